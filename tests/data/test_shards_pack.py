"""`sss data pack`: every sample written once with its source bytes and labels, verified, never over anything."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import typing
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from sss.data import DataError
from sss.data.shards import open_shards, pack
from sss.data.synthetic import make_industrial


@pytest.fixture(scope="module")
def industrial(tmp_path_factory) -> Path:
    return make_industrial(tmp_path_factory.mktemp("src") / "ind", n_train=30, n_val=8, n_test=0, image_size=32)


def _members(tar_path: Path) -> dict[str, bytes]:
    with tarfile.open(tar_path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _rows(manifest: Path) -> list[dict[str, str]]:
    with open(manifest, newline="") as handle:
        return list(csv.DictReader(handle))


def _events(table: Path) -> dict[str, list[list]]:
    out: dict[str, list[list]] = {}
    for row in _rows_tsv(table):
        out.setdefault(row["filename"], []).append([float(row["onset"]), float(row["offset"]), row["event_label"]])
    return out


def _rows_tsv(table: Path) -> list[dict[str, str]]:
    with open(table, newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def test_pack_writes_every_row_once_with_its_bytes_labels_events_and_an_index_that_matches(industrial, tmp_path):
    report = pack(industrial, tmp_path / "out", shard_size=8)
    out = tmp_path / "out"
    assert report.samples == {"train": 30, "val": 8} and report.shards == {"train": 4, "val": 1}
    assert report.skipped == [] and not (out / "skipped.csv").exists()
    assert (out / "classes.txt").read_text() == (industrial / "classes.txt").read_text()
    assert (out / "event_classes.txt").read_text() == (industrial / "event_classes.txt").read_text()
    index = json.loads((out / "shards.json").read_text())
    assert (index["format"], index["version"]) == ("sss-shards", 1)
    events = _events(industrial / "events.tsv")
    for split, n in (("train", 30), ("val", 8)):
        rows = _rows(industrial / f"{split}.csv")
        shards = index["splits"][split]["shards"]
        assert [s["file"] for s in shards] == [f"{split}-{i:06d}.tar" for i in range(len(shards))]
        seen = []
        for shard in shards:
            path = out / shard["file"]
            data = path.read_bytes()
            assert (shard["size"], shard["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
            members = _members(path)
            assert list(members) == sorted(members)  # WebDataset: members in key order, a sample's side by side
            for entry in shard["index"]:
                key = entry["key"]
                seen.append(key)
                for ext, (offset, size, _) in entry["members"].items():
                    assert data[offset : offset + size] == members[f"{key}.{ext}"]  # the index's offsets are right
                meta = json.loads(members[f"{key}.json"])
                row = rows[meta["source"]["line"] - 2]
                assert meta["source"]["manifest"] == f"{split}.csv"
                assert members[f"{key}.wav"] == (industrial / row["audio"]).read_bytes()
                assert members[f"{key}.png"] == (industrial / row["image"]).read_bytes()
                assert members[f"{key}.mask.png"] == (industrial / row["mask"]).read_bytes()
                assert meta["label"] == row["label"]
                assert meta["events"] == events.get(Path(row["audio"]).name, [])
                assert entry["duration"] == pytest.approx(1.0)
        assert seen == [f"{split}_{i:07d}" for i in range(n)]  # every row once, in manifest order
    assert sum(len(e) for e in events.values()) > 0


def _tone(path: Path, fmt: str, subtype: str) -> np.ndarray:
    wave = (0.3 * np.sin(2 * np.pi * 440 * np.arange(8000) / 8000)).astype(np.float32)
    sf.write(path, wave, 8000, format=fmt, subtype=subtype)
    return wave


def test_other_formats_are_reencoded_lossless_to_flac_and_png_and_multilabel_rows_keep_their_labels(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _tone(src / "a.aiff", "AIFF", "PCM_16")
    _tone(src / "b.flac", "FLAC", "PCM_16")
    pixels = np.random.default_rng(0).integers(0, 255, (20, 24, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(src / "a.bmp")
    Image.fromarray(pixels).save(src / "b.jpg", quality=90)
    Image.fromarray(pixels[..., 0]).save(src / "m.tif")
    (src / "train.csv").write_text("image,audio,labels,mask\na.bmp,a.aiff,x;y,m.tif\nb.jpg,b.flac,y,m.tif\n")
    pack(src, tmp_path / "out", shard_size=5)
    members = _members(tmp_path / "out" / "train-000000.tar")
    assert sorted(members) == [
        "train_0000000.flac", "train_0000000.json", "train_0000000.mask.png", "train_0000000.png",
        "train_0000001.flac", "train_0000001.jpg", "train_0000001.json", "train_0000001.mask.png",
    ]  # fmt: skip
    assert members["train_0000001.flac"] == (src / "b.flac").read_bytes()  # FLAC and JPEG keep their bytes
    assert members["train_0000001.jpg"] == (src / "b.jpg").read_bytes()
    original, _ = sf.read(src / "a.aiff", dtype="float32")
    packed, rate = sf.read(io.BytesIO(members["train_0000000.flac"]), dtype="float32")
    assert rate == 8000 and np.abs(packed - original).max() < 1e-6  # lossless: only the container changed
    assert (np.asarray(Image.open(io.BytesIO(members["train_0000000.png"]))) == pixels).all()
    assert (np.asarray(Image.open(io.BytesIO(members["train_0000000.mask.png"]))) == pixels[..., 0]).all()
    assert json.loads(members["train_0000000.json"])["labels"] == ["x", "y"]
    assert (tmp_path / "out" / "classes.txt").read_text() == "x\ny\n"
    source = open_shards(tmp_path / "out", "train")
    first, second = source.read(0)
    assert source.multilabel and (first.target, second.target) == ((0, 1), (1,))
    assert (first.audio, second.image) == (members["train_0000000.flac"], members["train_0000001.jpg"])


def test_an_existing_folder_is_never_written_into(industrial, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match=r"out already exists and is not empty; choose a new folder or remove"):
        pack(industrial, tmp_path / "out", shard_size=8)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial folder left behind
    (tmp_path / "empty").mkdir()
    assert pack(industrial, tmp_path / "empty", shard_size=64).shards == {"train": 1, "val": 1}


def _with_bad_row(industrial: Path, root: Path) -> Path:
    # A copy of the dataset whose val.csv line 5 (its 4th row) points at a WAV cut short.
    shutil.copytree(industrial, root)
    audio = _rows(root / "val.csv")[3]["audio"]
    (root / audio).write_bytes((root / audio).read_bytes()[:5000])
    return root


def test_a_bad_row_stops_the_pack_naming_manifest_and_line_or_is_left_out_and_listed(industrial, tmp_path):
    src = _with_bad_row(industrial, tmp_path / "src")
    with pytest.raises(DataError, match=r"val\.csv, line 5: audio file .*val_00003\.wav is truncated"):
        pack(src, tmp_path / "out", shard_size=3)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.partial-*"))  # nothing half-written
    report = pack(src, tmp_path / "out", shard_size=3, on_error="skip")
    assert report.samples == {"train": 30, "val": 7}
    assert [(r["row"], Path(r["file"]).name) for r in report.skipped] == [(5, "val_00003.wav")]
    assert "is truncated" in report.skipped[0]["reason"]
    assert "val_00003.wav" in (tmp_path / "out" / "skipped.csv").read_text()
    index = json.loads((tmp_path / "out" / "shards.json").read_text())
    lines = [
        json.loads(_members(tmp_path / "out" / s["file"])[f"{e['key']}.json"])["source"]["line"]
        for s in index["splits"]["val"]["shards"]
        for e in s["index"]
    ]
    assert lines == [2, 3, 4, 6, 7, 8, 9]
    assert [e["key"] for s in index["splits"]["val"]["shards"] for e in s["index"]][-1] == "val_0000006"


def _sss(*words: str, cwd: Path) -> subprocess.CompletedProcess:
    sss = Path(sys.executable).with_name("sss")
    return subprocess.run([str(sss), *words], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_command_as_a_user_types_it(industrial, tmp_path):
    done = _sss("data", "pack", str(industrial), "shards", "--shard-size", "24", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"train: 30 samples in 2 shard(s) from {industrial / 'train.csv'}",
        f"val: 8 samples in 1 shard(s) from {industrial / 'val.csv'}",
        f"wrote {Path('shards')}",
    ]
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == [
        "classes.txt", "event_classes.txt", "shards.json", "train-000000.tar", "train-000001.tar", "val-000000.tar",
    ]  # fmt: skip
    again = _sss("data", "pack", str(industrial), "shards", cwd=tmp_path)
    assert (
        again.returncode == 2
        and again.stderr == "error: shards already exists and is not empty; choose a new folder or remove it\n"
    )
    zero = _sss("data", "pack", str(industrial), "new", "--shard-size", "0", cwd=tmp_path)
    assert zero.returncode == 2 and zero.stderr == "error: sss data pack --shard-size 0: must be at least 1\n"
    mixed = _sss("data", "pack", str(industrial), "new", "--n", "5", cwd=tmp_path)
    assert mixed.returncode == 2 and mixed.stderr == "error: sss data pack: --n: only with sss data make\n"
    bad = _with_bad_row(industrial, tmp_path / "bad")
    failed = _sss("data", "pack", str(bad), "new", "--layout", "manifest", cwd=tmp_path)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1, failed.stderr
    assert failed.stderr.startswith(f"error: {bad / 'val.csv'}, line 5: audio file {bad / 'audio' / 'val_00003.wav'}")
    assert "is truncated" in failed.stderr and "--on-error skip" in failed.stderr
    assert not (tmp_path / "new").exists()


def test_the_layout_choices_of_the_command_are_the_layouts():
    from sss.data.layouts import LAYOUTS
    from sss.run.data_commands import data

    assert typing.get_args(typing.get_type_hints(data)["layout"]) == LAYOUTS
