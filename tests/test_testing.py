"""sss.testing.count_host_syncs: counts exactly what makes the host wait, and names the line that did it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sss.testing import count_host_syncs


def test_counts_each_read_of_a_value_exactly():
    t = torch.arange(4.0)
    with count_host_syncs() as syncs:
        for _ in range(3):
            _ = t.sum().item()
        _ = float(t[0]), float(t[1])
        _ = bool(t.any()), bool(t.all())
        _ = int(t[2])
        _ = t.tolist(), t[:2].tolist()
        _ = f"{t[3]:.2f}"
    assert [r.kind for r in syncs.records] == ["item"] * 3 + ["item"] * 2 + ["item"] * 2 + ["item"] + ["tolist"] * 2 + [
        "item"
    ]


def test_counts_copies_to_the_host_and_not_device_work():
    t = torch.arange(4.0)
    with count_host_syncs() as syncs:
        _ = t * 2, t.double(), t.clone(), t.sum(), torch.isfinite(t).all(), t.to(torch.float16)
        assert len(syncs) == 0  # work the device queues: no wait
        _ = t.cpu(), t.numpy(), np.asarray(t), t.nonzero()
    assert [r.kind for r in syncs.records] == ["cpu", "numpy", "numpy", "nonzero"]


def test_names_the_line_and_filters_by_the_functions_on_the_stack():
    def log_step(t):
        return float(t)  # the culprit

    def save(t):
        return t.tolist()

    def step(t):
        log_step(t)
        save(t)

    with count_host_syncs() as syncs:
        step(torch.ones(()))
        syncs.counting = False
        _ = float(torch.ones(()))  # not recorded
    line = log_step.__code__.co_firstlineno + 1
    assert syncs.records[0].where == f"tests/test_testing.py:{line} in log_step"
    assert len(syncs.inside("step")) == 2 and syncs.inside("step", outside=("save",))[0].kind == "item"
    assert f"1 x item at tests/test_testing.py:{line} in log_step" in syncs.report()


def test_leaves_torch_as_it_was_and_a_gpu_probe_ignores_host_tensors():
    tolist = torch.Tensor.tolist
    with count_host_syncs("cuda") as syncs:  # CPU tensors wait for no GPU
        _ = torch.ones(2).tolist(), float(torch.ones(()))
    assert len(syncs) == 0 and torch.Tensor.tolist is tolist
    with pytest.raises(ZeroDivisionError), count_host_syncs():
        raise ZeroDivisionError
    assert torch.Tensor.tolist is tolist and torch.Tensor.cpu is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_counts_reads_and_copies_of_device_tensors_only():
    t = torch.arange(4.0, device="cuda")
    with count_host_syncs("cuda") as syncs:
        _ = t * 2, torch.ones(3).tolist(), t.to("cuda", torch.float64)  # device work, a host tensor: no wait
        _ = t.sum().item(), t.tolist(), t.cpu(), bool(t.any())
    assert [r.kind for r in syncs.records] == ["item", "copy", "copy", "item"]
