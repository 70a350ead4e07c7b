"""Recipes on many-class data: does `examples/manifest.yaml` learn ESC-50-, UrbanSound8K- and manifest-shaped sets fast?

    python benchmarks/recipes.py                          # every set, 10 epochs each (the example's own budget)
    python benchmarks/recipes.py --sets esc50 --epochs 3  # one set, a shorter run
    python benchmarks/recipes.py --dry-run                # tiny sets, 1 epoch: what the test runs
    python benchmarks/recipes.py --sets esc50 -- trainer.optim.optimizer.lr=3e-3   # extra overrides

The script builds its own datasets in a temporary folder, in the public layouts' own shapes:

- ``esc50``: ``meta/esc50.csv`` with ESC-50's columns (filename, fold, target, category, esc10,
  src_file, take) and ``audio/{fold}-{src}-{take}-{target}.wav``: 50 classes x 40 clips of 5 s at
  44.1 kHz (ESC-50's rate: the loader resamples to the model's 16 kHz), 5 folds of 8 clips per class.
- ``urbansound8k``: ``metadata/UrbanSound8K.csv`` (slice_file_name, fsID, start, end, salience,
  fold, classID, class) and ``audio/fold1..10/``: 10 classes x 10 folds x 20 clips of 4 s at 44.1 kHz.
- ``manifest``: ``train.csv`` / ``val.csv`` with image and audio columns, 20 classes (64x64 PNG,
  1-s 16 kHz WAV); ``images``: images of the same 20 codes, with an image column only.

Each class is a texture code with random jitter and nuisance noise. Audio: band-limited noise
whose centre frequency (10 values, evenly spaced on the mel scale) and amplitude modulation
(rate and depth, 5 codes) name the class; every clip jitters the centre, rate, depth, phase and
gain and adds background noise at 8-20 dB SNR. Images: a hue (5 values) times a pattern
(horizontal or vertical grating, checkerboard, plain), with jittered hue, period, phase and pixel
noise; the patterns survive the loader's horizontal flip and crops. The codes are chosen so that
a linear model on simple statistics separates them: the script fits a logistic regression (torch)
on per-band mean and standard deviation of the log-mel (and, for images, per-channel mean/std and
directional gradient energy) of the loaded training split and prints its validation accuracy as
the ceiling check.

Then it runs ``sss fit examples/manifest.yaml data.root=... [data.layout=... data.fold=1]`` per
set as a subprocess (checkpoints off, everything else the example's recipe) and prints the
per-epoch validation accuracy (from the run's ``logs/metrics.csv``), the final figure and the wall
time.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from PIL import Image

EXAMPLE = Path(__file__).parents[1] / "examples" / "manifest.yaml"
SETS = ("esc50", "urbansound8k", "manifest", "images")
ESC50_COLUMNS = ["filename", "fold", "target", "category", "esc10", "src_file", "take"]
US8K_COLUMNS = ["slice_file_name", "fsID", "start", "end", "salience", "fold", "classID", "class"]
MODULATIONS = ((0.0, 0.0), (3.0, 0.45), (5.0, 0.75), (8.0, 0.92), (2.0, 0.995))
"""(rate in Hz, depth) of the audio codes: depth sets the per-band spread of the log-mel, rate the texture."""
HUES = (0.0, 0.2, 0.4, 0.6, 0.8)
PATTERNS = ("horizontal", "vertical", "checker", "plain")


@dataclass(frozen=True)
class Sizes:
    """How big each built set is (`FULL` or `DRY`)."""

    esc50_classes: int
    esc50_clips: int  # per class, spread over 5 folds
    esc50_seconds: float
    us8k_clips: int  # per class and fold
    manifest_classes: int
    manifest_train: int  # per class
    manifest_val: int  # per class
    sample_rate: int


FULL = Sizes(50, 40, 5.0, 20, 20, 40, 10, 44100)
DRY = Sizes(5, 5, 1.0, 1, 4, 4, 2, 16000)


# --- textures ---------------------------------------------------------------------------------------------------


def _mel(hz: np.ndarray | float) -> np.ndarray | float:
    return 2595.0 * np.log10(1.0 + np.asarray(hz) / 700.0)


def centres(count: int, low: float = 150.0, high: float = 6000.0) -> list[float]:
    """``count`` centre frequencies in Hz, evenly spaced on the mel scale from ``low`` to ``high``.

    Example:
        >>> [round(c) for c in centres(3)]
        [150, 1686, 6000]
    """
    mels = np.linspace(_mel(low), _mel(high), count)
    return [float(700.0 * (10 ** (m / 2595.0) - 1.0)) for m in mels]


def audio_code(label: int, n_centres: int = 10) -> tuple[float, float, float]:
    """Class ``label``'s (centre Hz, modulation rate Hz, depth): centre label % n_centres, modulation the rest.

    Example:
        >>> [round(v, 2) for v in audio_code(13)]
        [991.63, 3.0, 0.45]
    """
    rate, depth = MODULATIONS[(label // n_centres) % len(MODULATIONS)]
    return centres(n_centres)[label % n_centres], rate, depth


def texture(rng: np.random.Generator, label: int, seconds: float, sample_rate: int, n_centres: int = 10) -> np.ndarray:
    """One jittered clip of class ``label``: band-limited noise, amplitude-modulated, over background noise.

    Example:
        >>> clip = texture(np.random.default_rng(0), 3, 0.5, 16000)
        >>> clip.shape, clip.dtype, bool(np.abs(clip).max() <= 1.0)
        ((8000,), dtype('float32'), True)
    """
    centre, rate, depth = audio_code(label, n_centres)
    n = round(seconds * sample_rate)
    freqs = np.fft.rfftfreq(n, 1.0 / sample_rate)
    spacing = (_mel(6000.0) - _mel(150.0)) / (n_centres - 1)
    centre_mel = _mel(centre) + rng.uniform(-0.12, 0.12) * spacing
    band = np.exp(-0.5 * ((_mel(freqs) - centre_mel) / (0.25 * spacing)) ** 2)
    spectrum = (rng.standard_normal(freqs.size) + 1j * rng.standard_normal(freqs.size)) * band
    tone = np.fft.irfft(spectrum, n)
    t = np.arange(n) / sample_rate
    rate *= rng.uniform(0.9, 1.1)
    depth = min(depth * rng.uniform(0.97, 1.03), 0.999)
    tone *= 1.0 - depth * (0.5 + 0.5 * np.cos(2 * math.pi * rate * t + rng.uniform(0, 2 * math.pi)))
    tone /= np.sqrt(np.mean(tone**2)) + 1e-12
    # Nuisance: background noise, pink-ish (1/sqrt(f) amplitude), at a random SNR.
    noise_spec = (rng.standard_normal(freqs.size) + 1j * rng.standard_normal(freqs.size)) / np.sqrt(
        np.maximum(freqs, 20.0)
    )
    noise = np.fft.irfft(noise_spec, n)
    noise /= np.sqrt(np.mean(noise**2)) + 1e-12
    clip = tone + noise * 10 ** (-rng.uniform(8, 20) / 20)
    clip *= 10 ** (rng.uniform(-6, 0) / 20) * 0.25 / (np.abs(clip).max() + 1e-12)
    return clip.astype(np.float32)


def picture(rng: np.random.Generator, label: int, size: int = 64) -> np.ndarray:
    """One jittered ``size`` x ``size`` RGB uint8 image of class ``label``: hue = label % 5, pattern = label // 5.

    Example:
        >>> picture(np.random.default_rng(0), 6).shape
        (64, 64, 3)
    """
    import colorsys

    hue = (HUES[label % len(HUES)] + rng.uniform(-0.03, 0.03)) % 1.0
    pattern = PATTERNS[(label // len(HUES)) % len(PATTERNS)]
    colour = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.6, 0.9), rng.uniform(0.6, 0.9)))
    y, x = np.mgrid[0:size, 0:size].astype(np.float64)
    period, phase = rng.uniform(6, 10), rng.uniform(0, 2 * math.pi)
    wave = {
        "horizontal": np.sin(2 * math.pi * y / period + phase),
        "vertical": np.sin(2 * math.pi * x / period + phase),
        "checker": np.sin(2 * math.pi * x / period + phase) * np.sin(2 * math.pi * y / period + phase),
        "plain": np.zeros_like(x),
    }[pattern]
    shade = 0.65 + 0.35 * wave
    pixels = shade[..., None] * colour[None, None, :] + rng.normal(0, 0.04, (size, size, 3))
    return (np.clip(pixels, 0, 1) * 255).astype(np.uint8)


# --- the layouts ------------------------------------------------------------------------------------------------


def _write_csv(path: Path, columns: list[str], rows: list[list[object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)


def class_name(label: int, n_centres: int = 10) -> str:
    """A class's name from its code, e.g. ``band3_am1`` (centre 3, modulation code 1)."""
    return f"band{label % n_centres}_am{label // n_centres}"


def build_esc50(root: Path, sizes: Sizes, seed: int = 0) -> Path:
    """ESC-50-master's layout: ``meta/esc50.csv`` and ``audio/{fold}-{src}-{take}-{target}.wav``; 5 folds.

    Example:
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     root = build_esc50(Path(tmp) / "esc", DRY)
        ...     (root / "meta" / "esc50.csv").read_text().splitlines()[:2]
        ['filename,fold,target,category,esc10,src_file,take', '1-100000-A-0.wav,1,0,band0_am0,True,100000,A']
    """
    rng = np.random.default_rng(seed)
    rows = []
    for target in range(sizes.esc50_classes):
        for clip in range(sizes.esc50_clips):
            fold = clip % 5 + 1
            src, take = 100000 + target * 1000 + clip // 2, "AB"[clip % 2]
            name = f"{fold}-{src}-{take}-{target}.wav"
            wave = texture(rng, target, sizes.esc50_seconds, sizes.sample_rate)
            (root / "audio").mkdir(parents=True, exist_ok=True)
            sf.write(root / "audio" / name, wave, sizes.sample_rate, subtype="PCM_16")
            rows.append([name, fold, target, class_name(target), target < 10, src, take])
    rows.sort(key=lambda r: (r[1], r[0]))
    _write_csv(root / "meta" / "esc50.csv", ESC50_COLUMNS, rows)
    return root


def build_urbansound8k(root: Path, sizes: Sizes, seed: int = 1) -> Path:
    """UrbanSound8K's layout: ``metadata/UrbanSound8K.csv`` and ``audio/fold1..10/{fsID}-{classID}-{occ}-{slice}.wav``.

    Ten classes: five centres x two modulation codes, 4-s clips (US8K's longest).
    """
    rng = np.random.default_rng(seed)
    rows = []
    for fold in range(1, 11):
        for class_id in range(10):
            label = (class_id % 5) * 2 + (class_id // 5) * 10  # centres 0,2,..,8; modulation codes 0 and 1
            for clip in range(sizes.us8k_clips):
                fs_id = 10000 + fold * 1000 + class_id * 50 + clip
                name = f"{fs_id}-{class_id}-0-{clip}.wav"
                seconds = 4.0 if sizes is FULL else sizes.esc50_seconds
                wave = texture(rng, label, seconds, sizes.sample_rate)
                (root / "audio" / f"fold{fold}").mkdir(parents=True, exist_ok=True)
                sf.write(root / "audio" / f"fold{fold}" / name, wave, sizes.sample_rate, subtype="PCM_16")
                rows.append([name, fs_id, 0.0, seconds, 1 + clip % 2, fold, class_id, class_name(label)])
    _write_csv(root / "metadata" / "UrbanSound8K.csv", US8K_COLUMNS, rows)
    return root


def build_manifest(root: Path, sizes: Sizes, modalities: Sequence[str] = ("image", "audio"), seed: int = 2) -> Path:
    """A manifest folder: ``train.csv`` / ``val.csv`` with the given columns (PNG, 1-s 16 kHz WAV), ``classes.txt``.

    Class ``k``'s image code is (hue k % 5, pattern k // 5) and its audio code the texture ``k``
    (centre k % 10, modulation k // 10): either modality names the class on its own.
    """
    rng = np.random.default_rng(seed)
    classes = [f"class{k:02d}" for k in range(sizes.manifest_classes)]
    (root / "files").mkdir(parents=True, exist_ok=True)
    (root / "classes.txt").write_text("\n".join(classes) + "\n")
    for split, count in (("train", sizes.manifest_train), ("val", sizes.manifest_val)):
        rows = []
        for k, name in enumerate(classes):
            for i in range(count):
                stem = f"files/{split}_{k:02d}_{i:03d}"
                row: list[object] = []
                if "image" in modalities:
                    Image.fromarray(picture(rng, k)).save(root / f"{stem}.png")
                    row.append(f"{stem}.png")
                if "audio" in modalities:
                    sf.write(root / f"{stem}.wav", texture(rng, k, 1.0, 16000), 16000, subtype="PCM_16")
                    row.append(f"{stem}.wav")
                rows.append([*row, name])
        _write_csv(root / f"{split}.csv", [*modalities, "label"], rows)
    return root


def overrides_for(kind: str, folder: Path) -> list[str]:
    """The ``sss fit`` data overrides that read set ``kind`` in ``folder``.

    Example:
        >>> overrides_for("esc50", Path("/d/esc50"))
        ['data.root=/d/esc50', 'data.layout=esc50', 'data.fold=1']
    """
    layout = [f"data.layout={kind}", "data.fold=1"] if kind in ("esc50", "urbansound8k") else []
    return [f"data.root={folder}", *layout]


def build(kind: str, root: Path, sizes: Sizes) -> Path:
    """Build set ``kind`` (one of `SETS`) in ``root / kind`` and return that folder."""
    folder = root / kind
    if kind == "esc50":
        return build_esc50(folder, sizes)
    if kind == "urbansound8k":
        return build_urbansound8k(folder, sizes)
    return build_manifest(folder, sizes, ("image", "audio") if kind == "manifest" else ("image",))


# --- the linear ceiling -----------------------------------------------------------------------------------------


def _statistics(batch: dict[str, torch.Tensor], frontend: torch.nn.Module) -> torch.Tensor:
    parts = []
    if "audio" in batch:
        mel = frontend(batch["audio"])[:, 0]  # [B, M, T] in dB (eval-mode front-end, fresh statistics)
        parts += [mel.mean(-1), mel.std(-1)]
    if "image" in batch:
        image = batch["image"]
        dx, dy = image.diff(dim=-1), image.diff(dim=-2)
        parts += [image.mean((-2, -1)), image.std((-2, -1)), dx.pow(2).mean((1, 2, 3))[:, None]]
        parts += [dy.pow(2).mean((1, 2, 3))[:, None]]
    return torch.cat(parts, dim=1)


def linear_ceiling(data_overrides: list[str], steps: int = 500) -> dict[str, float]:
    """Validation accuracy of a logistic regression on simple statistics of the set, loaded by `ManifestDataModule`.

    The data module is built from ``examples/manifest.yaml`` with the same overrides as the run,
    so the layout readers, decoding and resampling are the run's own.
    """
    from sss.config import instantiate, load_config
    from sss.models.audio.frontend import LogMelFrontend

    cfg = load_config(str(EXAMPLE), [*data_overrides, "data.num_workers=0", "data.augment=false"])
    data = instantiate(cfg.data)
    data.setup("fit")
    frontend = LogMelFrontend(n_mels=data.n_mels, sample_rate=data.sample_rate).eval()
    feats = {}
    with torch.no_grad():
        for split, loader in (("train", data.train_dataloader()), ("val", data.val_dataloader())):
            xs, ys = zip(*((_statistics(b, frontend), b["label"]) for b in loader), strict=True)
            feats[split] = (torch.cat(xs), torch.cat(ys))
    (x_train, y_train), (x_val, y_val) = feats["train"], feats["val"]
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    x_train, x_val = (x_train - mean) / std, (x_val - mean) / std
    torch.manual_seed(0)
    linear = torch.nn.Linear(x_train.shape[1], len(data.classes))
    optimizer = torch.optim.LBFGS(linear.parameters(), max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(linear(x_train), y_train) + 1e-3 * linear.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        train_acc = (linear(x_train).argmax(1) == y_train).float().mean().item()
        val_acc = (linear(x_val).argmax(1) == y_val).float().mean().item()
    return {
        "classes": len(data.classes),
        "train": len(y_train),
        "val": len(y_val),
        "train_accuracy": train_acc,
        "val_accuracy": val_acc,
    }


# --- the runs ---------------------------------------------------------------------------------------------------


def val_curve(metrics_csv: Path) -> list[float]:
    """Per-epoch ``val/accuracy`` from a run's ``logs/metrics.csv``, in order."""
    with metrics_csv.open(newline="") as f:
        return [float(row["val/accuracy"]) for row in csv.DictReader(f) if row.get("val/accuracy")]


def fit(data_overrides: list[str], folder: Path, extra: list[str]) -> dict[str, object]:
    """``sss fit examples/manifest.yaml`` on one set in a subprocess; its curve, final accuracy and wall time."""
    cmd = [
        sys.executable,
        "-m",
        "sss",
        "fit",
        str(EXAMPLE),
        *data_overrides,
        f"trainer.output_dir={folder}",
        "trainer.log.progress=false",
        "trainer.checkpoint.every_epoch=false",
        *extra,
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"run failed ({' '.join(cmd)}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    results = json.loads((folder / "results.json").read_text())
    return {"curve": val_curve(folder / "logs" / "metrics.csv"), "final": results["val/accuracy"], "wall_s": wall}


def main(argv: list[str] | None = None) -> dict[str, dict[str, object]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    parser.add_argument("--epochs", type=int, default=None, help="trainer.max_epochs (default: the example's 10)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sets and 1 epoch (the test)")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the linear-ceiling check")
    parser.add_argument("--root", default=None, help="build (or reuse) the sets here instead of a temporary folder")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides of every run (after --)")
    args = parser.parse_args(argv)
    sizes = DRY if args.dry_run else FULL
    epochs = 1 if args.dry_run and args.epochs is None else args.epochs
    extra = [*([f"trainer.max_epochs={epochs}"] if epochs else []), *args.overrides]
    if args.dry_run:
        extra = ["data.num_workers=0", *extra]
    report: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.root) if args.root else Path(tmp)
        for kind in args.sets:
            start = time.perf_counter()
            folder = base / kind
            if not (args.root and folder.exists()):  # --root: a set already built there is reused
                build(kind, base, sizes)
            data_overrides = overrides_for(kind, folder)
            built_s = time.perf_counter() - start
            entry: dict[str, object] = {"built_s": built_s, "overrides": data_overrides}
            if not args.no_ceiling:
                entry["ceiling"] = linear_ceiling(data_overrides)
                ceiling = entry["ceiling"]
                print(
                    f"{kind}: linear ceiling (logistic regression on simple statistics): val accuracy "
                    f"{ceiling['val_accuracy']:.3f} (train {ceiling['train_accuracy']:.3f}; {ceiling['classes']} "
                    f"classes, {ceiling['train']} train / {ceiling['val']} val)",
                    flush=True,
                )
            entry |= fit(data_overrides, Path(tmp) / f"run_{kind}", extra)  # runs: always fresh folders
            curve = " ".join(f"{a:.3f}" for a in entry["curve"])  # type: ignore[union-attr]
            print(
                f"{kind}: val accuracy per epoch {curve}; final {entry['final']:.3f}; "
                f"fit {entry['wall_s']:.0f} s (built in {built_s:.0f} s)",
                flush=True,
            )
            report[kind] = entry
    return report


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
