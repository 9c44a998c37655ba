"""XGBoost backend: Ray Train XGBoostTrainer, one booster trained over xgboost's collective.

Ray Train (V2) starts the rabit tracker and wraps each worker's train function in
xgboost's CommunicatorContext, so `xgboost.train` on each worker's shard of "train"
builds one shared booster (histograms are all-reduced). Every worker holds its share of
"valid" (loop.own_valid_rows); a TrainingCallback evaluates it every `checkpoint_every`
rounds, combines the workers' metric partials over the collective (loop.combine_metrics: the
metrics of the whole split, the same on every worker) and reports through `EpochReporter`
("epoch" = boosting round index, 0-based), which also gives the best checkpoint and resume
after a worker failure.

Parameters of kind `gbdt` (`model.params`) go to xgboost as they are, except:
- num_boost_round: rounds in all (default: train.epochs, which the spec documents as
  the boosting-rounds default for xgboost).
- early_stopping_rounds: stop when the spec's metric on "valid" has not improved for this
  many rounds (default 10; 0 or null turns it off). It is checked at the evaluated rounds.
- checkpoint_every: evaluate, report and checkpoint every this many rounds (default:
  1 up to 100 rounds, then rounds // 100, so a run reports at most ~100 times); the last
  round, and the round where early stopping ends training, are always reported.
- external_memory: `auto` (default), `always` or `never`: whether a worker's train shard
  becomes an `ExtMemQuantileDMatrix`, its pages cached on the worker's local disk, instead of
  a `QuantileDMatrix` in RAM (see `matrix_plan`). `auto` picks it when the shard's bin
  indices would take more than half of the worker's memory budget: the memory it reserves
  (`train.resources_per_worker.memory`), else its share of the node's available memory.
The objective follows the task: reg:squarederror, binary:logistic (2 classes) or
multi:softprob with num_class. nthread is the worker's CPU share (loop config "threads").

The saved model directory holds `model.ubj` (the booster), `xgb_state.json` (early
stopping state, for resume) and `arch.json`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from rayline.frameworks import total_units
from rayline.inference.arch import ARCH_FILE
from rayline.inference.xgboost_model import MODEL_FILE
from rayline.inference.xgboost_model import outputs as model_outputs
from rayline.train.backend import Backend
from rayline.train.hardware import strategy_text, xgboost_device
from rayline.train.loop import (EpochReporter, available_memory, combine_metrics, own_valid_rows, sha256_of,
                                shard_batches, streamed_preprocessing)
from rayline.evaluation.metrics import MetricPartials
from rayline.train.probe import probe_features, write_probe
from rayline.train.splits import dataset_shard
from rayline.workspace import owned_tempdir, sweep_orphans

__all__ = ["XGBoostBackend", "BACKEND", "objective_params", "MatrixPlan", "matrix_plan", "train_matrix",
           "EXTERNAL_MEMORY", "EXTMEM_PREFIX"]

_STATE = "xgb_state.json"
_MAX_METRICS = {"accuracy", "f1", "precision", "recall", "roc_auc", "r2"}  # as rayline.spec.metric_mode
_DEFAULT_EARLY_STOPPING = 10
# model.params.external_memory: how a worker holds its train shard (see matrix_plan).
EXTERNAL_MEMORY = ("auto", "always", "never")
# An external-memory matrix's disk cache: an owned temporary folder per worker, removed when
# training ends, and by the next worker on the node if this one was killed.
EXTMEM_PREFIX = "rayline-xgb-extmem-"
# `auto` goes external when the in-RAM matrix would take more than this share of the budget:
# the rest is for what stays in RAM either way (gradients and predictions per row, the
# histograms, a batch being read, Python and xgboost themselves).
_IN_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class MatrixPlan:
    """How one worker holds its train shard: `kind` is "quantile" (QuantileDMatrix in RAM),
    "external" (ExtMemQuantileDMatrix, pages on local disk) or "dmatrix" (a tree method other
    than hist: the float rows in RAM); with the figures that decided it."""

    kind: str
    shard_rows: int
    estimated_bytes: int  # the QuantileDMatrix's bin indices for shard_rows
    budget_bytes: int
    budget_source: str  # "reserved" (resources_per_worker.memory) or "available" (node memory share)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "shard_rows": self.shard_rows, "estimated_bytes": self.estimated_bytes,
                "budget_bytes": self.budget_bytes, "budget_source": self.budget_source}


def matrix_plan(setting: str, tree_method: str, train_rows: int, world_size: int, num_features: int,
                max_bin: int, reserved_bytes: float | None, available_bytes: int, local_workers: int) -> MatrixPlan:
    """Decide how a worker holds its shard, before reading it.

    A QuantileDMatrix holds one bin index per value: 1 byte up to 256 bins, 2 beyond (the
    estimate ignores xgboost's further compression, so it errs towards external memory).
    The budget is the worker's reserved Ray memory when it reserves some, else the node's
    available memory divided among this run's workers on the node."""
    shard_rows = math.ceil(max(0, train_rows) / max(1, world_size))
    estimate = shard_rows * num_features * (1 if max_bin <= 256 else 2)
    if reserved_bytes:
        budget, source = int(reserved_bytes), "reserved"
    else:
        budget, source = int(available_bytes // max(1, local_workers)), "available"
    if tree_method not in ("hist", "auto"):
        kind = "dmatrix"  # exact/approx need the values; xgboost's external memory is hist-only
    elif setting == "always":
        kind = "external"
    elif setting == "never":
        kind = "quantile"
    else:
        kind = "external" if estimate > _IN_MEMORY_SHARE * budget else "quantile"
    return MatrixPlan(kind, shard_rows, estimate, budget, source)


def objective_params(task: str, num_outputs: int) -> dict:
    """The xgboost objective for a task and its number of outputs (classes, or 1)."""
    if task == "regression":
        return {"objective": "reg:squarederror"}
    if num_outputs == 2:
        return {"objective": "binary:logistic"}
    return {"objective": "multi:softprob", "num_class": int(num_outputs)}


def train_matrix(batches: Callable[[], Iterable], params: dict, num_features: int, kind: str = "quantile",
                 may_be_empty: bool = False, cache_dir: str | None = None):
    """The train shard as xgboost's matrix, and its number of rows.

    `batches()` gives a new pass over the shard's batches, [(features float32 (n, d), labels)],
    each time it is called (loop.shard_batches over the worker's Ray Train shard). `kind`
    (MatrixPlan.kind):
    - "quantile": a QuantileDMatrix fed batch by batch, streamed from Ray Data in each of its
      passes (one to sketch the quantiles, one to bin): the worker never holds the shard's float
      values, only 1-byte bin indices (about 4x less than the float32 rows; at 100M rows on the
      2-core, 24 GB machine, holding both ran the node out of memory).
    - "external": an ExtMemQuantileDMatrix over the same passes, its binned pages written under
      `cache_dir` (local disk) and read back page by page each round: RAM holds a page, not the
      shard.
    - "dmatrix": tree methods other than hist need the values themselves: the concatenated shard.

    `may_be_empty`: the split has fewer rows than there are workers (Ray gives every worker the
    same number of rows: then none). An empty shard has nothing to sketch, and a DMatrix of no
    rows still takes part in the collective's column-count sync; such a shard is tiny, so it is
    read into memory first to see."""
    import xgboost as xgb

    nthread = params["nthread"]
    if may_be_empty:
        pairs = list(batches())
        if not pairs:
            return xgb.DMatrix(np.zeros((0, num_features), np.float32), label=np.zeros((0,), np.float32),
                               nthread=nthread), 0
        batches = lambda: pairs  # noqa: E731 - the tiny shard, held
    if kind == "dmatrix":
        pairs = list(batches())
        x = np.concatenate([x for x, _ in pairs]) if pairs else np.zeros((0, num_features), np.float32)
        y = np.concatenate([y for _, y in pairs]).astype(np.float32) if pairs else np.zeros((0,), np.float32)
        return xgb.DMatrix(x, label=y, nthread=nthread), len(y)

    class _Batches(xgb.DataIter):
        def __init__(self, cache_prefix: str | None):
            self.rows, self.counted, self.source = 0, False, None
            super().__init__(cache_prefix=cache_prefix)

        def next(self, input_data) -> bool:
            if self.source is None:
                self.source = iter(batches())
            x, y = next(self.source, (None, None))
            if x is None:
                self.counted = True  # the first whole pass counted the rows
                return False
            if not self.counted:
                self.rows += len(y)
            input_data(data=x, label=y.astype(np.float32))
            return True

        def reset(self) -> None:
            self.source = None

    max_bin = int(params.get("max_bin", 256))
    if kind == "external":
        if cache_dir is None:
            raise ValueError("an external-memory matrix needs a cache_dir")
        it = _Batches(os.path.join(cache_dir, "shard"))
        return xgb.ExtMemQuantileDMatrix(it, max_bin=max_bin, nthread=nthread), it.rows
    it = _Batches(None)
    return xgb.QuantileDMatrix(it, max_bin=max_bin, nthread=nthread), it.rows


def _settings(config: dict) -> tuple[dict, int, int, int, str]:
    """(xgboost params, num_boost_round, early_stopping_rounds, checkpoint_every, external_memory)
    from the loop config."""
    arch = config["arch"]
    params = dict(arch["model"].get("params", {}))
    rounds = total_units("xgboost", params, config["epochs"])
    params.pop("num_boost_round", None)
    early = params.pop("early_stopping_rounds", _DEFAULT_EARLY_STOPPING)
    early = int(early) if early else 0
    every = params.pop("checkpoint_every", None)
    every = max(1, int(every)) if every else max(1, rounds // 100)
    external = str(params.pop("external_memory", "auto"))
    params.update(objective_params(config["task"], arch["num_outputs"]))
    params["nthread"] = int(config["threads"])
    # train.use_gpu: the worker's own GPU (Ray Train sets CUDA_VISIBLE_DEVICES per worker), where
    # xgboost builds the matrix and boosts; without it xgboost would train on the CPU beside an idle GPU.
    params["device"] = "cuda" if config.get("use_gpu") else "cpu"
    params.setdefault("seed", int(config["seed"]))
    params.setdefault("verbosity", 1)
    return params, max(1, rounds), early, every, external


class XGBoostBackend(Backend):
    name = "xgboost"

    def train_loop(self, config: dict) -> None:
        import ray.train

        reporter = EpochReporter()
        arch = config["arch"]
        params, num_boost_round, early_stopping, every, external = _settings(config)
        label_dtype = np.int64 if config["task"] == "classification" else np.float32

        train_shard = dataset_shard(config, "train")
        # This worker's share of "valid"; the metrics combine every worker's (loop.py).
        valid_x, valid_y, _ = own_valid_rows(dataset_shard(config, "valid"), arch["num_features"], label_dtype,
                                             reporter.rank, reporter.world_size)
        probe_x = probe_features(arch["num_features"], config)  # the probe rows of the test split (rayline/train/probe.py)
        # Every worker builds its matrix (construction syncs the column count, and the quantile
        # sketch, over the collective).
        plan = matrix_plan(external, params.get("tree_method", "hist"), int(config.get("train_rows", 0)),
                           reporter.world_size, arch["num_features"], int(params.get("max_bin", 256)),
                           config.get("memory_per_worker"), available_memory(),
                           ray.train.get_context().get_local_world_size())
        sweep_orphans(tempfile.gettempdir(), EXTMEM_PREFIX)  # left by a killed worker on this node
        cache_dir = owned_tempdir(tempfile.gettempdir(), EXTMEM_PREFIX) if plan.kind == "external" else None
        try:
            dtrain, train_rows = train_matrix(lambda: shard_batches(train_shard, arch["num_features"], label_dtype,
                                                                         streamed_preprocessing(config)),
                                              params, arch["num_features"], kind=plan.kind, cache_dir=cache_dir,
                                              may_be_empty=config.get("train_rows", 0) < reporter.world_size)
            self._boost(reporter, config, params, dtrain, train_rows, plan, num_boost_round, early_stopping, every,
                        valid_x, valid_y, probe_x)
        finally:
            if cache_dir is not None:
                shutil.rmtree(cache_dir, ignore_errors=True)

    def _boost(self, reporter, config, params, dtrain, train_rows, plan, num_boost_round, early_stopping, every,
               valid_x, valid_y, probe_x) -> None:
        import xgboost as xgb
        from xgboost import collective

        task = config["task"]
        arch = config["arch"]
        num_outputs = arch["num_outputs"]
        metric = config["metric"]
        maximize = metric in _MAX_METRICS

        state = {"best_score": None, "best_round": -1, "stopped": False, "num_boost_round": num_boost_round}
        booster = None
        if reporter.restore_model_dir:
            booster = xgb.Booster(model_file=os.path.join(reporter.restore_model_dir, MODEL_FILE))
            try:
                with open(os.path.join(reporter.restore_model_dir, _STATE)) as fh:
                    state.update(json.load(fh))
            except (OSError, ValueError):
                pass
            state["num_boost_round"] = num_boost_round
        done = booster.num_boosted_rounds() if booster is not None else 0
        remaining = num_boost_round - done

        meter = reporter.meter()  # rows x rounds per second between reports
        lr = float(params.get("eta", params.get("learning_rate", 0.3)))  # xgboost's default eta

        class _ReportCallback(xgb.callback.TrainingCallback):
            """Evaluate "valid" with rayline's metrics, report, checkpoint, and stop early."""

            def before_training(self, model):
                # What this attempt trains from, read from the booster xgb.train boosts on (its copy
                # of the restored one): its rounds and trees (the JSON dump, tree by tree), and the
                # early-stopping state it continues.
                reporter.record_start({
                    "train_matrix": plan.as_dict(),
                    "device": xgboost_device(params["device"], int(params["nthread"])),  # rayline/train/hardware.py
                    "strategy": strategy_text("xgboost", reporter.world_size,
                                              gpus_per_worker=1 if params["device"] == "cuda" else 0),
                    "rounds": model.num_boosted_rounds(),
                    "trees_sha256": sha256_of(tree.encode() for tree in model.get_dump(dump_format="json")),
                    "early_stopping": {"best_score": state["best_score"], "best_round": state["best_round"]},
                })
                return model

            def after_iteration(self, model, epoch, evals_log) -> bool:
                rnd = model.num_boosted_rounds() - 1  # absolute round index, also after resume
                meter.add(train_rows)
                last = rnd + 1 >= num_boost_round
                if (rnd + 1) % every and not last:
                    if not early_stopping or rnd - state["best_round"] < early_stopping:
                        return False
                    # early stopping is due between checkpoints: evaluate now, stop here
                raw = model.inplace_predict(valid_x) if len(valid_x) else np.zeros((0, num_outputs if num_outputs > 2 else 1))
                part = MetricPartials.of(task, model_outputs(raw, task, num_outputs), valid_y)
                metrics = combine_metrics(part, reporter.rank, reporter.world_size,
                                          lambda values: collective.allreduce(values, collective.Op.SUM))
                # The live booster's outputs on the probe rows, as `load`'s predict computes them;
                # rank 0's checkpoint holds them.
                probe = None
                if probe_x is not None and len(probe_x):
                    probe = model_outputs(model.inplace_predict(probe_x), task, num_outputs)
                score = metrics.get(metric)
                if score is not None and np.isfinite(score):
                    best = state["best_score"]
                    if best is None or (score > best if maximize else score < best):
                        state["best_score"], state["best_round"] = float(score), rnd
                stop = bool(early_stopping) and state["best_round"] >= 0 and rnd - state["best_round"] >= early_stopping
                if collective.is_distributed():
                    # Every worker has the same combined metrics; rank 0 decides anyway, so
                    # that no worker leaves the collective while another stays.
                    stop = bool(collective.broadcast(stop, 0))
                state["stopped"] = stop or last
                snapshot = dict(state)

                def save(model_dir: str) -> None:
                    os.makedirs(model_dir)
                    model.save_model(os.path.join(model_dir, MODEL_FILE))
                    with open(os.path.join(model_dir, _STATE), "w") as fh:
                        json.dump(snapshot, fh)
                    with open(os.path.join(model_dir, ARCH_FILE), "w") as fh:
                        json.dump(dict(arch, xgboost_params=params), fh)
                    write_probe(model_dir, probe)

                reporter.report(rnd, metrics, save, meter.stats(reporter.world_size, lr))
                return stop

        if remaining > 0 and not state["stopped"]:
            xgb.train(
                params,
                dtrain,
                num_boost_round=remaining,
                xgb_model=booster,
                callbacks=[_ReportCallback()],
                verbose_eval=False,
            )
        reporter.close()

    def trainer_class(self):
        from ray.train.xgboost import XGBoostTrainer

        return XGBoostTrainer

    def versions(self) -> dict[str, str]:
        import xgboost

        return {"xgboost": xgboost.__version__}


BACKEND = XGBoostBackend()
