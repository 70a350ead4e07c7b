"""The checkpoint folder format: marker and manifest, atomic commits, verification, rotation, RNG states.

The trainer writes and reads checkpoints, the checkpoint callback rotates them and the run folder
(`sss.run.folder`) finds them: all three use this module rather than repeating the file names, and
none reads a checkpoint's files but through it. torch is imported by the functions that load or
seed (``sss check`` finds checkpoints without loading it).

A checkpoint folder is complete when it holds a ``trainer_state.json`` that parses (written last)
under its final name. It is written as ``<name>.tmp``, every file is fsynced, and only then
renamed, so a crash at any moment leaves either the previous complete checkpoint or the new one.
The marker records every other file of the folder with its size and CRC32 (``files``); a
checkpoint is loaded only after `verify_checkpoint` found each of them intact and the marker's
values valid (`sss._marker`), once per resume (`verify_for_resume`). Rotation deletes the marker
first, so a half-deleted folder is never taken for a checkpoint.

The folder lock (`lock_folder`: one run at a time in ``OUTPUT_DIR`` or a checkpoints folder) is
`sss._lock`'s, re-exported here for the checkpoint callback; which folder a run takes is `sss.run.folder`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import zlib
from pathlib import Path
from typing import Any, NamedTuple

from sss._config_diff import config_differences, config_hash
from sss._lock import LOCK, FolderInUseError, FolderLock, folder_holder, lock_folder
from sss._marker import marker_problem
from sss.errors import SSSError

__all__ = [
    "LOCK",
    "MARKER",
    "DamagedCheckpointError",
    "FolderInUseError",
    "FolderLock",
    "UnsafeCheckpointError",
    "VerifiedCheckpoint",
    "check_no_code_on_load",
    "check_rng_restored",
    "checkpoint_step",
    "commit_folder",
    "complete_checkpoints",
    "config_differences",
    "config_hash",
    "folder_holder",
    "get_rng_state",
    "lock_folder",
    "newest_resumable",
    "newest_verified",
    "read_marker",
    "recover_leftovers",
    "remove_checkpoint",
    "resize_history",
    "resized_resume_batch",
    "rng_file",
    "seed_missing_rng",
    "set_rng_state",
    "verify_checkpoint",
    "verify_for_resume",
    "write_marker",
]

MARKER = "trainer_state.json"
"""Written last into a checkpoint folder: a folder without it is not a checkpoint."""
_NAME = re.compile(r"^step_(\d{7,})$")
_FSDP_MODEL = "pytorch_model_fsdp_0"  # Accelerate's folder of a sharded model state


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


def verify_checkpoint(checkpoint: str | Path, resume: bool = False) -> dict[str, Any]:
    """Check a checkpoint folder against its marker's manifest; return the marker's content.

    Raises `DamagedCheckpointError` naming the first file that is missing, has another size or
    another CRC32 than recorded, or a marker that is missing, does not parse or holds a value of the
    wrong type or range (`sss._marker.marker_problem`; with `resume`, also one without a value a resume
    reads). The RNG state file of every process that wrote the checkpoint must be among the files:
    without it a resume would not be exact. A folder named ``step_NNNNNNN`` must hold that step: one
    renamed or copied by hand is not taken for another step. A checkpoint written before sss recorded
    manifests is checked for its model and RNG files only.

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
    meta = _valid_marker(checkpoint, resume)
    files = meta.get("files")
    if files is None:  # written before manifests: the model and RNG files must at least be there
        files = {}
        if not any((checkpoint / n).exists() for n in ("model.safetensors", "pytorch_model.bin", _FSDP_MODEL)):
            raise DamagedCheckpointError(f"{checkpoint / 'model.safetensors'} is missing")
    if any(Path(n).is_absolute() or ".." in Path(n).parts for n in files):
        raise DamagedCheckpointError(f"{checkpoint / MARKER}: its file list is not a manifest of this folder: damaged")
    processes = meta.get("num_processes", 1)
    for name, entry in files.items():
        why = _file_problem(checkpoint / name, entry)
        if why:
            raise DamagedCheckpointError(f"{checkpoint / name} {why}{_rng_note(name, processes)}")
    for i in range(processes):  # each process's RNG file, also one not in the manifest; the first missing ends it
        name = rng_file(i)
        if name not in files and not (checkpoint / name).is_file():
            raise DamagedCheckpointError(f"{checkpoint / name} is missing{_rng_note(name, processes)}")
    return meta


def _valid_marker(checkpoint: Path, resume: bool) -> dict[str, Any]:
    # The marker, parsed and checked against the schema, and the folder's name against its step.
    marker = checkpoint / MARKER
    if not marker.is_file():
        raise DamagedCheckpointError(
            f"{checkpoint} is not a complete sss checkpoint (no {MARKER}): a save or a rotation was interrupted, "
            "or this is not a checkpoint folder"
        )
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise DamagedCheckpointError(f"{marker} cannot be read as JSON ({exc}): the marker is damaged") from exc
    if not isinstance(meta, dict) or "global_step" not in meta:
        raise DamagedCheckpointError(f"{marker} is not an sss checkpoint marker (no global_step): it is damaged")
    problem = marker_problem(meta, resume)
    if problem is not None:
        raise DamagedCheckpointError(
            f"{marker}: {problem}: the marker is damaged (edited, or garbled on disk) and nothing is read from it"
        )
    named = _NAME.match(checkpoint.name)
    if named is not None and int(named.group(1)) != meta["global_step"]:
        step = meta["global_step"]
        raise DamagedCheckpointError(
            f"{checkpoint}: its name says step {int(named.group(1))} but its {MARKER} says global_step {step} "
            f"(renamed or copied by hand?): it is not taken for another step; rename it step_{step:07d} to use it"
        )
    return meta


def _rng_note(name: str, processes: int) -> str:
    found = re.fullmatch(r"random_states_(\d+)\.pkl", name)
    if found is None or int(found.group(1)) >= processes:
        return ""
    return f" (the RNG state of process {int(found.group(1))}; without it the resume would not be exact)"


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


class VerifiedCheckpoint(NamedTuple):
    """A checkpoint folder `verify_checkpoint` accepted for a resume in this process, and its marker; a path-like.

    The run folder hands it to the trainer (``fit(ckpt_path=...)``), whose load checks no file again.

    Example:
        >>> import os
        >>> found = VerifiedCheckpoint(Path("runs/x/checkpoints/step_0000004"), {"global_step": 4})
        >>> os.fspath(found), found.meta["global_step"]
        ('runs/x/checkpoints/step_0000004', 4)
    """

    path: Path
    meta: dict[str, Any]

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:  # printed as the folder it is, as a path would be
        return os.fspath(self.path)


def verify_for_resume(checkpoint: str | os.PathLike) -> VerifiedCheckpoint:
    """`checkpoint` verified for a resume (`verify_checkpoint` with ``resume=True``), unless it already was.

    A `VerifiedCheckpoint` is returned as it is: a resume checks each file once, where its checkpoint
    is chosen, not again where it is loaded.

    Example:
        >>> import tempfile, pathlib
        >>> verify_for_resume(pathlib.Path(tempfile.mkdtemp()))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        sss.checkpoint.DamagedCheckpointError: ... is not a complete sss checkpoint (no trainer_state.json): ...
    """
    if isinstance(checkpoint, VerifiedCheckpoint):
        return checkpoint
    path = Path(checkpoint)
    return VerifiedCheckpoint(path, verify_checkpoint(path, resume=True))


def newest_resumable(folder: str | Path) -> tuple[VerifiedCheckpoint | None, list[str]]:
    """The newest checkpoint in `folder` that a resume may take, verified, and why each newer one failed.

    That is the newest that `verify_checkpoint` accepts with ``resume=True``; a folder whose name and
    marker disagree on the step is among the failures, with the reason.

    Example:
        >>> newest_resumable("/nonexistent")
        (None, [])
    """
    damaged: list[str] = []
    for candidate in reversed(_step_folders(folder)):
        try:
            return VerifiedCheckpoint(candidate, verify_checkpoint(candidate, resume=True)), damaged
        except DamagedCheckpointError as exc:
            damaged.append(str(exc))
    return None, damaged


def newest_verified(folder: str | Path) -> tuple[Path | None, list[str]]:
    """The folder of `newest_resumable`'s checkpoint (None when none verifies), and why each newer one failed.

    Example:
        >>> newest_verified("/nonexistent")
        (None, [])
    """
    found, damaged = newest_resumable(folder)
    return (None if found is None else found.path), damaged


def read_marker(checkpoint: str | Path) -> dict[str, Any]:
    """The ``trainer_state.json`` of a checkpoint, parsed but not verified (one this run wrote, say).

    Example:
        >>> import tempfile, pathlib
        >>> folder = pathlib.Path(tempfile.mkdtemp()); _ = (folder / MARKER).write_text('{"global_step": 4}')
        >>> read_marker(folder)
        {'global_step': 4}
    """
    meta = _read_marker(Path(checkpoint))
    if meta is None:
        raise DamagedCheckpointError(f"{Path(checkpoint) / MARKER} cannot be read as a checkpoint marker")
    return meta


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

    import torch
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
    import torch
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
    import torch
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


def get_rng_state() -> dict[str, Any]:
    """The process's Python, NumPy, torch CPU and CUDA RNG states (what Accelerate saves per process)."""
    import random

    import numpy as np
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(saved: dict[str, Any]) -> None:
    """Restore states taken by `get_rng_state`."""
    import random

    import numpy as np
    import torch

    random.setstate(saved["python"])
    np.random.set_state(saved["numpy"])
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] is not None:
        torch.cuda.set_rng_state_all(saved["cuda"])
