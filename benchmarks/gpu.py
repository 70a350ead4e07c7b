"""The one prepared device check: the GPU tests, then samples/s and peak memory of SSSTrainer vs a plain loop.

    python benchmarks/gpu.py --out gpu.json          # on one CUDA GPU: within 8 minutes
    python benchmarks/gpu.py --dry-run --out d.json  # on the CPU: hunter_tiny, 3 steps, fp32 (what the suite runs)

First ``python -m pytest tests/gpu -q`` in a subprocess (its exit code and last lines are kept),
then one row per configuration: ``hunter_small`` and ``hunter_base`` in fp32, bf16 and fp16, as is,
with gradient checkpointing, in channels-last and under ``torch.compile``. Each row trains the same
model on the same random batches through a plain PyTorch loop (autocast, a GradScaler for fp16,
pinned batches copied with ``non_blocking``) and through `SSSTrainer` (no callbacks but the timing
one), after warm-up steps, and reports samples/s, peak ``torch.cuda.max_memory_allocated`` of the
timed steps, the time ratio (SSSTrainer / plain), and for the plain configuration the host syncs
per training step: `sss.testing.count_host_syncs` and CUDA's own ``set_sync_debug_mode("warn")``
(its warnings counted). Each row is time-boxed (``--row-timeout``) and the whole run is bounded
(``--budget``): a row that fails or runs out of time is recorded with its error, and the run goes
on. Writes JSON (``--out``) and prints the markdown rows for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import signal
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import SEED, Tensors, optimizer_for  # the plain loop's dataset and optimizer

from sss import Callback, SSSTrainer

PRECISIONS = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}
VARIANTS = ("base", "checkpointing", "channels_last", "compile")  # cheapest first: the budget cuts compile rows


class RowTimeout(Exception):
    """A row ran past ``--row-timeout``."""


@contextlib.contextmanager
def time_box(seconds: float):
    """Raise `RowTimeout` in the main thread after `seconds` (SIGALRM; Python code is interrupted between ops)."""

    def expired(signum: int, frame: Any) -> None:
        raise RowTimeout(f"ran past its {seconds:.0f} s time box")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1.0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def dataset(n: int) -> Tensors:
    make = {
        "image": lambda k, g: torch.randn(k, 3, 64, 64, generator=g),
        "audio": lambda k, g: torch.randn(k, 1, 16000, generator=g) * 0.1,
        "label": lambda k, g: torch.randint(0, 4, (k,), generator=g),
    }
    return Tensors(n, make)


def build_model(name: str, variant: str) -> torch.nn.Module:
    from sss.models import create_model

    torch.manual_seed(SEED)
    module = create_model(name, num_classes=4, image_channels_last=variant == "channels_last")
    if variant == "checkpointing":
        module.set_grad_checkpointing(True)
    return module


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def reset_accelerate() -> None:
    # Accelerate keeps one process-wide state with one precision: each row starts a fresh one.
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def run_plain(name: str, precision: str, variant: str, steps: int, warm: int, batch: int, device: torch.device) -> dict:
    """The plain loop: autocast, GradScaler for fp16, pinned batches copied with non_blocking."""
    module = build_model(name, variant).to(device)
    if variant == "compile":
        module.compile()
    optimizer, dtype = optimizer_for(module), PRECISIONS[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    loader = DataLoader(dataset(batch * (steps + warm)), batch_size=batch, pin_memory=device.type == "cuda")
    module.train()
    start = 0.0
    for i, batch_ in enumerate(loader):
        if i == warm:
            sync(device)
            reset_peak(device)
            start = time.perf_counter()
        batch_ = {k: v.to(device, non_blocking=True) for k, v in batch_.items()}
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = module.compute_loss(module(batch_), batch_)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    sync(device)
    seconds = time.perf_counter() - start
    return {"samples_per_s": batch * steps / seconds, "peak_mib": peak_mib(device)}


class Window(Callback):
    """Times steps [warm, warm + steps) and counts host syncs over the `probe` steps after them."""

    def __init__(self, warm: int, steps: int, probe: int, device: torch.device) -> None:
        self.warm, self.steps, self.probe, self.device = warm, steps, probe, device
        self.seconds = 0.0
        self.syncs: list[int] = []
        self.cuda_warnings: list[int] = []
        self._probe: Any = None

    def on_batch_start(self, trainer, module) -> None:
        i = trainer.state.batch_idx
        if i == self.warm:
            sync(self.device)
            reset_peak(self.device)
            self.start = time.perf_counter()
        if i == self.warm + self.steps:
            sync(self.device)
            self.seconds = time.perf_counter() - self.start
            self.peak = peak_mib(self.device)
        if self.warm + self.steps <= i < self.warm + self.steps + self.probe:
            self._enter()

    def on_batch_end(self, trainer, module) -> None:
        if self._probe is not None:
            self._exit()

    def _enter(self) -> None:
        from sss.testing import count_host_syncs

        stack = contextlib.ExitStack()
        counted = stack.enter_context(count_host_syncs(self.device))
        caught = None
        if self.device.type == "cuda":
            caught = stack.enter_context(warnings.catch_warnings(record=True))
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            stack.callback(torch.cuda.set_sync_debug_mode, "default")
        self._probe = (stack, counted, caught)

    def _exit(self) -> None:
        stack, counted, caught = self._probe
        sync(self.device)
        stack.close()
        self.syncs.append(len(counted))
        if caught is not None:
            self.cuda_warnings.append(sum("synchroniz" in str(w.message) for w in caught))
        self._probe = None


def run_sss(
    name: str, precision: str, variant: str, steps: int, warm: int, batch: int, device: torch.device, probe: int
) -> dict:
    reset_accelerate()
    module = build_model(name, variant)
    window = Window(warm, steps, probe, device)
    trainer = SSSTrainer(
        callbacks=[window],
        max_steps=warm + steps + probe + 1,
        seed=SEED,
        cpu=device.type == "cpu",
        mixed_precision=precision,
        compile=variant == "compile",
        max_grad_norm=None,
        output_dir="runs/benchmark-gpu",
        optim={"optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3, "weight_decay": 0.0}},
        log={"progress": False, "trackers": []},
        checkpoint={"every_epoch": False},
        sanity_val_batches=0,
    )
    loader = DataLoader(dataset(batch * (warm + steps + probe + 1)), batch_size=batch)
    trainer.fit(module, train_dataloaders=loader)
    out = {"samples_per_s": batch * steps / window.seconds, "peak_mib": window.peak}
    if probe:
        out["syncs_per_step"] = statistics.mean(window.syncs) if window.syncs else None
        out["cuda_sync_warnings_per_step"] = statistics.mean(window.cuda_warnings) if window.cuda_warnings else None
    return out


def run_row(config: dict, args: argparse.Namespace, device: torch.device, seconds: float) -> dict:
    row = dict(config)
    sizes = dict(steps=args.steps, warm=args.warm, batch=args.batch_size, device=device)
    probe = args.probe_steps if config["variant"] == "base" else 0
    started = time.perf_counter()
    try:
        with time_box(seconds):
            plain = run_plain(config["model"], config["precision"], config["variant"], **sizes)
            ours = run_sss(config["model"], config["precision"], config["variant"], **sizes, probe=probe)
        row.update({f"plain_{k}": v for k, v in plain.items()})
        row.update({f"sss_{k}": v for k, v in ours.items() if k in ("samples_per_s", "peak_mib")})
        row.update({k: v for k, v in ours.items() if k not in ("samples_per_s", "peak_mib")})
        row["time_ratio"] = plain["samples_per_s"] / ours["samples_per_s"]
    except Exception as exc:  # recorded in the row: one failing configuration must not end the run
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def configs(dry_run: bool, device: torch.device) -> list[dict]:
    if dry_run:  # what the CPU can do in seconds: fp32, no compile (minutes of compilation on a CPU)
        return [{"model": "hunter_tiny", "precision": "no", "variant": v} for v in VARIANTS[:3]]
    precisions = ["no", "bf16", "fp16"]
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        precisions.remove("bf16")
    return [
        {"model": m, "precision": p, "variant": v}
        for v in VARIANTS
        for m in ("hunter_small", "hunter_base")
        for p in precisions
    ]


def run_tests(timeout: float) -> dict:
    command = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-3000:]
        return {
            "command": " ".join(command[1:]),
            "rc": None,
            "error": f"timed out after {timeout:.0f} s",
            "tail": str(tail),
        }
    return {"command": " ".join(command[1:]), "rc": done.returncode, "tail": (done.stdout + done.stderr)[-3000:]}


def markdown(rows: list[dict], date: str) -> list[str]:
    def number(value: Any, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        "| date | model | precision | variant | plain samples/s | SSSTrainer samples/s | time ratio | "
        "plain peak MiB | SSSTrainer peak MiB | syncs/step (probe) | syncs/step (CUDA debug mode) | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {date} | {r['model']} | {r['precision']} | {r['variant']} | {number(r.get('plain_samples_per_s'))} | "
            f"{number(r.get('sss_samples_per_s'))} | {number(r.get('time_ratio'), 3)} | "
            f"{number(r.get('plain_peak_mib'))} | {number(r.get('sss_peak_mib'))} | "
            f"{number(r.get('syncs_per_step'), 2)} | {number(r.get('cuda_sync_warnings_per_step'), 2)} | "
            f"{r.get('error', '')} |"
        )
    return lines


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the JSON here")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (hunter_tiny, 3 steps, fp32)")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for the whole run (tests included)")
    parser.add_argument("--tests-timeout", type=float, default=180.0)
    parser.add_argument("--row-timeout", type=float, default=60.0)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per loop (default 20; 3 dry)")
    parser.add_argument("--warm", type=int, default=None, help="warm-up steps (default 5; 1 dry)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 32; 4 dry")
    parser.add_argument("--probe-steps", type=int, default=2, help="steps counted for host syncs")
    parser.add_argument("--no-tests", action="store_true", help="skip the pytest run (implied by --dry-run)")
    args = parser.parse_args(argv)
    args.steps = args.steps or (3 if args.dry_run else 20)
    args.warm = args.warm or (1 if args.dry_run else 5)
    args.batch_size = args.batch_size or (4 if args.dry_run else 32)
    deadline = time.perf_counter() + args.budget
    device = torch.device("cpu") if args.dry_run or not torch.cuda.is_available() else torch.device("cuda")
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    result: dict[str, Any] = {
        "date": date,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dry_run": args.dry_run,
        "sizes": {"steps": args.steps, "warm": args.warm, "batch_size": args.batch_size},
    }
    if args.dry_run or args.no_tests:
        result["gpu_tests"] = {"skipped": "--dry-run" if args.dry_run else "--no-tests"}
    else:
        result["gpu_tests"] = run_tests(min(args.tests_timeout, deadline - time.perf_counter()))
        print(f"gpu tests: rc {result['gpu_tests'].get('rc')}\n{result['gpu_tests']['tail'][-1500:]}", flush=True)
    rows = []
    for config in configs(args.dry_run, device):
        left = deadline - time.perf_counter()
        if left < 5:
            rows.append({**config, "error": "not run: the run's --budget was spent"})
            continue
        rows.append(run_row(config, args, device, min(args.row_timeout, left)))
        print(json.dumps(rows[-1]), flush=True)
    result["rows"] = rows
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    print("\n".join(markdown(rows, date)))
    return result


if __name__ == "__main__":
    main()
