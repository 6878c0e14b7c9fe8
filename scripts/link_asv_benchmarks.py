"""Keep one copy of each asv benchmarks.json under docs/aa (docs/aa/asv-benchmarks/README.md says why).

    python scripts/link_asv_benchmarks.py [ROOT]     ROOT defaults to docs/aa

Every ``benchmarks.json`` under ROOT that is a plain file becomes a relative link to
``ROOT/asv-benchmarks/<first 12 hex digits of its SHA-256>.json`` (written there if new).  Run it on a
device visit's folders before committing them; a file already linked is left as it is.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path


def link_all(root: Path) -> int:
    shared = root / "asv-benchmarks"
    shared.mkdir(exist_ok=True)
    linked = 0
    for path in sorted(root.rglob("benchmarks.json")):
        if path.is_symlink() or shared in path.parents:
            continue
        data = path.read_bytes()
        target = shared / f"{hashlib.sha256(data).hexdigest()[:12]}.json"
        if not target.exists():
            partial = target.with_name(target.name + ".partial")
            partial.write_bytes(data)
            os.replace(partial, target)  # a shared copy is whole or absent, never half a file
        if target.read_bytes() != data:
            raise SystemExit(f"{target}: holds other bytes than {path} though its name says the same digest")
        link = path.with_name(path.name + ".link")
        os.symlink(os.path.relpath(target, path.parent), link)
        os.replace(link, path)  # the file is whole until the link takes its place
        linked += 1
    return linked


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/aa")
    print(f"{link_all(root)} benchmarks.json linked under {root}")
