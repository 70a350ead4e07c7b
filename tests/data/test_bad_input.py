"""Bad input: every kind gives one clear error naming the file and the row (raise), or is left out and listed (skip).

Conditions that are valid and fixed on the fly (8 channels, 192 kHz, CMYK, 16-bit, BOM, ...)
must load with correct values instead.
"""

from __future__ import annotations

import csv
import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image

from sss.callbacks.stock import add_stock_callbacks
from sss.data import DataError, ManifestDataModule, ManifestDataset
from sss.data._decode import IMAGENET_MEAN, IMAGENET_STD

HEADER = "image,audio,label,mask,events"
GOOD = "good.png,good.wav,a,mask.png,ev.tsv"


def base(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 32), (200, 100, 50)).save(root / "good.png")
    Image.new("L", (32, 32), 255).save(root / "mask.png")
    t = np.arange(16000) / 16000
    sf.write(root / "good.wav", 0.3 * np.sin(2 * np.pi * 440 * t), 16000, subtype="PCM_16")
    (root / "ev.tsv").write_text("filename\tonset\toffset\tevent_label\ngood.wav\t0.1\t0.2\tknock\n")
    (root / "classes.txt").write_text("a\nb\n")
    return root


def wav_bytes(root: Path) -> bytes:
    return (root / "good.wav").read_bytes()


# Each kind writes its bad file(s) into root and returns its manifest row, and a pattern the message must match.
def _truncated_audio(r: Path) -> tuple[str, str]:
    (r / "t.wav").write_bytes(wav_bytes(r)[:5000])
    return (
        "good.png,t.wav,a,mask.png,ev.tsv",
        r"audio file .*t\.wav is truncated: its header announces 16000 frames but only \d+ are there",
    )


def _empty_audio(r: Path) -> tuple[str, str]:
    (r / "e.wav").write_bytes(b"")
    return "good.png,e.wav,a,mask.png,ev.tsv", r"audio file .*e\.wav cannot be decoded as audio"


def _garbage_audio(r: Path) -> tuple[str, str]:
    (r / "g.wav").write_bytes(np.random.default_rng(0).bytes(3000))
    return "good.png,g.wav,a,mask.png,ev.tsv", r"audio file .*g\.wav cannot be decoded as audio"


def _nan_audio(r: Path) -> tuple[str, str]:
    sf.write(r / "nan.wav", np.array([0.1, np.nan, 0.2] * 100, dtype=np.float32), 16000, subtype="FLOAT")
    return "good.png,nan.wav,a,mask.png,ev.tsv", r"audio file .*nan\.wav contains NaN or infinite samples"


def _inf_audio(r: Path) -> tuple[str, str]:
    sf.write(r / "inf.wav", np.array([0.1, np.inf] * 100, dtype=np.float32), 16000, subtype="FLOAT")
    return "good.png,inf.wav,a,mask.png,ev.tsv", r"audio file .*inf\.wav contains NaN or infinite samples"


def _zero_length_audio(r: Path) -> tuple[str, str]:
    sf.write(r / "zero.wav", np.zeros(0, dtype=np.float32), 16000, subtype="PCM_16")
    return "good.png,zero.wav,a,mask.png,ev.tsv", r"audio file .*zero\.wav has no samples \(0-length clip\)"


def _text_as_audio(r: Path) -> tuple[str, str]:
    (r / "notes.wav").write_text("this is not a sound\n")
    return "good.png,notes.wav,a,mask.png,ev.tsv", r"audio file .*notes\.wav cannot be decoded as audio"


def _corrupt_png(r: Path) -> tuple[str, str]:
    data = bytearray((r / "good.png").read_bytes())
    data[40:80] = b"\x00" * 40  # inside IHDR/IDAT: CRC and zlib both break
    (r / "c.png").write_bytes(bytes(data))
    return "c.png,good.wav,a,mask.png,ev.tsv", r"image file .*c\.png (cannot be decoded|is not an image)"


def _truncated_png(r: Path) -> tuple[str, str]:
    noisy = np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noisy).save(r / "full.png")
    (r / "tr.png").write_bytes((r / "full.png").read_bytes()[:3000])
    return "tr.png,good.wav,a,mask.png,ev.tsv", r"image file .*tr\.png cannot be decoded"


def _tiny_image(r: Path) -> tuple[str, str]:
    Image.new("RGB", (1, 1)).save(r / "px.png")
    return "px.png,good.wav,a,mask.png,ev.tsv", r"image file .*px\.png is only 1x1 pixels"


def _audio_as_image(r: Path) -> tuple[str, str]:
    return "good.wav,good.wav,a,mask.png,ev.tsv", r"image file .*good\.wav is not an image"


def _corrupt_mask(r: Path) -> tuple[str, str]:
    (r / "m.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)
    return "good.png,good.wav,a,m.png,ev.tsv", r"mask file .*m\.png (cannot be decoded|is not an image)"


def _missing_file(r: Path) -> tuple[str, str]:
    return "good.png,gone.wav,a,mask.png,ev.tsv", r"audio file not found: .*gone\.wav"


def _directory(r: Path) -> tuple[str, str]:
    (r / "folder.png").mkdir()
    return "folder.png,good.wav,a,mask.png,ev.tsv", r"image path .*folder\.png is a directory, not a file"


def _fifo_audio(r: Path) -> tuple[str, str]:
    os.mkfifo(r / "pipe.wav")  # opening it would wait for a writer forever: refused from os.stat alone
    return "good.png,pipe.wav,a,mask.png,ev.tsv", r"audio path .*pipe\.wav is a named pipe \(FIFO\), not a regular file"


def _unknown_label(r: Path) -> tuple[str, str]:
    return "good.png,good.wav,zebra,mask.png,ev.tsv", r"unknown label 'zebra' \(classes: a, b\)"


def _empty_label(r: Path) -> tuple[str, str]:
    return "good.png,good.wav,,mask.png,ev.tsv", r"has an empty label"


def _empty_path(r: Path) -> tuple[str, str]:
    return ",good.wav,a,mask.png,ev.tsv", r"has an empty image path"


def _duplicate(r: Path) -> tuple[str, str]:
    return GOOD, r"duplicates line 2 \(every column equal\)"


def _dotdot(r: Path) -> tuple[str, str]:
    Image.new("RGB", (32, 32)).save(r.parent / "outside.png")
    return "../outside.png,good.wav,a,mask.png,ev.tsv", r"path '../outside.png' leaves the dataset folder"


def _absolute(r: Path) -> tuple[str, str]:
    Image.new("RGB", (32, 32)).save(r.parent / "abs.png")
    return f"{r.parent / 'abs.png'},good.wav,a,mask.png,ev.tsv", r"abs\.png' leaves the dataset folder"


def _symlink_outside(r: Path) -> tuple[str, str]:
    Image.new("RGB", (32, 32)).save(r.parent / "linked_target.png")
    (r / "out.png").symlink_to(r.parent / "linked_target.png")
    return "out.png,good.wav,a,mask.png,ev.tsv", r"path 'out\.png' leaves the dataset folder .* through a symbolic link"


def _short_row(r: Path) -> tuple[str, str]:
    return "good.png,good.wav,a", r"row has 3 fields but the header has 5"


def _missing_events_table(r: Path) -> tuple[str, str]:
    return "good.png,good.wav,b,mask.png,nope.tsv", r"events file not found: .*nope\.tsv"


def _bad_events_table(r: Path) -> tuple[str, str]:
    (r / "bad.tsv").write_text("filename\tonset\toffset\tevent_label\ngood.wav\tsoon\t0.2\tknock\n")
    return "good.png,good.wav,b,mask.png,bad.tsv", r"event table .*bad\.tsv, line 2: onset/offset must be numbers"


ROW_KINDS: dict[str, Callable[[Path], tuple[str, str]]] = {
    name.strip("_"): fn
    for name, fn in list(globals().items())
    if name.startswith("_") and not name.startswith("__") and callable(fn) and name not in ("_",)
}


def test_there_are_at_least_25_kinds() -> None:
    assert len(ROW_KINDS) + len(MANIFEST_KINDS) >= 25, sorted(ROW_KINDS) + sorted(MANIFEST_KINDS)


def load_all(root: Path, **kwargs: object) -> list[dict[str, object]]:
    dataset = ManifestDataset(root, "train", image_size=32, **kwargs)  # type: ignore[arg-type]
    return [dataset[i] for i in range(len(dataset))]


@pytest.mark.parametrize("kind", sorted(ROW_KINDS))
def test_raise_names_manifest_row_and_file(tmp_path: Path, kind: str) -> None:
    root = base(tmp_path / "ds")
    row, pattern = ROW_KINDS[kind](root)
    (root / "train.csv").write_text(f"{HEADER}\n{GOOD}\n{row}\n")
    with pytest.raises(DataError) as info:
        load_all(root)
    message = str(info.value)
    assert message.startswith(f"{root / 'train.csv'}, line 3: "), message
    assert "\n" not in message and "data.on_error=skip" in message
    assert pytest.importorskip("re").search(pattern, message), (pattern, message)


def write_manifest(root: Path, content: bytes) -> Path:
    (root / "train.csv").write_bytes(content)
    return root


MANIFEST_KINDS: dict[str, tuple[bytes, str]] = {
    "empty_manifest": (b"", r"train\.csv: empty manifest \(no header, no rows\)"),
    "header_only": (HEADER.encode() + b"\n", r"train\.csv: no usable rows"),
    "missing_column": (b"image,audio\ngood.png,good.wav\n", r"train\.csv: missing column label \(or labels"),
    "no_media_column": (b"picture,label\ngood.png,a\n", r"train\.csv: no image or audio column"),
    "non_utf8": (
        f"{HEADER}\n".encode() + "caf\xe9.png,good.wav,a,mask.png,ev.tsv\n".encode("latin-1"),
        r"train\.csv, line 2: not UTF-8",
    ),
    "label_and_labels": (b"image,audio,label,labels\ngood.png,good.wav,a,a\n", r"both label and labels columns"),
    "duplicate_column": (
        b"image,audio,label,image\ngood.png,good.wav,a,mask.png\n",
        r"train\.csv: column 'image' appears twice in the header \(image,audio,label,image\); keep one",
    ),
}


@pytest.mark.parametrize("kind", sorted(MANIFEST_KINDS))
def test_manifest_level_problems_raise_under_both_policies(tmp_path: Path, kind: str) -> None:
    content, pattern = MANIFEST_KINDS[kind]
    root = write_manifest(base(tmp_path / "ds"), content)
    for on_error in ("raise", "skip"):  # a broken manifest has no rows to skip
        with pytest.raises(DataError, match=pattern):
            load_all(root, on_error=on_error)


def test_invalid_jsonl_line_is_a_row_error(tmp_path: Path) -> None:
    root = base(tmp_path / "ds")
    (root / "train.jsonl").write_text(
        '{"image": "good.png", "audio": "good.wav", "label": "a"}\n{"image": oops}\n[1]\n'
    )
    with pytest.raises(DataError, match=r"train\.jsonl, line 2: row is not valid JSON .*\(1 more problem"):
        load_all(root)
    assert len(load_all(root, on_error="skip")) == 1


def test_fixable_conditions_load_correctly(tmp_path: Path) -> None:
    root = base(tmp_path / "ds")
    t = np.arange(192000) / 192000
    sf.write(root / "hi.wav", 0.5 * np.sin(2 * np.pi * 440 * t), 192000, subtype="PCM_24")  # 192 kHz
    sf.write(root / "oct.wav", np.tile(0.25 * np.sin(2 * np.pi * 440 * t[:48000:4])[:, None], (1, 8)), 12000)  # 8 ch
    sf.write(root / "x.flac", 0.5 * np.sin(2 * np.pi * 440 * np.arange(8000) / 8000), 8000)  # FLAC at 8 kHz
    Image.new("CMYK", (40, 40), (0, 255, 255, 0)).save(root / "cmyk.jpg")  # red in CMYK
    Image.fromarray(np.full((40, 40), 32896, dtype=np.uint16)).save(root / "deep.png")  # 16-bit mid grey
    Image.new("LA", (40, 40), (255, 0)).save(root / "la.png")
    Image.new("P", (40, 40)).save(root / "pal.gif")
    rows = ["cmyk.jpg,hi.wav,a", "deep.png,oct.wav,a", "la.png,x.flac,b", "pal.gif,good.wav,b"]
    content = "\ufeffimage,audio,label\n" + "\n".join(rows) + "\n"  # with a spreadsheet BOM
    (root / "train.csv").write_text(content, encoding="utf-8")
    items = load_all(root)
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    rgb = [item["image"] * std + mean for item in items]  # type: ignore[operator]
    assert rgb[0][:, 20, 20].tolist() == pytest.approx([1.0, 0.0, 0.0], abs=0.05)
    assert rgb[1][:, 20, 20].tolist() == pytest.approx([128 / 255] * 3, abs=0.01)  # scaled, not clipped to white
    for item in items:
        audio = item["audio"]
        assert audio.shape == (1, 16000) and torch.isfinite(audio).all()  # type: ignore[union-attr]
        assert 0.2 < audio.abs().max() < 0.6  # type: ignore[union-attr]
    spectrum = torch.fft.rfft(items[0]["audio"][0]).abs()  # type: ignore[index]
    assert spectrum.argmax().item() == 440  # 192 kHz resampled to 16 kHz keeps the tone


def bad_folder(root: Path) -> tuple[Path, dict[int, str]]:
    """Good rows interleaved with one row of every row-level kind; returns the bad rows' lines."""
    base(root)
    for i in range(8):
        Image.new("RGB", (32, 32), (i * 30, 80, 160)).save(root / f"ok{i}.png")
    lines, bad = [HEADER, GOOD], {}
    for i, (kind, make) in enumerate(sorted(ROW_KINDS.items())):
        row, _ = make(root)
        lines.append(row)
        bad[len(lines)] = kind
        if i < 8:
            lines.append(f"ok{i}.png,good.wav,{'ab'[i % 2]},mask.png,ev.tsv")
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    (root / "val.csv").write_text("\n".join(lines) + "\n")
    return root, bad


def read_skipped(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_skip_trains_and_lists_exactly_the_bad_rows(tmp_path: Path) -> None:
    from sss import SSSTrainer, TrainerConfig
    from sss.models import create_model

    root, bad = bad_folder(tmp_path / "ds")
    dm = ManifestDataModule(str(root), batch_size=3, image_size=32, clip_seconds=0.5, on_error="skip")
    model = create_model("hunter_tiny", num_classes=2)
    config = TrainerConfig(max_epochs=1, output_dir=str(tmp_path / "run"), cpu=True)
    config.log.progress, config.log.trackers, config.checkpoint.every_epoch = False, [], False
    add_stock_callbacks(SSSTrainer(config)).fit(model, dm)
    # the stock SkippedRows callback wrote OUTPUT_DIR/skipped.csv at the epoch's end
    written = read_skipped(tmp_path / "run" / "skipped.csv")
    train = {int(r["row"]): r for r in written if r["manifest"].endswith("train.csv")}
    val = {int(r["row"]) for r in written if r["manifest"].endswith("val.csv")}
    assert set(train) == set(bad) == val, (sorted(train), sorted(bad))
    assert list(written[0]) == ["manifest", "row", "file", "reason"]
    assert all(r["reason"] for r in written)
    assert "gone.wav" in train[next(k for k, v in bad.items() if v == "missing_file")]["file"]
    assert "contains NaN" in train[next(k for k, v in bad.items() if v == "nan_audio")]["reason"]
    assert dm.skipped_summary().startswith(f"sss: {2 * len(bad)} data row(s) skipped so far")


def test_skip_keeps_batch_shapes_and_serves_only_good_rows(tmp_path: Path) -> None:
    root, bad = bad_folder(tmp_path / "ds")
    dm = ManifestDataModule(
        str(root),
        batch_size=5,
        image_size=32,
        clip_seconds=0.5,
        on_error="skip",
        num_workers=1,
        persistent_workers=False,
    )
    dm.setup("fit")
    dataset = dm.datasets["val"]
    batches = list(dm.val_dataloader())  # type: ignore[arg-type]
    served = {dataset.lines[int(i)] for b in batches for i in b["index"]}
    assert sum(len(b["index"]) for b in batches) == len(dataset)
    assert not served & set(bad) and 2 in served
    # Rows skipped inside the worker process reach the main process's list.
    assert {r["row"] for r in dm.skipped if r["manifest"].endswith("val.csv")} == set(bad)


def test_wav_header_frame_count_is_what_truncation_is_checked_against(tmp_path: Path) -> None:
    # A WAV whose data chunk size was patched to claim more frames than present.
    root = base(tmp_path)
    data = bytearray(wav_bytes(root))
    at = data.find(b"data")
    data[at + 4 : at + 8] = struct.pack("<I", 64000)
    (root / "claim.wav").write_bytes(bytes(data))
    (root / "train.csv").write_text("image,audio,label\ngood.png,claim.wav,a\n")
    with pytest.raises(DataError, match=r"line 2: audio file .*claim\.wav is truncated"):
        load_all(root)
