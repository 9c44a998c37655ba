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

# OpenMP's idle threads sleep in the suite's processes as in every process rayline's CLI and Rays run
# (rayline.cluster.env.passive_thread_waits): the suite's xdist workers also train through rayline's
# Python API, in process, with torch and xgboost on 2 threads, on a box the other lane keeps busy, where
# libgomp's spinning threads took 2-15x the time (benchmarks/thread_waits.py). Set before xdist starts
# its workers, so they load libgomp with it; test_cluster_env.py checks the CLI sets it without this.
from rayline.cluster.env import passive_thread_waits  # noqa: E402

passive_thread_waits()
