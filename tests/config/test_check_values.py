"""`sss check` refuses the model and data values `sss fit` would refuse after reading the data (issue #29, item 4).

Each value is refused by ``sss check`` (exit 2, one ``error:`` line naming the key) and by ``sss fit`` with the
same line, before any data module reads anything (its ``setup`` is recorded, and the manifest cases point at a
data root that does not exist). The number of classes, which needs the data module's class list, is refused as
soon as that list is known and before any training step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sss.cli import main
from sss.config import ConfigError, check_config, load_config
from sss.models import HunterModule, create_model
from sss.run.parts import build_parts, check_num_classes, sizes_from_data

ROOT = Path(__file__).parents[2]
INDUSTRIAL = str(ROOT / "examples" / "industrial.yaml")  # hunter_small, 4 classes fixed, IndustrialDataModule
MANIFEST = str(ROOT / "examples" / "manifest.yaml")
NO_ROOT = "data.root=no-such-folder"  # a fit that got as far as reading the data would end with exit 1 there

# (case id, example config, overrides, the key the one error line names, a phrase it holds)
CASES = [
    ("unknown fusion", INDUSTRIAL, ["model.fusion=bogus"], "model.fusion", "choose one of bottleneck"),
    ("unknown audio encoder", INDUSTRIAL, ["model.audio_encoder=wavenet"], "model.audio_encoder", "ast, cnn"),
    ("zero width", INDUSTRIAL, ["model.dim=0"], "model.dim", "must be >= 1"),
    ("negative width", INDUSTRIAL, ["model.dim=-8"], "model.dim", "must be >= 1"),
    ("no heads", INDUSTRIAL, ["model.heads=0"], "model.heads", "must be >= 1"),
    ("width not divisible by heads", INDUSTRIAL, ["model.dim=30", "model.heads=4"], "model.dim", "divisible"),
    ("no mel bins", INDUSTRIAL, ["model.n_mels=0"], "model.n_mels", "must be >= 1"),
    ("data rate 1 Hz", INDUSTRIAL, ["data.sample_rate=1"], "data.sample_rate", "model.sample_rate=16000"),
    (
        "both rates below the front-end's least",
        INDUSTRIAL,
        ["model.sample_rate=50", "data.sample_rate=50"],
        "model.sample_rate",
        "below 100 Hz",
    ),
    ("an endless clip", INDUSTRIAL, ["data.clip_seconds=1e9"], "data.clip_seconds", "must be <= 3600"),
    ("a huge image", INDUSTRIAL, ["data.image_size=100000"], "data.image_size", "must be <= 4096"),
    ("manifest: an endless clip", MANIFEST, [NO_ROOT, "data.clip_seconds=1e9"], "data.clip_seconds", "<= 3600"),
    ("manifest: a huge image", MANIFEST, [NO_ROOT, "data.image_size=100000"], "data.image_size", "<= 4096"),
    ("manifest: unknown fusion", MANIFEST, [NO_ROOT, "model.fusion=early"], "model.fusion", "choose one of"),
    ("manifest: data rate 1 Hz", MANIFEST, [NO_ROOT, "data.sample_rate=1"], "data.sample_rate", "differs from"),
]


@pytest.fixture
def no_data(monkeypatch):
    """Records every data module's setup (where data is read or made): a case that gets there fails the test."""
    import sss.data

    calls = []
    for cls in (sss.data.ManifestDataModule, sss.data.IndustrialDataModule):
        monkeypatch.setattr(cls, "setup", lambda self, stage, cls=cls: calls.append(cls.__name__))
    return calls


def _one_error_line(err: str, key: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert f": {key}" in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(("case", "config", "overrides", "key", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_model_or_data_value_is_refused_by_check_and_by_fit_before_the_data(
    case, config, overrides, key, phrase, capsys, no_data
):
    assert main(["check", config, *overrides]) == 2
    checked = _one_error_line(capsys.readouterr().err, key)
    assert phrase in checked, checked
    assert main(["fit", config, *overrides, "trainer.log.progress=false"]) == 2
    fitted = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert fitted == [checked]  # the same line, word for word
    assert no_data == []


def test_the_examples_and_valid_model_values_still_pass(capsys):
    # Negative control: without the bad value each case's config passes, so the refusal is the value's.
    assert main(["check", INDUSTRIAL]) == 0
    assert main(["check", MANIFEST, NO_ROOT]) == 0
    capsys.readouterr()
    fine = [
        "model.dim=48",  # hunter_small's 4 heads divide 48
        "model.fusion=late",
        "model.audio_encoder=ast",
        "model.sample_rate=22050",
        "data.sample_rate=22050",
        "data.image_size=4096",
        "data.clip_seconds=3600",
    ]
    assert check_config(load_config(INDUSTRIAL, fine)) == []
    assert check_config(load_config(MANIFEST, [NO_ROOT, "data.clip_seconds=null"])) == []
    # the variant's own defaults count: hunter_tiny has 2 heads, so 30 wide is fine there and not on hunter_small
    tiny = [f"model.{k}" for k in ("name=hunter_tiny", "dim=30")]
    assert check_config(load_config(INDUSTRIAL, tiny)) == []
    assert check_config(load_config(INDUSTRIAL, ["model.dim=30"])) == [
        "model.dim: dim=30 must be divisible by heads=4 (model.dim / model.heads)"
    ]


def test_a_variant_registered_elsewhere_is_judged_by_the_signature_only():
    # Its own defaults (here dim 60) are not known to the check: it must not judge them by HunterModule's (128).
    from sss.models import register_model, registry

    @register_model
    def sixty_wide_test_variant(**overrides) -> HunterModule:
        return HunterModule(**{"dim": 60, **overrides})

    try:
        assert check_config(load_config(INDUSTRIAL, ["model.name=sixty_wide_test_variant", "model.heads=6"])) == []
        refused = check_config(load_config(INDUSTRIAL, ["model.name=sixty_wide_test_variant", "model.dim=0"]))
        assert refused == ["model.dim: must be >= 1, got 0"]  # the signature's range still applies
    finally:
        del registry._REGISTRY["sixty_wide_test_variant"]


def test_the_constructor_refuses_in_the_words_of_the_check():
    for overrides, key in [({"dim": 0}, "dim"), ({"sample_rate": 50}, "sample_rate"), ({"fusion": "x"}, "fusion")]:
        with pytest.raises(ValueError) as caught:
            create_model("hunter_tiny", **overrides)
        settings = HunterModule.resolve_settings(overrides, variant="hunter_tiny")
        assert HunterModule.setting_problems(settings) == [(key, str(caught.value))]


def _manifest_root(tmp_path: Path, labels: list[str]) -> Path:
    # A manifest whose files do not exist: only its class list can be read, as a data module does when built.
    root = tmp_path / "data"
    root.mkdir()
    rows = "".join(f"clip{i}.wav,{label}\n" for i, label in enumerate(labels * 2))
    (root / "train.csv").write_text("audio,label\n" + rows)
    return root


def test_num_classes_against_the_data_is_refused_before_any_step(tmp_path, capsys, no_data):
    root = _manifest_root(tmp_path, ["cat", "dog", "owl", "rain"])
    overrides = [f"data.root={root}", "model.num_classes=3", "trainer.log.progress=false"]
    assert main(["check", MANIFEST, *overrides]) == 0  # the class count needs the data's class list
    capsys.readouterr()
    assert main(["fit", MANIFEST, *overrides]) == 2  # today: IndexError: Target 3 is out of bounds, mid-epoch
    line = _one_error_line(capsys.readouterr().err, "model.num_classes")
    assert "model.num_classes=3, but the data has 4 classes (cat, dog, owl, rain)" in line
    assert "add model.num_classes=4" in line
    assert no_data == []  # refused before the data module read any file


def test_an_example_that_fixes_num_classes_with_a_task_of_another_count_gets_the_fix(capsys, no_data):
    # examples/industrial.yaml fixes num_classes: 4; the binding task has 2 classes
    assert main(["fit", INDUSTRIAL, "data.task=binding", "trainer.log.progress=false"]) == 2
    line = _one_error_line(capsys.readouterr().err, "model.num_classes")
    assert "model.num_classes=4, but the data has 2 classes (mismatch, match): add model.num_classes=2" in line
    assert no_data == []  # nothing generated
    assert not any(Path("cache").glob("**/train.csv"))


def test_a_class_list_known_only_after_setup_is_checked_before_the_model_is_built(monkeypatch):
    import sss.testing

    built = []
    monkeypatch.setattr(
        sss.testing.BoringDataModule, "setup", lambda self, stage: setattr(self, "classes", list("abc"))
    )
    monkeypatch.setattr(sss.testing.BoringModule, "__init__", lambda self, **k: built.append(k))
    parts = ["model._target_=sss.testing.BoringModule", "data._target_=sss.testing.BoringDataModule"]
    with pytest.raises(ConfigError, match=r"model.num_classes=2, but the data has 3 classes \(a, b, c\)"):
        build_parts(load_config(None, [*parts, "model.num_classes=2"]))
    assert built == []


def test_num_classes_null_takes_the_data_count_and_a_matching_count_passes():
    from types import SimpleNamespace

    data = SimpleNamespace(classes=["x", "y", "z"])

    spec = {"_target_": "sss.models.create_model", "name": "hunter_tiny", "num_classes": None}
    assert sizes_from_data(spec, data)["num_classes"] == 3  # not the variant's default 4
    check_num_classes({"num_classes": 3}, data)
    check_num_classes({"num_classes": 7}, object())  # no class list: nothing to compare with
