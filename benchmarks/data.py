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
"""

from __future__ import annotations

import argparse
import csv
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512, help="training samples")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="timed hunter_small steps")
    args = parser.parse_args()
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
