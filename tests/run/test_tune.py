"""`sss tune lr`: the LR range test on a copy of the run (sss/run/tune.py, the `tune` command)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import subprocess

import numpy as np
import pytest
import torch

from sss.cli import main
from sss.config import load_config
from sss.run.launch import child_environment, launch_command
from sss.run.parts import build_parts
from sss.run.tune import LRFindError, lr_find
from sss.trainer.trainer import SSSTrainer

BORING = [
    "model._target_=sss.testing.BoringModule",
    "data._target_=sss.testing.BoringDataModule",
    "data.n_train=32",
    "trainer.mixed_precision=no",
    "trainer.max_epochs=2",
    "trainer.optim.optimizer.lr=0.01",
]


def _cfg(*extra: str):
    return load_config(None, [*BORING, *extra])


def _fit_weights(cfg) -> dict[str, torch.Tensor]:
    # What `sss fit` trains, without its stock callbacks: the parts built from the config, then fit.
    parts = build_parts(cfg)
    trainer = SSSTrainer(cfg.trainer)
    trainer.fit(parts.module, parts.datamodule)
    lrs = [g["lr"] for g in trainer.optimizer.param_groups]
    return {k: v.clone() for k, v in parts.module.state_dict().items()} | {"lr": torch.tensor(lrs, dtype=torch.float64)}


def test_curve_is_geometric_and_the_suggestion_in_range():
    result = lr_find(_cfg(), steps=40, min_lr=1e-4, max_lr=10.0)
    lrs = np.array(result.lrs)
    assert len(lrs) >= 20 and np.all(np.diff(lrs) > 0)  # monotone in LR
    assert lrs[0] == pytest.approx(1e-4)
    ratios = lrs[1:] / lrs[:-1]
    assert np.allclose(ratios, (10.0 / 1e-4) ** (1 / 39))  # geometric: the same factor every step
    assert all(math.isfinite(x) for x in result.raw_losses[:10]) and len(result.losses) == len(lrs)
    assert result.suggestion is not None and 1e-4 <= result.suggestion <= 10.0
    # BoringDataModule(n_train=32) is 4 batches an epoch: the 40 steps cycle it, and say so
    assert any("cycles through the data" in note for note in result.notes)


def test_divergence_stops_the_test_early():
    result = lr_find(_cfg(), steps=60, min_lr=1e-3, max_lr=1e6, diverge=2.0)
    assert result.stopped_early and len(result.lrs) < 60
    assert any("diverged" in note for note in result.notes)


def test_a_fit_after_the_test_is_bitwise_the_fit_without_it():
    # with accumulation: the test ends its loader mid-epoch inside a window, and the later fit must not notice
    accumulate = "trainer.gradient_accumulation_steps=2"
    before = _fit_weights(_cfg(accumulate))
    cfg = _cfg(accumulate)
    snapshot = dataclasses.asdict(cfg)
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    rng = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    lr_find(cfg, steps=15, min_lr=1e-4, max_lr=1.0)
    # the process's RNG streams continue where they were: code after the test draws what it would have
    assert torch.equal(torch.get_rng_state(), rng[0])
    assert np.array_equal(np.random.get_state()[1], rng[1]) and random.getstate() == rng[2]
    assert dataclasses.asdict(cfg) == snapshot  # the caller's config (output folder, optimizer, schedule) as it was
    after = _fit_weights(cfg)
    assert after.keys() == before.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key  # the model and the optimizer's lr: untouched
    assert after["lr"].tolist() == [0.01, 0.01]


def test_errors_name_the_key_and_the_first_step(tmp_path, monkeypatch):
    cfg = _cfg()
    cfg.trainer.optim.optimizer = {"_target_": "torch.optim.SGD"}
    with pytest.raises(
        LRFindError, match=r"trainer\.optim\.optimizer\.lr is None .*trainer\.optim\.optimizer\.lr=1e-3"
    ):
        lr_find(cfg)
    with pytest.raises(LRFindError, match="--min-lr < --max-lr"):
        lr_find(_cfg(), min_lr=1.0, max_lr=0.1)
    (tmp_path / "nan_module.py").write_text(
        "from sss.testing import BoringModule\n\n"
        "class NaNModule(BoringModule):\n"
        "    def compute_loss(self, outputs, batch):\n"
        "        return super().compute_loss(outputs, batch) * float('nan')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LRFindError, match=r"the loss is nan at the first step \(lr=1e-05\)"):
        lr_find(_cfg("model._target_=nan_module.NaNModule"), steps=10, min_lr=1e-5)


def test_cli_prints_the_suggestion_and_keeps_existing_files(tmp_path, capsys):
    config = tmp_path / "boring.yaml"
    config.write_text(
        "model: {_target_: sss.testing.BoringModule}\n"
        "data: {_target_: sss.testing.BoringDataModule, n_train: 32}\n"
        "trainer: {mixed_precision: 'no', optim: {optimizer: {_target_: torch.optim.AdamW, lr: 0.01}}}\n"
    )
    users = tmp_path / "out" / "tune" / "lr_find.png"
    users.parent.mkdir(parents=True)
    users.write_bytes(b"the user's own file")
    code = main(["tune", "lr", str(config), "trainer.output_dir=out", "--steps", "30", "--min-lr", "1e-4", "--apply"])
    out = capsys.readouterr().out
    assert code == 0
    assert users.read_bytes() == b"the user's own file"  # never overwritten: the curve moves on to _1
    assert (tmp_path / "out" / "tune" / "lr_find_1.png").stat().st_size > 1000
    assert (tmp_path / "out" / "tune" / "lr_find_1.json").is_file()
    suggested = next(line for line in out.splitlines() if line.startswith("suggested lr: "))
    lr = float(suggested.split()[2])
    assert 1e-4 <= lr <= 1.0 and f"use trainer.optim.optimizer.lr={lr:.2e}" in suggested
    assert f"sss fit {config} trainer.output_dir=out trainer.optim.optimizer.lr={lr:.2e}" in out  # --apply
    assert any(ch in out for ch in "▁▂▃▄▅▆▇█")  # the sparkline
    assert "lr: 0.01" in config.read_text()  # the YAML is not edited
    assert main(["tune", "nope", str(config)]) == 2


# Run by `accelerate launch` on each of 2 processes: a fit, then the `sss tune lr` command line that the relaunch
# runs on each process, then the same fit again from the same RNG state; each rank writes what it saw to OUT.
TWO_PROCESS_SCRIPT = """
import json, os, sys
import numpy as np
import torch
import sss.run.tune
from sss import checkpoint as ckpt_io
from sss.cli import main
from sss.config import load_config
from sss.run.parts import build_parts
from sss.trainer.trainer import SSSTrainer

config, out, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
found = []
lr_find = sss.run.tune.lr_find
sss.run.tune.lr_find = lambda *a, **k: found.append(lr_find(*a, **k)) or found[-1]  # the CLI's result, kept

def fit(name):
    cfg = load_config(config, [f"trainer.output_dir={out}/{name}"])
    parts = build_parts(cfg)
    trainer = SSSTrainer(cfg.trainer)
    trainer.fit(parts.module, parts.datamodule)
    moments = [t for s in trainer.optimizer.state_dict()["state"].values() for t in s.values()]
    lr = torch.tensor(trainer.optimizer.param_groups[0]["lr"])
    return [t.clone() for t in [*parts.module.state_dict().values(), *moments, lr]]

torch.manual_seed(7)
start = ckpt_io.get_rng_state()
before = fit("a")
ckpt_io.set_rng_state(start)
code = main(args)
same = ckpt_io.get_rng_state()
rng = torch.equal(same["torch"], start["torch"]) and same["python"] == start["python"]
rng = rng and np.array_equal(same["numpy"][1], start["numpy"][1]) and same["numpy"][2:] == start["numpy"][2:]
after = fit("b")
equal = len(before) == len(after) and all(torch.equal(x, y) for x, y in zip(before, after))
r = found[0]
report = {"code": code, "rng": bool(rng), "fit_equal": equal, "lrs": r.lrs, "losses": r.losses, "lr": r.suggestion}
open(f"{out}/rank{os.environ['RANK']}.json", "w").write(json.dumps(report))
"""


@pytest.mark.slow
def test_two_processes_agree_write_once_and_leave_the_run_as_it_was(tmp_path, monkeypatch, capsys):
    config = tmp_path / "boring.yaml"
    config.write_text(
        "model: {_target_: sss.testing.BoringModule}\n"
        "data: {_target_: sss.testing.BoringDataModule, n_train: 32}\n"
        "trainer: {mixed_precision: 'no', max_epochs: 2, checkpoint: {every_epoch: false},\n"
        "  log: {progress: false, summary: false, plots: false},\n"
        "  optim: {optimizer: {_target_: torch.optim.AdamW, lr: 0.01}}}\n"
    )
    launched = []
    monkeypatch.setattr("sss.run.launch.relaunch", lambda n, args, *_: launched.append((n, args)) or 0)
    flags = ["--steps", "20", "--min-lr", "1e-4", "--apply", "--num-processes", "2"]
    assert main(["tune", "lr", str(config), f"trainer.output_dir={tmp_path}/tune_run", *flags]) == 0
    [(processes, args)] = launched  # what each of the 2 processes runs: the script below runs exactly that
    assert processes == 2
    script = tmp_path / "tune_two.py"
    script.write_text(TWO_PROCESS_SCRIPT)
    env = child_environment({**os.environ, "OMP_NUM_THREADS": "1"})
    command = launch_command(2, [str(script), str(config), str(tmp_path), json.dumps(args)])
    # its own process group, killed whole on timeout: a rank stuck in a collective must not outlive the test
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"2-process tune lr did not finish in 150 s:\n{proc.communicate()[0][-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, seen in enumerate(ranks):
        assert seen["code"] == 0 and seen["rng"], (rank, seen)  # the process's RNG streams as they were
        assert seen["fit_equal"], rank  # model, optimizer moments and lr: bitwise the fit without the test
    assert len(ranks[0]["lrs"]) >= 10 and ranks[0]["lr"] is not None
    for key in ("lrs", "losses", "lr"):  # each step's loss is the mean over the processes: one curve for all
        assert ranks[0][key] == ranks[1][key], key
    # printed and written by the main process only
    assert out.count("suggested lr: ") == 1 and out.count("sss fit ") == 1, out[-3000:]
    folder = tmp_path / "tune_run" / "tune"
    assert sorted(p.name for p in folder.iterdir()) == ["lr_find.json", "lr_find.png"]  # no rank moved on to _1
    assert json.loads((folder / "lr_find.json").read_text())["suggestion"] == ranks[0]["lr"]
