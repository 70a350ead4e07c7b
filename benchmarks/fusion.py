"""Fusion comparison on the synthetic industrial dataset: the same run with each fusion head.

    python benchmarks/fusion.py                                  # cross_attention, bottleneck, late; ~5 min
    python benchmarks/fusion.py --fusions late bottleneck -- model.fusion_depth=2

Each fusion trains with exactly the budget of ``examples/industrial.yaml`` (hunter_small, 6 epochs
of 2000 samples, batch 32, AdamW 2e-3 with warm-up and cosine decay, seed 42, the same generated
data): only ``model.fusion`` changes (plus any overrides after ``--``, applied to every run). Each
run is a separate ``python -m sss fit`` process, so no state leaks between them; checkpoints are
off because only the final metrics matter. Printed: fused validation accuracy and macro-F1, the
single-modality accuracies (``sss fit`` zeroes the other modality), parameters and wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE = Path(__file__).parents[1] / "examples" / "industrial.yaml"
FUSIONS = ("cross_attention", "bottleneck", "late")


def run(fusion: str, overrides: list[str], out: Path, env: dict[str, str]) -> dict[str, float]:
    folder = out / fusion
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
        raise RuntimeError(f"{fusion} failed:\n{done.stderr[-3000:]}")
    results = json.loads((folder / "results.json").read_text())
    results["bench_seconds"] = time.perf_counter() - start
    header = (folder / "model" / "README.md").read_text().split("(", 2)[1]
    results["params_m"] = float(header.split(",")[1].split("M")[0])
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fusions", nargs="+", default=list(FUSIONS), choices=FUSIONS)
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run (after --)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        # One data cache for all runs: the dataset is generated once and every run reads the same files.
        env = {**os.environ, "SSS_CACHE": os.environ.get("SSS_CACHE", str(Path(tmp) / "cache"))}
        rows = {}
        for fusion in args.fusions:
            rows[fusion] = run(fusion, args.overrides, Path(tmp), env)
            print(f"done {fusion}: val/accuracy {rows[fusion]['val/accuracy']:.4f}", flush=True)
    extra = " ".join(args.overrides) or "none"
    print(f"\nexamples/industrial.yaml, only model.fusion changed (extra overrides: {extra})")
    print(f"{'fusion':<17}{'val acc':>9}{'macro F1':>10}{'image only':>12}{'audio only':>12}{'params':>9}{'wall':>8}")
    for fusion, r in rows.items():
        print(
            f"{fusion:<17}{r['val/accuracy']:>9.4f}{r['val/macro_f1']:>10.4f}{r['val/accuracy_image_only']:>12.4f}"
            f"{r['val/accuracy_audio_only']:>12.4f}{r['params_m']:>8.2f}M{r['bench_seconds']:>7.0f}s"
        )
    if "late" in rows:
        late = rows["late"]["val/accuracy"]
        for fusion in (f for f in rows if f != "late"):
            verdict = "matches or beats" if rows[fusion]["val/accuracy"] >= late else "is below"
            print(f"{fusion} {verdict} late fusion ({rows[fusion]['val/accuracy']:.4f} vs {late:.4f})")


if __name__ == "__main__":
    main()
