"""The resume config check: which fields of a run config may differ between a checkpoint and the run resuming it.

Re-exported by `sss.checkpoint` (`config_hash`, `config_differences`), which records the hash in every marker.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["config_differences", "config_hash"]

# Keys of the run config that do not change the math of the steps still to run: where files go,
# what is logged or printed, how often checkpoints are taken, and loader plumbing. Everything else
# must match the checkpoint; the two limits may only grow.
_NEUTRAL = (
    "name",
    "callbacks",
    "trainer.output_dir",
    "trainer.resume",
    "trainer.resume_resize",
    "trainer.rendezvous_timeout",
    "trainer.log.",
    "trainer.checkpoint.",
    "trainer.val_every_n_epochs",
    "trainer.val_every_n_steps",  # step validations restore the RNG: the training math is the same
    "trainer.find_unused_parameters",
    "trainer.cpu",
    "data.pin_memory",
    "data.persistent_workers",
    "data.prefetch_factor",
    "data.root",
    "data.cache_dir",
)
_MAY_GROW = ("trainer.max_epochs", "trainer.max_steps")


def config_hash(config: dict[str, Any]) -> str:
    """A short hash of the fields of `config` that change the math of training.

    Example:
        >>> config_hash({"trainer": {"seed": 1, "log": {"every_n_steps": 5}}}) == config_hash({"trainer": {"seed": 1}})
        True
    """
    math = {k: v for k, v in _flatten(config).items() if not _neutral(k)}
    return hashlib.sha256(json.dumps(math, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The fields that differ between a checkpoint's config and the resuming one, as messages.

    Neutral fields (output, logging, checkpoint cadence, loader plumbing) may differ, and
    ``trainer.max_epochs``/``trainer.max_steps`` may grow.

    Example:
        >>> saved = {"trainer": {"seed": 1, "max_steps": 10}, "name": "a"}
        >>> config_differences(saved, {"trainer": {"seed": 1, "max_steps": 20}, "name": "b"})
        []
        >>> for line in config_differences(saved, {"trainer": {"seed": 2, "max_steps": 5}, "name": "a"}):
        ...     print(line)
        trainer.max_steps: 10 in the checkpoint, 5 now (it may only grow)
        trainer.seed: 1 in the checkpoint, 2 now

    A setting the checkpoint does not know (one added to sss since) is no difference while it is
    left at its default, so checkpoints of an earlier version stay resumable.
    """
    old, new = _flatten(saved), _flatten(current)
    defaults = _schema_defaults()
    problems = []
    for key in sorted(set(old) | set(new)):
        if _neutral(key):
            continue
        if key not in old and key in defaults and new.get(key) == defaults[key]:
            continue  # a setting added to sss after the checkpoint was written, left at its default
        a, b = old.get(key, "<unset>"), new.get(key, "<unset>")
        if key in _MAY_GROW:
            if a is not None and (b is None or (isinstance(b, int) and b >= a)):
                continue
            if a == b:
                continue
            problems.append(f"{key}: {a} in the checkpoint, {b} now (it may only grow)")
        elif a != b:
            problems.append(f"{key}: {a} in the checkpoint, {b} now")
    return problems


def _schema_defaults() -> dict[str, Any]:
    import dataclasses

    from sss.config import SSSConfig

    return _flatten(dataclasses.asdict(SSSConfig()))


def _neutral(key: str) -> bool:
    return any(key == n or (n.endswith(".") and key.startswith(n)) or key.startswith(n + ".") for n in _NEUTRAL)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
