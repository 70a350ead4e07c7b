"""``sss fit``: build the parts, pick the output folder, train, evaluate per modality, export, report."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from sss.callbacks.base import Callback
from sss.callbacks.plots import Plots
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import MARKER, complete_checkpoints
from sss.config import SSSConfig, instantiate, to_yaml
from sss.evaluation import evaluate, flat_results, print_evaluation
from sss.model_folder import export_model
from sss.run.parts import build_parts
from sss.trainer.trainer import SSSTrainer, use_cpu

__all__ = ["run_fit"]


def run_fit(cfg: SSSConfig, resume: str | None = None) -> dict[str, Any]:
    """Train the run described by `cfg`; return (and write to OUTPUT_DIR/results.json) its results.

    `resume` is ``"latest"`` (newest complete checkpoint in OUTPUT_DIR) or a checkpoint path.
    """
    from accelerate import PartialState

    wall_start = time.perf_counter()
    state = PartialState(cpu=use_cpu(cfg.trainer.cpu))
    cfg.trainer.output_dir = _output_dir(cfg, resume, state)
    ckpt = _resume_path(Path(cfg.trainer.output_dir), resume)
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
    trainer.fit(module, datamodule, ckpt_path=ckpt)
    fit_seconds = time.perf_counter() - fit_start - final.seconds
    results: dict[str, Any] = dict(trainer.state.metrics)
    evaluation = final.result
    model_dir = out / "model"
    if state.is_main_process:
        export_model(module, cfg, results, model_dir, datamodule)
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
    return results


def _write_config(out: Path, cfg: SSSConfig, ckpt: Path | None) -> None:
    # The first config of a run stays as written; a resume that changed neutral fields (more
    # epochs, another log cadence) records its own next to it.
    text, first = to_yaml(cfg), out / "config.yaml"
    if ckpt is None or not first.exists():
        first.write_text(text)
    elif first.read_text() != text:
        (out / f"config_resumed_{ckpt.name}.yaml").write_text(text)


def _output_dir(cfg: SSSConfig, resume: str | None, state: Any) -> str:
    # A fresh run never writes into an earlier run's folder: the default runs/<name> moves on to
    # runs/<name>_1, _2, ...; an explicit trainer.output_dir that is taken is refused by the
    # checkpoint callback. The main process decides so that every process agrees.
    from accelerate.utils import broadcast_object_list

    chosen = [cfg.trainer.output_dir]
    default = f"runs/{cfg.name}"
    if chosen[0] != default and resume is None and (Path(chosen[0]) / "results.json").exists():
        raise FileExistsError(
            f"trainer.output_dir {chosen[0]} already holds a finished run (results.json): choose another folder, "
            "or leave trainer.output_dir unset for a fresh numbered runs/<name>_N"
        )
    if resume not in (None, "latest") and chosen[0] == default and Path(resume).parent.name == "checkpoints":
        return str(Path(resume).parent.parent)  # resuming a given checkpoint continues its own run folder
    if state.is_main_process and chosen[0] == default:
        n, runs = 0, []
        while _holds_run(Path(chosen[0])):
            runs.append(chosen[0])
            n += 1
            chosen[0] = f"{default}_{n}"
        if resume == "latest":  # the newest versioned run that has checkpoints
            chosen[0] = next((r for r in reversed(runs) if complete_checkpoints(Path(r) / "checkpoints")), default)
    if state.num_processes > 1:
        broadcast_object_list(chosen)
    return chosen[0]


def _holds_run(folder: Path) -> bool:
    return (folder / "results.json").exists() or bool(complete_checkpoints(folder / "checkpoints"))


def _resume_path(out: Path, resume: str | None) -> Path | None:
    if resume is None:
        return None
    if resume != "latest":
        path = Path(resume)
        if not (path / MARKER).is_file():
            raise SystemExit(f"error: --resume {resume}: not a complete sss checkpoint folder (no {MARKER})")
        return path
    found = complete_checkpoints(out / "checkpoints")
    if not found:
        raise SystemExit(
            f"error: --resume: no complete checkpoint in {out / 'checkpoints'}; train without --resume first"
        )
    return found[-1]


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
