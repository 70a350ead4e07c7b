"""``sss fit``: build the parts, pick the output folder, train, evaluate per modality, export, report.

The report ends with the robustness table (the headline metric with each modality absent from 0, 25, 50
and 100 % of the validation samples), written to results.json as ``robustness`` and drawn as
``plots/robustness.png``.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sss import __version__
from sss.callbacks.base import Callback
from sss.callbacks.checkpoint import ModelCheckpoint
from sss.callbacks.export import export_run_model
from sss.callbacks.hub import HubPush
from sss.callbacks.plots import Plots
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import VerifiedCheckpoint, read_marker, resize_history
from sss.config import SSSConfig, instantiate, to_yaml
from sss.errors import HubPushError
from sss.evaluation import evaluate, flat_results, is_robustness_pass, print_evaluation
from sss.run.folder import claim_output_dir, resume_checkpoint, store_config, store_results
from sss.run.parts import build_parts, process_state
from sss.trainer.trainer import EvaluationStopped, SSSTrainer

__all__ = ["run_fit"]


def run_fit(
    cfg: SSSConfig, resume: str | None = None, callbacks: Sequence[Callback] = (), command: str = "fit"
) -> dict[str, Any]:
    """Train the run described by `cfg`; return (and write to OUTPUT_DIR/results.json) its results.

    `resume` is ``"latest"`` (the newest checkpoint in OUTPUT_DIR that verifies), ``"auto"`` (the same,
    or a fresh start when OUTPUT_DIR holds no checkpoint) or a checkpoint path; None takes
    ``trainer.resume`` (``never``: a fresh run). The main process holds OUTPUT_DIR's lock
    (``.sss.lock``) for the whole run. `callbacks` run after the config's own (an engine's: Ray's metric reports).
    The folder and the checkpoint are `sss.run.folder`'s choice; a refusal there (nothing to resume, a
    finished run, a damaged checkpoint given by path) raises `sss.errors.RunFolderError`. `command` names the
    run in the printed tables (``sss pretrain`` runs this same function).
    """
    wall_start = time.perf_counter()
    resume = cfg.trainer.resume if resume is None else resume  # the --resume flag, when given, wins over the key
    resume = None if resume == "never" else resume
    state = process_state(cfg)  # after every process of a launched run met the others (trainer.rendezvous_timeout)
    cfg.trainer.output_dir, lock = claim_output_dir(cfg, resume, state)
    with lock:
        return _fit_holding_the_folder(cfg, resume, state, wall_start, callbacks, command)


def _fit_holding_the_folder(
    cfg: SSSConfig, resume: str | None, state: Any, wall_start: float, extra: Sequence[Callback], command: str
) -> dict[str, Any]:
    ckpt = resume_checkpoint(cfg, resume, state)
    parts = build_parts(cfg, init_from=ckpt is None)  # a resume continues from its checkpoint's weights
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
        store_config(out, to_yaml(cfg), ckpt)
        print(f"sss: run {cfg.name!r} -> {out}" + (f" (resuming {ckpt.path})" if ckpt else ""), flush=True)
    push_failed = _fit(trainer, module, datamodule, ckpt)
    results: dict[str, Any] = dict(trainer.state.metrics)
    evaluation = final.result
    record = _run_record(trainer, final, ckpt)  # what ran, in this process and since step 0; the model card's too
    model_dir = out / "model"
    export_run_model(trainer, module, model_dir, {**results, **record}, cfg)  # every process: it gathers shards
    results.update(wall_seconds=round(time.perf_counter() - wall_start, 2), **record)
    results.update(checkpoint_dir=trainer.state.last_checkpoint, model_dir=str(model_dir))
    plots = next((c.files for c in trainer.callbacks if isinstance(c, Plots)), [])
    results.update({f"plot/{p.stem}": str(p) for p in plots})  # one row each in the summary table
    if evaluation is not None and evaluation.get("robustness"):
        results["robustness"] = evaluation["robustness"]  # {modality: {rate: {metric: value}}}: its own table
    if state.is_main_process:
        store_results(out, results, resumed=ckpt is not None)
        if evaluation is not None:  # with the robustness table after it
            what = "fused and per modality" if evaluation.get("ablation") else "at the end"
            print_evaluation(evaluation, f"sss {command} {cfg.name}: validation, {what}")
        hidden = ("val/", "robustness") if evaluation is not None else ("robustness",)
        shown = {k: v for k, v in results.items() if not k.startswith(hidden)}
        _print_results(f"sss {command} {cfg.name}", shown, out / "results.json")
        if command == "pretrain":  # the folder may be runs/<name>_N: a rerun never overwrites an earlier one
            print(f"sss: fine-tune from it: sss fit CONFIG model.init_from={out}", flush=True)
    state.wait_for_everyone()
    state.destroy_process_group()  # a clean exit for launched processes (a no-op for one process)
    if push_failed is not None:
        raise push_failed
    return results


def _fit(trainer: SSSTrainer, module: Any, datamodule: Any, ckpt: VerifiedCheckpoint | None) -> HubPushError | None:
    # A Hub push that failed at FIT_END failed after a finished run: its results are still exported,
    # written and shown, and the failure (naming the folders left to upload) ends the command after.
    try:
        trainer.fit(module, datamodule, ckpt_path=ckpt)  # verified already: the trainer's load checks no file again
    except HubPushError as exc:
        if not any(isinstance(c, HubPush) and c.errors for c in trainer.callbacks):  # not a push at FIT_END
            raise
        out, message = trainer.output_dir, " ".join(str(exc).split())  # one line: the Hub's replies span several
        return HubPushError(f"{message} The run itself finished: {out / 'results.json'} and {out / 'model'} exist.")
    return None


def _run_record(trainer: SSSTrainer, final: _FinalEvaluation, ckpt: VerifiedCheckpoint | None) -> dict[str, Any]:
    # Segment figures are this process's own (a resumed run counts from its checkpoint), totals run
    # from step 0; train_samples_per_second is null when the segment trained nothing.
    state, seconds = trainer.state, final.segment_seconds
    samples = state.samples - final.start_samples
    # The changes of process count since step 0 (trainer.resume_resize): the newest checkpoint of this segment
    # records them (the resumed one may be rotated away by now); without one, the resumed checkpoint tells.
    resized, last = [], Path(state.last_checkpoint) if state.last_checkpoint else None
    if ckpt is not None and last is not None and last != ckpt.path:
        resized = read_marker(last).get("resized_from", [])
    elif ckpt is not None:
        resized = resize_history(ckpt.meta, trainer.accelerator.num_processes)
    # The epoch the run stopped in, when max_steps (or a callback) ended it before the epoch's end: how far it got.
    if final.epoch_ended is not None:
        epoch, batch_idx = final.epoch_ended
        into = batch_idx + 1 if epoch == state.epoch else 0
    else:  # no epoch ran in this segment: where the checkpoint left it
        into = ckpt.meta["resume_batch"] if ckpt is not None else 0
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
        "resumed_from": None if ckpt is None else str(ckpt.path),
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


class _FinalEvaluation(Callback):
    """At FIT_END, the validation split once more, fused, with each modality absent, and the robustness passes.

    The per-modality headline figures go into ``state.metrics``; the robustness report to `Plots` (its curve).

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
        # The ablation and robustness passes' full metric sets stay in self.result; the run's metrics (results.json,
        # model card, Hub push) get the per-modality headline figures and the fusion gain.
        ablated = {"val_image_only", "val_audio_only"}
        passes = {k for k in trainer.state.metrics if k.split("/")[0] in ablated or is_robustness_pass(k.split("/")[0])}
        for key in passes:
            del trainer.state.metrics[key]
        trainer.state.metrics.update(flat_results(self.result))
        for plots in (c for c in trainer.callbacks if isinstance(c, Plots)):
            plots.robustness = self.result.get("robustness")  # drawn at its FIT_END, after this one's


def _print_results(title: str, results: dict[str, Any], path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{title}: results")
    table.add_column("key")
    table.add_column("value", justify="right")
    for key, value in results.items():  # metrics to 4 decimals; the run's own figures as results.json has them
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) and "/" in key else str(value))
    console = Console()
    console.print(table)
    console.print(f"written to {path}")
