"""``sss fit``: build the parts, pick the output folder, train, evaluate per modality, export, report."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sss import __version__
from sss.callbacks.base import Callback
from sss.callbacks.checkpoint import ModelCheckpoint
from sss.callbacks.ema import exported_weights
from sss.callbacks.hub import HubPush
from sss.callbacks.plots import Plots
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import (
    DamagedCheckpointError,
    FolderInUseError,
    complete_checkpoints,
    holds_run,
    lock_folder,
    newest_verified,
    recover_leftovers,
    resize_history,
    verify_checkpoint,
)
from sss.config import SSSConfig, instantiate, to_yaml
from sss.errors import HubPushError
from sss.evaluation import evaluate, flat_results, print_evaluation
from sss.model_folder import export_model
from sss.run.hub_resume import fetch_checkpoint, hub_source
from sss.run.parts import build_parts, process_state
from sss.trainer.trainer import EvaluationStopped, SSSTrainer

__all__ = ["run_fit"]


def run_fit(cfg: SSSConfig, resume: str | None = None, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Train the run described by `cfg`; return (and write to OUTPUT_DIR/results.json) its results.

    `resume` is ``"latest"`` (the newest checkpoint in OUTPUT_DIR that verifies), ``"auto"`` (the same,
    or a fresh start when OUTPUT_DIR holds no checkpoint) or a checkpoint path; None takes
    ``trainer.resume`` (``never``: a fresh run). The main process holds OUTPUT_DIR's lock
    (``.sss.lock``) for the whole run. `callbacks` run after the config's own (an engine's: Ray's metric reports).
    """
    wall_start = time.perf_counter()
    resume = cfg.trainer.resume if resume is None else resume  # the --resume flag, when given, wins over the key
    resume = None if resume == "never" else resume
    state = process_state(cfg)  # after every process of a launched run met the others (trainer.rendezvous_timeout)
    cfg.trainer.output_dir, lock = _output_dir(cfg, resume, state)
    with lock:
        return _fit_holding_the_folder(cfg, resume, state, wall_start, callbacks)


def _fit_holding_the_folder(
    cfg: SSSConfig, resume: str | None, state: Any, wall_start: float, extra: Sequence[Callback] = ()
) -> dict[str, Any]:
    ckpt = _resume_path(Path(cfg.trainer.output_dir), resume, state)
    if ckpt is not None:
        _refuse_finished_run(Path(cfg.trainer.output_dir), ckpt, cfg)
    parts = build_parts(cfg)
    datamodule, module = parts.datamodule, parts.module
    if parts.from_data and state.is_main_process:
        print("sss: model settings from the data: " + ", ".join(f"model.{k}={v}" for k, v in parts.from_data.items()))
    # First at FIT_END: the callbacks after it (a Hub push, plots) see the per-modality figures.
    final = _FinalEvaluation(datamodule)
    callbacks = [final, *(instantiate(spec) for spec in cfg.callbacks), *extra]
    trainer = add_stock_callbacks(SSSTrainer(cfg.trainer, callbacks=callbacks, run_config=dataclasses.asdict(cfg)))
    out = trainer.output_dir
    if state.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        _write_config(out, cfg, ckpt)
        print(f"sss: run {cfg.name!r} -> {out}" + (f" (resuming {ckpt})" if ckpt else ""), flush=True)
    push_failed = _fit(trainer, module, datamodule, ckpt)
    results: dict[str, Any] = dict(trainer.state.metrics)
    evaluation = final.result
    record = _run_record(trainer, final, ckpt)  # what ran, in this process and since step 0; the model card's too
    model_dir = out / "model"
    # On every process: under FSDP / ZeRO-3 this gathers the shards; keys are the trainer wrapper's "module.<name>"
    full = trainer.accelerator.get_state_dict(trainer.model)
    if state.is_main_process:
        weights, note = exported_weights(trainer, full)  # the EMA average with EMA(export=True)
        card = {**results, **record}
        export_model(module, cfg, card, model_dir, datamodule, state_dict=weights, weights_source=note)
    results.update(wall_seconds=round(time.perf_counter() - wall_start, 2), **record)
    results.update(checkpoint_dir=trainer.state.last_checkpoint, model_dir=str(model_dir))
    plots = next((c.files for c in trainer.callbacks if isinstance(c, Plots)), [])
    results.update({f"plot/{p.stem}": str(p) for p in plots})  # one row each in the summary table
    if state.is_main_process:
        _keep_earlier_results(out / "results.json", ckpt)
        (out / "results.json").write_text(json.dumps(results, indent=2))
        if evaluation is not None:
            print_evaluation(evaluation, f"sss fit {cfg.name}: validation, fused and per modality")
        shown = {k: v for k, v in results.items() if evaluation is None or not k.startswith("val/")}
        _print_results(cfg.name, shown, out / "results.json")
    state.wait_for_everyone()
    state.destroy_process_group()  # a clean exit for launched processes (a no-op for one process)
    if push_failed is not None:
        raise push_failed
    return results


def _fit(trainer: SSSTrainer, module: Any, datamodule: Any, ckpt: Path | None) -> HubPushError | None:
    # A Hub push that failed at FIT_END failed after a finished run: its results are still exported,
    # written and shown, and the failure (naming the folders left to upload) ends the command after.
    try:
        trainer.fit(module, datamodule, ckpt_path=ckpt)
    except RuntimeError as exc:
        failed_pushes = any(isinstance(c, HubPush) and c.errors for c in trainer.callbacks)
        if not (failed_pushes and str(exc).startswith("HubPush:")):
            raise
        out, message = trainer.output_dir, " ".join(str(exc).split())  # one line: the Hub's replies span several
        return HubPushError(f"{message} The run itself finished: {out / 'results.json'} and {out / 'model'} exist.")
    return None


def _refuse_finished_run(out: Path, ckpt: Path, cfg: SSSConfig) -> None:
    # A resume that would train nothing (the checkpoint is at max_steps / max_epochs) of a run whose
    # results exist would only rewrite them from a zero-step segment: refused before anything is
    # built or written. Without results.json (killed after its last save) the resume finishes the run.
    results = out / "results.json"
    if not results.is_file():
        return
    meta = json.loads((ckpt / "trainer_state.json").read_text())
    t, reached, longer = cfg.trainer, [], []
    if t.max_steps is not None and meta["global_step"] >= t.max_steps:
        reached.append(f"trainer.max_steps={t.max_steps} reached at step {meta['global_step']}")
        longer.append(f"trainer.max_steps={2 * max(t.max_steps, meta['global_step'])}")  # beyond the checkpoint
    if t.max_epochs is not None and meta["resume_epoch"] >= t.max_epochs:
        reached.append(f"trainer.max_epochs={t.max_epochs} completed")
        longer.append(f"trainer.max_epochs={2 * max(t.max_epochs, meta['resume_epoch'])}")
    if reached:
        raise SystemExit(
            f"error: --resume: {out} is a finished run: {ckpt} is at its end ({'; '.join(reached)}) and {results} "
            "holds its results. Nothing was trained and no file was changed. To train longer, raise the limit "
            f"when resuming (it may grow): sss fit CONFIG {' '.join(longer)} --resume"
        )


def _run_record(trainer: SSSTrainer, final: _FinalEvaluation, ckpt: Path | None) -> dict[str, Any]:
    # Segment figures are this process's own (a resumed run counts from its checkpoint), totals run
    # from step 0; train_samples_per_second is null when the segment trained nothing.
    state, seconds = trainer.state, final.segment_seconds
    samples = state.samples - final.start_samples
    # The changes of process count since step 0 (trainer.resume_resize): the newest checkpoint of this segment
    # records them (the resumed one may be rotated away by now); without one, the resumed checkpoint tells.
    resized, last = [], Path(state.last_checkpoint) if state.last_checkpoint else None
    if ckpt is not None and last is not None and last != ckpt:
        resized = json.loads((last / "trainer_state.json").read_text()).get("resized_from", [])
    elif ckpt is not None:
        saved = json.loads((ckpt / "trainer_state.json").read_text())
        resized = resize_history(saved, trainer.accelerator.num_processes)
    # The epoch the run stopped in, when max_steps (or a callback) ended it before the epoch's end: how far it got.
    if final.epoch_ended is not None:
        epoch, batch_idx = final.epoch_ended
        into = batch_idx + 1 if epoch == state.epoch else 0
    else:  # no epoch ran in this segment: where the checkpoint left it
        into = json.loads((ckpt / "trainer_state.json").read_text())["resume_batch"] if ckpt is not None else 0
    record: dict[str, Any] = {
        "segment_seconds": round(seconds, 2),
        "segment_samples": samples,
        "segment_steps": state.global_step - final.start_step,
        "train_samples_per_second": round(samples / max(seconds, 1e-9), 1) if samples else None,
        "train_seconds_total": round(final.seconds_before + seconds, 2),
        "samples_total": state.samples,
        "global_step": state.global_step,
        "epochs_completed": state.epoch,
        "batches_into_epoch": into,
        "skipped_steps": state.skipped_steps,
        "mixed_precision": trainer.accelerator.mixed_precision,
        "num_processes": trainer.accelerator.num_processes,
        "resumed_from": None if ckpt is None else str(ckpt),
        "resized_from": resized or None,  # [{num_processes, global_step}] of each change; null: never changed
        "sss_version": __version__,
    }
    commit = _code_commit()
    if commit is not None:
        record["git_commit"] = commit
    record["finished_at"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return record


def _code_commit() -> str | None:
    # The commit of the sss source that ran, with "-dirty" when its tracked files differ from it; None
    # where sss is not a git checkout (an installed wheel; also a venv inside someone's repository,
    # where the package files are untracked).
    folder = Path(__file__).resolve().parents[1]

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)

    try:
        if git("ls-files", "--error-unmatch", "__init__.py").returncode != 0:
            return None
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("diff", "--quiet", "HEAD", "--", ".").returncode == 1
    except (OSError, subprocess.SubprocessError):  # no git on this machine, or it hung
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def _keep_earlier_results(path: Path, ckpt: Path | None) -> None:
    # A resume that trains a finished run longer replaces its results; the earlier ones stay beside them.
    if ckpt is None or not path.is_file():
        return
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


def _write_config(out: Path, cfg: SSSConfig, ckpt: Path | None) -> None:
    # The first config of a run stays as written; a resume that changed neutral fields (more
    # epochs, another log cadence) records its own next to it.
    text, first = to_yaml(cfg), out / "config.yaml"
    if ckpt is None or not first.exists():
        first.write_text(text)
    elif first.read_text() != text:
        (out / f"config_resumed_{ckpt.name}.yaml").write_text(text)


def _output_dir(cfg: SSSConfig, resume: str | None, state: Any) -> tuple[str, contextlib.AbstractContextManager]:
    # A fresh run never writes into an earlier run's folder nor into one a live run holds: the
    # default runs/<name> moves on to runs/<name>_1, _2, ...; an explicit trainer.output_dir that is
    # taken is refused (here when a live run holds it or it holds results, by the checkpoint
    # callback when it holds checkpoints). The main process decides and takes the folder's lock
    # (released when the returned context ends), so that every process agrees.
    from accelerate.utils import broadcast_object_list

    chosen, default = cfg.trainer.output_dir, f"runs/{cfg.name}"
    # Only a folder load_config filled in is numbered on: a trainer.output_dir written as runs/<name> is the user's.
    numbered = chosen == default if cfg.output_dir_given is None else not cfg.output_dir_given
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
    if state.num_processes > 1:
        broadcast_object_list(outcome)
    if outcome[1] is not None:
        raise FolderInUseError(outcome[1])
    return outcome[0], lock


def _claim(chosen: str, default: str, resume: str | None) -> tuple[str, contextlib.AbstractContextManager]:
    if resume not in (None, "latest", "auto") and chosen == default and Path(resume).parent.name == "checkpoints":
        chosen = str(Path(resume).parent.parent)  # resuming a given checkpoint continues its own run folder
    # auto (a requeued or restarted job) continues runs/<name> itself: moving on to runs/<name>_1 would start over
    if chosen != default or resume == "auto":
        return chosen, lock_folder(chosen)
    n, runs = 0, []
    for _ in range(1000):
        while holds_run(Path(chosen)):
            runs.append(chosen)
            n += 1
            chosen = f"{default}_{n}"
        if resume == "latest":  # the newest versioned run that has checkpoints (refused if still running)
            chosen = next((r for r in reversed(runs) if complete_checkpoints(Path(r) / "checkpoints")), default)
            return chosen, lock_folder(chosen)
        with contextlib.suppress(FolderInUseError):  # another fresh run took it since we looked: the next one
            return chosen, lock_folder(chosen)
    raise FolderInUseError(f"{default}: no free numbered run folder after {n} tries")


def _resume_path(out: Path, resume: str | None, state: Any) -> Path | None:
    # The checkpoint to resume, verified first. A given path (or hub://OWNER/REPO[@REVISION], downloaded
    # into OUTPUT_DIR/checkpoints) must verify (no silent fallback);
    # "latest" falls back to the newest checkpoint that verifies and says which newer ones are
    # damaged and why; "auto" does the same and starts fresh when there is no checkpoint at all.
    # The main process, which holds the folder, cleans up what interrupted saves and rotations
    # left and decides for every process.
    from accelerate.utils import broadcast_object_list

    if resume is None:
        return None
    if hub_source(resume) is not None:  # downloaded and verified by the main process (sss/run/hub_resume.py)
        return fetch_checkpoint(resume, out, state)
    if resume not in ("latest", "auto"):
        try:
            verify_checkpoint(resume, resume=True)
        except DamagedCheckpointError as exc:
            raise SystemExit(
                f"error: --resume {resume}: {exc}. Resume another checkpoint (--resume PATH), or the newest one "
                "that verifies (--resume without a path)"
            ) from None
        return Path(resume)
    folder, found = out / "checkpoints", [None, []]
    flag = "--resume" if resume == "latest" else "--resume auto"
    if state.is_main_process:
        for line in recover_leftovers(folder):
            print(f"sss: checkpoints: {line}", flush=True)
        newest, damaged = newest_verified(folder)
        found = [None if newest is None else str(newest), damaged]
        for why in damaged:
            print(f"sss: warning: {flag}: skipping a damaged checkpoint: {why}", flush=True)
        if newest is not None and (damaged or resume == "auto"):
            print(f"sss: {flag}: using {newest}, the newest checkpoint that verifies", flush=True)
    if state.num_processes > 1:
        broadcast_object_list(found)
    if found[0] is None and found[1]:
        raise SystemExit(
            f"error: {flag}: no checkpoint in {folder} verifies (newest: {found[1][0]}); "
            "resume a checkpoint you have elsewhere (--resume PATH) or train without --resume"
        )
    if found[0] is None and resume == "auto":
        _refuse_fresh_over_results(out, folder)
        if state.is_main_process:
            print(f"sss: --resume auto: no checkpoint in {folder} yet; starting a fresh run", flush=True)
        return None
    if found[0] is None:
        raise SystemExit(f"error: --resume: no complete checkpoint in {folder}; train without --resume first")
    return Path(found[0])


def _refuse_fresh_over_results(out: Path, folder: Path) -> None:
    # auto with no checkpoint starts fresh, unless the folder holds a finished run's results (a run
    # that kept no checkpoint): a fresh run would overwrite them.
    results = out / "results.json"
    if results.exists():
        raise SystemExit(
            f"error: --resume auto: {out} holds a finished run ({results}) but no checkpoint in {folder} to "
            "continue from. Nothing was trained and no file was changed; give this run another folder "
            "(trainer.output_dir), or move that one away"
        )


class _FinalEvaluation(Callback):
    """At FIT_END, the validation split once more, fused and with each modality zeroed, into ``state.metrics``.

    It also times this process's training (FIT_START to FIT_END: the loop with its validations and
    saves, not the set-up, the final evaluation or the export) and carries the training seconds of
    the segments before it in the checkpoints (`state_dict`).
    """

    def __init__(self, datamodule: Any) -> None:
        self.datamodule, self.result = datamodule, None
        self.start, self.end, self.start_samples, self.start_step = 0.0, 0.0, 0, 0
        self.seconds_before = 0.0  # training seconds of the earlier segments, from the resumed checkpoint
        self.epoch_ended: tuple[int, int] | None = None  # (epoch, batch_idx) at this segment's latest EPOCH_END

    @property
    def segment_seconds(self) -> float:
        return (self.end or time.perf_counter()) - self.start

    def state_dict(self) -> dict[str, Any]:
        return {"train_seconds": self.seconds_before + self.segment_seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seconds_before = float(state.get("train_seconds", 0.0))

    def on_fit_start(self, trainer: SSSTrainer, module: Any) -> None:
        # After load_checkpoint: a resumed segment counts from its checkpoint's samples and step.
        self.start, self.end = time.perf_counter(), 0.0
        self.start_samples, self.start_step = trainer.state.samples, trainer.state.global_step

    def on_epoch_end(self, trainer: SSSTrainer, module: Any) -> None:
        # The trainer counts the epoch (state.epoch + 1) after this event only if its loader ran out.
        self.epoch_ended = (trainer.state.epoch, trainer.state.batch_idx)

    def on_fit_end(self, trainer: SSSTrainer, module: Any) -> None:
        self.end = time.perf_counter()
        # No validation in this segment, but the run validated before (its checkpoint's metrics): a
        # resume at the run's end that only finishes it (its results were never written) evaluates afresh.
        reuse = bool(trainer.state.eval_metrics)
        validated = any(k.startswith("val/") for k in trainer.state.metrics)
        if not hasattr(self.datamodule, "val_dataloader") or not (reuse or validated):
            return
        try:
            self.result = evaluate(trainer, module, self.datamodule, split="val", reuse_last=reuse)
        except EvaluationStopped:  # a signal: the checkpoint it promised, then stop; no more passes, no export
            saver = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)
            if saver is None:
                raise
            trainer.stop.during = "the final evaluation"
            saver.save_and_stop(trainer, replace=False)
        # The ablation passes' full metric sets stay in self.result; the run's metrics (results.json,
        # model card, Hub push) get the per-modality headline figures and the fusion gain.
        ablated = {k for k in trainer.state.metrics if k.startswith(("val_image_only/", "val_audio_only/"))}
        for key in ablated:
            del trainer.state.metrics[key]
        trainer.state.metrics.update(flat_results(self.result))


def _print_results(name: str, results: dict[str, Any], path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sss fit {name}: results")
    table.add_column("key")
    table.add_column("value", justify="right")
    for key, value in results.items():  # metrics to 4 decimals; the run's own figures as results.json has them
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) and "/" in key else str(value))
    console = Console()
    console.print(table)
    console.print(f"written to {path}")
