"""A training run that tests/trainer/test_resume.py interrupts (kill -9, SIGTERM) and resumes.

    python resume_run.py OUT [--resume] [--accum A] [--every N] [--fp16-poison K] [--pause-at E:B]
                             [--big] [--steps S] [--forget-position] [--die-in-rotation SEED]

Trains a small two-modality module with dropout (so the RNG state matters) for S optimizer steps
on shuffled data, checkpointing into OUT/checkpoints. Every micro-batch appends
``epoch batch_idx global_step loss.hex()`` to OUT/losses.txt (flushed, so a killed run keeps its
lines). At the end the main process writes OUT/final.pt: parameters, optimizer and scaler state.

--pause-at E:B   after micro-batch B of epoch E (BATCH_END) write OUT/paused and wait there, so
                 the parent can kill -9 or SIGTERM the run at exactly that point (a fresh run only).
--fp16-poison K  fp16 with a real CPU GradScaler; the gradients of epoch 0's micro-batch K are made
                 inf, so that window's optimizer step is skipped.
--big            a wider model, so that saving a checkpoint takes a while (kill during save).
--forget-position  negative control: resume from the start of the checkpoint's epoch.
--no-epoch-save  checkpoints by steps only (a save after an epoch's last batch resumes "mid-epoch").
--die-in-rotation SEED  kill -9 itself while rotation deletes a checkpoint (its 1st to 3rd deletion, after a
                 random part of the files, chosen by SEED): a preemption in the middle of ``shutil.rmtree``.

--resume does what ``sss fit --resume`` does: clean up leftovers, then take the newest checkpoint that
verifies, printing why each newer one does not; it appends the one it took to OUT/resumed_from.txt.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch import nn
from torch.utils.data import DataLoader

from sss import Callback, SSSTrainer
from sss.callbacks.checkpoint import Preempted
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import newest_verified, recover_leftovers
from sss.testing import BoringDataset, BoringModule


class DropoutModule(BoringModule):
    def __init__(self, width: int = 8) -> None:
        super().__init__(dim=width)
        self.image_encoder = nn.Sequential(nn.Flatten(), nn.Linear(48, width), nn.Dropout(0.3))
        self.audio_encoder = nn.Sequential(nn.Flatten(), nn.Linear(16, width), nn.GELU(), nn.Dropout(0.3))


class Recorder(Callback):
    def __init__(self, out: Path, pause_at: tuple[int, int] | None, poison: int | None) -> None:
        self.file = (out / "losses.txt").open("a")
        self.out, self.pause_at, self.poison = out, pause_at, poison

    def on_fit_start(self, trainer, module):
        if self.poison is not None:
            weight = module.fusion_head.head.weight
            state = trainer.state
            weight.register_hook(lambda g: g * math.inf if (state.epoch, state.batch_idx) == (0, self.poison) else g)

    def on_batch_end(self, trainer, module):
        s = trainer.state
        if trainer.accelerator.is_main_process:
            self.file.write(f"{s.epoch} {s.batch_idx} {s.global_step} {float(s.loss).hex()}\n")
            self.file.flush()
        if self.pause_at == (s.epoch, s.batch_idx):
            if trainer.accelerator.is_main_process:
                (self.out / "paused").write_text(f"{s.epoch} {s.batch_idx} {s.global_step}")
            ckpt = next(c for c in trainer.callbacks if type(c).__name__ == "ModelCheckpoint")
            deadline = time.monotonic() + 60
            while ckpt._signal is None and time.monotonic() < deadline:  # killed here, or signalled
                time.sleep(0.01)


def die_in_rotation(seed: int) -> None:
    """Make the n-th deletion by rotation stop dead inside ``shutil.rmtree``, after part of the files."""
    import sss.callbacks.checkpoint as rotation

    rng, real_rmtree, real_remove = random.Random(seed), shutil.rmtree, rotation.remove_checkpoint
    countdown, rotating = [rng.randint(1, 3)], [False]

    def rmtree(path, *args, **kwargs):
        if rotating[0]:
            countdown[0] -= 1
            if not countdown[0]:
                files = sorted(p for p in Path(path).rglob("*") if p.is_file())
                for file in rng.sample(files, rng.randint(0, len(files))):  # the kernel's order is arbitrary
                    file.unlink()
                os.kill(os.getpid(), signal.SIGKILL)
        return real_rmtree(path, *args, **kwargs)

    def remove_checkpoint(checkpoint):
        rotating[0] = True
        try:
            real_remove(checkpoint)
        finally:
            rotating[0] = False

    shutil.rmtree, rotation.remove_checkpoint = rmtree, remove_checkpoint


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--every", type=int, default=None)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--fp16-poison", type=int, default=None)
    p.add_argument("--pause-at", default=None)
    p.add_argument("--big", action="store_true")
    p.add_argument("--forget-position", action="store_true")
    p.add_argument("--no-epoch-save", action="store_true")
    p.add_argument("--die-in-rotation", type=int, default=None)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.die_in_rotation is not None:
        die_in_rotation(args.die_in_rotation)

    torch.manual_seed(0)
    module = DropoutModule(width=512 if args.big else 8)
    accelerator = None
    if args.fp16_poison is not None:
        # Accelerate leaves fp16 off on a CPU; switch on its machinery with a real CPU GradScaler.
        accelerator = Accelerator(
            cpu=True,
            mixed_precision="fp16",
            gradient_accumulation_steps=args.accum,
            dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=42),
        )
        accelerator.native_amp = True
        accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3)
    pause = tuple(int(x) for x in args.pause_at.split(":")) if args.pause_at else None
    trainer = add_stock_callbacks(
        SSSTrainer(
            accelerator=accelerator,
            callbacks=[Recorder(out, pause, args.fp16_poison)],
            max_steps=args.steps,
            cpu=True,
            mixed_precision="no" if accelerator is None else "fp16",
            gradient_accumulation_steps=args.accum,
            output_dir=str(out),
            optim={
                "optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.01, "weight_decay": 0.01},
                "scheduler": {"_target_": "sss.trainer.cosine_with_warmup", "warmup_steps": 3},
            },
            log={"progress": False, "trackers": []},
            checkpoint={"every_n_steps": args.every, "every_epoch": not args.no_epoch_save, "keep_last": 2},
        )
    )
    ckpt = None
    if args.resume:
        if trainer.accelerator.is_main_process:
            for line in recover_leftovers(out / "checkpoints"):
                print(f"sss: checkpoints: {line}", flush=True)
        trainer.accelerator.wait_for_everyone()
        ckpt, damaged = newest_verified(out / "checkpoints")
        for why in damaged:
            print(f"sss: warning: --resume: skipping a damaged checkpoint: {why}", flush=True)
        assert ckpt is not None, f"no checkpoint in {out / 'checkpoints'} verifies"
        if trainer.accelerator.is_main_process:
            with (out / "resumed_from.txt").open("a") as f:
                f.write(f"{ckpt.name} {len(damaged)}\n")
        if args.forget_position:
            meta = json.loads((ckpt / "trainer_state.json").read_text())
            meta["resume_batch"] = 0
            (ckpt / "trainer_state.json").write_text(json.dumps(meta))
    # 40 samples, per-process batch 4 over all processes -> 10 micro-batches per epoch on one process
    loader = DataLoader(BoringDataset(40), batch_size=4 // trainer.accelerator.num_processes, shuffle=True)
    try:
        trainer.fit(module, train_dataloaders=loader, ckpt_path=ckpt)
    except Preempted as stop:
        print(f"sss: {stop}", file=sys.stderr, flush=True)
        return 128 + stop.signum
    if trainer.accelerator.is_main_process:
        scaler = trainer.accelerator.scaler
        torch.save(
            {
                "params": [p.detach().clone() for p in module.parameters()],
                "optimizer": trainer.optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "global_step": trainer.state.global_step,
                "skipped_steps": trainer.state.skipped_steps,
            },
            out / "final.pt",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
