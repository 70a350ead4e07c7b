"""Peak activation memory and step time of one training step, with and without gradient checkpointing.

    python benchmarks/memory.py                       # hunter_small, batch 32, 1 s audio, 64 x 64 images
    python benchmarks/memory.py --model hunter_tiny --batch-size 8 --steps 5

How memory is measured (CPU has no allocator statistics to read): a ``TorchDispatchMode`` sees
every ATen op that runs during the forward and the backward, including checkpointing's
recomputation. For each tensor an op returns whose storage is new (not shared with one of the
op's inputs, so views and in-place results are not counted twice), it adds the storage's bytes to
a running total and registers a ``weakref.finalize`` on the storage that subtracts them when the
storage is freed. The peak of that total over forward + backward is the step's activation memory:
saved activations, recomputed ones and transient buffers. Parameters, the batch and the
optimizer state exist before the step and are not counted; the parameters' ``.grad`` tensors are
allocated by a warm-up step and kept (``zero_grad(set_to_none=False)``), so the measured
backward accumulates into them instead of counting them as new memory. Only tensors that go
through the dispatcher are seen (everything a model does in PyTorch ops; not oneDNN's internal
scratch space).

Step time: forward + backward + ``AdamW`` step, measured without the dispatch mode (it slows
every op), checkpointing off and on interleaved step by step so that load from other processes
hits both alike; the median and the best of ``--steps`` steps each, after two warm-up steps. On a
shared machine the best is the better estimate of the cost itself; the goal is judged on the median.
"""

from __future__ import annotations

import argparse
import statistics
import time
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from sss.models import create_model


class LiveBytes(TorchDispatchMode):
    """Running total and peak of the bytes of storages created while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._tracked: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            key = id(storage)
            if key in inputs or key in self._tracked:
                continue
            size = storage.nbytes()
            self._tracked.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, size)
        return out

    def _free(self, key: int, size: int) -> None:
        self._tracked.discard(key)
        self.live -= size


def make_batch(batch_size: int, image_size: int, samples: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "image": torch.randn(batch_size, 3, image_size, image_size, generator=gen),
        "audio": 0.1 * torch.randn(batch_size, 1, samples, generator=gen),
        "label": torch.randint(0, 4, (batch_size,), generator=gen),
    }


def build(
    name: str, checkpointing: bool, overrides: dict[str, Any], branches: list[str] | None = None
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = create_model(name, **overrides)
    model.set_grad_checkpointing(checkpointing, branches=branches)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    model.training_step(batch, 0).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)


def activation_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, Any]) -> int:
    step(model, optimizer, batch)  # warm-up: allocates .grad and the optimizer state outside the window
    with LiveBytes() as tracker:
        model.training_step(batch, 0).backward()
    optimizer.zero_grad(set_to_none=False)
    return tracker.peak


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="hunter_small")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=16000, help="audio samples per clip (16 kHz)")
    parser.add_argument("--steps", type=int, default=15, help="timed steps per setting")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--override", action="append", default=[], help="model override key=value (repeatable)")
    parser.add_argument("--branches", default=None, help="checkpoint only these branches, e.g. image,fusion")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = {}
    for item in args.override:
        key, value = item.split("=", 1)
        overrides[key] = int(value) if value.lstrip("-").isdigit() else value
    batch = make_batch(args.batch_size, args.image_size, args.samples)
    branches = args.branches.split(",") if args.branches else None

    memory = {}
    for ckpt in (False, True):
        model, optimizer = build(args.model, ckpt, overrides, branches)
        memory[ckpt] = activation_bytes(model, optimizer, batch)

    runs = {ckpt: build(args.model, ckpt, overrides, branches) for ckpt in (False, True)}
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.steps + 2):
        for ckpt in (False, True):
            start = time.perf_counter()
            step(*runs[ckpt], batch)
            if i >= 2:
                times[ckpt].append(time.perf_counter() - start)
    median = {ckpt: statistics.median(times[ckpt]) for ckpt in times}
    best = {ckpt: min(times[ckpt]) for ckpt in times}

    mem_saving = 1 - memory[True] / memory[False]
    slowdown = median[True] / median[False] - 1
    where = ",".join(branches) if branches else "all branches"
    title = f"{args.model}{overrides or ''}, checkpointing {where}, batch {args.batch_size}, {args.image_size} px"
    title += f", {args.samples} audio samples"
    print(f"{title}, {args.threads} threads, median of {args.steps} steps")
    print(f"{'':<28}{'no checkpointing':>18}{'checkpointing':>16}{'ratio':>9}")
    print(
        f"{'peak activation memory':<28}{memory[False] / 2**20:>15.1f} MiB{memory[True] / 2**20:>13.1f} MiB"
        f"{memory[True] / memory[False]:>9.2f}"
    )
    for label, stat in (("train step time, median", median), ("train step time, best", best)):
        print(f"{label:<28}{stat[False] * 1e3:>15.1f} ms {stat[True] * 1e3:>12.1f} ms{stat[True] / stat[False]:>9.2f}")
    slowdown_best = best[True] / best[False] - 1
    ok = mem_saving >= 0.40 and slowdown <= 0.35
    print(
        f"activation memory {-mem_saving:+.0%} (goal <= -40%), step time {slowdown:+.0%} median / "
        f"{slowdown_best:+.0%} best (goal <= +35% on the median): " + ("PASS" if ok else "FAIL")
    )
    return {
        "memory_ratio": memory[True] / memory[False],
        "time_ratio": median[True] / median[False],
        "time_ratio_best": best[True] / best[False],
    }


if __name__ == "__main__":
    main()
