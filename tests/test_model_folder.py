"""Model folders are data: loading one runs no code sss does not ship, and exporting one leaks no local path."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

import sss
from sss.cli import main
from sss.config import SSSConfig, load_config
from sss.model_folder import (
    DamagedModelFolderError,
    UntrustedCodeError,
    check_model_folder,
    export_model,
    read_preprocessing,
    require_complete,
    untrusted_targets,
)
from sss.models import create_model
from sss.testing import BoringModule, boring_loader

HUNTER = {"_target_": "sss.models.create_model", "name": "hunter_tiny", "num_classes": 4}


@pytest.fixture
def probe_modules(tmp_path, monkeypatch):
    """A folder on sys.path for modules a test writes; they are forgotten again afterwards."""
    folder = tmp_path / "probe_modules"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    names: list[str] = []

    def write(name: str, source: str) -> None:
        (folder / f"{name}.py").write_text(source)
        names.append(name)

    yield write
    for name in names:
        sys.modules.pop(name, None)


def _hunter_folder(tmp_path: Path, name: str = "hunter") -> Path:
    torch.manual_seed(0)
    cfg = SSSConfig(name=name, model=dict(HUNTER))
    return export_model(create_model("hunter_tiny", num_classes=4), cfg, {}, tmp_path / name)


def _edit_model(folder: Path, **extra) -> None:
    """What an attacker does to a published folder: add arguments to the model spec of config.yaml."""
    path = folder / "config.yaml"
    data = yaml.safe_load(path.read_text())
    data["model"].update(extra)
    path.write_text(yaml.safe_dump(data))


def _system_folder(tmp_path: Path) -> tuple[Path, Path]:
    # The reported hole: a nested _target_ in image_kwargs that runs a shell command.
    folder, marker = _hunter_folder(tmp_path), tmp_path / "pwned"
    system = {"_target_": "os.system", "command": f"touch {marker}"}  # returns 0: a valid drop_rate
    _edit_model(folder, image_kwargs={"channels": [8, 16, 32, 64], "stem_width": 8, "drop_rate": system})
    return folder, marker


def test_load_model_refuses_a_nested_os_system_and_runs_nothing(tmp_path):
    folder, marker = _system_folder(tmp_path)
    with pytest.raises(UntrustedCodeError) as info:
        sss.load_model(folder)
    message = str(info.value)
    assert "model.image_kwargs.drop_rate._target_: os.system" in message
    assert "trust_code=True" in message and "--trust-code" in message and "Nothing was imported" in message
    assert info.value.targets == [("model.image_kwargs.drop_rate._target_", "os.system")]
    assert not marker.exists()
    # negative control: what the check stands between. trust_code=True builds it, and the command runs.
    sss.load_model(folder, trust_code=True)
    assert marker.exists()


def test_sss_predict_refuses_it_and_writes_nothing(tmp_path, capsys):
    folder, marker = _system_folder(tmp_path)
    output = tmp_path / "preds.csv"
    assert main(["predict", str(folder), "--input", str(tmp_path / "rows.csv"), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert "model.image_kwargs.drop_rate._target_: os.system" in err and "--trust-code" in err
    assert not marker.exists() and not output.exists()


def test_sss_check_on_a_folder_reports_the_names_and_runs_nothing(tmp_path, capsys):
    clean = _hunter_folder(tmp_path, "clean")
    assert main(["check", str(clean)]) == 0, capsys.readouterr().err
    assert "ok (model folder" in capsys.readouterr().out
    folder, marker = _system_folder(tmp_path)
    assert main(["check", str(folder)]) == 2
    captured = capsys.readouterr()
    assert "model.image_kwargs.drop_rate._target_: os.system" in captured.err and "ok" not in captured.out
    assert not marker.exists()
    assert main(["check", str(tmp_path)]) == 2  # not a model folder at all
    assert "model.safetensors, config.yaml missing" in capsys.readouterr().err


def test_a_target_in_a_list_is_found_and_its_module_is_never_imported(tmp_path, probe_modules):
    marker = tmp_path / "imported"
    probe_modules("sss_probe_on_import", f"open({str(marker)!r}, 'w').close()\n\ndef thing(**kwargs):\n    return 0\n")
    folder = _hunter_folder(tmp_path)
    _edit_model(folder, audio_kwargs={"blocks": [1, {"_target_": "sss_probe_on_import.thing"}]})
    with pytest.raises(UntrustedCodeError, match=r"model\.audio_kwargs\.blocks\[1\]\._target_: sss_probe_on_import"):
        sss.load_model(folder)
    assert check_model_folder(folder) and not marker.exists() and "sss_probe_on_import" not in sys.modules
    # negative control: a plain import of that module does write the marker
    __import__("sss_probe_on_import")
    assert marker.exists()


def test_every_target_is_listed_and_a_non_string_target_is_untrusted():
    spec = {
        "_target_": "my_pkg.Model",
        "parts": [{"_target_": "builtins.exec", "source": "print(1)"}, {"inner": {"_target_": ["os", "system"]}}],
        "fine": {"_target_": "sss.models.LateFusion"},
    }
    assert untrusted_targets(spec) == [
        ("model._target_", "my_pkg.Model"),
        ("model.parts[0]._target_", "builtins.exec"),
        ("model.parts[1].inner._target_", ["os", "system"]),
    ]


def test_trust_code_loads_a_user_class(tmp_path, probe_modules):
    probe_modules(
        "sss_probe_user_models",
        "import torch\n\nclass TinyNet(torch.nn.Module):\n    def __init__(self, dim: int = 3):\n"
        "        super().__init__()\n        self.layer = torch.nn.Linear(dim, 2)\n",
    )
    from sss_probe_user_models import TinyNet

    module = TinyNet(dim=5)
    cfg = SSSConfig(name="user", model={"_target_": "sss_probe_user_models.TinyNet", "dim": 5})
    folder = export_model(module, cfg, {}, tmp_path / "user")
    with pytest.raises(UntrustedCodeError, match=r"model\._target_: sss_probe_user_models\.TinyNet"):
        sss.load_model(folder)
    loaded = sss.load_model(folder, trust_code=True)
    assert isinstance(loaded, TinyNet) and torch.equal(loaded.layer.weight, module.layer.weight)


def test_a_clean_boring_folder_loads_and_predicts_as_before(tmp_path, capsys):
    module = BoringModule(dim=8).eval()
    cfg = SSSConfig(name="boring", model={"_target_": "sss.testing.BoringModule", "dim": 8})
    folder = export_model(module, cfg, {}, tmp_path / "boring")
    assert check_model_folder(folder) == []
    batch = next(iter(boring_loader(n=8, batch_size=8)))
    with torch.no_grad():
        torch.testing.assert_close(sss.load_model(folder)(batch), module(batch), rtol=0, atol=0)
    assert main(["check", str(folder)]) == 0


def test_a_clean_hunter_folder_loads_and_predicts_as_before(tmp_path, capsys):
    root = sss.data.make_industrial(tmp_path / "industrial", n_train=4, n_val=4, n_test=0)
    classes = (root / "classes.txt").read_text().split()
    data = SimpleNamespace(classes=classes, task="multiclass", image_size=64, sample_rate=16000, clip_seconds=1.0)
    torch.manual_seed(0)
    module = create_model("hunter_tiny", num_classes=len(classes))
    folder = export_model(module, SSSConfig(name="hunter", model=dict(HUNTER)), {}, tmp_path / "hunter", data)
    loaded = sss.load_model(folder)
    for a, b in zip(loaded.state_dict().values(), module.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    rows = (root / "val.csv").read_text().splitlines()
    (root / "unlabelled.csv").write_text("\n".join(",".join(r.split(",")[:2]) for r in rows) + "\n")
    output = tmp_path / "preds.csv"
    assert main(["predict", str(folder), "--input", str(root / "unlabelled.csv"), "--output", str(output)]) == 0
    with output.open() as f:
        preds = list(csv.DictReader(f))
    assert len(preds) == len(rows) - 1
    for row in preds:
        probs = [float(row[f"prob_{c}"]) for c in classes]
        assert abs(sum(probs) - 1) < 1e-4 and row["prediction"] == classes[probs.index(max(probs))]


def test_exported_config_and_card_carry_no_local_path(tmp_path):
    weights = tmp_path / "pretrained" / "resnet.safetensors"  # a local pretrained file: absent on the reader's disk
    cfg = SSSConfig(
        name="leak",
        model={**HUNTER, "image_pretrained": str(weights)},
        data={"_target_": "sss.data.IndustrialDataModule", "root": str(tmp_path / "data"), "cache_dir": "~/cache"},
    )
    cfg.trainer.output_dir = str(tmp_path / "run")
    folder = export_model(create_model("hunter_tiny", num_classes=4), cfg, {"val/accuracy": 0.5}, tmp_path / "m")
    text, card = (folder / "config.yaml").read_text(), (folder / "README.md").read_text()
    for written in (text, card):
        assert str(tmp_path) not in written and "~/cache" not in written
    header = text.splitlines()[0]
    assert header.startswith("# Local absolute paths were left out")
    assert all(key in header for key in ("data.root", "data.cache_dir", "model.image_pretrained", "trainer.output_dir"))
    assert "(local paths left out: trainer.output_dir, model.image_pretrained, data.root, data.cache_dir)" in card
    saved = load_config(folder / "config.yaml")
    assert saved.data["root"] is None and saved.model["image_pretrained"] is None
    assert saved.trainer.output_dir == "runs/leak"  # null falls back to the default, relative
    assert saved.trainer.seed == cfg.trainer.seed and saved.model["name"] == "hunter_tiny"
    sss.load_model(folder)  # needs neither the data nor the local pretrained file


def test_sss_check_lists_what_a_training_config_calls(tmp_path, capsys):
    config = tmp_path / "mine.yaml"
    config.write_text(
        "model: {_target_: sss.models.create_model, name: hunter_tiny, num_classes: 4}\n"
        "data: {_target_: sss.data.IndustrialDataModule, n_train: 16}\n"
        "callbacks:\n  - {_target_: sss.callbacks.ModelSummary, image_size: 64}\n"
    )
    assert main(["check", str(config)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    for line in (
        "model._target_: sss.models.create_model",
        "data._target_: sss.data.IndustrialDataModule",
        "trainer.optim.optimizer._target_: torch.optim.AdamW",
        "callbacks[0]._target_: sss.callbacks.ModelSummary",
    ):
        assert f"  {line}\n" in out, out
    assert "imports and calls each _target_" in out


@pytest.mark.parametrize("name", ["preprocessing.json", "README.md", "model.safetensors", "config.yaml"])
def test_a_folder_missing_a_file_it_needs_is_damaged_for_sss_check(tmp_path, capsys, name):
    cfg = SSSConfig(name="boring", model={"_target_": "sss.testing.BoringModule"})
    folder = export_model(BoringModule(), cfg, {}, tmp_path / "boring")
    assert main(["check", str(folder)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    (folder / name).unlink()
    assert main(["check", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{folder} is a damaged model folder: {name} is missing (" in err[0]
    with pytest.raises(DamagedModelFolderError, match=rf"{name} is missing") as info:
        require_complete(folder)
    assert info.value.exit_code == 1 and isinstance(info.value, FileNotFoundError)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "not readable JSON"),
        ('["a", "b"]', "expected a JSON object, got list"),
        ('{"classes": "a,b"}', "classes: expected a list of class names or null"),
        ('{"classes": null, "image_size": -3}', "image_size: expected a positive number or null, got -3"),
    ],
)
def test_a_preprocessing_file_that_does_not_read_is_damaged(tmp_path, capsys, text, problem):
    cfg = SSSConfig(name="boring", model={"_target_": "sss.testing.BoringModule"})
    folder = export_model(BoringModule(), cfg, {}, tmp_path / "boring")
    (folder / "preprocessing.json").write_text(text)
    assert main(["check", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'preprocessing.json'}: {problem}" in err and "the model folder is damaged" in err
    with pytest.raises(DamagedModelFolderError, match=problem):
        read_preprocessing(folder)


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_sss_predict_refuses_a_folder_without_its_preprocessing_and_writes_nothing(tmp_path, capsys, runtime):
    # Without preprocessing.json predict would decode the input with default settings: wrong, silently.
    root = sss.data.make_industrial(tmp_path / "industrial", n_train=4, n_val=4, n_test=0)
    folder = _hunter_folder(tmp_path)
    (folder / "preprocessing.json").unlink()
    output = tmp_path / "preds.csv"
    argv = ["predict", str(folder), "--input", str(root / "val.csv"), "--output", str(output), "--runtime", runtime]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{folder} is a damaged model folder: preprocessing.json is missing (" in err[0]
    assert not output.exists() and not output.with_name("preds.csv.partial").exists()


def test_sss_check_on_a_folder_refuses_the_model_values_fit_would(tmp_path, capsys):
    folder = _hunter_folder(tmp_path)
    assert main(["check", str(folder)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    _edit_model(folder, dim=30, heads=4)
    assert main(["check", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(folder / "config.yaml") in err[0] and "heads" in err[0], err
