"""Checks that a resumed training run really restored its checkpoint: the live state it trained from
equals the checkpoint files it came from.

Each training attempt records, in every later checkpoint's state file (`starts`, rayline/train/loop.py),
digests of the LIVE model and optimizer it was about to train from. Here the same digests are computed
from the checkpoint files themselves, with a few lines of torch / numpy / xgboost of the tests' own,
and compared for equality: a backend whose restore code does nothing trains from a fresh model, whose
digests differ from the checkpoint's.

Ray Train keeps only the best and the latest checkpoints (train/run.py checkpoint_keep) and deletes the
others as training goes on: a test copies the run's checkpoints (`copy_checkpoints`) at a moment when
nothing can register a new one (a worker or driver just killed: no report completes until the restarted
attempt has restored) and compares against those copies.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from rayline.train.loop import MODEL_DIR, read_state

__all__ = ["copy_checkpoints", "evidence", "assert_restored", "latest_checkpoint"]


def _sha(chunks) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def _torch_bytes(value) -> bytes:
    import torch

    return value.numpy().tobytes() if isinstance(value, torch.Tensor) else repr(value).encode()


def _npz(path: str) -> list:
    import numpy as np

    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def evidence(checkpoint_dir: str) -> dict:
    """What a `starts` record says about the state in a checkpoint's files (torch, tensorflow or xgboost)."""
    model = os.path.join(checkpoint_dir, MODEL_DIR)
    if os.path.exists(os.path.join(model, "weights.pt")):
        import torch

        weights = torch.load(os.path.join(model, "weights.pt"), map_location="cpu", weights_only=True)
        state = torch.load(os.path.join(model, "optimizer.pt"), map_location="cpu", weights_only=True)["state"]
        return {"weights_sha256": _sha(_torch_bytes(weights[name]) for name in sorted(weights)),
                "optimizer_sha256": _sha(_torch_bytes(state[key][name]) for key in sorted(state, key=str)
                                         for name in sorted(state[key]))}
    if os.path.exists(os.path.join(model, "weights.npz")):
        return {"weights_sha256": _sha(a.tobytes() for a in _npz(os.path.join(model, "weights.npz"))),
                "optimizer_sha256": _sha(a.tobytes() for a in _npz(os.path.join(model, "optimizer.npz")))}
    import xgboost as xgb

    booster = xgb.Booster(model_file=os.path.join(model, "model.ubj"))
    with open(os.path.join(model, "xgb_state.json")) as fh:
        saved = json.load(fh)
    return {"rounds": booster.num_boosted_rounds(),
            "trees_sha256": _sha(tree.encode() for tree in booster.get_dump(dump_format="json")),
            "early_stopping": {"best_score": saved["best_score"], "best_round": saved["best_round"]}}


def copy_checkpoints(run_dir: str, dest: str) -> dict[str, str]:
    """Copy every checkpoint directory of a Train run now; {checkpoint name: its copy}."""
    copies = {}
    for name in sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else []:
        if not name.startswith("checkpoint_"):
            continue
        try:
            shutil.copytree(os.path.join(run_dir, name), os.path.join(dest, name), dirs_exist_ok=True)
            copies[name] = os.path.join(dest, name)
        except (OSError, shutil.Error):
            pass  # being deleted (an old one Ray dropped) or written (not registered: never restored from)
    return copies


def assert_restored(starts: list[dict], resumed_from: list[int], checkpoints: dict[str, str], final_dir: str) -> list[dict]:
    """Every restore in `starts` put back exactly its source checkpoint's state (`checkpoints`: name ->
    a copy of that checkpoint, taken before it could be deleted), that state was not a fresh model's,
    and training went on from it to `final_dir` (the run's last checkpoint). Returns the restores."""
    assert starts, "the checkpoint records no training start"
    fresh, *restores = starts
    assert fresh["epoch"] == -1 and fresh["source"] is None, fresh  # the lineage began from a fresh model
    assert [r["epoch"] for r in restores] == resumed_from, (starts, resumed_from)
    for restore in restores:
        name = os.path.basename(restore["source"].rstrip("/"))
        assert name in checkpoints, f"restored from {restore['source']}, not among the copies taken: {sorted(checkpoints)}"
        assert read_state(checkpoints[name])["epoch"] == restore["epoch"]
        saved = evidence(checkpoints[name])
        live = {key: restore.get(key) for key in saved}
        assert live == saved, f"the state training resumed from is not its checkpoint's ({restore['source']}): {live} != {saved}"
        if "rounds" in saved:
            assert saved["rounds"] == restore["epoch"] + 1 and fresh["rounds"] == 0, (saved, fresh)
        else:  # not the fresh model's weights, and an optimizer that had taken steps
            assert saved["weights_sha256"] != fresh["weights_sha256"], "the checkpoint holds the fresh model"
            assert saved["optimizer_sha256"] != fresh["optimizer_sha256"], "the checkpoint holds a fresh optimizer"
    # Trained on from there: the last checkpoint's state is another one.
    final = evidence(final_dir)
    for restore in restores:
        for key in final:
            if key != "early_stopping":
                assert final[key] != restore[key], f"{key}: the last checkpoint holds the state restored at epoch {restore['epoch']}"
    return restores


def latest_checkpoint(run_dir: str) -> str:
    """The registered checkpoint of a Train run with the highest epoch."""
    from rayline.train.run import _registered_checkpoints

    states = [(read_state(c), c) for c in _registered_checkpoints(run_dir)]
    return max((s["epoch"], c) for s, c in states if s)[1]
