"""Metrics merged from shards equal sklearn's on all the rows (rayline/evaluation/metrics.py)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as skm

from rayline.evaluation.metrics import AUC_BINS, EXACT_AUC_ROWS, MetricPartials, compute_metrics


def _classification(rows: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, classes, size=rows)
    logits = rng.normal(size=(rows, classes)) + 1.5 * np.eye(classes)[truth]  # better than chance
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return probs, truth


def _sklearn_classification(probs, truth):
    classes = np.arange(probs.shape[1])
    predicted = probs.argmax(axis=1)
    auc = (skm.roc_auc_score(truth, probs[:, 1]) if probs.shape[1] == 2
           else skm.roc_auc_score(truth, probs, multi_class="ovr", labels=classes))
    return {
        "log_loss": skm.log_loss(truth, probs, labels=classes),
        "accuracy": skm.accuracy_score(truth, predicted),
        "f1": skm.f1_score(truth, predicted, labels=classes, average="macro", zero_division=0),
        "precision": skm.precision_score(truth, predicted, labels=classes, average="macro", zero_division=0),
        "recall": skm.recall_score(truth, predicted, labels=classes, average="macro", zero_division=0),
        "roc_auc": auc,
    }


def _merged(task, outputs, labels, shards: int):
    parts = [MetricPartials.of(task, o, t) for o, t in zip(np.array_split(outputs, shards), np.array_split(labels, shards))]
    total = MetricPartials(task, outputs.shape[1] if task == "classification" else 0)
    for part in parts:
        total.merge(part)
    return total


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("shards", [1, 7])
def test_classification_metrics_from_shards_equal_sklearns_on_all_rows(classes, shards):
    probs, truth = _classification(5000, classes, seed=classes)
    merged = _merged("classification", probs, truth, shards)
    got, expected = merged.result(), _sklearn_classification(probs, truth)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    assert got["loss"] == got["log_loss"]
    assert merged.auc_error_bound() == 0.0  # few rows: the AUC is sklearn's own


def test_a_class_never_predicted_scores_zero_and_a_missing_class_drops_the_auc():
    probs = np.array([[0.9, 0.1, 0.0], [0.8, 0.2, 0.0], [0.3, 0.7, 0.0], [0.6, 0.4, 0.0]])
    truth = np.array([0, 1, 1, 2])  # class 2 never predicted; all three present
    got, expected = compute_metrics("classification", probs, truth), _sklearn_classification(
        np.clip(probs, 1e-12, 1) / np.clip(probs, 1e-12, 1).sum(axis=1, keepdims=True), truth)
    for name in ("accuracy", "f1", "precision", "recall", "log_loss"):
        assert got[name] == pytest.approx(expected[name], rel=1e-9), name
    assert "roc_auc" not in compute_metrics("classification", probs[:3], truth[:3])  # class 2 absent


@pytest.mark.parametrize("classes", [2, 3])
def test_beyond_the_exact_rows_the_auc_comes_from_histograms_within_the_stated_bound(classes):
    rows = EXACT_AUC_ROWS + 50_000
    probs, truth = _classification(rows, classes, seed=10 + classes)
    merged = _merged("classification", probs, truth, shards=9)
    assert merged.histograms is not None and merged.histograms.shape == (classes, 2, AUC_BINS)
    assert merged.scores.size == 0  # nothing that grows with the rows is kept
    expected = _sklearn_classification(probs, truth)
    bound = merged.auc_error_bound()
    assert 0 < bound < 1e-3
    assert abs(merged.result()["roc_auc"] - expected["roc_auc"]) <= bound
    assert merged.result()["accuracy"] == pytest.approx(expected["accuracy"], rel=1e-12)


@pytest.mark.parametrize("shards", [1, 5])
def test_regression_metrics_from_shards_equal_sklearns(shards):
    rng = np.random.default_rng(3)
    truth = 1e6 + rng.normal(size=4000) * 3  # a large mean: the merge must not cancel catastrophically
    values = truth + rng.normal(size=4000)
    got = _merged("regression", values, truth, shards).result()
    assert got["loss"] == pytest.approx(skm.mean_squared_error(truth, values), rel=1e-9)
    assert got["rmse"] == pytest.approx(np.sqrt(skm.mean_squared_error(truth, values)), rel=1e-9)
    assert got["mae"] == pytest.approx(skm.mean_absolute_error(truth, values), rel=1e-9)
    assert got["r2"] == pytest.approx(skm.r2_score(truth, values), rel=1e-7)


def test_empty_shards_merge_as_nothing():
    probs, truth = _classification(50, 3)
    total = MetricPartials("classification", 3)
    total.merge(MetricPartials.of("classification", probs[:0], truth[:0]))
    total.merge(MetricPartials.of("classification", probs, truth))
    assert total.result() == compute_metrics("classification", probs, truth)
    with pytest.raises(ValueError, match="2 and 3 classes"):
        MetricPartials.of("classification", probs[:, :2], truth % 2).merge(MetricPartials.of("classification", probs, truth))


class _Shard:
    """A Ray Train dataset shard's iter_batches over in-memory batches of uneven sizes."""

    def __init__(self, x, y, sizes):
        self.batches, start = [], 0
        for n in sizes:
            self.batches.append({"features": x[start:start + n], "label": y[start:start + n]})
            start += n

    def iter_batches(self, batch_size, batch_format):
        return iter(self.batches)


class _Collective:
    """allreduce_sum across `world` threads, as a framework's collective does across workers;
    the sum comes back flat, as xgboost's allreduce gives it."""

    def __init__(self, world):
        import threading

        self.barrier, self.lock, self.world = threading.Barrier(world), threading.Lock(), world
        self.total, self.calls = None, 0

    def allreduce_sum(self, values):
        with self.lock:
            self.total = values.copy() if self.total is None else self.total + values
        self.barrier.wait()
        out = self.total.copy()
        if self.barrier.wait() == 0:
            self.total = None
            self.calls += 1
        self.barrier.wait()
        return out.reshape(-1)


@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.parametrize("world", [2, 3])
def test_workers_metrics_on_their_valid_shares_equal_the_metrics_of_the_whole_split(task, world):
    import threading

    from rayline.train.loop import combine_metrics, eval_chunks, own_valid_rows

    rng = np.random.default_rng(world)
    rows = 1001  # not a multiple of any world size, nor of the batches
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) if task == "classification" else x[:, 1].astype(np.float32)

    def predict(features):  # a fixed "model" of the features
        if task == "regression":
            return features[:, 1] * 0.9 + 0.1
        p = 1 / (1 + np.exp(-2 * features[:, 0]))
        return np.stack([1 - p, p], axis=1)

    shard = _Shard(x, y, [400, 333, 268])
    collective = _Collective(world)
    results, shares, calls = {}, {}, {}

    def worker(rank):
        vx, vy, most = own_valid_rows(shard, 4, y.dtype, rank, world)
        shares[rank] = (vx, vy)
        chunks = eval_chunks(len(vx), most, 64)
        calls[rank] = len(chunks)
        outputs = np.concatenate([predict(vx[s]) for s in chunks])
        results[rank] = combine_metrics(MetricPartials.of(task, outputs, vy), rank, world, collective.allreduce_sum)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # The shares are disjoint and cover every row; every worker made as many forward calls.
    assert sum(len(v[1]) for v in shares.values()) == rows
    assert sorted(np.concatenate([v[0][:, 0] for v in shares.values()]).tolist()) == sorted(x[:, 0].tolist())
    assert len(set(calls.values())) == 1 and max(len(v[1]) for v in shares.values()) < rows / world + len(shard.batches)
    expected = compute_metrics(task, predict(x), y)
    for rank in range(world):
        assert results[rank].keys() == expected.keys()
        for name, value in expected.items():
            assert results[rank][name] == pytest.approx(value, rel=1e-9, abs=1e-12), (rank, name)
    assert collective.calls == 2  # sizes, then the table: a gather costs two all-reduces


def test_one_worker_combines_nothing():
    from rayline.train.loop import combine_metrics

    probs, truth = _classification(30, 2)
    part = MetricPartials.of("classification", probs, truth)
    assert combine_metrics(part, 0, 1, allreduce_sum=None) == compute_metrics("classification", probs, truth)
