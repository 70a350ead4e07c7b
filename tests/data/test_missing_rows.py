"""Manifest rows with one modality absent: presence flags, zero placeholders, the bad rows, the cache, workers."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from sss.data import DataError, ManifestDataModule, ManifestDataset
from sss.data.cache import attach_feature_cache
from sss.data.contract import check_batch
from sss.data.manifest import collate
from sss.data.synthetic import make_industrial

SIZE = 32
NO_IMAGE, NO_AUDIO = 1, 3  # rows (0-based) that lose a modality


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_industrial(tmp_path_factory.mktemp("miss") / "ind", n_train=6, n_val=0, n_test=0, image_size=SIZE)


def rows_of(root: Path) -> list[dict[str, str]]:
    with open(root / "train.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def folder(source: Path, tmp: Path, edit: dict[int, dict[str, str | None]], suffix: str = ".csv") -> Path:
    """A copy of `source` whose train rows `edit` changes ("<drop>": leave the key out, JSONL)."""
    shutil.copytree(source, tmp)
    (tmp / "train.csv").unlink()
    rows = rows_of(source)
    for i, change in edit.items():
        rows[i].update(change)
    if suffix == ".csv":
        with open(tmp / "train.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        lines = [json.dumps({k: v for k, v in row.items() if v != "<drop>"}) for row in rows]
        (tmp / "train.jsonl").write_text("\n".join(lines) + "\n")
    return tmp


ABSENT = {NO_IMAGE: {"image": "", "mask": ""}, NO_AUDIO: {"audio": " ", "events": ""}}


def items(root: Path, **kwargs: object) -> list[dict[str, torch.Tensor]]:
    dataset = ManifestDataset(root, "train", image_size=SIZE, **kwargs)  # type: ignore[arg-type]
    return [dataset[i] for i in range(len(dataset))]


def test_absent_cells_give_placeholders_and_flags(source: Path, tmp_path: Path) -> None:
    got = items(folder(source, tmp_path / "ds", ABSENT))
    batch = collate(got)
    assert batch["image_present"].dtype == torch.bool and batch["image_present"].shape == (6,)
    assert batch["image_present"].tolist() == [i != NO_IMAGE for i in range(6)]
    assert batch["audio_present"].tolist() == [i != NO_AUDIO for i in range(6)]
    assert batch["image"].shape == (6, 3, SIZE, SIZE) and batch["audio"].shape == (6, 1, 16000)
    for key in ("image", "mask"):
        assert not batch[key][NO_IMAGE].any() and batch[key][NO_IMAGE].dtype == torch.float32
    assert not batch["audio"][NO_AUDIO].any() and not batch["events"][NO_AUDIO].any()
    assert batch["image"][NO_AUDIO].abs().sum() > 0 and batch["audio"][NO_IMAGE].abs().sum() > 0
    check_batch(batch)  # the batch contract: presence masks bool [B]


@pytest.mark.parametrize("empty", [None, "", "   ", "<drop>"], ids=["null", "empty", "blank", "no-key"])
def test_jsonl_empty_cells(source: Path, tmp_path: Path, empty: str | None) -> None:
    edit = {NO_IMAGE: {"image": empty, "mask": empty}, NO_AUDIO: {"audio": empty, "events": empty}}
    batch = collate(items(folder(source, tmp_path / "ds", edit, ".jsonl")))
    assert batch["image_present"].tolist() == [i != NO_IMAGE for i in range(6)]
    assert batch["audio_present"].tolist() == [i != NO_AUDIO for i in range(6)]
    assert not batch["image"][NO_IMAGE].any() and not batch["audio"][NO_AUDIO].any()


def test_present_rows_bitwise_unchanged(source: Path, tmp_path: Path) -> None:
    """Augmented items of full rows equal those of the all-present manifest; a row keeps its other modality's draws."""
    # clip_seconds < the 1 s files: a random audio crop is drawn after the image's crop box, for every row
    full = items(folder(source, tmp_path / "full", {}), train=True, seed=3, clip_seconds=0.5)
    masked = items(folder(source, tmp_path / "masked", ABSENT), train=True, seed=3, clip_seconds=0.5)
    for i, (a, b) in enumerate(zip(full, masked, strict=True)):
        # complete data carries no flags (its batches are what they always were); a partial split flags every item
        assert set(b) == set(a) | {"image_present", "audio_present"}
        assert bool(b["image_present"]) == (i != NO_IMAGE) and bool(b["audio_present"]) == (i != NO_AUDIO)
        for key in ("image", "audio", "mask", "events", "label"):
            if (i, key) in {(NO_IMAGE, "image"), (NO_IMAGE, "mask"), (NO_AUDIO, "audio"), (NO_AUDIO, "events")}:
                continue
            assert torch.equal(a[key], b[key]), (i, key)


def test_neither_row_is_refused_naming_manifest_and_line(source: Path, tmp_path: Path) -> None:
    root = folder(source, tmp_path / "ds", {2: {"image": "", "audio": "", "mask": "", "events": ""}})
    with pytest.raises(DataError) as info:
        ManifestDataset(root, "train")
    assert str(info.value) == (
        f"{root / 'train.csv'}, line 4: has neither an image nor an audio file; a row needs at least one; "
        "set data.on_error=skip to leave such rows out"
    )


def test_neither_row_is_skipped_and_logged(source: Path, tmp_path: Path) -> None:
    root = folder(source, tmp_path / "ds", {2: {"image": "", "audio": "", "mask": "", "events": ""}})
    dataset = ManifestDataset(root, "train", on_error="skip")
    assert len(dataset) == 5 and 4 not in dataset.lines
    logged = dataset.skip_log.rows()
    assert [(int(r["row"]), r["reason"]) for r in logged] == [
        (4, "has neither an image nor an audio file; a row needs at least one")
    ]


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        ({"image": ""}, "has an empty image path but a mask file; a mask belongs to its image"),
        ({"audio": ""}, "has an empty audio path but an events table; events belong to its audio"),
        ({"mask": ""}, "has an empty mask path"),  # the image is there: its mask is still required
    ],
    ids=["mask-without-image", "events-without-audio", "image-without-mask"],
)
def test_mask_and_events_rules(source: Path, tmp_path: Path, edit: dict[str, str], pattern: str) -> None:
    root = folder(source, tmp_path / "ds", {0: edit})
    with pytest.raises(DataError, match=rf"train\.csv, line 2: {pattern}"):
        ManifestDataset(root, "train")


def test_single_modality_unchanged(tmp_path: Path, source: Path) -> None:
    root = tmp_path / "audio-only"
    shutil.copytree(source / "audio", root / "audio")
    rows = rows_of(source)
    lines = ["audio,label"] + [f"{r['audio']},{r['label']}" for r in rows]
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    item = ManifestDataset(root, "train")[0]
    assert set(item) == {"audio", "label", "index"}
    lines[2] = f",{rows[1]['label']}"
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"train\.csv, line 3: has an empty audio path; every row needs one"):
        ManifestDataset(root, "train")


def test_feature_cache_serves_absent_rows(source: Path, tmp_path: Path) -> None:
    full = ManifestDataset(folder(source, tmp_path / "full", {}), "train", image_size=SIZE, train=True)
    masked = ManifestDataset(folder(source, tmp_path / "masked", ABSENT), "train", image_size=SIZE, train=True)
    cache = attach_feature_cache(masked, tmp_path / "cache", n_mels=32, num_workers=0)
    attach_feature_cache(full, tmp_path / "cache", n_mels=32, num_workers=0)
    assert cache.absent == {"image": [NO_IMAGE], "audio": [NO_AUDIO]}
    indices = list(range(6))
    batch = collate(masked.__getitems__(indices))  # the stacked path
    reference = collate(full.__getitems__(indices))
    assert batch["audio"].shape == (6, 1, 32, 101) and batch["image_present"].tolist() == [i != 1 for i in indices]
    assert not batch["image"][NO_IMAGE].any() and not batch["mask"][NO_IMAGE].any()
    assert not batch["audio"][NO_AUDIO].any() and not batch["events"][NO_AUDIO].any()
    keep = [i for i in indices if i not in (NO_IMAGE, NO_AUDIO)]
    for key in ("image", "audio", "mask", "events"):
        assert torch.equal(batch[key][keep], reference[key][keep]), key
    one = masked[NO_AUDIO]  # the per-item path
    assert one["audio"].shape == (1, 32, 101) and not one["audio"].any() and not bool(one["audio_present"])
    assert not masked[NO_IMAGE]["image"].any() and bool(masked[NO_IMAGE]["audio_present"])
    check_batch(batch)


def test_workers_collate_presence(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = folder(source, tmp_path / "ds", ABSENT)
    dm = ManifestDataModule(str(root), batch_size=3, num_workers=2, image_size=SIZE, clip_seconds=1.0)
    dm.setup("fit")
    assert "image+audio, mask, events (3 at 100 frames/s), 1 row(s) without image, 1 row(s) without audio" in (
        capsys.readouterr().out
    )
    seen: dict[int, tuple[bool, bool]] = {}
    for batch in dm.train_dataloader():
        check_batch(batch)
        assert batch["image_present"].dtype == torch.bool and batch["image_present"].shape == (3,)
        for row, image, audio in zip(batch["index"], batch["image_present"], batch["audio_present"], strict=True):
            seen[int(row)] = (bool(image), bool(audio))
    assert seen == {i: (i != NO_IMAGE, i != NO_AUDIO) for i in range(6)}


def test_plain_default_collate_workers(source: Path, tmp_path: Path) -> None:
    dataset = ManifestDataset(folder(source, tmp_path / "ds", ABSENT), "train", image_size=SIZE)
    batches = list(DataLoader(dataset, batch_size=6, num_workers=2))
    assert batches[0]["audio_present"].tolist() == [i != NO_AUDIO for i in range(6)]
