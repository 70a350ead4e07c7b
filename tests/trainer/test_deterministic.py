"""``trainer.deterministic``: torch's deterministic mode, a clear error for an op without one, and bitwise repeats."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from sss import SSSTrainer
from sss.cli import explain_error
from sss.testing import BoringModule, boring_loader
from sss.warnings import SSSWarning


@pytest.fixture
def restore_torch_modes():
    """Deterministic mode is process-wide: put torch (and the cuBLAS variable) back as they were."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic)
    saved += (torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1], saved[2]
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    if saved[3] is not None:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[3]


def test_the_trainer_turns_on_every_switch(restore_torch_modes):
    SSSTrainer(max_steps=1, mixed_precision="no", deterministic=False)
    assert not torch.are_deterministic_algorithms_enabled()  # off by default: nothing changed
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    torch.backends.cudnn.benchmark = True
    SSSTrainer(max_steps=1, mixed_precision="no", deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_an_unset_mkl_cbwr_is_a_warning_saying_how_to_set_it(restore_torch_modes, monkeypatch):
    monkeypatch.delenv("MKL_CBWR", raising=False)
    with pytest.warns(SSSWarning, match=r"MKL_CBWR is unset.*MKL_CBWR=AUTO,STRICT.*before `import torch`"):
        SSSTrainer(max_steps=1, mixed_precision="no", deterministic=True)
    monkeypatch.setenv("MKL_CBWR", "AUTO,STRICT")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SSSWarning)
        SSSTrainer(max_steps=1, mixed_precision="no", deterministic=True)


class UnpoolModule(BoringModule):
    """BoringModule through max_unpool2d, which has no deterministic CPU implementation (torch 2.x)."""

    def forward(self, batch):
        image = batch["image"]
        pooled, indices = F.max_pool2d(image, 2, return_indices=True)
        image = F.max_unpool2d(pooled, indices, 2, output_size=image.shape[-2:])
        return super().forward({**batch, "image": image})


def test_an_op_without_a_deterministic_implementation_is_one_line_naming_it(restore_torch_modes):
    SSSTrainer(max_steps=2, mixed_precision="no", log={"progress": False}).fit(
        UnpoolModule(), train_dataloaders=boring_loader()
    )  # negative control: without the mode the op runs
    trainer = SSSTrainer(max_steps=2, mixed_precision="no", deterministic=True, log={"progress": False})
    with pytest.raises(RuntimeError, match="does not have a deterministic implementation") as info:
        trainer.fit(UnpoolModule(), train_dataloaders=boring_loader())
    message, code = explain_error(info.value)
    assert code == 1 and "\n" not in message
    assert message.startswith("error: trainer.deterministic=true: max_unpooling2d_forward_out has no deterministic")
    assert "set trainer.deterministic=false" in message


def test_the_cublas_error_names_the_variable_to_set():
    # torch's exact text on a CUDA matmul without CUBLAS_WORKSPACE_CONFIG (no GPU needed to map it)
    text = (
        "Deterministic behavior was enabled with either `torch.use_deterministic_algorithms(True)` or "
        "`at::Context::setDeterministicAlgorithms(true)`, but this operation is not deterministic because it uses "
        "CuBLAS and you have CUDA >= 10.2. To enable deterministic behavior in this case, you must set an environment "
        "variable before running your PyTorch application: CUBLAS_WORKSPACE_CONFIG=:4096:8 or "
        "CUBLAS_WORKSPACE_CONFIG=:16:8. For more information, go to "
        "https://docs.nvidia.com/cuda/cublas/index.html#results-reproducibility"
    )
    message, code = explain_error(RuntimeError(text))
    assert (
        code == 1 and "export CUBLAS_WORKSPACE_CONFIG=:4096:8" in message and "trainer.deterministic=false" in message
    )
    assert explain_error(RuntimeError("some other failure")) == ("error: some other failure", 1)


# A fresh process: the default model (hunter_small, as in examples/industrial.yaml) for 2 optimizer steps on
# shuffled batches of the industrial batch format; it prints the SHA-256 of its trained weights.
FRESH_FIT = """
import hashlib, sys
import torch
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from sss import SSSTrainer
from sss.models import create_model

set_seed(42)  # the initial weights, as sss fit seeds them (sss.run.parts)
g = torch.Generator().manual_seed(0)
data = [{"image": torch.rand(3, 64, 64, generator=g), "audio": 0.1 * torch.randn(1, 16000, generator=g),
         "label": torch.randint(0, 4, (), generator=g)} for _ in range(8)]
module = create_model("hunter_small", num_classes=4)
trainer = SSSTrainer(max_steps=2, mixed_precision="no", deterministic=True, sanity_val_batches=0,
                     log={"progress": False}, output_dir=sys.argv[1])
trainer.fit(module, train_dataloaders=DataLoader(data, batch_size=4, shuffle=True))
assert torch.are_deterministic_algorithms_enabled()
digest = hashlib.sha256()
for name, value in sorted(module.state_dict().items()):
    digest.update(name.encode() + value.detach().contiguous().numpy().tobytes())
print("weights", digest.hexdigest())
"""


@pytest.mark.slow
def test_twenty_fresh_processes_train_bitwise_equal_weights(tmp_path):
    # 20 fresh processes, 2 at a time; each one's weights compared to the first one's.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # 2 processes on 2 cores; MKL_CBWR as conftest (and sss) set it
    digests = []
    for pair in range(10):
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", FRESH_FIT, str(tmp_path / f"run{2 * pair + i}")],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for i in range(2)
        ]
        for run in runs:
            out, err = run.communicate(timeout=120)
            assert run.returncode == 0, err[-2000:]
            digests.append(next(line.split()[1] for line in out.splitlines() if line.startswith("weights ")))
    assert len(digests) == 20
    assert digests.count(digests[0]) == 20, digests
