"""The checkpoint folder format: the marker, atomic commits, finding complete ones, pickle refusal, the resume check.

The trainer writes and reads checkpoints, the checkpoint callback rotates them and the run layer
finds them: all three use this module rather than repeating the file names.


A checkpoint folder is complete when it holds ``trainer_state.json`` (written last) under its
final name. It is written as ``<name>.tmp``, every file is fsynced, and only then renamed, so a
crash at any moment leaves either the previous complete checkpoint or the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "MARKER",
    "check_no_code_on_load",
    "commit_folder",
    "complete_checkpoints",
    "config_differences",
    "config_hash",
    "get_rng_state",
    "recover_leftovers",
    "set_rng_state",
]

MARKER = "trainer_state.json"
"""Written last into a checkpoint folder: a folder without it is not a checkpoint."""
_NAME = re.compile(r"^step_(\d{7,})$")

# Keys of the run config that do not change the math of the steps still to run: where files go,
# what is logged or printed, how often checkpoints are taken, and loader plumbing. Everything else
# must match the checkpoint; the two limits may only grow.
_NEUTRAL = (
    "name",
    "callbacks",
    "trainer.output_dir",
    "trainer.log.",
    "trainer.checkpoint.",
    "trainer.val_every_n_epochs",
    "trainer.find_unused_parameters",
    "trainer.cpu",
    "data.pin_memory",
    "data.persistent_workers",
    "data.prefetch_factor",
    "data.root",
    "data.cache_dir",
)
_MAY_GROW = ("trainer.max_epochs", "trainer.max_steps")


def _fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_folder(tmp: Path, final: Path) -> None:
    """Flush every file of the complete folder `tmp` to disk, then rename it to `final`.

    An existing `final` (this run's earlier save of the same step) is moved aside first and
    removed last, so some complete copy exists at every moment.

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> (root / "step_0000001.tmp").mkdir(); _ = (root / "step_0000001.tmp" / MARKER).write_text("{}")
        >>> commit_folder(root / "step_0000001.tmp", root / "step_0000001")
        >>> sorted(p.name for p in root.iterdir())
        ['step_0000001']
    """
    for file in tmp.rglob("*"):
        if file.is_file():
            _fsync(file)
    _fsync(tmp, directory=True)
    old = final.with_name(final.name + ".old")
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        final.rename(old)
    tmp.rename(final)
    _fsync(final.parent, directory=True)  # the rename itself survives a power cut
    if old.exists():
        shutil.rmtree(old)


def complete_checkpoints(folder: str | Path) -> list[Path]:
    """Complete checkpoint folders (``step_NNNNNNN`` with ``trainer_state.json``), oldest first.

    Example:
        >>> complete_checkpoints("/nonexistent")
        []
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME.match(p.name) and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def recover_leftovers(folder: Path) -> list[str]:
    """Clean what interrupted saves left in `folder`; returns what was done, one line each.

    ``*.tmp`` folders (a save that never completed) are removed. A ``*.old`` folder is a complete
    checkpoint moved aside by `commit_folder`: it is put back when its replacement never arrived.

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp()); (root / "step_0000002.tmp").mkdir()
        >>> recover_leftovers(root)
        ['removed the incomplete save step_0000002.tmp']
    """
    done: list[str] = []
    if not folder.is_dir():
        return done
    for leftover in sorted(folder.glob("*.old")):
        final = leftover.with_suffix("")
        if not final.exists() and (leftover / MARKER).is_file():
            leftover.rename(final)
            done.append(f"restored {final.name} from {leftover.name}")
        else:
            shutil.rmtree(leftover, ignore_errors=True)
            done.append(f"removed {leftover.name}")
    for leftover in sorted(folder.glob("*.tmp")):
        shutil.rmtree(leftover, ignore_errors=True)
        done.append(f"removed the incomplete save {leftover.name}")
    return done


def check_no_code_on_load(folder: Path) -> None:
    """Refuse a checkpoint folder holding a pickle that would run code when loaded.

    Accelerate loads weights from safetensors and most states with ``weights_only=True``, but
    registered objects (our LR scheduler) with ``weights_only=False``. Every pickle in the folder
    is therefore opened first with ``torch.load(weights_only=True, mmap=True)`` (the tensors stay
    on disk, so this is cheap); one that needs anything but tensors, numbers and containers fails.

    Example:
        >>> import tempfile, pathlib, torch
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> torch.save({"step": 3, "w": torch.ones(2)}, folder / "optimizer.bin")
        >>> check_no_code_on_load(folder)  # plain state: accepted
        >>> torch.save({"hook": print}, folder / "custom_checkpoint_0.pkl")
        >>> check_no_code_on_load(folder)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        sss.checkpoint.UnsafeCheckpointError: .../custom_checkpoint_0.pkl would run code when loaded (...
    """
    from accelerate.utils.other import TORCH_SAFE_GLOBALS

    for file in sorted(folder.rglob("*")):
        if not file.is_file() or file.suffix in {".safetensors", ".json", ".yaml", ".md", ".txt", ".csv"}:
            continue
        try:
            with torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
                torch.load(file, map_location="cpu", weights_only=True, mmap=_is_zip(file))
        except Exception as exc:  # any refusal by the safe loader means "not plain data"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UnsafeCheckpointError(
                f"{file} would run code when loaded ({first}). sss loads checkpoints without executing "
                "pickled code; if you wrote this file yourself and trust it, load it with torch.load(..., "
                "weights_only=False) and re-save plain tensors and numbers, or remove it from the folder."
            ) from exc


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file that cannot be loaded without executing code."""


def _is_zip(file: Path) -> bool:
    with file.open("rb") as f:
        return f.read(4) == b"PK\x03\x04"  # torch.save's default format; mmap needs it


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
    """
    old, new = _flatten(saved), _flatten(current)
    problems = []
    for key in sorted(set(old) | set(new)):
        if _neutral(key):
            continue
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


def get_rng_state() -> dict[str, Any]:
    """The process's Python, NumPy, torch CPU and CUDA RNG states (what Accelerate saves per process)."""
    import random

    import numpy as np

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(saved: dict[str, Any]) -> None:
    """Restore states taken by `get_rng_state`."""
    import random

    import numpy as np

    random.setstate(saved["python"])
    np.random.set_state(saved["numpy"])
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] is not None:
        torch.cuda.set_rng_state_all(saved["cuda"])
