"""The one rule for what a command may write: nothing a user has is lost to a typo.

Every command that writes claims its outputs here, after its inputs are checked and before anything
is built, measured or written:

* ``claim_file`` / ``claim_dir``: an existing file, or a folder that holds anything, is never
  overwritten unless the user says so (``--force``) or it is the command's own work in progress (a
  sweep's partial CSV, a compare's ``--resume``, a bisect's state); a file the repository tracks (or a
  folder holding one) needs ``--force`` even then.  A folder that does not exist yet is fine when its
  nearest existing parent is writable: defaults like ``.asv/compare/`` are made on the way.
* ``claim_replaced_dir``: a folder another tool deletes before writing (asv publish's html folder)
  is refused when it holds tracked files or anything that is not that tool's own output; no
  ``--force`` overrides that.
* ``name_part``: a name that becomes part of a path (a machine name, a folder name) is one plain
  component: no separator, not ``.`` or ``..``.

Torch-free, and every refusal is a ``UsageError``: exit 2, one line.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from relu2.host.git import tracked
from relu2.vocab.errors import UsageError


def name_part(text: str, what: str = "--machine") -> str:
    """``text`` when it is one plain path component; UsageError otherwise."""
    bad = (not text or text != text.strip() or text in (".", "..") or text.startswith("-") or "\0" in text
           or "/" in text or (os.altsep and os.altsep in text) or os.sep in text)
    if bad:
        raise UsageError(f"{what} {text!r}: a name, not a path (no '/', not '.' or '..')")
    return text


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path.cwd()


def _writable_ancestor(path: Path, what: str, shown: Path | None = None) -> None:
    """UsageError unless the nearest existing folder on ``path``'s way takes a file: tried, not asked
    (``os.access`` says yes to root everywhere, and /proc or a read-only mount say no only when written)."""
    shown = shown or path
    where = _existing_ancestor(path.absolute())
    if not where.is_dir():
        raise UsageError(f"{what} {shown}: {where} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError:
        raise UsageError(f"{what} {shown}: {where} is not writable") from None


def claim_file(path: str | os.PathLike, what: str = "--out", *, force: bool = False,
               own: Callable[[Path], bool] | None = None) -> Path:
    """``path`` as a file this command may write; UsageError (nothing written) when it may not."""
    path = Path(path)
    if not str(path).strip():
        raise UsageError(f"{what}: no file named")
    if path.is_dir():
        raise UsageError(f"{what} {path}: is a folder (name the file to write)")
    _writable_ancestor(path.parent, what, shown=path)
    if path.exists() and not force:
        if tracked(path):
            raise UsageError(f"{what} {path}: a file the repository ships (tracked by git); name a new file, or --force")
        if own is None or not own(path):
            raise UsageError(f"{what} {path}: exists; name a new file, or --force to replace it")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{what} {path}: not writable")
    return path


def claim_dir(path: str | os.PathLike, what: str = "--out", *, force: bool = False,
              resume: Callable[[Path], bool] | None = None) -> Path:
    """``path`` as a folder this command may write into; UsageError (nothing written) when it may not."""
    path = Path(path)
    if not str(path).strip():
        raise UsageError(f"{what}: no folder named")
    if path.exists() and not path.is_dir():
        raise UsageError(f"{what} {path}: exists and is not a folder")
    _writable_ancestor(path, what)
    if path.is_dir() and any(path.iterdir()) and not force:
        if tracked(path):
            raise UsageError(f"{what} {path}: holds files the repository ships (tracked by git, e.g. "
                             f"{tracked(path)[0]}); name a new folder, or --force")
        if resume is None or not resume(path):
            raise UsageError(f"{what} {path}: not empty; name a new folder, or --force to write over it")
    return path


def claim_replaced_dir(path: str | os.PathLike, what: str, *, protect: Iterable[str | os.PathLike] = (),
                       own: Callable[[Path], bool] = lambda p: False) -> Path:
    """``path`` as a folder another tool empties before it writes: refused (no override) when it is, or
    holds, a folder in ``protect``, holds tracked files, or holds anything that is not ``own``."""
    path = Path(path)
    if not str(path).strip():
        raise UsageError(f"{what}: no folder named")
    if path.exists() and not path.is_dir():
        raise UsageError(f"{what} {path}: exists and is not a folder")
    target = path.resolve()
    for kept in protect:
        kept_path = Path(kept).resolve()
        if kept_path == target or target in kept_path.parents:
            raise UsageError(f"{what} {path}: would delete {kept} (the folder is emptied before it is written)")
    if path.is_dir() and any(path.iterdir()):
        if tracked(path):
            raise UsageError(f"{what} {path}: holds files the repository ships (tracked by git, e.g. "
                             f"{tracked(path)[0]}), and it is emptied before it is written; name another folder")
        if not own(path):
            raise UsageError(f"{what} {path}: holds files of its own, and it is emptied before it is written; "
                             "name a new folder")
    _writable_ancestor(path, what)
    return path
