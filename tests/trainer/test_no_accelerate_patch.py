"""A fit leaves Accelerate as it found it: no attribute of its modules or classes is rebound.

sss may only change its own objects (sss/trainer/_accelerate_compat.py lists the three attributes
it sets on the trainer's own `Accelerator` instance); a library that rebinds a function inside
another library's module changes that library for every user of the process.
"""

from __future__ import annotations

import importlib
import sys

from sss import SSSTrainer
from sss.testing import BoringModule, boring_loader

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}, "mixed_precision": "no"}
# Imported before the snapshot so that a module a fit imports lazily is compared too.
MODULES = (
    "accelerate",
    "accelerate.accelerator",
    "accelerate.checkpointing",
    "accelerate.data_loader",
    "accelerate.hooks",
    "accelerate.launchers",
    "accelerate.optimizer",
    "accelerate.scheduler",
    "accelerate.state",
    "accelerate.tracking",
    "accelerate.utils",
    "accelerate.utils.imports",
    "accelerate.utils.operations",
    "accelerate.utils.other",
    "accelerate.utils.random",
)
MISSING = object()


def _snapshot() -> dict[str, dict[str, object]]:
    """The attributes of every loaded ``accelerate.*`` module and of every Accelerate class they hold."""
    for name in MODULES:
        importlib.import_module(name)
    seen: dict[str, dict[str, object]] = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] != "accelerate":
            continue
        seen[name] = dict(vars(module))
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__.split(".")[0] == "accelerate":
                seen.setdefault(f"{value.__module__}.{value.__qualname__}", dict(vars(value)))
    return seen


def _rebound(before: dict[str, dict[str, object]], after: dict[str, dict[str, object]]) -> list[str]:
    """``owner.attribute`` for each attribute added, removed or bound to another object since `before`."""
    changed = []
    for owner, attributes in before.items():
        now = after.get(owner, {})
        changed += [
            f"{owner}.{key}"
            for key in attributes.keys() | now.keys()
            if attributes.get(key, MISSING) is not now.get(key, MISSING)
        ]
    return sorted(changed)


def test_a_fit_rebinds_no_attribute_of_accelerates_modules_or_classes():
    before = _snapshot()
    assert {
        "accelerate.optimizer",
        "accelerate.accelerator.Accelerator",
        "accelerate.optimizer.AcceleratedOptimizer",
    } <= (before.keys())
    # Accumulation 1 takes every shortcut of _accelerate_compat (unit window, backward, optimizer step,
    # zero_grad, clipping); accumulation 2 with an epoch cut short closes a window early.
    for accumulation, limit in ((1, None), (2, 3)):
        trainer = SSSTrainer(
            max_epochs=2,
            gradient_accumulation_steps=accumulation,
            limit_train_batches=limit,
            max_grad_norm=1.0,
            **QUIET,
        )
        trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=32, batch_size=4))
        assert trainer.state.global_step > 0
    assert _rebound(before, _snapshot()) == []
