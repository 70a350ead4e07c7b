"""`ManifestDataModule` on `data.layout: shards | hf`: splits, summary, loaders, and the options `sss check` refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from sss.cli import main
from sss.data import ManifestDataModule, make_industrial
from sss.data.records import SourceDataset
from sss.data.shards import pack
from sss.data.stream import StreamDataset
from sss.testing import hub_parquet

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "manifest.yaml")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("records")
    src = make_industrial(base / "ind", n_train=16, n_val=8, n_test=0, image_size=32)
    pack(src, base / "shards", shard_size=4)
    hub_parquet(src, base / "hub", files=2, row_group=4)
    return src, base / "shards", base / "hub"


@pytest.mark.parametrize(("layout", "streaming"), [("shards", False), ("hf", True), ("hf", False)])
def test_record_layouts_give_the_manifests_batches(folders, layout, streaming, capsys):
    src, shards, hub = folders
    dm = ManifestDataModule(shards if layout == "shards" else hub, layout=layout, streaming=streaming, batch_size=4)
    assert dm.classes == ["idle", "fault", "passerby", "collision"]  # before setup, from the index or the footers
    dm.setup("fit")
    assert f"({layout}): 4 classes (multiclass), image+audio" in capsys.readouterr().out
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert isinstance(train.dataset, StreamDataset if layout == "shards" or streaming else SourceDataset)
    assert isinstance(val.dataset, SourceDataset)  # evaluation stays map-style: Accelerate pads and de-duplicates
    reference = ManifestDataModule(src, batch_size=4, augment=False)
    reference.setup("fit")
    got, want = next(iter(val)), next(iter(reference.val_dataloader()))
    for key in ("image", "audio", "label"):  # the same decoders: the same tensors
        assert (got[key] == want[key]).all(), key
    assert sorted(i for b in train for i in b["index"].tolist()) == list(range(16))


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["data.streaming=true"], "data.streaming=true reads data.layout=hf as a stream"),
        (["data.layout=shards", "data.cache=features"], "data.cache=features stores a manifest's decoded files"),
        (["data.layout=shards", "data.columns={audio: wav}"], "data.columns maps the columns of data.layout=hf"),
        (["data.layout=hf", "data.columns=[wav]"], "data.columns: expected a mapping (key: value) or null"),
        (["data.layout=hf", "data.columns={audio: [1]}"], "data.columns: entry 'audio': [1] is not a string"),
        (["data.layout=tar"], "data.layout: must be one of"),
    ],
)
def test_sss_check_refuses_record_options_that_do_not_fit_naming_the_key(words, message, capsys):
    assert main(["check", EXAMPLE, "data.root=/nowhere", *words]) == 2
    assert message in capsys.readouterr().err


def _corrupt_member(root: Path) -> str:
    import json

    index = json.loads((root / "shards.json").read_text())
    shard = index["splits"]["train"]["shards"][1]
    offset, size, _ = shard["index"][2]["members"]["wav"]
    path = root / shard["file"]
    data = bytearray(path.read_bytes())
    data[offset + size // 2] ^= 0xFF  # one flipped byte inside the clip's data
    path.write_bytes(bytes(data))
    return shard["file"]


def _damage(kind: str, tmp_path: Path, folders) -> tuple[dict, str]:
    import shutil

    _, shards, hub = folders
    if kind == "hub":
        root = shutil.copytree(hub, tmp_path / "hub")
        part = root / "data" / "train-00001-of-00002.parquet"
        part.write_bytes(part.read_bytes()[:-40])  # the footer cut off: a download that stopped
        return {"root": root, "layout": "hf", "streaming": True}, "train-00001-of-00002.parquet"
    root = shutil.copytree(shards, tmp_path / "shards")
    if kind == "missing":
        (root / "train-000002.tar").unlink()
        return {"root": root, "layout": "shards"}, "train-000002.tar: is missing"
    return {"root": root, "layout": "shards"}, f"{_corrupt_member(root)}, sample 2"


@pytest.mark.parametrize("kind", ["corrupt", "missing", "hub"])
def test_a_corrupt_member_a_missing_shard_and_a_truncated_parquet_raise_or_are_skipped(kind, folders, tmp_path):
    from sss import SSSTrainer
    from sss.data.errors import DataError
    from sss.models import create_model

    settings, names = _damage(kind, tmp_path, folders)

    def fit(on_error: str) -> ManifestDataModule:
        dm = ManifestDataModule(**settings, batch_size=4, image_size=32, on_error=on_error)
        trainer = SSSTrainer(
            max_epochs=1, cpu=True, log={"progress": False, "trackers": []}, output_dir=str(tmp_path / "r")
        )
        trainer.fit(create_model("hunter_tiny", num_classes=4), dm)
        return dm

    with pytest.raises(DataError, match=names.replace(".", r"\.")):
        fit("raise")
    skipped = fit("skip").skipped
    assert len(skipped) == 1 and names.split(":")[0].split(",")[0] in skipped[0]["file"], skipped


def test_hf_without_pyarrow_says_which_extra_to_install(folders, monkeypatch):
    import sys

    from sss.config.errors import ConfigError

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as in an install without the datasets extra
    with pytest.raises(ConfigError, match=r"pip install 'shadow-sound-hunter\[datasets\]'"):
        ManifestDataModule(folders[2], layout="hf").setup("fit")
