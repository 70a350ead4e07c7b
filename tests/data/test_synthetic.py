"""The synthetic industrial generator: determinism, balance, masks/events vs labels, atomic and concurrent writes."""

from __future__ import annotations

import csv
import multiprocessing
import multiprocessing.synchronize
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from sss.data import IndustrialDataModule, make_industrial, synthetic
from sss.data.synthetic import CLASSES

SMALL = {"n_train": 16, "n_val": 4, "n_test": 4}


@pytest.fixture(scope="module")
def industrial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_industrial(tmp_path_factory.mktemp("industrial") / "ds", n_train=48, n_val=8, n_test=8, seed=1)


def read_csv(path: Path, delimiter: str = ",") -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle, delimiter=delimiter))


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout(industrial: Path) -> None:
    files = {"train.csv", "val.csv", "test.csv", "events.tsv", "classes.txt", "event_classes.txt", "sss-dataset.json"}
    assert {p.name for p in industrial.iterdir()} == {"images", "audio", "masks"} | files
    assert (industrial / "classes.txt").read_text().split() == list(CLASSES)
    rows = read_csv(industrial / "train.csv")
    assert list(rows[0]) == ["image", "audio", "label", "mask", "events"]
    assert len(rows) == 48
    assert all((industrial / row[key]).is_file() for row in rows for key in ("image", "audio", "mask"))
    with Image.open(industrial / rows[0]["image"]) as image:
        assert image.mode == "RGB" and image.size == (64, 64)
    info = sf.info(str(industrial / rows[0]["audio"]))
    assert (info.samplerate, info.channels, info.frames, info.subtype) == (16000, 1, 16000, "PCM_16")


@pytest.mark.parametrize("task", ["default", "binding"])
def test_same_seed_gives_identical_bytes_and_another_seed_does_not(tmp_path: Path, task: str) -> None:
    first = tree(make_industrial(tmp_path / "a", **SMALL, seed=5, task=task))
    assert first == tree(make_industrial(tmp_path / "b", **SMALL, seed=5, task=task))
    other = tree(make_industrial(tmp_path / "c", **SMALL, seed=6, task=task))
    assert first.keys() - {"sss-dataset.json"} == other.keys() - {"sss-dataset.json"}
    differ = [name for name in first if name.endswith((".png", ".wav")) and first[name] != other[name]]
    assert len(differ) == len([name for name in first if name.endswith((".png", ".wav"))])


def test_classes_are_balanced(industrial: Path) -> None:
    assert Counter(row["label"] for row in read_csv(industrial / "train.csv")) == {name: 12 for name in CLASSES}
    assert Counter(row["label"] for row in read_csv(industrial / "val.csv")) == {name: 2 for name in CLASSES}


def soft_interior(mask: np.ndarray) -> int:
    """Partially covered pixels with an all-partial 3x3 neighbourhood: inside a blur, never on a sharp edge."""
    partial = np.pad((mask > 0) & (mask < 255), 1)
    inside = np.ones(mask.shape, dtype=bool)
    for dy in range(3):
        for dx in range(3):
            inside &= partial[dy : dy + mask.shape[0], dx : dx + mask.shape[1]]
    return int(inside.sum())


def test_masks_and_events_match_labels(industrial: Path) -> None:
    events = {row["filename"]: row for row in read_csv(industrial / "events.tsv", "\t")}
    rows = [row for split in ("train", "val", "test") for row in read_csv(industrial / f"{split}.csv")]
    assert len(events) == sum(row["label"] in ("fault", "collision") for row in rows)
    for row in rows:
        moving, transient = row["label"] in ("passerby", "collision"), row["label"] in ("fault", "collision")
        mask = np.asarray(Image.open(industrial / row["mask"]))
        assert mask.shape == (64, 64) and mask.dtype == np.uint8
        assert (soft_interior(mask) >= 20) == moving, row
        name = Path(row["audio"]).name
        assert (name in events) == transient, row
        if transient:
            event = events[name]
            onset, offset = float(event["onset"]), float(event["offset"])
            assert event["event_label"] in ("knock", "friction", "collision") and 0 < onset < offset <= 1.0
            wave, _ = sf.read(industrial / row["audio"])
            energy = (wave.reshape(-1, 160) ** 2).mean(axis=1)  # 10-ms frames
            assert onset - 0.02 <= (energy.argmax() + 0.5) / 100 <= offset + 0.02, row  # loudest frame is the event


def test_reuse_and_refusals(tmp_path: Path) -> None:
    root = make_industrial(tmp_path / "ds", **SMALL)
    stamp = (root / "sss-dataset.json").stat().st_mtime_ns
    assert make_industrial(root, **SMALL) == root and (root / "sss-dataset.json").stat().st_mtime_ns == stamp
    with pytest.raises(FileExistsError, match="generated with other arguments"):
        make_industrial(root, **SMALL, seed=1)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="exists and is not a generated dataset"):
        make_industrial(tmp_path / "other", **SMALL)
    (tmp_path / "empty").mkdir()
    assert (make_industrial(tmp_path / "empty", **SMALL) / "train.csv").is_file()
    with pytest.raises(ValueError, match="need n_train >= 1"):
        make_industrial(tmp_path / "bad", n_train=0)


def test_crash_leaves_no_dataset_and_the_next_run_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def crash_after_three(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    real = synthetic._write_sample
    monkeypatch.setattr(synthetic, "_write_sample", crash_after_three)
    with pytest.raises(KeyboardInterrupt):
        make_industrial(tmp_path / "ds", **SMALL)
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".ds.tmp-*"))
    (tmp_path / ".ds.tmp-killed").mkdir()  # what a SIGKILL mid-generation leaves behind
    monkeypatch.setattr(synthetic, "_write_sample", real)
    make_industrial(tmp_path / "ds", **SMALL)
    assert (tmp_path / "ds" / "sss-dataset.json").is_file() and not list(tmp_path.glob(".ds.tmp-*"))


def generate(out_dir: str, start: multiprocessing.synchronize.Barrier, results: multiprocessing.Queue) -> None:
    args = synthetic._arguments(96, 8, 8, 0, 64, 16000, 1.0)
    start.wait()  # both processes race for the folder at the same moment
    results.put(synthetic._generate_once(Path(out_dir), args))


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork and flock")
def test_concurrent_generation_gives_one_complete_folder(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")  # fork: the children reuse this process's imports
    start, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=generate, args=(str(tmp_path / "ds"), start, results)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    assert sorted(results.get(timeout=5) for _ in workers) == [False, True]  # exactly one generated
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ds.lock", "ds"]
    assert len(read_csv(tmp_path / "ds" / "train.csv")) == 96
    assert len(list((tmp_path / "ds" / "audio").iterdir())) == 96 + 8 + 8


def test_datamodule_generates_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SSS_CACHE", str(tmp_path))
    dm = IndustrialDataModule(**SMALL, batch_size=8)
    assert dm.classes == list(CLASSES) and dm.num_classes == 4  # known before setup
    assert dm.root.parent == tmp_path and dm.root.name.startswith("industrial-")
    dm.setup("fit")
    assert "generated the industrial dataset (24 samples) in" in capsys.readouterr().out
    batch = next(iter(dm.train_dataloader()))
    assert batch["image"].shape == (8, 3, 64, 64) and batch["audio"].shape == (8, 1, 16000)
    assert len(dm.val_dataloader().dataset) == 4 and len(dm.test_dataloader().dataset) == 4
    again = IndustrialDataModule(**SMALL)
    again.setup("fit")
    out = capsys.readouterr().out
    assert again.root == dm.root and "generated" not in out  # reused, not generated again
    assert out.startswith("sss: data ") and "4 classes (multiclass), image+audio, mask, events" in out
    assert IndustrialDataModule(**SMALL, seed=1).root != dm.root
