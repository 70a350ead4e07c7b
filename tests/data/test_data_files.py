"""The files the data module reads on its own obey the root's rules (issue #29: S(e), 1, 5).

Class lists, manifests, event tables and layout metadata that are symbolic links out of the root are
refused like rows (``data.allow_outside_root=true`` lifts it), and never printed; named pipes, devices
and sockets are refused without being opened (a FIFO blocked set-up forever); duplicate manifest
columns and JSONL keys are refused instead of the last one silently winning.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from sss.data import DataError, ManifestDataModule, ManifestDataset

REPO = Path(__file__).parents[2]
SECRET = "hf_SECRETTOKEN123"
TABLE = "filename\tonset\toffset\tevent_label\n"


@contextlib.contextmanager
def deadline(root: Path, seconds: float = 20) -> Iterator[None]:
    """Fail instead of hanging when something opens a FIFO under ``root`` for reading.

    A signal would not help: the open blocks inside C code (libsndfile), often while another thread
    takes the signal. Instead, once time is up, every FIFO under ``root`` is opened for writing over
    and over, which releases a blocked reader (it then reads end-of-file), and the block fails.
    """
    done, expired = threading.Event(), threading.Event()

    def release() -> None:
        if done.wait(seconds):
            return
        expired.set()
        while not done.is_set():
            for path in root.rglob("*"):
                if path.is_fifo():
                    with contextlib.suppress(OSError):  # ENXIO: nobody is reading it right now
                        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            done.wait(0.05)

    watchdog = threading.Thread(target=release, daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()
    assert not expired.is_set(), f"blocked for over {seconds} s: a FIFO under {root} was opened for reading"


def tone(path: Path, seconds: float = 1.0) -> None:
    sf.write(path, 0.3 * np.sin(2 * np.pi * 440 * np.arange(round(seconds * 16000)) / 16000), 16000)


def folder(root: Path) -> Path:
    root.mkdir(parents=True)
    Image.new("RGB", (32, 32), (200, 100, 50)).save(root / "good.png")
    Image.new("L", (32, 32), 255).save(root / "mask.png")
    tone(root / "good.wav")
    tone(root / "other.wav", 0.5)
    (root / "ev.tsv").write_text(TABLE + "good.wav\t0.1\t0.2\tknock\n")
    return root


def outside(tmp_path: Path, name: str, content: str) -> Path:
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    target = tmp_path / "elsewhere" / name
    target.write_text(content)
    return target


# --- S(e): files read from the root, linked out of it ---------------------------------------------------------


def _classes(root: Path, tmp_path: Path) -> str:
    (root / "train.csv").write_text("image,label\ngood.png,a\n")
    (root / "classes.txt").symlink_to(outside(tmp_path, "token.txt", f"a\n{SECRET}\n"))
    return "classes.txt"


def _event_classes(root: Path, tmp_path: Path) -> str:
    (root / "train.csv").write_text("audio,label,events\ngood.wav,a,ev.tsv\n")
    (root / "event_classes.txt").symlink_to(outside(tmp_path, "token.txt", f"knock\n{SECRET}\n"))
    return "event_classes.txt"


def _manifest_csv(root: Path, tmp_path: Path) -> str:
    (root / "train.csv").symlink_to(outside(tmp_path, "m.csv", f"image,label\ngood.png,{SECRET}\n"))
    return "train.csv"


def _manifest_jsonl(root: Path, tmp_path: Path) -> str:
    row = json.dumps({"image": "good.png", "label": SECRET})
    (root / "train.jsonl").symlink_to(outside(tmp_path, "m.jsonl", row + "\n"))
    return "train.jsonl"


def _esc50_metadata_through_a_folder_link(root: Path, tmp_path: Path) -> str:
    # Not the file but the folder above it is the link: the resolved path is what counts.
    outside(tmp_path, "esc50.csv", f"filename,fold,target,category\nx.wav,1,0,{SECRET}\n")
    (root / "esc").mkdir()
    (root / "esc" / "meta").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    return "esc/meta/esc50.csv"


ROOT_FILES: dict[str, Callable[[Path, Path], str]] = {
    "classes.txt": _classes,
    "event_classes.txt": _event_classes,
    "train.csv": _manifest_csv,
    "train.jsonl": _manifest_jsonl,
    "esc50 metadata through a folder link": _esc50_metadata_through_a_folder_link,
}


def build(root: Path, name: str, **kwargs: object) -> ManifestDataset:
    if name.startswith("esc50"):
        return ManifestDataset(root / "esc", "train", layout="esc50", **kwargs)  # type: ignore[arg-type]
    return ManifestDataset(root, "train", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(ROOT_FILES))
def test_a_root_file_linked_out_of_the_root_is_refused_and_never_printed(tmp_path: Path, name: str) -> None:
    root = folder(tmp_path / "ds")
    relative = ROOT_FILES[name](root, tmp_path)
    for on_error in ("raise", "skip"):  # the file is the whole split's, not a row to skip
        with pytest.raises(DataError) as info:
            build(root, name, on_error=on_error)
        message = str(info.value)
        assert message.startswith(f"{root / relative} is a symbolic link to {tmp_path / 'elsewhere'}"), message
        assert f"outside the dataset folder {root / 'esc' if 'esc' in relative else root}" in message
        assert "data.allow_outside_root=true" in message and "\n" not in message
        assert SECRET not in message
    if not name.startswith("esc50"):
        allowed = build(root, name, allow_outside_root=True)  # the documented opt-in, as for rows
        assert len(allowed) == 1


def test_the_data_module_refuses_a_linked_class_list_before_printing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = folder(tmp_path / "ds")
    _classes(root, tmp_path)
    dm = ManifestDataModule(str(root), clip_seconds=1.0)  # construction reads classes.txt too
    assert SECRET not in str(getattr(dm, "classes", ""))
    with pytest.raises(DataError, match=r"classes\.txt is a symbolic link to .*data\.allow_outside_root=true"):
        dm.setup("fit")
    assert SECRET not in capsys.readouterr().out


def test_a_linked_desed_table_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "desed"
    (root / "audio" / "train").mkdir(parents=True)
    tone(root / "audio" / "train" / "Y0.wav")
    (root / "metadata").mkdir()
    (root / "metadata" / "train.tsv").symlink_to(outside(tmp_path, "t.tsv", TABLE + f"Y0.wav\t0.1\t0.5\t{SECRET}\n"))
    with pytest.raises(DataError) as info:
        ManifestDataModule(str(root), layout="desed", clip_seconds=1.0).setup("fit")
    assert str(info.value).startswith(f"{root / 'metadata' / 'train.tsv'} is a symbolic link to ")
    assert SECRET not in str(info.value)
    dm = ManifestDataModule(str(root), layout="desed", clip_seconds=1.0, allow_outside_root=True)
    dm.setup("fit")
    assert dm.classes == [SECRET]  # followed when the user says so


PROBE = """
import os, sys
import soundfile
root, outside = sys.argv[1], sys.argv[2]
opened = []
def hook(event, args):
    if event == "open" and str(args[0]).startswith(outside):
        opened.append(str(args[0]))
sys.addaudithook(hook)
# libsndfile opens files in C, unseen by the audit hook: record what soundfile is asked to open.
real_info, RealSoundFile = soundfile.info, soundfile.SoundFile
def info(path, *args, **kwargs):
    hook("open", (os.path.realpath(path),))
    return real_info(path, *args, **kwargs)
class SoundFile(RealSoundFile):
    def __init__(self, path, *args, **kwargs):
        hook("open", (os.path.realpath(path),))
        super().__init__(path, *args, **kwargs)
soundfile.info, soundfile.SoundFile = info, SoundFile
from sss.data import DataError, ManifestDataModule
try:
    ManifestDataModule(root).setup("fit")  # clip length inferred: every clip is probed
except DataError as err:
    print("refused:", err)
os.unlink(os.path.join(root, "classes.txt"))
dm = ManifestDataModule(root, on_error="skip", batch_size=2)
dm.setup("fit")
print("served:", [len(batch["index"]) for batch in dm.train_dataloader()])
print("opened:", opened)
"""


def test_nothing_outside_the_root_is_opened(tmp_path: Path) -> None:
    # An audit hook sees every open() Python makes (class list, manifest, images); soundfile's are recorded too.
    root = folder(tmp_path / "ds")
    _classes(root, tmp_path)
    (root / "train.csv").write_text("audio,label\nlinked.wav,a\ngood.wav,a\n")
    tone(tmp_path / "elsewhere" / "x.wav")
    (root / "linked.wav").symlink_to(tmp_path / "elsewhere" / "x.wav")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(root), str(tmp_path / "elsewhere")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"refused: {root / 'classes.txt'} is a symbolic link" in done.stdout, done.stdout
    assert "served: [1]" in done.stdout
    assert done.stdout.strip().endswith("opened: []"), done.stdout


# --- 1: pipes, devices and sockets are never opened -----------------------------------------------------------


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("column", ["image", "audio", "mask", "events"])
def test_a_fifo_as_a_data_file_is_a_bad_row_and_never_blocks(tmp_path: Path, column: str) -> None:
    root = folder(tmp_path / "ds")
    fifo(root / f"pipe.{'tsv' if column == 'events' else 'wav' if column == 'audio' else 'png'}")
    good = {"image": "good.png", "audio": "good.wav", "mask": "mask.png", "events": "ev.tsv"}
    bad = {**good, column: f"pipe.{'tsv' if column == 'events' else 'wav' if column == 'audio' else 'png'}"}
    header = ",".join([*good, "label"])
    rows = [",".join([*good.values(), "a"]), ",".join([*bad.values(), "a"])]
    (root / "train.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    with deadline(root):
        with pytest.raises(DataError) as info:
            ManifestDataModule(str(root)).setup("fit")  # clip_seconds inferred: the probe that used to block
        dm = ManifestDataModule(str(root), on_error="skip", batch_size=2)
        dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))
    message = str(info.value)
    assert message.startswith(f"{root / 'train.csv'}, line 3: {column} path {root / bad[column]} is a named pipe")
    assert "not a regular file" in message and "data.on_error=skip" in message
    assert len(dm.datasets["train"]) == 1 and batch["index"].tolist() == [0]
    assert [(r["row"], r["file"]) for r in dm.skipped] == [(3, str(root / bad[column]))]


def test_a_file_replaced_by_a_fifo_after_the_check_is_refused_at_load(tmp_path: Path) -> None:
    root = folder(tmp_path / "ds")
    (root / "train.csv").write_text("audio,label\ngood.wav,a\nother.wav,a\n")
    dataset = ManifestDataset(root, "train", on_error="skip")
    (root / "good.wav").unlink()
    fifo(root / "good.wav")
    with deadline(root):
        item = dataset[0]  # the next good row is served in its place
    assert item["index"] == 1
    assert "is a named pipe (FIFO)" in dataset.skip_log.rows()[0]["reason"]


@pytest.mark.parametrize("name", ["classes.txt", "event_classes.txt", "train.csv", "train.jsonl"])
def test_a_fifo_root_file_is_refused_not_waited_on(tmp_path: Path, name: str) -> None:
    root = folder(tmp_path / "ds")
    if name != "train.csv":
        (root / "train.csv").write_text("audio,label,events\ngood.wav,a,ev.tsv\n")
    if name == "train.jsonl":
        (root / "train.csv").unlink()
    fifo(root / name)
    with deadline(root), pytest.raises(DataError) as info:
        ManifestDataModule(str(root), clip_seconds=1.0).setup("fit")
    assert str(info.value) == (
        f"{root / name}: is a named pipe (FIFO), not a regular file; give a regular file "
        "(sss never opens pipes or devices)"
    )


def test_a_device_is_a_bad_row(tmp_path: Path) -> None:
    root = folder(tmp_path / "ds")
    (root / "zero.wav").symlink_to("/dev/zero")  # would never end; allowed out of the root to reach the check
    (root / "train.csv").write_text("audio,label\ngood.wav,a\nzero.wav,a\n")
    with pytest.raises(DataError, match=r"line 3: audio path .*zero\.wav is a character device, not a"):
        ManifestDataModule(str(root), allow_outside_root=True).setup("fit")


def test_a_socket_is_a_bad_row() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:  # AF_UNIX paths are short: not under pytest's tmp_path
        root = folder(Path(tmp) / "ds")
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(root / "s.png"))
            (root / "train.csv").write_text("image,label\ngood.png,a\ns.png,a\n")
            with pytest.raises(DataError, match=r"line 3: image path .*s\.png is a socket, not a regular"):
                ManifestDataset(root, "train")


# --- 5: duplicate columns and keys ----------------------------------------------------------------------------


def test_a_duplicate_manifest_column_is_refused_naming_it(tmp_path: Path) -> None:
    root = folder(tmp_path / "ds")
    (root / "train.csv").write_text("image,audio,label,image\ngood.png,good.wav,a,mask.png\n")
    for on_error in ("raise", "skip"):
        with pytest.raises(DataError) as info:
            ManifestDataset(root, "train", on_error=on_error)
        assert str(info.value) == (
            f"{root / 'train.csv'}: column 'image' appears twice in the header (image,audio,label,image); keep one"
        )
    # Unnamed columns (a spreadsheet's trailing commas) are never read, so they may repeat.
    (root / "train.csv").write_text("image,label,,\ngood.png,a,,\n")
    assert len(ManifestDataset(root, "train")) == 1


def test_a_duplicate_jsonl_key_is_a_bad_row(tmp_path: Path) -> None:
    root = folder(tmp_path / "ds")
    lines = ['{"image": "good.png", "label": "a"}', '{"image": "good.png", "label": "b", "image": "mask.png"}']
    (root / "train.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"train\.jsonl, line 2: row has the key 'image' twice; keep one"):
        ManifestDataset(root, "train")
    assert len(ManifestDataset(root, "train", on_error="skip", classes=["a", "b"])) == 1


def test_duplicate_columns_of_metadata_and_event_tables_are_refused(tmp_path: Path) -> None:
    root = folder(tmp_path / "esc")
    (root / "meta").mkdir()
    (root / "meta" / "esc50.csv").write_text("filename,fold,target,category,fold\nx.wav,1,0,dog,2\n")
    with pytest.raises(DataError, match=r"esc50\.csv: column 'fold' appears twice in the header"):
        ManifestDataset(root, "train", layout="esc50")
    (root / "ev2.tsv").write_text("filename\tonset\toffset\tevent_label\tonset\ngood.wav\t0.1\t0.2\tknock\t0.9\n")
    (root / "train.csv").write_text("audio,label,events\ngood.wav,a,ev2.tsv\n")
    with pytest.raises(DataError, match=r"line 2: event table .*ev2\.tsv: column 'onset' appears twice"):
        ManifestDataset(root, "train", event_classes=["knock"])
