"""How busy the GPU was, sampled from NVML while a benchmark runs (the GPU variants of
overhead.py and image_training.py).

NVML's utilisation is the share of its last sample period (1/6 s to 1 s, by device) in which a
kernel was running on the GPU: "busy" here, not how much of the GPU each kernel used. It is read
every `interval` seconds in a thread of this process, which sees every process's kernels, so the
benchmark measures its subprocesses (the hand-written script, Ray's workers) from outside.

    with GpuBusy() as gpu:
        ...  # the work
    gpu.share(start, end)   # mean busy share between two time.time() stamps

nvidia-ml-py (import name `pynvml`) is on the lent GPU machines; benchmarks are not part of the
suite, and nothing here is imported unless `--gpu` is given.
"""

from __future__ import annotations

import threading
import time

__all__ = ["GpuBusy"]


class GpuBusy:
    def __init__(self, index: int = 0, interval: float = 0.05):
        self.index, self.interval = index, interval
        self.samples: list[tuple[float, int]] = []  # (time.time(), busy percent)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuBusy:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        self.name = pynvml.nvmlDeviceGetName(handle)

        def sample() -> None:
            while not self._stop.wait(self.interval):
                self.samples.append((time.time(), pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))

        self._thread = threading.Thread(target=sample, daemon=True, name="gpu-busy")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        import pynvml

        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        pynvml.nvmlShutdown()

    def share(self, start: float, end: float) -> float | None:
        """Mean busy share (0-1) of the samples taken between two wall-clock stamps; None without one."""
        inside = [busy for at, busy in self.samples if start <= at <= end]
        return sum(inside) / len(inside) / 100.0 if inside else None
