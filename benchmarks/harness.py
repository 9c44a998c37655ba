"""A small, reusable HTTP load harness: one closed-loop client, servers in subprocesses, stats.

- `measure(url, bodies, concurrency, seconds)` drives `concurrency` connections, each sending
  the next pre-encoded JSON body as soon as its previous answer arrived (closed loop), after
  a warm-up; it runs in its own process (`LoadClient`), so the client never shares a GIL with
  the caller, and it reports its own CPU use next to the machine's, so a reader can tell
  whether the client or a neighbour was the bottleneck.
- The client is aiohttp (already installed with rayline: MLflow and Ray Serve depend on it).
  Measured on the 2-core development machine against the hand-written baseline at
  concurrency 8: httpx's AsyncClient spent ~2x the CPU per request of aiohttp (see
  benchmarks/README.md); on 2 cores every client CPU-second is taken from the servers.
- `ServerProcess` starts a server command, waits for its health URL, and stops it (only the
  process it started) on exit.

Nothing here knows about rayline; `serving.py` composes it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["LoadResult", "LoadClient", "HeyClient", "load_client", "ServerProcess", "measure", "wait_http", "machine_info",
           "format_table"]


@dataclass
class LoadResult:
    """One measured scenario against one server."""

    url: str
    concurrency: int
    seconds: float  # measured wall time (warm-up excluded)
    requests: int  # completed with status 200
    errors: int  # non-200 answers and transport errors
    rows_per_request: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    client_cpu: float  # cores the client process used (CPU seconds / wall second)
    machine_cpu: float  # cores busy on the whole machine during the run (everyone's)
    first_error: str | None = None

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.requests_per_s * self.rows_per_request

    def to_dict(self) -> dict:
        return {**asdict(self), "requests_per_s": self.requests_per_s, "rows_per_s": self.rows_per_s}


async def _drive(url: str, bodies: list[bytes], concurrency: int, warmup_s: float, seconds: float, timeout_s: float):
    import aiohttp

    # One connection per concurrent caller, kept alive: what a fleet of clients looks like
    # to the server, without TCP set-up in every measurement.
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    errors = [0]
    first_error: list[str] = []
    counter = [0]
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:

        async def worker(record_from: float, stop_at: float, offset: int) -> None:
            i = offset
            while True:
                now = time.perf_counter()
                if now >= stop_at:
                    return
                body = bodies[i % len(bodies)]
                i += concurrency
                try:
                    async with session.post(url, data=body) as resp:
                        payload = await resp.read()
                        status = resp.status
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    status, payload = None, repr(exc).encode()
                done = time.perf_counter()
                if now < record_from:
                    continue
                if status == 200:
                    latencies.append(done - now)
                else:
                    errors[0] += 1
                    if not first_error:
                        first_error.append(f"{status}: {payload[:300].decode(errors='replace')}")
                counter[0] += 1

        start = time.perf_counter()
        record_from = start + warmup_s
        stop_at = record_from + seconds
        await asyncio.gather(*(worker(record_from, stop_at, k) for k in range(concurrency)))
        # Requests in flight at `stop_at` finish after it: the measured window ends when the
        # last one is back, so requests/s = completed / (that end - record_from).
        end = time.perf_counter()
    return latencies, errors[0], (first_error or [None])[0], end - record_from


def measure(url: str, bodies: list[bytes], concurrency: int, seconds: float, warmup_s: float = 1.0,
            rows_per_request: int = 1, timeout_s: float = 60.0) -> LoadResult:
    """Closed-loop load at `concurrency` for `seconds` after `warmup_s`; latencies of 200s only."""
    import psutil

    try:
        import uvloop

        uvloop.install()  # the client's own event-loop overhead, halved
    except ImportError:
        pass
    me = psutil.Process()
    machine_before = psutil.cpu_times()
    mine_before = me.cpu_times()
    wall_before = time.perf_counter()
    # CPU is sampled over warm-up + measurement: both are the same closed loop.
    latencies, errors, first_error, measured = asyncio.run(_drive(url, bodies, concurrency, warmup_s, seconds, timeout_s))
    wall = time.perf_counter() - wall_before
    mine_after = me.cpu_times()
    machine_after = psutil.cpu_times()
    busy = lambda t: sum(t) - t.idle - getattr(t, "iowait", 0.0)  # noqa: E731
    lat = np.asarray(latencies) * 1000.0
    pct = (lambda q: float(np.percentile(lat, q))) if len(lat) else (lambda q: float("nan"))
    return LoadResult(
        url=url, concurrency=concurrency, seconds=measured, requests=len(latencies), errors=errors,
        rows_per_request=rows_per_request, p50_ms=pct(50), p90_ms=pct(90), p99_ms=pct(99),
        client_cpu=((mine_after.user - mine_before.user) + (mine_after.system - mine_before.system)) / wall,
        machine_cpu=(busy(machine_after) - busy(machine_before)) / wall,
        first_error=first_error,
    )


class LoadClient:
    """`measure` in one long-lived child process (spawned: no fork of a Ray driver's threads)."""

    def __init__(self):
        self._pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))

    def measure(self, *args, **kwargs) -> LoadResult:
        return self._pool.submit(measure, *args, **kwargs).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "LoadClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HeyClient:
    """`measure` with `hey` (Go; Debian's package `hey`), an HTTP load generator nobody here wrote,
    so the client is neither ours nor a Python event loop competing for 2 cores. Closed loop,
    keep-alive, `concurrency` workers for `seconds` after a discarded warm-up run. hey sends one
    body file per run: the first of `bodies` (a served model's cost does not depend on which
    digits row it scores). Latencies and status codes come from hey's per-request CSV."""

    def __init__(self, binary: str):
        self.binary = binary

    def measure(self, url: str, bodies: list[bytes], concurrency: int, seconds: float, warmup_s: float = 2.0,
                rows_per_request: int = 1, timeout_s: float = 60.0, headers: dict | None = None) -> LoadResult:
        import tempfile

        import psutil

        with tempfile.NamedTemporaryFile(suffix=".json") as body:
            body.write(bodies[0])
            body.flush()
            cmd = [self.binary, "-c", str(concurrency), "-m", "POST", "-T", "application/json", "-D", body.name,
                   "-t", str(int(timeout_s))]
            for key, value in (headers or {}).items():
                cmd += ["-H", f"{key}: {value}"]
            if warmup_s > 0:
                subprocess.run(cmd + ["-z", f"{warmup_s:g}s", url], capture_output=True, timeout=warmup_s + 60)
            busy = lambda t: sum(t) - t.idle - getattr(t, "iowait", 0.0)  # noqa: E731
            machine_before, children_before = psutil.cpu_times(), os.times()
            wall_before = time.perf_counter()
            proc = subprocess.run(cmd + ["-z", f"{seconds:g}s", "-o", "csv", url], capture_output=True, text=True,
                                  timeout=seconds + timeout_s + 60)
            wall = time.perf_counter() - wall_before
            machine_after, children_after = psutil.cpu_times(), os.times()
        latencies, errors, first_error, last_offset = [], 0, None, 0.0
        for line in proc.stdout.splitlines()[1:]:
            cells = line.split(",")
            if len(cells) < 8:
                continue
            status, offset = cells[6], float(cells[7])
            last_offset = max(last_offset, offset)
            if status == "200":
                latencies.append(float(cells[0]))
            else:
                errors += 1
                first_error = first_error or f"HTTP {status}"
        if proc.returncode != 0 and first_error is None:
            first_error = proc.stderr.strip()[-300:] or f"hey exited {proc.returncode}"
        lat = np.asarray(latencies) * 1000.0
        pct = (lambda q: float(np.percentile(lat, q))) if len(lat) else (lambda q: float("nan"))
        client = (children_after.children_user - children_before.children_user
                  + children_after.children_system - children_before.children_system)
        return LoadResult(
            url=url, concurrency=concurrency, seconds=last_offset or seconds, requests=len(latencies), errors=errors,
            rows_per_request=rows_per_request, p50_ms=pct(50), p90_ms=pct(90), p99_ms=pct(99),
            client_cpu=client / wall, machine_cpu=(busy(machine_after) - busy(machine_before)) / wall,
            first_error=first_error,
        )

    def close(self) -> None:
        pass


def load_client(kind: str = "auto"):
    """`hey` when installed (kind auto or hey), else (or with kind aiohttp) the aiohttp LoadClient."""
    import shutil

    binary = shutil.which("hey")
    if kind == "hey" and binary is None:
        raise SystemExit("--client hey: `hey` is not installed (Debian: apt-get install hey)")
    if kind in ("auto", "hey") and binary:
        return HeyClient(binary)
    return LoadClient()


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Wait until GET `url` answers 200; fail early if `proc` exits."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before {url} answered")
        try:
            r = httpx.get(url, timeout=2.0)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer 200 within {timeout_s:.0f} s (last: {last})")


@dataclass
class ServerProcess:
    """A server command in its own process group, stopped (that group only) on exit."""

    cmd: list[str]
    health_url: str
    cwd: str | None = None
    start_timeout_s: float = 60.0
    log_path: str | None = None
    proc: subprocess.Popen | None = field(default=None, init=False)

    def __enter__(self) -> "ServerProcess":
        log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_http(self.health_url, self.start_timeout_s, self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def __exit__(self, *exc) -> None:
        self.stop()


def machine_info(packages: tuple[str, ...] = ()) -> dict:
    """Cores, CPU model, memory, OS, Python and the named packages' versions."""
    import importlib.metadata

    import psutil

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), model)
    except OSError:
        pass
    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "versions": versions,
    }


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table (readable in a terminal, pasteable into a README)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
