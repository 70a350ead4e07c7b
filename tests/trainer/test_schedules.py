"""Schedules relative to the run: warmup_ratio and decay_ratio of `cosine_with_warmup`."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

import sss
from sss.callbacks import Callback, ModelCheckpoint
from sss.config import ConfigError, check_target
from sss.testing import BoringDataModule, BoringModule
from sss.trainer import cosine_with_warmup

KEY = "trainer.optim.scheduler"


def _factors(total: int, **kw) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    factor = cosine_with_warmup(opt, total_steps=total, **kw).lr_lambdas[0]
    return [factor(step) for step in range(total + 1)]


def _shape(total: int, **kw) -> list[float]:
    # the curve at the same fractions of the run: 0, 1/150, 2/150, ... 1
    factors = _factors(total, **kw)
    return [factors[i * total // 150] for i in range(151)]


def test_a_ratio_keeps_the_curves_shape_when_the_run_grows():
    short, long = _shape(150, warmup_ratio=0.1, min_lr_ratio=0.05), _shape(15000, warmup_ratio=0.1, min_lr_ratio=0.05)
    assert short == pytest.approx(long, abs=1e-12)
    assert short[15] == 1.0 and short[0] == 0.0 and short[-1] == pytest.approx(0.05)
    # a fixed number of warm-up steps does not: 15 steps are a tenth of the short run, a thousandth of the long one
    fixed = _shape(150, warmup_steps=15, min_lr_ratio=0.05), _shape(15000, warmup_steps=15, min_lr_ratio=0.05)
    assert fixed[0] == pytest.approx(short) and fixed[1] != pytest.approx(fixed[0], abs=1e-3)


def test_warmup_steps_and_an_exact_ratio_give_the_earlier_curve_bit_for_bit():
    def earlier(step: int, total: int = 378, warmup: int = 30, floor: float = 0.05) -> float:  # the formula before
        if step < warmup:
            return step / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    expected = [earlier(step) for step in range(379)]
    assert _factors(378, warmup_steps=30, min_lr_ratio=0.05) == expected
    assert _factors(378, warmup_ratio=30 / 378, min_lr_ratio=0.05) == expected
    assert _factors(10) == [earlier(s, 10, 0, 0.0) for s in range(11)]  # neither given: no warm-up, as before


def test_decay_ratio_holds_the_peak_between_warm_up_and_decay():
    f = _factors(100, warmup_ratio=0.1, decay_ratio=0.2)
    assert f[5] == 0.5 and f[10] == f[50] == f[80] == 1.0
    assert f[90] == pytest.approx(0.5) and f[100] == pytest.approx(0.0)
    assert _factors(100, warmup_ratio=0.1)[50] < 1.0  # without it the decay starts after the warm-up


@pytest.mark.parametrize(
    ("kw", "total", "message"),
    [
        ({"warmup_steps": 5, "warmup_ratio": 0.1}, 100, f"{KEY}.warmup_steps and {KEY}.warmup_ratio are both set"),
        ({"warmup_ratio": 1.0}, 100, rf"{KEY}.warmup_ratio: a fraction of the run's steps in \[0, 1\), got 1.0"),
        ({"warmup_ratio": -0.1}, 100, rf"{KEY}.warmup_ratio: a fraction"),
        ({"decay_ratio": 1.5}, 100, rf"{KEY}.decay_ratio: a fraction"),
        ({"warmup_ratio": 0.6, "decay_ratio": 0.5}, 100, "together exceed the run's 100 optimizer steps"),
        ({"warmup_ratio": 0.05}, 0, "unknown here .* set trainer.max_steps"),
    ],
)
def test_errors_name_the_keys(kw, total, message):
    with pytest.raises(ConfigError, match=message):
        _factors(total, **kw)


def test_sss_check_refuses_a_ratio_out_of_range():
    spec = {"_target_": "sss.trainer.cosine_with_warmup", "warmup_ratio": 1.5, "warmup_steps": None}
    assert check_target(spec, KEY) == [f"{KEY}.warmup_ratio: must be < 1 (or null), got 1.5"]
    assert check_target({**spec, "warmup_ratio": 0.05, "decay_ratio": 0.2}, KEY) == []


class _Stop(Callback):
    def on_epoch_end(self, trainer, module):
        trainer.state.should_stop = trainer.state.epoch == 0


def test_a_resumed_run_follows_the_same_schedule(tmp_path):
    def fit(out, callbacks=(), ckpt=None):
        torch.manual_seed(0)
        lrs: list[float] = []

        class Record(Callback):
            def on_after_optimizer_step(self, trainer, module):
                lrs.append(trainer.state.lr)

        trainer = sss.SSSTrainer(
            max_epochs=3,
            mixed_precision="no",
            output_dir=str(out),
            log={"progress": False, "trackers": []},
            optim={"scheduler": {"_target_": "sss.trainer.cosine_with_warmup", "warmup_ratio": 0.25}},
            callbacks=[*callbacks, Record(), ModelCheckpoint(every_epoch=True, keep_last=None, on_signal=False)],
        )
        trainer.fit(BoringModule(), BoringDataModule(n_train=32, n_val=8), ckpt_path=ckpt)
        return lrs

    whole = fit(tmp_path / "a")
    assert len(whole) == 12  # 3 epochs of 4 steps; a warm-up of a quarter: 3 steps up to the peak, then the decay
    assert whole[0] * 3 == pytest.approx(whole[2]) and whole[1] * 1.5 == pytest.approx(whole[2])
    assert whole[2] > whole[3] > whole[-1]
    first = fit(tmp_path / "b", callbacks=[_Stop()])  # stopped after its first epoch, with the same max_epochs
    (tmp_path / "c" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "b" / "checkpoints" / "step_0000004", tmp_path / "c" / "checkpoints" / "step_0000004")
    rest = fit(tmp_path / "c", ckpt=tmp_path / "c" / "checkpoints" / "step_0000004")
    assert first + rest == whole
