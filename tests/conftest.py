"""Suite-wide setup, read by pytest before any test module is imported and before xdist starts its
workers, so every process the suite starts inherits it."""

import os
import sys

# Python's bytecode cache, on for the suite's processes. With PYTHONDONTWRITEBYTECODE set (the 2-core
# machines this suite is timed on set it), Python writes no .pyc for rayline's ~30,000 lines, and every
# process the suite starts compiles the rayline modules it imports again from source: each `python -m
# rayline.cli`, Ray worker, Serve replica and training worker, some hundreds of processes a run.
# (Installed packages are compiled by pip at install; rayline, installed editable, never is.)
# Measured on the 2-core CI box (2026-12-07): compiling all 189 modules takes 0.52 CPU-s; side by side
# (benchmarks/bytecode_cache.py) `python -m rayline.cli --help` took 0.91 CPU-s from source, 0.88 from
# the cache (0.97x): a small saving per process, for processes that import more. The cache goes where
# Python puts it by default, in __pycache__ folders beside the sources: git ignores them, and
# `rayline submit` never ships them (rayline/jobs/package.py).
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

# OpenMP's idle threads sleep in the suite's processes (OMP_WAIT_POLICY=PASSIVE). By default libgomp's
# threads (torch's intra-op pool and MKL, xgboost, scikit-learn) spin after each parallel region before
# they sleep; on this suite's box both cores are always busy (two lanes, Ray's processes), and a
# spinning thread takes the core from the one with work. benchmarks/thread_waits.py on the 2-core box
# (2026-12-07, medians of 3, each case a fresh process): beside 2 busy processes a 2-thread torch MLP
# took 2.69 s with the default and 1.36 s passive, xgboost 0.81 s and 0.49 s (CPU 0.34x and 0.42x).
# Not rayline's default: on an idle machine the sleeping threads' wake-ups cost 1.49x and 1.32x there.
# The policy changes no result (the same threads split the same work), only how idle threads wait.
# At the suite's scale no gain beyond the box's noise was shown (five training modules in both orders:
# 0.92x, then 1.06x; docs/development.md): it stays for the contended processes the benchmark measures.
# Set before xdist starts its workers, so every process of the suite loads libgomp with it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
