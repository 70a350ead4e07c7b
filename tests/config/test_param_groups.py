"""``trainer.optim.param_groups``: per-part learning rates from YAML, with the decay split and the schedule kept."""

from __future__ import annotations

import pytest
import torch

from sss import SSSTrainer
from sss.cli import main
from sss.config import ConfigError, OptimConfig, load_config
from sss.testing import BoringModule, boring_loader
from sss.trainer._setup import build_optimizer

ADAMW = {"_target_": "torch.optim.AdamW", "lr": 0.01, "weight_decay": 0.1}
COSINE = {"_target_": "sss.trainer.cosine_with_warmup", "warmup_steps": 2}


def _names(module: torch.nn.Module, group: dict) -> list[str]:
    names = {id(p): n for n, p in module.named_parameters()}
    return [names[id(p)] for p in group["params"]]


def test_a_glob_gives_its_parameters_their_own_lr_and_keeps_the_decay_split():
    module = BoringModule()
    rules = [{"params": "image_encoder.*", "lr": 1e-4, "name": "image"}, {"params": ["fusion_*"], "weight_decay": 0.5}]
    optimizer, _ = build_optimizer(OptimConfig(optimizer=ADAMW, param_groups=rules), module, 10)
    seen = [(_names(module, g), g["lr"], g["weight_decay"], g.get("name")) for g in optimizer.param_groups]
    assert seen == [
        (["audio_encoder.1.weight"], 0.01, 0.1, None),  # the rest first: train/lr stays the optimizer's lr
        (["audio_encoder.1.bias"], 0.01, 0.0, None),
        (["image_encoder.1.weight"], 1e-4, 0.1, "image"),
        (["image_encoder.1.bias"], 1e-4, 0.0, "image"),  # no decay on biases, as without param_groups
        (["fusion_head.head.weight"], 0.01, 0.5, None),
        (["fusion_head.head.bias"], 0.01, 0.0, None),  # a group's own decay stays off its biases too
    ]


def test_the_scheduler_scales_every_group():
    module = BoringModule()
    rules = [{"params": "image_encoder.*", "lr": 1e-4}]
    optimizer, scheduler = build_optimizer(
        OptimConfig(optimizer=ADAMW, scheduler=COSINE, param_groups=rules), module, 10
    )
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    rest, image = optimizer.param_groups[0]["lr"], optimizer.param_groups[2]["lr"]
    assert 0 < rest < 0.01 and image == pytest.approx(rest * 1e-2)


def test_the_first_matching_rule_wins_and_a_rule_that_gets_nothing_is_an_error():
    module = BoringModule()
    rules = [{"params": "image_encoder.1.weight", "lr": 1e-4}, {"params": "image_encoder.*", "lr": 1e-3}]
    optimizer, _ = build_optimizer(OptimConfig(optimizer=ADAMW, param_groups=rules), module, 10)
    lrs = {n: g["lr"] for g in optimizer.param_groups for n in _names(module, g)}
    assert lrs["image_encoder.1.weight"] == 1e-4 and lrs["image_encoder.1.bias"] == 1e-3
    shadowed = [{"params": "*encoder*"}, {"params": "image_encoder.*", "lr": 1e-4}]
    with pytest.raises(ConfigError, match=r"param_groups\[1\]\.params: 'image_encoder\.\*' matches only parameters "):
        build_optimizer(OptimConfig(optimizer=ADAMW, param_groups=shadowed), module, 10)
    with pytest.raises(ConfigError, match=r"param_groups\[0\]\.params: 'backbone\.\*' matches no parameter of Boring"):
        build_optimizer(OptimConfig(optimizer=ADAMW, param_groups=[{"params": "backbone.*"}]), module, 10)
    module.image_encoder.requires_grad_(False)
    with pytest.raises(ConfigError, match="matches only frozen parameters"):
        build_optimizer(OptimConfig(optimizer=ADAMW, param_groups=[{"params": "image_encoder.*"}]), module, 10)


def test_a_misspelled_group_setting_is_an_error_in_sss_check(tmp_path, capsys):
    # torch keeps any key of a parameter group silently: `lrr` would change nothing without a word.
    with pytest.raises(ConfigError, match=r"param_groups\[0\]\.lrr: not a setting of torch\.optim\.AdamW \(did you"):
        build_optimizer(OptimConfig(optimizer=ADAMW, param_groups=[{"params": "*", "lrr": 1}]), BoringModule(), 10)
    path = tmp_path / "groups.yaml"
    path.write_text(
        "model: {_target_: sss.testing.BoringModule}\ndata: {_target_: sss.testing.BoringDataModule}\n"
        "trainer:\n  optim:\n    param_groups:\n      - {params: 'image_encoder.*', lrr: 1.0e-4}\n"
    )
    assert main(["check", str(path)]) == 2
    assert "trainer.optim.param_groups[0].lrr: not a setting of torch.optim.AdamW" in capsys.readouterr().err
    assert main(["check", str(path), "trainer.optim.param_groups=[{params: 'image_encoder.*', lr: 1e-4}]"]) == 0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[{lr: 1e-4}]", r"param_groups\[0\]\.params: expected a glob over parameter names"),
        ("[{params: 'a.*', lr: -1}]", r"param_groups\[0\]\.lr: must be > 0, got -1"),
        ("[{params: 'a.*', weight_decay: fast}]", r"param_groups\[0\]\.weight_decay: expected a number, got str"),
    ],
)
def test_malformed_groups_are_config_errors_before_anything_is_built(value, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"trainer.optim.param_groups={value}"])


def test_without_param_groups_the_groups_are_the_modules_own():
    module = BoringModule()
    optimizer, _ = build_optimizer(OptimConfig(optimizer=ADAMW), module, 10)
    expected = module.parameter_groups(0.1)
    assert [[id(p) for p in g["params"]] for g in optimizer.param_groups] == [
        [id(p) for p in g["params"]] for g in expected
    ]
    assert [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] == [
        {**optimizer.defaults, **{k: v for k, v in g.items() if k != "params"}} for g in expected
    ]


def test_a_tiny_backbone_lr_from_the_config_holds_the_backbone_while_the_rest_trains():
    torch.manual_seed(0)
    module = BoringModule()
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    optim = {"optimizer": {**ADAMW, "weight_decay": 0.0}, "param_groups": [{"params": "image_encoder.*", "lr": 1e-12}]}
    trainer = SSSTrainer(max_steps=4, mixed_precision="no", optim=optim, log={"progress": False, "trackers": []})
    trainer.fit(module, train_dataloaders=boring_loader(n=32))
    moved = {n: float((p.detach() - before[n]).abs().max()) for n, p in module.named_parameters()}
    assert moved["image_encoder.1.weight"] < 1e-9 and moved["audio_encoder.1.weight"] > 1e-3


def test_param_groups_with_a_module_that_builds_its_own_optimizer_is_refused():
    class Own(BoringModule):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = SSSTrainer(
        max_steps=1, mixed_precision="no", optim={"param_groups": [{"params": "fusion_head.*", "lr": 1e-4}]}
    )
    with pytest.raises(ConfigError, match=r"param_groups is set but Own\.configure_optimizers builds its own"):
        trainer.fit(Own(), train_dataloaders=boring_loader())
