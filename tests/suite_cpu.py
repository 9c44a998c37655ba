"""Where a command's CPU goes, process by process: every process that exits while it runs, from the
kernel's process accounting (acct(2): root only), named by its command line where a scan of /proc saw
it alive, attributed to the lane (pytest-xdist worker) it descends from.

    python tests/suite_cpu.py --out cpu.json -- .ci/run     # the README's test command, profiled
    python tests/suite_cpu.py --report cpu.json              # the summary again

tests/timings.py says which tests take the wall time; this says which processes burn the CPU, exact
where a sampler of /proc loses every process that lives less than its interval (CLI launches, Ray
workers that exit, pip). On the 2-core CI box the suite keeps both cores busy, so its wall time
follows its CPU: this is the list to cut from.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime (epoch s),
# etime (float, ticks), utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t each), comm[16].
_ACCT_V3 = struct.Struct("<BBHIIIIIIfHHHHHHHH16s")
_AHZ = 100  # acct's ticks a second
_SCAN_S = 5.0  # how often /proc is read for command lines (a process that lives less is named by its comm)
_XDIST_WORKER = "exec(eval(sys.stdin.readline()))"


def _comp_t(value: int) -> int:
    """acct's comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * ((value >> 13) & 7))


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("/proc/stat has no btime")


def _busy_ticks() -> int:
    """The machine's CPU ticks spent outside idle and iowait, all cores (kernel threads included)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]


class _CmdlineScanner(threading.Thread):
    """pid -> [(start epoch s, command line)], read from /proc every _SCAN_S."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen: dict[int, list[tuple[float, str]]] = collections.defaultdict(list)
        self._done = threading.Event()
        self._boot, self._tick = _boot_time(), os.sysconf("SC_CLK_TCK")

    def scan(self) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            try:
                start = self._boot + int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]) / self._tick
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except (OSError, IndexError, ValueError):
                continue
            known = self.seen.get(pid)
            if known and abs(known[-1][0] - start) < 1.5:
                # A Ray worker renames itself (ray::IDLE -> ray::Actor, and back to ray::IDLE after a task):
                # the last title that says what it ran wins; a zombie's empty command line never does.
                if cmd and not cmd.startswith("ray::IDLE"):
                    known[-1] = (start, cmd)
            else:
                self.seen[pid].append((start, cmd))

    def run(self) -> None:
        while not self._done.wait(_SCAN_S):
            self.scan()

    def stop(self) -> None:
        self._done.set()
        self.join()
        self.scan()


def _records(path: Path) -> list[dict]:
    data = path.read_bytes()
    out = []
    for offset in range(0, len(data) - _ACCT_V3.size + 1, _ACCT_V3.size):
        f = _ACCT_V3.unpack_from(data, offset)
        if f[1] != 3:
            continue
        out.append({"pid": f[6], "ppid": f[7], "start": float(f[8]), "life": f[9] / _AHZ,
                    "cpu": (_comp_t(f[10]) + _comp_t(f[11])) / _AHZ,
                    "comm": f[18].split(b"\0")[0].decode(errors="replace")})
    return out


def _kind(cmd: str, comm: str) -> str:
    """A short name for what a process was: Ray's actor or task title, the rayline command, Ray's daemons."""
    if not cmd:
        return f"[{comm}]"
    if cmd.startswith("ray::"):
        return cmd.split()[0]
    for marker, kind in (("gcs_server", "ray gcs_server"), ("/raylet ", "ray raylet"), ("dashboard/agent.py", "ray dashboard agent"),
                         ("dashboard/dashboard.py", "ray dashboard"), ("ray-dashboard-", "ray dashboard module"),
                         ("log_monitor.py", "ray log monitor"), ("autoscaler/_private/monitor.py", "ray monitor"),
                         ("runtime_env/agent", "ray runtime-env agent"), ("default_worker.py", "ray worker (starting)"),
                         ("ray.util.client.server", "ray client server"), ("chrome", "chromium"), ("chromium", "chromium"),
                         ("-m pytest", "pytest (controller)"), (_XDIST_WORKER, "pytest-xdist worker"), ("-m pip ", "pip")):
        if marker in cmd:
            return kind
    words = cmd.split()
    if Path(words[0]).name in ("pip", "haproxy"):
        return Path(words[0]).name
    if "rayline.cli" in words or (len(words) > 1 and Path(words[1]).name == "rayline"):
        at = words.index("rayline.cli") if "rayline.cli" in words else 1
        sub = [w for w in words[at + 1:at + 3] if not w.startswith("-")]
        return "rayline " + " ".join(sub[:2] if sub and sub[0] in ("cluster", "serve", "jobs", "models", "retrain") else sub[:1])
    if words[0].endswith("/ray") or (len(words) > 1 and words[1].endswith("/ray")):
        return "ray CLI " + next((w for w in words[1:] if not w.startswith("/") and not w.startswith("-")), "")
    if words[0].endswith("/serve") or (len(words) > 1 and words[1].endswith("/serve")):
        return "serve CLI"
    if words[0].endswith("python") or "python" in Path(words[0]).name:
        return "python " + " ".join(words[1:3])[:40]
    return Path(words[0]).name[:40]


def profile(command: list[str], out: Path) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as tmp:
        acct_file = Path(tmp) / "pacct"
        acct_file.touch()
        if libc.acct(str(acct_file).encode()) != 0:
            err = ctypes.get_errno()
            sys.exit(f"suite_cpu: process accounting could not start ({os.strerror(err)}): it needs root and a kernel "
                     "with BSD process accounting")
        scanner = _CmdlineScanner()
        scanner.scan()
        scanner.start()
        busy0, started = _busy_ticks(), time.time()
        try:
            rc = subprocess.call(command)
        except OSError as exc:  # not found, not executable: said in one line, accounting off again
            rc, failed = 127, f"suite_cpu: could not start {command[0]!r}: {exc.strerror}"
        else:
            failed = None
        finally:
            libc.acct(None)
            wall, busy = time.time() - started, (_busy_ticks() - busy0) / os.sysconf("SC_CLK_TCK")
            scanner.stop()
        records = _records(acct_file)
    if failed:
        sys.exit(failed)
    _name(records, scanner.seen)
    result = {"command": command, "rc": rc, "wall_s": round(wall, 1), "machine_busy_cpu_s": round(busy, 1),
              "cores": os.cpu_count(), "records": records, "cmdlines": scanner.seen}
    out.write_text(json.dumps(result))
    report(result)
    return rc


# acct's start (the wall clock at exit less the process's monotonic age) and /proc's (boot time plus
# its start tick) drift apart over a long run on a VM: matched within 1.5 s, the first whole-suite
# profile (2026-12-07) named 385 of its 1,848 processes. A pid comes back only after the kernel's pid
# range wraps (32,768 on the CI box: hours of a suite's process starts).
_SAME_PROCESS_S = 120.0


def _name(records: list[dict], seen: dict) -> None:
    """Each record's command line: the scan's for the same pid whose start is nearest, within _SAME_PROCESS_S."""
    for record in records:
        near = [(abs(start - record["start"]), cmd) for start, cmd in seen.get(record["pid"], seen.get(str(record["pid"]), ()))
                if abs(start - record["start"]) <= _SAME_PROCESS_S and cmd]
        record["cmd"] = min(near)[1] if near else ""


def _lanes(records: list[dict]) -> dict[int, str]:
    """Each process's lane: the xdist worker it descends from (by parent pid, the parent alive when
    the child started), else 'outside the lanes' (pytest itself, and what was re-parented to init:
    `ray start` daemons)."""
    by_pid = collections.defaultdict(list)
    for i, r in enumerate(records):
        by_pid[r["pid"]].append(i)
    workers = {i for i, r in enumerate(records) if _XDIST_WORKER in r["cmd"]}

    def parent(i):
        r = records[i]
        alive = [j for j in by_pid.get(r["ppid"], ())
                 if records[j]["start"] - _SAME_PROCESS_S <= r["start"] <= records[j]["start"] + records[j]["life"] + _SAME_PROCESS_S]
        return min(alive, key=lambda j: abs(records[j]["start"] - r["start"])) if alive else None

    lane = {}
    for i in range(len(records)):
        chain, j = [], i
        while j is not None and j not in lane and j not in workers and len(chain) < 64:
            chain.append(j)
            j = parent(j)
        found = lane.get(j) if j in lane else (f"lane of xdist worker {records[j]['pid']}" if j in workers else "outside the lanes")
        for k in chain:
            lane[k] = found
        if j in workers:
            lane[j] = found
    return lane


def report(result: dict, top: int = 30) -> None:
    records = result["records"]
    lane = _lanes(records)
    total = sum(r["cpu"] for r in records)
    print(f"\n{result['command']}: exit {result['rc']}, wall {result['wall_s']:.0f} s on {result['cores']} cores; "
          f"machine busy {result['machine_busy_cpu_s']:.0f} CPU-s; processes that exited: {len(records)}, {total:.0f} CPU-s")
    per_lane = collections.Counter()
    for i, r in enumerate(records):
        per_lane[lane[i]] += r["cpu"]
    for name, cpu in per_lane.most_common():
        print(f"  {cpu:8.0f} CPU-s  {name}")
    kinds = collections.defaultdict(lambda: [0.0, 0])
    for r in records:
        k = _kind(r["cmd"], r["comm"])
        kinds[k][0] += r["cpu"]
        kinds[k][1] += 1
    print(f"\n{'CPU-s':>8} {'share':>6} {'procs':>6} {'each':>6}  kind")
    for k, (cpu, n) in sorted(kinds.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:8.1f} {cpu / (total or 1):6.1%} {n:6d} {cpu / n:6.2f}  {k}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("suite-cpu.json"))
    parser.add_argument("--report", type=Path, help="summarise a saved profile instead of running")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("command", nargs="*")
    args = parser.parse_args()
    if args.report:
        result = json.loads(args.report.read_text())
        if "cmdlines" in result:
            _name(result["records"], result["cmdlines"])
        report(result, args.top)
        return
    if not args.command:
        parser.error("a command to run (after --), or --report FILE")
    sys.exit(profile(args.command, args.out))


if __name__ == "__main__":
    main()
