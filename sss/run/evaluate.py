"""``sss validate`` / ``sss test``: evaluate a checkpoint or model folder, print the table, write a JSON file."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from sss.evaluation import evaluate, print_evaluation
from sss.model_folder import load_trained_weights
from sss.run.parts import build_parts
from sss.trainer.trainer import SSSTrainer

__all__ = ["check_output", "run_evaluate"]


def run_evaluate(cfg: Any, ckpt: str, split: str, output: str | None, ablation: bool = True) -> dict[str, Any]:
    """``sss validate|test CONFIG --ckpt PATH``: evaluate a checkpoint or model folder, print, write metrics.json."""
    parts = build_parts(cfg)  # classes and modalities, as at training time
    state, datamodule, module = parts.state, parts.datamodule, parts.module
    path = _output_path(cfg, ckpt, split, output) if state.is_main_process else None
    load_trained_weights(module, ckpt, "Evaluate with the config and overrides it was trained with.")
    quiet = dataclasses.replace(  # the whole split, whatever the training run limited
        cfg.trainer,
        limit_val_batches=None,
        fast_dev_run=0,
        overfit_batches=0,
        log=dataclasses.replace(cfg.trainer.log, progress=False, trackers=[]),
        checkpoint=dataclasses.replace(cfg.trainer.checkpoint, every_epoch=False, every_n_steps=None),
    )
    trainer = SSSTrainer(quiet)
    result = evaluate(trainer, module, datamodule, split=split, ablation=ablation)
    result = {"checkpoint": str(ckpt), "config": cfg.name, **result}
    if state.is_main_process:
        print_evaluation(result, f"sss {'validate' if split == 'val' else 'test'} {cfg.name}: {ckpt}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_json_safe(result), indent=2))
        print(f"written to {path}")
    state.wait_for_everyone()
    return result


def _output_path(cfg: Any, ckpt: str, split: str, output: str | None) -> Path:
    # An explicit --output that exists is refused; the default, in the run folder the checkpoint
    # or model folder belongs to, never overwrites an earlier file.
    if output is not None:
        check_output(output)
        return Path(output)
    ckpt_path = Path(ckpt)
    if ckpt_path.parent.name == "checkpoints":
        run = ckpt_path.parent.parent
    elif (ckpt_path.parent / "results.json").is_file():
        run = ckpt_path.parent  # OUTPUT_DIR/model
    else:
        run = Path(cfg.trainer.output_dir)
    name, n = f"{split}_{ckpt_path.name}", 0
    path = run / "eval" / f"{name}.json"
    while path.exists():
        n += 1
        path = run / "eval" / f"{name}_{n}.json"
    return path


def check_output(output: str) -> None:
    """Refuse an existing ``--output`` file (checked before any process starts)."""
    if Path(output).exists():
        raise FileExistsError(f"--output {output} already exists; choose another path or remove it")


def _json_safe(value: Any) -> Any:
    # JSON has no NaN: an undefined metric (e.g. event F1 of a model that detects nothing) is null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value
