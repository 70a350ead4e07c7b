"""`Profiler`: the recorded optimizer steps as a Chrome trace and TensorBoard files, a summary, and ``--profile``."""

from __future__ import annotations

import json
import os
import re
import time

import torch
import yaml

from sss import SSSTrainer
from sss.callbacks import Profiler
from sss.cli import main
from sss.testing import BoringDataset, BoringModule, boring_loader


def _step_spans(trace):
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}), events


def test_the_active_optimizer_steps_are_written_as_a_trace_with_a_summary(tmp_path, capsys):
    profiler = Profiler(wait=1, warmup=1, active=2)
    trainer = SSSTrainer(
        max_steps=6, gradient_accumulation_steps=2, mixed_precision="no", output_dir=str(tmp_path), callbacks=[profiler]
    )
    trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    out = tmp_path / "profile"
    assert [p.name for p in profiler.files] == ["trace_step_4.json"]  # steps 1 waits, 2 warms up, 3-4 recorded
    names, events = _step_spans(out / "trace_step_4.json")
    assert names == ["ProfilerStep#2", "ProfilerStep#3"]  # one span per optimizer step, not per micro-batch
    fetches = [e for e in events if e.get("name", "").startswith("enumerate(DataLoader)#")]
    assert len(fetches) == 4  # 2 micro-batches in each of the 2 recorded steps
    board = list((out / "tensorboard").glob("*.pt.trace.json"))
    assert [p.name for p in board] == ["rank0.4.pt.trace.json"]
    assert json.loads(board[0].read_text()) == json.loads((out / "trace_step_4.json").read_text())
    printed = capsys.readouterr().out
    assert "sss: profiler: optimizer steps 3-4:" in printed and "waiting for data" in printed
    assert "top 10 operators by self CPU time" in printed and "Self CPU" in printed and "aten::" in printed


class _SlowDataset(BoringDataset):
    def __getitem__(self, i):
        time.sleep(0.03)
        return super().__getitem__(i)


def _data_share(summary: str) -> float:
    return float(re.search(r"([\d.]+)% of it waiting for data", summary)[1])


def test_the_data_wait_share_is_the_loaders_fetch_time():
    fast = Profiler(wait=0, warmup=1, active=2)
    SSSTrainer(max_steps=3, mixed_precision="no", callbacks=[fast]).fit(
        BoringModule(), train_dataloaders=boring_loader(n=32, batch_size=2)
    )
    slow = Profiler(wait=0, warmup=1, active=2)
    loader = torch.utils.data.DataLoader(_SlowDataset(32), batch_size=2)
    SSSTrainer(max_steps=3, mixed_precision="no", callbacks=[slow]).fit(BoringModule(), train_dataloaders=loader)
    assert _data_share(slow.summaries[0]) > 60 > _data_share(fast.summaries[0])


def test_a_fit_shorter_than_the_window_says_so(tmp_path, capsys):
    profiler = Profiler(wait=3, warmup=1, active=2)
    SSSTrainer(max_steps=2, mixed_precision="no", output_dir=str(tmp_path), callbacks=[profiler]).fit(
        BoringModule(), train_dataloaders=boring_loader()
    )
    assert profiler.files == [] and not (tmp_path / "profile").exists()
    assert "the fit ended before the first recorded step" in capsys.readouterr().out


def test_sss_fit_profile_writes_the_trace(tmp_path, capsys):
    config = {
        "trainer": {"max_steps": 6, "deterministic": True, "log": {"progress": False, "trackers": []}},
        "model": {"_target_": "sss.testing.BoringModule"},
        "data": {"_target_": "sss.testing.BoringDataModule"},
    }
    (tmp_path / "boring.yaml").write_text(yaml.safe_dump(config))
    before = torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    try:
        assert main(["fit", "boring.yaml", "--profile", f"trainer.output_dir={tmp_path / 'run'}"]) == 0
        assert torch.are_deterministic_algorithms_enabled()  # trainer.deterministic=true, through sss fit
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # set by the CLI, before anything ran
    finally:
        torch.use_deterministic_algorithms(before[0])  # the mode is process-wide: leave the next tests as they were
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        if before[1] is not None:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = before[1]
    names, _ = _step_spans(tmp_path / "run" / "profile" / "trace_step_5.json")
    assert names == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert "sss: profiler: optimizer steps 3-5:" in capsys.readouterr().out
