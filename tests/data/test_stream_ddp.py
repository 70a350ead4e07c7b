"""Two gloo processes x 2 DataLoader workers train on tar shards and on streamed Parquet with uneven shard
counts: every sample once per epoch, the same number of steps on each process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from sss.data.shards import pack
from sss.data.synthetic import make_industrial
from sss.run.launch import launch_command
from sss.testing import hub_parquet


@pytest.mark.slow
def test_two_processes_with_two_workers_read_every_sample_once_per_epoch_in_equal_steps(tmp_path):
    src = make_industrial(tmp_path / "ind", n_train=42, n_val=4, n_test=0, image_size=32)
    pack(src, tmp_path / "shards", shard_size=8)  # 6 shards of 8, 8, 8, 8, 8 and 2 samples for 4 readers
    hub_parquet(src, tmp_path / "hub", files=3, row_group=5)  # 9 row groups of 5 or 4 samples
    folders = [f"{tmp_path / 'shards'}:shards", f"{tmp_path / 'hub'}:hf"]
    out = tmp_path / "seen"
    cmd = launch_command(2, [str(Path(__file__).parents[1] / "scripts" / "stream_ddp.py"), str(out), *folders])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(f"{out}.rank{rank}.pt") for rank in (0, 1)]
    for folder in folders:
        for epoch in (0, 1):
            per_rank = [[b for e, b in r["seen"][folder] if e == epoch] for r in ranks]
            assert len(per_rank[0]) == len(per_rank[1]) == 6  # 10 samples a reader: 3 batches a worker
            indices = [i for batches in per_rank for b in batches for i in b]
            assert len(indices) == len(set(indices)) == 40  # each sample once; 2 of 42 left over this epoch
            assert set(indices) <= set(range(42))
        epochs = [{i for e, b in ranks[0]["seen"][folder] if e == epoch for i in b} for epoch in (0, 1)]
        assert epochs[0] != epochs[1]  # reshuffled: rank 0 reads other samples in epoch 1
