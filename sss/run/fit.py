"""``sss fit``: build the parts, pick the output folder, train, evaluate per modality, export, report."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from sss.callbacks.base import Callback
from sss.callbacks.hub import HubPush
from sss.callbacks.plots import Plots
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import (
    DamagedCheckpointError,
    FolderInUseError,
    complete_checkpoints,
    folder_holder,
    lock_folder,
    newest_verified,
    recover_leftovers,
    verify_checkpoint,
)
from sss.config import SSSConfig, instantiate, to_yaml
from sss.errors import HubPushError
from sss.evaluation import evaluate, flat_results, print_evaluation
from sss.model_folder import export_model
from sss.run.parts import build_parts
from sss.trainer.trainer import SSSTrainer, use_cpu

__all__ = ["run_fit"]


def run_fit(cfg: SSSConfig, resume: str | None = None) -> dict[str, Any]:
    """Train the run described by `cfg`; return (and write to OUTPUT_DIR/results.json) its results.

    `resume` is ``"latest"`` (the newest checkpoint in OUTPUT_DIR that verifies) or a checkpoint
    path. The main process holds OUTPUT_DIR's lock (``.sss.lock``) for the whole run.
    """
    from accelerate import PartialState

    wall_start = time.perf_counter()
    state = PartialState(cpu=use_cpu(cfg.trainer.cpu))
    cfg.trainer.output_dir, lock = _output_dir(cfg, resume, state)
    with lock:
        return _fit_holding_the_folder(cfg, resume, state, wall_start)


def _fit_holding_the_folder(cfg: SSSConfig, resume: str | None, state: Any, wall_start: float) -> dict[str, Any]:
    ckpt = _resume_path(Path(cfg.trainer.output_dir), resume, state)
    parts = build_parts(cfg)
    datamodule, module = parts.datamodule, parts.module
    if parts.from_data and state.is_main_process:
        print("sss: model settings from the data: " + ", ".join(f"model.{k}={v}" for k, v in parts.from_data.items()))
    # First at FIT_END: the callbacks after it (a Hub push, plots) see the per-modality figures.
    final = _FinalEvaluation(datamodule)
    callbacks = [final, *(instantiate(spec) for spec in cfg.callbacks)]
    trainer = add_stock_callbacks(SSSTrainer(cfg.trainer, callbacks=callbacks, run_config=dataclasses.asdict(cfg)))
    out = trainer.output_dir
    if state.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        _write_config(out, cfg, ckpt)
        print(f"sss: run {cfg.name!r} -> {out}" + (f" (resuming {ckpt})" if ckpt else ""), flush=True)
    fit_start = time.perf_counter()
    push_failed = _fit(trainer, module, datamodule, ckpt)
    fit_seconds = time.perf_counter() - fit_start - final.seconds
    results: dict[str, Any] = dict(trainer.state.metrics)
    evaluation = final.result
    model_dir = out / "model"
    # On every process: under FSDP / ZeRO-3 this gathers the shards; keys are the trainer wrapper's "module.<name>"
    full = trainer.accelerator.get_state_dict(trainer.model)
    if state.is_main_process:
        weights = {k.removeprefix("module."): v for k, v in full.items()}
        export_model(module, cfg, results, model_dir, datamodule, state_dict=weights)
    results.update(
        wall_seconds=round(time.perf_counter() - wall_start, 2),
        train_samples_per_second=round(trainer.state.samples / max(fit_seconds, 1e-9), 1),
        global_step=trainer.state.global_step,
        skipped_steps=trainer.state.skipped_steps,
        checkpoint_dir=trainer.state.last_checkpoint,
        model_dir=str(model_dir),
    )
    plots = next((c.files for c in trainer.callbacks if isinstance(c, Plots)), [])
    results.update({f"plot/{p.stem}": str(p) for p in plots})  # one row each in the summary table
    if state.is_main_process:
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
    if chosen != default and resume is None and (Path(chosen) / "results.json").exists():
        raise FileExistsError(
            f"trainer.output_dir {chosen} already holds a finished run (results.json): choose another folder, "
            "or leave trainer.output_dir unset for a fresh numbered runs/<name>_N"
        )
    outcome: list[Any] = [chosen, None]  # the folder, or why it cannot be had
    lock: contextlib.AbstractContextManager = contextlib.nullcontext()
    if state.is_main_process:
        try:
            outcome[0], lock = _claim(chosen, default, resume)
        except FolderInUseError as exc:
            outcome[1] = str(exc)
    if state.num_processes > 1:
        broadcast_object_list(outcome)
    if outcome[1] is not None:
        raise FolderInUseError(outcome[1])
    return outcome[0], lock


def _claim(chosen: str, default: str, resume: str | None) -> tuple[str, contextlib.AbstractContextManager]:
    if resume not in (None, "latest") and chosen == default and Path(resume).parent.name == "checkpoints":
        chosen = str(Path(resume).parent.parent)  # resuming a given checkpoint continues its own run folder
    if chosen != default:
        return chosen, lock_folder(chosen)
    n, runs = 0, []
    for _ in range(1000):
        while _holds_run(Path(chosen)):
            runs.append(chosen)
            n += 1
            chosen = f"{default}_{n}"
        if resume == "latest":  # the newest versioned run that has checkpoints (refused if still running)
            chosen = next((r for r in reversed(runs) if complete_checkpoints(Path(r) / "checkpoints")), default)
            return chosen, lock_folder(chosen)
        with contextlib.suppress(FolderInUseError):  # another fresh run took it since we looked: the next one
            return chosen, lock_folder(chosen)
    raise FolderInUseError(f"{default}: no free numbered run folder after {n} tries")


def _holds_run(folder: Path) -> bool:
    return (
        (folder / "results.json").exists()
        or bool(complete_checkpoints(folder / "checkpoints"))
        or folder_holder(folder) is not None
        or folder_holder(folder / "checkpoints") is not None  # a Python fit's checkpoint callback
    )


def _resume_path(out: Path, resume: str | None, state: Any) -> Path | None:
    # The checkpoint to resume, verified first. A given path must verify (no silent fallback);
    # "latest" falls back to the newest checkpoint that verifies and says which newer ones are
    # damaged and why. The main process, which holds the folder, cleans up what interrupted saves
    # and rotations left and decides for every process.
    from accelerate.utils import broadcast_object_list

    if resume is None:
        return None
    if resume != "latest":
        try:
            verify_checkpoint(resume)
        except DamagedCheckpointError as exc:
            raise SystemExit(
                f"error: --resume {resume}: {exc}. Resume another checkpoint (--resume PATH), or the newest one "
                "that verifies (--resume without a path)"
            ) from None
        return Path(resume)
    folder, found = out / "checkpoints", [None, []]
    if state.is_main_process:
        for line in recover_leftovers(folder):
            print(f"sss: checkpoints: {line}", flush=True)
        newest, damaged = newest_verified(folder)
        found = [None if newest is None else str(newest), damaged]
        for why in damaged:
            print(f"sss: warning: --resume: skipping a damaged checkpoint: {why}", flush=True)
        if newest is not None and damaged:
            print(f"sss: --resume: using {newest}, the newest checkpoint that verifies", flush=True)
    if state.num_processes > 1:
        broadcast_object_list(found)
    if found[0] is None and found[1]:
        raise SystemExit(
            f"error: --resume: no checkpoint in {folder} verifies (newest: {found[1][0]}); "
            "resume a checkpoint you have elsewhere (--resume PATH) or train without --resume"
        )
    if found[0] is None:
        raise SystemExit(f"error: --resume: no complete checkpoint in {folder}; train without --resume first")
    return Path(found[0])


class _FinalEvaluation(Callback):
    """At FIT_END, the validation split once more, fused and with each modality zeroed, into ``state.metrics``."""

    def __init__(self, datamodule: Any) -> None:
        self.datamodule, self.result, self.seconds = datamodule, None, 0.0

    def on_fit_end(self, trainer: SSSTrainer, module: Any) -> None:
        if not hasattr(self.datamodule, "val_dataloader") or not trainer.state.eval_metrics:
            return
        start = time.perf_counter()
        self.result = evaluate(trainer, module, self.datamodule, split="val", reuse_last=True)
        # The ablation passes' full metric sets stay in self.result; the run's metrics (results.json,
        # model card, Hub push) get the per-modality headline figures and the fusion gain.
        ablated = {k for k in trainer.state.metrics if k.startswith(("val_image_only/", "val_audio_only/"))}
        for key in ablated:
            del trainer.state.metrics[key]
        trainer.state.metrics.update(flat_results(self.result))
        self.seconds = time.perf_counter() - start


def _print_results(name: str, results: dict[str, Any], path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sss fit {name}: results")
    table.add_column("key")
    table.add_column("value", justify="right")
    for key, value in results.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console = Console()
    console.print(table)
    console.print(f"written to {path}")
