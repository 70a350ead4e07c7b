"""Framework overhead: the same model, data and optimizer through `SSSTrainer` and a plain PyTorch loop.

Both run in this one process, interleaved round by round (plain, sss, plain, sss, ...), from the
same initial weights on the same batches. Prints the median per-step time of each, their ratio,
and the largest parameter difference after the last round (0 means bit-equal). Two more loops
run in the same rounds: the hand-written Accelerate loop, and the floor (Accelerate's prepared
loader and model with the inner optimizer called directly).

    python benchmarks/overhead.py                      # tiny MLP
    python benchmarks/overhead.py --model hunter_small # the default Hunter model (batch 32)
    python benchmarks/overhead.py --split              # also the per-step µs of each phase, both loops

glibc's malloc thresholds change page-fault counts between otherwise equal loops
(measured here: 3x); fix them for comparable figures, as benchmarks/RESULTS.md does:

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296 python benchmarks/overhead.py

The SSSTrainer runs with the progress bar, loggers and checkpoints off, no clipping, and times
itself from FIT_START to FIT_END (set-up excluded, as for the plain loop).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from sss import Callback, LitModule, SSSTrainer

SEED = 42


class MLP(LitModule):
    """The tiny MLP of the reference figures: 32 -> 64 -> 64 -> 4."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, batch: dict) -> torch.Tensor:
        return self.net(batch["x"])

    def compute_loss(self, outputs: torch.Tensor, batch: dict) -> torch.Tensor:
        return F.cross_entropy(outputs, batch["label"])


class Tensors(Dataset):
    def __init__(self, n: int, make: dict) -> None:
        g = torch.Generator().manual_seed(0)
        self.items = {k: f(n, g) for k, f in make.items()}

    def __len__(self) -> int:
        return len(next(iter(self.items.values())))

    def __getitem__(self, i: int) -> dict:
        return {k: v[i] for k, v in self.items.items()}


def build(model: str, steps: int) -> tuple[LitModule, Dataset, int]:
    if model == "mlp":
        make = {
            "x": lambda n, g: torch.randn(n, 32, generator=g),
            "label": lambda n, g: torch.randint(0, 4, (n,), generator=g),
        }
        return MLP(), Tensors(steps * 64, make), 64
    from sss.models import create_model

    make = {
        "image": lambda n, g: torch.randn(n, 3, 64, 64, generator=g),
        "audio": lambda n, g: torch.randn(n, 1, 16000, generator=g) * 0.1,
        "label": lambda n, g: torch.randint(0, 4, (n,), generator=g),
    }
    return create_model(model, num_classes=4), Tensors(steps * 32, make), 32


def optimizer_for(module: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(module.parameters(), lr=1e-3, weight_decay=0.0)


def run_plain(module: LitModule, loader: DataLoader) -> float:
    from accelerate.utils import set_seed

    set_seed(SEED)  # what SSSTrainer.fit does first: same dropout/SpecAugment draws in both loops
    optimizer = optimizer_for(module)
    module.train()
    start = time.perf_counter()
    for batch in loader:
        loss = module.compute_loss(module(batch), batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def run_accelerate(module: LitModule, loader: DataLoader) -> float:
    """The hand-written Accelerate loop users write today (the 3-change port of the plain loop)."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(SEED)
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(module, optimizer_for(module), loader)
    model.train()
    start = time.perf_counter()
    for batch in loader:
        loss = module.compute_loss(model(batch), batch)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def run_floor(module: LitModule, loader: DataLoader) -> float:
    """The floor under any loop on Accelerate: its prepared loader and model, the inner optimizer called directly.

    No ``accelerator.backward``, no ``AcceleratedOptimizer`` wrapper, no accumulation context, no events:
    what is left between this and plain PyTorch is the prepared loader's and model's own cost.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(SEED)
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(module, optimizer_for(module), loader)
    model.train()
    inner = optimizer.optimizer
    start = time.perf_counter()
    for batch in loader:
        module.compute_loss(model(batch), batch).backward()
        inner.step()
        inner.zero_grad(set_to_none=True)
    return time.perf_counter() - start


class Clock(Callback):
    def on_fit_start(self, trainer, module) -> None:
        self.start = time.perf_counter()

    def on_fit_end(self, trainer, module) -> None:
        self.seconds = time.perf_counter() - self.start


def run_sss(module: LitModule, loader: DataLoader, trainer_kwargs: dict) -> float:
    module.configure_optimizers = lambda: optimizer_for(module)  # the same optimizer as the plain loop
    clock = Clock()
    trainer = SSSTrainer(callbacks=[clock], **trainer_kwargs)
    trainer.fit(module, train_dataloaders=loader)
    return clock.seconds


class Timer:
    """Seconds spent in wrapped calls, by phase: the split of ``--split`` (no callback: events are a phase)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, phase: str, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

        return timed

    def batches(self, phase: str, iterable):
        iterator = iter(iterable)
        while True:
            start = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
            yield item


def split_plain(module: LitModule, loader: DataLoader) -> dict[str, float]:
    """The plain loop's seconds per phase: data fetch, forward+backward, optimizer step (with zero_grad)."""
    from accelerate.utils import set_seed

    set_seed(SEED)
    optimizer, timer = optimizer_for(module), Timer()
    module.train()
    start = time.perf_counter()
    for batch in timer.batches("data fetch", loader):
        t0 = time.perf_counter()
        module.compute_loss(module(batch), batch).backward()
        t1 = time.perf_counter()
        optimizer.step()
        t2 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        for phase, seconds in (("forward+backward", t1 - t0), ("optimizer step", t2 - t1), ("zero_grad", t3 - t2)):
            timer.seconds[phase] = timer.seconds.get(phase, 0.0) + seconds
    timer.seconds["total"] = time.perf_counter() - start
    return timer.seconds


def split_sss(module: LitModule, loader: DataLoader, trainer_kwargs: dict) -> dict[str, float]:
    """`SSSTrainer`'s seconds per phase, timed by wrapping its methods on the instance (no callback).

    data fetch: the prepared loader (device placement, look-ahead) and the DataLoader; forward+backward:
    ``training_step`` through the prepared model and ``accelerator.backward``; optimizer step: the
    torch optimizer's own ``step``; Accelerate wrappers: what the loop's ``compat.optimizer_step`` adds around it;
    callbacks/events: ``_fire``; the rest of the loop (``accumulate``, ``unscale_gradients``,
    ``zero_grad``, counters) is the total minus those.
    """
    module.configure_optimizers = lambda: optimizer_for(module)
    trainer, timer = SSSTrainer(**trainer_kwargs), Timer()
    epoch_batches, setup = trainer._epoch_batches, trainer._setup_fit
    trainer._epoch_batches = lambda loader, start: timer.batches("data fetch", epoch_batches(loader, start))
    trainer._forward_backward = timer.wrap("forward+backward", trainer._forward_backward)
    trainer._fire = timer.wrap("callbacks/events", trainer._fire)
    trainer._train_epoch = timer.wrap("total", trainer._train_epoch)

    def setup_fit(*args):
        loaders = setup(*args)
        inner = trainer.optimizer.optimizer
        inner.step = timer.wrap("optimizer step", inner.step)
        return loaders

    trainer._setup_fit = setup_fit
    import sss.trainer._accelerate_compat as compat
    import sss.trainer.trainer as loop

    zero_grad, check_gradients, step = compat.zero_grad, loop.check_gradients, compat.optimizer_step
    compat.zero_grad = timer.wrap("zero_grad", zero_grad)
    compat.optimizer_step = timer.wrap("optimizer + Accelerate wrapper", step)  # the loop's call of the step
    loop.check_gradients = timer.wrap("first-step checks", check_gradients)  # the loop's module-level name
    try:
        trainer.fit(module, train_dataloaders=loader)
    finally:
        compat.zero_grad, loop.check_gradients, compat.optimizer_step = zero_grad, check_gradients, step
    seconds = dict(timer.seconds)
    seconds["Accelerate optimizer wrapper"] = seconds.pop("optimizer + Accelerate wrapper") - seconds["optimizer step"]
    return seconds


def print_split(plain: list[dict[str, float]], ours: list[dict[str, float]], steps: int) -> None:
    """The median µs per step of each phase, both loops side by side."""
    phases = [
        "data fetch",
        "forward+backward",
        "optimizer step",
        "Accelerate optimizer wrapper",
        "zero_grad",
        "callbacks/events",
        "first-step checks",
    ]
    print(f"\nper-step split (µs, median over {len(plain)} rounds; wrapping adds ~0.2 µs per timed call)")
    print(f"{'phase':<42} {'plain':>9} {'SSSTrainer':>11}")

    def median(rows, phase):
        return statistics.median(row.get(phase, 0.0) for row in rows) / steps * 1e6

    for phase in phases:
        print(f"{phase:<42} {median(plain, phase):>9.1f} {median(ours, phase):>11.1f}")
    rest = [row["total"] - sum(row.get(p, 0.0) for p in phases) for row in ours]
    plain_rest = [row["total"] - sum(row.get(p, 0.0) for p in phases) for row in plain]
    label, per_step = "rest (accumulate, unscale, counters)", 1e6 / steps
    print(f"{label:<42} {statistics.median(plain_rest) * per_step:>9.1f} {statistics.median(rest) * per_step:>11.1f}")
    print(f"{'total':<42} {median(plain, 'total'):>9.1f} {median(ours, 'total'):>11.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp", help="mlp, or a registered model name such as hunter_small")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--split", action="store_true", help="also time each phase of a step, in extra rounds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    initial, dataset, batch_size = build(args.model, args.steps)
    trainer_kwargs = dict(
        max_epochs=1,
        seed=SEED,
        cpu=True,
        mixed_precision="no",
        max_grad_norm=None,
        output_dir="runs/benchmark-overhead",
        log={"progress": False, "trackers": []},
        checkpoint={"every_epoch": False},
    )
    plain_times, accelerate_times, sss_times, floor_times = [], [], [], []
    for _ in range(args.rounds):
        plain = copy.deepcopy(initial)
        plain_times.append(run_plain(plain, DataLoader(dataset, batch_size=batch_size)) / args.steps)
        hand = copy.deepcopy(initial)
        accelerate_times.append(run_accelerate(hand, DataLoader(dataset, batch_size=batch_size)) / args.steps)
        ours = copy.deepcopy(initial)
        sss_times.append(run_sss(ours, DataLoader(dataset, batch_size=batch_size), trainer_kwargs) / args.steps)
        floor = copy.deepcopy(initial)  # last in the round: the three loops above keep their order of earlier rows
        floor_times.append(run_floor(floor, DataLoader(dataset, batch_size=batch_size)) / args.steps)
    diff = max((a - b).abs().max().item() for a, b in zip(plain.parameters(), ours.parameters(), strict=True))
    p, s = statistics.median(plain_times) * 1e3, statistics.median(sss_times) * 1e3
    a = statistics.median(accelerate_times) * 1e3
    print(f"model {args.model}, batch {batch_size}, {args.steps} steps x {args.rounds} rounds, {args.threads} threads")
    malloc = {k: os.environ.get(k, "unset") for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    print("allocator settings:", ", ".join(f"{k}={v}" for k, v in malloc.items()))
    print(f"plain PyTorch loop          : {p:.3f} ms/step (median)")
    print(f"hand-written Accelerate loop: {a:.3f} ms/step (median), ratio {a / p:.3f}")
    f = statistics.median(floor_times) * 1e3
    print(f"prepared loader+model floor : {f:.3f} ms/step (median), ratio {f / p:.3f}")
    print(f"SSSTrainer                  : {s:.3f} ms/step (median)")
    print(f"SSSTrainer overhead         : {s - p:+.3f} ms/step, ratio {s / p:.3f}")
    print(f"max |param diff| sss-plain  : {diff:.3g}")
    if args.split:  # separate rounds: the timing wrappers must not touch the figures above
        plain_split, sss_split = [], []
        for _ in range(args.rounds):
            plain_split.append(split_plain(copy.deepcopy(initial), DataLoader(dataset, batch_size=batch_size)))
            loader = DataLoader(dataset, batch_size=batch_size)
            sss_split.append(split_sss(copy.deepcopy(initial), loader, trainer_kwargs))
        print_split(plain_split, sss_split, args.steps)


if __name__ == "__main__":
    main()
