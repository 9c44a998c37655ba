"""PyTorch backend: Ray Train TorchTrainer with DistributedDataParallel workers."""

from __future__ import annotations

import contextlib
import json
import logging
import os

import numpy as np

from rayline.inference.arch import ARCH_FILE
from rayline.inference.torch_model import WEIGHTS_FILE, build_model
from rayline.train.backend import Backend
from rayline.train.hardware import strategy_text, worker_device
from rayline.train.loop import (EpochReporter, available_memory, combine_metrics, epoch_order, eval_chunks,
                                fewest_rows, model_ready, own_valid_rows, sha256_of, shard_arrays, shard_plan,
                                streamed_preprocessing, with_last)
from rayline.inference.outputs import softmax
from rayline.evaluation.metrics import MetricPartials
from rayline.train.probe import probe_features, write_probe
from rayline.train.splits import ARRAYS_KEY, dataset_shard
from rayline.train.torch_steps import TorchSteps, register_compression

__all__ = ["TorchBackend", "BACKEND", "restore_hyperparameters", "state_digests"]

log = logging.getLogger(__name__)

_OPTIMIZER = "optimizer.pt"
_EVAL_BATCH = 4096


def _optimizer(params, spec: dict):
    import torch

    name = spec["name"]
    if name == "sgd":
        return torch.optim.SGD(params, lr=spec["lr"], momentum=spec["momentum"], weight_decay=spec["weight_decay"])
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    return cls(params, lr=spec["lr"], weight_decay=spec["weight_decay"])


def _bytes(value) -> bytes:
    """A state value's raw bytes: a tensor's elements (on the CPU, in order), anything else its repr."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return repr(value).encode()


def state_digests(weights: dict, optimizer_state: dict) -> dict:
    """A `starts` record's evidence (rayline/train/loop.py): sha256 of the weights (the state
    dict's tensors by sorted key) and of the optimizer state (`optimizer_state["state"]`, by
    sorted parameter key, then sorted name: exp_avg, exp_avg_sq, step, momentum_buffer...)."""
    state = optimizer_state.get("state", {})
    return {"weights_sha256": sha256_of(_bytes(weights[k]) for k in sorted(weights)),
            "optimizer_sha256": sha256_of(_bytes(state[k][n]) for k in sorted(state, key=str) for n in sorted(state[k]))}


def restore_hyperparameters(optimizer) -> None:
    """Put the optimizer's own hyperparameters (lr, momentum, weight_decay...) back after
    `load_state_dict`, which sets those the state was saved with: this run's config wins
    (PBT restarts a trial from another trial's checkpoint with a perturbed lr)."""
    for group in optimizer.param_groups:
        group.update({k: v for k, v in optimizer.defaults.items() if k in group and k != "params"})


class TorchBackend(Backend):
    name = "torch"

    def train_loop(self, config: dict) -> None:
        import ray.train
        import ray.train.torch
        import torch

        torch.manual_seed(config["seed"])
        torch.set_num_threads(config["threads"])
        reporter = EpochReporter(config.get("initial_checkpoint"))
        classification = config["task"] == "classification"
        model = build_model(config["arch"])
        restore = reporter.restore_model_dir
        if restore:  # full weights, before any wrapping or sharding (every rank reads the same file)
            model.load_state_dict(torch.load(os.path.join(restore, WEIGHTS_FILE), weights_only=True))
        device = ray.train.torch.get_device()
        # train.strategy: fsdp shards over the workers (rayline/train/torch_fsdp.py); one worker has nothing to shard.
        sharded = config.get("strategy", "ddp") == "fsdp" and reporter.world_size > 1
        if sharded:
            from rayline.train import torch_fsdp

            model = torch_fsdp.shard(model, device, reporter.world_size)
            optimizer = _optimizer(model.parameters(), config["optimizer"])  # over the sharded parameters
            if restore and torch_fsdp.load_optimizer_state(
                    model, optimizer, torch.load(os.path.join(restore, _OPTIMIZER), weights_only=True)):
                restore_hyperparameters(optimizer)
        else:
            optimizer = _optimizer(model.parameters(), config["optimizer"])
            if restore:
                try:
                    optimizer.load_state_dict(torch.load(os.path.join(restore, _OPTIMIZER), weights_only=True))
                    restore_hyperparameters(optimizer)
                except (KeyError, ValueError, TypeError, RuntimeError) as exc:  # an FSDP run's (keyed by name): start it afresh
                    log.warning("rayline: the checkpoint's optimizer state does not fit (%s); the optimizer starts afresh", exc)
            model = ray.train.torch.prepare_model(model)
            register_compression(model, config.get("grad_compression"))
        num_features = config["arch"]["num_features"]
        as_read = streamed_preprocessing(config)  # rows as read (images): decoded by this worker
        streamed = _collate(as_read, num_features, np.int64 if classification else np.float32)
        # train.in_memory: the shard fetched once and sliced here, or streamed every epoch (loop.py).
        plan = shard_plan(config.get("in_memory", "auto"), config.get("train_rows", 0), reporter.world_size, num_features,
                          streamed=streamed is not None, reserved_bytes=config.get("memory_per_worker"),
                          available_bytes=available_memory(),
                          local_workers=ray.train.get_context().get_local_world_size(),
                          handed_off="train" in (config.get(ARRAYS_KEY) or {}))
        # What this attempt trains from, read from the live model and optimizer (sharded: gathered,
        # a collective every rank joins; rank 0 holds the full state and writes the record).
        if sharded:
            evidence = state_digests(*torch_fsdp.full_state(model, optimizer))
        else:
            evidence = state_digests((model.module if hasattr(model, "module") else model).state_dict(),
                                     optimizer.state_dict())
        # The device it found (rayline/train/hardware.py): the summary's "trained on" line.
        reporter.record_start({**evidence, "train_shard": plan.as_dict(), "device": worker_device(device),
                               "strategy": strategy_text("torch", reporter.world_size, strategy="fsdp" if sharded else "ddp",
                                                         precision=config.get("precision", "fp32"))})
        loss_fn = torch.nn.CrossEntropyLoss() if classification else torch.nn.MSELoss()
        label_dtype = torch.long if classification else torch.float32
        train_shard = dataset_shard(config, "train")
        # This worker's share of "valid", read once, not one Ray Data execution per epoch (most
        # of an epoch's time on small data); the metrics combine every worker's (loop.py).
        valid_x, valid_y, valid_most = own_valid_rows(dataset_shard(config, "valid"), config["arch"]["num_features"],
                                                      np.int64 if classification else np.float32,
                                                      reporter.rank, reporter.world_size)
        valid_x = torch.from_numpy(valid_x).to(device)
        dummy_x = torch.zeros((1, config["arch"]["num_features"]), device=device)

        def allreduce_sum(values: np.ndarray) -> np.ndarray:
            import torch.distributed as dist

            tensor = torch.from_numpy(values).to(device)
            dist.all_reduce(tensor)
            return tensor.cpu().numpy()
        resident = (_ResidentShard(train_shard, num_features, np.int64 if classification else np.float32, device,
                                   reporter, allreduce_sum, as_read) if plan.kind == "memory" else None)
        # The probe rows of the test split (rayline/train/probe.py), predicted below at every epoch.
        probe_x = probe_features(config["arch"]["num_features"], config)
        probe_x = None if probe_x is None else torch.from_numpy(probe_x).to(device)
        per_worker_batch = max(1, config["batch_size"] // reporter.world_size)
        dtypes = {"features": torch.float32, "label": label_dtype}

        # train.precision and train.grad_accumulation (rayline/train/torch_steps.py).
        steps = TorchSteps(model, optimizer, precision=config.get("precision", "fp32"),
                           accumulation=config.get("grad_accumulation", 1), device_type=device.type)

        def loss_of(batch):
            out = model(batch["features"])
            return loss_fn(out if classification else out.reshape(-1), batch["label"])

        for epoch in range(reporter.start_epoch, config["epochs"]):
            model.train()
            optimizer.zero_grad(set_to_none=True)
            if resident is not None:
                batches = resident.batches(per_worker_batch, config["seed"], epoch, reporter.rank)
            else:
                batches = train_shard.iter_torch_batches(
                    batch_size=per_worker_batch, device=device,
                    local_shuffle_buffer_size=per_worker_batch * 4, local_shuffle_seed=config["seed"] + epoch,
                    # Rows as read (images): transformed in Ray Data's prefetch threads, beside the steps.
                    **({"collate_fn": streamed, "prefetch_batches": 2} if streamed is not None else {"dtypes": dtypes}),
                )
            meter = reporter.meter()
            for batch, last in with_last(batches):
                steps.micro_batch(lambda: loss_of(batch), last)
                meter.add(len(batch["label"]))
            stats = meter.stats(reporter.world_size, optimizer.param_groups[0]["lr"])

            model.eval()
            with torch.no_grad():  # as many calls on every worker (eval_chunks); a dummy row's output is dropped
                outputs = [model(valid_x[s] if s.stop > s.start else dummy_x)[:s.stop - s.start].float().cpu().numpy()
                           for s in eval_chunks(len(valid_x), valid_most, _EVAL_BATCH)]
            raw = np.concatenate(outputs) if outputs else np.zeros((0, config["arch"]["num_outputs"]), np.float32)
            part = MetricPartials.of(config["task"], softmax(raw) if classification else raw.reshape(-1), valid_y)
            metrics = combine_metrics(part, reporter.rank, reporter.world_size, allreduce_sum)
            # The live model's outputs on the probe rows, as `load`'s predict computes them (every
            # rank: a sharded forward is a collective); rank 0's checkpoint holds them.
            probe = None
            if probe_x is not None and len(probe_x):
                with torch.no_grad(), _ieee_fp32():
                    probe = model(probe_x).float().cpu().numpy()
                probe = softmax(probe) if classification else probe.reshape(-1)

            # Sharded: every rank gathers the full state (a collective); rank 0 writes it below.
            gathered = torch_fsdp.full_state(model, optimizer) if sharded else None

            def save(model_dir: str) -> None:
                os.makedirs(model_dir)
                if gathered is not None:
                    weights, optimizer_state = gathered
                else:
                    weights = (model.module if hasattr(model, "module") else model).state_dict()
                    optimizer_state = optimizer.state_dict()
                torch.save(weights, os.path.join(model_dir, WEIGHTS_FILE))
                torch.save(optimizer_state, os.path.join(model_dir, _OPTIMIZER))
                with open(os.path.join(model_dir, ARCH_FILE), "w") as fh:
                    json.dump(config["arch"], fh)
                write_probe(model_dir, probe)

            reporter.report(epoch, metrics, save, stats)
        reporter.close()

    def trainer_class(self):
        from ray.train.torch import TorchTrainer

        return TorchTrainer

    def trainer_options(self) -> dict:
        # Ray's TorchConfig, which the controller would unpickle, imports torch there (rayline/train/torch_cluster.py).
        from rayline.train.torch_cluster import TorchClusterConfig

        return {"torch_config": TorchClusterConfig()}

    def versions(self) -> dict[str, str]:
        import torch

        return {"torch": torch.__version__}


class _ResidentShard:
    """A worker's train shard held in memory for the whole run (ShardPlan kind "memory").

    Fetched once (handed off as arrays, or in Ray Data's large blocks; rows as read decoded once
    through `preprocessing`); on a GPU it lives on the device
    when it takes at most half of the device's free memory (a batch is then an index into it, no copy
    per step), else in host memory, each batch gathered there and copied to the device (not
    overlapped with the step: a shard that large is rare, and the copy is one batch). Every rank keeps
    the fewest rows any rank has (loop.py's fewest_rows)."""

    def __init__(self, shard, num_features: int, label_dtype, device, reporter, allreduce_sum, preprocessing=None):
        import torch

        x, y = shard_arrays(shard, num_features, label_dtype, preprocessing)  # rows as read: decoded once, here
        rows = fewest_rows(len(y), reporter.rank, reporter.world_size, allreduce_sum)
        self.x, self.y = torch.from_numpy(x[:rows]), torch.from_numpy(y[:rows])
        self.device = device
        self.on_device = device.type == "cpu"
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            if self.x.nbytes + self.y.nbytes <= free // 2:
                self.x, self.y, self.on_device = self.x.to(device), self.y.to(device), True

    def __len__(self) -> int:
        return len(self.y)

    def batches(self, batch_size: int, seed: int, epoch: int, rank: int):
        """This epoch's mini-batches: slices of a fresh permutation (loop.py's epoch_order)."""
        import torch

        order = torch.from_numpy(epoch_order(len(self), seed, epoch, rank))
        if self.on_device:
            order = order.to(self.device)
        for start in range(0, len(order), batch_size):
            index = order[start:start + batch_size]
            x, y = self.x.index_select(0, index), self.y.index_select(0, index)
            if not self.on_device:
                x, y = x.to(self.device), y.to(self.device)
            yield {"features": x, "label": y}


@contextlib.contextmanager
def _ieee_fp32():
    """TensorFloat-32 off for the probe's forward pass. On Ampere and later GPUs cuDNN runs fp32
    convolutions in TF32 by default: an H100-trained cnn's probe outputs were 8e-4 from the CPU
    fp32 that serving computes, and registration refused the version as skewed. In IEEE fp32 the
    two agree to the check's 1e-4; training and validation keep TF32's speed."""
    import torch

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _collate(preprocessing, num_features: int, label_dtype):
    """Ray Data's collate function for a train split of rows as read: each pandas batch through the
    fitted preprocessing into tensors (Ray moves them to the device). None when it is model-ready."""
    if preprocessing is None:
        return None
    import torch
    from ray.data.collate_fn import PandasBatchCollateFn

    class Transform(PandasBatchCollateFn):
        def __call__(self, frame):
            x, y = model_ready(preprocessing, frame, num_features, label_dtype)
            return {"features": torch.from_numpy(x), "label": torch.from_numpy(y)}

    return Transform()


BACKEND = TorchBackend()
