"""Fusion comparison on the synthetic industrial dataset: the same run with each fusion head, over seeds and tasks.

    python benchmarks/fusion.py                                   # both tasks, 3 seeds, the small budget below
    python benchmarks/fusion.py --task binding --seeds 0 1 2
    python benchmarks/fusion.py --full --task default --seeds 42  # the full examples/industrial.yaml budget
    python benchmarks/fusion.py --fusions late bottleneck -- model.fusion_depth=2

Every run is ``examples/industrial.yaml`` with the budget overrides (`BUDGET`, unless ``--full``:
then the example's own hunter_small, 6 epochs of 2000 samples), the task (``default``: four
classes; ``binding``: ``data.task=binding``, match / mismatch, where each modality alone is at
chance), ``trainer.seed`` (model initialisation and shuffle; the data is the same for every seed)
and ``model.fusion``, plus any overrides after ``--``. Parameter counts are kept within ~10%:
late fusion has no fusion layer, so its image encoder's last stage is widened until it has at least
97% of the cross-attention model's parameters (``--no-match-params`` leaves it as it is). Each run
is a separate ``python -m sss fit`` process, so no state leaks between them; checkpoints are off.
Printed: per task and fusion, the mean and spread (sample standard deviation) over seeds of the
fused validation accuracy and the single-modality accuracies (``sss fit`` zeroes the other
modality), the parameters and the wall time.
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
FUSIONS = ("cross_attention", "bottleneck", "late")
TASKS = ("default", "binding")
BUDGET = [
    "model.name=hunter_tiny",
    "data.n_train=2000",
    "data.n_val=400",
    "data.n_test=0",
    "trainer.max_epochs=5",
]
"""The small budget (the same for every fusion, task and seed): hunter_tiny, 5 epochs of 2000 (315 steps)."""
IMAGE_STAGES = {"hunter_tiny": [8, 16, 32, 64], "hunter_small": [16, 32, 64, 128]}
"""The image encoder's stage widths of each variant (``image_kwargs.channels``; both have ``stem_width`` 8)."""


def parameters(model: str, fusion: str, num_classes: int, image_kwargs: dict | None = None) -> int:
    from sss.models import create_model

    extra = {"image_kwargs": image_kwargs} if image_kwargs else {}
    built = create_model(model, num_classes=num_classes, fusion=fusion, **extra)
    return sum(p.numel() for p in built.parameters())


def matched_late(model: str, num_classes: int) -> tuple[list[str], int]:
    """Overrides that widen late fusion's last image stage to >= 97% of the cross-attention model's parameters."""
    target = 0.97 * parameters(model, "cross_attention", num_classes)
    channels = list(IMAGE_STAGES[model])
    while True:
        kwargs = {"channels": channels, "stem_width": 8}
        count = parameters(model, "late", num_classes, kwargs)
        if count >= target:
            return [f"model.image_kwargs={json.dumps(kwargs).replace(' ', '')}"], count
        channels = [*channels[:-1], channels[-1] + 4]


def run(fusion: str, overrides: list[str], folder: Path, env: dict[str, str]) -> dict[str, float]:
    cmd = [
        sys.executable,
        "-m",
        "sss",
        "fit",
        str(EXAMPLE),
        f"model.fusion={fusion}",
        f"trainer.output_dir={folder}",
        "trainer.log.progress=false",
        "trainer.checkpoint.every_epoch=false",
        *overrides,
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{fusion} failed ({' '.join(cmd)}):\n{done.stderr[-3000:]}")
    results = json.loads((folder / "results.json").read_text())
    results["bench_seconds"] = time.perf_counter() - start
    return results


def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.4f} ± {sd:.4f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fusions", nargs="+", default=list(FUSIONS), choices=FUSIONS)
    parser.add_argument("--task", choices=[*TASKS, "both"], default="both")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="trainer.seed of each repeat")
    parser.add_argument("--full", action="store_true", help="the example's own budget (hunter_small), not BUDGET")
    parser.add_argument("--no-match-params", action="store_true", help="late fusion with the variant's own widths")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run (after --)")
    args = parser.parse_args(argv)
    budget = [] if args.full else list(BUDGET)
    model = next(
        (o.split("=", 1)[1] for o in [*budget, *args.overrides] if o.startswith("model.name=")), "hunter_small"
    )
    tasks = list(TASKS) if args.task == "both" else [args.task]
    table: dict[tuple[str, str], list[dict[str, float]]] = {}
    params: dict[tuple[str, str], int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # One data cache for all runs: each task's dataset is generated once and every run reads the same files.
        env = {**os.environ, "SSS_CACHE": os.environ.get("SSS_CACHE", str(Path(tmp) / "cache"))}
        for task in tasks:
            classes = 2 if task == "binding" else 4
            task_overrides = ["data.task=binding", "model.num_classes=2"] if task == "binding" else []
            for fusion in args.fusions:
                widen: list[str] = []
                if fusion == "late" and not args.no_match_params and model in IMAGE_STAGES:
                    widen, params[task, fusion] = matched_late(model, classes)
                elif model in IMAGE_STAGES:
                    params[task, fusion] = parameters(model, fusion, classes)
                for seed in args.seeds:
                    overrides = [*budget, *task_overrides, f"trainer.seed={seed}", *widen, *args.overrides]
                    folder = Path(tmp) / f"{task}_{fusion}_{seed}"
                    result = run(fusion, overrides, folder, env)
                    table.setdefault((task, fusion), []).append(result)
                    print(
                        f"done {task} {fusion} seed {seed}: val/accuracy {result['val/accuracy']:.4f} "
                        f"(image only {result['val/accuracy_image_only']:.4f}, audio only "
                        f"{result['val/accuracy_audio_only']:.4f}, {result['bench_seconds']:.0f} s)",
                        flush=True,
                    )
    extra = " ".join(args.overrides) or "none"
    print(f"\nexamples/industrial.yaml with {' '.join(budget) or 'its own budget'}; seeds {args.seeds}")
    print(f"(extra overrides: {extra}); mean ± standard deviation over seeds")
    head = f"{'task':<9}{'fusion':<17}{'val acc':>17}{'image only':>17}{'audio only':>17}{'params':>9}{'wall':>7}"
    print(head)
    for (task, fusion), runs in table.items():
        cells = [
            spread([r[k] for r in runs]) for k in ("val/accuracy", "val/accuracy_image_only", "val/accuracy_audio_only")
        ]
        count = params.get((task, fusion))
        shown = f"{count / 1e3:.1f}k" if count else "-"
        wall = statistics.fmean(r["bench_seconds"] for r in runs)
        print(f"{task:<9}{fusion:<17}{cells[0]:>17}{cells[1]:>17}{cells[2]:>17}{shown:>9}{wall:>6.0f}s")
    for task in tasks:
        chance = 0.5 if task == "binding" else 0.25
        best = max(
            (f for t, f in table if t == task),
            key=lambda f: statistics.fmean(r["val/accuracy"] for r in table[task, f]),
        )
        runs = table[task, best]
        worst_ablation = max(
            abs(r[k] - 0.5) for r in runs for k in ("val/accuracy_image_only", "val/accuracy_audio_only")
        )
        print(
            f"{task}: best fusion {best} ({spread([r['val/accuracy'] for r in runs])}; chance {chance}); its "
            f"single-modality accuracies are at most {worst_ablation:.4f} from 0.5"
        )


if __name__ == "__main__":
    main()
