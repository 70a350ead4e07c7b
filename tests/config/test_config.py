"""Config: merge order, checks without building, and clear errors that name the key."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from sss.cli import main
from sss.config import ConfigError, SSSConfig, check_config, check_target, field_docs, load_config, to_yaml

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("**/*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_config_checks(path, capsys):
    assert main(["check", str(path)]) == 0, capsys.readouterr().err
    assert "ok" in capsys.readouterr().out


def test_examples_exist():
    assert any(p.name == "industrial.yaml" for p in EXAMPLES)


def test_merge_order_defaults_yaml_overrides(tmp_path):
    cfg_file = tmp_path / "exp.yaml"
    cfg_file.write_text("trainer:\n  max_epochs: 3\n  seed: 1\n")
    cfg = load_config(cfg_file, ["trainer.seed=7"])
    assert cfg.trainer.max_epochs == 3  # from YAML
    assert cfg.trainer.seed == 7  # override wins
    assert cfg.trainer.gradient_accumulation_steps == 1  # default
    assert cfg.name == "exp" and cfg.trainer.output_dir == "runs/exp"


GOOD = """
model: {_target_: sss.models.create_model, name: hunter_tiny, num_classes: 4}
data: {_target_: sss.data.IndustrialDataModule, n_train: 16}
"""

# (name, YAML added to GOOD or overrides, expected key in the message)
MALFORMED = [
    ("unknown key", "trainer:\n  max_stepz: 3\n", "trainer.max_stepz"),
    ("wrong type", "trainer:\n  max_steps: lots\n", "trainer.max_steps"),
    ("negative accumulation", "trainer:\n  gradient_accumulation_steps: -2\n", "trainer.gradient_accumulation_steps"),
    ("bad precision", "trainer:\n  mixed_precision: fp64\n", "trainer.mixed_precision"),
    ("unimportable target", "callbacks:\n  - {_target_: sss.callbacks.NoSuchCallback}\n", "callbacks[0]._target_"),
    (
        "unknown module in target",
        "trainer:\n  optim:\n    optimizer: {_target_: torch.optimz.AdamW}\n",
        "trainer.optim.optimizer._target_",
    ),
    (
        "bad argument name",
        "trainer:\n  optim:\n    optimizer: {_target_: torch.optim.AdamW, learning_rate: 0.1}\n",
        "trainer.optim.optimizer.learning_rate",
    ),
    (
        "bad model argument",
        "model: {_target_: sss.models.create_model, name: hunter_tiny, num_clases: 4}\n",
        "model.num_clases",
    ),
    ("unknown model", "model: {_target_: sss.models.create_model, name: hunter_huge}\n", "model.name"),
    ("wrong argument type", "data: {_target_: sss.data.IndustrialDataModule, batch_size: many}\n", "data.batch_size"),
    ("missing target", "data: {batch_size: 4}\n", "data._target_"),
    ("callbacks not a list", "callbacks: {_target_: sss.callbacks.ProgressBar}\n", "callbacks"),
    ("clip must be positive", "trainer:\n  max_grad_norm: 0\n", "trainer.max_grad_norm"),
    ("no stopping rule", "trainer:\n  max_epochs: null\n", "trainer.max_epochs"),
]


@pytest.mark.parametrize(("name", "extra", "key"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_configs_exit_2_naming_the_key(name, extra, key, tmp_path, capsys):
    import yaml

    merged = {**yaml.safe_load(GOOD), **yaml.safe_load(extra)}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(merged))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert key in err, err
    assert str(path) in err


def test_bad_yaml_and_missing_file_name_the_file(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("trainer:\n  max_steps: [1,\n")
    assert main(["check", str(broken)]) == 2
    assert "broken.yaml" in capsys.readouterr().err
    assert main(["check", str(tmp_path / "missing.yaml")]) == 2
    assert "no such config file" in capsys.readouterr().err
    assert main(["check", str(broken.parent / "ok.yaml"), "trainer.max_steps"]) == 2


def test_override_without_equals_is_refused():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["trainer.max_steps"])


def test_check_builds_nothing(monkeypatch):
    import sss.data

    built = []
    monkeypatch.setattr(sss.data.IndustrialDataModule, "__init__", lambda self, **kw: built.append(kw))
    cfg = load_config(
        None,
        [
            "model._target_=sss.models.create_model",
            "model.name=hunter_tiny",
            "data._target_=sss.data.IndustrialDataModule",
            "data.n_train=8",
        ],
    )
    assert check_config(cfg) == []
    assert built == []


def test_field_docs_feed_fit_help():
    rows = {key: doc for key, _, doc in field_docs(SSSConfig)}
    assert rows.get("trainer.gradient_accumulation_steps")
    assert "trainer.checkpoint.every_n_steps" in rows
    out = subprocess.run([sys.executable, "-m", "sss", "fit", "--help"], capture_output=True, text=True).stdout
    assert "trainer.max_grad_norm" in out and "Clip the global gradient norm" in out


def test_help_does_not_import_torch():
    code = "import sys, sss.cli; sss.cli._parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_config_command_prints_resolved_yaml(capsys, tmp_path):
    assert main(["config", str(EXAMPLES[0]), "trainer.max_steps=9"]) == 0
    assert "max_steps: 9" in capsys.readouterr().out


DM = "sss.data.ManifestDataModule"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"layout": "audioset"}, "data.layout: must be one of 'manifest', 'esc50', 'urbansound8k', 'desed', 'istd'"),
        ({"on_error": "ignore"}, "data.on_error: must be one of 'raise', 'skip', got 'ignore'"),
        ({"cache": "disk"}, "data.cache: must be one of 'features' (or null), got 'disk'"),
        ({"clip_seconds": -1}, "data.clip_seconds: must be > 0 (or null), got -1"),
        ({"batch_size": 0}, "data.batch_size: must be >= 1, got 0"),
        (
            {"batch_size": "8"},
            "data.batch_size: expected an integer, got str '8' (a number in quotes?",
        ),
        ({"num_workers": -1}, "data.num_workers: must be >= 0, got -1"),
        ({"fold": 0}, "data.fold: must be >= 1 (or null), got 0"),
    ],
)
def test_check_target_reads_literal_choices_and_bounds_off_the_signature(args, expected):
    errors = check_target({"_target_": DM, **args}, "data")
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_values_inside_the_choices_and_bounds_pass():
    good = {"layout": "esc50", "on_error": "skip", "cache": None, "clip_seconds": None, "fold": 2, "num_workers": 0}
    assert check_target({"_target_": DM, "batch_size": 1, **good}, "data") == []
    assert check_target({"_target_": DM, "cache": "features", "clip_seconds": 0.5}, "data") == []


def test_the_literal_annotations_list_the_same_choices_as_the_runtime_checks():
    import typing

    from sss.data import IndustrialDataModule, ManifestDataModule
    from sss.data.layouts import LAYOUTS
    from sss.data.manifest import ON_ERROR
    from sss.data.record_setup import RECORD_LAYOUTS

    hints = typing.get_type_hints(ManifestDataModule.__init__, include_extras=True)
    assert typing.get_args(hints["layout"]) == (*LAYOUTS, *RECORD_LAYOUTS)
    assert typing.get_args(hints["on_error"]) == tuple(ON_ERROR)
    industrial = typing.get_type_hints(IndustrialDataModule.__init__, include_extras=True)
    assert industrial["cache"] == hints["cache"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"lr": -1}, "trainer.optim.optimizer.lr: must be > 0, got -1"),
        ({"lr": "fast"}, "trainer.optim.optimizer.lr: expected a number, got str 'fast'"),
        ({"lr": [0.1, 0.2]}, "trainer.optim.optimizer.lr: expected a number, got list [0.1, 0.2]"),
        ({"betas": [0.9, 1.5]}, "trainer.optim.optimizer.betas: item 1 (1.5): must be < 1, got [0.9, 1.5]"),
        ({"weight_decay": -0.5}, "trainer.optim.optimizer.weight_decay: must be >= 0, got -0.5"),
    ],
)
def test_optimizer_numbers_are_checked_by_name(args, expected):
    # torch.optim annotates lr as float | Tensor, which says nothing about a YAML value: a table by name does.
    assert check_target({"_target_": "torch.optim.AdamW", **args}, "trainer.optim.optimizer") == [expected]
    assert check_target({"_target_": "torch.optim.AdamW", **args}, "model.some_optimizer")[:1] != [expected]


def test_an_argument_the_target_lacks_is_reported_once():
    errors = check_target({"_target_": "torch.optim.AdamW", "momentum": -1}, "trainer.optim.optimizer")
    assert len(errors) == 1 and "unknown argument of torch.optim.AdamW" in errors[0]


def test_a_target_that_is_not_callable_is_refused():
    assert check_target({"_target_": "math.pi"}, "model") == [
        "model._target_: 'math.pi' is a float, not a class or function that builds the part"
    ]


def test_a_yaml_number_with_an_exponent_and_no_dot_is_a_number(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("trainer:\n  optim:\n    optimizer: {_target_: torch.optim.AdamW, lr: 1e-3}\n")
    assert load_config(path).trainer.optim.optimizer["lr"] == 0.001  # PyYAML alone reads the string '1e-3'


def test_a_duplicate_yaml_key_is_refused_with_its_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("trainer:\n  seed: 1\n  seed: 2\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml: line 3, column 3: duplicate key 'seed' \(first on line 2\)"):
        load_config(path)


def test_errors_of_overrides_name_the_override_and_the_key():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["trainer.optim=1"])
    assert (
        str(info.value)
        == "defaults: override 'trainer.optim=1': trainer.optim: expected a mapping of settings, got int 1"
    )


def test_trainer_seed_and_output_dir_are_checked():
    with pytest.raises(ConfigError, match=r"trainer\.seed must be in 0 \.\. 2\*\*32 - 1"):
        load_config(None, ["trainer.seed=-1"])
    with pytest.raises(ConfigError, match=r"trainer\.output_dir is empty"):
        load_config(None, ["trainer.output_dir=' '"])


@pytest.mark.parametrize(
    ("overrides", "suggestion"),
    [
        (["trainer.lr=1e-3"], "Did you mean trainer.optim.optimizer.lr?"),
        (["trainer.batch_size=8"], "Did you mean data.batch_size?"),
        (["max_steps=5"], "Did you mean trainer.max_steps?"),
        (["trainer.num_workers=2"], "Did you mean data.num_workers?"),
        (["trainer.max_stepz=3"], "Did you mean trainer.max_steps?"),  # a typo: the same section's key
    ],
)
def test_an_unknown_key_names_the_closest_key_anywhere_in_the_config(overrides, suggestion):
    with pytest.raises(ConfigError) as info:
        load_config(Path(__file__).parents[2] / "examples" / "industrial.yaml", overrides)
    assert str(info.value).endswith(suggestion), str(info.value)


def test_an_unknown_key_in_the_yaml_file_gets_the_suggestion_too(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("trainer:\n  lr: 0.01\n")
    with pytest.raises(ConfigError, match=r"exp\.yaml: trainer\.lr: .*Did you mean trainer\.optim\.optimizer\.lr\?$"):
        load_config(path)


def test_whether_output_dir_was_given_is_recorded(tmp_path):
    sources: dict[str, str] = {}
    default = load_config(None, ["name=demo"], sources)
    assert default.trainer.output_dir == "runs/demo" and default.output_dir_given is False
    assert "trainer.output_dir" not in sources
    given = load_config(None, ["name=demo", "trainer.output_dir=runs/demo"], sources)
    assert given.trainer.output_dir == "runs/demo" and given.output_dir_given is True
    assert sources["trainer.output_dir"] == "override"
    path = tmp_path / "exp.yaml"
    path.write_text("trainer:\n  output_dir: null\n")
    sources = {}
    assert load_config(path, [], sources).output_dir_given is False and "trainer.output_dir" not in sources
    assert SSSConfig().output_dir_given is None  # built in Python: unknown
    assert "output_dir_given" not in to_yaml(given)  # not a YAML key
    # An attribute of each config (kept by a copy), not a class attribute set on instances.
    assert isinstance(vars(SSSConfig)["output_dir_given"], property)
    assert copy.deepcopy(given).output_dir_given is True


def test_a_stored_config_loads_with_overrides_and_names_its_source():
    stored = {"name": "old", "trainer": {"max_steps": 7, "seed": 1}, "model": {"_target_": "a.B"}}
    cfg = load_config("runs/old/checkpoints/step_0000007/trainer_state.json", ["trainer.seed=2"], stored=stored)
    assert (cfg.name, cfg.trainer.max_steps, cfg.trainer.seed, cfg.model) == ("old", 7, 2, {"_target_": "a.B"})
    with pytest.raises(ConfigError, match=r"^ckpt/trainer_state\.json: trainer\.lr: .*optim\.optimizer\.lr\?$"):
        load_config("ckpt/trainer_state.json", stored={"trainer": {"lr": 1}})


@pytest.mark.parametrize("word", ["no", "off", "yes"])
def test_yaml_1_1_words_stay_strings_in_the_yaml_and_in_overrides(tmp_path, word):
    # PyYAML and OmegaConf read `no` as False (YAML 1.1): `mixed_precision: no` was refused as 'False'.
    path = tmp_path / "p.yaml"
    path.write_text("trainer:\n  mixed_precision: no\n  cpu: yes\n")
    cfg = load_config(path)
    assert cfg.trainer.mixed_precision == "no" and cfg.trainer.cpu is True  # a boolean field takes yes/no
    assert load_config(None, ["trainer.mixed_precision=no"]).trainer.mixed_precision == "no"
    assert load_config(None, [f"trainer.cpu={word}"]).trainer.cpu is (word == "yes")
