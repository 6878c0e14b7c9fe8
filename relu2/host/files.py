"""Files the instrument writes: whole or not at all, and JSON that says "no figure" as null.

``atomic_write_text`` is how every result, report, model, state and CSV is written; ``json_text`` is
how a report or state with missing figures (NaN) is spelled in JSON.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from relu2.vocab.errors import WriteError


TEMPORARY_SUFFIX = ".tmp"  # atomic_write_text's temporary files: .NAME.XXXX.tmp, renamed or removed


def is_cut_short(name: str) -> bool:
    """Whether ``name`` is an atomic write's temporary file (left only by a kill mid-write)."""
    return name.startswith(".") and name.endswith(TEMPORARY_SUFFIX)


def atomic_write_text(path: str | os.PathLike, text: str | bytes) -> None:
    """Write ``text`` (or bytes) to ``path`` through a temporary file and a rename, so a crash never
    leaves half a file.  The file gets the mode a plain open() would give it; errors name ``path``,
    never the temporary file.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX, dir=path.parent)
    except OSError as e:
        raise WriteError(e.errno, f"cannot write {path}: {e.strerror or e}") from None
    umask = os.umask(0)  # mkstemp makes the file owner-only; give it the mode a plain open() would
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    try:
        with (os.fdopen(fd, "wb") if isinstance(text, bytes) else
              os.fdopen(fd, "w", encoding="utf-8", newline="")) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise WriteError(e.errno, f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (no figure) as None, which JSON spells null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_text(value: Any, **dumps: Any) -> str:
    """``value`` as strict JSON (no NaN or Infinity tokens): every missing figure written as null."""
    return json.dumps(finite(value), allow_nan=False, **dumps)
