"""The runs tests/trainer/test_resume_resize.py checks: a resume on another process count, both ways.

    python resize_runs.py RUN.yaml      (in the folder the runs go to; tests/scripts on PYTHONPATH)

One interpreter, `notebook_fit` forking the two-process parts (it starts in a second, not ~8 s):
``one`` trains 4 steps on 1 process and continues to step 8 on 2 with ``trainer.resume_resize``;
``two`` trains 2 steps on 2 processes and continues to step 10 on 1. Each segment ends where the
epoch of 48 samples (batch 4 per process) ends. ``Seen`` (a callback, neutral on resume) appends,
per rank, every trained micro-batch's sample indices and loss to ``OUTPUT_DIR/seen.RANK.jsonl``,
and a probe of the weights and optimizer state at FIT_START and FIT_END. Prints ``RESULTS [...]``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import torch

from sss import Callback
from sss.testing import BoringDataset, BoringModule


class SeenBoring(BoringModule):
    """`BoringModule` that keeps the sample indices of the micro-batch it trained last."""

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.last_index = batch["index"].tolist()
        return super().training_step(batch, batch_idx)


class Seen(Callback):
    def _write(self, trainer: Any, record: dict[str, Any]) -> None:
        path = trainer.output_dir / f"seen.{trainer.accelerator.process_index}.jsonl"
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def _probe(self, trainer: Any, module: Any, when: str) -> None:
        # the weights (a loss on fixed samples) and the optimizer's moments, as sums: equal iff restored
        batch = torch.utils.data.default_collate([BoringDataset(48)[i] for i in range(8)])
        with torch.no_grad():
            loss = float(module.compute_loss(module(batch), batch))
        moments = [t for s in trainer.optimizer.state_dict()["state"].values() for t in s.values()]
        opt = float(sum(t.double().sum() for t in moments if torch.is_tensor(t)))
        record = {"probe": when, "loss": loss, "opt": opt, "lr": trainer.optimizer.param_groups[0]["lr"]}
        rng = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()  # the stream this rank draws from
        self._write(
            trainer, {**record, "step": trainer.state.global_step, "acc_step": trainer.accelerator.step, "rng": rng}
        )

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        self._probe(trainer, module, "start")

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        self._probe(trainer, module, "end")

    def on_batch_end(self, trainer: Any, module: Any) -> None:
        s = trainer.state
        self._write(
            trainer, {"epoch": s.epoch, "step": s.global_step, "loss": float(s.loss), "index": module.last_index}
        )


def main() -> None:
    from sss.run.notebook import notebook_fit

    config, resize = sys.argv[1], "trainer.resume_resize=true"
    results = [
        notebook_fit(config, overrides=["trainer.output_dir=one", "trainer.max_steps=4"]),
        notebook_fit(
            config, 2, ["trainer.output_dir=one", "trainer.max_steps=8", resize], resume="one/checkpoints/step_0000004"
        ),
        notebook_fit(config, 2, ["trainer.output_dir=two", "trainer.max_steps=2"]),
        notebook_fit(
            config, 1, ["trainer.output_dir=two", "trainer.max_steps=10", resize], resume="two/checkpoints/step_0000002"
        ),
    ]
    print("RESULTS", json.dumps(results))


if __name__ == "__main__":
    main()
