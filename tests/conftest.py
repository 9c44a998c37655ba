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
