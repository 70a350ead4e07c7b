"""The checkpoint folder format: marker and manifest, atomic commits, verification, rotation, the folder lock.

The trainer writes and reads checkpoints, the checkpoint callback rotates them and the run layer
finds them: all three use this module rather than repeating the file names.

A checkpoint folder is complete when it holds a ``trainer_state.json`` that parses (written last)
under its final name. It is written as ``<name>.tmp``, every file is fsynced, and only then
renamed, so a crash at any moment leaves either the previous complete checkpoint or the new one.
The marker records every other file of the folder with its size and CRC32 (``files``); a
checkpoint is loaded only after `verify_checkpoint` found each of them intact. Rotation deletes
the marker first, so a half-deleted folder is never taken for a checkpoint.

`lock_folder` gives one run at a time a folder (``OUTPUT_DIR``, a checkpoints folder): an
``fcntl.flock`` on ``.sss.lock``, which also names the holder (pid, host, start, command).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import sys
import zlib
from pathlib import Path
from typing import Any

import torch

from sss.errors import SSSError

__all__ = [
    "LOCK",
    "MARKER",
    "DamagedCheckpointError",
    "FolderInUseError",
    "FolderLock",
    "UnsafeCheckpointError",
    "check_no_code_on_load",
    "check_rng_restored",
    "checkpoint_step",
    "commit_folder",
    "complete_checkpoints",
    "config_differences",
    "config_hash",
    "folder_holder",
    "get_rng_state",
    "holds_run",
    "lock_folder",
    "newest_verified",
    "recover_leftovers",
    "remove_checkpoint",
    "resize_history",
    "resized_resume_batch",
    "rng_file",
    "seed_missing_rng",
    "set_rng_state",
    "verify_checkpoint",
    "write_marker",
]

MARKER = "trainer_state.json"
"""Written last into a checkpoint folder: a folder without it is not a checkpoint."""
_NAME = re.compile(r"^step_(\d{7,})$")
_FSDP_MODEL = "pytorch_model_fsdp_0"  # Accelerate's folder of a sharded model state

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
    """Complete checkpoint folders (``step_NNNNNNN`` whose ``trainer_state.json`` parses), oldest first.

    Complete is not verified: `newest_verified` also checks every file against the marker's manifest.

    Example:
        >>> complete_checkpoints("/nonexistent")
        []
    """
    return [p for p in _step_folders(folder) if _read_marker(p) is not None]


def checkpoint_step(checkpoint: str | Path) -> int:
    """The global step in a checkpoint folder's name (``step_0000040`` -> 40).

    Example:
        >>> checkpoint_step("runs/x/checkpoints/step_0000040")
        40
    """
    found = _NAME.match(Path(checkpoint).name)
    if found is None:
        raise ValueError(f"{checkpoint} is not named like a checkpoint folder (step_NNNNNNN)")
    return int(found.group(1))


def _step_folders(folder: str | Path) -> list[Path]:
    # step_NNNNNNN folders holding a marker file, parseable or not, oldest first
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME.match(p.name) and (p / MARKER).is_file()]
    return sorted(found, key=checkpoint_step)


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):  # missing, unreadable, not UTF-8, not JSON
        return None
    return meta if isinstance(meta, dict) else None


def recover_leftovers(folder: Path) -> list[str]:
    """Clean what interrupted saves and rotations left in `folder`; returns what was done, one line each.

    ``*.tmp`` folders (a save that never completed) are removed. A ``*.old`` folder is a complete
    checkpoint moved aside by `commit_folder`: it is put back when its replacement never arrived.
    A ``step_NNNNNNN`` folder without a marker is one that rotation had begun to delete
    (`remove_checkpoint` deletes the marker first): its deletion is finished. A folder whose
    marker does not parse is left alone for `newest_verified` to report.

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
        if not final.exists() and _read_marker(leftover) is not None:
            leftover.rename(final)
            done.append(f"restored {final.name} from {leftover.name}")
        else:
            shutil.rmtree(leftover, ignore_errors=True)
            done.append(f"removed {leftover.name}")
    for leftover in sorted(folder.glob("*.tmp")):
        shutil.rmtree(leftover, ignore_errors=True)
        done.append(f"removed the incomplete save {leftover.name}")
    for leftover in sorted(folder.glob("step_*")):
        if leftover.is_dir() and _NAME.match(leftover.name) and not (leftover / MARKER).exists():
            shutil.rmtree(leftover, ignore_errors=True)
            done.append(f"finished removing {leftover.name} (its rotation was interrupted)")
    return done


def remove_checkpoint(checkpoint: Path) -> None:
    """Delete a checkpoint folder, its marker first, so that an interrupted deletion never looks complete.

    Example:
        >>> import tempfile, pathlib
        >>> ckpt = pathlib.Path(tempfile.mkdtemp()) / "step_0000001"; ckpt.mkdir()
        >>> _ = (ckpt / MARKER).write_text("{}"); remove_checkpoint(ckpt); ckpt.exists()
        False
    """
    with contextlib.suppress(FileNotFoundError):
        (checkpoint / MARKER).unlink()
        _fsync(checkpoint, directory=True)  # the marker is gone on disk before any other file goes
    shutil.rmtree(checkpoint, ignore_errors=True)


# ---------------------------------------------------------------------- the manifest and verification
class DamagedCheckpointError(RuntimeError, SSSError):
    """A checkpoint folder with a missing, truncated or altered file (or an unreadable marker)."""


def _crc32(path: Path) -> str:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def write_marker(folder: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Write ``trainer_state.json`` into `folder`: `meta` plus ``files``, the manifest of every other file.

    Call it last, when every other file of the checkpoint is written; returns what was written.
    Each file is recorded with its size and the CRC32 of its bytes (about 3 GB/s from the page
    cache: 2 ms for the 5 MB checkpoint of the default model).

    Example:
        >>> import tempfile, pathlib
        >>> folder = pathlib.Path(tempfile.mkdtemp()); _ = (folder / "model.safetensors").write_bytes(b"abc")
        >>> write_marker(folder, {"global_step": 1})["files"]
        {'model.safetensors': {'size': 3, 'crc32': '352441c2'}}
    """
    files = {}
    for file in sorted(folder.rglob("*")):
        name = file.relative_to(folder).as_posix()
        if file.is_file() and name != MARKER:
            files[name] = {"size": file.stat().st_size, "crc32": _crc32(file)}
    written = {**meta, "files": files}
    (folder / MARKER).write_text(json.dumps(written, indent=2))
    return written


def rng_file(process_index: int) -> str:
    """The name of the RNG state file Accelerate writes for process `process_index`.

    Example:
        >>> rng_file(1)
        'random_states_1.pkl'
    """
    return f"random_states_{process_index}.pkl"


def verify_checkpoint(checkpoint: str | Path) -> dict[str, Any]:
    """Check a checkpoint folder against its marker's manifest; return the marker's content.

    Raises `DamagedCheckpointError` naming the first file that is missing, has another size or
    another CRC32 than recorded, or a marker that is missing or does not parse. The RNG state file
    of every process that wrote the checkpoint must be among the files: without it a resume
    would not be exact. A checkpoint written before sss recorded manifests is checked for its
    model and RNG files only.

    Example:
        >>> import tempfile, pathlib
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (folder / rng_file(0)).write_bytes(b"rng"); _ = write_marker(folder, {"global_step": 2})
        >>> verify_checkpoint(folder)["global_step"]
        2
        >>> _ = (folder / rng_file(0)).write_bytes(b"rn")
        >>> verify_checkpoint(folder)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        sss.checkpoint.DamagedCheckpointError: .../random_states_0.pkl is 2 bytes but trainer_state.json recorded 3 ...
    """
    checkpoint = Path(checkpoint)
    marker = checkpoint / MARKER
    if not marker.is_file():
        raise DamagedCheckpointError(
            f"{checkpoint} is not a complete sss checkpoint (no {MARKER}): a save or a rotation was interrupted, "
            "or this is not a checkpoint folder"
        )
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError) as exc:
        raise DamagedCheckpointError(f"{marker} cannot be read as JSON ({exc}): the marker is damaged") from exc
    if not isinstance(meta, dict) or "global_step" not in meta:
        raise DamagedCheckpointError(f"{marker} is not an sss checkpoint marker (no global_step): it is damaged")
    files = meta.get("files")
    if files is None:  # written before manifests: the model and RNG files must at least be there
        files = {}
        if not any((checkpoint / n).exists() for n in ("model.safetensors", "pytorch_model.bin", _FSDP_MODEL)):
            raise DamagedCheckpointError(f"{checkpoint / 'model.safetensors'} is missing")
    if not isinstance(files, dict) or any(Path(n).is_absolute() or ".." in Path(n).parts for n in files):
        raise DamagedCheckpointError(f"{marker}: its file list is not a manifest of this folder: it is damaged")
    needed = [rng_file(i) for i in range(int(meta.get("num_processes", 1)))]
    for name in [*files, *(n for n in needed if n not in files)]:
        file, entry = checkpoint / name, files.get(name)
        why = _file_problem(file, entry if isinstance(entry, dict) or entry is None else {})
        if why and name in needed:
            why += f" (the RNG state of process {needed.index(name)}; without it the resume would not be exact)"
        if why:
            raise DamagedCheckpointError(f"{file} {why}")
    return meta


def _file_problem(file: Path, entry: dict[str, Any] | None) -> str | None:
    # entry: what the manifest recorded (None: not in the manifest, only required to be there)
    if not file.is_file():
        return f"is missing (listed in {MARKER})" if entry is not None else "is missing"
    if entry is None:
        return None
    size = file.stat().st_size
    if size != entry.get("size"):
        return f"is {size} bytes but {MARKER} recorded {entry.get('size')} (truncated or rewritten)"
    if _crc32(file) != entry.get("crc32"):
        return f"does not match the CRC32 recorded in {MARKER} (its bytes changed after the save)"
    return None


def newest_verified(folder: str | Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint in `folder` that `verify_checkpoint` accepts, and why each newer one failed.

    Example:
        >>> newest_verified("/nonexistent")
        (None, [])
    """
    damaged: list[str] = []
    for candidate in reversed(_step_folders(folder)):
        try:
            verify_checkpoint(candidate)
        except DamagedCheckpointError as exc:
            damaged.append(str(exc))
            continue
        return candidate, damaged
    return None, damaged


def check_rng_restored(checkpoint: Path, process_index: int) -> None:
    """Raise unless this process's RNG now is the one saved in `checkpoint` (call right after ``load_state``).

    Accelerate's ``load_state`` logs a failure to restore the RNG states at info level and goes
    on; the resume would then silently differ from the uninterrupted run.

    Example:
        >>> import random, tempfile, pathlib, numpy as np, torch
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> saved = {"random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
        ...          "torch_manual_seed": torch.get_rng_state()}
        >>> torch.save(saved, folder / rng_file(0))
        >>> check_rng_restored(folder, 0)
        >>> _ = torch.rand(1)
        >>> check_rng_restored(folder, 0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        sss.checkpoint.DamagedCheckpointError: .../random_states_0.pkl: the RNG state was not restored from it ...
    """
    import random

    from accelerate.utils.other import TORCH_SAFE_GLOBALS

    file = checkpoint / rng_file(process_index)
    try:
        with torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
            saved = torch.load(file, map_location="cpu", weights_only=True)
        same = torch.equal(torch.get_rng_state(), saved["torch_manual_seed"])
        same = same and random.getstate() == _as_tuples(saved["random_state"])
    except Exception as exc:  # missing, unreadable, or without the expected keys
        raise DamagedCheckpointError(
            f"{file}: the RNG state cannot be read from it ({type(exc).__name__}: {exc}); the resume would not be "
            "exact. Resume an older checkpoint (sss fit CONFIG --resume PATH) or start a new run."
        ) from exc
    if not same:
        raise DamagedCheckpointError(
            f"{file}: the RNG state was not restored from it (Accelerate's load_state failed on it); the resume "
            "would not be exact. Resume an older checkpoint (sss fit CONFIG --resume PATH) or start a new run."
        )


def _as_tuples(value: Any) -> Any:
    # random.getstate() is nested tuples; a pickle round trip keeps them, a list would not compare equal
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


# ---------------------------------------------------------------------- resuming on another process count
def resized_resume_batch(resume_batch: int, saved_processes: int, processes: int, split_batches: bool = False) -> int:
    """The per-process batch to resume at on `processes` processes, for a checkpoint of `saved_processes`.

    Accelerate shards a prepared loader by handing the underlying batch sampler's batches round-robin
    to the processes (``BatchSamplerShard``, ``split_batches=False``): after ``resume_batch`` batches
    each, ``resume_batch * saved_processes`` underlying batches of the epoch were served, and the
    seedable sampler's order is the same on any process count. The new count skips that many
    underlying batches, rounded down to a whole number per process: when it does not divide, fewer
    than `processes` underlying batches (less than one global batch of the resumed run) are served
    again; none is ever skipped. With ``split_batches=True`` every process takes a slice of each
    underlying batch, so the count carries over unchanged.

    Example:
        >>> resized_resume_batch(3, saved_processes=2, processes=1)  # 6 batches were served: skip 6
        6
        >>> resized_resume_batch(4, saved_processes=1, processes=2)  # 4 batches were served: 2 each
        2
        >>> resized_resume_batch(3, saved_processes=1, processes=2)  # 3 served: 2 skipped, batch 2 again
        1
    """
    if split_batches:
        return resume_batch
    return resume_batch * saved_processes // processes


def seed_missing_rng(checkpoint: Path, process_index: int) -> int:
    """Seed the RNG of a process the checkpoint has no RNG file for; return the saved Accelerate step.

    A checkpoint written by fewer processes than resume it holds no ``random_states_{rank}.pkl``
    for the new ranks (Accelerate's ``load_state`` logs that at info level and goes on). Their
    Python, NumPy and torch (CPU and CUDA) generators are seeded from the saved process 0 state and
    the rank (a SHA-256 of both), so a resized resume is repeatable and its ranks draw different
    streams (dropout, augmentation). Accelerate's step counter, also in that file, is process 0's.

    Example:
        >>> import tempfile, pathlib, torch
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> torch.save({"step": 8, "torch_manual_seed": torch.get_rng_state()}, folder / rng_file(0))
        >>> step = seed_missing_rng(folder, 1); first = torch.rand(1)
        >>> _ = seed_missing_rng(folder, 1); step, torch.equal(first, torch.rand(1))  # repeatable
        (8, True)
    """
    import random

    import numpy as np
    from accelerate.utils.other import TORCH_SAFE_GLOBALS

    with torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
        saved = torch.load(checkpoint / rng_file(0), map_location="cpu", weights_only=True)
    digest = hashlib.sha256(saved["torch_manual_seed"].numpy().tobytes() + process_index.to_bytes(8, "little"))
    seed = int.from_bytes(digest.digest()[:4], "little")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # the CUDA generators too
    return int(saved.get("step", 0))


def resize_history(meta: dict[str, Any], num_processes: int) -> list[dict[str, int]]:
    """The process-count changes of a run resumed from a checkpoint with marker `meta` on `num_processes`.

    The checkpoint's own ``resized_from`` list, plus this resume when its count differs: one
    ``{"num_processes", "global_step"}`` (the count that wrote the checkpoint, and its step) each.

    Example:
        >>> resize_history({"num_processes": 2, "global_step": 4}, 1)
        [{'num_processes': 2, 'global_step': 4}]
        >>> resize_history({"num_processes": 2, "global_step": 4}, 2)
        []
    """
    history = [dict(entry) for entry in meta.get("resized_from", [])]
    saved = int(meta.get("num_processes", 1))
    if saved != num_processes:
        history.append({"num_processes": saved, "global_step": int(meta["global_step"])})
    return history


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
        if not file.is_file() or file.suffix in {".safetensors", ".json", ".yaml", ".md", ".txt", ".csv", ".lock"}:
            continue
        try:
            with torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
                torch.load(file, map_location="cpu", weights_only=True, mmap=_is_zip(file))
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if not _needs_code(file, exc):  # truncated or garbled: damage, not a security problem
                raise DamagedCheckpointError(
                    f"{file} cannot be read ({type(exc).__name__}: {first[:200]}): it is damaged"
                ) from exc
            raise UnsafeCheckpointError(
                f"{file} would run code when loaded ({first}). sss loads checkpoints without executing "
                "pickled code; if you wrote this file yourself and trust it, load it with torch.load(..., "
                "weights_only=False) and re-save plain tensors and numbers, or remove it from the folder."
            ) from exc


class UnsafeCheckpointError(RuntimeError, SSSError):
    """A checkpoint file that cannot be loaded without executing code."""


def _needs_code(file: Path, exc: BaseException) -> bool:
    # The safe loader refused a file. A whole pickle it refuses needs something beyond plain data
    # (a global, a reduce call, a protocol feature it does not parse): treated as code. A file that
    # is not even a whole pickle (cut short, garbled) or a broken zip is damage.
    import pickle
    import pickletools

    if not isinstance(exc, pickle.UnpicklingError):
        return False
    if _is_zip(file):
        return True  # the zip container read fine: the refusal is about its pickle's content
    try:
        with file.open("rb") as f:
            for _ in pickletools.genops(f):  # parses the opcodes only: nothing is imported or called
                pass
    except Exception:
        return False
    return True


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


# ---------------------------------------------------------------------- the folder lock
LOCK = ".sss.lock"
"""The lock file of a folder in use by a run (``OUTPUT_DIR``, a checkpoints folder); removed when the run ends."""

_GRACE_S = 1.0
"""How long `lock_folder` waits for a held lock: a run killed a moment ago may still be exiting (tearing
down its memory) and releases its flock only when it is gone."""
_HELD: dict[str, FolderLock] = {}  # this process's locks by real path, so that one run can take its folder twice


class FolderInUseError(FileExistsError, SSSError):
    """The folder is locked by another live run."""


class FolderLock:
    """An exclusive ``fcntl.flock`` on ``FOLDER/.sss.lock``, held until `release` (or the process ends).

    The kernel drops the flock when the holder dies, however it dies (``kill -9`` too); the file's
    JSON body ``{pid, host, started, command}`` names the holder in the refusal message. Made by
    `lock_folder`; a context manager.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd, self._pid, self._count = path, fd, os.getpid(), 1

    def release(self) -> None:
        """Let the folder go (once per `lock_folder` call); the file is removed with the last release."""
        if self._fd is None or self._pid != os.getpid():
            return
        self._count -= 1
        if self._count:
            return
        _HELD.pop(os.path.realpath(self.path), None)
        with contextlib.suppress(OSError):
            self.path.unlink()  # before unlocking: a run that opened the old file sees it is gone and retries
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_folder(folder: str | Path, what: str = "run") -> FolderLock:
    """Take `folder` for this process, or raise `FolderInUseError` naming the live run that has it.

    A lock left by a run that ended without releasing it is taken over with a one-line notice:
    either the kernel already dropped its flock (the run was killed), or the flock survives in
    processes that inherited it but the run's own pid is gone on this host. Taking a folder this
    process already holds nests (one `release` per call).

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> with lock_folder(folder) as lock:
        ...     folder_holder(folder)["pid"] == os.getpid()
        True
        >>> folder_holder(folder) is None
        True
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    held = _HELD.get(os.path.realpath(path))
    if held is not None and held._pid == os.getpid() and held._fd is not None:
        held._count += 1
        return held
    for _ in range(10):  # each retry follows a holder that released or was taken over meanwhile
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _flock_within(fd, 0 if _gone(_read_holder(fd)) else _GRACE_S)
        except BlockingIOError:
            holder = _read_holder(fd)
            same = _same_file(fd, path)
            os.close(fd)
            if not same:
                continue
            if not _gone(holder):
                raise FolderInUseError(
                    f"{folder} is in use by another sss {what}: {_describe(holder)}. Two runs in one folder would "
                    f"overwrite each other's checkpoints and results. Wait for it to end, or give this run another "
                    f"folder (trainer.output_dir); if that process is not running any more, delete {path}."
                ) from None
            print(f"sss: {folder}: taking over the lock of {_describe(holder)}: that process is gone", flush=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a fresh file: the processes that inherited the old flock keep only the old one
            continue
        if not _same_file(fd, path):  # its holder removed it between our open and our flock
            os.close(fd)
            continue
        holder = _read_holder(fd)
        if holder:
            ended = "which ended without releasing it"
            print(f"sss: {folder}: taking over the lock of {_describe(holder)}, {ended}", flush=True)
        body = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": shlex.join(sys.argv),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(body).encode(), 0)
        lock = _HELD[os.path.realpath(path)] = FolderLock(path, fd)
        return lock
    raise FolderInUseError(f"{folder}: could not take {path}: other runs keep taking and releasing it")


def _flock_within(fd: int, seconds: float) -> None:
    import fcntl
    import time

    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def folder_holder(folder: str | Path) -> dict[str, Any] | None:
    """The lock body ``{pid, host, started, command}`` of the live run holding `folder`, or None.

    Example:
        >>> folder_holder("/nonexistent") is None
        True
    """
    import fcntl

    path = Path(folder) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        held = _HELD.get(os.path.realpath(path))
        if held is not None and held._pid == os.getpid() and held._fd is not None:
            return _read_holder(fd) or {"pid": os.getpid()}
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a probe: nobody holds it
        except BlockingIOError:
            holder = _read_holder(fd)
            return None if _gone(holder) else (holder or {})
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        body = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _gone(holder: dict[str, Any]) -> bool:
    # Only a pid on this host can be checked; elsewhere, a held flock means a live run.
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a process that has not written its name yet"
    text = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}"
    return text + (f" ({holder['command']})" if holder.get("command") else "")


def holds_run(folder: str | Path) -> bool:
    """Whether an output folder holds a run: its results, a complete checkpoint, or a live run's lock.

    A fresh ``sss fit`` with the default ``runs/<name>`` moves on to ``runs/<name>_1`` while this is true.

    Example:
        >>> holds_run("/nonexistent")
        False
    """
    folder = Path(folder)
    return (
        (folder / "results.json").exists()
        or bool(complete_checkpoints(folder / "checkpoints"))
        or folder_holder(folder) is not None
        or folder_holder(folder / "checkpoints") is not None  # a Python fit's checkpoint callback
    )
