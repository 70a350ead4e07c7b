"""Errors -> one line and an exit code: what the ``sss`` command prints for an exception that ends it.

`explain_error` walks `ERRORS`, a table of ``(matches, message)`` rows (first match wins), with
the running command's config when there is one: its output folder is where a failed write is
looked for and which checkpoints are still intact. No argparse and no torch are needed to use it.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ERRORS", "LOW_DISK", "explain_error"]

Match = Callable[[BaseException, Any], bool]
"""Whether a row is for an exception (given with the running command's config, or None)."""
Message = Callable[[BaseException, Any], tuple[str, int]]
"""A row's line and exit code for an exception (given with the running command's config, or None)."""

LOW_DISK = 1 << 30
"""Free bytes under which a failed write counts as a full disk (torch.save's errors do not say why)."""
# What torch.save and safetensors raise when a write fails (a full disk among other causes).
_WRITE_FAILED = re.compile(r"unexpected pos|PytorchStreamWriter failed|file write failed", re.IGNORECASE)
_NO_SPACE = re.compile(r"No space left on device|StorageFull|Disk quota exceeded", re.IGNORECASE)


def explain_error(exc: BaseException, cfg: Any = None) -> tuple[str, int]:
    """The line ``sss`` prints for `exc`, and the exit code: the first row of `ERRORS` that matches.

    `cfg` is the running command's config (None before one is loaded): a failed write without a
    path of its own is looked for in its ``trainer.output_dir``, and its checkpoints are named.

    Example:
        >>> import errno
        >>> explain_error(PermissionError(errno.EACCES, "Permission denied", "/srv/runs"))  # doctest: +ELLIPSIS
        ('error: permission denied: /srv/runs; ...', 1)
        >>> explain_error(KeyError("x"))  # doctest: +ELLIPSIS
        ("error: KeyError: 'x' (unexpected: `sss --traceback ...` shows where it happened)", 1)
    """
    for matches, message in ERRORS:
        if matches(exc, cfg):
            return message(exc, cfg)
    raise AssertionError("the last row of ERRORS matches everything")  # pragma: no cover


def _instance_of(module: str, name: str) -> Match:
    # Matching without importing: an instance of the class exists only if its module was loaded,
    # so a config error does not pay for importing torch to be reported.
    def matches(exc: BaseException, cfg: Any) -> bool:
        cls = getattr(sys.modules.get(module), name, None)
        return cls is not None and isinstance(exc, cls)

    return matches


def _is_sss_error(exc: BaseException, cfg: Any) -> bool:
    from sss.errors import SSSError

    # sss.checkpoint's errors (an unsafe or damaged checkpoint, a folder in use) name the folder and the fix.
    return isinstance(exc, SSSError) or (isinstance(exc, Exception) and type(exc).__module__ == "sss.checkpoint")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return seen


def _out_of_space(exc: BaseException, cfg: Any) -> bool:
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if _NO_SPACE.search(str(link)):
            return True
        if isinstance(link, RuntimeError) and _WRITE_FAILED.search(str(link)):
            return _free_bytes(_write_target(exc, cfg)) < LOW_DISK
    return False


def _write_target(exc: BaseException, cfg: Any) -> Path:
    # The writers name the folder they write (sss._writing.writing_to): the outermost OSError of the chain.
    # A copy or a rename names its destination second (shutil.copyfile on a full disk: filename2).
    for link in _chain(exc):
        if isinstance(link, OSError) and (link.filename2 or link.filename):
            return Path(os.fsdecode(link.filename2 or link.filename))
    return Path(cfg.trainer.output_dir) if cfg is not None and cfg.trainer.output_dir else Path.cwd()


def _free_bytes(path: Path) -> int:
    for folder in (path, *path.absolute().parents):  # the nearest folder that exists (the output may not yet)
        if folder.exists():
            return shutil.disk_usage(folder).free
    return shutil.disk_usage(Path.cwd()).free


def _disk_full(exc: BaseException, cfg: Any) -> tuple[str, int]:
    path = _write_target(exc, cfg)
    free = _free_bytes(path) // 2**20
    return f"error: disk full at {path}, {free} MB free; {_after_write_failure(cfg)}", 1


def _after_write_failure(cfg: Any) -> str:
    if cfg is None:
        return "free some space and run the command again"
    from sss.checkpoint import complete_checkpoints

    # Checkpoints are written as step_N.tmp and renamed when complete; the next start removes the leftover.
    saved = complete_checkpoints(Path(cfg.trainer.output_dir or ".") / "checkpoints")
    if not saved:
        return "no checkpoint was saved yet: free some space, then run `sss fit CONFIG` again"
    return f"the checkpoint {saved[-1]} is intact: free some space, then continue with `sss fit CONFIG --resume`"


def _write_failed(exc: BaseException, cfg: Any) -> tuple[str, int]:
    path = _write_target(exc, cfg)
    free = _free_bytes(path) // 2**20
    reason = str(exc).strip().splitlines()[0]
    return (
        f"error: writing to {path} failed ({reason}) with {free} MB free there (a quota, a network file system "
        f"or a failing disk?); {_after_write_failure(cfg)}",
        1,
    )


def _not_allowed(exc: BaseException, cfg: Any) -> tuple[str, int]:
    assert isinstance(exc, OSError)
    path = Path(os.fsdecode(exc.filename)) if exc.filename else Path.cwd()
    head = f"{path} is on a read-only file system" if exc.errno == errno.EROFS else f"permission denied: {path}"
    out = Path(cfg.trainer.output_dir).absolute() if cfg is not None and cfg.trainer.output_dir else None
    target = path.absolute()
    # The output folder, a file in it, or a folder above it that had to be created.
    if out is not None and (target == out or out in target.parents or target in out.parents):
        fix = "choose a writable output folder (trainer.output_dir=PATH), or make this one writable for this user"
    else:
        fix = "make it readable and writable for this user (chmod, chown), or use another path"
    return f"error: {head}; {fix}", 1


def _not_a_folder(exc: BaseException, cfg: Any) -> bool:
    # mkdir of a path that is a file (trainer.output_dir=/dev/null): the OS says only "File exists".
    if not isinstance(exc, OSError) or not exc.filename or exc.errno not in (errno.EEXIST, errno.ENOTDIR):
        return False
    path = Path(os.fsdecode(exc.filename))
    return exc.errno == errno.ENOTDIR or (path.exists() and not path.is_dir())


def _not_a_folder_message(exc: BaseException, cfg: Any) -> tuple[str, int]:
    assert isinstance(exc, OSError)
    path = Path(os.fsdecode(exc.filename))
    found = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
    out = Path(cfg.trainer.output_dir) if cfg is not None and cfg.trainer.output_dir else None
    if out is not None and (out == path or out.absolute() in (path.absolute(), *path.absolute().parents)):
        return f"error: trainer.output_dir={out}: {found} exists and is not a folder; choose a folder path", 1
    return f"error: {found} exists and is not a folder, so nothing can be written in it; choose a folder path", 1


def _interrupted(exc: BaseException, cfg: Any) -> tuple[str, int]:
    folder = Path(cfg.trainer.output_dir) / "checkpoints" if cfg is not None else None
    saved = folder is not None and folder.is_dir() and any(p.name[-4:] != ".tmp" for p in folder.glob("step_*"))
    if not saved:
        return "sss: interrupted (Ctrl-C)" + (", before any checkpoint was saved" if folder else ""), 130
    return (
        f"sss: interrupted (Ctrl-C): stopped at once, without saving; the checkpoints in {folder} are "
        "intact: `sss fit CONFIG --resume` continues from the newest",
        130,
    )


def _unexpected(exc: BaseException, cfg: Any) -> tuple[str, int]:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"error: {type(exc).__name__}: {first} (unexpected: `sss --traceback ...` shows where it happened)", 1


_NOT_DETERMINISTIC = re.compile(r"(\S+) does not have a deterministic implementation")
_CUBLAS = "because it uses CuBLAS"


def _not_deterministic(exc: BaseException, cfg: Any) -> bool:
    return any(
        isinstance(link, RuntimeError) and (_NOT_DETERMINISTIC.search(str(link)) or _CUBLAS in str(link))
        for link in _chain(exc)
    )


def _nondeterministic_op(exc: BaseException, cfg: Any) -> tuple[str, int]:
    # torch's own message says "turn off determinism just for this operation" in C++ terms; say it in sss's.
    text = next(str(link) for link in _chain(exc) if isinstance(link, RuntimeError))
    if _CUBLAS in text:
        return (
            "error: trainer.deterministic=true: cuBLAS is not deterministic without CUBLAS_WORKSPACE_CONFIG, which "
            "must be set before the first CUDA matmul: export CUBLAS_WORKSPACE_CONFIG=:4096:8 (sss fit sets it "
            "itself; from Python, set it before anything runs on the GPU), or set trainer.deterministic=false",
            1,
        )
    found = _NOT_DETERMINISTIC.search(text)
    op = found[1] if found else "an operation"
    return (
        f"error: trainer.deterministic=true: {op} has no deterministic implementation on this device, so "
        "torch.use_deterministic_algorithms refuses it: set trainer.deterministic=false, or replace the op in your "
        "model with one that has (torch's list: the torch.use_deterministic_algorithms documentation)",
        1,
    )


def _is_os(*codes: int) -> Match:
    return lambda exc, cfg: isinstance(exc, OSError) and exc.errno in codes


ERRORS: list[tuple[Match, Message]] = [
    (lambda exc, cfg: isinstance(exc, KeyboardInterrupt), _interrupted),  # a second Ctrl-C: the first one saves
    # SIGTERM/SIGINT after saving a checkpoint: the shell's 128 + signal number
    (_instance_of("sss.callbacks.checkpoint", "Preempted"), lambda exc, cfg: (f"sss: {exc}", 128 + exc.signum)),
    (_out_of_space, _disk_full),
    (_is_sss_error, lambda exc, cfg: (f"error: {exc}", getattr(exc, "exit_code", 1))),
    (_is_os(errno.EROFS, errno.EACCES, errno.EPERM), _not_allowed),
    (_not_a_folder, _not_a_folder_message),  # trainer.output_dir=/dev/null: "File exists" on its own says nothing
    (lambda exc, cfg: isinstance(exc, RuntimeError) and bool(_WRITE_FAILED.search(str(exc))), _write_failed),
    (_not_deterministic, _nondeterministic_op),  # under trainer.deterministic=true
    # sss raises these with a message naming the path and the fix; the OS's own name the path too
    (lambda exc, cfg: isinstance(exc, (OSError, RuntimeError)), lambda exc, cfg: (f"error: {exc}", 1)),
    (lambda exc, cfg: True, _unexpected),
]
"""``(matches, message)`` rows, first match wins: how ``sss`` turns an exception into a line and an exit code."""
