"""Missing modalities on the redundant task: modality dropout vs none vs unimodal models, one modality absent.

    python benchmarks/missing.py                                  # hunter_tiny, 630 steps, seed 0
    python benchmarks/missing.py --seeds 0 1 2 --plot docs/images/missing.png
    python benchmarks/missing.py --full                           # the example's own hunter_small, 6 epochs
    python benchmarks/missing.py -- model.fusion=late             # extra overrides for every run

The data is the synthetic generator's ``task="redundant"``: four machines, each shown by its grille's slat
angle and heard by its own sound, each modality corrupted alone, the image in 5% of the samples and the audio
in 30% (so the image alone reaches about 96%, the audio alone 78%, both together 99%). Four models are
trained on it with the same budget (`BUDGET`, unless ``--full``), each ``examples/industrial.yaml`` with
``data.task=redundant``:

- ``dropout``: ``model.modality_dropout={"image": 0.3, "audio": 0.3}`` (a sample's image or its audio is
  marked absent in training, never both);
- ``no_dropout``: the same model without it;
- ``image_only`` / ``audio_only``: ``model.modalities=[image]`` / ``[audio]``, one encoder and its pooled
  tokens to the classifier (``model.fusion=late``: a single modality has nothing to attend across).

Each fused model is then evaluated with ``trainer.validate(missing={modality: r})`` for each modality and
r in `RATES` (the seeded absences of ``sss validate --missing``), the unimodal ones plainly. Each model is
trained and evaluated in its own ``python`` process (no state leaks between them); checkpoints are off.
Printed: the side-by-side table (validation accuracy per model, modality and rate) and the acceptance
ratios: with one modality absent from every sample, the dropout model against the model trained on the
other modality alone (goal: at most 3 points below) and against the model trained without dropout (goal:
far above); with nothing absent, dropout against no dropout (goal: at most 2 points below). ``--plot``
writes the accuracy-vs-rate curves as a PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE = Path(__file__).parents[1] / "examples" / "industrial.yaml"
RATES = (0.0, 0.25, 0.5, 1.0)
MODELS = {
    "dropout": ['model.modality_dropout={"image":0.3,"audio":0.3}'],
    "no_dropout": [],
    "image_only": ["model.modalities=[image]", "model.fusion=late"],  # one encoder: nothing to attend across
    "audio_only": ["model.modalities=[audio]", "model.fusion=late"],
}
"""The overrides of each model (on top of the task and the budget)."""
TASK = ["data.task=redundant"]
BUDGET = ["model.name=hunter_tiny", "data.n_train=2000", "data.n_val=400", "data.n_test=0", "trainer.max_epochs=10"]
"""hunter_tiny, 10 epochs of 2000 samples (630 steps): at benchmarks/fusion.py's 5, the dropout model's audio
branch, which learns from the 30% of samples whose image is dropped, was still 10 points short of the
audio-only model (RESULTS.md)."""
OTHER = {"image": "audio", "audio": "image"}


def train_and_evaluate(overrides: list[str], out: Path) -> None:
    """In this process: train the model of `overrides`, evaluate it with each modality absent, write ``out``."""
    from sss import SSSTrainer
    from sss.config import load_config
    from sss.run.parts import build_parts

    cfg = load_config(EXAMPLE, overrides)
    parts = build_parts(cfg)
    module, datamodule = parts.module, parts.datamodule
    trainer = SSSTrainer(cfg.trainer)
    start = time.perf_counter()
    trainer.fit(module, datamodule)
    seconds = time.perf_counter() - start
    result: dict = {"seconds": seconds, "modalities": list(getattr(module, "modalities", ("image", "audio")))}
    result["modality_dropout"] = dict(getattr(module, "modality_dropout", {}))  # what the model trained with
    if len(result["modalities"]) == 1:
        result["accuracy"] = trainer.validate(module, datamodule)["val/accuracy"]
    else:
        for modality in ("image", "audio"):
            for rate in RATES:
                metrics = trainer.validate(module, datamodule, missing={modality: rate})
                result.setdefault(modality, {})[str(rate)] = metrics["val/accuracy"]
    out.write_text(json.dumps(result, indent=2))


def run(name: str, overrides: list[str], folder: Path, env: dict[str, str]) -> dict:
    """Train and evaluate one model in a child process; its figures."""
    folder.mkdir(parents=True)
    overrides = [
        *overrides,
        f"trainer.output_dir={folder / 'run'}",
        "trainer.log.progress=false",
        "trainer.checkpoint.every_epoch=false",
    ]
    cmd = [sys.executable, __file__, "--one", str(folder / "result.json"), "--", *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed ({' '.join(cmd)}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads((folder / "result.json").read_text())


def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{mean:.4f}"


def mean(values: list[float]) -> float:
    return statistics.fmean(values)


def report(results: dict[str, list[dict]], header: str) -> list[str]:
    """The table and the acceptance lines, as printed (and pasted into RESULTS.md)."""
    lines = [header, "", "| model | absent | " + " | ".join(f"r = {r}" for r in RATES) + " |"]
    lines.append("|---|---|" + "---|" * len(RATES))
    for name in ("dropout", "no_dropout"):
        for modality in ("image", "audio"):
            cells = [spread([run[modality][str(r)] for run in results[name]]) for r in RATES]
            lines.append(f"| {name} | {modality} | " + " | ".join(cells) + " |")
    for name in ("image_only", "audio_only"):
        lines.append(f"| {name} | - | {spread([run['accuracy'] for run in results[name]])} |" + " |" * (len(RATES) - 1))
    lines.append("")
    full = {name: mean([run["image"]["0.0"] for run in results[name]]) for name in ("dropout", "no_dropout")}
    for gone, kept in OTHER.items():
        drop = mean([run[gone]["1.0"] for run in results["dropout"]])
        plain = mean([run[gone]["1.0"] for run in results["no_dropout"]])
        alone = mean([run["accuracy"] for run in results[f"{kept}_only"]])
        lines.append(
            f"- {gone} absent from every sample: dropout {drop:.4f} vs {kept}-only model {alone:.4f} "
            f"({100 * (drop - alone):+.1f} points; goal >= -3: {'pass' if drop >= alone - 0.03 else 'FAIL'}); "
            f"vs no dropout {plain:.4f} ({100 * (drop - plain):+.1f} points)"
        )
    lost = full["dropout"] - full["no_dropout"]
    lines.append(
        f"- nothing absent: dropout {full['dropout']:.4f} vs no dropout {full['no_dropout']:.4f} "
        f"({100 * lost:+.1f} points; goal >= -2: {'pass' if lost >= -0.02 else 'FAIL'})"
    )
    return lines


def plot(results: dict[str, list[dict]], path: Path, title: str) -> None:
    """Accuracy vs the fraction of samples without the modality: one panel per absent modality."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, modality in zip(axes, ("image", "audio"), strict=True):
        for name, style in (("dropout", "o-"), ("no_dropout", "s--")):
            ys = [mean([run[modality][str(r)] for run in results[name]]) for r in RATES]
            ax.plot(RATES, ys, style, label=name.replace("_", " "))
        alone = mean([run["accuracy"] for run in results[f"{OTHER[modality]}_only"]])
        ax.axhline(alone, color="grey", linestyle=":", label=f"{OTHER[modality]}-only model")
        ax.set(title=f"{modality} absent", xlabel=f"fraction of samples without the {modality}", xticks=RATES)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left")
    axes[0].set_ylabel("validation accuracy")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="trainer.seed of each repeat")
    parser.add_argument("--full", action="store_true", help="the example's own budget (hunter_small), not BUDGET")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--plot", type=Path, help="write the curves to this PNG")
    parser.add_argument("--save", type=Path, help="write every run's figures to this JSON file")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a child: train and evaluate one model
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run (after --)")
    args = parser.parse_args(argv)
    if args.one is not None:
        train_and_evaluate(args.overrides, args.one)
        return
    budget = [] if args.full else list(BUDGET)
    results: dict[str, list[dict]] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        # One data cache for all runs: the dataset is generated once and every run reads the same files.
        env = {**os.environ, "SSS_CACHE": os.environ.get("SSS_CACHE", str(Path(tmp) / "cache"))}
        for seed in args.seeds:
            for name in args.models:
                overrides = [*TASK, *budget, f"trainer.seed={seed}", *MODELS[name], *args.overrides]
                result = run(name, overrides, Path(tmp) / f"{name}_{seed}", env)
                results.setdefault(name, []).append(result)
                shown = result.get("accuracy") or {m: result[m]["1.0"] for m in ("image", "audio")}
                print(f"done {name} seed {seed}: {shown} ({result['seconds']:.0f} s)", flush=True)
    if args.save is not None:
        args.save.write_text(json.dumps(results, indent=2))
    minutes = (time.perf_counter() - start) / 60
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    setup = " ".join([*TASK, *budget, *args.overrides])
    header = f"examples/industrial.yaml with {setup}; seeds {args.seeds}; {minutes:.1f} min; load {load:.2f} at the end"
    if set(results) == set(MODELS):
        print("\n".join(report(results, header)))
        if args.plot is not None:
            model = "hunter_small, the example's budget" if args.full else "hunter_tiny, 630 steps"
            plot(results, args.plot, f"redundant task, {model}: mean over seeds {args.seeds}")
            print(f"curves: {args.plot}")
    else:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
