"""`sss check` refuses keys that are valid one by one but not together, in the words the build would use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sss.cli import main
from sss.config import ConfigError, check_config, load_config
from sss.data.folder import loader_options
from sss.trainer.schedules import cosine_with_warmup

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "industrial.yaml")  # warmup_steps: 30, num_workers: 0


def _build_error(build, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as caught:
        build(*args, **kwargs)
    return str(caught.value)


def test_warmup_steps_and_ratio_together_are_refused_before_the_build(capsys):
    assert load_config(EXAMPLE, []).trainer.optim.scheduler["warmup_steps"] == 30
    code = main(["check", EXAMPLE, "trainer.optim.scheduler.warmup_ratio=0.1"])
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    built = _build_error(cosine_with_warmup, optimizer, total_steps=100, warmup_steps=30, warmup_ratio=0.1)
    assert code == 2
    assert f"error: {EXAMPLE}: {built}" in capsys.readouterr().err.splitlines()  # the schedule's own words
    alone = load_config(
        EXAMPLE, ["trainer.optim.scheduler.warmup_steps=null", "trainer.optim.scheduler.warmup_ratio=0.1"]
    )
    assert check_config(alone) == []


@pytest.mark.parametrize(
    ("key", "value", "override"), [("prefetch_factor", 4, "4"), ("persistent_workers", True, "true")]
)
def test_worker_settings_without_workers_are_refused_before_the_data_is_built(key, value, override, capsys):
    built = _build_error(loader_options, 0, **{key: value})
    assert main(["check", EXAMPLE, f"data.{key}={override}"]) == 2  # the example's num_workers: 0
    assert f"error: {EXAMPLE}: {built}" in capsys.readouterr().err.splitlines()
    # num_workers left out: the data module's default (0) counts
    parts = [
        "model._target_=sss.models.create_model",
        "model.name=hunter_tiny",
        "data._target_=sss.data.IndustrialDataModule",
    ]
    assert check_config(load_config(None, [*parts, f"data.{key}={override}"])) == [built]
    assert check_config(load_config(EXAMPLE, [f"data.{key}={override}", "data.num_workers=2"])) == []
    assert check_config(load_config(EXAMPLE, [f"data.{key}=null"])) == []
