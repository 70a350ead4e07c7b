"""Data loading throughput next to the default model's training step rate, measured in one run.

Prints loader samples/s (decode, resample, downmix, augment, collate) with 0, 1 and 2 workers,
with and without the feature cache (``cache="features"``), for two copies of the synthetic
industrial dataset:

- ``16k``: the generator's files as they are (16 kHz mono WAV, 64x64 PNG): no resampling;
- ``44k``: the same clips written as 44.1 kHz stereo and the images as 256x256 JPEG, the usual
  shape of user data: every item is downmixed, resampled to 16 kHz and resized.

Then the training step rate of ``hunter_small`` (batch 32, AdamW, one process, in-memory batch)
and the ratios the data issue sets as goals: loader with 2 workers >= 3x the step rate, cache
>= 5x uncached decoding (both with 0 workers, i.e. per core).

    python benchmarks/data.py                 # 512 samples, about 2-3 minutes on 2 cores
    python benchmarks/data.py --n 256 --steps 6

Loader figures are the second epoch (workers already started; the first epoch of a
persistent-worker loader pays the fork). The step rate is measured alone: in a real run the
loader workers and the training step share the cores.

``--scale`` measures the record layouts instead (issue #26), side by side in one run:

1. **Resume cost**: seconds from building and placing the train loader to its first batch, resuming
   at batch 10 and at batch 5,000 of an epoch (batch size 1, a written dataset of 6,000 tiny
   samples: 0.1 s 16 kHz WAV + 16x16 PNG, 2 classes), with 0 and 2 workers, best of ``--repeat``,
   for (a) tar shards (``sss.data.shards.pack``, 500 per shard) placed by ``StreamDataset.start_at``,
   as the trainer does (``loader_from``); (b) the same stream loader skipped by replay, Accelerate's
   ``skip_first_batches``, which reads and drops the batches (a stream's resume before #26); (c) Hub
   Parquet (``sss.testing.hub_parquet``) read with ``streaming=True``, placed by ``start_at``; (d) the
   manifest, map-style, through ``Accelerator.skip_first_batches`` (indices only). The ratio 5000/10
   is ~1x for a placed resume and grows with the batch for a replayed one. The run also checks that the
   placed and the replayed stream give the same first batch at 5,000.
2. **Throughput**: train-loader samples/s in the second epoch (batch 32, 2 workers) of the manifest,
   its shards and its streamed Parquet, on the industrial dataset (512 samples, 64x64, 1 s audio; the
   manifest cut to ``image,audio,label``, the columns Parquet carries, so all three decode the same).

    python benchmarks/data.py --scale         # about 40 s on 2 cores (--workers 0 2, --repeat 3)
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import numpy as np
import soundfile as sf
import torch
from PIL import Image

from sss.data import ManifestDataModule, make_industrial


def resampled_copy(src: Path, dst: Path) -> Path:
    """The industrial split as 44.1 kHz stereo WAV + 256x256 JPEG (what users tend to bring)."""
    import torchaudio.functional

    (dst / "audio").mkdir(parents=True)
    (dst / "images").mkdir()
    for split in ("train",):
        with open(src / f"{split}.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        out = []
        for row in rows:
            wave, rate = sf.read(src / row["audio"], dtype="float32")
            up = torchaudio.functional.resample(torch.from_numpy(wave)[None], rate, 44100)[0].numpy()
            name = Path(row["audio"]).stem
            sf.write(dst / "audio" / f"{name}.wav", np.stack([up, up], 1), 44100, subtype="PCM_16")
            with Image.open(src / row["image"]) as img:
                img.resize((256, 256), Image.Resampling.BICUBIC).save(dst / "images" / f"{name}.jpg", quality=90)
            out.append(f"images/{name}.jpg,audio/{name}.wav,{row['label']}")
        (dst / f"{split}.csv").write_text("image,audio,label\n" + "\n".join(out) + "\n")
    (dst / "classes.txt").write_text((src / "classes.txt").read_text())
    return dst


def loader_rate(root: Path, workers: int, cache: str | None, cache_dir: Path, batch: int) -> tuple[float, float]:
    """(samples/s in the second epoch, seconds of setup incl. any cache build)."""
    start = time.perf_counter()
    dm = ManifestDataModule(
        str(root), batch_size=batch, num_workers=workers, cache=cache, cache_dir=str(cache_dir), clip_seconds=1.0
    )
    dm.setup("fit")
    setup = time.perf_counter() - start
    loader = dm.train_dataloader()
    for _ in loader:  # epoch 1: starts the (persistent) workers
        pass
    start = time.perf_counter()
    count = sum(len(b["label"]) for b in loader)
    return count / (time.perf_counter() - start), setup


def step_rate(root: Path, steps: int, batch: int) -> float:
    """hunter_small training samples/s: median step time over ``steps`` steps after 2 warm-up steps."""
    from sss.models import create_model

    torch.manual_seed(0)
    dm = ManifestDataModule(str(root), batch_size=batch, clip_seconds=1.0)
    dm.setup("fit")
    data = next(iter(dm.train_dataloader()))
    model = create_model("hunter_small", num_classes=4).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for i in range(steps + 2):
        start = time.perf_counter()
        loss = model.training_step(data, i)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return batch / statistics.median(times)


def tiny_manifest(dst: Path, n: int) -> Path:
    """``n`` samples of 0.1 s 16 kHz noise WAV + 16x16 PNG, 2 classes, listed in ``train.csv``."""
    rng = np.random.default_rng(0)
    (dst / "audio").mkdir(parents=True)
    (dst / "images").mkdir()
    rows = []
    for i in range(n):
        sf.write(dst / "audio" / f"{i:05d}.wav", rng.uniform(-0.5, 0.5, 1600), 16000, subtype="PCM_16")
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(dst / "images" / f"{i:05d}.png")
        rows.append(f"images/{i:05d}.png,audio/{i:05d}.wav,{'ab'[i % 2]}")
    (dst / "train.csv").write_text("image,audio,label\n" + "\n".join(rows) + "\n")
    (dst / "classes.txt").write_text("a\nb\n")
    return dst


def record_copies(root: Path, work: Path, shard_size: int, row_group: int) -> dict[str, tuple[Path, dict]]:
    """The manifest, its tar shards and its Hub Parquet, each with the data-module options that read it."""
    from sss.data.shards import pack
    from sss.testing import hub_parquet

    with contextlib.redirect_stdout(io.StringIO()):  # pack's per-split summary
        pack(root, work / "shards", shard_size=shard_size)
    hub_parquet(root, work / "hub", files=4, row_group=row_group)
    return {
        "manifest": (root, {}),
        "shards": (work / "shards", {"layout": "shards"}),
        "hf-stream": (work / "hub", {"layout": "hf", "streaming": True}),
    }


def first_batch(dm: ManifestDataModule, accelerator: object, start: int, replay: bool) -> tuple[float, list[int]]:
    """Seconds from building the train loader, resumed after ``start`` batches, to its first batch (and its indices).

    ``replay``: Accelerate's ``skip_first_batches`` whatever the dataset (reads and drops an iterable's batches);
    otherwise the trainer's ``loader_from`` (a stream is placed by ``start_at``).
    """
    from sss.trainer._accelerate_compat import loader_from, prepare_loader

    begin = time.perf_counter()
    loader = prepare_loader(accelerator, dm.train_dataloader())
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(0)
    placed = accelerator.skip_first_batches(loader, start) if replay else loader_from(accelerator, loader, start)
    batches = iter(placed)
    batch = next(batches)
    seconds = time.perf_counter() - begin
    del batches  # stops this loader's workers before the next measurement
    return seconds, batch["index"].tolist()


def resume_table(work: Path, workers: tuple[int, ...], repeat: int) -> None:
    """Print the resume cost at batch 10 and 5,000 for placed and replayed streams and the map-style manifest."""
    from accelerate import Accelerator

    start = time.perf_counter()
    copies = record_copies(tiny_manifest(work / "tiny", 6000), work / "tiny-records", 500, 100)
    print(
        f"resume data: 6000 samples written, packed (500/shard), Parquet (100/row group) in "
        f"{time.perf_counter() - start:.1f} s"
    )
    accelerator = Accelerator(cpu=True)
    cases = [
        ("(a) shards, start_at", "shards", False),
        ("(b) shards, replay", "shards", True),
        ("(c) hf stream, start_at", "hf-stream", False),
        ("(d) manifest, skip_first_batches", "manifest", False),
    ]
    print(f"{'loader':<34} {'workers':>7} {'s @10':>8} {'s @5000':>8} {'5000/10':>8}")
    for count in workers:
        firsts: dict[str, list[int]] = {}
        for label, name, replay in cases:
            root, options = copies[name]
            dm = ManifestDataModule(
                str(root), batch_size=1, num_workers=count, clip_seconds=0.1, image_size=16, **options
            )
            with contextlib.redirect_stdout(io.StringIO()):  # setup's data summary
                dm.setup("fit")
            cost = {}
            for at in (10, 5000):
                runs = [first_batch(dm, accelerator, at, replay) for _ in range(1 if replay and at > 10 else repeat)]
                cost[at] = min(seconds for seconds, _ in runs)
                firsts[label] = runs[0][1]
            print(
                f"{label:<34} {count:>7} {cost[10]:>8.4f} {cost[5000]:>8.4f} {cost[5000] / cost[10]:>7.1f}x", flush=True
            )
        same = firsts["(a) shards, start_at"] == firsts["(b) shards, replay"]
        print(f"  batch 5000 placed == replayed (sample {firsts['(a) shards, start_at']}): {same}")


def throughput_table(work: Path, batch: int, workers: int) -> None:
    """Print the second-epoch train-loader samples/s of the manifest, its shards and its streamed Parquet."""
    from accelerate import Accelerator

    from sss.trainer._accelerate_compat import prepare_loader

    root = make_industrial(work / "industrial", n_train=512, n_val=8, n_test=0, seed=0)
    for split in ("train", "val"):  # the columns Parquet carries (no mask, no events): the same work for all three
        with open(root / f"{split}.csv", newline="") as handle:
            rows = [f"{r['image']},{r['audio']},{r['label']}" for r in csv.DictReader(handle)]
        (root / f"{split}.csv").write_text("image,audio,label\n" + "\n".join(rows) + "\n")
    copies = record_copies(root, work / "industrial-records", 64, 32)
    accelerator = Accelerator(cpu=True)
    rates = {}
    print(f"{'data':<10} {'samples/s':>10} {'vs manifest':>12}   (batch {batch}, {workers} workers, epoch 2)")
    for name, (folder, options) in copies.items():
        dm = ManifestDataModule(str(folder), batch_size=batch, num_workers=workers, clip_seconds=1.0, **options)
        with contextlib.redirect_stdout(io.StringIO()):
            dm.setup("fit")
        loader = prepare_loader(accelerator, dm.train_dataloader())
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            if hasattr(loader.dataset, "set_epoch"):
                loader.dataset.set_epoch(epoch)
            start = time.perf_counter()
            count = sum(len(b["label"]) for b in loader)
        rates[name] = count / (time.perf_counter() - start)
        print(f"{name:<10} {rates[name]:>10.0f} {rates[name] / rates['manifest']:>11.2f}x", flush=True)
        del loader


def scale(args: argparse.Namespace) -> None:
    """``--scale``: resume cost and record-layout throughput (module docstring), with the load before and after."""
    import subprocess

    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()  # noqa: E731
    print(f"before: {uptime()}")
    print(f"torch threads {torch.get_num_threads()}, cores {os.cpu_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        resume_table(Path(tmp), tuple(args.workers), args.repeat)
        throughput_table(Path(tmp), args.batch, 2)
    print(f"after: {uptime()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512, help="training samples")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="timed hunter_small steps")
    parser.add_argument("--scale", action="store_true", help="resume cost and shard / Parquet throughput instead")
    parser.add_argument("--repeat", type=int, default=3, help="--scale: best of this many placed resumes")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="--scale: resume worker counts")
    args = parser.parse_args()
    if args.scale:
        return scale(args)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        root = make_industrial(work / "industrial", n_train=args.n, n_val=0, n_test=0, seed=0)
        seconds = time.perf_counter() - start
        print(
            f"generator: {args.n} samples in {seconds:.2f} s = {args.n / seconds:.0f} samples/s (incl. writing files)"
        )
        copies = {"16k": root, "44k": resampled_copy(root, work / "user")}
        print(f"torch threads {torch.get_num_threads()}, cores {os.cpu_count()}, batch {args.batch}")
        print(f"{'data':>5} {'cache':>9} {'workers':>7} {'samples/s':>10} {'setup s':>8}")
        rates: dict[tuple[str, str, int], float] = {}
        for name, folder in copies.items():
            for cache in (None, "features"):
                for workers in (0, 1, 2):
                    rate, setup = loader_rate(folder, workers, cache, work / "cache", args.batch)
                    rates[name, str(cache), workers] = rate
                    print(f"{name:>5} {cache!s:>9} {workers:>7} {rate:>10.0f} {setup:>8.2f}", flush=True)
        train = step_rate(root, args.steps, args.batch)
        print(
            f"hunter_small training: {train:.1f} samples/s "
            f"({args.batch / train * 1000:.0f} ms/step, batch {args.batch})"
        )
        for name in copies:
            two = rates[name, "None", 2]
            cached = rates[name, "features", 0] / rates[name, "None", 0]
            print(
                f"{name}: loader 2 workers / step rate = {two / train:.1f}x "
                f"(goal >= 3x: {'pass' if two >= 3 * train else 'FAIL'}); "
                f"cache / uncached (0 workers) = {cached:.1f}x (goal >= 5x: {'pass' if cached >= 5 else 'FAIL'})"
            )


if __name__ == "__main__":
    main()
