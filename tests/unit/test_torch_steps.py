"""Gradient accumulation and precision in the torch worker's step (rayline/train/torch_steps.py).

The DDP test runs real torch.distributed (gloo, two processes on loopback) and counts the
all-reduce calls through a DDP communication hook, as the issue asks: N micro-batches per
step give the update of one batch N times larger, with one all-reduce instead of N.
"""

from __future__ import annotations

import math
import socket

import pytest

import torch  # declared in pyproject.toml: a broken install fails, not skips

from rayline.train.loop import with_last  # noqa: E402
from rayline.train.torch_steps import TorchSteps  # noqa: E402

ROWS, FEATURES, CLASSES = 8, 5, 3


def _model(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, CLASSES))


def _batches(seed: int, count: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(ROWS, FEATURES, generator=g), torch.randint(0, CLASSES, (ROWS,), generator=g)) for _ in range(count)]


def _train(model, batches, accumulation: int, precision: str = "fp32"):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    steps = TorchSteps(model, optimizer, precision=precision, accumulation=accumulation)
    # The optimizer.step() calls as the optimizer itself sees them (not TorchSteps' own count).
    steps.optimizer_calls = []
    optimizer.register_step_post_hook(lambda *_: steps.optimizer_calls.append(1))
    loss_fn = torch.nn.CrossEntropyLoss()
    for (x, y), last in with_last(batches):
        steps.micro_batch(lambda: loss_fn(model(x), y), last)
    return steps


def _params(model):
    inner = model.module if hasattr(model, "module") else model
    return [p.detach().clone() for p in inner.parameters()]


def test_with_last_marks_only_the_final_item():
    assert list(with_last([1, 2, 3])) == [(1, False), (2, False), (3, True)]
    assert list(with_last(iter([7]))) == [(7, True)]
    assert list(with_last([])) == []


def test_n_micro_batches_make_the_update_of_one_batch_n_times_larger():
    batches = _batches(1, 4)
    accumulated = _model()
    steps = _train(accumulated, batches, accumulation=4)
    big = _model()
    _train(big, [(torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]))], accumulation=1)
    assert len(steps.optimizer_calls) == 1 == steps.steps  # one optimizer step for the 4 micro-batches
    for a, b in zip(_params(accumulated), _params(big)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # And not what 4 separate steps give.
    separate = _model()
    _train(separate, batches, accumulation=1)
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(_params(accumulated), _params(separate)))


def test_a_short_last_group_steps_with_its_own_mean():
    batches = _batches(2, 5)  # N=2: groups (1,2) (3,4) (5)
    accumulated = _model()
    steps = _train(accumulated, batches, accumulation=2)
    reference = _model()
    pairs = [(torch.cat([batches[i][0], batches[i + 1][0]]), torch.cat([batches[i][1], batches[i + 1][1]])) for i in (0, 2)]
    _train(reference, pairs + [batches[4]], accumulation=1)
    assert len(steps.optimizer_calls) == 3 == steps.steps
    for a, b in zip(_params(accumulated), _params(reference)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bf16_runs_the_forward_pass_in_bf16_and_keeps_fp32_weights():
    model = _model()
    seen = []
    model[0].register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    _train(model, _batches(3, 2), accumulation=1, precision="bf16")
    assert seen == [torch.bfloat16, torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    fp32 = _model()
    _train(fp32, _batches(3, 2), accumulation=1)
    # bf16 has 8 bits of mantissa: close to the fp32 update, not equal to it.
    for a, b in zip(_params(model), _params(fp32)):
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.02)


# ------------------------------------------------------------------ real DDP, two processes


def _ddp_worker(rank: int, port: int, results):
    import traceback

    try:
        _ddp_runs(rank, port, results)
    except BaseException:  # noqa: BLE001 - the parent reads it instead of waiting for a result that never comes
        results.put((rank, {"error": traceback.format_exc()}))


def _ddp_runs(rank: int, port: int, results):
    from datetime import timedelta

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        def counted(model):
            calls = []

            def hook(state, bucket):
                calls.append(1)
                tensor = bucket.buffer().div_(dist.get_world_size())
                return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])

            model.register_comm_hook(None, hook)
            return calls

        batches = _batches(10 + rank, 4)  # each rank its own shard
        out = {}
        for name, accumulation, data in (
            ("accumulated", 4, batches),
            ("one_big_batch", 1, [(torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]))]),
            ("every_micro_batch", 1, batches),
        ):
            model = DistributedDataParallel(_model())
            calls = counted(model)
            steps = _train(model, data, accumulation)
            out[name] = {"calls": len(calls), "steps": len(steps.optimizer_calls), "params": [p.tolist() for p in _params(model)]}
        # train.grad_compression: the same 6 steps with each DDP communication hook.
        from rayline.train.torch_steps import register_compression

        # (bf16's hook is NCCL-only: the spec refuses it on CPU workers.)
        for name, compression in (("none", {"name": "none"}), ("fp16", {"name": "fp16"}),
                                  ("powersgd", {"name": "powersgd", "rank": 1, "start_iter": 2})):
            model = DistributedDataParallel(_model())
            assert register_compression(model, compression) == name
            _train(model, _batches(20 + rank, 6), accumulation=1)
            out[f"compressed_{name}"] = [p.tolist() for p in _params(model)]
            # The hook DDP holds, and the all-reduces PowerSGD's own state counted (its hook alone counts them).
            out[f"hooks_{name}"] = [[hook.__qualname__, getattr(state, "iter", None)] for hook, state in model._comm_hooks]
        # PowerSGD with 2 micro-batches per step: its hook runs once per step (3), not per micro-batch (6).
        model = DistributedDataParallel(_model())
        register_compression(model, {"name": "powersgd", "rank": 1, "start_iter": 2})
        steps = _train(model, _batches(20 + rank, 6), accumulation=2)
        out["powersgd_accumulated"] = {"steps": len(steps.optimizer_calls),
                                       "hook_calls": [getattr(state, "iter", None) for _, state in model._comm_hooks]}
        # train.strategy fsdp: the same 4 accumulated micro-batches with the parameters sharded over
        # the 2 ranks (FSDP2 over gloo); the gathered full weights are what DDP computed.
        from rayline.train import torch_fsdp

        sharded = torch_fsdp.shard(_model(), torch.device("cpu"), 2)
        # This rank's elements of each parameter (a DTensor's local shard; all of a plain tensor) and how
        # each is placed over the mesh.
        local = [(p.to_local() if hasattr(p, "to_local") else p).numel() for p in sharded.parameters()]
        placements = sorted({str(getattr(p, "placements", "not a DTensor")) for p in sharded.parameters()})
        steps = _train(sharded, batches, accumulation=4)
        stepped = len(steps.optimizer_calls)  # before full_state, whose gathering steps a stateless optimizer once
        weights, _ = torch_fsdp.full_state(sharded, steps.optimizer)
        out["fsdp"] = {"steps": stepped, "local_numel": local, "placements": placements,
                       "params": [weights[k].tolist() for k in _model().state_dict()] if rank == 0 else []}
        # Its optimizer state survives a checkpoint: gathered, then loaded into a fresh sharded copy.
        adam_model = torch_fsdp.shard(_model(), torch.device("cpu"), 2)
        adam = torch.optim.Adam(adam_model.parameters(), lr=0.01)
        _train_with(adam_model, adam, batches)
        _, saved = torch_fsdp.full_state(adam_model, adam)
        saved = _broadcast(saved)  # as every rank reads the checkpoint file
        fresh_model = torch_fsdp.shard(_model(), torch.device("cpu"), 2)
        fresh = torch.optim.Adam(fresh_model.parameters(), lr=0.01)
        out["fsdp_optimizer_restored"] = torch_fsdp.load_optimizer_state(fresh_model, fresh, saved)
        # What the fresh sharded optimizer now holds, gathered (a collective: full on rank 0), beside
        # what was saved: compared value for value in the test.
        _, restored = torch_fsdp.full_state(fresh_model, fresh)

        def values(state):
            return {key: {name: value.tolist() for name, value in entry.items()} for key, entry in state["state"].items()}

        out["fsdp_optimizer_state"] = {"saved": values(saved), "restored": values(restored)} if rank == 0 else None
        # The image and text kinds keep their encoders in a ModuleList, which fully_shard refuses as
        # a unit: sharded through its members, a combined model trains and gathers to a plain state.
        from rayline.inference.torch_combined import CombinedModel

        schema = {"images": [{"name": "p", "start": 0, "stop": 16, "shape": [4, 4, 1], "augment": {}}],
                  "texts": [{"name": "t", "start": 16, "stop": 20, "length": 4, "vocab_size": 9}], "tabular": [20]}
        torch.manual_seed(0)
        combined = torch_fsdp.shard(CombinedModel(schema, 3, widths=[4], filters=2, kernel_sizes=[2], hidden_sizes=[4]),
                                    torch.device("cpu"), 2)
        images = torch.cat([torch.randn(8, 16), torch.randint(0, 9, (8, 4)).float(), torch.randn(8, 1)], dim=1)
        labels = torch.randint(0, 3, (8,))
        optimizer = torch.optim.SGD(combined.parameters(), lr=0.1)
        _train_with(combined, optimizer, [(images, labels)])
        weights, _ = torch_fsdp.full_state(combined, optimizer)
        # The same model, unsharded, one SGD step on the same batch (both ranks hold the same batch, so
        # the sharded step's averaged gradient is this one's): the gathered weights must be its weights.
        torch.manual_seed(0)
        plain_model = CombinedModel(schema, 3, widths=[4], filters=2, kernel_sizes=[2], hidden_sizes=[4])
        start_weights = {k: v.detach().clone() for k, v in plain_model.state_dict().items()}
        _train_with(plain_model, torch.optim.SGD(plain_model.parameters(), lr=0.1), [(images, labels)])
        plain = plain_model.state_dict()
        out["fsdp_combined"] = {key: {"gathered": weights[key].tolist(), "plain": plain[key].tolist(),
                                      "start": start_weights[key].tolist()}
                                for key in plain} if rank == 0 and sorted(weights) == sorted(plain) else sorted(weights)
        # The image and text kinds under DDP with the other training options at once: PowerSGD
        # compression, 2 micro-batches per step, bf16 autocast. Both ranks end on the same weights,
        # which moved from the start.
        torch.manual_seed(0)
        model = DistributedDataParallel(CombinedModel(schema, 3, widths=[4], filters=2, kernel_sizes=[2],
                                                      hidden_sizes=[4]))
        start = [p.detach().clone() for p in model.parameters()]
        register_compression(model, {"name": "powersgd", "rank": 1, "start_iter": 2})
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        steps = TorchSteps(model, optimizer, precision="bf16", accumulation=2, device_type="cpu")
        loss_fn = torch.nn.CrossEntropyLoss()
        generator = torch.Generator().manual_seed(rank)
        batches = [(torch.cat([torch.randn(4, 16, generator=generator), torch.randint(0, 9, (4, 4), generator=generator).float(),
                               torch.randn(4, 1, generator=generator)], dim=1), torch.randint(0, 3, (4,), generator=generator))
                   for _ in range(6)]
        for (x, y), last in with_last(batches):
            steps.micro_batch(lambda: loss_fn(model(x), y), last)
        out["ddp_combined"] = {"moved": any(not torch.equal(a, b.detach()) for a, b in zip(start, model.parameters())),
                               "params": [p.detach().tolist() for p in model.parameters()]}
        results.put((rank, out))
    finally:
        dist.destroy_process_group()


def _train_with(model, optimizer, batches):
    steps = TorchSteps(model, optimizer)
    loss_fn = torch.nn.CrossEntropyLoss()
    for (x, y), last in with_last(batches):
        steps.micro_batch(lambda: loss_fn(model(x), y), last)


def _broadcast(obj):
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_results():
    """Both ranks' runs (_ddp_runs), from one pair of spawned processes."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_ddp_worker, args=(rank, port, results)) for port in [_free_port()] for rank in (0, 1)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=180) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    errors = [out["error"] for out in got.values() if "error" in out]
    assert not errors, errors[0]
    return got


def test_ddp_accumulation_all_reduces_once_per_step_and_matches_the_big_batch(ddp_results):
    got = ddp_results
    for rank in (0, 1):
        run = got[rank]
        # One all-reduce (the model fits one DDP bucket) for 4 accumulated micro-batches; 4 without.
        assert run["accumulated"]["calls"] == 1 and run["accumulated"]["steps"] == 1
        assert run["one_big_batch"]["calls"] == 1
        assert run["every_micro_batch"]["calls"] == 4 and run["every_micro_batch"]["steps"] == 4
        for a, b in zip(run["accumulated"]["params"], run["one_big_batch"]["params"]):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
    # FSDP: each rank holds its own dim-0 shard of every parameter (FSDP2's Shard(0) over the 2-rank
    # mesh: rank 0 the first ceil(rows / 2) rows, rank 1 the rest), 147 elements between them, and
    # the gathered weights after the accumulated step are DDP's.
    shapes = [p.shape for p in _model().parameters()]  # (16, 5), (16,), (3, 16), (3,)
    for rank in (0, 1):
        mine = [math.prod(shape[1:]) * (-(-shape[0] // 2) if rank == 0 else shape[0] // 2) for shape in shapes]
        assert got[rank]["fsdp"]["local_numel"] == mine == ([40, 8, 32, 2] if rank == 0 else [40, 8, 16, 1])
        assert got[rank]["fsdp"]["placements"] == ["(Shard(dim=0),)"], got[rank]["fsdp"]["placements"]
    assert sum(got[0]["fsdp"]["local_numel"]) + sum(got[1]["fsdp"]["local_numel"]) == 147
    assert got[0]["fsdp"]["steps"] == 1
    for a, b in zip(got[0]["fsdp"]["params"], got[0]["accumulated"]["params"]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
    # The ranks agree: the all-reduced update is the same everywhere.
    for a, b in zip(got[0]["accumulated"]["params"], got[1]["accumulated"]["params"]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b))


def test_fsdp_shards_a_model_whose_encoders_sit_in_a_module_list(ddp_results):
    """Sharded through its members, the combined model's gathered weights after a step are, key for
    key, shape for shape and value for value, the unsharded model's after the same step, which moved."""
    combined = ddp_results[0]["fsdp_combined"]
    assert isinstance(combined, dict), f"the gathered state's keys differ from the plain model's: {combined}"
    moved = False
    for key, entry in combined.items():
        gathered, plain = torch.tensor(entry["gathered"]), torch.tensor(entry["plain"])
        assert gathered.shape == plain.shape, (key, gathered.shape, plain.shape)
        torch.testing.assert_close(gathered, plain, rtol=1e-5, atol=1e-6, msg=key)
        moved = moved or not torch.equal(plain, torch.tensor(entry["start"]))
    assert moved, "the step changed no weight: the comparison would hold for an untrained model"


def test_fsdp_optimizer_state_is_restored_exactly_from_a_checkpoint(ddp_results):
    """The full Adam state gathered from a trained sharded optimizer (what a checkpoint holds), loaded by
    torch_fsdp.load_optimizer_state into a fresh sharded optimizer, gathers back value for value."""
    assert all(ddp_results[r]["fsdp_optimizer_restored"] for r in (0, 1))
    state = ddp_results[0]["fsdp_optimizer_state"]
    saved, restored = state["saved"], state["restored"]
    # Every parameter's Adam state, after 4 steps: not a fresh optimizer's.
    assert sorted(saved) == sorted(_model().state_dict()), sorted(saved)
    assert all(entry["step"] == 4.0 and set(entry) == {"step", "exp_avg", "exp_avg_sq"} for entry in saved.values()), saved
    assert all(any(v != 0 for v in torch.tensor(entry["exp_avg"]).flatten().tolist()) for entry in saved.values())
    # Exactly (float32 values sent as Python floats: exact), not approximately.
    assert restored == saved


def test_image_and_text_kinds_train_under_ddp_with_compression_accumulation_and_bf16(ddp_results):
    a, b = ddp_results[0]["ddp_combined"], ddp_results[1]["ddp_combined"]
    assert a["moved"] and b["moved"]
    for x, y in zip(a["params"], b["params"]):  # the all-reduced (compressed) update is the same on both ranks
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y))


def test_compressed_all_reduce_trains_close_to_plain_ddp(ddp_results):
    got = ddp_results
    for rank in (0, 1):
        # register_compression installed DDP's own hook for each name, and none for "none"...
        assert got[rank]["hooks_none"] == []
        assert got[rank]["hooks_fp16"] == [["fp16_compress_hook", None]]
        # ...and DDP called PowerSGD's on every all-reduce: once per step of the 6 (its state counts
        # them), and with 2 accumulated micro-batches per step once per step of the 3, not per micro-batch.
        assert got[rank]["hooks_powersgd"] == [["powerSGD_hook", 6]]
        assert got[rank]["powersgd_accumulated"] == {"steps": 3, "hook_calls": [3]}
    plain = [torch.tensor(p) for p in got[0]["compressed_none"]]
    for name, tolerance in (("fp16", 0.01), ("powersgd", 0.3)):
        compressed = [torch.tensor(p) for p in got[0][f"compressed_{name}"]]
        # Compression changed what was sent (not the plain update bit for bit)...
        assert any(not torch.equal(a, b) for a, b in zip(compressed, plain)), name
        # ...and training stayed close to it; every rank holds the same weights.
        for a, b in zip(compressed, plain):
            torch.testing.assert_close(a, b, rtol=0, atol=tolerance, msg=name)
        for a, b in zip(got[0][f"compressed_{name}"], got[1][f"compressed_{name}"]):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b))
