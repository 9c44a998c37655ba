"""What a run trains on, said in words: the train stage's plan line (before any worker starts)
and the summary's "trained on" line (from what the workers found, recorded in their checkpoints'
`starts`), so a GPU run says it used the GPU, and which one.

    plan_text(plan, kinds)       -> '2 workers x 1 CPU + 1 GPU (H100)'      the resources asked for
    strategy_text(framework, 2)  -> 'DDP, bf16'                             how the workers train together
    worker_device(device)        -> {'type': 'cuda', 'name': 'NVIDIA H200', 'count': 1}   (in a worker)
    trained_on(starts)           -> '2 workers x NVIDIA H200 (cuda), DDP, bf16'   what they found

Each worker's start record (loop.py's EpochReporter.record_start) holds its `device` and
`strategy`, so a sweep's winner says what it ran with, its own overrides included.
"""

from __future__ import annotations

__all__ = ["cluster_accelerators", "plan_text", "spec_strategy_text", "strategy_text", "tf_worker_device", "trained_on",
           "worker_device", "xgboost_device"]


def plan_text(plan, cluster_kinds: tuple[str, ...] = ()) -> str:
    """The workers and each one's resources: '2 workers x 0.5 CPU', '1 workers x 1 CPU + 1 GPU (H100)',
    '4 workers x 1 CPU + 4 TPU'. The accelerator is named by train.accelerator_type, else by the
    cluster's accelerator types as Ray detected them (`cluster_kinds`, 'accelerator_type:<T>' resources)."""
    parts = [f"{plan.cpus_per_worker:g} CPU"]
    if plan.gpus_per_worker:
        parts.append(f"{plan.gpus_per_worker:g} GPU")
    parts += [f"{amount:g} {name}" for name, amount in plan.extra_per_worker if name in ("TPU", "HPU", "NPU")]
    kinds = (plan.accelerator_type,) if plan.accelerator_type else tuple(cluster_kinds)
    named = f" ({' or '.join(kinds)})" if kinds and len(parts) > 1 else ""
    return f"{plan.workers_text()} x {' + '.join(parts)}{named}"


def cluster_accelerators(resources: dict) -> tuple[str, ...]:
    """The accelerator types in Ray's cluster resources ('accelerator_type:H100' keys), sorted."""
    return tuple(sorted(key.split(":", 1)[1] for key in resources if key.startswith("accelerator_type:")))


def strategy_text(framework: str, workers: int, *, strategy: str = "ddp", precision: str = "fp32",
                  gpus_per_worker: float = 0.0) -> str:
    """How the workers train together, and in which precision: 'DDP, fp32', 'FSDP (sharded), bf16',
    'MultiWorkerMirroredStrategy, fp32', 'xgboost collective, device cuda'. `workers`: the most the
    plan starts (one worker has nobody to synchronise with)."""
    if framework == "xgboost":
        return f"{'xgboost collective' if workers > 1 else 'one booster'}, device {'cuda' if gpus_per_worker else 'cpu'}"
    if framework == "torch":
        together = ("FSDP (sharded)" if strategy == "fsdp" else "DDP") if workers > 1 else "one process"
    else:
        together = ("MultiWorkerMirroredStrategy" if workers > 1
                    else "MirroredStrategy" if gpus_per_worker > 1 else "one replica")
    return f"{together}, {precision}"


def spec_strategy_text(spec, workers: int) -> str:
    """strategy_text for a pipeline spec's train section."""
    train = spec.train
    gpus = float((train.resources_per_worker or {}).get("GPU", 1 if train.use_gpu else 0) or 0)
    return strategy_text(spec.model.framework, workers, strategy=train.strategy, precision=train.precision,
                         gpus_per_worker=gpus)


def worker_device(device) -> dict:
    """What a torch worker trains on (`device`: its torch.device), for its start record."""
    import torch

    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return {"type": "cuda", "name": torch.cuda.get_device_name(index), "count": 1}
    return {"type": device.type, "name": device.type, "count": 1, "threads": torch.get_num_threads()}


def tf_worker_device() -> dict:
    """What a TensorFlow worker trains on: its visible GPUs (MirroredStrategy uses them all), else the CPU."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return {"type": "cpu", "name": "cpu", "count": 1, "threads": tf.config.threading.get_intra_op_parallelism_threads()}
    details = tf.config.experimental.get_device_details(gpus[0])
    return {"type": "cuda", "name": details.get("device_name", "GPU"), "count": len(gpus)}


def xgboost_device(device: str, threads: int) -> dict:
    """What an xgboost worker boosts on: its GPU (named by the node's Ray accelerator type, as Ray
    detected it) or the CPU with its threads."""
    if device != "cuda":
        return {"type": "cpu", "name": "cpu", "count": 1, "threads": threads}
    import ray

    node = ray.get_runtime_context().get_node_id()
    kinds = [key.split(":", 1)[1] for n in ray.nodes() if n.get("NodeID") == node
             for key in n.get("Resources", {}) if key.startswith("accelerator_type:")]
    return {"type": "cuda", "name": kinds[0] if kinds else "GPU", "count": 1}


def trained_on(starts: list[dict]) -> str | None:
    """'2 workers x NVIDIA H200 (cuda)' or '1 worker x cpu (4 threads)', from the latest attempt's
    start record; None for runs whose records predate it."""
    start = next((s for s in reversed(starts or []) if s.get("device")), None)
    if start is None:
        return None
    device, workers = start["device"], int(start.get("workers", 1))
    count = int(device.get("count", 1))
    what = f"{count} x {device['name']}" if count > 1 else device["name"]
    if device["type"] == "cpu":
        threads = device.get("threads")
        what = f"cpu ({threads} thread{'s' if threads != 1 else ''})" if threads else "cpu"
    else:
        what += f" ({device['type']})"
    text = f"{workers} worker{'s' if workers != 1 else ''} x {what}"
    return text + (f", {start['strategy']}" if start.get("strategy") else "")
