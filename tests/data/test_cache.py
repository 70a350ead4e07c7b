"""Feature cache: same features as the model's front-end, keyed by files and settings, built once under concurrency."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from sss.callbacks.stock import add_stock_callbacks
from sss.data import DataError, ManifestDataModule, make_industrial
from sss.models import LogMelFrontend


@pytest.fixture(scope="module")
def industrial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_industrial(tmp_path_factory.mktemp("cache") / "ds", n_train=12, n_val=4, n_test=0, seed=3)


def module(root: Path, cache_dir: Path, **kwargs: object) -> ManifestDataModule:
    dm = ManifestDataModule(str(root), batch_size=4, cache="features", cache_dir=str(cache_dir), **kwargs)  # type: ignore[arg-type]
    dm.setup("fit")
    return dm


def test_cached_batches_match_decoded_ones_through_the_frontend(industrial: Path, tmp_path: Path) -> None:
    plain = ManifestDataModule(str(industrial), batch_size=4)
    plain.setup("fit")
    cached = module(industrial, tmp_path)
    decoded, served = next(iter(plain.val_dataloader())), next(iter(cached.val_dataloader()))  # type: ignore[arg-type]
    assert served["audio"].shape == (4, 1, 64, 101) and served["audio"].dtype == torch.float32
    for key in ("image", "mask", "events", "label", "index"):
        torch.testing.assert_close(served[key], decoded[key], atol=1e-6, rtol=0)
    # The model's front-end takes the cached 4-D log-mel and must give what it computes from the waveform.
    # A loader built by hand with the default collate gets the same batch (per-item views, restacked).
    own = next(iter(torch.utils.data.DataLoader(cached.datasets["val"], batch_size=4)))
    assert all(torch.equal(own[key], served[key]) for key in served)
    frontend = LogMelFrontend(n_fft=400, hop_length=160, n_mels=64, f_max=8000.0).eval()
    frontend.norm.running_mean.uniform_(-60, 0)  # non-trivial statistics, as after training
    torch.testing.assert_close(frontend(served["audio"]), frontend(decoded["audio"]), atol=1e-4, rtol=1e-4)


def test_cache_is_reused_and_rebuilt_when_files_or_settings_change(industrial: Path, tmp_path: Path) -> None:
    module(industrial, tmp_path)
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert len(folders) == 2 and all(name.startswith("features-") for name in folders)  # train and val
    stamp = {p: p.stat().st_mtime_ns for p in tmp_path.glob("features-*/meta.json")}
    module(industrial, tmp_path)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("features-*/meta.json")} == stamp  # reused
    module(industrial, tmp_path, n_mels=32)
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 4  # new settings: new caches
    clip = industrial / "audio" / "val_00001.wav"
    os.utime(clip, ns=(time.time_ns(), time.time_ns()))  # touched: the val cache is stale
    dm = module(industrial, tmp_path)
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 5 and dm.datasets["val"].cache is not None


BUILD = """
import sys
from sss.data import ManifestDataModule
dm = ManifestDataModule(sys.argv[1], batch_size=4, cache="features", cache_dir=sys.argv[2])
dm.setup("fit")
print(dm.datasets["train"].cache.folder)
"""


@pytest.mark.slow
def test_concurrent_builds_give_one_complete_cache(industrial: Path, tmp_path: Path) -> None:
    # Separate interpreters (not fork: a forked child of a process that ran torch ops can deadlock in OpenMP).
    cmd = [sys.executable, "-c", BUILD, str(industrial), str(tmp_path)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err for _, err in outputs]
    folders = {out.strip().splitlines()[-1] for out, _ in outputs}
    assert len(folders) == 1
    entries = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert len(entries) == 2 and not any(".tmp-" in name for name in entries)  # train + val, no half-built folder


def test_bad_rows_while_building(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    sf.write(root / "ok.wav", np.zeros(16000, dtype=np.float32), 16000)
    sf.write(root / "nan.wav", np.full(16000, np.nan, dtype=np.float32), 16000, subtype="FLOAT")
    (root / "train.csv").write_text("audio,label\nok.wav,a\nnan.wav,b\n")
    with pytest.raises(DataError, match=r"train\.csv, line 3: audio file .*nan\.wav contains NaN"):
        module(root, tmp_path / "cache")
    dm = module(root, tmp_path / "cache2", on_error="skip")
    assert [r["row"] for r in dm.skipped] == [3] and "NaN" in dm.skipped[0]["reason"]
    assert [dm.datasets["train"][i]["index"] for i in range(2)] == [0, 0]  # the bad row is never served


@pytest.mark.slow
def test_training_from_the_cache_through_the_trainer(industrial: Path, tmp_path: Path) -> None:
    # Accelerate's prepare() rebuilds the loader: the pre-stacked cached batches must survive it.
    from sss import SSSTrainer, TrainerConfig
    from sss.models import create_model

    dm = ManifestDataModule(str(industrial), batch_size=4, cache="features", cache_dir=str(tmp_path), n_mels=32)
    model = create_model("hunter_tiny", num_classes=4, image_kwargs={"channels": [8, 16, 32, 64], "stem_width": 8})
    config = TrainerConfig(max_steps=3, output_dir=str(tmp_path / "run"), cpu=True)
    config.log.progress, config.log.trackers, config.checkpoint.every_epoch = False, [], False
    trainer = add_stock_callbacks(SSSTrainer(config))
    trainer.fit(model, dm)
    assert trainer.state.global_step == 3 and bool(torch.isfinite(torch.as_tensor(trainer.state.loss)))
