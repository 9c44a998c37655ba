"""Where runs, checkpoints and artifacts live: a local or shared path, or an s3:// / gs:// URI.

Everything rayline reads or writes there goes through pyarrow's filesystems
(`pyarrow.fs.FileSystem.from_uri`), the same layer Ray Train and Tune use for their
`storage_path`, so a location rayline can read is one Ray can write and the other way round.
Credentials and endpoints come from the environment, never from rayline: for S3 (and
S3-compatible stores) AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN or
AWS_PROFILE, AWS_DEFAULT_REGION, AWS_ENDPOINT_URL (pyarrow 25 and boto3, which MLflow uses for
artifacts, both read it); for GCS, Google's application default credentials.

`check_shared` is the multi-node start check: a local path that some node of the cluster
does not see fails the run before any work, instead of losing checkpoints later.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
import secrets

from rayline.errors import RaylineError

__all__ = [
    "URI_SCHEMES",
    "ALLOWED",
    "StorageError",
    "parse_location",
    "is_uri",
    "join",
    "filesystem",
    "exists",
    "read_json",
    "write_json",
    "list_names",
    "download_dir",
    "upload_dir",
    "ensure_dir",
    "check_shared",
    "SHARED_CHECK_TIMEOUT_S",
]

# gcs:// is pyarrow's other spelling of gs://; both mean Google Cloud Storage.
URI_SCHEMES = {"s3": "s3", "gs": "gs", "gcs": "gs"}
ALLOWED = "a local path or one every node mounts (NFS), s3://bucket/prefix or gs://bucket/prefix"
# `scheme:/`: a URI, or what pathlib makes of one (Path("s3://b/p") is "s3:/b/p").
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/+(.*)$", re.S)


class StorageError(RaylineError):
    """A storage location is malformed, unreachable, or not visible where it must be."""


def _shown(value: str) -> str:
    from rayline.redact import redact_uri

    return redact_uri(value)


def parse_location(value: str | os.PathLike, where: str = "workspace") -> str:
    """`value` as rayline stores it: `s3://bucket/prefix` / `gs://bucket/prefix` without a trailing
    slash, or an absolute local path. Anything else is a one-line StorageError naming `where`."""
    raw = os.fspath(value)
    text = raw.strip()
    if not text:
        raise StorageError(f"{where}: empty location (allowed: {ALLOWED})")
    m = _SCHEME.match(text)
    if not m:
        return os.path.abspath(os.path.expanduser(text))
    scheme, rest = m.group(1).lower(), m.group(2)
    text = f"{m.group(1)}://{rest}"  # as typed, also when it came through pathlib (one slash)
    if scheme == "file":
        return os.path.abspath("/" + rest.lstrip("/"))
    if scheme not in URI_SCHEMES:
        raise StorageError(f"{where}: unsupported storage scheme {scheme + '://'!r} (got {_shown(text)!r}; allowed: {ALLOWED})")
    scheme = URI_SCHEMES[scheme]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket:
        # pyarrow accepts s3://KEY:SECRET@bucket; rayline would then print and record the secret.
        raise StorageError(f"{where}: credentials in the URI (got {_shown(text)!r}; allowed: {scheme}://bucket/prefix "
                           "with credentials in the environment, e.g. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
    if "?" in text or "#" in text:
        raise StorageError(f"{where}: query or fragment in a storage URI (got {_shown(text)!r}; allowed: "
                           f"{scheme}://bucket/prefix; endpoints and regions come from the environment, e.g. AWS_ENDPOINT_URL)")
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,221}[a-z0-9]", bucket):
        raise StorageError(f"{where}: bad bucket name {bucket!r} (got {_shown(text)!r}; allowed: {scheme}://bucket/prefix, "
                           "a bucket of 3-63 lowercase letters, digits, '.', '-' or '_')")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise StorageError(f"{where}: '.' or '..' in a storage URI (got {_shown(text)!r}; allowed: {scheme}://bucket/prefix)")
    return f"{scheme}://" + "/".join([bucket, *parts])


def is_uri(location: str) -> bool:
    """Whether `location` (as `parse_location` returns it) is object storage rather than a path."""
    return "://" in str(location)


def join(location: str, *parts: str) -> str:
    """`location`/`parts`, with '/' on object storage and os.path.join for paths."""
    if is_uri(location):
        return posixpath.join(str(location).rstrip("/"), *parts)
    return os.path.join(str(location), *parts)


@functools.lru_cache(maxsize=32)
def _filesystem(base: str):
    import pyarrow.fs

    # One filesystem per bucket: S3's costs a region lookup (a HEAD request) to make.
    return pyarrow.fs.FileSystem.from_uri(base)[0]


def filesystem(location: str):
    """(pyarrow filesystem, path on it) for `location`."""
    import pyarrow.fs

    location = str(location)
    if not is_uri(location):
        return pyarrow.fs.LocalFileSystem(), os.path.abspath(location)
    scheme, rest = location.split("://", 1)
    bucket = rest.split("/", 1)[0]
    try:
        fs = _filesystem(f"{scheme}://{bucket}")
    except (OSError, ValueError) as exc:
        raise StorageError(f"{_shown(location)}: cannot open the {scheme}:// filesystem: {_first_line(exc)} "
                           f"({_env_hint(scheme)})") from exc
    return fs, rest.rstrip("/")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    # pyarrow's S3 errors end in "; Details: <curl's words for the same thing>".
    line = line.split("; Details:", 1)[0]
    return line if len(line) <= 400 else line[:397] + "..."


def _env_hint(scheme: str) -> str:
    if scheme == "s3":
        return ("allowed: credentials in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, AWS_DEFAULT_REGION, "
                "and AWS_ENDPOINT_URL for an S3-compatible server")
    return "allowed: Google application default credentials (GOOGLE_APPLICATION_CREDENTIALS)"


def exists(location: str) -> bool:
    import pyarrow.fs

    fs, path = filesystem(location)
    return fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound


def read_json(location: str):
    """The JSON document at `location`, or None when it is missing, partial or not JSON."""
    fs, path = filesystem(location)
    try:
        with fs.open_input_stream(path) as fh:
            return json.loads(fh.read())
    except (OSError, ValueError):
        return None  # missing, being written (local), or not ours


def write_json(location: str, document) -> None:
    """Write `document` so that readers see the old or the new one, never half of it: a local
    file via a temporary name and a rename; an object in one upload (objects appear whole)."""
    data = json.dumps(document, indent=1).encode()
    if not is_uri(location):
        from rayline.files import atomic_write

        os.makedirs(os.path.dirname(location) or ".", exist_ok=True)
        atomic_write(location, data)
        return
    fs, path = filesystem(location)
    try:
        with fs.open_output_stream(path) as fh:
            fh.write(data)
    except OSError as exc:
        raise StorageError(f"{_shown(location)}: cannot write: {_first_line(exc)} "
                           f"({_env_hint(location.split('://', 1)[0])})") from exc


def list_names(location: str, folders_only: bool = False) -> list[str]:
    """Names of the entries directly under `location` (sorted; empty when it does not exist);
    with `folders_only`, of its folders (prefixes, on object storage) only."""
    import pyarrow.fs

    fs, path = filesystem(location)
    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True, recursive=False))
    except OSError:
        return []
    return sorted(posixpath.basename(info.path.rstrip("/")) for info in infos
                  if not folders_only or info.type == pyarrow.fs.FileType.Directory)


def download_dir(location: str, dest: str) -> str:
    """Copy the directory at `location` to the local directory `dest`; returns `dest`."""
    import pyarrow.fs

    fs, path = filesystem(location)
    os.makedirs(dest, exist_ok=True)
    try:
        pyarrow.fs.copy_files(path, dest, source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem())
    except OSError as exc:
        raise StorageError(f"{_shown(location)}: cannot download: {_first_line(exc)}") from exc
    return dest


def upload_dir(source: str, location: str) -> str:
    """Copy the local directory `source` to `location` (a path or a URI); returns `location`."""
    import pyarrow.fs

    fs, path = filesystem(location)
    try:
        pyarrow.fs.copy_files(os.path.abspath(source), path, source_filesystem=pyarrow.fs.LocalFileSystem(),
                              destination_filesystem=fs)
    except OSError as exc:
        raise StorageError(f"{_shown(location)}: cannot upload: {_first_line(exc)}") from exc
    return location


def ensure_dir(location: str, where: str = "workspace") -> None:
    """Create the directory `location` (a no-op on object storage, which has no directories),
    proving for a URI that the bucket answers and takes writes: a wrong endpoint, bucket or
    credentials fail here, in one line, before any training."""
    if not is_uri(location):
        os.makedirs(location, exist_ok=True)
        return
    scheme = location.split("://", 1)[0]
    # One probe per process: runs starting at once on one workspace must not delete each other's.
    probe = join(location, f".rayline-write-probe-{os.getpid()}-{secrets.token_hex(4)}")
    fs, path = filesystem(probe)
    try:
        with fs.open_output_stream(path) as fh:
            fh.write(b"ok")
    except OSError as exc:
        raise StorageError(f"{where}: cannot write to {_shown(location)}: {_first_line(exc)} ({_env_hint(scheme)})") from exc
    try:
        fs.delete_file(path)
    except OSError:
        pass  # written is what mattered; a policy may allow writes without deletes


# ----------------------------------------------------------------- the multi-node start check

# A zero-CPU task per node needs a worker process there: 1-3 s each on an idle node, and
# several times that on a loaded 2-core machine running three raylets (measured 9 s).
SHARED_CHECK_TIMEOUT_S = 60.0
_MARKER_PREFIX = ".rayline-shared-check-"


def _read_marker(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def check_shared(location: str, where: str = "workspace", timeout_s: float = SHARED_CHECK_TIMEOUT_S) -> list[str]:
    """When the connected Ray cluster has more than one alive node and `location` is a local
    path, prove that every node sees it: write a marker with a random token, read it back on
    each alive node with a zero-CPU task pinned there; the first node that does not see it
    (or does not answer within `timeout_s`) is a StorageError. Returns the node ids checked
    (empty when there was nothing to check: object storage, or a single node)."""
    if is_uri(location):
        return []
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) < 2:
        return []
    allowed = "allowed: an s3:// or gs:// URI, or a path every node mounts, e.g. NFS"
    os.makedirs(location, exist_ok=True)
    token = secrets.token_hex(16)
    marker = os.path.join(location, f"{_MARKER_PREFIX}{token}")
    with open(marker, "w") as fh:
        fh.write(token)
    try:
        read = ray.remote(num_cpus=0, max_retries=0)(_read_marker)
        pending = {
            read.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                         name="rayline-storage-check").remote(marker): n
            for n in nodes
        }
        ready, late = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
        for ref in ready:
            node = pending[ref]
            try:
                seen = ray.get(ref)
            except Exception:  # noqa: BLE001 - a node whose task failed did not show it sees the file
                seen = None
            if seen != token:
                raise StorageError(f"{where}: {location} is not shared: node {_node_name(node)} does not see it ({allowed})")
        if late:
            for ref in late:
                ray.cancel(ref, force=True)
            node = pending[late[0]]
            raise StorageError(f"{where}: cannot tell whether {location} is shared: node {_node_name(node)} did not "
                               f"answer within {timeout_s:g} s ({allowed})")
    finally:
        try:
            os.remove(marker)
        except OSError:
            pass
    return [n["NodeID"] for n in nodes]


def _node_name(node: dict) -> str:
    return f"{node.get('NodeManagerAddress', '?')}/{node['NodeID'][:12]}"
