"""A model folder's or checkpoint's config is data: nothing in it is resolved, and it opens no file outside the folder.

Each refusal is checked where it matters: the secret never appears in any output, and an audit
hook on ``open`` shows that the file outside the folder is never opened (not only the message).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

import sss
from sss.cli import main
from sss.config import ConfigError, SSSConfig
from sss.model_folder import check_model_folder, export_model, load_folder_config
from sss.models import create_model
from sss.run.evaluate import load_stored_config

HUNTER = {"_target_": "sss.models.create_model", "name": "hunter_tiny", "num_classes": 4}
SECRET = "hf_NOT_A_REAL_TOKEN_4242"

_OPENED: list[str] = []  # paths the audit hook saw opened (hooks cannot be removed: it stays cheap)
_WATCHED: list[str] = []  # path fragments being watched right now


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _WATCHED and isinstance(args[0], str | bytes | Path):
        path = str(args[0] if not isinstance(args[0], bytes) else args[0].decode(errors="replace"))
        if any(fragment in path for fragment in _WATCHED):
            _OPENED.append(path)


sys.addaudithook(_audit)


@pytest.fixture
def opened(tmp_path):
    """Records every ``open`` of a file under ``tmp_path/outside`` (the probe's own positive control first)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    _WATCHED.append(str(outside))
    _OPENED.clear()
    (outside / "probe.txt").write_text("x")
    (outside / "probe.txt").read_text()  # the probe sees an open in this very folder
    assert _OPENED, "the audit hook on open records nothing: the test could not fail"
    _OPENED.clear()
    yield _OPENED
    _WATCHED.remove(str(outside))


def _folder(tmp_path: Path, **extra) -> Path:
    torch.manual_seed(0)
    folder = export_model(
        create_model("hunter_tiny", num_classes=4), SSSConfig(name="h", model=dict(HUNTER)), {}, tmp_path / "m"
    )
    path = folder / "config.yaml"
    data = yaml.safe_load(path.read_text())
    data["model"].update(extra)
    path.write_text(yaml.safe_dump(data))
    return folder


def _weights_file(path: Path) -> Path:
    # Real weights of the folder's backbone: timm would load them without a word.
    torch.save(create_model("hunter_tiny", num_classes=4).image_encoder.model.state_dict(), path)
    return path


def test_an_env_resolver_is_refused_naming_file_and_key_never_the_value(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SSS_TEST_TOKEN", SECRET)
    folder = _folder(tmp_path, name="${oc.env:SSS_TEST_TOKEN}")
    for trust in (False, True):  # trust_code concerns code, not values
        with pytest.raises(ConfigError, match=r"config\.yaml: model\.name: holds an interpolation") as info:
            sss.load_model(folder, trust_code=trust)
        assert SECRET not in str(info.value)
    assert main(["check", str(folder)]) == 2
    assert (
        main(["predict", str(folder), "--input", str(tmp_path / "rows.csv"), "--output", str(tmp_path / "p.csv")]) == 2
    )
    assert main(["validate", "--ckpt", str(folder)]) == 2
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 3 and all(f"{folder / 'config.yaml'}: model.name: holds an interpolation" in x for x in lines)
    assert check_model_folder(folder)[0].startswith(f"{folder / 'config.yaml'}: model.name:")


@pytest.mark.parametrize(
    "where",
    [
        {"num_classes": "${oc.env:SSS_TEST_TOKEN}"},  # a resolver in any key of the model
        {"image_kwargs": {"stem_width": "${trainer.seed}"}},  # a plain interpolation, nested
        {"metrics": ["accuracy", "${oc.env:SSS_TEST_TOKEN,x}"]},  # in a list
    ],
)
def test_every_interpolation_in_a_folder_is_refused(tmp_path, monkeypatch, where):
    monkeypatch.setenv("SSS_TEST_TOKEN", SECRET)
    folder = _folder(tmp_path, **where)
    with pytest.raises(ConfigError, match="holds an interpolation") as info:
        load_folder_config(folder)
    assert SECRET not in str(info.value) and "model." in str(info.value)


def test_a_checkpoints_stored_config_is_not_resolved(tmp_path, monkeypatch):
    monkeypatch.setenv("SSS_TEST_TOKEN", SECRET)
    ckpt = tmp_path / "step_0000004"
    ckpt.mkdir()
    stored = {"name": "${oc.env:SSS_TEST_TOKEN}", "model": {"_target_": "sss.testing.BoringModule"}}
    (ckpt / "trainer_state.json").write_text(json.dumps({"config": stored}))
    with pytest.raises(ConfigError, match=r"trainer_state\.json: name: holds an interpolation") as info:
        load_stored_config(ckpt, trust_code=True)
    assert SECRET not in str(info.value)


def test_your_own_config_still_interpolates(tmp_path, monkeypatch):
    # A config you pass is yours, as for sss fit: interpolation stays what OmegaConf gives it.
    monkeypatch.setenv("SSS_TEST_TOKEN", "mine")
    config = tmp_path / "mine.yaml"
    config.write_text("name: ${oc.env:SSS_TEST_TOKEN}\n")
    assert sss.load_config(config).name == "mine"


def test_a_pretrained_path_outside_the_folder_is_dropped_and_never_opened(tmp_path, opened):
    outside = _weights_file(tmp_path / "outside" / "backbone.pth")
    clean = sss.load_model(_folder(tmp_path / "clean"))
    folder = _folder(tmp_path, image_pretrained=str(outside))
    loaded = sss.load_model(folder)
    assert opened == []
    for a, b in zip(loaded.state_dict().values(), clean.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # the folder's own weights, as without the setting
    assert "image_pretrained" not in load_folder_config(folder).model
    assert check_model_folder(folder) == []
    assert opened == []


@pytest.mark.parametrize(
    "extra",
    [
        lambda out: {"image_kwargs": {"checkpoint_path": str(out)}},
        lambda out: {"image_kwargs": {"pretrained_cfg_overlay": {"file": str(out)}}},
        lambda out: {"image_kwargs": {"pretrained_file": str(out)}},
        lambda out: {"image_kwargs": {"cache_dir": str(out.parent)}},
        lambda out: {"image_kwargs": {"some_path": f"../{out.parent.name}/{out.name}"}},
    ],
    ids=["checkpoint_path", "pretrained_cfg_overlay", "pretrained_file", "cache_dir", "relative-dotdot"],
)
def test_a_file_named_by_a_model_argument_is_refused_and_never_opened(tmp_path, opened, capsys, extra):
    outside = _weights_file(tmp_path / "outside" / "evil.pth")
    folder = _folder(tmp_path, **extra(outside))
    for trust in (False, True):
        with pytest.raises(ConfigError, match=r"config\.yaml: model\.image_kwargs\.\w+ names a file") as info:
            sss.load_model(folder, trust_code=trust)
        assert "model.safetensors" in str(info.value)
    assert main(["check", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.image_kwargs." in err[0] and "names a file" in err[0]
    assert opened == []


def test_the_drop_leaves_a_trusted_config_alone(tmp_path):
    # Your own config keeps its pretrained setting (sss fit with a local backbone file).
    config = tmp_path / "mine.yaml"
    config.write_text(
        f"model: {{_target_: sss.models.create_model, name: hunter_tiny, image_pretrained: {tmp_path}/w.pth}}\n"
    )
    assert sss.load_config(config).model["image_pretrained"] == f"{tmp_path}/w.pth"
