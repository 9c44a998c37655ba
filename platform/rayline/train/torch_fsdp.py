"""train.strategy: fsdp for the torch backend: parameters, gradients and optimizer state sharded
across the workers (torch's FSDP2, `torch.distributed.fsdp.fully_shard`).

Ray Train's `prepare_model(parallel_strategy="fsdp")` wraps with FSDP1, which refuses to run
without an accelerator ("FSDP needs a non-CPU accelerator device"); FSDP2 shards over a device
mesh of the process group Ray Train already set up (gloo on CPU workers, NCCL on GPUs), so the
same code trains on both. Each child module that holds parameters becomes its own shard unit
(its parameters are gathered for its forward and backward only), then the root.

Checkpoints hold the full, unsharded state: every rank takes part in gathering it
(`get_model_state_dict(full_state_dict=True)`, a collective) and rank 0 writes it, so the
weights file is exactly a plain model's `state_dict()` and serving loads it on one replica
unchanged; a restart with another number of workers (elastic training) reshards it.
"""

from __future__ import annotations

import logging

__all__ = ["shard", "full_state", "load_optimizer_state"]

log = logging.getLogger(__name__)


def shard(model, device, world_size: int):
    """`model` sharded over `world_size` workers, in place; returns it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model.to(device)
    mesh = init_device_mesh(device.type, (world_size,))
    for unit in _units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _units(module):
    """The shard units under `module`: each child holding parameters, except that a container
    without a forward of its own (a ModuleList or ModuleDict: the image and text kinds' encoders)
    gives its members instead, which fully_shard requires."""
    from torch import nn

    for child in module.children():
        if not any(True for _ in child.parameters()):
            continue
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            yield from _units(child)
        else:
            yield child


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state(model, optimizer) -> tuple[dict, dict]:
    """(model state_dict, optimizer state) unsharded on rank 0 (empty elsewhere). A collective:
    every rank must call it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return get_model_state_dict(model, options=_options()), get_optimizer_state_dict(model, optimizer, options=_options())


def load_optimizer_state(model, optimizer, state: dict) -> bool:
    """Restore a full optimizer state (as `full_state` saved it) into the sharded optimizer, on
    every rank. False, with a warning, for a state it cannot take (one saved by a DDP run, whose
    optimizer file is keyed by parameter index): training then starts its optimizer afresh."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    try:
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
        return True
    except (KeyError, RuntimeError, ValueError) as exc:
        log.warning("rayline: the checkpoint's optimizer state does not fit the sharded model (%s); "
                    "the optimizer starts afresh", exc)
        return False
