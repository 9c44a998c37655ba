"""Image training, side by side: rayline's data and train stages on an image folder against a
hand-written PyTorch script (a Dataset that opens each PNG with Pillow, a DataLoader per process
with a DistributedSampler, DistributedDataParallel over gloo), the same folder, split fractions,
preprocessing (grayscale, resize, per-channel normalisation fitted on the train files), network
(rayline's `cnn` kind: the same class, so the same FLOPs), optimizer, batch and epochs, a
validation pass and a rank-0 checkpoint each epoch.

    python benchmarks/image_training.py                     # 4 noisy copies of digits = 7,188 PNGs
    python benchmarks/image_training.py --copies 8 --size 32 --epochs 3 --json-out images.json
    python benchmarks/image_training.py --gpu --precision bf16   # on a GPU machine (use_gpu, nccl)

Printed for each: wall time from the first file read to the last epoch's checkpoint (rayline:
`run_pipeline` with serving off, on a Ray already started, as the hand-written script's processes
are spawned by it; the data stage and the train stage apart), training throughput (images/s over
the epochs' training loops, all workers) and the final valid accuracy; then the ratios. The load
average is printed: on a shared machine it says how much to trust the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))
sys.path.insert(0, str(ROOT / "benchmarks"))

VALID, TEST = 0.2, 0.1
WIDTHS, HIDDEN, LR = [16, 32], [64], 0.001


def make_images(out: Path, copies: int, size: int) -> int:
    spec = importlib.util.spec_from_file_location("make_digit_images", ROOT / "pipelines" / "make_digit_images.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_digit_images(out, size=size, copies=copies)


def spec_dict(folder: Path, args) -> dict:
    return {
        "name": "bench-images",
        "data": {"source": {"format": "image_folder", "path": str(folder)}, "label": "label",
                 "split": {"valid": VALID, "test": TEST, "seed": 0},
                 "preprocess": [{"image": {"columns": ["image"], "size": [args.size, args.size], "channels": 1}}]},
        "task": "classification",
        "model": {"framework": "torch", "kind": "cnn", "params": {"widths": WIDTHS, "hidden_sizes": HIDDEN}},
        "train": {"workers": args.workers, "epochs": args.epochs, "batch_size": args.batch,
                  "optimizer": {"name": "adam", "lr": LR}, "metric": "accuracy", "precision": args.precision,
                  **({"use_gpu": True} if args.gpu else {})},
    }


def rayline_run(folder: Path, args, ws) -> dict:
    from rayline.pipeline.run import run_pipeline
    from rayline.spec import parse_spec

    started = time.monotonic()
    summary = run_pipeline(parse_spec(spec_dict(folder, args)), ws, deploy=False, data_cache=False)
    wall = time.monotonic() - started
    return {"wall_s": wall, "data_s": summary.seconds["data"], "train_s": summary.seconds["train"],
            "register_s": summary.seconds["register"], "trained_on": summary.trained_on,
            "epoch_end_at": [r["at"] for r in summary.trials[0].result.timeline.get("reports", [])],
            "images_per_s": summary.throughput[0], "valid_accuracy": summary.valid_metrics["accuracy"],
            "train_rows": summary.rows["train"]}


# ---------------------------------------------------------------- the hand-written script


def _split_of(path: str) -> str:
    """70/20/10 by a hash of the file's name (rayline hashes the row's bytes: other files, same shares)."""
    h = int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "little") / 2**64
    return "valid" if h < VALID else "test" if h < VALID + TEST else "train"


def _load(path: str, size: int):
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("L").resize((size, size), Image.BILINEAR), dtype=np.float32) / 255.0


class _Folder:
    """The hand-written script's Dataset: (normalised pixels, class index) of each file, opened on
    demand. A module-level class: DataLoader worker processes (--loader-workers) pickle it."""

    def __init__(self, items, index, size, mean, std):
        self.items, self.index, self.size, self.mean, self.std = items, index, size, mean, std

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        import torch

        path, label = self.items[i]
        return torch.from_numpy(((_load(path, self.size) - self.mean) / self.std).reshape(-1)), self.index[label]


def _worker(rank: int, world: int, files: dict, classes: list, stats: tuple, args, result_file: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    from rayline.inference.torch_combined import CombinedModel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    device = torch.device(f"cuda:{rank}") if args.gpu else torch.device("cpu")
    dist.init_process_group("nccl" if args.gpu else "gloo", rank=rank, world_size=world)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    mean, std = stats
    index = {c: i for i, c in enumerate(classes)}

    train = _Folder(files["train"], index, args.size, mean, std)
    valid = _Folder(files["valid"], index, args.size, mean, std)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch // world, sampler=sampler, num_workers=args.loader_workers)
    valid_loader = DataLoader(valid, batch_size=256, sampler=DistributedSampler(valid, world, rank, shuffle=False))
    torch.manual_seed(0)
    schema = {"images": [{"name": "image", "start": 0, "stop": args.size * args.size, "shape": [args.size, args.size, 1],
                          "augment": {}}], "texts": [], "tabular": []}
    model = CombinedModel(schema, len(classes), widths=WIDTHS, hidden_sizes=HIDDEN).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if args.gpu else None)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    train_seconds, seen, accuracy, ends = 0.0, 0, 0.0, []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        t0 = time.monotonic()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            seen += len(y)
        train_seconds += time.monotonic() - t0
        model.eval()
        right = torch.zeros(2, device=device)
        with torch.no_grad():
            for x, y in valid_loader:
                right += torch.tensor([(model(x.to(device)).argmax(1) == y.to(device)).sum().item(), len(y)], device=device)
        dist.all_reduce(right)
        accuracy = float(right[0] / right[1])
        if rank == 0:
            with tempfile.TemporaryDirectory() as d:
                torch.save(model.module.state_dict(), os.path.join(d, "weights.pt"))
        ends.append(time.time())  # as rayline's report: after validation and the checkpoint
    totals = torch.tensor([float(seen), train_seconds], device=device)  # nccl reduces GPU tensors only
    dist.all_reduce(totals)
    if rank == 0:
        Path(result_file).write_text(json.dumps({"images_per_s": totals[0].item() / (totals[1].item() / world),
                                                 "valid_accuracy": accuracy, "epoch_end_at": ends}))
    dist.destroy_process_group()


def hand_written(folder: Path, args) -> dict:
    import numpy as np
    import torch.multiprocessing as mp

    started = time.monotonic()
    files: dict[str, list] = {"train": [], "valid": [], "test": []}
    for path in sorted(folder.rglob("*.png")):
        files[_split_of(path.name)].append((str(path), path.parent.name))
    classes = sorted({label for _, label in files["train"]})
    pixels = np.stack([_load(p, args.size) for p, _ in files["train"]])  # the normalisation's statistics: one pass
    stats = (float(pixels.mean()), float(pixels.std()))
    with tempfile.TemporaryDirectory(prefix="bench-images-") as folder_out:
        result = os.path.join(folder_out, "result.json")
        mp.spawn(_worker, args=(args.workers, files, classes, stats, args, result), nprocs=args.workers, join=True)
        out = json.loads(Path(result).read_text())
    return {"wall_s": time.monotonic() - started, **out, "train_rows": len(files["train"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=4, help="noisy copies of each of the 1,797 digits")
    parser.add_argument("--size", type=int, default=32, help="height and width of the PNGs and of the model's input")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--workers", type=int, default=2, help="DDP processes / Ray Train workers")
    parser.add_argument("--loader-workers", type=int, default=0, help="the hand-written DataLoader's worker processes")
    parser.add_argument("--gpu", action="store_true", help="one GPU per worker (train.use_gpu; nccl)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--port", type=int, default=29517, help="the hand-written script's rendezvous port")
    parser.add_argument("--json-out")
    args = parser.parse_args()

    from harness import format_table, machine_info

    from rayline.cluster.connection import connect
    from rayline.workspace import workspace

    tmp = Path(tempfile.mkdtemp(prefix="bench-images-", dir=ROOT / "benchmarks"))
    try:
        folder = tmp / "images"
        count = make_images(folder, args.copies, args.size)
        info = machine_info(("ray", "torch", "pillow"))
        print(f"machine: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB; load {info['load_avg_1m']}; "
              f"{count:,} PNGs {args.size}x{args.size}, {args.workers} workers, {args.epochs} epochs, batch {args.batch}, "
              f"{args.precision}{', GPU' if args.gpu else ''}", flush=True)
        import contextlib

        if args.gpu:
            from gpu_meter import GpuBusy
        with GpuBusy() if args.gpu else contextlib.nullcontext() as gpu:
            hand = hand_written(folder, args)
            print(f"  hand-written: {hand['wall_s']:.1f} s, {hand['images_per_s']:,.0f} images/s", flush=True)
            ws = workspace(str(tmp / "ws")).ensure()
            conn = connect(ws, None)
            try:
                ours = rayline_run(folder, args, ws)
            finally:
                conn.shutdown()
        print(f"  rayline: {ours['wall_s']:.1f} s ({ours['data_s']:.1f} s data, {ours['train_s']:.1f} s train), "
              f"{ours['images_per_s']:,.0f} images/s, trained on {ours['trained_on']}", flush=True)
        if gpu is not None:  # busy share from the first epoch's end to the last's (the steady epochs)
            for who, result in (("hand-written", hand), ("rayline", ours)):
                share = gpu.share(result["epoch_end_at"][0], result["epoch_end_at"][-1])
                result["gpu_busy"] = share
                print(f"  {who}: the GPU ({gpu.name}) was busy {'-' if share is None else f'{share:.0%}'} "
                      "of its steady epochs", flush=True)
        # The hand-written script registers nothing: rayline's register stage (artifact, probe check,
        # test metrics, MLflow) is shown apart, and the like-for-like ratio is data + train.
        like = ours["data_s"] + ours["train_s"]
        rows = [["rayline (image_folder, image step, cnn)", f"{ours['wall_s']:.1f}", f"{ours['data_s']:.1f}",
                 f"{ours['train_s']:.1f}", f"{like:.1f}", f"{ours['register_s']:.1f}", f"{ours['images_per_s']:,.0f}",
                 f"{ours['valid_accuracy']:.3f}"],
                ["hand-written (Dataset + DataLoader + DDP)", f"{hand['wall_s']:.1f}", "-", "-", f"{hand['wall_s']:.1f}",
                 "-", f"{hand['images_per_s']:,.0f}", f"{hand['valid_accuracy']:.3f}"],
                ["rayline / hand-written", f"{ours['wall_s'] / hand['wall_s']:.2f}x", "", "", f"{like / hand['wall_s']:.2f}x",
                 "", f"{ours['images_per_s'] / hand['images_per_s']:.2f}x", ""]]
        print()
        print(format_table(["", "wall s", "data s", "train s", "data + train s", "register s", "images/s (training)",
                            "valid accuracy"], rows))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps({"machine": info, "args": vars(args), "rayline": ours,
                                                       "hand_written": hand}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
