"""Record layouts with one modality absent: `RecordDecoder`, `sss data pack` shards and Hugging Face Parquet."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image

from sss.data import DataError, ManifestDataModule, ManifestDataset
from sss.data.contract import check_batch
from sss.data.manifest import SkipLog, collate
from sss.data.records import Record, RecordDecoder, SourceDataset
from sss.data.shards import open_shards, pack
from sss.data.synthetic import make_industrial

SIZE = 32
NO_IMAGE, NO_AUDIO = 1, 3


def _wav() -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, np.random.default_rng(0).uniform(-0.5, 0.5, 8000).astype(np.float32), 8000, format="WAV")
    return buffer.getvalue()


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def decoder(modalities: tuple[str, ...] = ("image", "audio"), **kwargs: object) -> RecordDecoder:
    return RecordDecoder(classes=["a", "b"], modalities=modalities, image_size=SIZE, **kwargs)  # type: ignore[arg-type]


def test_decoder_fills_absent_modalities() -> None:
    full = decoder(has_mask=True)(Record("x.tar", 0, "k", _png(), _wav(), _png(), 1), 0)
    no_image = decoder(has_mask=True)(Record("x.tar", 1, "k", None, _wav(), None, 1), 1)
    no_audio = decoder(has_mask=True)(Record("x.tar", 2, "k", _png(), b"", _png(), 1), 2)
    assert bool(full["image_present"]) and bool(full["audio_present"]) and full["image_present"].dtype == torch.bool
    assert not bool(no_image["image_present"]) and bool(no_image["audio_present"])
    assert no_image["image"].shape == (3, SIZE, SIZE) and not no_image["image"].any() and not no_image["mask"].any()
    assert torch.equal(no_image["audio"], full["audio"]) and torch.equal(no_audio["image"], full["image"])
    assert no_audio["audio"].shape == (1, 16000) and not no_audio["audio"].any() and not bool(no_audio["audio_present"])


def test_decoder_keeps_a_full_records_draws() -> None:
    """Training crops: a record without its image still gets the audio crop of the full record (same seed)."""
    make = decoder(train=True, clip_seconds=0.25)
    torch.manual_seed(5)
    full = make(Record("x.tar", 0, "k", _png(), _wav(), target=0), 0)
    torch.manual_seed(5)
    no_image = make(Record("x.tar", 0, "k", None, _wav(), target=0), 0)
    assert torch.equal(full["audio"], no_image["audio"])


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (Record("x.tar", 4, "k", target=0), "has neither an image nor an audio; a sample needs at least one"),
        (Record("x.tar", 4, "k", None, _wav(), _png(), 0), "has a mask but no image"),
        (Record("x.tar", 4, "k", _png(), None, None, 0, ((0.0, 0.1, 0),)), "has events but no audio"),
    ],
    ids=["neither", "mask-without-image", "events-without-audio"],
)
def test_decoder_refuses_bad_records(record: Record, reason: str) -> None:
    make = decoder(has_mask=bool(record.mask), event_classes=["knock"])
    with pytest.raises(DataError, match=rf"^x\.tar, sample 4 \(key k\): {reason}"):
        make(record, 0)


def test_single_modality_records_unchanged() -> None:
    item = decoder(("audio",))(Record("x.tar", 0, "k", audio=_wav(), target=0), 0)
    assert set(item) == {"audio", "label", "index"}
    with pytest.raises(DataError, match=r"has no audio \(every sample of this split needs one\)"):
        decoder(("audio",))(Record("x.tar", 0, "k", target=0), 0)


# --- shards and Parquet made from a manifest with absences ------------------------------------------------------


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic dataset (6 train rows, 2 val) with row 1 lacking its image (and mask), row 3 its audio."""
    root = make_industrial(tmp_path_factory.mktemp("rec") / "ind", n_train=6, n_val=2, n_test=0, image_size=SIZE)
    with open(root / "train.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows[NO_IMAGE].update(image="", mask="")
    rows[NO_AUDIO].update(audio="", events="")
    with open(root / "train.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return root


def test_pack_writes_present_members_and_reads_them_back(masked: Path, tmp_path: Path) -> None:
    pack(masked, tmp_path / "shards", shard_size=4)
    index = json.loads((tmp_path / "shards" / "shards.json").read_text())
    samples = [s for shard in index["splits"]["train"]["shards"] for s in shard["index"]]
    assert samples[NO_IMAGE]["absent"] == ["image"] and sorted(samples[NO_IMAGE]["members"]) == ["json", "wav"]
    assert samples[NO_AUDIO]["absent"] == ["audio"] and sorted(samples[NO_AUDIO]["members"]) == [
        "json",
        "mask.png",
        "png",
    ]
    assert all("absent" not in s for i, s in enumerate(samples) if i not in (NO_IMAGE, NO_AUDIO))
    source = open_shards(tmp_path / "shards", "train")
    assert source is not None and source.modalities == ("image", "audio")
    got = SourceDataset(source, RecordDecoder.of(source, image_size=SIZE), skip_log=SkipLog(tmp_path / "s.csv"))
    rows = ManifestDataset(masked, "train", image_size=SIZE)
    batch, reference = collate([got[i] for i in range(6)]), collate([rows[i] for i in range(6)])
    assert batch["image_present"].tolist() == [i != NO_IMAGE for i in range(6)]
    assert batch["audio_present"].tolist() == [i != NO_AUDIO for i in range(6)]
    for key in ("image", "audio", "mask", "events", "label", "image_present", "audio_present"):
        assert torch.equal(batch[key], reference[key]), key  # placeholders included
    check_batch(batch)


def test_shards_stream_with_workers(masked: Path, tmp_path: Path) -> None:
    pack(masked, tmp_path / "shards", shard_size=2)
    dm = ManifestDataModule(str(tmp_path / "shards"), layout="shards", batch_size=2, num_workers=2, image_size=SIZE)
    dm.setup("fit")
    seen = {}
    for batch in dm.train_dataloader():
        check_batch(batch)
        for row, image, audio in zip(batch["index"], batch["image_present"], batch["audio_present"], strict=True):
            seen[int(row)] = (bool(image), bool(audio))
    assert seen == {i: (i != NO_IMAGE, i != NO_AUDIO) for i in range(6)}


def test_hf_parquet_none_cells_are_absent(masked: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = ManifestDataset(masked, "train", image_size=SIZE)
    cell = lambda path: {"bytes": Path(path).read_bytes(), "path": Path(path).name} if path else None  # noqa: E731
    struct = {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}
    features = datasets.Features(
        {"image": datasets.Image(), "audio": struct, "label": datasets.ClassLabel(names=rows.classes)}
    )
    table = datasets.Dataset.from_dict(
        {"image": [cell(p) for p in rows.images], "audio": [cell(p) for p in rows.audio], "label": rows.targets},
        features=features,
    ).cast_column("audio", datasets.Audio(decode=False))
    (tmp_path / "hub" / "data").mkdir(parents=True)
    table.to_parquet(str(tmp_path / "hub" / "data" / "train-00000-of-00001.parquet"), batch_size=4)
    dm = ManifestDataModule(str(tmp_path / "hub"), layout="hf", batch_size=6, num_workers=2, image_size=SIZE)
    dm.setup("fit")
    batch = collate([dm.datasets["train"][i] for i in range(6)])
    assert batch["image_present"].tolist() == [i != NO_IMAGE for i in range(6)]
    assert batch["audio_present"].tolist() == [i != NO_AUDIO for i in range(6)]
    augmented = ManifestDataset(masked, "train", image_size=SIZE, train=True)  # the same seeded draws
    reference = collate([augmented[i] for i in range(6)])
    for key in ("image", "audio", "label"):
        assert torch.equal(batch[key], reference[key]), key
    check_batch(batch)
    shuffled = next(iter(dm.train_dataloader()))  # 2 workers, map-style
    for row, image, audio in zip(shuffled["index"], shuffled["image_present"], shuffled["audio_present"], strict=True):
        assert (bool(image), bool(audio)) == (int(row) != NO_IMAGE, int(row) != NO_AUDIO)
