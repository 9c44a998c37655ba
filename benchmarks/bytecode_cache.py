"""What a process pays to compile rayline from source: `python -m rayline.cli --help` with no bytecode
cache (as under PYTHONDONTWRITEBYTECODE, which tests/conftest.py lifts for the suite) against the same
command with rayline's .pyc written, side by side, CPU-s of the child (median of --rounds).

    python benchmarks/bytecode_cache.py --rounds 3
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from statistics import median

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "rayline"


def _caches() -> list[Path]:
    return list(PACKAGE.rglob("__pycache__"))


def _child_cpu() -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "rayline.cli", "--help"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures = {"from source": [], "cached": []}
    for _ in range(args.rounds):
        for path in _caches():
            shutil.rmtree(path, ignore_errors=True)
        figures["from source"].append(_child_cpu())
        compileall.compile_dir(str(PACKAGE), quiet=1)
        figures["cached"].append(_child_cpu())
    source, cached = median(figures["from source"]), median(figures["cached"])
    print(f"rayline --help, CPU-s, median of {args.rounds}: from source {source:.2f}, cached {cached:.2f}, ratio {cached / source:.2f}")


if __name__ == "__main__":
    main()
