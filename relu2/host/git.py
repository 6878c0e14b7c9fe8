"""The one way the instrument asks git: a checkout's commits, refs, worktrees and files.

``run`` raises ``UsageError`` with git's own one-line reason; ``output`` is its stdout; the ``try_``
forms answer None where "not here" is an answer (a folder outside any checkout, a ref of results
that may not be in this clone).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Iterable, Sequence

from relu2.vocab.errors import UsageError

Repo = str | os.PathLike | None  # a checkout, or None: the current folder's

TIMEOUT_S = 120.0  # no git command of this tool takes long; one that hangs (a lock, a prompt) is refused


def _argv(repo: Repo, args: Sequence[str]) -> list[str]:
    return ["git", *(["-C", str(repo)] if repo is not None else []), *args]


def run(repo: Repo, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``git -C repo ARGS``; UsageError naming git's reason when it fails and ``check``."""
    try:
        # surrogateescape: a file name need not be UTF-8; os.fsencode gives its bytes back
        done = subprocess.run(_argv(repo, args), capture_output=True, text=True, errors="surrogateescape",
                              timeout=TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(f"git {' '.join(args[:2])}: {e}") from None
    if check and done.returncode != 0:
        said = done.stderr.strip().splitlines()
        why = next((ln for ln in said if ln.startswith(("fatal:", "error:"))), said[0] if said else f"exit {done.returncode}")
        raise UsageError(f"git {' '.join(args[:2])}: {why}")
    return done


def output(repo: Repo, *args: str) -> str:
    """stdout of ``git -C repo ARGS``, stripped; UsageError when git fails."""
    return run(repo, *args).stdout.strip()


def try_output(repo: Repo, *args: str) -> str | None:
    """stdout of ``git -C repo ARGS``, stripped, or None when git fails or is absent."""
    try:
        done = run(repo, *args, check=False)
    except UsageError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _commit_of(ref: str) -> list[str]:
    return ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"]


def resolve(repo: Repo, ref: str) -> str:
    """The full hash of the commit ``ref`` names (``main~1``, a tag, a prefix); UsageError when none."""
    if not ref or ref.startswith("-"):
        raise UsageError(f"not a git ref: {ref!r}")
    sha = try_output(repo, *_commit_of(ref))
    if not sha:
        raise UsageError(f"{ref!r} names no commit of {repo or Path.cwd()}")
    return sha


def try_resolve(ref: str, repo: Repo = None) -> str | None:
    """``resolve``, or None where git cannot say."""
    if not ref or ref.startswith("-"):
        return None
    return try_output(repo, *_commit_of(ref))


def head(repo: Repo = None) -> str:
    """The full hash of HEAD, or "unknown" outside a git checkout."""
    return try_output(repo, "rev-parse", "HEAD") or "unknown"


def state(repo: Repo = None, paths: Sequence[str] = ()) -> str:
    """What a record names as the code that ran from the checkout ``repo``: HEAD's hash, and where
    ``paths`` (the whole tree when empty) differ from HEAD (edited, added, deleted or untracked; files
    git ignores aside) ``+dirty-`` and a digest of their contents, so that two edits read as two
    instruments and none reads as HEAD; ``+dirty-unknown`` where git cannot say.  "unknown" outside a
    checkout."""
    root = toplevel(Path(repo) if repo is not None else Path.cwd())
    sha = head(root) if root is not None else "unknown"
    if sha == "unknown":
        return sha
    changed = try_output(root, "status", "--porcelain", "--untracked-files=all", "--", *paths)
    if changed == "":
        return sha
    listed = try_output(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *paths)
    if changed is None or listed is None:
        return f"{sha}+dirty-unknown"
    return f"{sha}+dirty-{files_digest(root, listed.split(chr(0)))}"


def files_digest(root: Path, names: Iterable[str]) -> str:
    """12 hex digits of sha256 over ``names`` (paths under ``root``) and their contents, in name order:
    the same files with the same bytes are the same digest wherever they lie."""
    digest = hashlib.sha256()
    for name in sorted(set(filter(None, names))):
        digest.update(os.fsencode(name) + b"\0" + _file_digest(Path(root) / name))
    return digest.hexdigest()[:12]


def _file_digest(path: Path) -> bytes:
    """sha256 of a file's bytes, read in chunks; a fixed marker for one that is gone (deleted in the tree)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return b"\0deleted"
    return h.digest()


def toplevel(path: str | os.PathLike) -> Path | None:
    """The root of the git checkout holding ``path`` (a file or folder), or None."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    top = try_output(folder if folder.exists() else None, "rev-parse", "--show-toplevel")
    return Path(top) if top else None


def checkout(repo: str | os.PathLike | None, what: str = "--repo") -> Path:
    """The checkout ``repo`` names (default: the one around the current folder); UsageError when none."""
    where = Path(repo).expanduser() if repo else Path.cwd()
    root = toplevel(where) if where.is_dir() else None
    if root is None:
        raise UsageError(f"{where}: not a git checkout" + (f" ({what} names the repository whose commits are measured)"
                                                           if repo else f" (run it inside one, or pass {what})"))
    return root


def common_dir(repo: Repo) -> Path:
    """The checkout's git folder that its worktrees share."""
    found = Path(output(repo, "rev-parse", "--git-common-dir"))
    return found if found.is_absolute() else Path(repo or Path.cwd()) / found


def order(hashes: Iterable[str], repo: Repo) -> dict[str, int]:
    """Each hash's position in ``git rev-list --topo-order`` (parents first) of ``repo``; {} without one.

    Commit dates have one-second resolution, so two commits made in the same second tie; the
    repository's graph says which came first.  ``repo`` is the checkout the results belong to
    (never the current directory, which would make the order depend on where the command runs).
    """
    if repo is None:
        return {}
    out = try_output(repo, "rev-list", "--topo-order", "--reverse", "--all")
    if out is None:
        return {}
    rank = {h: i for i, h in enumerate(out.split())}
    return {h: rank[h] for h in hashes if h in rank}


def is_ancestor(repo: Repo, older: str, newer: str) -> bool:
    return run(repo, "merge-base", "--is-ancestor", older, newer, check=False).returncode == 0


def first_parents(repo: Repo, since: str, until: str) -> list[str]:
    """The first-parent commits after ``since`` up to ``until``, oldest first; UsageError for a bad range."""
    return output(repo, "rev-list", "--first-parent", "--reverse", f"{since}..{until}").split()


def subjects(repo: Repo, commits: Sequence[str]) -> dict[str, str]:
    """Each commit's subject line."""
    out = output(repo, "log", "--no-walk=unsorted", "--format=%H %s", *commits)
    return dict(line.split(" ", 1) if " " in line else (line, "") for line in out.splitlines())


def show(repo: Repo, commit: str, path: str) -> str | None:
    """The text of ``path`` at ``commit``, or None when that commit has no such file."""
    done = run(repo, "show", f"{commit}:{path}", check=False)
    return done.stdout if done.returncode == 0 else None


def commit_time(repo: Repo, commit: str) -> int:
    """The commit's date, in seconds since the epoch."""
    return int(output(repo, "log", "-1", "--format=%ct", commit))


def worktree_add(repo: Repo, tree: Path, commit: str) -> None:
    output(repo, "worktree", "add", "--detach", "-q", str(tree), commit)


def worktree_remove(repo: Repo, tree: Path) -> None:
    """Remove a worktree made by ``worktree_add``, and prune one whose folder went first; never raises."""
    run(repo, "worktree", "remove", "--force", str(tree), check=False)
    run(repo, "worktree", "prune", check=False)


def tracked(path: str | os.PathLike) -> list[str]:
    """Up to three files git tracks at ``path`` (a file, or under a folder); [] outside a checkout."""
    path = Path(path).absolute()
    where = next((p for p in (path, *path.parents) if p.exists()), Path.cwd())
    folder = where if where.is_dir() else where.parent
    out = try_output(folder, "ls-files", "-z", "--full-name", "--", str(path))
    return [f for f in (out or "").split("\0") if f][:3]
