"""What a submitted job ships to the cluster: the user's project, as a Ray runtime_env working_dir.

The working_dir is the project folder (the spec's folder, or `--project DIR`) with only what the
job needs on the cluster: the spec, its data when local and small, and `model.import` code. Ray
zips whatever folder it is given and uploads it through the GCS (at most ~500 MiB, the gRPC
message limit), and every node unpacks it; so rayline picks the files itself, checks them, and
hands Ray a staging copy of exactly those files:

- never shipped: version control and caches (.git, __pycache__, .pytest_cache, ...), virtual
  environments (any folder holding a pyvenv.cfg), rayline workspaces (.rayline, and the
  workspace folder when it sits inside the project), and files that usually hold credentials
  (.env, *.pem, *.key, SSH keys, .netrc, .aws/, ...): the package is stored in the cluster's GCS
  and unpacked on every node;
- everything a .gitignore or .rayignore (Ray's own convention) in the project matches, with
  git's rules (pathspec's GitIgnoreSpec; nested ignore files apply below their folder);
- the data files the spec names are shipped even when ignored (the job cannot run without
  them), and must be inside the project;
- no file over `max_file_bytes` (10 MiB by default): a large file fails the submission with its
  name, its size, the limit and what to do (put data on shared storage), instead of a slow upload
  of something the job may not need or a package Ray refuses at 500 MiB.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from rayline.errors import RaylineError

__all__ = ["PackageError", "Package", "DEFAULT_MAX_FILE_BYTES", "DEFAULT_MAX_TOTAL_BYTES", "ALWAYS_EXCLUDED_DIRS",
           "SECRET_PATTERNS", "collect_files", "stage_package", "human_size"]

DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024  # Ray itself warns about files over 10 MiB in a working_dir
# Ray's limit on one package (GCS_STORAGE_MAX_SIZE: the gRPC message limit, 512 MiB), less room
# for the zip's own overhead; checked on the files' sizes before zipping.
DEFAULT_MAX_TOTAL_BYTES = 500 * 1024 * 1024

ALWAYS_EXCLUDED_DIRS = frozenset({
    ".git", ".hg", ".svn", ".rayline", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
    ".hypothesis", ".ipynb_checkpoints", ".tox", ".nox", ".venv", "venv", "node_modules", ".eggs",
    ".idea", ".vscode", ".cache",
})
# Files that usually hold credentials. The package lands in the cluster's GCS and on every node's
# disk, readable by every job there; a key must reach the cluster another way (a Secret, the nodes'
# environment), never inside the code package.
SECRET_PATTERNS = (
    ".env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "id_rsa*", "id_dsa*", "id_ecdsa*",
    "id_ed25519*", ".netrc", ".pypirc", ".git-credentials", ".npmrc", "auth_token", "*.kubeconfig",
)
SECRET_DIRS = frozenset({".ssh", ".aws", ".gnupg", ".kube", ".docker", ".azure", ".config"})
_IGNORE_FILES = (".gitignore", ".rayignore")
_NEVER_SHIPPED_FILES = frozenset({".DS_Store"})


class PackageError(RaylineError):
    """The project cannot be shipped as the job's working_dir (a file too large, data outside it)."""

    exit_code = 2


def human_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@dataclass
class Package:
    """The files to ship (paths relative to `root`) and what was left out, for the user."""

    root: Path
    files: list[str] = field(default_factory=list)
    total_bytes: int = 0
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason -> relative paths

    def skip(self, reason: str, rel: str) -> None:
        self.skipped.setdefault(reason, []).append(rel)


class _IgnoreRules:
    """git's ignore rules of one project: every .gitignore/.rayignore below the root, each
    applying to paths below its own folder; the deepest decisive pattern wins (a `!` re-includes)."""

    def __init__(self) -> None:
        self._specs: list[tuple[str, object]] = []  # (folder relative to root, "" for the root; spec)

    def add_folder(self, root: Path, rel_dir: str) -> None:
        import pathspec

        for name in _IGNORE_FILES:
            path = root / rel_dir / name
            if path.is_file():
                try:
                    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
                except OSError as exc:
                    raise PackageError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
                self._specs.append((rel_dir, pathspec.GitIgnoreSpec.from_lines(lines)))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        verdict = None
        for folder, spec in self._specs:
            if folder and not rel.startswith(folder + "/"):
                continue
            sub = rel[len(folder) + 1:] if folder else rel
            result = spec.check_file(sub + "/" if is_dir else sub)
            if result.include is not None:
                verdict = result.include
        return bool(verdict)


def _is_secret(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in SECRET_PATTERNS)


def _is_venv(path: Path) -> bool:
    return (path / "pyvenv.cfg").is_file() or (path / "conda-meta").is_dir()


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def _files_of(path_or_glob: str) -> list[Path]:
    """The files a data path names: a file, every file below a folder, or a glob's matches."""
    if any(c in path_or_glob for c in "*?["):
        matches = [Path(m) for m in glob.glob(path_or_glob, recursive=True)]
    else:
        matches = [Path(path_or_glob)]
    files = []
    for match in matches:
        if match.is_dir():
            files += [p for p in match.rglob("*") if p.is_file()]
        elif match.is_file():
            files.append(match)
    return files


def _too_big(rel: str, size: int, limit: int, what: str) -> PackageError:
    unneeded = "" if what else "add the file to .rayignore if the job does not need it, "
    return PackageError(
        f"{what}{rel}: {human_size(size)} is over the {human_size(limit)} limit for a file shipped with the job "
        f"(allowed: files up to {human_size(limit)}; put large data on shared storage -- an s3:// or gs:// URI or a "
        f"path every node sees -- and point the spec at it, {unneeded}or raise the limit with --max-file-mb)")


def collect_files(root: str | os.PathLike, *, data_paths: tuple[str, ...] = (), force_files: tuple[str, ...] = (),
                  exclude_dirs: tuple[str, ...] = (),
                  max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES) -> Package:
    """Decide what to ship from the project folder `root` (see the module's docstring).

    `data_paths`: the spec's local data (absolute paths, folders or globs) inside `root`, and
    `force_files` (the spec itself), shipped even when ignored. `exclude_dirs`: absolute folders never shipped (the workspace). Raises
    PackageError for a file over `max_file_bytes` that would be shipped, or a package over
    `max_total_bytes`.
    """
    root = Path(root).resolve()
    package = Package(root=root)
    excluded = {Path(d).resolve() for d in exclude_dirs}
    rules = _IgnoreRules()
    forced: dict[str, bool] = {}  # relative path -> is data
    for paths, is_data in ((data_paths, True), (force_files, False)):
        for data in paths:
            for path in _files_of(data):
                resolved = path.resolve()
                if _inside(resolved, root):
                    forced[resolved.relative_to(root).as_posix()] = is_data
    chosen: set[str] = set()

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        rel_dir = "" if here == root else here.relative_to(root).as_posix()
        rules.add_folder(root, rel_dir)
        keep = []
        for name in sorted(dirnames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            path = here / name
            if name in ALWAYS_EXCLUDED_DIRS or path.is_symlink():
                package.skip("caches, version control, workspaces and links", rel + "/")
            elif name in SECRET_DIRS:
                package.skip("credentials", rel + "/")
            elif path.resolve() in excluded or _is_venv(path):
                package.skip("caches, version control, workspaces and links", rel + "/")
            elif rules.ignored(rel, is_dir=True):
                if not any(f.startswith(rel + "/") for f in forced):  # the spec's data in it still goes
                    package.skip(".gitignore/.rayignore", rel + "/")
            else:
                keep.append(name)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            path = here / name
            if name in _IGNORE_FILES or name in _NEVER_SHIPPED_FILES or name.endswith((".pyc", ".pyo")):
                continue
            if rel in forced:
                continue  # the spec names it: shipped below whatever it looks like, and not counted as left out
            if _is_secret(name):
                package.skip("credentials", rel)
            elif path.is_symlink() and not _inside(path.resolve(), root):
                package.skip("links out of the project", rel)
            elif rules.ignored(rel, is_dir=False):
                package.skip(".gitignore/.rayignore", rel)
            elif path.is_file():
                chosen.add(rel)

    for rel in sorted(chosen | set(forced)):
        path = root / rel
        size = path.stat().st_size
        if size > max_file_bytes:
            raise _too_big(rel, size, max_file_bytes, "data.source.path: " if forced.get(rel) else "")
        package.files.append(rel)
        package.total_bytes += size
    if package.total_bytes > max_total_bytes:
        largest = sorted(package.files, key=lambda r: (root / r).stat().st_size, reverse=True)[:3]
        raise PackageError(
            f"{root}: the files to ship total {human_size(package.total_bytes)}, over Ray's "
            f"{human_size(max_total_bytes)} limit for a job's working_dir (got largest: "
            + ", ".join(f"{r} ({human_size((root / r).stat().st_size)})" for r in largest)
            + "; allowed: put data on shared storage -- s3://, gs:// or a path every node sees -- or list what the "
              "job does not need in .rayignore)")
    return package


def stage_package(package: Package, dest: str | os.PathLike) -> Path:
    """Copy the package's files into `dest` (an empty folder): the working_dir handed to Ray, so
    that what Ray zips is exactly what was checked. Hard links where the filesystem allows."""
    dest = Path(dest)
    for rel in package.files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        source = package.root / rel
        try:
            os.link(source.resolve(), target)
        except OSError:
            shutil.copy2(source, target)
    return dest
