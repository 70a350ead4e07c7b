"""`sss fit` on a manifest whose rows lack the image or the audio: 2 processes, workers, the cache, the refusal."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sss.data.synthetic import make_industrial
from sss.testing import subprocess_env

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "manifest.yaml")
ENV = subprocess_env(OMP_NUM_THREADS="1")
RUN = [
    "model.name=hunter_tiny",
    "data.batch_size=4",
    "data.num_workers=2",
    "trainer.max_epochs=1",
    "trainer.log.progress=false",
    "trainer.log.trackers=[]",
    "trainer.output_dir=run",
]


def _blank(root: Path, split: str, no_image: set[int], no_audio: set[int]) -> None:
    """Empty the image (and mask) cells of rows `no_image`, the audio (and events) cells of rows `no_audio`."""
    path = root / f"{split}.csv"
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows):
        if i in no_image:
            row["image"] = row["mask"] = ""
        if i in no_audio:
            row["audio"] = row["events"] = ""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("missing-data")
    src = make_industrial(base / "ind", n_train=40, n_val=12, n_test=0)
    out = base / "partial"
    shutil.copytree(src, out)
    # 30 % of the rows without an image, 20 % without audio, never both (the acceptance data)
    for split, n in (("train", 40), ("val", 12)):
        _blank(out, split, {i for i in range(n) if i % 10 in (0, 1, 2)}, {i for i in range(n) if i % 10 in (3, 4)})
    return out


def _fit(cwd: Path, *words: str, processes: int = 1) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "sss", "fit", EXAMPLE, *RUN, *words]
    if processes > 1:
        command += ["--num-processes", str(processes)]
    return subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)


def _results(cwd: Path) -> dict:
    return json.loads((cwd / "run" / "results.json").read_text())


@pytest.mark.slow
def test_two_processes_with_workers_train_and_evaluate_rows_without_a_modality(root: Path, tmp_path: Path) -> None:
    done = _fit(tmp_path, f"data.root={root}", "model.modality_dropout={image: 0.2, audio: 0.2}", processes=2)
    assert done.returncode == 0, done.stderr[-3000:]
    results = _results(tmp_path)
    assert set(results["robustness"]) == {"image", "audio"}
    assert list(results["robustness"]["image"]) == ["0.0", "0.25", "0.5", "1.0"]
    assert (tmp_path / "run" / "plots" / "robustness.png").is_file()


@pytest.mark.slow
def test_one_process_with_workers_and_the_feature_cache(root: Path, tmp_path: Path) -> None:
    done = _fit(
        tmp_path, f"data.root={root}", "data.cache=features", "data.n_mels=32", f"data.cache_dir={tmp_path / 'cache'}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "robustness" in _results(tmp_path)


def test_a_row_with_neither_modality_is_refused_naming_the_manifest_and_line(root: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    _blank(bad, "train", {5}, {5})
    done = _fit(tmp_path / "cwd", f"data.root={bad}")
    assert done.returncode != 0
    assert f"{bad / 'train.csv'}, line 7: has neither an image nor an audio file" in done.stderr, done.stderr[-2000:]
