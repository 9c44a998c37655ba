"""How a torch worker turns micro-batches into optimizer steps: precision and gradient accumulation.

`train.precision`: bf16 runs the forward pass and the loss under `torch.autocast` (CPU and
GPU); fp16 (GPU only) adds a `GradScaler`, whose dynamic loss scale keeps small fp16
gradients from flushing to zero. Parameters, gradients and optimizer state stay fp32, so
checkpoints load for serving in fp32 unchanged.

`train.grad_accumulation: N`: N micro-batches per optimizer step. Each micro-batch's loss is
divided by N, so the summed gradients are those of one batch N times larger (same-size
micro-batches: Ray's equal split gives every worker the same number of rows). Under DDP the
first N-1 backward passes run inside `model.no_sync()` (FSDP: `set_requires_gradient_sync(False)`):
gradients add up locally and only the last one all-reduces (reduce-scatters), which is the
point (N times fewer collective calls). An epoch whose
micro-batch count is not a multiple of N ends with a shorter group, stepped with its
gradients rescaled to that group's mean (the last micro-batch is known one batch ahead, so
that group all-reduces too).
"""

from __future__ import annotations

import contextlib
from typing import Callable

__all__ = ["TorchSteps", "register_compression"]


def register_compression(model, compression: dict) -> str:
    """Install train.grad_compression as DDP's communication hook; returns what was installed.

    fp16/bf16: gradients are cast for the all-reduce and back (half the bytes). PowerSGD:
    each gradient matrix is sent as two rank-`rank` factors, after `start_iter` plain steps,
    with error feedback (what compression dropped is added to the next step's gradient).
    A model that is not DDP-wrapped (one worker) all-reduces nothing: no hook."""
    from torch.nn.parallel import DistributedDataParallel

    name = (compression or {}).get("name", "none")
    if name == "none" or not isinstance(model, DistributedDataParallel):
        return "none"
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif name == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(compression["rank"]),
                                            start_powerSGD_iter=int(compression["start_iter"]))
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        raise ValueError(f"unknown grad_compression {name!r}")
    return name


class TorchSteps:
    """Backward passes and optimizer steps for one worker."""

    def __init__(self, model, optimizer, *, precision: str = "fp32", accumulation: int = 1, device_type: str = "cpu"):
        import torch

        self.model, self.optimizer = model, optimizer
        self.accumulation = max(1, int(accumulation))
        self.device_type = device_type
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(device_type) if precision == "fp16" else None
        self.steps = 0  # optimizer steps taken (for throughput and tests)
        self._pending = 0  # micro-batches whose gradients await a step

    def autocast(self):
        """The training forward pass's precision. Validation runs in fp32, as the served model does,
        so the metric that picks the best checkpoint is the one users get."""
        import torch

        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def micro_batch(self, loss_of: Callable[[], object], last: bool):
        """Forward + backward of one micro-batch; steps the optimizer at the end of a group of
        N, or at `last` (the epoch's final micro-batch). Returns the micro-batch's loss, a detached
        tensor on the device: reading it as a number would wait for the GPU at every step."""
        self._pending += 1
        sync = last or self._pending == self.accumulation
        context = contextlib.nullcontext()
        if hasattr(self.model, "set_requires_gradient_sync"):  # FSDP2: no reduce-scatter until the last
            self.model.set_requires_gradient_sync(sync)
        elif not sync and hasattr(self.model, "no_sync"):  # DDP; a single worker's plain module has neither
            context = self.model.no_sync()
        with context:
            with self.autocast():
                loss = loss_of()
            scaled = loss.float() / self.accumulation
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        if sync:
            self._step()
        return loss.detach()

    def _step(self) -> None:
        if self._pending < self.accumulation:  # a short last group: its mean, not 1/N of a sum
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            factor = self.accumulation / self._pending
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(factor)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        self._pending = 0
