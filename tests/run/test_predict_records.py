"""``sss predict`` over tar shards and Hugging Face datasets: the same probabilities as over the manifest they hold."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import torch

from sss.cli import main
from sss.config import SSSConfig
from sss.data import DataError, make_industrial
from sss.data.shards import pack
from sss.data.synthetic import CLASSES
from sss.model_folder import export_model
from sss.models import create_model
from sss.run.predict import predict
from sss.testing import hub_parquet

PROBS = [f"prob_{c}" for c in CLASSES]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    # One manifest folder (test: 5 rows, val: 3) as itself, as shards of 2 and as Hub Parquet (row groups of 2),
    # and a tiny hunter model folder whose BatchNorm statistics are away from their init (distinct rows).
    root = tmp_path_factory.mktemp("predict-records")
    data = make_industrial(root / "data", n_train=2, n_val=3, n_test=5, seed=3)
    with contextlib.redirect_stdout(io.StringIO()):
        pack(data, root / "shards", shard_size=2)
    hub_parquet(data, root / "hub", files=2, row_group=2)
    torch.manual_seed(0)
    module = create_model("hunter_tiny", num_classes=len(CLASSES)).eval()
    with torch.no_grad():
        for name, buf in module.named_buffers():
            if name.endswith("running_mean"):
                buf.normal_(0, 0.5)
    spec = {"_target_": "sss.models.create_model", "name": "hunter_tiny", "num_classes": len(CLASSES)}
    # Not the decoders' defaults (64 px, 1 s): a record path that forgot preprocessing.json would decode otherwise.
    settings = SimpleNamespace(classes=list(CLASSES), task=None, image_size=48, sample_rate=16000, clip_seconds=0.75)
    model = export_model(module, SSSConfig(name="tiny", model=spec), {}, root / "model", settings)
    return SimpleNamespace(data=data, shards=root / "shards", hub=root / "hub", model=model, root=root)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _probs(rows: list[dict[str, str]]) -> list[list[str]]:
    return [[row["prediction"], *(row[k] for k in PROBS)] for row in rows]


def test_shards_and_hub_parquet_give_the_manifest_probabilities_in_order(inputs, tmp_path, capsys):
    manifest = _rows(predict(inputs.model, inputs.data / "test.csv", tmp_path / "manifest.csv", batch_size=3))
    shards = _rows(predict(inputs.model, inputs.shards, tmp_path / "shards.csv", batch_size=3))
    said = capsys.readouterr().out
    hub = _rows(predict(inputs.model, inputs.hub, tmp_path / "hub.csv", batch_size=3))
    assert len(manifest) == 5 and len({tuple(p) for p in _probs(manifest)}) == 5  # rows tell apart: order counts
    assert _probs(shards) == _probs(manifest) and _probs(hub) == _probs(manifest)
    assert list(shards[0]) == ["sample", "file", "key", "prediction", *PROBS]
    assert [(r["sample"], r["file"], r["key"]) for r in shards[1:3]] == [
        ("1", "test-000000.tar", "test_0000001"),
        ("2", "test-000001.tar", "test_0000002"),
    ]
    assert [r["file"] for r in hub] == ["data/test-00000-of-00002.parquet"] * 3 + [
        "data/test-00001-of-00002.parquet"
    ] * 2
    assert [r["key"] for r in hub] == [Path(r["image"]).name for r in manifest]  # the image cell's file name
    assert f"sss predict: split test of {inputs.shards} (5 samples; the first of test, val, train it has" in said


def test_a_split_suffix_picks_the_split(inputs, tmp_path, capsys):
    manifest = _rows(predict(inputs.model, inputs.data / "val.csv", tmp_path / "manifest.csv"))
    for name, folder in (("shards", inputs.shards), ("hub", inputs.hub)):
        out = tmp_path / f"{name}.csv"
        assert main(["predict", str(inputs.model), "--input", f"{folder}:val", "--output", str(out)]) == 0
        assert _probs(_rows(out)) == _probs(manifest) and len(manifest) == 3
        assert f"sss predict: split val of {folder} (3 samples)\n" in capsys.readouterr().out


def test_a_missing_split_names_the_splits_there(inputs, tmp_path, capsys):
    data = make_industrial(tmp_path / "data", n_train=1, n_val=2, n_test=0, seed=4)
    with contextlib.redirect_stdout(io.StringIO()):
        pack(data, tmp_path / "shards", shard_size=2)
    hub_parquet(data, tmp_path / "hub", files=1)
    for folder in (tmp_path / "shards", tmp_path / "hub"):
        with pytest.raises(DataError, match=rf"{folder}: no split test; it has train, val: name one as"):
            predict(inputs.model, f"{folder}:test", tmp_path / "none.csv")
    assert not (tmp_path / "none.csv").exists()
    out = tmp_path / "val.csv"  # no test split: val is the default
    assert len(_rows(predict(inputs.model, tmp_path / "hub", out))) == 2
    assert "split val of" in capsys.readouterr().out
    with pytest.raises(DataError, match=r"unknown split 'validation'; name one of train, val, test"):
        predict(inputs.model, f"{inputs.hub}:validation", tmp_path / "bad.csv")


def test_unlabelled_parquet_and_a_cached_dataset_id(inputs, tmp_path, monkeypatch):
    manifest = _rows(predict(inputs.model, inputs.data / "test.csv", tmp_path / "manifest.csv"))
    bare = tmp_path / "bare" / "data"
    bare.mkdir(parents=True)
    for file in sorted((inputs.hub / "data").glob("test-*.parquet")):  # no label column (its schema's too)
        table = pq.read_table(file).drop_columns(["label"])
        meta = json.loads(table.schema.metadata[b"huggingface"])
        meta["info"]["features"].pop("label")
        pq.write_table(table.replace_schema_metadata({"huggingface": json.dumps(meta)}), bare / file.name)
    assert _probs(_rows(predict(inputs.model, bare.parent, tmp_path / "bare.csv"))) == _probs(manifest)
    cache = tmp_path / "hub-cache" / "datasets--owner--birds"
    shutil.copytree(inputs.hub, cache / "snapshots" / "0123abcd")
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    cached = _rows(predict(inputs.model, "owner/birds:test", tmp_path / "cached.csv"))
    assert _probs(cached) == _probs(manifest) and cached[0]["file"].endswith(
        "0123abcd/data/test-00000-of-00002.parquet"
    )
    with pytest.raises(DataError, match=r"owner/other: not a folder, and not in the local Hugging Face cache"):
        predict(inputs.model, "owner/other", tmp_path / "other.csv")


def test_a_corrupt_sample_is_an_error_or_skipped_without_a_row(inputs, tmp_path, capsys):
    shards = tmp_path / "shards"
    shutil.copytree(inputs.shards, shards)
    index = json.loads((shards / "shards.json").read_text())
    offset = index["splits"]["test"]["shards"][0]["index"][1]["members"]["png"][0]
    with (shards / "test-000000.tar").open("r+b") as f:  # sample 1's image: a flipped byte fails its crc32
        f.seek(offset + 40)
        byte = f.read(1)
        f.seek(offset + 40)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DataError, match=r"test-000000.tar, sample 1 \(key test_0000001\): member .* is corrupt"):
        predict(inputs.model, shards, tmp_path / "raise.csv")
    assert not (tmp_path / "raise.csv").exists() and not (tmp_path / "raise.csv.partial").exists()
    out = tmp_path / "skip.csv"
    assert main(["predict", str(inputs.model), "--input", str(shards), "--output", str(out), "data.on_error=skip"]) == 0
    assert [r["sample"] for r in _rows(out)] == ["0", "2", "3", "4"]
    skipped = _rows(tmp_path / "skip.skipped.csv")
    assert [(Path(r["manifest"]).name, r["row"]) for r in skipped] == [("test-000000.tar", "1")]
    assert f"1 sample(s) or file(s) of {shards} could not be read" in capsys.readouterr().out


def test_a_manifest_keeps_its_columns_and_takes_no_split(inputs, tmp_path):
    rows = _rows(predict(inputs.model, inputs.data / "test.csv", tmp_path / "m.csv"))
    assert list(rows[0]) == ["row", "image", "audio", "prediction", *PROBS]
    assert [r["row"] for r in rows] == ["2", "3", "4", "5", "6"] and rows[0]["image"].startswith("images/")
    with pytest.raises(DataError, match=r"test.csv: a manifest file; a split \(:val\) is read from a folder"):
        predict(inputs.model, f"{inputs.data / 'test.csv'}:val", tmp_path / "split.csv")
    with pytest.raises(DataError, match=r"missing: not found; a split \(:val\) is read from a folder"):
        predict(inputs.model, f"{tmp_path / 'missing'}:val", tmp_path / "split.csv")
    with pytest.raises(DataError, match=r"looked for dataset_dict.json.*; nor shards.json \(sss data pack\)"):
        predict(inputs.model, inputs.data, tmp_path / "folder.csv")  # a manifest dataset's folder, not its file


@pytest.mark.slow
def test_the_onnx_runtime_writes_the_torch_rows_over_shards(inputs, tmp_path):
    from sss.model_folder import add_onnx, load_model

    pytest.importorskip("onnxruntime")
    folder = tmp_path / "onnx"
    shutil.copytree(inputs.model, folder)
    add_onnx(load_model(folder), folder)
    torch_rows = _rows(predict(folder, inputs.shards, tmp_path / "torch.csv"))
    onnx_rows = _rows(predict(folder, inputs.shards, tmp_path / "onnx.csv", runtime="onnx"))
    assert [r["key"] for r in onnx_rows] == [r["key"] for r in torch_rows] and len(onnx_rows) == 5
    for t, o in zip(torch_rows, onnx_rows, strict=True):
        assert all(abs(float(t[k]) - float(o[k])) <= 1e-4 for k in PROBS)
