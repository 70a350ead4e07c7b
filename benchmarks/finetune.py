"""Fine-tuning from weights sss trained itself vs training from scratch on a small labelled set; HF encoder load time.

    python benchmarks/finetune.py                      # 3 seeds and the AST-base load time (<= 6 min on 2 cores)
    python benchmarks/finetune.py --quick              # tiny sizes, seconds: what the test runs
    python benchmarks/finetune.py --seeds 0 --variants finetune warm scratch --task exactly_one --no-load-time
    python benchmarks/finetune.py --ft trainer.finetune.unfrozen_lr_scale=0.5   # an override of the fine-tune runs
    python benchmarks/finetune.py -- model.fusion=late                         # overrides of every target run

**Source** (the pretraining): ``sss fit examples/industrial.yaml`` with ``model.name=hunter_tiny`` on the
synthetic generator's default task (four classes: moving shadow x transient sound), generator seed 0,
`Sizes.source_train` clips; its exported ``model/model.safetensors`` is the pretrained checkpoint.

**Target** (the small labelled set): fresh clips (generator seed 1: none of them is a source clip),
`Sizes.target_train` of them for training, relabelled as a task the source never saw (`TARGETS`,
``--task``): ``count`` (default; how many of the two cues are present: ``no_cue`` = idle, ``one_cue`` =
fault or passerby, ``two_cues`` = collision; three classes, majority 50%) or ``exactly_one`` (the XOR of
the two cues, two classes). The same two factors, another rule and another head: related, not equal.

Each seed (``trainer.seed``: the fresh weights and the data order) trains the same ``hunter_tiny`` for the
same `Sizes.target_steps` optimizer steps, with the same optimizer and schedule, validating every
`Sizes.val_every` steps on `Sizes.target_val` held-out clips; ``sss fit`` in a subprocess per run:

- ``finetune``: ``model.init_from=SOURCE_RUN``: both encoders' tensors from the source run (every one of
  them, or the run refuses: `sss.run.init_from`), a fresh fusion and head; ``trainer.finetune.freeze=
  [audio_encoder, image_encoder]`` until ``unfreeze_at_step``, ``trainer.optim.layer_decay`` and
  ``head_lr_scale`` (`finetune_overrides`);
- ``warm`` (not run unless asked: ``--variants``): the same loaded weights, everything trained from step 0
  at one LR, no layer decay: what the fine-tuning controls add over a plain warm start;
- ``scratch``: ``sss.models.create_model`` with the same seed (so the same fresh fusion and head), nothing
  loaded, no controls.

Printed: the load report, both learning curves per seed, and the mean and spread over seeds of the
final validation accuracy. Then **load time**: a random transformers ``ASTModel`` of AST-base size
(``ASTConfig()``: 12 layers, width 768, ~86 M parameters) saved with ``save_pretrained``, timed through
``HunterModule(audio_encoder="hf", audio_pretrained=DIR)`` and through ``ASTModel.from_pretrained(DIR)``
alone (``--quick``: a tiny AST). Run it alone on the machine; the figures carry the load average.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "industrial.yaml"
ENCODERS = ("image_encoder", "audio_encoder")
"""The parts ``model.init_from`` loads from the source run; everything else (fusion, head) starts fresh."""
TARGETS = {
    "exactly_one": {
        "idle": "none_or_both",
        "fault": "exactly_one",
        "passerby": "exactly_one",
        "collision": "none_or_both",
    },
    "count": {"idle": "no_cue", "fault": "one_cue", "passerby": "one_cue", "collision": "two_cues"},
}
"""The target tasks, as labels of the source's classes (`sss.data.synthetic.CLASSES`: 2 x moving shadow + transient)."""
VARIANTS = ("finetune", "warm", "scratch")


@dataclass(frozen=True)
class Sizes:
    """How big each part of the benchmark is (`FULL` or `QUICK`)."""

    source_train: int
    source_val: int
    source_steps: int
    target_train: int
    target_val: int
    target_steps: int
    val_every: int
    unfreeze_at: int
    warmup: int
    ast: dict[str, int] | None  # ASTConfig arguments; None: ASTConfig() (AST-base)


FULL = Sizes(2000, 200, 250, 128, 400, 120, 20, 40, 10, None)
QUICK = Sizes(32, 16, 3, 16, 16, 4, 2, 2, 1, {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4})


def finetune_overrides(sizes: Sizes) -> list[str]:
    """The fine-tuning controls of the ``finetune`` runs (trainer.finetune, layer decay, head LR scale).

    Example:
        >>> finetune_overrides(FULL)[:2]
        ['trainer.finetune.freeze=[audio_encoder,image_encoder]', 'trainer.finetune.unfreeze_at_step=40']
    """
    return [
        "trainer.finetune.freeze=[audio_encoder,image_encoder]",
        f"trainer.finetune.unfreeze_at_step={sizes.unfreeze_at}",
        "trainer.finetune.unfrozen_lr_scale=1.0",
        "trainer.optim.layer_decay=0.75",
        "trainer.optim.head_lr_scale=1.0",
    ]


# --- the data ---------------------------------------------------------------------------------------------------


def relabel(source: Path, out: Path, task: str) -> Path:
    """A manifest folder at `out` with `source`'s train/val clips relabelled by ``TARGETS[task]`` (files hard-linked).

    Only the image, audio and label columns are kept (the target task has no mask or event targets).
    """
    out.mkdir(parents=True, exist_ok=True)
    for folder in ("images", "audio"):
        (out / folder).mkdir(exist_ok=True)
    mapping = TARGETS[task]
    (out / "classes.txt").write_text("".join(f"{name}\n" for name in dict.fromkeys(mapping.values())))
    for split in ("train", "val"):
        with (source / f"{split}.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        write_manifest(out / f"{split}.csv", source, rows, [mapping[row["label"]] for row in rows])
    return out


def write_manifest(path: Path, source: Path, rows: list[dict[str, str]], labels: list[str]) -> None:
    """A manifest at `path` of `rows`' image and audio with `labels`; their files hard-linked from `source`."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "audio", "label"])
        for row, label in zip(rows, labels, strict=True):
            for column in ("image", "audio"):
                _link(source / row[column], path.parent / row[column])
            writer.writerow([row["image"], row["audio"], label])


def _link(src: Path, dst: Path) -> None:
    if dst.exists():  # --root: linked by an earlier run
        return
    try:
        os.link(src, dst)
    except OSError:  # another file system, or no hard links: a copy
        shutil.copyfile(src, dst)


def make_data(root: Path, sizes: Sizes, task: str) -> tuple[Path, Path]:
    """Generate the source set (task default, seed 0) and the relabelled target set (seed 1) under `root`."""
    from sss.data.synthetic import make_industrial

    source = make_industrial(root / "source", n_train=sizes.source_train, n_val=sizes.source_val, n_test=0, seed=0)
    raw = make_industrial(root / "target_raw", n_train=sizes.target_train, n_val=sizes.target_val, n_test=0, seed=1)
    return source, relabel(raw, root / f"target_{task}", task)


# --- the runs ---------------------------------------------------------------------------------------------------


def target_config(folder: Path, target: Path, sizes: Sizes) -> Path:
    """The YAML of every target run (``model._target_`` and the controls come as overrides)."""
    text = f"""\
trainer:
  max_epochs: null
  max_steps: {sizes.target_steps}
  max_grad_norm: 1.0
  seed: 0
  val_every_n_epochs: 1000000   # only every val_every_n_steps steps (and at the end)
  val_every_n_steps: {sizes.val_every}
  optim:
    optimizer: {{_target_: torch.optim.AdamW, lr: 2.0e-3, weight_decay: 0.01}}
    scheduler: {{_target_: sss.trainer.cosine_with_warmup, warmup_steps: {sizes.warmup}, min_lr_ratio: 0.05}}
  checkpoint: {{every_epoch: false}}
  log: {{progress: false, plots: false, trackers: [csv]}}
model:
  _target_: sss.models.create_model
  name: hunter_tiny
data:
  _target_: sss.data.ManifestDataModule
  root: {target}
  batch_size: 32
  augment: false
  clip_seconds: 1.0
"""
    path = folder / "target.yaml"
    path.write_text(text)
    return path


def fit(config: Path, overrides: list[str], folder: Path, env: dict[str, str]) -> dict[str, Any]:
    """``python -m sss fit CONFIG OVERRIDES`` in a subprocess; its validation curve, final accuracy and wall time."""
    cmd = [sys.executable, "-m", "sss", "fit", str(config), f"trainer.output_dir={folder}", *overrides]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"run failed ({' '.join(cmd)}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    (folder / "stdout.txt").write_text(done.stdout)
    results = json.loads((folder / "results.json").read_text())
    return {
        "curve": val_curve(folder / "logs" / "metrics.csv"),
        "final": results["val/accuracy"],
        "wall_s": wall,
        "stdout": done.stdout,
    }


def val_curve(metrics_csv: Path) -> dict[int, float]:
    """``{step: val/accuracy}`` from a run's ``logs/metrics.csv`` (the last row of a step wins)."""
    with metrics_csv.open(newline="") as f:
        return {int(row["step"]): float(row["val/accuracy"]) for row in csv.DictReader(f) if row.get("val/accuracy")}


def source_run(source: Path, folder: Path, sizes: Sizes, env: dict[str, str]) -> dict[str, Any]:
    """Pretrain ``hunter_tiny`` on the source set with ``examples/industrial.yaml``'s recipe."""
    overrides = [
        "model.name=hunter_tiny",
        f"data.root={source}",
        f"data.n_train={sizes.source_train}",
        f"data.n_val={sizes.source_val}",
        "data.n_test=0",
        f"trainer.max_steps={sizes.source_steps}",
        "trainer.log.progress=false",
        "trainer.log.plots=false",
        "trainer.log.trackers=[csv]",
        "trainer.checkpoint.every_epoch=false",
    ]
    return fit(EXAMPLE, overrides, folder, env)


def variant_overrides(variant: str, source: Path, sizes: Sizes, extra: list[str]) -> list[str]:
    """The overrides that make a target run `variant` (`VARIANTS`); `extra` go to the fine-tune runs only.

    `source` is the source run's folder (``model.init_from`` reads its ``model/model.safetensors``).

    Example:
        >>> variant_overrides("scratch", Path("/runs/source"), QUICK, [])
        []
        >>> variant_overrides("warm", Path("/runs/source"), QUICK, [])
        ['model.init_from=/runs/source']
    """
    if variant == "scratch":
        return []
    warm = [f"model.init_from={source}"]
    return [*warm, *finetune_overrides(sizes), *extra] if variant == "finetune" else warm


def spread(values: list[float]) -> str:
    """Mean ± sample standard deviation.

    Example:
        >>> spread([0.5, 0.7])
        '0.6000 ± 0.1414'
    """
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4f} ± {sd:.4f}"


def compare(args: argparse.Namespace, sizes: Sizes, tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """Pretrain once, then each variant x seed on the target set; prints every curve and the summary."""
    start = time.perf_counter()
    source, target = make_data(tmp / "data", sizes, args.task)
    print(
        f"data: source {sizes.source_train} clips, target {sizes.target_train} train / {sizes.target_val} val "
        f"({time.perf_counter() - start:.0f} s)",
        flush=True,
    )
    checkpoint = tmp / "source_run" / "model" / "model.safetensors"
    if checkpoint.is_file():  # --root: a source run already there is reused
        pre = {"final": json.loads((tmp / "source_run" / "results.json").read_text())["val/accuracy"], "wall_s": 0.0}
    else:
        pre = source_run(source, tmp / "source_run", sizes, env)
    print(f"source: default task, {sizes.source_steps} steps, val accuracy {pre['final']:.4f} ({pre['wall_s']:.0f} s)")
    report = loaded_report(tmp / "source_run", len(set(TARGETS[args.task].values())))
    print(f"warm start loads {report}", flush=True)
    config = target_config(tmp, target, sizes)
    runs: dict[str, list[dict[str, Any]]] = {}
    for seed in args.seeds:
        for variant in args.variants:
            overrides = [
                f"trainer.seed={seed}",
                *args.overrides,
                *variant_overrides(variant, tmp / "source_run", sizes, args.ft),
            ]
            folder = tmp / f"{variant}_{seed}"
            shutil.rmtree(folder, ignore_errors=True)  # --root: every run starts fresh
            run = fit(config, overrides, folder, env)
            runs.setdefault(variant, []).append(run)
            if variant == "finetune" and seed == args.seeds[0]:
                print(f"seed {seed} finetune: {released(checkpoint, folder / 'model' / 'model.safetensors')}")
            curve = " ".join(f"{step}:{acc:.3f}" for step, acc in sorted(run["curve"].items()))
            print(
                f"seed {seed} {variant:<8} val accuracy by step {curve}; final {run['final']:.4f} "
                f"({run['wall_s']:.0f} s)",
                flush=True,
            )
    return {"source": pre, "load_report": report, "runs": runs}


def loaded_report(source: Path, num_classes: int) -> dict[str, int]:
    """What ``model.init_from=SOURCE`` loads into the target model (checked here once, before any run).

    Tensors and parameters (elements) loaded per encoder, and the source's tensors left out (its fusion, head).
    """
    from sss.models import create_model
    from sss.run.init_from import init_encoders_from

    model = create_model("hunter_tiny", num_classes=num_classes)
    reports = init_encoders_from(model, source)  # both encoders (hunter_tiny has both), in ENCODERS' order
    report: dict[str, int] = {}
    for name, loaded in zip(ENCODERS, reports, strict=True):
        report[name] = len(loaded.loaded)
        report[f"{name}_elements"] = sum(t.numel() for t in getattr(model, name).state_dict().values())
    report["left_out"] = len(reports[0].unused)
    return report


def released(source: Path, finished: Path) -> str:
    """How many encoder parameter tensors a fine-tune run changed from the source checkpoint: all, once released."""
    from safetensors.torch import load_file

    before, after = load_file(source), load_file(finished)
    names = [n for n in after if n.startswith(tuple(p + "." for p in ENCODERS)) and after[n].is_floating_point()]
    changed = sum(1 for n in names if not after[n].equal(before[n]))
    return f"{changed} of {len(names)} encoder tensors differ from the source checkpoint after the run"


def summary(result: dict[str, Any], variants: list[str]) -> None:
    """The final accuracy of each variant over seeds, and the mean curves side by side."""
    runs = result["runs"]
    print("\nfinal val accuracy, mean ± sd over seeds (the majority class is 0.5 of the clips):")
    for variant in variants:
        finals = [run["final"] for run in runs[variant]]
        print(f"  {variant:<8} {spread(finals)}   per seed {' / '.join(f'{v:.4f}' for v in finals)}")
    steps = sorted(set.intersection(*(set(run["curve"]) for v in variants for run in runs[v])))
    print("mean val accuracy by step:")
    print("  step     " + "".join(f"{v:>10}" for v in variants))
    for step in steps:
        means = [statistics.fmean(run["curve"][step] for run in runs[v]) for v in variants]
        print(f"  {step:<9}" + "".join(f"{m:>10.4f}" for m in means))


# --- load time --------------------------------------------------------------------------------------------------


def load_time(folder: Path, sizes: Sizes, repeats: int) -> dict[str, float]:
    """Seconds (best of `repeats`) to build sss's model around a saved AST vs ``ASTModel.from_pretrained`` alone.

    ``from_pretrained`` maps the file and reads pages on first use, so ``from_pretrained_read`` also reads
    every weight once (a sum). ``hunter`` builds ``create_model("hunter_tiny", audio_encoder="hf",
    audio_pretrained=DIR)`` (the AST, hunter_tiny's image encoder, fusion and head); ``rest`` the same model
    with its own audio CNN; ``random_init`` is ``ASTModel(config)``, the random initialisation a load that
    builds the tower before reading the file pays.
    """
    import torch
    from transformers import ASTConfig, ASTFeatureExtractor, ASTModel
    from transformers.utils import logging as hf_logging

    from sss.models import create_model

    hf_logging.disable_progress_bar()
    config = ASTConfig(**(sizes.ast or {}))
    torch.manual_seed(0)
    ASTModel(config).save_pretrained(folder)
    ASTFeatureExtractor(num_mel_bins=config.num_mel_bins, max_length=config.max_length).save_pretrained(folder)
    params = sum(p.numel() for p in ASTModel.from_pretrained(folder).parameters())

    def read(model: torch.nn.Module) -> float:
        with torch.no_grad():
            return sum(float(p.sum()) for p in model.parameters())

    timers = {
        "from_pretrained": lambda: ASTModel.from_pretrained(folder),
        "from_pretrained_read": lambda: read(ASTModel.from_pretrained(folder)),
        "hunter": lambda: create_model("hunter_tiny", num_classes=2, audio_encoder="hf", audio_pretrained=str(folder)),
        "rest": lambda: create_model("hunter_tiny", num_classes=2),
        "random_init": lambda: ASTModel(config),
    }
    best = {name: float("inf") for name in timers}
    for _ in range(repeats):  # interleaved, so a slow moment of the machine hits them all alike
        for name, build in timers.items():
            start = time.perf_counter()
            build()
            best[name] = min(best[name], time.perf_counter() - start)
    return {**best, "parameters": params}


# --- main -------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds (the test)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="trainer.seed of each repeat")
    parser.add_argument("--variants", nargs="+", default=["finetune", "scratch"], choices=VARIANTS)
    parser.add_argument("--task", choices=list(TARGETS), default="count", help="the target task")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the runs get OMP_NUM_THREADS)")
    parser.add_argument("--no-load-time", action="store_true", help="skip the AST load-time part")
    parser.add_argument("--no-compare", action="store_true", help="skip the fine-tune vs scratch part")
    parser.add_argument("--repeats", type=int, default=3, help="load-time repeats (best of)")
    parser.add_argument(
        "--root", default=None, help="work here (data and source run reused) instead of a temporary folder"
    )
    parser.add_argument(
        "--ft", action="append", default=[], metavar="KEY=VALUE", help="an override of the finetune runs only"
    )
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides of every target run (after --)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    import torch

    torch.set_num_threads(args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    malloc = {k: os.environ.get(k, "unset") for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    print(
        f"{args.threads} threads, {os.cpu_count()} cores; allocator settings: "
        + ", ".join(f"{k}={v}" for k, v in malloc.items()),
        flush=True,
    )
    result: dict[str, Any] = {"sizes": sizes}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.root) if args.root else Path(tmp)
        if not args.no_compare:
            result |= compare(args, sizes, work, env)
            summary(result, args.variants)
        if not args.no_load_time:
            result["load_time"] = times = load_time(Path(tmp) / "ast", sizes, args.repeats)
            print(
                f"\nload time of a saved AST ({times['parameters'] / 1e6:.1f} M parameters), best of {args.repeats}: "
                f"ASTModel.from_pretrained {times['from_pretrained']:.2f} s ({times['from_pretrained_read']:.2f} s "
                f"reading every weight once); sss build (hunter_tiny, audio_encoder=hf, audio_pretrained) "
                f"{times['hunter']:.2f} s, of which the rest of the model {times['rest']:.2f} s; a random "
                f"ASTModel(config) alone {times['random_init']:.2f} s"
            )
    print(f"total {time.perf_counter() - start:.0f} s; load average {os.getloadavg()[0]:.2f}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
