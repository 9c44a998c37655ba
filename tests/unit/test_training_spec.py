"""train.precision and train.grad_accumulation in the spec: what each framework and worker takes."""

from __future__ import annotations

import pytest

from rayline.errors import SpecError
from rayline.spec import parse_spec


def _raw(framework: str = "torch", **train) -> dict:
    kind = "gbdt" if framework == "xgboost" else "mlp"
    return {"name": "tech", "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
            "model": {"framework": framework, "kind": kind}, "train": train}


@pytest.mark.parametrize("framework, train, message", [
    ("xgboost", {"precision": "bf16"}, r"^invalid pipeline spec\n  train\.precision: framework xgboost trains in fp32 only .*"
                                       r"\(got bf16; supported: fp32\)$"),
    ("xgboost", {"grad_accumulation": 4}, r"train\.grad_accumulation: framework xgboost has no mini-batches to accumulate "
                                          r".*\(got 4; allowed: 1\)$"),
    ("torch", {"precision": "fp16"}, r"train\.precision: fp16 needs GPU workers \(train\.use_gpu: true\).*"
                                     r"\(got fp16 on CPU workers; allowed: bf16 \(CPU and GPU\), fp32, or fp16 with use_gpu: true\)$"),
    ("tensorflow", {"precision": "fp16", "resources_per_worker": {"CPU": 1}}, r"train\.precision: fp16 needs GPU workers"),
    ("torch", {"precision": "fp8"}, r"train\.precision: Input should be 'fp32', 'bf16' or 'fp16' \(got 'fp8'\)"),
    ("torch", {"grad_accumulation": 0}, r"train\.grad_accumulation: .*greater than or equal to 1"),
    ("tensorflow", {"grad_compression": "fp16"}, r"train\.grad_compression: framework tensorflow has no gradient "
                                                 r"compression .*\(got fp16; allowed: none\)$"),
    ("torch", {"grad_compression": "fp16", "workers": 1}, r"train\.grad_compression: needs 2 or more workers"),
    ("torch", {"grad_compression": "bf16"}, r"train\.grad_compression: bf16 compression needs GPU workers"),
    ("torch", {"grad_compression": "zstd"}, r"train\.grad_compression: unknown gradient compression \(got 'zstd'; "
                                            r"allowed: none, fp16, bf16, powersgd\)$"),
    ("torch", {"grad_compression": {"powersgd": {"rank": 0}}}, r"train\.grad_compression\.rank: .*greater than or equal to 1"),
    ("torch", {"grad_compression": {"fp16": {"rank": 2}}}, r"train\.grad_compression\.fp16: fp16 takes no parameters"),
    ("tensorflow", {"strategy": "fsdp"}, r"train\.strategy: framework tensorflow has no fsdp training .*\(got fsdp; supported: ddp\)$"),
    ("xgboost", {"strategy": "fsdp"}, r"train\.strategy: framework xgboost has no fsdp training"),
    ("torch", {"strategy": "fsdp", "workers": 1}, r"train\.strategy: fsdp shards across workers and needs 2 or more"),
    ("torch", {"strategy": "fsdp", "grad_compression": "powersgd"}, r"train\.grad_compression: gradient compression is a DDP "
                                                                    r"communication hook"),
    ("torch", {"strategy": "zero3"}, r"train\.strategy: Input should be 'ddp' or 'fsdp' \(got 'zero3'\)"),
    ("torch", {"use_gpu": True, "resources_per_worker": {"GPU": 2}},
     r"train\.resources_per_worker\.GPU: framework torch trains on one GPU per worker .*\(got 2; allowed: 1 or less, "
     r"with more train\.workers \(tensorflow mirrors over a worker's GPUs\)\)$"),
    ("xgboost", {"use_gpu": True, "resources_per_worker": {"GPU": 1.5}}, r"train\.resources_per_worker\.GPU: framework xgboost"),
    ("xgboost", {"in_memory": "always"}, r"train\.in_memory: framework xgboost holds its train shard as its own matrix "
                                         r"\(model\.params\.external_memory: .*\(got always; allowed: auto \(torch and tensorflow"),
    ("torch", {"in_memory": "yes"}, r"train\.in_memory: Input should be 'auto', 'always' or 'never' \(got 'yes'\)"),
])
def test_what_a_framework_or_its_workers_cannot_do_is_one_line_naming_the_key(framework, train, message):
    with pytest.raises(SpecError) as info:
        parse_spec(_raw(framework, **train))
    assert len(str(info.value).splitlines()) == 2
    assert __import__("re").search(message, str(info.value)), str(info.value)


def test_what_they_can_do_is_accepted_and_the_effective_batch_is_known():
    spec = parse_spec(_raw("torch", precision="bf16", grad_accumulation=4, batch_size=16))
    assert (spec.train.precision, spec.train.effective_batch_size) == ("bf16", 64)
    assert parse_spec(_raw("torch", precision="fp16", use_gpu=True)).train.precision == "fp16"
    assert parse_spec(_raw("tensorflow", precision="fp16", use_gpu=True, resources_per_worker={"GPU": 0.5})).train.precision == "fp16"
    assert parse_spec(_raw("xgboost")).train.precision == "fp32"
    assert [parse_spec(_raw(f, in_memory=m)).train.in_memory for f, m in [("torch", "never"), ("tensorflow", "always")]] == [
        "never", "always"]
    # tensorflow mirrors over the GPUs of one worker (MirroredStrategy; rayline/train/tf_steps.py).
    assert parse_spec(_raw("tensorflow", use_gpu=True, resources_per_worker={"GPU": 4}, workers=1)).train.resources_per_worker["GPU"] == 4
    fsdp = parse_spec(_raw("torch", strategy="fsdp", precision="bf16", grad_accumulation=2, workers={"min": 2, "max": 4}))
    assert fsdp.train.strategy == "fsdp"
    compression = parse_spec(_raw("torch", grad_compression={"powersgd": {"rank": 4}})).train.grad_compression
    assert (compression.name, compression.rank, compression.start_iter, str(compression)) == ("powersgd", 4, 10, "powersgd rank 4")
    # What the spec dumps (a resumed run re-reads it) parses back to the same.
    dumped = parse_spec(_raw("torch", grad_compression="fp16")).model_dump(by_alias=True, exclude_none=True)
    assert parse_spec(dumped).train.grad_compression.name == "fp16"


def test_precision_and_accumulation_are_tunable_and_each_value_is_checked():
    raw = _raw("torch")
    raw["tune"] = {"search": "grid", "space": {"train.precision": {"grid": ["fp32", "bf16"]},
                                               "train.grad_accumulation": {"grid": [1, 4]}}}
    assert parse_spec(raw).tune is not None
    raw["tune"]["space"]["train.precision"] = {"grid": ["fp32", "fp16"]}  # fp16 on CPU workers: the draw is refused
    with pytest.raises(SpecError, match=r"fp16"):
        parse_spec(raw)
