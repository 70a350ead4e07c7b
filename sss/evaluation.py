"""Evaluation with a modality ablation: fused, image only, audio only, and the fusion gain.

`evaluate` runs a trainer's validation or test pass fused and with each modality zeroed;
`flat_results` names the figures (``val/accuracy_image_only``, ``val/fusion_gain_accuracy``);
`print_evaluation` shows them as one table. ``sss fit`` ends with it; ``sss validate`` and
``sss test`` are it on a checkpoint.
"""

from __future__ import annotations

import math
from typing import Any

from sss.metrics.task import HEADLINE

__all__ = ["LOWER_IS_BETTER", "evaluate", "flat_results", "modality_keys", "print_evaluation"]

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
    fusion gain. The batch key zeroed for each modality is the module's `modality_keys` entry
    (``LitModule.modality_keys``; ``image`` and ``audio`` by default); a module that names fewer
    than both gets no ablation.

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
    keys = modality_keys(module)
    modalities = tuple(getattr(datamodule, "modalities", None) or getattr(module, "modalities", None) or keys)
    if ablation and len(modalities) == 2 and {"image", "audio"} <= set(keys):
        for kept, zeroed in (("image", "audio"), ("audio", "image")):
            prefix = f"{split}_{kept}_only"
            result["ablation"][f"{kept}_only"] = _strip(
                run(module, datamodule, dataloaders=dataloaders, prefix=prefix, zero=keys[zeroed]), prefix
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


def modality_keys(module: Any) -> dict[str, str]:
    """The batch key of each modality of `module`: its ``modality_keys``, else ``image`` and ``audio``.

    Example:
        >>> from sss.testing import BoringModule
        >>> modality_keys(BoringModule()), modality_keys(object())
        ({'image': 'image', 'audio': 'audio'}, {'image': 'image', 'audio': 'audio'})
    """
    return dict(getattr(module, "modality_keys", {"image": "image", "audio": "audio"}))


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


def _strip(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {key.removeprefix(f"{prefix}/"): value for key, value in metrics.items()}


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return "nan" if isinstance(value, float) and math.isnan(value) else f"{value:.4f}"
