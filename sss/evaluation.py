"""Evaluation with a modality ablation and a robustness report: fused, image only, audio only, the fusion gain,
and the metrics with each modality absent in a growing fraction of the samples.

`evaluate` runs a trainer's validation or test pass fused and with each modality absent
(`sss.data.presence.mark_absent`: its presence mask False and its input a zero placeholder);
`flat_results` names the figures (``val/accuracy_image_only``, ``val/fusion_gain_accuracy``);
`print_evaluation` shows them as tables. ``sss fit`` ends with it; ``sss validate`` and
``sss test`` are it on a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from sss.metrics.task import HEADLINE

__all__ = ["ABSENT", "LOWER_IS_BETTER", "ROBUSTNESS_RATES", "evaluate", "flat_results", "is_robustness_pass"]
__all__ += ["modality_keys", "print_evaluation", "print_robustness", "robustness_metric"]

LOWER_IS_BETTER = ("loss", "ber", "error", "_er")

ROBUSTNESS_RATES = (0.0, 0.25, 0.5, 1.0)
"""The fractions of samples a modality is absent from in the robustness report (0 and 1 must be among them)."""

ABSENT = "absent"
"""The robustness passes' metric prefixes: ``val_absent_0.0`` (nothing absent), ``val_absent_image_0.25``, ..."""

REPORTED = (*HEADLINE, "mauc", "dprime", "loss")
"""The metrics a robustness report keeps per rate, where present: the headline ones, mAUC with d′, the loss."""


def evaluate(
    trainer: Any,
    module: Any,
    datamodule: Any = None,
    *,
    split: str = "val",
    dataloaders: Any = None,
    ablation: bool = True,
    reuse_last: bool = False,
    missing: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Evaluate `module` on a split; with two modalities and `ablation`, also with each modality absent.

    "Image only" is the pass with the audio absent from every sample (`sss.data.presence.mark_absent`: its
    ``audio_present`` mask False, its input a zero placeholder; zeroed in a tuple batch), and the reverse;
    `flat_results` derives the fusion gain from them. Each modality's batch key is the module's `modality_keys`
    entry; a module naming fewer than both, or whose ``ablation`` is False, gets no ablation. The robustness report
    holds the metrics (`REPORTED`) with each modality absent from a seeded fraction of the samples, at each of
    `ROBUSTNESS_RATES` (those absent at 0.25 are absent at 0.5 too): rate 0 is one pass through the same path with
    nothing absent, rate 1 the ablation pass. `missing` (``{"image": 0.5}``) makes modalities absent in the fused
    pass only (``sss validate --missing``). With `reuse_last`, the fused figures are the trainer's latest pass over
    the split (the validation at the end of ``fit``). Afterwards ``trainer.state`` describes the fused pass.
    Returns ``{"split", "samples", "missing", "metrics", "ablation": {"image_only", "audio_only"}, "robustness":
    {"image": {"0.0": {...}, "0.25", "0.5", "1.0"}, "audio"}, "confusion_matrix"}``.

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule, boring_loader
        >>> trainer = SSSTrainer(mixed_precision="no", log={"progress": False, "trackers": []})
        sss: mixed precision no
        >>> result = evaluate(trainer, BoringModule(), dataloaders=boring_loader(n=10))
        >>> result["samples"], sorted(result["ablation"]), list(result["robustness"]["image"])
        (10, ['audio_only', 'image_only'], ['0.0', '0.25', '0.5', '1.0'])
    """
    run, state = (trainer.validate if split == "val" else trainer.test), trainer.state
    last = (dict(state.eval_metrics), state.eval_outputs) if reuse_last and state.eval_metrics else None
    result: dict[str, Any] = {"split": split, "missing": dict(missing or {}), "ablation": {}}
    keys = modality_keys(module)
    positional = any(isinstance(key, int) for key in keys.values())  # a tuple batch: no room for presence masks

    def one(prefix: str, **edit: Any) -> dict[str, float]:
        return _strip(run(module, datamodule, dataloaders=dataloaders, prefix=prefix, **edit), prefix)

    if ablation and getattr(module, "ablation", True) and _two_modalities(module, datamodule, keys):
        for kept, gone in (("image", "audio"), ("audio", "image")):
            edit = {"zero": keys[gone]} if positional else {"missing": {gone: 1.0}}
            result["ablation"][f"{kept}_only"] = one(f"{split}_{kept}_only", **edit)
        if not positional:  # a tuple batch's modality is zeroed for the ablation: no partial absence to report
            result["robustness"] = _robustness(one, split, result["ablation"])
    # The fused pass last, so that trainer.state (eval_outputs, eval_metrics) describes it afterwards.
    if last is not None and not missing:
        state.eval_metrics, state.eval_outputs = last
        fused = _strip(last[0], split)
    else:
        fused = one(split, missing=missing or None)
    outputs = state.eval_outputs
    samples = len(next(iter(outputs.values()))) if outputs else None  # per-sample values: any one counts
    result.update(samples=samples, metrics=fused, confusion_matrix=_confusion(outputs))
    order = ("split", "samples", "missing", "metrics", "ablation", "robustness", "confusion_matrix")
    return {key: result[key] for key in order if key in result and (key == "samples" or result[key] is not None)}


def _two_modalities(module: Any, datamodule: Any, keys: dict[str, Any]) -> bool:
    modalities = tuple(getattr(datamodule, "modalities", None) or getattr(module, "modalities", None) or keys)
    return len(modalities) == 2 and {"image", "audio"} <= set(keys)


def _robustness(one: Callable[..., dict[str, float]], split: str, alone: dict[str, Any]) -> dict[str, Any]:
    # Rate 0: one pass, shared by both modalities; rate 1: the ablation pass without the other modality.
    clean = _reported(one(f"{split}_{ABSENT}_0.0", missing={"image": 0.0, "audio": 0.0}))
    report: dict[str, dict[str, dict[str, float]]] = {}
    for modality, other in (("image", "audio"), ("audio", "image")):
        rows = report[modality] = {}
        for rate in ROBUSTNESS_RATES:
            if rate == 0.0:
                rows[str(rate)] = clean
            elif rate == 1.0:
                rows[str(rate)] = _reported(alone[f"{other}_only"])
            else:
                rows[str(rate)] = _reported(one(f"{split}_{ABSENT}_{modality}_{rate}", missing={modality: rate}))
    return report


def is_robustness_pass(prefix: str) -> bool:
    """Whether the metric prefix `prefix` is that of a robustness pass (``val_absent_image_0.25``).

    Example:
        >>> is_robustness_pass("val_absent_image_0.25"), is_robustness_pass("val_image_only")
        (True, False)
    """
    return prefix.partition("_")[2].startswith(f"{ABSENT}_")


def robustness_metric(report: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
    """The metric a robustness table and curve show: the first headline metric the report holds, else the loss.

    Example:
        >>> robustness_metric({"image": {"0.0": {"macro_f1": 0.7, "accuracy": 0.8, "loss": 0.5}}})
        'accuracy'
    """
    held = {name for rows in report.values() for row in rows.values() for name in row}
    return next((name for name in HEADLINE if name in held), "loss")


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
    """Rich tables: each metric fused, image only, audio only and the fusion gain (without an ablation: its value);
    then the robustness report."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    flat, split = flat_results(result), result["split"]
    alone = result.get("ablation", {})
    columns = ("metric", "fused", "image only", "audio only", "fusion gain") if alone else ("metric", "value")
    for column in columns:
        table.add_column(column, justify="left" if column == "metric" else "right", no_wrap=column == "metric")
    for key, value in result["metrics"].items():
        gain = flat.get(f"{split}/fusion_gain_{key}")
        row = [value, alone.get("image_only", {}).get(key), alone.get("audio_only", {}).get(key), gain]
        table.add_row(key, *(_cell(v) for v in row[: len(columns) - 1]))
    Console().print(table)
    if result.get("robustness"):
        print_robustness(result["robustness"], f"{split}: robustness, a modality absent from a fraction of the samples")


def print_robustness(report: Mapping[str, Mapping[str, Mapping[str, float]]], title: str) -> None:
    """A rich table of a robustness report: a row per rate, a column per modality absent, the `robustness_metric`.

    Example:
        >>> report = {"image": {"0.0": {"accuracy": 0.9}}, "audio": {"0.0": {"accuracy": 0.9}}}
        >>> print_robustness(report, "demo")  # doctest: +NORMALIZE_WHITESPACE
                            demo
        ┏━━━━━━━━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━┓
        ┃             ┃ image absent ┃ audio absent ┃
        ┃ rate absent ┃     accuracy ┃     accuracy ┃
        ┡━━━━━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━┩
        │ 0.0         │       0.9000 │       0.9000 │
        └─────────────┴──────────────┴──────────────┘
    """
    from rich.console import Console
    from rich.table import Table

    metric = robustness_metric(report)
    table = Table(title=title)
    table.add_column("rate absent")
    for modality in report:
        table.add_column(f"{modality} absent\n{metric}", justify="right")
    rates = list(next(iter(report.values()), {}))
    for rate in rates:
        table.add_row(rate, *(_cell(report[m].get(rate, {}).get(metric)) for m in report))
    Console().print(table)


def _confusion(outputs: dict[str, Any]) -> list[list[int]] | None:
    from sss.metrics import confusion_matrix

    if not ("preds" in outputs and "target" in outputs and "scores" in outputs):
        return None
    k = outputs["scores"].shape[-1]
    return confusion_matrix(outputs["preds"].cpu(), outputs["target"].cpu(), k).tolist()


def _reported(metrics: dict[str, float]) -> dict[str, float]:
    return {name: metrics[name] for name in REPORTED if name in metrics}


def _strip(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {key.removeprefix(f"{prefix}/"): value for key, value in metrics.items()}


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return "nan" if isinstance(value, float) and math.isnan(value) else f"{value:.4f}"
