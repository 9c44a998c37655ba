"""Where the suite's time goes: per-test timings from the JUnit XML every run writes, by module and lane.

    python tests/timings.py                      # the last run (.test-timings.xml, pyproject.toml's addopts)
    python tests/timings.py BASE.xml NEW.xml     # two runs side by side: module sums and their change

A test's time is its setup, call and teardown (pytest's default junit_duration_report), so a
session fixture's start-up (the shared Ray, a trained pipeline) counts in the first test that asks
for it. Lanes are xdist's groups (tests/integration/conftest.py): the tests of one lane run one after
another in one worker, so the longest lane's sum is the suite's critical path; the wall time is about
that plus collection and start-up.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / ".test-timings.xml"
__all__ = ["TestTime", "read", "summary", "compare", "main"]


@dataclass(frozen=True)
class TestTime:
    module: str  # tests/integration/test_x.py
    name: str  # test_y[param]
    lane: str  # the xdist group ("session-ray", "own-processes"), or "-" in a run without lanes
    seconds: float
    outcome: str  # passed | failed | error | skipped


def read(path: str | Path) -> list[TestTime]:
    """The testcases of a pytest JUnit XML file."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        lane = ""
        if name.rfind("@") > name.rfind("]"):  # loadgroup's nodeids end in @GROUP (a parameter may hold an @)
            name, lane = name.rsplit("@", 1)
        module = case.get("classname", "").split(".")
        # classname is dotted: tests.integration.test_x[.TestClass]; keep the file's path
        parts = [p for p in module if not p[:1].isupper()]
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = "failed" if tag == "failure" else tag
        tests.append(TestTime("/".join(parts) + ".py", name, lane or "-", float(case.get("time", 0) or 0), outcome))
    return tests


def _by(tests, key):
    sums = defaultdict(float)
    for t in tests:
        sums[key(t)] += t.seconds
    return dict(sorted(sums.items(), key=lambda kv: -kv[1]))


def summary(tests: list[TestTime], top: int = 20) -> str:
    lanes = _by(tests, lambda t: t.lane)
    modules = _by(tests, lambda t: (t.lane, t.module))
    counts = defaultdict(int)
    for t in tests:
        counts[t.outcome] += 1
    lines = [f"{len(tests)} tests ({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}); "
             f"sum {sum(lanes.values()):.0f} s; critical path (longest lane) {max(lanes.values(), default=0):.0f} s", "",
             "lane                 seconds  tests"]
    for lane, secs in lanes.items():
        lines.append(f"{lane:<20} {secs:>7.0f}  {sum(1 for t in tests if t.lane == lane):>5}")
    lines += ["", "module (lane)                                                seconds  tests"]
    for (lane, module), secs in modules.items():
        n = sum(1 for t in tests if t.module == module and t.lane == lane)
        lines.append(f"{module + ' (' + lane + ')':<60} {secs:>7.1f}  {n:>5}")
    lines += ["", f"top {top} tests                                                          seconds"]
    for t in sorted(tests, key=lambda t: -t.seconds)[:top]:
        lines.append(f"{(t.module.rsplit('/', 1)[-1] + '::' + t.name)[:70]:<72} {t.seconds:>7.1f}")
    return "\n".join(lines)


def compare(base: list[TestTime], new: list[TestTime]) -> str:
    b, n = _by(base, lambda t: t.module), _by(new, lambda t: t.module)
    bl, nl = _by(base, lambda t: t.lane), _by(new, lambda t: t.lane)
    lines = [f"{'':<52} {'base':>8} {'new':>8} {'ratio':>6}",
             f"{'tests':<52} {len(base):>8} {len(new):>8}",
             f"{'sum of test times (s)':<52} {sum(b.values()):>8.0f} {sum(n.values()):>8.0f} "
             f"{sum(n.values()) / max(sum(b.values()), 1e-9):>6.2f}",
             f"{'critical path, longest lane (s)':<52} {max(bl.values(), default=0):>8.0f} "
             f"{max(nl.values(), default=0):>8.0f} {max(nl.values(), default=0) / max(max(bl.values(), default=0), 1e-9):>6.2f}",
             ""]
    for lane in sorted(set(bl) | set(nl)):
        lines.append(f"{'lane ' + lane:<52} {bl.get(lane, 0):>8.0f} {nl.get(lane, 0):>8.0f}")
    lines.append("")
    for module in sorted(set(b) | set(n), key=lambda m: -max(b.get(m, 0), n.get(m, 0))):
        lines.append(f"{module:<52} {b.get(module, 0):>8.1f} {n.get(module, 0):>8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2:
        print(compare(read(args[0]), read(args[1])))
        return
    path = Path(args[0]) if args else DEFAULT
    if not path.exists():
        sys.exit(f"tests/timings.py: no timings at {path}: run the suite first (pyproject.toml writes them there)")
    print(summary(read(path)))


if __name__ == "__main__":
    main()
