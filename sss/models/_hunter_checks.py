"""What `HunterModule` refuses in its settings, checked without building anything (``sss check``, fit start)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from sss.models.audio.hf import hf_setting_problems
from sss.models.audio.panns import panns_setting_problems
from sss.models.registry import fusion_class, list_encoders, list_fusions

__all__ = ["CHECKPOINTS", "LOSS_KEYS", "MIN_SAMPLE_RATE", "setting_problems"]

CHECKPOINTS = ("backbone", "stages")
"""Names accepted by ``HunterModule(image_checkpointing=...)``."""

LOSS_KEYS = ("label", "labels", "events", "mask", "image_head", "audio_head")
"""The losses `HunterModule.compute_loss` knows (the batch targets, the unimodal heads'): ``loss_weights``'s keys."""

MIN_SAMPLE_RATE = 100
"""The lowest ``sample_rate`` the audio front-end takes: its hop is ``sample_rate // 100`` samples (10 ms) and its
mel filters start at 50 Hz, which must lie below the Nyquist frequency."""


def setting_problems(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`HunterModule.setting_problems`, in the order the constructor has always checked them.

    Example:
        >>> setting_problems({"dim": 30, "heads": 4})
        [('dim', 'dim=30 must be divisible by heads=4 (model.dim / model.heads)')]
    """
    get, problems = settings.get, []
    fusions, audio_encoders = tuple(list_fusions()), tuple(list_encoders("audio"))
    for key, choices in (("fusion", fusions), ("audio_encoder", audio_encoders), ("image_checkpointing", CHECKPOINTS)):
        if key in settings and settings[key] not in choices:
            problems.append((key, _unknown_choice(key, settings[key], choices)))
    dim, heads, rate = get("dim", 128), get("heads", 4), get("sample_rate", 16000)
    if dim < 1 or heads < 1:  # a zero-width model builds, and trains to exit 0
        key = "dim" if dim < 1 else "heads"
        problems.append((key, f"dim={dim} and heads={heads} must both be >= 1 (model.{key})"))
    elif dim % heads:
        problems.append(("dim", f"dim={dim} must be divisible by heads={heads} (model.dim / model.heads)"))
    if rate < MIN_SAMPLE_RATE:
        why = "its hop is sample_rate // 100 samples, its lowest mel filter 50 Hz"
        problems.append(
            (
                "sample_rate",
                f"sample_rate={rate} Hz is below {MIN_SAMPLE_RATE} Hz, the least the audio "
                f"front-end takes ({why}): give the audio's rate, e.g. 16000 (model.sample_rate)",
            )
        )
    problems += _dropout_problems(get("modality_dropout", 0.0))
    modalities, fusion = list(get("modalities", ("image", "audio"))), get("fusion", "cross_attention")
    if not set(modalities) or set(modalities) - {"image", "audio"}:
        problems.append(("modalities", f"modalities={modalities} must be a non-empty subset of ['image', 'audio']"))
    elif len(set(modalities)) == 1 and (fusion not in fusions or fusion_class(fusion).needs_both_modalities):
        alone = " or ".join(f"model.fusion={name}" for name in fusions if not fusion_class(name).needs_both_modalities)
        why = f"fuses two modalities; with modalities={modalities} use {alone}"
        problems.append(("fusion", f"fusion={fusion!r} {why}"))
    unknown = sorted(set(get("loss_weights") or {}) - set(LOSS_KEYS))
    if unknown:
        problems.append(
            ("loss_weights", f"unknown loss_weights key(s) {unknown}; the targets are {', '.join(LOSS_KEYS)}")
        )
    # The pretrained encoders' own rules: their front-end is bound to the weights (hf reads DIR's JSON files only).
    return problems + hf_setting_problems(settings) + panns_setting_problems(settings)


def _dropout_problems(value: Any) -> list[tuple[str, str]]:
    # A number is the rate of each modality (at most 0.5: never both), a mapping one rate per modality.
    why = "one draw per sample marks its image absent with p, else its audio with q, never both: p + q <= 1"
    if not isinstance(value, Mapping):
        if 0.0 <= value <= 0.5:
            return []
        return [
            ("modality_dropout", f"modality_dropout={value} must be in [0, 0.5] ({why}), or {{image: p, audio: q}}")
        ]
    unknown = sorted(set(value) - {"image", "audio"})
    if unknown:
        return [("modality_dropout", f"modality_dropout has unknown key(s) {unknown}; the keys are image and audio")]
    rates = {key: value[key] for key in value}
    bad = [key for key, rate in rates.items() if not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0]
    if bad:
        return [("modality_dropout", f"modality_dropout.{bad[0]}={rates[bad[0]]} must be a rate in [0, 1]")]
    if sum(rates.values()) > 1.0:
        return [("modality_dropout", f"modality_dropout={dict(rates)} sums to over 1: {why}")]
    return []


def _unknown_choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(value), choices, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {key.replace('_', ' ')} {value!r}{hint}; choose one of {', '.join(choices)} (model.{key})"
