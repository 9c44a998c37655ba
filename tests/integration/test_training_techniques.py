"""train.precision, train.grad_accumulation and train.grad_compression through real Ray Train runs
(2 DDP workers), proved by what they do to the model, not by the message built from the spec.

The model is a `model.import` MLP (`_PROBE`, written beside the spec) that watches its own
training and keeps what it saw in buffers saved with its weights, so every trial's checkpoint
holds the evidence: the dtype its hidden layer computed in during each training forward pass
(bf16 under autocast), how many micro-batches it ran, how often its weights changed between two
forward passes (the optimizer steps), and the rank of each change. Plain SGD makes a change
-lr x the all-reduced gradient, and PowerSGD rank 2 all-reduces a gradient matrix as two rank-2
factors: after the spec's `start_iter` 4 plain all-reduces, every step's change to the 32x30
hidden weight has rank 2 (a plain one's is full rank). So the sweep shows, per trial:

- bf16 (and only bf16) runs every training forward pass in bf16;
- one optimizer step per 2 micro-batches (`grad_accumulation: 2`; an odd epoch ends with a group of 1);
- the compression hook compressed every all-reduce after the 4th, and the 4 plain ones spanned 4
  optimizer steps: one all-reduce per step, not one per micro-batch.

The mechanisms (the update of N micro-batches equals one batch N times larger, all-reduces and
hook calls counted on a real gloo process group, FSDP's shards) are in tests/unit/test_torch_steps.py;
tensorflow's (the mixed policy's compute dtype inside the step, optimizer iterations) in
tests/unit/test_tf_steps.py, and its accumulation through the pipeline (the checkpoint's optimizer
iterations) in the tensorflow case of test_frameworks.py's regression test. Here the whole pipeline
trains with them, a sweep tunes precision, and the registered model, trained in bf16, loads and
predicts in fp32 as served.
"""

from __future__ import annotations

import math
import os
import textwrap

import numpy as np
import yaml

from tests.integration.conftest import run

CANCER = {"format": "sklearn", "name": "breast_cancer"}

_PROBE = textwrap.dedent('''
    """An MLP (Linear-ReLU-Linear) that records, in buffers saved with its weights, what its training did."""
    import torch
    import torch.nn as nn

    COUNTERS = ("forwards", "bf16_forwards", "updates", "low_rank_updates")


    class ProbeMLP(nn.Module):
        def __init__(self, num_features, num_outputs, hidden=32):
            super().__init__()
            self.hidden = nn.Linear(num_features, hidden)
            self.out = nn.Linear(hidden, num_outputs)
            for name in COUNTERS:
                self.register_buffer(name, torch.zeros((), dtype=torch.int64))
            self._last = None  # the hidden weight at the previous training forward pass

        def forward(self, x):
            h = self.hidden(x)
            if self.training:
                self._observe(h.dtype)
            return self.out(torch.relu(h))

        @torch.no_grad()
        def _observe(self, dtype):
            self.forwards += 1
            self.bf16_forwards += int(dtype == torch.bfloat16)
            weight = self.hidden.weight.detach().clone()
            if self._last is not None and not torch.equal(weight, self._last):
                self.updates += 1  # the optimizer stepped since the last micro-batch
                with torch.autocast(weight.device.type, enabled=False):
                    s = torch.linalg.svdvals(weight - self._last)
                # Measured: ~1e-6 for a PowerSGD rank-2 step (float rounding), ~0.1 for a plain one.
                self.low_rank_updates += int(s[2] <= 1e-3 * s[0])
            self._last = weight


    def build(num_features, num_outputs, hidden=32):
        return ProbeMLP(num_features, num_outputs, hidden)
''')


def _raw(name: str, framework: str, **train) -> dict:
    return {
        "name": name,
        "data": {"source": CANCER, "label": "target", "split": {"valid": 0.2, "test": 0.2, "seed": 0},
                 "preprocess": [{"standard_scale": {"columns": "numeric"}}]},
        "task": "classification",
        "model": {"framework": framework, "kind": "mlp", "params": {"hidden_sizes": [32]}},
        "train": {"workers": 2, "epochs": 5, "batch_size": 32, "optimizer": {"name": "adam", "lr": 0.01}, **train},
    }


def _predicts_like_its_metric(summary, ws) -> None:
    """The registered model loads (fp32, as serving does) and its test accuracy is the recorded one."""
    from sklearn.datasets import load_breast_cancer

    from rayline import load_model

    model = load_model(summary.name, summary.version, workspace=str(ws.root))
    frame = load_breast_cancer(as_frame=True).frame
    rows = frame.drop(columns=["target"]).to_dict(orient="records")
    got = model.predict(rows)["predictions"]
    assert np.mean(np.asarray(got) == frame["target"].to_numpy()) >= 0.9


def _what_the_model_saw(checkpoint_dir: str) -> tuple[int, dict]:
    """(epochs trained, the probe's counters) from a trial's checkpoint files, as rank 0 saved them."""
    import torch

    from rayline.train.loop import MODEL_DIR, read_state

    epochs = read_state(checkpoint_dir)["epoch"] + 1
    weights = torch.load(os.path.join(checkpoint_dir, MODEL_DIR, "weights.pt"), weights_only=True)
    return epochs, {k: int(weights[k]) for k in ("forwards", "bf16_forwards", "updates", "low_rank_updates")}


def test_torch_sweep_over_precision_bf16_trains_as_well_as_fp32_with_accumulation_and_powersgd(ray_session, ws, tmp_path):
    from rayline.spec import parse_spec

    (tmp_path / "technique_probe.py").write_text(_PROBE)
    raw = _raw("tech-torch", "torch", grad_accumulation=2, grad_compression={"powersgd": {"rank": 2, "start_iter": 4}})
    raw["model"] = {"framework": "torch", "import": "technique_probe:build", "params": {"hidden": 32}}
    # Plain SGD: a step changes the weights by -lr x the all-reduced gradient, whose rank the probe sees.
    raw["train"]["optimizer"] = {"name": "sgd", "lr": 0.1}
    raw["tune"] = {"search": "grid", "scheduler": "fifo", "max_concurrent": 1,
                   "space": {"train.precision": {"grid": ["fp32", "bf16"]}}}
    spec_path = tmp_path / "spec.yaml"  # model.import looks beside the spec
    spec_path.write_text(yaml.safe_dump(raw))
    summary = run(parse_spec(raw), ws, deploy=False, spec_path=str(spec_path))
    start = next(detail for stage, event, detail in summary.events if stage == "train" and event == "start")
    assert "effective batch 64 (32 x 2 micro-batches), powersgd rank 2 gradient compression" in start, start

    # Each worker's micro-batches per epoch: its half of the train rows (Ray's equal split) in batches of 32 / 2.
    micro_batches = math.ceil((summary.rows["train"] // 2) / 16)
    assert micro_batches >= 9, summary.rows  # enough steps for the 4 plain all-reduces and rank-2 ones after them
    seen = {}
    for trial in summary.trials:
        precision = trial.overrides["train.precision"]
        epochs, got = seen[precision] = _what_the_model_saw(trial.result.checkpoint_dir)
        assert got["forwards"] == epochs * micro_batches, (precision, epochs, got)
        # train.precision: every training forward pass computed in bf16 under bf16, none under fp32.
        assert got["bf16_forwards"] == (got["forwards"] if precision == "bf16" else 0), (precision, got)
        # train.grad_accumulation 2: ceil(micro-batches / 2) optimizer steps per epoch; the probe sees
        # each step at the forward pass after it, so all but the last.
        assert got["updates"] + 1 == epochs * math.ceil(micro_batches / 2), (precision, epochs, got)
        # train.grad_compression: the hook all-reduced the first 4 steps' gradients plainly (start_iter 4
        # counts all-reduces: had each micro-batch all-reduced, only 2 steps would be plain), and every
        # later step's gradient as rank-2 PowerSGD factors.
        assert got["updates"] - got["low_rank_updates"] == 4, (precision, got)
    assert set(seen) == {"fp32", "bf16"}, seen

    accuracy = {t.overrides["train.precision"]: t.result.metrics["accuracy"] for t in summary.trials}
    assert min(accuracy.values()) >= 0.9, accuracy
    assert abs(accuracy["bf16"] - accuracy["fp32"]) <= 0.05, accuracy  # the stated tolerance
    _predicts_like_its_metric(summary, ws)
