"""The schema of a checkpoint's marker (``trainer_state.json``): its values are checked as data before use.

A marker may come from anywhere (a copied folder, a download, a hand edit, a disk that garbled it while
the JSON still parses). Every value sss reads from it is checked here for its type and range before
anything is sized from it (``num_processes`` says how many RNG files to look for, ``batch_splits`` how
many parts to cut a batch into): a marker that fails is a damaged checkpoint, as a truncated file is.
`sss.checkpoint.verify_checkpoint` raises `DamagedCheckpointError` with the line `marker_problem` returns.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_PROCESSES", "RESUME_KEYS", "marker_problem"]

MAX_PROCESSES = 1 << 20
"""The most processes a marker may record: beyond any cluster, and small enough to look for each one's RNG file."""
_BIG = (1 << 63) - 1  # counters are int64 in torch; a larger one is no count sss wrote

# key: (lowest, highest) of the whole numbers a marker holds
_WHOLE = {
    "global_step": (0, _BIG),
    "skipped_steps": (0, _BIG),
    "batch_splits": (1, MAX_PROCESSES),
    "epoch": (0, _BIG),
    "batch_idx": (0, _BIG),
    "resume_epoch": (0, _BIG),
    "resume_batch": (0, _BIG),
    "samples": (0, _BIG),
    "num_processes": (1, MAX_PROCESSES),
}
RESUME_KEYS = ("global_step", "skipped_steps", "resume_epoch", "resume_batch", "samples", "metrics", "callbacks")
"""What a resume reads from a marker: a marker without one of them is damaged for a resume."""
_CRC32 = re.compile(r"^[0-9a-f]{8}$")


def marker_problem(meta: Any, resume: bool = False) -> str | None:
    """What is wrong with the marker content `meta`, as the end of a sentence; None when it is valid.

    Only ``global_step`` is required (a marker of an early sss holds little else), unless `resume`:
    then every key of `RESUME_KEYS`. Keys that are present must have the type and range sss writes.

    Example:
        >>> marker_problem({"global_step": 4, "num_processes": 2}) is None
        True
        >>> marker_problem({"global_step": 4, "num_processes": "x"})
        "num_processes is 'x', not a whole number from 1 to 1048576"
        >>> marker_problem({"global_step": -1})
        'global_step is -1, not a whole number from 0 to 9223372036854775807'
        >>> marker_problem({"global_step": 4}, resume=True)
        'it has no skipped_steps (a resume needs it)'
    """
    if not isinstance(meta, dict):
        return f"it holds {type(meta).__name__}, not an object of keys"
    required = RESUME_KEYS if resume else ("global_step",)
    missing = next((key for key in required if key not in meta), None)
    if missing is not None:
        return f"it has no {missing}" + (" (a resume needs it)" if resume else "")
    for key, (low, high) in _WHOLE.items():
        if key in meta and not _whole(meta[key], low, high):
            return f"{key} is {_show(meta[key])}, not a whole number from {low} to {high}"
    for check in (_metrics, _callbacks, _files, _resized, _config, _stream):
        problem = check(meta)
        if problem is not None:
            return problem
    return None


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _metrics(meta: dict[str, Any]) -> str | None:
    metrics = meta.get("metrics", {})
    if not isinstance(metrics, dict):
        return f"metrics is {_show(metrics)}, not an object of metric names and numbers"
    bad = next((k for k, v in metrics.items() if not (_number(v) or v is None)), None)
    return None if bad is None else f"metrics[{bad!r}] is {_show(metrics[bad])}, not a number"


def _callbacks(meta: dict[str, Any]) -> str | None:
    entries = meta.get("callbacks", [])
    if not isinstance(entries, list):
        return f"callbacks is {_show(entries)}, not a list"
    for i, entry in enumerate(entries):
        if not (
            isinstance(entry, dict) and isinstance(entry.get("class"), str) and isinstance(entry.get("state"), dict)
        ):
            return f"callbacks[{i}] is {_show(entry)}, not {{'class': NAME, 'state': {{...}}}}"
    return None


def _files(meta: dict[str, Any]) -> str | None:
    files = meta.get("files")
    if files is None:  # a checkpoint from before manifests
        return None
    if not isinstance(files, dict):
        return f"files is {_show(files)}, not the manifest of the folder"
    for name, entry in files.items():
        size = entry.get("size") if isinstance(entry, dict) else None
        crc = entry.get("crc32") if isinstance(entry, dict) else None
        if not (_whole(size, 0, _BIG) and isinstance(crc, str) and _CRC32.match(crc)):
            return f"files[{name!r}] is {_show(entry)}, not {{'size': BYTES, 'crc32': 8 hex digits}}"
    return None


def _resized(meta: dict[str, Any]) -> str | None:
    history = meta.get("resized_from", [])
    ok = isinstance(history, list) and all(
        isinstance(e, dict)
        and _whole(e.get("num_processes"), 1, MAX_PROCESSES)
        and _whole(e.get("global_step"), 0, _BIG)
        for e in history
    )
    return None if ok else f"resized_from is {_show(history)}, not a list of {{num_processes, global_step}}"


def _config(meta: dict[str, Any]) -> str | None:
    if "config" in meta and not isinstance(meta["config"], dict):
        return f"config is {_show(meta['config'])}, not the run's config"
    if "config_hash" in meta and not isinstance(meta["config_hash"], str):
        return f"config_hash is {_show(meta['config_hash'])}, not a string"
    return None


def _stream(meta: dict[str, Any]) -> str | None:
    stream = meta.get("stream")
    if stream is None:
        return None
    ok = (
        isinstance(stream, dict)
        and isinstance(stream.get("plan"), str)
        and all(_whole(stream.get(key), 0, _BIG) for key in ("epoch", "batch"))
        and _whole(stream.get("processes"), 1, MAX_PROCESSES)
        and isinstance(stream.get("readers"), list)
        and all(isinstance(r, list) and len(r) == 4 and all(_whole(v, 0, _BIG) for v in r) for r in stream["readers"])
    )
    return None if ok else f"stream is {_show(stream)}, not {{plan, epoch, batch, processes, readers: [[4 counts]]}}"
