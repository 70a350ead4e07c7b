"""A full disk on every write path: one ``error:`` line naming the folder being written, exit 1, nothing left behind.

Each case runs twice: on a real full file system (a 1 MB tmpfs filled up, mounted when the tests run
as root on Linux; skipped otherwise) and with the write call failing as a full disk makes it fail
(``OSError(ENOSPC)`` without a file name, as ``write()`` and ``flush()`` raise it), which runs everywhere.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

import sss
from sss.cli import main
from sss.config import SSSConfig
from sss.model_folder import export_model
from sss.models import create_model
from sss.testing import subprocess_env

BORING = {
    "name": "boring",
    "trainer": {"max_steps": 3, "log": {"progress": False, "trackers": []}},
    "model": {"_target_": "sss.testing.BoringModule", "dim": 8},
    "data": {"_target_": "sss.testing.BoringDataModule"},
}
HUNTER = {"_target_": "sss.models.create_model", "name": "hunter_tiny", "num_classes": 4}


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")  # no file name: what write() and flush() raise


def _mount_full(folder: Path) -> bool:
    if sys.platform != "linux" or os.geteuid() != 0:
        return False
    folder.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(folder)], capture_output=True).returncode:
        return False
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, bytes(4096)):
            pass
    except OSError:  # full
        pass
    finally:
        os.close(fd)
    return True


@dataclass
class Full:
    folder: Path
    """A folder on a full file system."""
    injected: bool
    """True: the folder is not full; the test makes the write fail as on a full disk."""


@pytest.fixture(params=["tmpfs", "injected"])
def full(request, tmp_path):
    folder = tmp_path / "full"
    if request.param == "tmpfs":
        if not _mount_full(folder):
            pytest.skip("mounting a 1 MB tmpfs needs root on Linux; the injected case runs instead")
        yield Full(folder, injected=False)
        subprocess.run(["umount", "-l", str(folder)], check=False)
    else:
        folder.mkdir()
        yield Full(folder, injected=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A boring run with a checkpoint, and its config."""
    root = tmp_path_factory.mktemp("trained")
    config = root / "boring.yaml"
    config.write_text(yaml.safe_dump(BORING))
    assert main(["fit", str(config), f"trainer.output_dir={root / 'run'}"]) == 0
    return config, root / "run" / "checkpoints" / "step_0000003"


@pytest.fixture(scope="module")
def hunter(tmp_path_factory):
    """A hunter_tiny model folder and an unlabelled manifest of 48 rows."""
    root = tmp_path_factory.mktemp("hunter")
    data = sss.data.make_industrial(root / "industrial", n_train=4, n_val=48, n_test=0)
    classes = (data / "classes.txt").read_text().split()
    prep = SimpleNamespace(classes=classes, task="multiclass", image_size=64, sample_rate=16000, clip_seconds=1.0)
    torch.manual_seed(0)
    module = create_model("hunter_tiny", num_classes=len(classes))
    folder = export_model(module, SSSConfig(name="hunter", model=dict(HUNTER)), {}, root / "model", prep)
    rows = (data / "val.csv").read_text().splitlines()
    (data / "rows.csv").write_text("\n".join(",".join(r.split(",")[:2]) for r in rows) + "\n")
    return folder, data / "rows.csv"


def _one_line(capfd, folder: Path) -> str:
    return _lines(capfd.readouterr().err, folder)


def test_export_names_out_and_leaves_no_folder(full, trained, monkeypatch, capfd):
    config, ckpt = trained
    if full.injected:
        import safetensors.torch

        monkeypatch.setattr(safetensors.torch, "save_file", _no_space)
    out = full.folder / "exported" / "model"
    assert main(["export", str(config), str(out), "--ckpt", str(ckpt)]) == 1
    _one_line(capfd, out)
    assert not (full.folder / "exported").exists()  # neither OUT nor the parent it created


def test_onnx_export_of_a_model_folder_names_out(full, trained, tmp_path, monkeypatch, capfd):
    config, ckpt = trained
    folder = tmp_path / "model"
    assert main(["export", str(config), str(folder), "--ckpt", str(ckpt)]) == 0
    capfd.readouterr()
    if full.injected:
        import shutil

        def copy_fails(src, dst, **kwargs):  # shutil's own ENOSPC names both files
            raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))

        monkeypatch.setattr(shutil, "copyfile", copy_fails)
    out = full.folder / "onnx"
    assert main(["export", str(folder), str(out), "--format", "onnx"]) == 1
    _one_line(capfd, out)
    assert not out.exists()


def test_predict_names_the_output_folder_and_leaves_no_csv(full, hunter, monkeypatch, capfd):
    folder, rows = hunter
    if full.injected:
        import sss.run.predict

        def half(file, *args):
            file.write("row,image,audio,prediction\n")
            _no_space()

        monkeypatch.setattr(sss.run.predict, "_write_rows", half)
    out = full.folder / "preds" / "p.csv"
    assert main(["predict", str(folder), "--input", str(rows), "--output", str(out)]) == 1
    _one_line(capfd, out.parent)
    assert not out.parent.exists()  # no CSV, no .partial, and not the folder predict created


def test_data_make_names_out(full, monkeypatch, capfd):
    if full.injected:
        monkeypatch.setattr(sss.data.synthetic, "_write_files", _no_space)
    out = full.folder / "industrial"
    assert main(["data", "make", "industrial", str(out), "--n", "8"]) == 1
    _one_line(capfd, out)
    assert not out.exists() and not list(full.folder.glob(".industrial.tmp-*"))


def _boring_run(tmp_path: Path, full: Path, sub: str) -> tuple[Path, Path]:
    run = tmp_path / "run"
    run.mkdir()
    (run / sub).symlink_to(full)  # the run's folder has room; this folder of it is full
    config = tmp_path / "boring.yaml"
    config.write_text(yaml.safe_dump(BORING))
    return config, run


def _lines(err: str, folder: Path) -> str:
    assert "Traceback" not in err and "Exception in thread" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: disk full at {folder}, ") and " MB free; " in lines[0], err
    return lines[0]


def test_tensorboard_on_a_full_disk_names_the_logs_folder_and_prints_no_thread_traceback(full, tmp_path):
    # A child process: pytest replaces threading.excepthook in-process, which hides what a user's terminal shows.
    config, run = _boring_run(tmp_path, full.folder, "logs")
    code = "import sys\n"
    if full.injected:  # in TensorBoard's writer thread, as its file write on a full disk fails
        code += (
            "from tensorboard.summary.writer.record_writer import RecordWriter\n"
            "def full(*args):\n    raise OSError(28, 'No space left on device')\n"
            "RecordWriter.write = full\n"
        )
    code += "from sss.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    words = ["fit", str(config), f"trainer.output_dir={run}", "trainer.log.trackers=[tensorboard]"]
    done = subprocess.run(
        [sys.executable, "-c", code, *words, "trainer.log.every_n_steps=1"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    line = _lines(done.stderr, run / "logs")
    assert "no checkpoint was saved yet" in line and "intact" not in line


def test_the_metrics_csv_on_a_full_disk_names_the_logs_folder(full, tmp_path, monkeypatch, capfd):
    if full.injected:
        monkeypatch.setattr(sss.callbacks.metrics_logger, "_atomic_write", _no_space)
    config, run = _boring_run(tmp_path, full.folder, "logs")
    words = ["fit", str(config), f"trainer.output_dir={run}", "trainer.log.trackers=[csv]"]
    assert main([*words, "trainer.log.every_n_steps=1"]) == 1
    line = _one_line(capfd, run / "logs")
    assert "no checkpoint was saved yet" in line and "intact" not in line


def test_plots_name_the_plots_folder(full, tmp_path, monkeypatch, capfd):
    if full.injected:
        from matplotlib.figure import Figure

        monkeypatch.setattr(Figure, "savefig", _no_space)
    config, run = _boring_run(tmp_path, full.folder, "plots")
    assert main(["fit", str(config), f"trainer.output_dir={run}"]) == 1
    line = _one_line(capfd, run / "plots")
    assert "the checkpoint " in line and "step_0000003 is intact" in line  # the fit saved one before its plots
    assert not list(full.folder.glob("*.png"))  # no truncated image


def test_a_sigterm_during_predict_leaves_no_csv(hunter, tmp_path):
    folder, rows = hunter
    out = tmp_path / "preds.csv"
    partial = tmp_path / "preds.csv.partial"
    command = [sys.executable, "-m", "sss", "predict", str(folder), "--input", str(rows), "--output", str(out)]
    child = subprocess.Popen(
        [*command, "--batch-size", "1"], env=subprocess_env(), stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        deadline = time.monotonic() + 120
        while not (partial.is_file() and partial.stat().st_size > 0):  # the header and the first rows are written
            assert child.poll() is None and time.monotonic() < deadline, "predict ended before it could be stopped"
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 128 + signal.SIGTERM, err
    assert (
        err.strip() == "error: sss predict stopped by SIGTERM; no predictions were written (run it again to write them)"
    )
    assert not out.exists() and not partial.exists()
