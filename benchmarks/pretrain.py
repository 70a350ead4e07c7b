"""Contrastive pretraining on every image-audio pair, then fine-tuning on 5/10/100 % of the labels vs scratch.

    python benchmarks/pretrain.py                          # 2 seeds, 600 steps, the shared task (~16 min on 2 cores)
    python benchmarks/pretrain.py --steps 1500 --root /tmp/pre   # where scratch converges on all labels (~22 min
                                                           # more; the data and pretraining of /tmp/pre reused)
    python benchmarks/pretrain.py --quick                  # tiny sizes, ~35 s: what the test runs
    python benchmarks/pretrain.py --seeds 0 1 2 --fractions 0.1 --scratch-lrs 1e-3 3e-3 1e-2
    python benchmarks/pretrain.py --task redundant --pretrain-steps 300 --steps 150 --root /tmp/pre
    python benchmarks/pretrain.py -- model.label_smoothing=0.0   # overrides of every fine-tune and scratch run

**Data**: ``sss data make industrial DIR --task shared`` (`--task`; generator seed 0), `Sizes.n_train`
training pairs and `Sizes.n_val` validation samples. On the shared task both modalities show the same
latent machine type (16 types) and the label (4 production lines) is a function of the type that neither
of its factors gives alone: a model must tell the types apart, which the pairing teaches without labels.

**Pretraining**, once: ``sss pretrain examples/pretrain.yaml data.root=DIR model.name=contrastive_tiny``
(hunter_tiny's encoders and projection heads, symmetric InfoNCE) on every training pair (the labels are not
read) for ``--pretrain-steps`` optimizer steps. Printed from its results.json: retrieval R@1/5/10 both ways
over the validation split next to chance (k / N_val) and the linear probe's accuracy on the frozen features.

**Fine-tuning vs scratch**: label subsets of the training split (`label_subset`: stratified by label,
seeded, nested: the 5 % rows are among the 10 % ones; files hard-linked; the full validation split), at
each ``--fractions`` and for each ``--seeds`` (``trainer.seed``: the fresh fusion and head, the data
order), ``sss fit examples/manifest.yaml data.root=SUBSET model.name=hunter_tiny`` for the same ``--steps``
optimizer steps with the example's optimizer and schedule (AdamW, cosine with warmup), validating at the end:

- ``pretrained``: with ``model.init_from=PRETRAIN_RUN`` (every encoder tensor from the pretraining; the
  fusion and head fresh) at the example's LR (``--lr``);
- ``scratch``: nothing loaded. Its LR is the best mean validation accuracy of ``--scratch-lrs`` at the
  10 % fraction (chosen on the validation split the table reports: a bias in scratch's favour), then
  used at every fraction. The example's 3e-3 has beaten 1e-3 (at 600 steps) and 1e-2 (at 300 steps).

Printed: each run's final validation accuracy, the LR sweep, then the table: fraction, labelled rows,
scratch mean ± sd, pretrained mean ± sd, gain in points; and the goal line (+10 points or more at 10 %).
Run it alone on the machine; the figures carry the load average.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The subsets are written as the fine-tuning benchmark writes its target set: manifests, files hard-linked.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from finetune import write_manifest

REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO / "examples" / "pretrain.yaml"
MANIFEST = REPO / "examples" / "manifest.yaml"
GOAL_FRACTION, GOAL_POINTS = 0.1, 10.0
"""The acceptance goal: pretrained at least this many points above scratch at this fraction of the labels."""
QUIET = [
    "trainer.log.progress=false",
    "trainer.log.plots=false",
    "trainer.log.trackers=[csv]",
    "trainer.checkpoint.every_epoch=false",
    "trainer.max_epochs=null",
    "data.num_workers=0",
]
"""Overrides of every run: no progress bar, plots or checkpoints; a step budget; the data in the main process."""


@dataclass(frozen=True)
class Sizes:
    """How big each part of the benchmark is (`FULL` or `QUICK`); ``--pretrain-steps`` and ``--steps`` override."""

    n_train: int
    n_val: int
    pretrain_steps: int
    steps: int
    pretrain_batch: int
    batch: int


FULL = Sizes(2000, 400, 1500, 600, 64, 16)
QUICK = Sizes(48, 16, 2, 2, 8, 8)


# --- the data ---------------------------------------------------------------------------------------------------


def make_data(root: Path, sizes: Sizes, task: str) -> Path:
    """``sss data make industrial`` (seed 0, no test split) at ``root/task-N``; a folder already there is reused."""
    out = root / f"{task}-{sizes.n_train}"
    if not (out / "val.csv").is_file():
        cmd = ["data", "make", "industrial", str(out), "--task", task, "--n", str(sizes.n_train)]
        sss([*cmd, "--n-val", str(sizes.n_val), "--n-test", "0", "--seed", "0"], os.environ.copy())
    return out


def subset_counts(counts: dict[str, int], fraction: float) -> dict[str, int]:
    """Rows to keep of each label: ``fraction`` of its rows, rounded half up, at least 1.

    Example:
        >>> subset_counts({"a": 500, "b": 500, "c": 7}, 0.05)
        {'a': 25, 'b': 25, 'c': 1}
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"a label fraction is in (0, 1], got {fraction}")
    return {label: max(1, int(n * fraction + 0.5)) for label, n in counts.items()}


def label_subset(source: Path, out: Path, fraction: float, seed: int = 0) -> Path:
    """A manifest folder at `out`: `fraction` of `source`'s train rows per label (`subset_counts`), all val rows.

    The rows of each label are drawn in a seeded order (`seed`, the label) and the first ones kept, so the
    subsets of one seed are nested; kept rows stay in file order. Only the image, audio and label columns are
    written; the files are hard-linked (copied across file systems) and ``classes.txt`` is kept.

    Example:
        >>> import tempfile
        >>> from sss.data.synthetic import make_industrial
        >>> tmp = Path(tempfile.mkdtemp())
        >>> data = make_industrial(tmp / "d", n_train=8, n_val=2, n_test=0)
        >>> sub = label_subset(data, tmp / "half", 0.5)
        >>> len((sub / "train.csv").read_text().splitlines()), len((sub / "val.csv").read_text().splitlines())
        (5, 3)
    """
    with (source / "train.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    by_label: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        by_label.setdefault(row["label"], []).append(index)
    keep: set[int] = set()
    for label, n in subset_counts({k: len(v) for k, v in sorted(by_label.items())}, fraction).items():
        order = list(by_label[label])
        random.Random(f"{seed}/{label}").shuffle(order)
        keep.update(order[:n])
    out.mkdir(parents=True, exist_ok=True)
    for folder in ("images", "audio"):
        (out / folder).mkdir(exist_ok=True)
    shutil.copyfile(source / "classes.txt", out / "classes.txt")
    with (source / "val.csv").open(newline="") as f:
        val = list(csv.DictReader(f))
    for split, chosen in (("train", [row for i, row in enumerate(rows) if i in keep]), ("val", val)):
        write_manifest(out / f"{split}.csv", source, chosen, [row["label"] for row in chosen])
    return out


def _rows(folder: Path, split: str) -> int:
    with (folder / f"{split}.csv").open(newline="") as f:
        return sum(1 for _ in csv.DictReader(f))


# --- the runs ---------------------------------------------------------------------------------------------------


def sss(words: list[str], env: dict[str, str]) -> str:
    """``python -m sss WORDS`` in a subprocess; its stdout (a failure raises with the end of its output)."""
    cmd = [sys.executable, "-m", "sss", *words]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"run failed ({' '.join(cmd)}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def run(command: str, config: Path, overrides: list[str], folder: Path, env: dict[str, str]) -> dict[str, Any]:
    """One ``sss fit`` / ``sss pretrain`` run into `folder` (started afresh); its results.json and wall time."""
    shutil.rmtree(folder, ignore_errors=True)
    start = time.perf_counter()
    out = sss([command, str(config), *QUIET, *overrides, f"trainer.output_dir={folder}"], env)
    wall = time.perf_counter() - start
    (folder / "stdout.txt").write_text(out)
    return {**json.loads((folder / "results.json").read_text()), "wall_s": wall}


def pretrain(data: Path, folder: Path, sizes: Sizes, env: dict[str, str]) -> dict[str, Any]:
    """``sss pretrain examples/pretrain.yaml`` with contrastive_tiny on every training pair; reused if finished."""
    if (folder / "results.json").is_file() and (folder / "model").is_dir():  # --root: an earlier pretraining
        return {**json.loads((folder / "results.json").read_text()), "wall_s": 0.0}
    overrides = [
        f"data.root={data}",
        "model.name=contrastive_tiny",
        f"trainer.max_steps={sizes.pretrain_steps}",
        f"data.batch_size={sizes.pretrain_batch}",
    ]
    return run("pretrain", PRETRAIN, overrides, folder, env)


def pretrain_report(results: dict[str, Any], n_val: int) -> list[str]:
    """Retrieval R@1/5/10 both ways next to chance (k / `n_val`) and the linear probe's accuracy.

    Example:
        >>> ways = ("audio_to_image", "image_to_audio")
        >>> results = {f"val/retrieval/{w}_r{k}": 0.5 for w in ways for k in (1, 5, 10)}
        >>> pretrain_report(results | {"val/linear_probe/accuracy": 0.9}, 100)[1]
        '  audio_to_image  R@1 0.500 (chance 0.010)  R@5 0.500 (chance 0.050)  R@10 0.500 (chance 0.100)'
    """
    lines = [f"retrieval over the {n_val} validation pairs:"]
    for way in ("audio_to_image", "image_to_audio"):
        cells = [
            f"R@{k} {results[f'val/retrieval/{way}_r{k}']:.3f} (chance {min(1.0, k / n_val):.3f})" for k in (1, 5, 10)
        ]
        lines.append(f"  {way:<15} " + "  ".join(cells))
    probe = results.get("val/linear_probe/accuracy")
    lines.append("linear probe on the frozen features: " + ("n/a" if probe is None else f"accuracy {probe:.4f}"))
    return lines


def fit_overrides(subset: Path, seed: int, sizes: Sizes, lr: float, init_from: Path | None) -> list[str]:
    """The overrides of one fine-tune (`init_from` given) or scratch run of ``examples/manifest.yaml``.

    Example:
        >>> fit_overrides(Path("/d"), 1, QUICK, 3e-3, Path("/pre"))[-1]
        'model.init_from=/pre'
    """
    overrides = [
        f"data.root={subset}",
        "model.name=hunter_tiny",
        f"trainer.seed={seed}",
        f"trainer.max_steps={sizes.steps}",
        f"data.batch_size={sizes.batch}",
        f"trainer.optim.optimizer.lr={lr}",
        "trainer.val_every_n_epochs=1000000",  # only at the end: the same single validation for every run
    ]
    return [*overrides, f"model.init_from={init_from}"] if init_from else overrides


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value).

    Example:
        >>> [round(v, 4) for v in spread([0.5, 0.7])]
        [0.6, 0.1414]
    """
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _cell(values: list[float]) -> str:
    mean, sd = spread(values)
    return f"{mean:.4f} ± {sd:.4f}"


def arm(
    subset: Path,
    init_from: Path | None,
    work: Path,
    args: argparse.Namespace,
    sizes: Sizes,
    lr: float,
    env: dict[str, str],
) -> list[dict[str, Any]]:
    """Every seed of one arm (``pretrained`` from `init_from`, else ``scratch``) at one subset and LR, printed."""
    runs = []
    name = "pretrained" if init_from else "scratch"
    for seed in args.seeds:
        folder = work / "runs" / f"{subset.name}_{name}_lr{lr:g}_seed{seed}"
        result = run(
            "fit", MANIFEST, [*fit_overrides(subset, seed, sizes, lr, init_from), *args.overrides], folder, env
        )
        finished = result["global_step"] == sizes.steps
        print(
            f"  {subset.name} {name:<10} lr {lr:g} seed {seed}: val accuracy {result['val/accuracy']:.4f}, "
            f"{result['global_step']} steps{'' if finished else ' (UNFINISHED)'} ({result['wall_s']:.0f} s)",
            flush=True,
        )
        runs.append(result)
    return runs


def compare(args: argparse.Namespace, sizes: Sizes, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """The data, the pretraining, the scratch LR sweep, then both arms at every fraction."""
    start = time.perf_counter()
    data = make_data(work / "data", sizes, args.task)
    print(f"data: task {args.task}, {sizes.n_train} train / {sizes.n_val} val ({time.perf_counter() - start:.0f} s)")
    source = work / f"pretrain-{data.name}-{sizes.pretrain_steps}"
    pre = pretrain(data, source, sizes, env)
    print(
        f"pretraining: contrastive_tiny, {pre['global_step']} steps of {sizes.pretrain_batch} pairs "
        f"({pre['wall_s']:.0f} s)"
    )
    print("\n".join(pretrain_report(pre, _rows(data, "val"))), flush=True)
    subsets = {f: label_subset(data, work / "data" / f"{data.name}-labels{f:g}", f) for f in args.fractions}
    sweep_at = GOAL_FRACTION if GOAL_FRACTION in subsets else args.fractions[0]
    sweep = {lr: arm(subsets[sweep_at], None, work, args, sizes, lr, env) for lr in args.scratch_lrs}
    best = max(sweep, key=lambda lr: spread([r["val/accuracy"] for r in sweep[lr]])[0])
    print(f"scratch LR: {best:g}, the best mean val accuracy at {sweep_at:g} of {', '.join(f'{lr:g}' for lr in sweep)}")
    rows = []
    for fraction, subset in subsets.items():
        scratch = sweep[best] if fraction == sweep_at else arm(subset, None, work, args, sizes, best, env)
        warm = arm(subset, source, work, args, sizes, args.lr, env)
        rows.append({"fraction": fraction, "rows": _rows(subset, "train"), "scratch": scratch, "pretrained": warm})
    return {"pretrain": pre, "scratch_lr": best, "sweep": sweep, "rows": rows}


def table(rows: list[dict[str, Any]], sizes: Sizes, scratch_lr: float, lr: float) -> list[str]:
    """The comparison table and the goal line.

    Example:
        >>> row = {"fraction": 0.1, "rows": 200, "scratch": [{"val/accuracy": 0.5}]}
        >>> row["pretrained"] = [{"val/accuracy": 0.75}]
        >>> print("\\n".join(table([row], QUICK, 1e-2, 3e-3)))  # doctest: +NORMALIZE_WHITESPACE
        final val accuracy after 2 steps (scratch lr 0.01, pretrained lr 0.003), mean ± sd over seeds:
          fraction  labelled rows  scratch            pretrained         gain (points)
          0.1       200            0.5000 ± 0.0000    0.7500 ± 0.0000    +25.0
        goal: pretrained +10 points or more over scratch at 0.1 of the labels: +25.0, met
    """
    lines = [
        f"final val accuracy after {sizes.steps} steps (scratch lr {scratch_lr:g}, pretrained lr {lr:g}), "
        "mean ± sd over seeds:",
        f"  {'fraction':<10}{'labelled rows':<15}{'scratch':<19}{'pretrained':<19}gain (points)",
    ]
    gains = {}
    for row in rows:
        scratch, warm = ([r["val/accuracy"] for r in row[arm]] for arm in ("scratch", "pretrained"))
        gains[row["fraction"]] = gain = 100 * (spread(warm)[0] - spread(scratch)[0])
        lines.append(f"  {row['fraction']:<10g}{row['rows']:<15}{_cell(scratch):<19}{_cell(warm):<19}{gain:+.1f}")
    if GOAL_FRACTION in gains:
        met = "met" if gains[GOAL_FRACTION] >= GOAL_POINTS else "NOT met"
        lines.append(
            f"goal: pretrained +{GOAL_POINTS:g} points or more over scratch at {GOAL_FRACTION:g} of the labels: "
            f"{gains[GOAL_FRACTION]:+.1f}, {met}"
        )
    return lines


# --- main -------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds (the test)")
    parser.add_argument("--task", default="shared", help="the generator's task (sss data make --task)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="trainer.seed of each repeat")
    parser.add_argument(
        "--fractions", nargs="+", type=float, default=None, help="label fractions (default 0.05 0.1 1; --quick 0.1 1)"
    )
    parser.add_argument("--pretrain-steps", type=int, default=None, help="pretraining steps (default: the sizes')")
    parser.add_argument("--steps", type=int, default=None, help="steps of every fit run (default: the sizes')")
    parser.add_argument("--lr", type=float, default=3e-3, help="the pretrained arm's LR (examples/manifest.yaml's)")
    parser.add_argument("--scratch-lrs", nargs="+", type=float, default=[1e-3, 3e-3], help="the scratch LR sweep")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of every run (OMP_NUM_THREADS)")
    parser.add_argument("--root", default=None, help="work here (data and pretraining reused) instead of a temp folder")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides of every fit run (after --)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    args.fractions = args.fractions or ([0.1, 1.0] if args.quick else [0.05, 0.1, 1.0])
    sizes = Sizes(
        sizes.n_train,
        sizes.n_val,
        args.pretrain_steps or sizes.pretrain_steps,
        args.steps or sizes.steps,
        sizes.pretrain_batch,
        sizes.batch,
    )
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    print(f"{args.threads} threads, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = compare(args, sizes, Path(args.root) if args.root else Path(tmp), env)
    print()
    print("\n".join(table(result["rows"], sizes, result["scratch_lr"], args.lr)))
    print(f"total {time.perf_counter() - start:.0f} s; load average {os.getloadavg()[0]:.2f}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
