"""trainer.compile on the CPU: step time and first-step (compile) time, none vs regional vs full, side by side.

The model is a small transformer HunterModule: hunter_tiny with ``model.audio_encoder=ast`` (``--blocks``
AST blocks of ``--width``) and two cross-attention fusion layers, trained on random in-memory clips of
64x64 px and 1 s of 16 kHz audio. Each mode runs in a fresh process with an empty inductor cache, so
the first step pays the whole compilation, as a new run does; the step time is the median of the
steps after ``--warm``. The load average is printed beside the figures (the machine's other work
slows every mode alike, but not evenly: run it alone for figures to keep).

    python benchmarks/compile.py                    # ~2 min on 2 cores
    python benchmarks/compile.py --blocks 2 --steps 20 --json out.json
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

MODES = ("none", "regional", "full")


def one(mode: str, blocks: int, width: int, steps: int, warm: int, batch_size: int) -> dict:
    """Train `steps` steps with ``trainer.compile`` = `mode` in this process; the per-step host times."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from sss import Callback, SSSTrainer
    from sss.models import create_model

    class Clock(Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._start = 0.0

        def on_batch_start(self, trainer, module) -> None:
            self._start = time.perf_counter()

        def on_after_optimizer_step(self, trainer, module) -> None:
            self.times.append(time.perf_counter() - self._start)

    torch.manual_seed(0)
    settings = {"audio_encoder": "ast", "audio_depth": blocks, "audio_width": width, "fusion_depth": 2}
    model = create_model("hunter_tiny", num_classes=4, **settings)
    g = torch.Generator().manual_seed(0)
    n = (steps + warm) * batch_size
    data = TensorDataset(torch.randn(n, 3, 64, 64, generator=g), torch.randn(n, 1, 16000, generator=g) * 0.1)
    labels = torch.randint(0, 4, (n,), generator=g)
    loader = DataLoader(range(n), batch_size=batch_size, collate_fn=lambda i: _batch(data, labels, i))
    clock = Clock()
    trainer = SSSTrainer(
        max_steps=steps + warm,
        seed=0,
        mixed_precision="no",
        compile=False if mode == "none" else mode,
        callbacks=[clock],
        output_dir=tempfile.mkdtemp(prefix="sss-compile-"),
        log={"progress": False, "trackers": [], "summary": False},
        checkpoint={"every_epoch": False},
    )
    trainer.fit(model, train_dataloaders=loader)
    from torch._dynamo.utils import counters

    median = statistics.median(clock.times[warm:])
    return {
        "mode": mode,
        "first_step_s": clock.times[0],
        "compile_s": clock.times[0] - median,
        "step_ms": median * 1e3,
        "graphs": int(counters["stats"]["unique_graphs"]),
        "params": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
    }


def _batch(data, labels, index: list[int]) -> dict:
    image, audio = data[index]
    return {"image": image, "audio": audio, "label": labels[index]}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_all(args: argparse.Namespace) -> list[dict]:
    rows = []
    for mode in MODES:
        with tempfile.TemporaryDirectory(prefix="sss-inductor-") as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}  # cold: the whole compilation, as a new run
            command = [sys.executable, __file__, "--one", mode, *_pass_on(args)]
            load = _load()
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            rows.append({"mode": mode, "error": done.stderr.strip().splitlines()[-1:], "load": load})
            continue
        rows.append({**json.loads(done.stdout.strip().splitlines()[-1]), "load": load})
    return rows


def _pass_on(args: argparse.Namespace) -> list[str]:
    names = ("blocks", "width", "steps", "warm", "batch_size")
    return [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in names]


def report(rows: list[dict], args: argparse.Namespace) -> str:
    base = next((r for r in rows if r["mode"] == "none" and "error" not in r), None)
    lines = [
        f"hunter_tiny + AST ({args.blocks} blocks x {args.width}), batch {args.batch_size}, "
        f"{args.steps} timed steps after {args.warm}; load average (1/5/15 min) before each mode",
        "| trainer.compile | step ms | vs none | first step s | compile s | graphs | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['mode']} | failed: {r['error']} | | | | | {r['load']} |")
            continue
        ratio = f"{r['step_ms'] / base['step_ms']:.2f}x" if base else "n/a"
        lines.append(
            f"| {r['mode']} | {r['step_ms']:.1f} | {ratio} | {r['first_step_s']:.1f} | {r['compile_s']:.1f} "
            f"| {r['graphs']} | {r['load']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warm", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a child process: one mode, JSON out
    args = parser.parse_args(argv)
    if args.one:
        row = one(args.one, args.blocks, args.width, args.steps, args.warm, args.batch_size)
        print(json.dumps(row), flush=True)
        return [row]
    rows = run_all(args)
    print(report(rows, args), flush=True)
    print(f"load average after: {_load()}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "args": vars(args) | {"json": str(args.json)}}, indent=1))
    return rows


if __name__ == "__main__":
    main()
