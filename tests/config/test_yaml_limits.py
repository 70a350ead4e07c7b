"""Hostile YAML ends in one line naming the file, in well under a second: alias bombs, deep nesting, huge files.

Also: an empty override value is refused naming the key (an unset shell variable), not read as null.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sss.cli import main
from sss.config import ConfigError, load_config
from sss.config._yaml import MAX_BYTES, MAX_DEPTH, MAX_NODES

GOOD = "model: {_target_: sss.testing.BoringModule}\n"


def _bomb(levels: int, refs: int = 9, indent: str = "") -> str:
    """A "billion laughs": `levels` anchors, each a list of `refs` references to the one before."""
    lines = [f"{indent}a0: &a0 [{', '.join(['lol'] * refs)}]"]
    lines += [f"{indent}a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * refs)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _refused_fast(path: Path, *overrides: str) -> str:
    load_config(None)  # imports done: the time below is the file's own
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    assert time.perf_counter() - start < 1.0
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


@pytest.mark.parametrize("levels", [5, 6, 8, 10])
def test_an_alias_bomb_is_refused_at_once_naming_the_file_and_first_alias(tmp_path, levels):
    path = tmp_path / "bomb.yaml"
    path.write_text(GOOD + "data:\n" + _bomb(levels, indent="  "))
    assert path.stat().st_size < 1024
    message = _refused_fast(path)
    assert f"more than {MAX_NODES:,} values (first alias *a0 on line 4)" in message


def test_a_bomb_in_a_model_folder_stops_sss_check(tmp_path, capsys):
    from sss.config import SSSConfig
    from sss.model_folder import export_model
    from sss.testing import BoringModule

    folder = export_model(
        BoringModule(), SSSConfig(name="b", model={"_target_": "sss.testing.BoringModule"}), {}, tmp_path / "m"
    )
    (folder / "config.yaml").write_text(GOOD + "data:\n" + _bomb(9, indent="  "))
    start = time.perf_counter()
    assert main(["check", str(folder)]) == 2
    assert time.perf_counter() - start < 5.0  # the command, imports and all
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{folder / 'config.yaml'}: line " in err[0] and "first alias *a0" in err[0]


def test_an_unknown_top_level_key_is_named_before_its_bomb_is_read(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(GOOD + "laughs:\n" + _bomb(10, indent="  "))
    assert _refused_fast(path) == f"{path}: laughs: Key 'laughs' not in 'SSSConfig'. The sections are " + (
        "callbacks, data, model, name, trainer."
    )
    path.write_text("trainr:\n" + _bomb(10, indent="  "))
    assert _refused_fast(path).endswith("Did you mean trainer?")


def test_a_small_alias_still_works(tmp_path):
    # The positive control: aliases and merge keys as people use them.
    path = tmp_path / "ok.yaml"
    path.write_text(
        "model: &m {_target_: sss.testing.BoringModule, dim: 8}\n"
        "data:\n  <<: *m\n  dim: 4\n"
        "callbacks: [&es {_target_: sss.callbacks.EarlyStopping, patience: 2}, *es]\n"
    )
    cfg = load_config(path)
    assert cfg.data == {"_target_": "sss.testing.BoringModule", "dim": 4}
    assert cfg.callbacks[0] == cfg.callbacks[1]


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("model: &a\n  inner: *a\n")
    assert "alias *a refers to a value that holds it" in _refused_fast(path)


@pytest.mark.parametrize("style", ["flow", "block"])
def test_a_5000_deep_list_is_refused_naming_the_file_not_the_recursion_limit(tmp_path, style):
    path = tmp_path / "deep.yaml"
    if style == "flow":
        path.write_text("model:\n  x: " + "[" * 5000 + "]" * 5000 + "\n")
    else:
        path.write_text("model:\n  x:\n    " + "- " * 5000 + "1\n")  # compact nested block lists
    message = _refused_fast(path)
    assert f"nested deeper than {MAX_DEPTH} levels" in message and "recursion" not in message


def test_a_9mb_config_is_refused_by_its_size_before_parsing(tmp_path, capsys):
    path = tmp_path / "big.yaml"
    entry = "  - {_target_: sss.callbacks.EarlyStopping, patience: 3}\n"
    path.write_text("callbacks:\n" + entry * 200_000)
    assert path.stat().st_size > 9_000_000
    message = _refused_fast(path)
    assert f"sss reads config files of at most {MAX_BYTES // 1_000_000} MB" in message
    assert main(["check", str(path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_many_values_under_the_size_limit_are_refused_by_count(tmp_path):
    path = tmp_path / "many.yaml"
    path.write_text("callbacks:\n" + "  - {_target_: sss.callbacks.EarlyStopping, patience: 3}\n" * 5000)
    assert path.stat().st_size < MAX_BYTES
    assert f"more than {MAX_NODES:,} values" in _refused_fast(path)


def test_a_stored_config_is_held_to_the_same_limits(tmp_path):
    from sss.run.evaluate import load_stored_config

    ckpt = tmp_path / "step_0000004"
    ckpt.mkdir()
    many = json.dumps({"callbacks": [{"_target_": "sss.callbacks.EarlyStopping"}] * 5000})
    deep = '{"model": {"x": ' + "[" * 200 + "]" * 200 + "}}"  # deeper than sss's limit, within json's own
    for stored, expected in (
        (many, f"more than {MAX_NODES:,} values"),
        (deep, f"nests deeper than {MAX_DEPTH} levels"),
    ):
        (ckpt / "trainer_state.json").write_text('{"config": ' + stored + "}")
        with pytest.raises(ConfigError, match=expected):
            load_stored_config(ckpt)
    (ckpt / "trainer_state.json").write_text('{"config": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError, match="not a readable checkpoint record"):  # json's own recursion limit
        load_stored_config(ckpt)


@pytest.mark.parametrize("item", ["trainer.max_steps=", "name=", "trainer.seed=  "])
def test_an_empty_override_value_is_refused_naming_the_key(tmp_path, capsys, item):
    key = item.split("=")[0]
    with pytest.raises(ConfigError, match=rf"override '{item}': {key} has an empty value"):
        load_config(None, [item])
    config = tmp_path / "c.yaml"
    config.write_text(GOOD)
    assert main(["check", str(config), item]) == 2
    assert f"{key} has an empty value" in capsys.readouterr().err


def test_an_explicit_null_and_empty_string_still_work():
    assert load_config(None, ["trainer.max_steps=null"]).trainer.max_steps is None
    assert load_config(None, ["name=''"]).name == "run"  # an empty name: the default
