"""Augmentation is a function of (seed, epoch, index): a mid-epoch resume reproduces the crops too."""

from __future__ import annotations

import pytest
import torch

from sss import SSSTrainer
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import complete_checkpoints
from sss.data import ManifestDataModule
from sss.data.synthetic import make_industrial
from sss.models import create_model


def _datamodule(root, workers: int) -> ManifestDataModule:
    return ManifestDataModule(
        str(root), batch_size=4, num_workers=workers, image_size=32, clip_seconds=0.5, augment=True, seed=3
    )


def test_a_sample_is_a_function_of_seed_epoch_and_index_and_leaves_the_rng_alone(tmp_path):
    dm = _datamodule(make_industrial(tmp_path / "ind", n_train=8, n_val=4, n_test=0), 0)
    dm.setup("fit")
    train = dm.datasets["train"]
    before = torch.get_rng_state()
    a, b = train[5], train[5]
    assert torch.equal(torch.get_rng_state(), before), "loading a sample moved the caller's RNG"
    assert torch.equal(a["audio"], b["audio"]) and torch.equal(a["image"], b["image"])
    train.set_epoch(1)
    c = train[5]
    assert not (torch.equal(a["audio"], c["audio"]) and torch.equal(a["image"], c["image"])), "epochs look alike"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_mid_epoch_resume_with_random_crops_is_bitwise_equal(tmp_path, workers):
    root = make_industrial(tmp_path / "ind", n_train=24, n_val=0, n_test=0)

    def fit(max_steps, out, ckpt=None):
        torch.manual_seed(0)
        module = create_model("hunter_tiny", modality_dropout=0.2)  # model randomness on top of the data's
        trainer = add_stock_callbacks(
            SSSTrainer(
                max_steps=max_steps,
                mixed_precision="no",
                cpu=True,
                output_dir=str(out),
                log={"progress": False, "trackers": []},
                checkpoint={"every_n_steps": 4, "every_epoch": False},
            )
        )
        trainer.fit(module, _datamodule(root, workers), ckpt_path=ckpt)
        return module

    straight = fit(14, tmp_path / "straight")
    fit(9, tmp_path / "run")  # interrupted after step 9: the newest checkpoint is step 8 (epoch 1, batch 2)
    resumed = fit(14, tmp_path / "run", complete_checkpoints(tmp_path / "run" / "checkpoints")[-1])
    for a, b in zip(resumed.parameters(), straight.parameters(), strict=True):
        assert torch.equal(a, b)
