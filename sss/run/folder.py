"""The run folder (``OUTPUT_DIR``): which one a run writes to, which checkpoint it resumes, what it keeps there.

The one owner of this policy, for ``sss fit`` (`sss.run.fit`), ``sss check`` / ``sss config``
(`planned_output_dir`) and ``sss fit --engine ray`` (`ray_output_dir`):

- claim (`claim_output_dir`): a fresh run never writes into an earlier run's folder nor into one a live
  run holds; the default ``runs/<name>`` moves on to ``runs/<name>_1``, ``_2``, ... (`holds_run`), an
  explicit ``trainer.output_dir`` that is taken is refused. The main process takes the folder's lock
  (`sss._lock`, ``.sss.lock``) for the whole run.
- resume (`resume_checkpoint`): ``--resume PATH``, ``--resume`` (latest), ``--resume auto`` and
  ``hub://OWNER/REPO``, verified once (`sss.checkpoint.verify_for_resume`); a finished run is refused.
- stored config and earlier results (`store_config`, `store_results`): ``config.yaml`` stays as the
  run first wrote it, ``results.json`` of an earlier end is kept beside the new one.

A refusal raises `sss.errors.RunFolderError` (``sss fit`` prints its one ``error:`` line, exit 1).
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

from sss._lock import FolderInUseError, folder_holder, lock_folder
from sss.checkpoint import (
    DamagedCheckpointError,
    VerifiedCheckpoint,
    complete_checkpoints,
    newest_resumable,
    recover_leftovers,
    verify_for_resume,
)
from sss.errors import RunFolderError
from sss.run.hub_resume import fetch_checkpoint, hub_source

__all__ = [
    "claim_output_dir",
    "holds_run",
    "json_safe",
    "planned_output_dir",
    "ray_output_dir",
    "resume_checkpoint",
    "store_config",
    "store_results",
]


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


def _numbered(cfg: Any, chosen: str) -> bool:
    # Only a folder load_config filled in is numbered on: a trainer.output_dir written as runs/<name> is the user's.
    return chosen == f"runs/{cfg.name}" if cfg.output_dir_given is None else not cfg.output_dir_given


def _first_free(chosen: str, default: str, runs: list[str]) -> str:
    # From `chosen` on, the first of default, default_1, ... that holds no run; each taken one goes into `runs`.
    while holds_run(Path(chosen)):
        runs.append(chosen)
        chosen = f"{default}_{len(runs)}"
    return chosen


def planned_output_dir(cfg: Any) -> tuple[str, str | None]:
    """The folder a fresh ``sss fit`` of `cfg` writes to, and the default folder it moved on from (or None).

    A given ``trainer.output_dir`` is used as it is; the default ``runs/<name>`` moves on to
    ``runs/<name>_1``, ``_2``, ... while the folder holds a run (results, checkpoints, or a live
    run's lock), as `claim_output_dir` decides when it claims the folder.

    Example:
        >>> from sss.config import load_config
        >>> planned_output_dir(load_config(None, ["name=nothing_here_yet"]))
        ('runs/nothing_here_yet', None)
    """
    chosen = cfg.trainer.output_dir
    if not _numbered(cfg, chosen) or not Path(chosen).exists():  # nothing to look at
        return chosen, None
    runs: list[str] = []
    free = _first_free(chosen, chosen, runs)
    return free, (chosen if runs else None)


def claim_output_dir(cfg: Any, resume: str | None, state: Any) -> tuple[str, contextlib.AbstractContextManager]:
    """The folder this run of `cfg` writes to, and its lock (released when the returned context ends).

    `resume` is None (a fresh run), ``"latest"``, ``"auto"`` or a checkpoint path; `state` is Accelerate's
    ``PartialState``: the main process decides and takes the lock, every process gets the same folder.
    An explicit ``trainer.output_dir`` is refused here when a live run holds it or it holds results (by
    the checkpoint callback when it holds checkpoints).

    Example:
        >>> import tempfile
        >>> from types import SimpleNamespace
        >>> from sss.config import load_config
        >>> cfg = load_config(None, [f"trainer.output_dir={tempfile.mkdtemp()}/run"])
        >>> folder, lock = claim_output_dir(cfg, None, SimpleNamespace(is_main_process=True, num_processes=1))
        >>> with lock:
        ...     folder == cfg.trainer.output_dir and holds_run(folder)
        True
    """
    chosen, default = cfg.trainer.output_dir, f"runs/{cfg.name}"
    numbered = _numbered(cfg, chosen)
    if not numbered and resume is None and (Path(chosen) / "results.json").exists():
        raise FileExistsError(
            f"trainer.output_dir {chosen} already holds a finished run (results.json): choose another folder, "
            "or leave trainer.output_dir unset for a fresh numbered runs/<name>_N"
        )
    outcome: list[Any] = [chosen, None]  # the folder, or why it cannot be had
    lock: contextlib.AbstractContextManager = contextlib.nullcontext()
    if state.is_main_process:
        try:
            outcome[0], lock = _claim(chosen, default, resume) if numbered else (chosen, lock_folder(chosen))
        except FolderInUseError as exc:
            outcome[1] = str(exc)
    _share(outcome, state)
    if outcome[1] is not None:
        raise FolderInUseError(outcome[1])
    return outcome[0], lock


def _share(values: list[Any], state: Any) -> None:
    # The main process's decision, in place, on every process of a launched run.
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(values)


def _claim(chosen: str, default: str, resume: str | None) -> tuple[str, contextlib.AbstractContextManager]:
    if resume not in (None, "latest", "auto") and chosen == default and Path(resume).parent.name == "checkpoints":
        chosen = str(Path(resume).parent.parent)  # resuming a given checkpoint continues its own run folder
    # auto (a requeued or restarted job) continues runs/<name> itself: moving on to runs/<name>_1 would start over
    if chosen != default or resume == "auto":
        return chosen, lock_folder(chosen)
    runs: list[str] = []
    for _ in range(1000):
        chosen = _first_free(chosen, default, runs)
        if resume == "latest":  # the newest versioned run that has checkpoints (refused if still running)
            chosen = next((r for r in reversed(runs) if complete_checkpoints(Path(r) / "checkpoints")), default)
            return chosen, lock_folder(chosen)
        with contextlib.suppress(FolderInUseError):  # another fresh run took it since we looked: the next one
            return chosen, lock_folder(chosen)
    raise FolderInUseError(f"{default}: no free numbered run folder after {len(runs)} tries")


def ray_output_dir(cfg: Any, resume: str | None) -> Path:
    """The folder a Ray run of `cfg` works in, decided once for all its attempts (each resumes it with ``auto``).

    `resume` None starts in a folder that holds no run, as a fresh ``sss fit`` picks it; ``"latest"`` takes
    the newest run folder with a complete checkpoint; ``"auto"`` the folder as it is. The workers claim it.

    Example:
        >>> from sss.config import load_config
        >>> ray_output_dir(load_config(None, ["name=nothing_here_yet"]), None)
        PosixPath('runs/nothing_here_yet')
    """
    chosen, default = cfg.trainer.output_dir or f"runs/{cfg.name}", f"runs/{cfg.name}"
    numbered = _numbered(cfg, chosen)
    if resume == "auto":
        return Path(chosen)
    runs: list[str] = []
    if numbered:
        chosen = _first_free(chosen, default, runs)
    if resume is None:
        if not numbered and holds_run(Path(chosen)):
            raise RunFolderError(
                f"trainer.output_dir {chosen} already holds a run (results, checkpoints or a live run's lock): "
                "continue it with --resume auto, or give this run another folder (trainer.output_dir)"
            )
        return Path(chosen)
    found = next((r for r in reversed(runs or [chosen]) if complete_checkpoints(Path(r) / "checkpoints")), None)
    if found is None:
        folder = Path(runs[-1] if runs else chosen) / "checkpoints"
        raise RunFolderError(f"--resume: no complete checkpoint in {folder}; train without --resume first")
    return Path(found)


def resume_checkpoint(cfg: Any, resume: str | None, state: Any) -> VerifiedCheckpoint | None:
    """The checkpoint this run of `cfg` resumes in its ``trainer.output_dir``, verified; None: a fresh start.

    A given path (or ``hub://OWNER/REPO[@REVISION]``, downloaded into OUTPUT_DIR/checkpoints) must verify
    (no silent fallback); ``"latest"`` falls back to the newest checkpoint that verifies and says which
    newer ones are damaged and why; ``"auto"`` does the same and starts fresh when there is no checkpoint
    at all. A resume that would train nothing of a run whose results exist is refused (`RunFolderError`).

    Example:
        >>> from sss.config import load_config
        >>> resume_checkpoint(load_config(None, []), None, None) is None
        True
    """
    if resume is None:
        return None
    out = Path(cfg.trainer.output_dir)
    found = _newest_or_fresh(out, resume, state) if resume in ("latest", "auto") else _given(out, resume, state)
    if found is not None:
        _refuse_finished_run(out, found, cfg)
    return found


def _given(out: Path, resume: str, state: Any) -> VerifiedCheckpoint:
    if hub_source(resume) is not None:  # downloaded and verified by the main process (sss/run/hub_resume.py)
        return verify_for_resume(fetch_checkpoint(resume, out, state))
    try:
        return verify_for_resume(resume)
    except DamagedCheckpointError as exc:
        raise RunFolderError(
            f"--resume {resume}: {exc}. Resume another checkpoint (--resume PATH), or the newest one "
            "that verifies (--resume without a path)"
        ) from None


def _newest_or_fresh(out: Path, resume: str, state: Any) -> VerifiedCheckpoint | None:
    # The main process, which holds the folder, cleans up what interrupted saves and rotations left and
    # decides for every process; the others verify the one it found themselves.
    folder, found = out / "checkpoints", [None, []]
    flag = "--resume" if resume == "latest" else "--resume auto"
    newest = None
    if state.is_main_process:
        for line in recover_leftovers(folder):
            print(f"sss: checkpoints: {line}", flush=True)
        newest, damaged = newest_resumable(folder)
        found = [None if newest is None else str(newest.path), damaged]
        for why in damaged:
            print(f"sss: warning: {flag}: skipping a damaged checkpoint: {why}", flush=True)
        if newest is not None and (damaged or resume == "auto"):
            print(f"sss: {flag}: using {newest.path}, the newest checkpoint that verifies", flush=True)
    _share(found, state)
    if found[0] is None and found[1]:
        raise RunFolderError(
            f"{flag}: no checkpoint in {folder} verifies (newest: {found[1][0]}); "
            "resume a checkpoint you have elsewhere (--resume PATH) or train without --resume"
        )
    if found[0] is None and resume == "auto":
        _refuse_fresh_over_results(out, folder)
        if state.is_main_process:
            print(f"sss: --resume auto: no checkpoint in {folder} yet; starting a fresh run", flush=True)
        return None
    if found[0] is None:
        raise RunFolderError(f"--resume: no complete checkpoint in {folder}; train without --resume first")
    return newest if newest is not None else verify_for_resume(found[0])


def _refuse_fresh_over_results(out: Path, folder: Path) -> None:
    # auto with no checkpoint starts fresh, unless the folder holds a finished run's results (a run
    # that kept no checkpoint): a fresh run would overwrite them.
    results = out / "results.json"
    if results.exists():
        raise RunFolderError(
            f"--resume auto: {out} holds a finished run ({results}) but no checkpoint in {folder} to "
            "continue from. Nothing was trained and no file was changed; give this run another folder "
            "(trainer.output_dir), or move that one away"
        )


def _refuse_finished_run(out: Path, ckpt: VerifiedCheckpoint, cfg: Any) -> None:
    # A resume that would train nothing (the checkpoint is at max_steps / max_epochs) of a run whose
    # results exist would only rewrite them from a zero-step segment: refused before anything is
    # built or written. Without results.json (killed after its last save) the resume finishes the run.
    results = out / "results.json"
    if not results.is_file():
        return
    meta, t, reached, longer = ckpt.meta, cfg.trainer, [], []
    if t.max_steps is not None and meta["global_step"] >= t.max_steps:
        reached.append(f"trainer.max_steps={t.max_steps} reached at step {meta['global_step']}")
        longer.append(f"trainer.max_steps={2 * max(t.max_steps, meta['global_step'])}")  # beyond the checkpoint
    if t.max_epochs is not None and meta["resume_epoch"] >= t.max_epochs:
        reached.append(f"trainer.max_epochs={t.max_epochs} completed")
        longer.append(f"trainer.max_epochs={2 * max(t.max_epochs, meta['resume_epoch'])}")
    if reached:
        raise RunFolderError(
            f"--resume: {out} is a finished run: {ckpt.path} is at its end ({'; '.join(reached)}) and {results} "
            "holds its results. Nothing was trained and no file was changed. To train longer, raise the limit "
            f"when resuming (it may grow): sss fit CONFIG {' '.join(longer)} --resume"
        )


def store_config(out: Path, text: str, ckpt: VerifiedCheckpoint | None) -> None:
    """Write the run's config (`text`, its YAML) as ``out/config.yaml``; a resume's own only where it differs.

    The first config of a run stays as written; a resume that changed neutral fields (more epochs,
    another log cadence) records its own next to it, ``config_resumed_<checkpoint>.yaml``.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()); store_config(out, "name: x\\n", None)
        >>> (out / "config.yaml").read_text()
        'name: x\\n'
    """
    first = out / "config.yaml"
    if ckpt is None or not first.exists():
        first.write_text(text)
    elif first.read_text() != text:
        (out / f"config_resumed_{ckpt.path.name}.yaml").write_text(text)


def store_results(out: Path, results: dict[str, Any], resumed: bool) -> Path:
    """Write `results` to ``out/results.json``; a resumed run first keeps the earlier end's file beside it.

    The earlier file becomes ``results_step_<its global_step>.json`` (``_1``, ``_2``, ... when taken).

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()); _ = store_results(out, {"global_step": 4}, resumed=False)
        >>> _ = store_results(out, {"global_step": 8}, resumed=True)
        sss: the results of the run's earlier end (step 4) are kept in .../results_step_0000004.json
        >>> sorted(p.name for p in out.iterdir())
        ['results.json', 'results_step_0000004.json']
    """
    path = out / "results.json"
    if resumed and path.is_file():
        _keep_earlier_results(path)
    # JSON has no NaN or Infinity: an undefined metric (mAUC without a positive) or d' of a perfect AUC is null.
    path.write_text(json.dumps(json_safe(results), indent=2))
    return path


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float (NaN, inf) as None, which JSON writes as null.

    Example:
        >>> json_safe({"mauc": float("nan"), "dprime": [float("inf"), 2.5]})
        {'mauc': None, 'dprime': [None, 2.5]}
    """
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def _keep_earlier_results(path: Path) -> None:
    # A resume that trains a finished run longer replaces its results; the earlier ones stay beside them.
    try:
        step = int(json.loads(path.read_text()).get("global_step", 0))
    except (ValueError, AttributeError):
        step = 0
    kept, n = path.with_name(f"results_step_{step:07d}.json"), 0
    while kept.exists():
        n += 1
        kept = path.with_name(f"results_step_{step:07d}_{n}.json")
    path.rename(kept)
    print(f"sss: the results of the run's earlier end (step {step}) are kept in {kept}", flush=True)
