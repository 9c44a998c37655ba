"""What each framework offers, described without importing the framework: the catalog of names
shared by the spec, training (`rayline.train`) and prediction (`rayline.inference`).

The spec validates `model.framework`, `model.kind`, `model.params` and accelerator choices
against this table, so `rayline validate` and `rayline --help` never import torch,
TensorFlow or xgboost. Each framework has two halves, named here and imported only when
needed: its training backend (`module`, loaded by `rayline.train.backend.load_backend`) and its
inference module (`inference`, loaded by `rayline.inference`), which serving uses alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BackendInfo", "BACKENDS", "total_units"]


@dataclass(frozen=True)
class BackendInfo:
    """One framework: its two modules, built-in model kinds and their parameters."""

    name: str
    module: str  # the training backend, "rayline.train.torch_backend"; imported lazily
    inference: str  # the prediction half, "rayline.inference.torch_model": load(model_dir, meta), ENV
    kinds: dict[str, frozenset[str]]  # built-in kind -> parameters it accepts
    accelerators: frozenset[str] = field(default_factory=lambda: frozenset({"cpu", "gpu"}))
    epoch_based: bool = True  # False: rounds instead of epochs (xgboost)
    units_param: str = ""  # the model parameter that counts its units of training instead of epochs, if any
    units: str = "epochs"  # what its units of training are called, in what rayline prints
    import_returns: str = ""  # what a `model.import` callable must return
    precisions: frozenset[str] = frozenset({"fp32", "bf16", "fp16"})  # train.precision values it trains in
    grad_accumulation: bool = True  # whether train.grad_accumulation > 1 means anything (mini-batch training)
    grad_compressions: frozenset[str] = frozenset()  # train.grad_compression values besides none
    strategies: frozenset[str] = frozenset({"ddp"})  # train.strategy values (ddp: the framework's data parallelism)
    multi_gpu_workers: bool = False  # whether one worker trains on several GPUs (resources_per_worker.GPU > 1)
    param_choices: dict[str, tuple] = field(default_factory=dict)  # parameter -> the only values it takes
    # Whether one worker may train in the driver's or a trial's own process (rayline/train/in_process.py):
    # the framework's process-wide setup can be made again by a later run in the same process.
    trains_in_process: bool = True
    # Work (train rows x units) up to which N CPU workers of a one-node run train as one process of N
    # threads (rayline/train/in_process.py): about what trains in the time Ray Train's controller and
    # worker group cost to start and stop. None: the default there, a small MLP's rows x epochs.
    one_process_max_work: int | None = None
    # The library a `rayline run` driver imports on a thread of its own while Ray connects and the data
    # stage runs (rayline/train/preload.py), "" for none: only where measured to pay (its import is most
    # of a run's training start and the driver trains it or loads it to register it anyway).
    preload: str = ""


_MLP_PARAMS = frozenset({"hidden_sizes", "dropout"})
# rayline/inference/torch_combined.py and tf_combined.py: each kind's encoder parameters, any other encoder's (a mixed
# table), and the head's.
_CNN_PARAMS = frozenset({"widths", "blocks", "embedding_dim", "filters", "kernel_sizes", "hidden_sizes", "dropout"})
_TEXT_CNN_PARAMS = _CNN_PARAMS
_TRANSFORMER_PARAMS = frozenset({"widths", "blocks", "width", "heads", "layers", "hidden_sizes", "dropout"})

BACKENDS: dict[str, BackendInfo] = {
    "torch": BackendInfo(
        name="torch",
        module="rayline.train.torch_backend",
        inference="rayline.inference.torch_model",
        kinds={"mlp": _MLP_PARAMS, "cnn": _CNN_PARAMS, "text_cnn": _TEXT_CNN_PARAMS, "transformer": _TRANSFORMER_PARAMS},
        import_returns="a torch.nn.Module",
        grad_compressions=frozenset({"fp16", "bf16", "powersgd"}),
        strategies=frozenset({"ddp", "fsdp"}),
    ),
    "tensorflow": BackendInfo(
        name="tensorflow",
        module="rayline.train.tensorflow_backend",
        inference="rayline.inference.tensorflow_model",
        # TensorFlow sets its thread pools once per process: a second run in the same driver failed
        # ("Intra op parallelism cannot be modified after initialization"). Its workers keep their own.
        trains_in_process=False,
        kinds={"mlp": _MLP_PARAMS, "cnn": _CNN_PARAMS, "text_cnn": _TEXT_CNN_PARAMS, "transformer": _TRANSFORMER_PARAMS},
        import_returns="a Keras model (tf_keras.Model)",
        multi_gpu_workers=True,  # MirroredStrategy / MWMS over a worker's local GPUs (train/tf_steps.py)
    ),
    "xgboost": BackendInfo(
        name="xgboost",
        module="rayline.train.xgboost_backend",
        inference="rayline.inference.xgboost_model",
        kinds={
            "gbdt": frozenset(
                {
                    "max_depth", "eta", "learning_rate", "subsample", "colsample_bytree",
                    "colsample_bylevel", "colsample_bynode", "min_child_weight", "gamma",
                    "lambda", "alpha", "reg_lambda", "reg_alpha", "max_bin", "tree_method",
                    "num_boost_round", "early_stopping_rounds", "max_leaves", "grow_policy",
                    "scale_pos_weight", "checkpoint_every", "external_memory",
                }
            )
        },
        # As xgboost_backend.EXTERNAL_MEMORY (not imported: this table never imports a backend).
        param_choices={"external_memory": ("auto", "always", "never")},
        epoch_based=False,
        units_param="num_boost_round",
        units="boosting rounds",
        import_returns="",
        precisions=frozenset({"fp32"}),
        grad_accumulation=False,
        # A boosting round costs a fraction of an MLP epoch: 10 rounds over 800,000 rows took 2.1 s on two
        # 1-thread workers, their worker group 9.6-9.9 s to start and stop (2-core box, 2026-12-03,
        # benchmarks/overhead.py --only xgboost). 40M rows x rounds boost in about that time.
        one_process_max_work=40_000_000,
        # import xgboost (sklearn, scipy, pandas with it): 1.6 s of the 1M-row job's 3.2-s train stage against a
        # running head; in the background 0.5 s were left, the job 8.96 -> 7.7 s (2-core box, 2026-12-06,
        # benchmarks/overhead.py --only xgboost --repeats 5). torch's did not pay there: its import took the CPU of
        # the Ray start it overlapped (3,000-row job 8.2 -> 9.2 s against a head, 14.3 -> 14.3 s embedded).
        preload="xgboost",
    ),
}



def total_units(framework: str, model_params: dict, epochs: int) -> int:
    """Units of training a run does at most: ASHA's clock (`rayline.tune.schedulers.asha_defaults`). Epochs, or for a
    framework that trains in other units (xgboost: boosting rounds) its parameter that counts them
    (epochs when that parameter is not set)."""
    param = BACKENDS[framework].units_param
    return max(1, int(model_params.get(param) or epochs)) if param else epochs
