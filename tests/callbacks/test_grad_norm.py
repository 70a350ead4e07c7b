"""GradNormMonitor: per-part norms combine to the trainer's global norm; advice for bad LRs and starving modalities."""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch

from sss import Callback, SSSTrainer
from sss.callbacks import GradNormMonitor
from sss.testing import BoringModule, boring_loader

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}, "mixed_precision": "no"}


def _fit(callbacks, lr=0.1, module=None, steps=8, optim=None, **kw):
    trainer = SSSTrainer(
        callbacks=callbacks,
        max_steps=steps,
        optim=optim or {"optimizer": {"_target_": "torch.optim.SGD", "lr": lr}},
        **QUIET,
        **kw,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module or BoringModule(), train_dataloaders=boring_loader(n=64, batch_size=8))
    return trainer, [str(w.message) for w in caught if "GradNormMonitor" in str(w.message)]


class AfterStep(Callback):
    def __init__(self, monitor):
        self.monitor, self.rows = monitor, []

    def on_after_optimizer_step(self, trainer, module):
        self.rows.append((dict(self.monitor.norms), float(trainer.state.grad_norm), dict(trainer.state.logs)))


def test_per_modality_norms_combine_to_the_global_norm():
    monitor = GradNormMonitor(every_n_steps=1)
    probe = AfterStep(monitor)
    _fit([monitor, probe], max_grad_norm=1e6, steps=4)
    assert len(probe.rows) == 4
    for norms, clip_norm, logs in probe.rows:
        parts = [norms[k] for k in ("image", "audio", "fusion", "heads")]
        assert all(p > 0 for p in parts[:3]) and parts[3] == 0.0  # BoringModule has no extra heads
        assert math.sqrt(sum(p * p for p in parts)) == pytest.approx(norms["total"], rel=1e-6)
        # the trainer's own clip_grad_norm_ (over all parameters) gives the same global norm
        assert norms["total"] == pytest.approx(clip_norm, rel=1e-5)
        shares = [logs[f"train/grad_share/{k}"] for k in ("image", "audio", "fusion", "heads")]
        assert sum(shares) == pytest.approx(1.0)
        assert logs["train/grad_norm/audio"] == norms["audio"]


def test_tiny_learning_rate_warns_too_small_and_only_once():
    _, messages = _fit([GradNormMonitor(every_n_steps=1, patience=3)], lr=1e-9, steps=10)
    small = [m for m in messages if "may be too small" in m]
    assert len(small) == 1, messages
    assert "lr=1.0e-09" in small[0]
    assert not any("too large" in m for m in messages)


def test_huge_learning_rate_warns_too_large():
    _, messages = _fit([GradNormMonitor(every_n_steps=1, patience=3)], lr=10.0, max_grad_norm=1.0)
    assert any("sat at the clip value trainer.max_grad_norm=1.0" in m and "too large" in m for m in messages), messages
    assert not any("too small" in m for m in messages)


def test_healthy_learning_rate_gives_no_advice():
    _, messages = _fit([GradNormMonitor(every_n_steps=1, patience=3)], lr=0.1, max_grad_norm=100.0)
    assert messages == []


def test_frozen_audio_branch_warns_imbalance():
    module = BoringModule()
    module.audio_encoder.requires_grad_(False)
    trainer, messages = _fit([GradNormMonitor(every_n_steps=1, patience=3)], module=module)
    imbalance = [m for m in messages if "modality imbalance" in m]
    assert len(imbalance) == 1 and "audio gets 0.0%" in imbalance[0] and "none of its parameters" in imbalance[0]
    assert "OGM-GE" in imbalance[0] and "modality dropout" in imbalance[0]
    assert trainer.state.logs["train/grad_share/audio"] == 0.0


WARMUP = {"_target_": "sss.trainer.cosine_with_warmup", "warmup_steps": 8}


def _large_lr_fit(scheduler):
    # SGD at lr=10 with a clip value of 1.0: every step is clipped, "the learning rate may be too large"
    optim = {"optimizer": {"_target_": "torch.optim.SGD", "lr": 10.0}}
    if scheduler is not None:
        optim["scheduler"] = scheduler
    return _fit([GradNormMonitor(every_n_steps=1, patience=3)], steps=16, max_grad_norm=1.0, optim=optim)


def _steps(messages, text):
    return [int(re.search(r"global_step (\d+)", m).group(1)) for m in messages if text in m]


def test_no_learning_rate_advice_during_the_warm_up():
    _, messages = _large_lr_fit(WARMUP)
    large = _steps(messages, "too large")
    # the advice waits for the warm-up (steps 0-7) to end, then for `patience` checks, and comes all the same
    assert large and min(large) >= 8 + 3 - 1, messages
    assert not _steps(messages, "too small"), messages  # the LR starts at 0: small by design, not advice


def test_the_same_run_without_a_warm_up_is_advised_at_once():  # the negative control of the test above
    _, messages = _large_lr_fit(None)
    assert min(_steps(messages, "too large")) < 8, messages


def test_warming_up_follows_the_schedule():
    seen = []

    class Probe(Callback):
        def on_after_backward(self, trainer, module):
            seen.append(monitor.warming_up(trainer))

    monitor = GradNormMonitor(every_n_steps=1)
    optim = {"optimizer": {"_target_": "torch.optim.SGD", "lr": 0.1}, "scheduler": {**WARMUP, "warmup_steps": 4}}
    _fit([monitor, Probe()], steps=10, optim=optim)
    assert seen == [True] * 4 + [False] * 6  # steps 0-3 below the optimizer's lr; from step 4 on, the cosine decay
    seen.clear()
    _fit([monitor, Probe()], steps=3, lr=0.1)  # no scheduler: no warm-up
    assert seen == [False] * 3


def test_advice_is_an_sss_warning_printed_as_one_line(capsys):
    from sss.warnings import SSSWarning

    module = BoringModule()
    module.audio_encoder.requires_grad_(False)
    trainer = SSSTrainer(callbacks=[GradNormMonitor(every_n_steps=1, patience=2)], max_steps=3, **QUIET)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, train_dataloaders=boring_loader(n=64, batch_size=8))
    advice = [w for w in caught if "GradNormMonitor" in str(w.message)]
    assert advice and all(w.category is SSSWarning for w in advice)
    w = advice[0]
    text = warnings.formatwarning(w.message, w.category, w.filename, w.lineno, "warnings.warn(message)")
    assert text == f"sss: warning: {w.message}\n" and "grad_norm.py" not in text
    with warnings.catch_warnings(record=True) as ignored:  # users can filter sss's advice by its category
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=SSSWarning)
        SSSTrainer(callbacks=[GradNormMonitor(every_n_steps=1, patience=2)], max_steps=3, **QUIET).fit(
            module, train_dataloaders=boring_loader(n=64, batch_size=8)
        )
    assert not [w for w in ignored if "GradNormMonitor" in str(w.message)]


class GradSnapshot(Callback):
    def __init__(self):
        self.grads = []

    def on_after_backward(self, trainer, module):
        self.grads.append({n: p.grad.clone() for n, p in module.named_parameters()})


@pytest.mark.parametrize("noise", [False, True])
def test_ogm_ge_slows_the_dominant_modality(noise):
    before, after = GradSnapshot(), GradSnapshot()
    monitor = GradNormMonitor(every_n_steps=1, ogm_ge=True, ogm_alpha=0.5, ogm_noise=noise)
    coeffs = []

    class Coeffs(Callback):
        def on_after_backward(self, trainer, module):
            logs = trainer.state.logs
            coeffs.append((logs["train/ogm/coeff_image"], logs["train/ogm/coeff_audio"], logs["train/ogm/score_ratio"]))

    _fit([before, monitor, Coeffs(), after], steps=3)
    assert len(coeffs) == 3
    for (c_img, c_aud, ratio), b, a in zip(coeffs, before.grads, after.grads, strict=True):
        dominant = max(ratio, 1 / ratio)
        assert min(c_img, c_aud) == pytest.approx(1 - math.tanh(0.5 * dominant)) and max(c_img, c_aud) == 1.0
        for name in b:
            if name.startswith("fusion_head"):
                assert torch.equal(a[name], b[name]), "OGM-GE must leave the fusion gradients alone"
                continue
            c = c_img if name.startswith("image_encoder") else c_aud
            if not noise:
                torch.testing.assert_close(a[name], b[name] * c)
            elif a[name].numel() > 1:
                residual = a[name] - b[name] * c
                assert residual.abs().sum() > 0, "GE noise missing"


def _dominated_by(modality):
    """A BoringModule whose `modality` alone predicts the label (75 % agreement); the other branch outputs zeros."""
    torch.manual_seed(0)
    module = BoringModule()
    image, audio, head = module.image_encoder[1], module.audio_encoder[1], module.fusion_head.head
    with torch.no_grad():
        for layer in (image, audio, head):
            layer.weight.zero_()
            layer.bias.zero_()
        # feature 0 is 5x the first input value of `modality`; the label is the sign of image[0] + audio[0]
        (image if modality == "image" else audio).weight[0, 0] = 5.0
        head.weight[1, 0], head.weight[0, 0] = 1.0, -1.0
    return module


@pytest.mark.parametrize("dominant", ["image", "audio"])
def test_ogm_ge_slows_the_modality_that_dominates_not_the_other(dominant):
    monitor = GradNormMonitor(every_n_steps=1, ogm_ge=True, ogm_alpha=0.5, ogm_noise=False)
    seen = []

    class Coeffs(Callback):
        def on_after_backward(self, trainer, module):
            logs = trainer.state.logs
            seen.append((logs["train/ogm/coeff_image"], logs["train/ogm/coeff_audio"], logs["train/ogm/score_ratio"]))

    _fit([monitor, Coeffs()], lr=1e-3, module=_dominated_by(dominant), steps=3)
    assert len(seen) == 3
    for c_image, c_audio, ratio in seen:
        # the score ratio is image / audio: above 1 exactly when the image branch dominates
        assert (ratio > 1) is (dominant == "image") and ratio != 1
        slowed, kept = (c_image, c_audio) if dominant == "image" else (c_audio, c_image)
        assert kept == 1.0 and slowed < 1.0
        assert slowed == pytest.approx(1 - math.tanh(0.5 * max(ratio, 1 / ratio)))
