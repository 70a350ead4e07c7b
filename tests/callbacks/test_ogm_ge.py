"""OGMGE, a callback of its own; ``GradNormMonitor(ogm_ge=True)`` still spells it and trains bitwise the same."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sss import Callback, SSSTrainer
from sss.callbacks import OGMGE, GradNormMonitor
from sss.testing import BoringModule, boring_loader
from sss.warnings import SSSWarning

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}, "mixed_precision": "no"}


class Record(Callback):
    """After every callback before it: the gradients at AFTER_BACKWARD, the figures in state.logs after each step."""

    def __init__(self):
        self.grads, self.logs = [], []

    def on_after_backward(self, trainer, module):
        self.grads.append({n: p.grad.clone() for n, p in module.named_parameters()})

    def on_after_optimizer_step(self, trainer, module):
        self.logs.append({k: float(v) for k, v in trainer.state.logs.items()})


def _run(callbacks, steps=4):
    torch.manual_seed(0)
    module, record = BoringModule(), Record()
    trainer = SSSTrainer(callbacks=[*callbacks, record], max_steps=steps, seed=7, **QUIET)
    trainer.fit(module, train_dataloaders=boring_loader(n=64, batch_size=8))
    return record, module.state_dict()


@pytest.mark.parametrize("noise", [False, True])
def test_the_monitor_flag_and_the_callback_after_it_train_bitwise_alike(noise):
    flag, flag_weights = _run([GradNormMonitor(every_n_steps=1, ogm_ge=True, ogm_alpha=0.3, ogm_noise=noise)])
    own, own_weights = _run([GradNormMonitor(every_n_steps=1), OGMGE(alpha=0.3, noise=noise)])
    plain, _ = _run([GradNormMonitor(every_n_steps=1)])
    assert len(flag.grads) == len(own.grads) == 4
    for a, b in zip(flag.grads, own.grads, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert all(torch.equal(flag_weights[n], own_weights[n]) for n in flag_weights)
    # the same keys and values logged: the monitor's norms measured before the modulation, OGM-GE's figures
    assert flag.logs == own.logs and all("train/ogm/coeff_image" in row for row in flag.logs)
    assert flag.logs[0]["train/grad_norm"] == plain.logs[0]["train/grad_norm"]  # the first step: same weights
    assert any(flag.grads[0][n].ne(plain.grads[0][n]).any() for n in flag.grads[0])  # and it did modulate


def test_without_a_label_it_warns_once_naming_who_runs_it():
    trainer = SimpleNamespace(accelerator=SimpleNamespace(is_main_process=True))
    for ogm, who in ((OGMGE(), "OGMGE"), (GradNormMonitor(ogm_ge=True).ogm, "GradNormMonitor")):
        with pytest.warns(SSSWarning) as caught:  # no batch seen yet: as for a batch without "label"
            ogm.on_after_backward(trainer, None)
            ogm.on_after_backward(trainer, None)
        assert [str(w.message) for w in caught] == [
            f"{who}: OGM-GE needs the class of each sample in batch['label']; not modulating"
        ]
