"""Holes in the data input found by an adversarial review: each case below was reproduced before the fix.

Symbolic links out of the root, one bad line of a shared event table, the file named in
``skipped.csv``, thin (line-scan) images, memory of very large images, and clips too short to
infer a clip length from.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image

from sss.data import DataError, ManifestDataModule, ManifestDataset
from sss.data._decode import load_image, load_mask

REPO = Path(__file__).parents[2]
TABLE_HEADER = "filename\tonset\toffset\tevent_label\n"


def tone(path: Path, seconds: float = 1.0, rate: int = 16000) -> None:
    t = np.arange(round(seconds * rate)) / rate
    sf.write(path, 0.3 * np.sin(2 * np.pi * 440 * t), rate, subtype="PCM_16")


def folder(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 32), (200, 100, 50)).save(root / "good.png")
    Image.new("L", (32, 32), 255).save(root / "mask.png")
    tone(root / "good.wav")
    (root / "classes.txt").write_text("a\nb\n")
    return root


def skipped_by_line(dataset: ManifestDataset) -> dict[int, dict[str, str]]:
    return {int(row["row"]): row for row in dataset.skip_log.rows()}


# --- 1. symbolic links that lead out of the root -------------------------------------------------------------


def test_a_symlink_out_of_the_root_is_refused_like_dotdot(tmp_path: Path) -> None:
    root = folder(tmp_path / "ds")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    Image.new("RGB", (32, 32)).save(outside / "secret.png")
    (root / "link.png").symlink_to(outside / "secret.png")  # a file link
    (root / "linked").symlink_to(outside, target_is_directory=True)  # a folder link
    (root / "inner.png").symlink_to(root / "good.png")  # stays inside: fine
    (root / "train.csv").write_text("image,label\ninner.png,a\nlink.png,a\nlinked/secret.png,b\n")
    with pytest.raises(DataError) as info:
        ManifestDataset(root, "train")
    message = str(info.value)
    assert message.startswith(f"{root / 'train.csv'}, line 3: path 'link.png' leaves the dataset folder {root} ")
    assert f"through a symbolic link to {outside / 'secret.png'}" in message
    assert "data.allow_outside_root=true" in message and "(1 more problem row(s)" in message

    skipping = ManifestDataset(root, "train", on_error="skip")
    assert skipping.images == [str(root / "inner.png")]
    skipped = skipped_by_line(skipping)
    assert set(skipped) == {3, 4}
    assert skipped[3]["file"] == str(root / "link.png") and skipped[4]["file"] == str(root / "linked/secret.png")
    assert "through a symbolic link" in skipped[4]["reason"]

    allowed = ManifestDataset(root, "train", allow_outside_root=True)  # the existing opt-in covers links too
    assert len(allowed) == 3 and allowed[1]["image"].shape == (3, 64, 64)


def test_a_root_reached_through_a_symlink_is_still_inside(tmp_path: Path) -> None:
    real = folder(tmp_path / "real")
    (real / "train.csv").write_text("image,label\ngood.png,a\n")
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    assert len(ManifestDataset(tmp_path / "alias", "train")) == 1


# --- 2. one bad line of a shared event table ------------------------------------------------------------------


def shared_events(root: Path, bad_line: str) -> Path:
    for name in ("a.wav", "b.wav", "c.wav"):
        tone(root / name)
    lines = ["a.wav\t0.1\t0.3\tknock", bad_line, "c.wav\t0.5\t0.7\tknock", "b.wav\t0.2\t0.4\tknock"]
    (root / "ev.tsv").write_text(TABLE_HEADER + "\n".join(lines) + "\n")
    (root / "train.csv").write_text("audio,label,events\na.wav,a,ev.tsv\nb.wav,b,ev.tsv\nc.wav,a,ev.tsv\n")
    return root


def test_a_bad_event_line_rejects_only_the_rows_of_its_clip(tmp_path: Path) -> None:
    root = shared_events(folder(tmp_path / "ds"), "b.wav\tsoon\t0.2\tknock")
    table = root / "ev.tsv"
    with pytest.raises(DataError) as info:
        ManifestDataset(root, "train")
    message = str(info.value)
    # The row of b.wav (line 3), not the first row that uses the table; the table's own line is named.
    assert message.startswith(f"{root / 'train.csv'}, line 3: event table {table}, line 3: onset/offset must be ")
    assert "fix or remove that line" in message and "more problem" not in message

    dataset = ManifestDataset(root, "train", on_error="skip")
    assert [os.path.basename(p) for p in dataset.audio] == ["a.wav", "c.wav"]
    assert dataset[0]["events"][10:30, 0].min() == 1.0 and dataset[1]["events"][50:70, 0].min() == 1.0
    skipped = skipped_by_line(dataset)
    assert list(skipped) == [3] and skipped[3]["file"] == str(table)


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [("b.wav\t0.9\t0.2\tknock", "need 0 <= onset <= offset"), ("b.wav\t0.2\t0.4\t", "event_label is empty")],
)
def test_other_malformed_event_lines_are_charged_to_their_clip(tmp_path: Path, bad_line: str, problem: str) -> None:
    root = shared_events(folder(tmp_path / "ds"), bad_line)
    dataset = ManifestDataset(root, "train", on_error="skip")
    assert len(dataset) == 2 and problem in skipped_by_line(dataset)[3]["reason"]


def test_desed_layout_keeps_the_clips_a_bad_line_does_not_name(tmp_path: Path) -> None:
    root = tmp_path / "desed"
    (root / "audio" / "train").mkdir(parents=True)
    for i in range(3):
        tone(root / "audio" / "train" / f"Y{i}.wav")
    lines = ["Y0.wav\t0.1\t0.5\tDog", "Y1.wav\toops\t0.5\tDog", "Y2.wav\t\t\t"]  # Y2: DCASE's "no events" row
    (root / "metadata").mkdir()
    (root / "metadata" / "train.tsv").write_text(TABLE_HEADER + "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"audio/train, line 2: event table .*train\.tsv, line 3: onset/offset"):
        ManifestDataModule(str(root), layout="desed", clip_seconds=1.0).setup("fit")
    dm = ManifestDataModule(str(root), layout="desed", clip_seconds=1.0, on_error="skip", batch_size=2)
    dm.setup("fit")
    train = dm.datasets["train"]
    assert [os.path.basename(p) for p in train.audio] == ["Y0.wav", "Y2.wav"] and dm.classes == ["Dog"]
    assert train[0]["events"][10:50, 0].min() == 1.0 and train[1]["events"].sum() == 0


def test_all_rows_skipped_names_the_list_of_skipped_rows(tmp_path: Path) -> None:
    root = folder(tmp_path / "ds")
    (root / "train.csv").write_text("image,audio,label\ngone.png,good.wav,a\ngood.png,gone.wav,b\n")
    log = tmp_path / "skipped.csv"
    with pytest.raises(DataError) as info:
        ManifestDataset(root, "train", on_error="skip", skip_log=log)
    message = str(info.value)
    assert message.startswith(f"{root / 'train.csv'}: no usable rows: all 2 were skipped (first: line 2: image file")
    assert message.endswith(f"the skipped rows are listed in {log}")
    with open(log, newline="") as handle:
        rows = list(csv.DictReader(handle))  # a table with a header, readable on its own
    assert [(r["row"], os.path.basename(r["file"])) for r in rows] == [("2", "gone.png"), ("3", "gone.wav")]


# --- 3. skipped.csv names the file that failed ----------------------------------------------------------------


@pytest.mark.parametrize("cache", [None, "features"])
def test_the_skip_list_names_the_file_at_fault(tmp_path: Path, cache: str | None) -> None:
    root = folder(tmp_path / "ds")
    (root / "my photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)  # corrupt, with a space in its name
    (root / "bad clip.wav").write_bytes(b"RIFF....not audio")
    (root / "ev.tsv").write_text(TABLE_HEADER)
    rows = [
        "good.png,good.wav,a,mask.png,ev.tsv",  # line 2: fine
        "gone.png,good.wav,a,mask.png,ev.tsv",  # line 3: the image is missing, the audio is fine
        "good.png,good.wav,b,gone_mask.png,ev.tsv",  # line 4: the mask is missing
        "good.png,good.wav,a,mask.png,gone.tsv",  # line 5: the event table is missing
        "my photo.png,good.wav,b,mask.png,ev.tsv",  # line 6: the image fails to decode
        "good.png,bad clip.wav,a,mask.png,ev.tsv",  # line 7: the audio fails to decode
        "good.png,good.wav,zebra,mask.png,ev.tsv",  # line 8: no file at fault: the row's first file
    ]
    (root / "train.csv").write_text("image,audio,label,mask,events\n" + "\n".join(rows) + "\n")
    dm = ManifestDataModule(
        str(root), batch_size=8, clip_seconds=0.5, on_error="skip", cache=cache, cache_dir=str(tmp_path / "cache")
    )
    dm.setup("fit")
    list(dm.train_dataloader())
    files = {row["row"]: row["file"] for row in dm.skipped}
    expected = {3: "gone.png", 4: "gone_mask.png", 5: "gone.tsv", 6: "my photo.png", 7: "bad clip.wav", 8: "good.wav"}
    assert files == {line: str(root / name) for line, name in expected.items()}
    reasons = {row["row"]: row["reason"] for row in dm.skipped}
    assert reasons[6].startswith("cannot be decoded") or reasons[6].startswith("is not an image")
    assert reasons[7].startswith("cannot be decoded as audio")
    written = dm.write_skipped(tmp_path / "run" / "skipped.csv")
    with open(written, newline="") as handle:
        assert {int(r["row"]): r["file"] for r in csv.DictReader(handle)} == files


# --- 4. thin images -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(5, 300), (300, 5), (1, 64)])
def test_a_thin_line_scan_image_is_resized_like_any_other(tmp_path: Path, size: tuple[int, int]) -> None:
    ramp = np.linspace(0, 255, max(size)).astype(np.uint8)
    pixels = np.tile(ramp[None, :], (size[1], 1)) if size[0] > size[1] else np.tile(ramp[:, None], (1, size[0]))
    Image.fromarray(pixels, "L").save(tmp_path / "strip.png")
    image = load_image(tmp_path / "strip.png", 32)
    assert image.shape == (3, 32, 32)
    along = image[0].mean(dim=0 if size[0] > size[1] else 1)  # the profile along the long side survives the resize
    assert torch.all(along[1:] >= along[:-1]) and along[-1] - along[0] > 3.5  # dark to bright (normalised units)
    assert load_mask(tmp_path / "strip.png", 16).shape == (1, 16, 16)


def test_placeholders_are_still_refused_with_a_precise_rule(tmp_path: Path) -> None:
    Image.new("RGB", (7, 7)).save(tmp_path / "tiny.png")
    with pytest.raises(DataError, match=r"is only 7x7 pixels \(minimum 8 along its longer side\): a placeholder"):
        load_image(tmp_path / "tiny.png", 32)


# --- 5. memory of very large images ---------------------------------------------------------------------------

MEASURE = """
import json, sys
from sss.data._decode import load_image
def status_mb(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key + ":"))
load_image(sys.argv[2], 8)  # warm up: first-call allocations are not the image's
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current resident size
before = status_mb("VmRSS")
image = load_image(sys.argv[1], 64)
peak = status_mb("VmHWM")
print(json.dumps({"delta_mb": peak - before, "shape": list(image.shape), "centre": image[:, 32, 32].tolist()}))
"""


def peak_decode_mb(path: Path, small: Path) -> dict[str, object]:
    """Peak memory of one `load_image(path, 64)` in a fresh process.

    Read from the child's own ``VmHWM`` (reset just before): ``getrusage``'s ``ru_maxrss`` survives
    ``exec`` and would report this (larger) test process's peak instead.
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), str(small)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="measures memory through Linux's /proc")
def test_a_very_large_image_is_reduced_before_it_is_copied(tmp_path: Path) -> None:
    side = 6000  # 36 M pixels: Pillow holds RGB as 4 bytes per pixel, 137 MiB decoded
    ramp = np.linspace(0, 255, side).astype(np.uint8)
    pixels = np.empty((side, side, 3), np.uint8)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = ramp[None, :], ramp[:, None], 128
    big = Image.fromarray(pixels)
    del pixels
    big.save(tmp_path / "big.png", compress_level=1)
    big.save(tmp_path / "big.jpg", quality=85)
    reference = big.resize((64, 64), Image.Resampling.BILINEAR)  # what a direct resize gives
    del big
    Image.new("RGB", (16, 16)).save(tmp_path / "small.png")
    decoded_mb = side * side * 4 / 2**20
    png = peak_decode_mb(tmp_path / "big.png", tmp_path / "small.png")
    jpg = peak_decode_mb(tmp_path / "big.jpg", tmp_path / "small.png")
    # PNG has no reduced decode in Pillow: one decoded copy, reduced at once (it was two full copies, 2x).
    assert png["delta_mb"] < 1.3 * decoded_mb, (png["delta_mb"], decoded_mb)
    # JPEG decodes at 1/8 scale (750x750): a few MiB.
    assert jpg["delta_mb"] < 0.15 * decoded_mb, (jpg["delta_mb"], decoded_mb)
    expected = (np.asarray(reference, dtype=np.float32)[32, 32] / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    for result in (png, jpg):
        assert result["shape"] == [3, 64, 64]
        assert np.allclose(result["centre"], expected, atol=0.05), (result["centre"], expected)


# --- 6. clips too short to infer a clip length from -----------------------------------------------------------


def test_clips_too_short_to_infer_a_length_from_fail_at_setup_with_the_fix(tmp_path: Path) -> None:
    root = folder(tmp_path / "ds")
    for i in range(3):
        tone(root / f"click{i}.wav", seconds=0.003)  # 48 samples
    (root / "train.csv").write_text("audio,label\n" + "".join(f"click{i}.wav,a\n" for i in range(3)))
    with pytest.raises(DataError) as info:
        ManifestDataModule(str(root)).setup("fit")
    message = str(info.value)
    assert message.startswith(f"{root / 'train.csv'}: cannot infer the clip length: the median duration of 3 audio")
    assert "is 3.0 ms" in message and "set data.clip_seconds" in message
    dm = ManifestDataModule(str(root), clip_seconds=0.5, batch_size=3)  # what the message says to do
    dm.setup("fit")
    assert next(iter(dm.train_dataloader()))["audio"].shape == (3, 1, 8000)
    with pytest.raises(ValueError, match=r"data\.clip_seconds must be > 0 .*got 0"):
        ManifestDataModule(str(root), clip_seconds=0).setup("fit")
