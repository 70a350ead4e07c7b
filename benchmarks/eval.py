"""Evaluation cost: `SSSTrainer.validate` (per-sample losses, every task's outputs, dataset metrics)
against a bare loop (forward, batch loss, argmax, accuracy) on the same model and batches.

Both run in this one process, interleaved round by round; prints the median seconds per pass,
their ratio, and the accuracy of each (they must agree).

    python benchmarks/eval.py                                  # hunter_small, 400 samples, batch 32
    python benchmarks/eval.py --model hunter_tiny --heads      # with event and mask heads
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sss import SSSTrainer, create_model


def batches(n: int, batch_size: int, heads: bool) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for start in range(0, n, batch_size):
        b = min(batch_size, n - start)
        batch = {
            "image": torch.rand(b, 3, 64, 64, generator=g),
            "audio": torch.randn(b, 1, 16000, generator=g) * 0.1,
            "label": torch.randint(0, 4, (b,), generator=g),
        }
        if heads:
            batch["events"] = (torch.rand(b, 100, 3, generator=g) > 0.9).float()
            batch["mask"] = (torch.rand(b, 1, 64, 64, generator=g) > 0.5).float()
        out.append(batch)
    return out


def bare_pass(module: torch.nn.Module, data: list[dict[str, torch.Tensor]]) -> float:
    correct = total = 0
    with torch.no_grad():
        for batch in data:
            outputs = module(batch)
            module.compute_loss(outputs, batch)
            correct += int((outputs["logits"].argmax(-1) == batch["label"]).sum())
            total += len(batch["label"])
    return correct / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hunter_small")
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--heads", action="store_true", help="event and mask heads, with their targets")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    extra = {"num_event_classes": 3, "mask_head": True} if args.heads else {}
    module = create_model(args.model, num_classes=4, **extra).eval()
    data = batches(args.n, args.batch_size, args.heads)
    trainer = SSSTrainer(cpu=True, mixed_precision="no", log={"progress": False, "trackers": []})
    bare, full, accs = [], [], {}
    for _ in range(args.rounds):
        start = time.perf_counter()
        accs["bare"] = bare_pass(module, data)
        bare.append(time.perf_counter() - start)
        start = time.perf_counter()
        metrics = trainer.validate(module, dataloaders=data)
        full.append(time.perf_counter() - start)
        accs["sss"] = metrics["val/accuracy"]
    b, f = statistics.median(bare), statistics.median(full)
    print(f"model {args.model}{' + event/mask heads' if args.heads else ''}, {args.n} samples, batch {args.batch_size}")
    print(f"bare loop (forward, batch loss, accuracy): {b:.3f} s/pass")
    print(f"SSSTrainer.validate (all task metrics)   : {f:.3f} s/pass, ratio {f / b:.3f}")
    print(f"accuracy bare {accs['bare']:.4f}, sss {accs['sss']:.4f}; {len(metrics)} metrics")


if __name__ == "__main__":
    main()
