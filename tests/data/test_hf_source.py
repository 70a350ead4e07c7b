"""`sss.data.hf`: Hugging Face datasets (Hub Parquet, save_to_disk folders, cached ids) read as record sources."""

from __future__ import annotations

import csv
import io
import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import torch
from PIL import Image

from sss.data.errors import DataError
from sss.data.hf import HFSource, open_hf
from sss.data.manifest import ManifestDataset, SkipLog
from sss.data.records import Record, RecordDecoder, SourceDataset

datasets = pytest.importorskip("datasets")

NAMES = ["cat", "dog", "owl"]


def _wav(i: int) -> bytes:
    buffer = io.BytesIO()
    wave = np.random.default_rng(i).uniform(-0.5, 0.5, 4000 + 400 * i).astype(np.float32)
    sf.write(buffer, wave, 8000, format="WAV")
    return buffer.getvalue()


def _png(i: int) -> bytes:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(100 + i).integers(0, 255, (20, 24, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _dataset(n: int, offset: int = 0):
    """An HF Dataset with Image, Audio and ClassLabel features, made without torchcodec.

    ``Audio().encode_example`` imports torchcodec even for bytes, so the audio column is built as the plain
    {bytes, path} struct and cast to ``Audio(decode=False)``: the stored table is what the Hub holds.
    """
    rows = range(offset, offset + n)
    struct = {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}
    features = datasets.Features(
        {"image": datasets.Image(), "audio": struct, "label": datasets.ClassLabel(names=NAMES)}
    )
    data = {
        "image": [{"bytes": _png(i), "path": f"img_{i}.png"} for i in rows],
        "audio": [{"bytes": _wav(i), "path": f"clip_{i}.wav"} for i in rows],
        "label": [i % 3 for i in rows],
    }
    return datasets.Dataset.from_dict(data, features=features).cast_column("audio", datasets.Audio(decode=False))


def _hub_parquet(root, row_group: int = 3):
    """The Hub's layout: train in two files (7 + 6 rows, row groups of 3), validation in one (4 rows)."""
    os.makedirs(root / "data")
    _dataset(7).to_parquet(str(root / "data/train-00000-of-00002.parquet"), batch_size=row_group)
    _dataset(6, 7).to_parquet(str(root / "data/train-00001-of-00002.parquet"), batch_size=row_group)
    _dataset(4, 20).to_parquet(str(root / "data/validation-00000-of-00001.parquet"), batch_size=row_group)
    return root


def _saved(root):
    datasets.DatasetDict({"train": _dataset(13), "validation": _dataset(4, 20)}).save_to_disk(
        str(root), num_shards={"train": 2, "validation": 1}
    )
    return root


@pytest.fixture(params=["parquet", "saved"])
def layout(request, tmp_path):
    make = _hub_parquet if request.param == "parquet" else _saved
    return request.param, make(tmp_path / request.param)


def _all(source: HFSource) -> list[Record]:
    return [record for shard in range(len(source.shards)) for record in source.read(shard)]


def test_every_row_is_read_once_in_order_with_its_classlabel(layout):
    kind, root = layout
    source = open_hf(root, "train")
    records = _all(source)
    assert source.kind == ("parquet" if kind == "parquet" else "arrow")
    assert [r.audio for r in records] == [_wav(i) for i in range(13)]
    assert [r.image for r in records] == [_png(i) for i in range(13)]
    assert [r.target for r in records] == [i % 3 for i in range(13)]
    assert source.classes == NAMES and source.modalities == ("image", "audio") and source.has_label
    assert not source.multilabel and not source.has_mask and not source.has_events and len(source) == 13
    if kind == "parquet":  # a shard per row group, rows numbered within the file
        assert [(os.path.basename(s.path)[:11], s.part, s.rows) for s in source.shards] == [
            ("train-00000", 0, 3), ("train-00000", 1, 3), ("train-00000", 2, 1),
            ("train-00001", 0, 3), ("train-00001", 1, 3),
        ]  # fmt: skip
        assert [r.row for r in records] == [*range(7), *range(6)]
    else:  # a shard per Arrow file
        assert [s.rows for s in source.shards] == [7, 6] and [s.part for s in source.shards] == [0, 0]
    assert records[8].key == "img_8.png" and records[8].file == source.shards[-1].path


def test_a_slice_reads_the_same_records_as_the_whole_shard(layout):
    _, root = layout
    source = open_hf(root, "train")
    for shard in range(len(source.shards)):
        whole = list(source.read(shard))
        assert list(source.read(shard, 1, 3)) == whole[1:3]
        assert list(source.read(shard, 2)) == whole[2:]
    # a fresh source (no cached table) reading the last shard's tail alone
    fresh = open_hf(root, "train")
    assert list(fresh.read(len(fresh.shards) - 1, 1)) == list(source.read(len(source.shards) - 1))[1:]


def test_val_is_read_from_validation_and_an_absent_split_is_none(layout):
    _, root = layout
    val = open_hf(root, "val")
    assert [r.audio for r in _all(val)] == [_wav(i) for i in range(20, 24)] and val.classes == NAMES
    assert open_hf(root, "test") is None


def test_a_decoded_item_equals_the_manifest_item_of_the_same_bytes_as_files(tmp_path):
    root = _hub_parquet(tmp_path / "hub")
    source = open_hf(root, "train")
    folder = tmp_path / "manifest"
    folder.mkdir()
    with open(folder / "train.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image", "audio", "label"])
        for i in range(13):
            (folder / f"{i}.png").write_bytes(_png(i))
            (folder / f"{i}.wav").write_bytes(_wav(i))
            writer.writerow([f"{i}.png", f"{i}.wav", NAMES[i % 3]])
    settings = dict(image_size=16, sample_rate=16000, clip_seconds=0.5)
    manifest = ManifestDataset(folder, "train", classes=NAMES, **settings)
    records = SourceDataset(source, RecordDecoder.of(source, **settings), skip_log=SkipLog(tmp_path / "log"))
    assert len(records) == len(manifest) == 13
    for i in (0, 4, 12):
        got, want = records[i], manifest[i]
        assert got.keys() == want.keys()
        for key in ("image", "audio", "label"):
            assert torch.equal(got[key], want[key]), (i, key)


def test_columns_name_the_fields_and_string_labels_take_the_sorted_names_of_train(tmp_path):
    os.makedirs(tmp_path / "data")
    train = pa.table({"recording": [_wav(0), _wav(1), _wav(2)], "category": ["rain", "bird", "rain"], "id": [1, 2, 3]})
    pq.write_table(train, tmp_path / "data/train-00000-of-00001.parquet")
    val = pa.table({"recording": [_wav(3), _wav(4)], "category": ["bird", "wind"], "id": [4, 5]})
    pq.write_table(val, tmp_path / "data/validation-00000-of-00001.parquet")
    source = open_hf(tmp_path, "val", columns={"audio": "recording", "label": "category"})
    assert source.classes == ["bird", "rain"] and source.modalities == ("audio",)
    good, bad = _all(source)
    assert good.target == 0 and good.audio == _wav(3)
    assert isinstance(bad, DataError) and "unknown label 'wind' (classes: bird, rain)" in str(bad)
    assert "validation-00000-of-00001.parquet, sample 1" in str(bad)
    given = open_hf(tmp_path, "val", columns={"audio": "recording", "label": "category"}, classes=["wind", "bird"])
    assert [r.target for r in _all(given)] == [1, 0]
    with pytest.raises(DataError) as err:
        open_hf(tmp_path, "train", columns={"audio": "sound", "label": "category"})
    assert "data.columns.audio" in str(err.value) and "'sound'" in str(err.value)
    assert "recording, category, id" in str(err.value)
    with pytest.raises(DataError, match="no image or audio column"):
        open_hf(tmp_path, "train")  # "recording" is found only through data.columns


def test_a_list_of_classlabel_is_multilabel(tmp_path):
    features = datasets.Features(
        {"image": datasets.Image(), "tags": datasets.List(datasets.ClassLabel(names=["a", "b", "c"]))}
    )
    data = {"image": [{"bytes": _png(i), "path": None} for i in range(3)], "tags": [[0, 2], [], [1]]}
    datasets.Dataset.from_dict(data, features=features).to_parquet(str(tmp_path / "train.parquet"))
    source = open_hf(tmp_path, "train")
    assert source.multilabel and source.classes == ["a", "b", "c"] and source.columns["label"] == "tags"
    assert [r.target for r in _all(source)] == [(0, 2), (), (1,)]


def test_a_truncated_parquet_file_is_refused_or_left_out_and_logged(tmp_path):
    root = _hub_parquet(tmp_path / "hub")
    cut = root / "data/train-00001-of-00002.parquet"
    cut.write_bytes(cut.read_bytes()[:-100])
    with pytest.raises(DataError) as err:
        open_hf(root, "train")
    assert str(cut) in str(err.value) and "download or export it again" in str(err.value)
    log = SkipLog(tmp_path / "skipped.csv")
    source = open_hf(root, "train", on_error="skip", skip_log=log)
    assert {s.path for s in source.shards} == {str(root / "data/train-00000-of-00002.parquet")} and len(source) == 7
    assert [(r["manifest"], r["row"], r["file"]) for r in log.rows()] == [(str(cut), 0, str(cut))]
    assert "Parquet footer" in log.rows()[0]["reason"]


def test_a_null_or_path_only_audio_cell_is_an_error_record(tmp_path):
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    cells = [{"bytes": _wav(0), "path": "a.wav"}, None, {"bytes": None, "path": "/data/c.wav"}]
    pq.write_table(pa.table({"audio": pa.array(cells, struct), "label": ["x", "y", "x"]}), tmp_path / "train.parquet")
    first, null, path_only = _all(open_hf(tmp_path, "train"))
    assert first.audio == _wav(0) and first.key == "a.wav"
    assert isinstance(null, DataError) and "train.parquet, sample 1: has no audio: the cell is empty" in str(null)
    assert (null.row, null.file) == (1, str(tmp_path / "train.parquet"))
    assert isinstance(path_only, DataError) and "sample 2 (key c.wav)" in str(path_only)
    assert "only a path (/data/c.wav), not the bytes" in str(path_only) and "embed_external_files" in str(path_only)


def test_a_dataset_id_is_read_from_the_local_hub_cache_only(tmp_path, monkeypatch):
    cache = tmp_path / "hub-cache"
    repo = cache / "datasets--owner--birds"
    _hub_parquet(repo / "snapshots/0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs/main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = open_hf("owner/birds", "train")
    assert source.where == "owner/birds" and len(source) == 13
    assert source.shards[0].path.startswith(str(repo / "snapshots/0123abcd/data/"))
    with pytest.raises(DataError) as err:
        open_hf("owner/other", "train")
    assert "not in the local Hugging Face cache" in str(err.value) and "hf download owner/other" in str(err.value)


def test_a_folder_without_a_dataset_names_what_was_looked_for(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"looked for dataset_dict.json, state.json and Parquet files \(data/train"):
        open_hf(tmp_path / "empty", "train")
    with pytest.raises(DataError, match="not a Hugging Face dataset"):
        open_hf(tmp_path / "missing" / "folder", "train")


def test_durations_and_a_pickled_source(layout):
    _, root = layout
    source = open_hf(root, "train", streaming=True)
    assert source.durations() == pytest.approx([(4000 + 400 * i) / 8000 for i in range(13)])
    clone = pickle.loads(pickle.dumps(source))
    assert clone._cache == {} and clone.streaming and _all(clone) == _all(source)


def test_a_single_saved_dataset_is_its_recorded_split_else_train(tmp_path):
    _dataset(3).save_to_disk(str(tmp_path / "one"))
    source = open_hf(tmp_path / "one", "train")
    assert [r.audio for r in _all(source)] == [_wav(i) for i in range(3)] and source.kind == "arrow"
    assert open_hf(tmp_path / "one", "val") is None
