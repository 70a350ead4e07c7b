"""OverflowDetector with a real CPU GradScaler and real fp16 autocast: skips counted, NaN policy, abort, culprit."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch import nn

from sss import Callback, SSSTrainer
from sss.callbacks import OverflowDetector
from sss.testing import BoringModule, boring_loader

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}}


def _fp16_cpu_accelerator(init_scale: float = 2.0**4) -> Accelerator:
    # as in tests/trainer/test_fp16_skip.py: Accelerate's fp16 path with a real CPU GradScaler
    accelerator = Accelerator(
        cpu=True, mixed_precision="fp16", dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True)
    )
    accelerator.native_amp = True
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    return accelerator


def _poison(module: BoringModule, windows: set[int] | None) -> None:
    """Multiply the fusion head's weight gradient by inf in the given windows (1-based); None: always."""
    calls = {"n": 0}

    def hook(grad):
        calls["n"] += 1
        return grad * math.inf if windows is None or calls["n"] in windows else grad

    module.fusion_head.head.weight.register_hook(hook)


class ParamWatch(Callback):
    def __init__(self):
        self.before, self.moved = None, []

    def on_after_backward(self, trainer, module):
        self.before = [p.detach().clone() for p in module.parameters()]

    def on_after_optimizer_step(self, trainer, module):
        self.moved.append(any(not torch.equal(a, p) for a, p in zip(self.before, module.parameters(), strict=True)))


def _fit(module, callbacks, accelerator=None, steps=5, optimizer=None, **kw):
    trainer = SSSTrainer(
        accelerator=accelerator,
        callbacks=callbacks,
        max_steps=steps,
        optim={"optimizer": optimizer or {"_target_": "torch.optim.SGD", "lr": 0.1}},
        **({} if accelerator else {"mixed_precision": "no"}),
        **QUIET,
        **kw,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, train_dataloaders=boring_loader(n=128, batch_size=4))
    return trainer, [str(w.message) for w in caught if "OverflowDetector" in str(w.message)]


def test_injected_inf_gradients_are_skipped_and_counted():
    module, detector, watch = BoringModule(), OverflowDetector(), ParamWatch()
    _poison(module, {2, 4})
    accelerator = _fp16_cpu_accelerator()
    trainer, _ = _fit(module, [detector, watch], accelerator)
    assert trainer.state.global_step == 5 and trainer.state.skipped_steps == 2
    assert watch.moved == [True, False, True, False, True, True, True]
    assert trainer.state.logs["train/overflow/skipped"] == 2
    assert trainer.state.logs["train/loss_scale"] == accelerator.scaler.get_scale() == 2.0**2
    assert detector.consecutive == 0


def test_fused_optimizer_skip_is_seen_through_the_scale_factor():
    torch.optim.AdamW([nn.Parameter(torch.zeros(2))], fused=True)  # fused AdamW runs on the CPU in this torch
    module, detector, watch = BoringModule(), OverflowDetector(), ParamWatch()
    _poison(module, {2})
    fused = {"_target_": "torch.optim.AdamW", "lr": 0.01, "fused": True}
    trainer, _ = _fit(module, [detector, watch], _fp16_cpu_accelerator(), steps=4, optimizer=fused)
    assert watch.moved == [True, False, True, True, True], "the fused kernel should have skipped the 2nd update"
    # Accelerate reports the fused skip as a step taken (accelerate#4242); the trainer sees the scale back off,
    # so it is a skipped step: global_step and the LR schedule stay, and it is counted once
    assert trainer.state.skipped_steps == 1 and trainer.state.global_step == 4
    assert trainer.state.logs["train/overflow/skipped"] == 1 and detector.consecutive == 0


def test_fused_optimizer_without_overflow_counts_nothing():
    fused = {"_target_": "torch.optim.AdamW", "lr": 0.01, "fused": True}
    detector = OverflowDetector()
    trainer, messages = _fit(BoringModule(), [detector], _fp16_cpu_accelerator(), steps=3, optimizer=fused)
    assert trainer.state.skipped_steps == 0 and trainer.state.logs["train/overflow/skipped"] == 0 and messages == []


class NaNAt(BoringModule):
    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * math.nan if batch_idx in self.batches else loss


def test_nan_loss_under_skip_continues():
    detector = OverflowDetector(on_nan="skip")
    trainer, messages = _fit(NaNAt({2}), [detector], steps=5)
    assert trainer.state.global_step == 5 and trainer.state.skipped_steps == 1 and detector.nan_losses == 1
    assert all(torch.isfinite(p).all() for p in trainer.module.parameters())
    assert len(messages) == 1 and "global_step 2 (epoch 0, batch index 2)" in messages[0]


def test_nan_loss_without_the_detector_ruins_the_weights():  # the negative control of the test above
    trainer, _ = _fit(NaNAt({2}), [], steps=5)
    assert not all(torch.isfinite(p).all() for p in trainer.module.parameters())


def test_nan_loss_early_in_an_accumulation_window_is_caught():
    detector = OverflowDetector(on_nan="skip")
    trainer, _ = _fit(NaNAt({2}), [detector], steps=3, gradient_accumulation_steps=2)
    assert trainer.state.skipped_steps == 1 and detector.nan_losses == 1
    assert all(torch.isfinite(p).all() for p in trainer.module.parameters())


def test_nan_loss_under_raise_stops_naming_the_step():
    with pytest.raises(FloatingPointError, match=r"loss is nan at global_step 3 \(epoch 0, batch index 3\)"):
        _fit(NaNAt({3}), [OverflowDetector(on_nan="raise")], steps=6)


def test_100_consecutive_skips_abort_with_advice():
    module, detector = BoringModule(), OverflowDetector()
    _poison(module, None)
    accelerator = _fp16_cpu_accelerator(init_scale=2.0**16)
    with pytest.raises(RuntimeError, match="100 optimizer steps in a row were skipped") as err:
        _fit(module, [detector], accelerator, steps=1000)
    for advice in ("bf16", "lower learning rate", "clamping the loss"):
        assert advice in str(err.value)
    assert detector.consecutive == 100


class Blowup(nn.Module):
    def forward(self, x):
        return x * math.inf


def test_find_culprit_names_the_module_with_infinite_outputs():
    module = BoringModule()
    module.audio_encoder.append(Blowup())
    with pytest.raises(FloatingPointError, match=r"first non-finite: audio_encoder\.2 \(Blowup\) output"):
        _fit(module, [OverflowDetector(on_nan="raise", find_culprit=True)], steps=2)


def test_find_culprit_names_the_parameter_with_infinite_gradients():
    module = BoringModule()
    _poison(module, {2})
    _, messages = _fit(module, [OverflowDetector(find_culprit=True)], _fp16_cpu_accelerator(), steps=3)
    assert any("fusion_head.head (Linear) gradient of weight" in m for m in messages), messages


TWO_PROCESS_SCRIPT = """
import json, math, sys, warnings
import torch
from sss import SSSTrainer
from sss.callbacks import GradNormMonitor, HubPush, MemoryMonitor, OverflowDetector
from sss.testing import BoringModule, boring_loader

mode, out = sys.argv[1], sys.argv[2]


class NaNOnRank1(BoringModule):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * math.nan if trainer.accelerator.process_index == 1 and batch_idx == 2 else loss


warnings.simplefilter("ignore")
if mode == "health":
    callbacks = [OverflowDetector(), GradNormMonitor(every_n_steps=1, ogm_ge=True), MemoryMonitor(every_n_steps=1)]
else:
    callbacks = [HubPush("tester/boring", endpoint=sys.argv[3])]
trainer = SSSTrainer(callbacks=callbacks, max_steps=5, output_dir=out + "_run", log={"progress": False, "trackers": []},
                     checkpoint={"every_epoch": False}, optim={"optimizer": {"_target_": "torch.optim.SGD", "lr": 0.1}})
result = {}
try:
    trainer.fit(NaNOnRank1(), train_dataloaders=boring_loader(n=64, batch_size=4))
except RuntimeError as exc:
    result["error"] = str(exc)
state = trainer.state
result.update(step=state.global_step, skipped=state.skipped_steps, logs=dict(state.logs),
              params=[p.detach().tolist() for p in trainer.module.parameters()] if trainer.module else [])
with open(f"{out}.{trainer.accelerator.process_index}", "w") as f:
    json.dump(result, f)
"""


def _launch_two(tmp_path, *args):
    import os
    import subprocess

    from sss.run.launch import launch_command

    script = tmp_path / "two.py"
    script.write_text(TWO_PROCESS_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_TOKEN": "hf_x"}
    done = subprocess.run(launch_command(2, [str(script), *args]), capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    return [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in (0, 1)]


@pytest.mark.slow
def test_two_processes_agree_on_a_nan_seen_by_one_and_stay_equal(tmp_path):
    # rank 1 alone sees a NaN loss; both must skip that window, or rank 0 would step on the NaN gradients
    # it received in the all-reduce. OGM-GE's scores and noise must be the same on both ranks too.
    rank0, rank1 = _launch_two(tmp_path, "health", str(tmp_path / "out"))
    for r in (rank0, rank1):
        assert r["step"] == 5 and r["skipped"] == 1 and r["logs"]["train/overflow/nan_losses"] == 1
        assert all(math.isfinite(v) for p in r["params"] for v in torch.tensor(p).flatten().tolist())
    assert rank0["params"] == rank1["params"], "the replicas drifted apart"
    for key in ("memory/peak_rss_mb", "train/ogm/coeff_image", "train/ogm/coeff_audio"):
        assert rank0["logs"][key] == rank1["logs"][key]


def test_deferred_raise_stops_at_the_next_logging_step_naming_the_first_bad_window():
    # batch index 5 makes the weights NaN, so windows 5..9 are not finite; the flags are read with the
    # logged figures at step 10
    steps = []

    class Steps(Callback):
        def on_after_optimizer_step(self, trainer, module):
            steps.append(trainer.state.global_step)

    detector = OverflowDetector(on_nan="raise", deferred=True)
    log = {"every_n_steps": 10, "progress": False, "trackers": []}
    with pytest.raises(FloatingPointError, match=r"not finite at global_step 5 \(epoch 0, batch index 5\) \(5 window"):
        SSSTrainer(callbacks=[detector, Steps()], max_steps=20, mixed_precision="no", **{**QUIET, "log": log}).fit(
            NaNAt({5}), train_dataloaders=boring_loader(n=128, batch_size=4)
        )
    assert steps[-1] == 10 and detector.nan_losses == 5  # it ran on to the logging step, no further


def test_deferred_reads_at_the_fit_end_and_refuses_skip():
    with pytest.raises(FloatingPointError, match=r"global_step 2 \(epoch 0, batch index 2\)"):
        _fit(NaNAt({2}), [OverflowDetector(on_nan="raise", deferred=True)], steps=4)  # no logging step reached
    with pytest.raises(ValueError, match="on_nan='skip' must decide before each update"):
        OverflowDetector(on_nan="skip", deferred=True)
