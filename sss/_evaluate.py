"""Evaluation with a modality ablation, and what ``sss validate`` / ``sss test`` do around it."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from sss.metrics.task import HEADLINE

__all__ = ["check_output", "evaluate", "flat_results", "print_evaluation", "run_evaluate"]

LOWER_IS_BETTER = ("loss", "ber", "error", "_er")


def evaluate(
    trainer: Any,
    module: Any,
    datamodule: Any = None,
    *,
    split: str = "val",
    dataloaders: Any = None,
    ablation: bool = True,
    reuse_last: bool = False,
) -> dict[str, Any]:
    """Evaluate `module` on a split, then (with two modalities and `ablation`) with each modality zeroed.

    With `reuse_last`, the fused figures are those of the trainer's latest pass over the split (the
    validation at the end of ``fit``, with these weights), and only the ablation passes run.
    Afterwards ``trainer.state`` (``eval_metrics``, ``eval_outputs``) describes the fused pass.

    Returns ``{"split", "samples", "metrics", "ablation": {"image_only": ..., "audio_only": ...},
    "confusion_matrix"}``; metric names carry no prefix. "image only" means the audio was zeroed,
    and the reverse: what each modality achieves alone, from which `flat_results` derives the
    fusion gain.

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule, boring_loader
        >>> trainer = SSSTrainer(mixed_precision="no", log={"progress": False, "trackers": []})
        sss: mixed precision no
        >>> result = evaluate(trainer, BoringModule(), dataloaders=boring_loader(n=10))
        >>> result["samples"], sorted(result["ablation"])
        (10, ['audio_only', 'image_only'])
    """
    run = trainer.validate if split == "val" else trainer.test
    state = trainer.state
    last = (dict(state.eval_metrics), state.eval_outputs) if reuse_last and state.eval_metrics else None
    result: dict[str, Any] = {"split": split, "ablation": {}}
    modalities = tuple(getattr(datamodule, "modalities", None) or getattr(module, "modalities", ("image", "audio")))
    if ablation and len(modalities) == 2:
        for kept, zeroed in (("image", "audio"), ("audio", "image")):
            prefix = f"{split}_{kept}_only"
            result["ablation"][f"{kept}_only"] = _strip(
                run(module, datamodule, dataloaders=dataloaders, prefix=prefix, zero=zeroed), prefix
            )
    # The fused pass last, so that trainer.state (eval_outputs, eval_metrics) describes it afterwards.
    if last is not None:
        fused, outputs = last
        state.eval_metrics, state.eval_outputs = last
    else:
        fused = run(module, datamodule, dataloaders=dataloaders, prefix=split)
        outputs = state.eval_outputs
    result.update(samples=len(outputs["loss"]) if "loss" in outputs else None, metrics=_strip(fused, split))
    if "preds" in outputs and "target" in outputs and "scores" in outputs:
        from sss.metrics import confusion_matrix

        k = outputs["scores"].shape[-1]
        result["confusion_matrix"] = confusion_matrix(outputs["preds"].cpu(), outputs["target"].cpu(), k).tolist()
    order = ("split", "samples", "metrics", "ablation", "confusion_matrix")
    return {key: result[key] for key in order if key in result}


def flat_results(result: dict[str, Any]) -> dict[str, float]:
    """``{split}/{metric}`` for every fused metric, plus per-modality values and the fusion gain of the headline ones.

    The fusion gain is the fused value's improvement over the better single modality (positive is
    better, also for metrics where lower is better, such as the error rate).

    Example:
        >>> r = {"split": "val", "metrics": {"accuracy": 0.9}, "ablation": {"image_only": {"accuracy": 0.5},
        ...      "audio_only": {"accuracy": 0.6}}}
        >>> for key, value in flat_results(r).items():
        ...     print(key, round(value, 4))
        val/accuracy 0.9
        val/accuracy_image_only 0.5
        val/accuracy_audio_only 0.6
        val/fusion_gain_accuracy 0.3
    """
    split, fused = result["split"], result["metrics"]
    flat = {f"{split}/{key}": value for key, value in fused.items()}
    alone = result.get("ablation", {})
    for name in HEADLINE:
        singles = [alone[m][name] for m in ("image_only", "audio_only") if name in alone.get(m, {})]
        if name not in fused or len(singles) != 2:
            continue
        flat[f"{split}/{name}_image_only"], flat[f"{split}/{name}_audio_only"] = singles
        # An undefined single-modality value (e.g. event F1 with no events detected) is not the better one.
        defined = [v for v in singles if not math.isnan(v)]
        lower = name.endswith(LOWER_IS_BETTER)
        best = (min(defined) if lower else max(defined)) if defined else math.nan
        flat[f"{split}/fusion_gain_{name}"] = (best - fused[name]) if lower else (fused[name] - best)
    return flat


def print_evaluation(result: dict[str, Any], title: str) -> None:
    """A rich table: each metric fused, image only, audio only, and the fusion gain of the headline ones."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("metric", "fused", "image only", "audio only", "fusion gain"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    flat, split = flat_results(result), result["split"]
    alone = result.get("ablation", {})
    for key, value in result["metrics"].items():
        gain = flat.get(f"{split}/fusion_gain_{key}")
        row = [value, alone.get("image_only", {}).get(key), alone.get("audio_only", {}).get(key), gain]
        table.add_row(key, *(_cell(v) for v in row))
    Console().print(table)


def run_evaluate(cfg: Any, ckpt: str, split: str, output: str | None, ablation: bool = True) -> dict[str, Any]:
    """``sss validate|test CONFIG --ckpt PATH``: evaluate a checkpoint or model folder, print, write metrics.json."""
    from accelerate import PartialState

    from sss._export import load_trained_weights
    from sss._run import _sizes_from_data
    from sss.config import instantiate
    from sss.trainer.trainer import SSSTrainer, use_cpu

    state = PartialState(cpu=use_cpu(cfg.trainer.cpu))
    path = _output_path(cfg, ckpt, split, output) if state.is_main_process else None
    datamodule = instantiate(cfg.data)
    if hasattr(datamodule, "setup"):
        datamodule.setup("fit")  # classes and modalities, as at training time
    cfg.model = {**cfg.model, **_sizes_from_data(cfg.model, datamodule)}
    module = instantiate(cfg.model)
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


def _strip(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {key.removeprefix(f"{prefix}/"): value for key, value in metrics.items()}


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return "nan" if isinstance(value, float) and math.isnan(value) else f"{value:.4f}"


def _json_safe(value: Any) -> Any:
    # JSON has no NaN: an undefined metric (e.g. event F1 of a model that detects nothing) is null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value
