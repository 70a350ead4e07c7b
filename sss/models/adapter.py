"""LoRA adapters (PEFT) on a built model: ``model.adapter``, injected in place, merged into plain weights for export.

``model.adapter: {type: lora, r: 8, alpha: 16, dropout: 0.0, target: [audio_encoder]}`` puts a LoRA
adapter on every ``Linear``, ``Conv1d`` and ``Conv2d`` layer at or under the modules a target names
(a dotted module name stands for that module and all under it; a glob with ``*``, ``?`` or ``[``
matches whole dotted names, e.g. ``audio_encoder.blocks.*.attn.qkv``). PEFT's
``inject_adapter_in_model`` replaces those layers inside the module itself, so the model keeps its
class and its training methods, and the trainer builds its optimizer from the parameters that
still require gradients.

What trains: the LoRA weights, and everything outside the targets as it was (a fusion block and a
fresh classification head must learn; another encoder is frozen or not by ``trainer.finetune.freeze``).
What is frozen: every other parameter under a target (the adapted layers' weights and biases, and the
norms beside them). Norm layers' running statistics still update in training mode, as in PEFT.
"""

from __future__ import annotations

import copy
import fnmatch
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sss.config import ConfigError
from sss.config.instantiate import adapter_problems

__all__ = [
    "LAYER_TYPES",
    "AdapterSummary",
    "adapted_layers",
    "apply_adapter",
    "merged_copy",
    "plain_export",
    "target_layers",
]

LAYER_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d)
"""The layers a LoRA adapter goes on."""
_GLOB = frozenset("*?[")


@dataclass
class AdapterSummary:
    """What `apply_adapter` did: the adapted layers and the parameter counts after it."""

    spec: dict[str, Any]
    layers: list[str] = field(default_factory=list)
    trainable: int = 0
    total: int = 0

    def line(self) -> str:
        """The line ``sss fit`` prints at build.

        Example:
            >>> AdapterSummary({"r": 4, "target": ["audio_encoder"]}, ["a", "b"], 10, 400).line()
            'sss: LoRA r=4 on 2 layers under audio_encoder; trainable parameters: 10 of 400 (2.50 %)'
        """
        where = ", ".join(_targets(self.spec))
        share = 100.0 * self.trainable / max(self.total, 1)
        return (
            f"sss: LoRA r={self.spec.get('r', 8)} on {len(self.layers)} layers under {where}; "
            f"trainable parameters: {self.trainable:,} of {self.total:,} ({share:.2f} %)"
        )


def apply_adapter(module: nn.Module, spec: dict[str, Any]) -> AdapterSummary:
    """Put the LoRA adapter of ``model.adapter`` `spec` on `module`, in place; freeze what it targets but the adapter.

    Raises `sss.config.ConfigError` (one line naming ``model.adapter.*``) for an unknown key or type, a
    target that matches no module or holds no Linear / Conv layer, a module that already has adapters,
    and an adapter that would leave every parameter trainable (espnet #6107: a LoRA that trains 100 %).

    Example:
        >>> from sss.testing import BoringModule
        >>> module = BoringModule()
        >>> print(apply_adapter(module, {"type": "lora", "r": 2, "target": ["audio_encoder"]}).line())
        sss: LoRA r=2 on 1 layers under audio_encoder; trainable parameters: ...
        >>> type(module).__name__, [n for n, p in module.named_parameters() if "audio" in n and p.requires_grad]
        ('BoringModule', ['audio_encoder.1.lora_A.default.weight', 'audio_encoder.1.lora_B.default.weight'])
    """
    problems = adapter_problems(spec)
    if problems:
        raise ConfigError("; ".join(problems))
    if adapted_layers(module):
        raise ConfigError(f"model.adapter: {type(module).__name__} already has LoRA adapters; apply model.adapter once")
    roots, layers = target_layers(module, _targets(spec))
    was = {name: p.requires_grad for name, p in module.named_parameters()}
    _inject(module, spec, layers)
    for name, p in module.named_parameters():
        inside = any(name.startswith(root + ".") for root in roots)
        p.requires_grad_(_is_lora(name) if inside else was.get(name, True))
    summary = AdapterSummary(dict(spec), layers)
    summary.total = sum(p.numel() for p in module.parameters())
    summary.trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    if summary.trainable >= summary.total:  # cannot happen by the rule above; PEFT's own default did (espnet #6107)
        raise ConfigError(f"model.adapter: every parameter of {type(module).__name__} stays trainable; nothing frozen")
    return summary


def target_layers(module: nn.Module, targets: list[str]) -> tuple[list[str], list[str]]:
    """The modules `targets` name (prefixes or globs) and the Linear / Conv layers at or under them.

    Raises `sss.config.ConfigError` naming a target that matches no module (with a few module names) or
    holds no such layer (with what it holds).

    Example:
        >>> from sss.testing import BoringModule
        >>> target_layers(BoringModule(), ["*_encoder"])
        (['image_encoder', 'audio_encoder'], ['image_encoder.1', 'audio_encoder.1'])
    """
    names = {name: child for name, child in module.named_modules() if name}
    roots: list[str] = []
    layers: list[str] = []
    for target in targets:
        found = [n for n in names if _matches(n, target)]
        if not found:
            raise ConfigError(_no_module(module, target, list(names)))
        under = [n for n, m in names.items() if isinstance(m, LAYER_TYPES) and any(_under(n, r) for r in found)]
        if not under:
            kinds = sorted({type(names[n]).__name__ for n in found for n in _subtree(names, n)})
            raise ConfigError(
                f"model.adapter.target: {target!r} holds no Linear, Conv1d or Conv2d layer (it holds "
                f"{', '.join(kinds[:8])}): LoRA adapts only those; name a module that has some"
            )
        roots += [r for r in found if r not in roots]
        layers += [n for n in under if n not in layers]
    return roots, layers


def adapted_layers(module: nn.Module) -> list[str]:
    """The names of `module`'s layers that carry a PEFT adapter (none without PEFT loaded).

    Example:
        >>> adapted_layers(nn.Linear(2, 2))
        []
    """
    import sys

    if "peft" not in sys.modules:  # nothing was adapted in this process: no need to import PEFT (seconds) to know
        return []
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [name for name, child in module.named_modules() if isinstance(child, BaseTunerLayer)]


def merged_copy(module: nn.Module, weights: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """A copy of `module` with its adapters merged into plain layers (the class it had before `apply_adapter`).

    `weights` (the module's own state dict names, adapters included: trained or EMA weights) are
    loaded into the copy first; `module` itself is left as it is. The copy's outputs equal the adapted
    module's up to float rounding, and its state dict has no ``lora_`` / ``base_layer`` keys.

    Example:
        >>> from sss.testing import BoringModule
        >>> module = BoringModule()
        >>> _ = apply_adapter(module, {"type": "lora", "r": 2, "target": ["audio_encoder"]})
        >>> [k for k in merged_copy(module).state_dict() if k.startswith("audio")]
        ['audio_encoder.1.weight', 'audio_encoder.1.bias']
    """
    plain = copy.deepcopy(module)
    if weights is not None:
        plain.load_state_dict(weights)
    for name in adapted_layers(plain):
        layer = plain.get_submodule(name)
        with torch.no_grad():
            layer.merge(safe_merge=True)  # safe: a NaN in the merged weights raises instead of being exported
        parent, _, child = name.rpartition(".")
        setattr(plain.get_submodule(parent) if parent else plain, child, layer.get_base_layer())
    for p in plain.parameters():
        p.requires_grad_(True)
    return plain


def plain_export(
    module: nn.Module, cfg: Any = None, weights: dict[str, torch.Tensor] | None = None, note: str | None = None
) -> tuple[nn.Module, Any, dict[str, torch.Tensor] | None, str | None]:
    """What the model folder of `module` holds: ``(module, config, weights, card note)``, adapters merged.

    For a module with adapters: `merged_copy` (with `weights`, the trained or EMA ones), the config
    (an `sss.config.SSSConfig`) without ``model.adapter`` (so that `sss.load_model` builds the plain
    model), the merged state dict, and `note` with what was merged. Any other module: as given.

    Example:
        >>> from sss.config import SSSConfig
        >>> from sss.testing import BoringModule
        >>> module = BoringModule()
        >>> _ = apply_adapter(module, {"type": "lora", "r": 2, "target": "audio_encoder"})
        >>> cfg = SSSConfig(model={"_target_": "sss.testing.BoringModule", "adapter": {"target": "audio_encoder"}})
        >>> plain, cfg, weights, note = plain_export(module, cfg)
        >>> cfg.model, any("lora" in k for k in weights), note
        ({'_target_': 'sss.testing.BoringModule'}, False, 'LoRA adapters (r=2 on audio_encoder) merged')
    """
    layers = adapted_layers(module)
    if not layers:
        return module, cfg, weights, note
    import dataclasses

    from sss.config.instantiate import split_model_spec

    plain = merged_copy(module, weights)
    spec = split_model_spec(cfg.model)[1] if cfg is not None else None
    r = next(iter(module.get_submodule(layers[0]).r.values()))
    where = ", ".join(_targets(spec or {})) or f"{len(layers)} layers"
    merged = f"LoRA adapters (r={r} on {where}) merged"
    if cfg is not None:
        cfg = dataclasses.replace(cfg, model=split_model_spec(cfg.model)[0])
    return plain, cfg, plain.state_dict(), f"{note}; {merged}" if note else merged


def _inject(module: nn.Module, spec: dict[str, Any], layers: list[str]) -> None:
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(
        r=int(spec.get("r", 8)),
        lora_alpha=float(spec.get("alpha", 16)),
        lora_dropout=float(spec.get("dropout", 0.0)),
        target_modules=layers,  # full names: exactly these layers, matched by PEFT as whole names
        bias="none",
    )
    inject_adapter_in_model(config, module)


def _targets(spec: dict[str, Any]) -> list[str]:
    target = spec.get("target") or []
    return [target] if isinstance(target, str) else list(target)


def _matches(name: str, target: str) -> bool:
    return fnmatch.fnmatchcase(name, target) if _GLOB & set(target) else name == target


def _under(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


def _subtree(names: dict[str, nn.Module], root: str) -> list[str]:
    return [n for n in names if _under(n, root)]


def _is_lora(name: str) -> bool:
    return ".lora_" in name


def _no_module(module: nn.Module, target: str, names: list[str]) -> str:
    import difflib

    tops = sorted({n.split(".")[0] for n in names})
    close = difflib.get_close_matches(target, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"model.adapter.target: {target!r} matches no module of {type(module).__name__}{hint}; its modules start "
        f"with {', '.join(tops[:8])} (e.g. {', '.join(names[:3])}); a name stands for that module and all under it, "
        "a glob (*, ?) must match whole dotted names"
    )
