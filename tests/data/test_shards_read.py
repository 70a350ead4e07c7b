"""`TarShards`: records as packed, decoded as the manifest decodes them, read from any sample on, damage named."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sss.data import DataError, ManifestDataset
from sss.data._skiplog import SkipLog
from sss.data.records import Record, RecordDecoder
from sss.data.shards import TarShards, open_shards, pack
from sss.data.synthetic import make_industrial


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[Path, Path]:
    """(source folder, its shards): 30 train samples in shards of 8, 8, 8, 6; 8 val samples in one."""
    tmp = tmp_path_factory.mktemp("shards")
    src = make_industrial(tmp / "ind", n_train=30, n_val=8, n_test=0, image_size=32)
    pack(src, tmp / "out", shard_size=8)
    return src, tmp / "out"


def _copy(packed: tuple[Path, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(packed[1], tmp_path / "out"))


def _all(source: TarShards) -> list[Record | DataError]:
    return [r for shard in range(len(source.shards)) for r in source.read(shard)]


def test_every_record_reads_back_with_its_bytes_labels_events_and_fields(packed):
    src, out = packed
    source = open_shards(out, "train")
    rows = ManifestDataset(src, "train")
    assert (source.where, len(source), [s.rows for s in source.shards]) == (str(out), 30, [8, 8, 8, 6])
    assert source.classes == rows.classes and source.event_classes == rows.event_classes
    assert (source.modalities, source.has_mask, source.multilabel, source.has_label) == (
        ("image", "audio"),
        True,
        False,
        True,
    )
    assert source.durations() == [1.0] * 30
    records = _all(source)
    assert [r.key for r in records] == [f"train_{i:07d}" for i in range(30)]
    assert [(Path(r.file).name, r.row) for r in records[7:9]] == [("train-000000.tar", 7), ("train-000001.tar", 0)]
    for i, record in enumerate(records):
        assert record.audio == Path(rows.audio[i]).read_bytes()
        assert record.image == Path(rows.images[i]).read_bytes()
        assert record.mask == Path(rows.masks[i]).read_bytes()
        assert record.target == rows.targets[i] and record.events == rows.events[i]
    assert any(r.events for r in records)
    assert open_shards(out, "test") is None  # no test split was packed


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_decoded_record_is_the_manifest_item_of_its_row(packed, split):
    src, out = packed
    source = open_shards(out, split)
    settings = {"image_size": 32, "sample_rate": 16000, "clip_seconds": 0.5}
    decoder = RecordDecoder.of(source, **settings)
    rows = ManifestDataset(src, split, **settings)
    records = _all(source)
    for i in (0, 5, len(rows) - 1):
        want, got = rows[i], decoder(records[i], index=i)
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            assert torch.equal(torch.as_tensor(got[key]), torch.as_tensor(value)), (i, key)


def test_reading_from_the_middle_is_the_tail_of_a_full_read(packed):
    source = open_shards(packed[1], "train")
    full = list(source.read(1))
    assert list(source.read(1, 3)) == full[3:]
    assert list(source.read(1, 2, 5)) == full[2:5]
    assert list(source.read(3, 5)) == list(source.read(3))[5:] and len(full) == 8


def _flip(shard: Path, entry: dict, ext: str) -> None:
    offset, size, _ = entry["members"][ext]
    data = bytearray(shard.read_bytes())
    data[offset + size // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_a_corrupt_member_is_an_error_record_naming_shard_sample_and_key(packed, tmp_path):
    out = _copy(packed, tmp_path)
    index = json.loads((out / "shards.json").read_text())["splits"]["train"]["shards"][1]["index"]
    _flip(out / "train-000001.tar", index[2], "wav")
    records = list(open_shards(out, "train").read(1))
    bad = records[2]
    assert isinstance(bad, DataError) and all(isinstance(r, Record) for i, r in enumerate(records) if i != 2)
    assert str(bad).startswith(f"{out / 'train-000001.tar'}, sample 2 (key train_0000010): member train_0000010.wav")
    assert "is corrupt" in str(bad) and "pack the source again" in str(bad)
    assert (bad.file, bad.row) == (str(out / "train-000001.tar"), 2)


def test_reading_from_a_sample_never_reads_the_ones_before_it(packed, tmp_path):
    out = _copy(packed, tmp_path)
    index = json.loads((out / "shards.json").read_text())["splits"]["train"]["shards"][0]["index"]
    for entry in index[:4]:  # every member of samples 0-3 damaged: a reader that touched them would say so
        for ext in entry["members"]:
            _flip(out / "train-000000.tar", entry, ext)
    source = open_shards(out, "train")
    assert all(isinstance(r, Record) for r in source.read(0, 4))
    assert all(isinstance(r, DataError) for r in source.read(0, 0, 4))
    intact = open_shards(packed[1], "train").read(0, 4)
    assert [replace(r, file="") for r in source.read(0, 4)] == [replace(r, file="") for r in intact]


def test_a_shard_cut_short_after_opening_gives_truncated_records(packed, tmp_path):
    out = _copy(packed, tmp_path)
    source = open_shards(out, "train")
    shard = out / "train-000003.tar"
    entry = source.samples[3][4]
    shard.write_bytes(shard.read_bytes()[: entry["members"]["png"][0] + 10])
    records = list(source.read(3))
    assert all(isinstance(r, Record) for r in records[:4])
    assert isinstance(records[4], DataError) and "member train_0000028.png is truncated (10 of" in str(records[4])
    with pytest.raises(DataError, match=r"train-000003\.tar: has \d+ bytes, but shards\.json says \d+"):
        open_shards(out, "train")


def test_a_missing_shard_is_refused_or_left_out_and_logged(packed, tmp_path):
    out = _copy(packed, tmp_path)
    (out / "train-000002.tar").unlink()
    with pytest.raises(DataError) as caught:
        open_shards(out, "train")
    message = str(caught.value)
    assert message.startswith(f"{out / 'train-000002.tar'}: is missing (split train of {out / 'shards.json'} lists it)")
    assert "pack the source again (sss data pack SRC OUT)" in message and "data.on_error=skip" in message
    log = SkipLog(tmp_path / "skipped.csv")
    source = open_shards(out, "train", on_error="skip", skip_log=log)
    assert [Path(s.path).name for s in source.shards] == ["train-000000.tar", "train-000001.tar", "train-000003.tar"]
    assert len(source) == 22 and len(source.durations()) == 22
    assert [(r["file"], r["row"], r["reason"]) for r in log.rows()] == [
        (str(out / "train-000002.tar"), 0, "is missing")
    ]
    assert next(source.read(2)).key == "train_0000024"


def test_a_folder_not_made_by_pack_is_refused_saying_how_to_make_one(packed, tmp_path):
    with pytest.raises(DataError, match=r"shards\.json not found; .* made by `sss data pack SRC OUT`"):
        open_shards(packed[0], "train")
    out = _copy(packed, tmp_path)
    index = json.loads((out / "shards.json").read_text())
    (out / "shards.json").write_text(json.dumps({**index, "version": 99}))
    with pytest.raises(
        DataError, match=r"version 99, but this sss reads 'sss-shards' version 1, a folder made by `sss"
    ):
        open_shards(out, "train")
    del index["splits"]["train"]["shards"][1]["size"]
    (out / "shards.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match=r"shards\.json: a shard's entry lacks one of file, samples, size, index"):
        open_shards(out, "train")
