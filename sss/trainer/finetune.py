"""Fine-tuning controls: ``trainer.finetune`` (what is frozen, and from which step it trains) and the layer-wise
learning rates of ``trainer.optim.layer_decay`` / ``head_lr_scale``.

Frozen parameters are kept out of the optimizer (no AdamW state, no weight decay) in param groups that are
built empty with their final settings, so a scheduler's per-group base LR is fixed at construction as for
any other group; `Finetuning.release` fills them at the start of the window of step ``unfreeze_at_step``.
Whether they are released is a function of the step: a resume applies it before the optimizer state loads
(a backbone is never re-frozen by a resume: Lightning #21901). Layer decay is set as each group's ``lr``,
so every scheduler applies it (timm #2532: its ``lr_scale`` is read by timm's schedulers only).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from sss.config import ConfigError, FinetuneConfig, OptimConfig

__all__ = ["Finetuning", "depth_map", "lr_scales", "matches", "rewrap"]

_BLOCK = re.compile(r"(?:^|\.)(?:blocks|layers|layer|stages)\.(\d+)(?:\.|$)")
"""A block index in a parameter name: sss ``blocks.N``, Hugging Face ``encoder.layer.N`` / ``layers.N``."""


def _candidates(name: str) -> tuple[str, ...]:
    # An encoder wraps its library model in one attribute (TimmImageEncoder.model): a pattern written as the
    # library prints its names ("image_encoder.blocks.0*") matches the name without that segment too.
    parts = name.split(".")
    if len(parts) > 2 and parts[0].endswith("_encoder"):
        return name, ".".join([parts[0], *parts[2:]])
    return (name,)


def matches(pattern: str, name: str) -> bool:
    """Whether a ``trainer.finetune.freeze`` `pattern` covers the parameter or module `name`.

    A pattern matches a name equal to it, a name it is a module prefix of (``audio_encoder`` covers
    ``audio_encoder.*``) or a name it matches as a glob (`fnmatch`, case-sensitive). For names under an
    ``*_encoder``, the name without its second segment (the encoder's wrapped model) is tried too.

    Example:
        >>> matches("audio_encoder", "audio_encoder.blocks.0.conv1.weight")
        True
        >>> matches("image_encoder.blocks.0*", "image_encoder.model.blocks.0.attn.qkv.weight")
        True
        >>> matches("audio_enc", "audio_encoder.proj.weight")
        False
    """
    return any(
        c == pattern or c.startswith(pattern + ".") or fnmatch.fnmatchcase(c, pattern) for c in _candidates(name)
    )


def _resolve(module: nn.Module, patterns: list[str]) -> list[str]:
    """The trainable parameter names `patterns` cover; a pattern that covers none is an error naming it."""
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    for pattern in patterns:
        if not any(matches(pattern, n) for n in names):
            tops = ", ".join(sorted({n.split(".")[0] for n in names}))
            raise ConfigError(
                f"trainer.finetune.freeze: {pattern!r} matches no trainable parameter of {type(module).__name__}; "
                f"its parameters start with {tops} (e.g. {', '.join(names[:3])}): write a module prefix such as "
                "audio_encoder, or a glob over the names such as 'image_encoder.blocks.0*'"
            )
    frozen = [n for n in names if any(matches(p, n) for p in patterns)]
    if len(frozen) == len(names):
        raise ConfigError(
            f"trainer.finetune.freeze: {patterns} covers every trainable parameter of {type(module).__name__}, "
            "so no step would train anything: leave the fusion and heads out of it"
        )
    return frozen


class Finetuning:
    """The ``trainer.finetune`` plan of one fit: which parameters are held out of training, and their groups.

    Example:
        >>> from sss.config import FinetuneConfig
        >>> from sss.testing import BoringModule
        >>> plan = Finetuning(BoringModule(), FinetuneConfig(freeze=["audio_encoder"], unfreeze_at_step=2))
        >>> plan.frozen, plan.due(1), plan.due(2)
        (['audio_encoder.1.weight', 'audio_encoder.1.bias'], False, True)
    """

    def __init__(
        self,
        module: nn.Module | None = None,
        config: FinetuneConfig | None = None,
        fsdp: dict[str, Any] | None = None,
        deepspeed: Any = None,
    ) -> None:
        self.config = config = config or FinetuneConfig()
        self.frozen: list[str] = _resolve(module, config.freeze) if module is not None and config.freeze else []
        if self.frozen and fsdp is not None and fsdp.get("fsdp_version", 2) == 1:
            # FSDP1 flattens a wrapped unit's parameters into one tensor with one requires_grad; FSDP2 shards each one
            raise ConfigError(
                "trainer.finetune.freeze needs FSDP2 under trainer.fsdp: FSDP1 cannot shard frozen and trainable "
                "parameters together; set trainer.fsdp.fsdp_version=2 (the default)"
            )
        if self.frozen and deepspeed:
            raise ConfigError(
                "trainer.finetune.freeze is not supported under trainer.deepspeed (its engine builds the optimizer "
                "once, so the held-out parameters could not join it): use trainer.fsdp (FSDP2) or DDP"
            )
        self.held: list[tuple[int, list[str]]] = []
        """(optimizer group index, parameter names) of the groups `release` fills."""
        self.released = not self.frozen
        self._hooks: list[Any] = []

    def due(self, step: int) -> bool:
        """Whether the held parameters join training at the window that starts at optimizer step `step`."""
        at = self.config.unfreeze_at_step
        return not self.released and at is not None and step >= at

    def hold_out(self, module: nn.Module, groups: list[dict[str, Any]], base_lr: float) -> list[dict[str, Any]]:
        """`groups` with the frozen parameters moved to empty groups of their own, appended; freezes them.

        A held group keeps its source group's settings with ``lr * unfrozen_lr_scale``. Frozen parameters get
        ``requires_grad=False``; BatchNorm layers wholly inside frozen parts stay in eval mode unless ``train_bn``.
        """
        names = {id(p): n for n, p in module.named_parameters()}
        frozen, kept, held = set(self.frozen), [], []
        for group in groups:
            mine = [p for p in group["params"] if names[id(p)] in frozen]
            rest = [p for p in group["params"] if names[id(p)] not in frozen]
            if rest:
                kept.append({**group, "params": rest})
            if mine:
                lr = group.get("lr", base_lr) * self.config.unfrozen_lr_scale
                name = f"{group['name']}.frozen" if group.get("name") else "frozen"
                held.append(({**group, "params": [], "lr": lr, "name": name}, [names[id(p)] for p in mine]))
        self.held = [(len(kept) + i, hold) for i, (_, hold) in enumerate(held)]
        for name, p in module.named_parameters():
            if name in frozen:
                p.requires_grad_(False)
        if not self.config.train_bn:
            norms = _frozen_norms(module, frozen, self.config.freeze)
            self._hooks = [(bn, bn.register_forward_pre_hook(_eval_mode)) for bn in norms]
        return kept + [group for group, _ in held]

    def release(self, optimizer: torch.optim.Optimizer, module: nn.Module) -> None:
        """Put the held parameters into their groups and make them trainable (the unfreeze)."""
        params = dict(module.named_parameters())  # by name: a sharded wrap (FSDP2) replaced the tensors
        for index, hold in self.held:
            optimizer.param_groups[index]["params"].extend(params[n] for n in hold)
            for n in hold:
                params[n].requires_grad_(True)
        for norm, hook in self._hooks:
            hook.remove()
            norm.train(module.training)  # the hook left it in eval mode; the next train() call may be an epoch away
        self._hooks, self.released = [], True

    def unfreeze(self, optimizer: torch.optim.Optimizer, module: nn.Module, accelerator: Any, model: nn.Module) -> Any:
        """`release`, then the prepared `model` wrapped anew (`rewrap`): DDP registered only what required grad."""
        self.release(optimizer, module)
        return rewrap(accelerator, model)

    def restore(self, meta: dict[str, Any], optimizer: torch.optim.Optimizer, module: nn.Module) -> bool:
        """Before a checkpoint's optimizer state loads: apply its step's freeze state; whether it released now.

        The state is a function of the saved step (released after ``unfreeze_at_step``), checked against the
        one the checkpoint recorded.
        """
        at, step = self.config.unfreeze_at_step, int(meta["global_step"])
        released = not self.frozen or (at is not None and step > at)
        recorded = meta.get("finetune")
        if recorded is not None and recorded != self._record(released):
            raise ConfigError(
                f"the checkpoint at step {step} records trainer.finetune state {recorded}, but this run's "
                f"trainer.finetune gives {self._record(released)} there: resume with the checkpoint's trainer.finetune"
            )
        if released and not self.released:
            self.release(optimizer, module)
            return True
        return False

    def record(self) -> dict[str, Any] | None:
        """The freeze state a checkpoint records (``trainer_state.json``: ``finetune``); None: nothing frozen."""
        return self._record(self.released) if self.frozen else None

    def announce(self, accelerator: Any, optimizer: torch.optim.Optimizer, optim: OptimConfig) -> None:
        """Print the optimizer's group table once at fit start, when freezing or LR scales make the groups differ."""
        if self.frozen or optim.layer_decay is not None or optim.head_lr_scale != 1.0:
            accelerator.print(f"sss: optimizer groups\n{group_table(optimizer)}")

    def _record(self, released: bool) -> dict[str, Any]:
        return {"frozen": len(self.frozen), "released": released}


def _eval_mode(norm: nn.Module, args: Any) -> None:
    # A frozen BatchNorm keeps its running statistics as loaded: eval before every call, so no train() undoes it.
    norm.training = False


def _frozen_norms(module: nn.Module, frozen: set[str], patterns: list[str]) -> list[nn.Module]:
    out = []
    for name, sub in module.named_modules():
        if isinstance(sub, nn.modules.batchnorm._BatchNorm):
            own = [f"{name}.{n}" for n, _ in sub.named_parameters()]
            # an affine=False norm has no parameter: frozen when a pattern covers its module path
            if all(n in frozen for n in own) if own else any(matches(p, name) for p in patterns):
                out.append(sub)
    return out


def rewrap(accelerator: Any, prepared: nn.Module) -> nn.Module:
    """`prepared` wrapped anew by `accelerator`, so a data-parallel wrapper sees the parameters now trainable.

    DDP registers the parameters that require grad when it wraps; where nothing wraps the module
    (one process) or the wrap is in place (FSDP2), `prepared` is returned as it is.
    """
    inner = accelerator.unwrap_model(prepared, keep_torch_compile=True)
    if inner is prepared:
        return prepared
    models = accelerator._models  # Accelerate lists the unwrapped module once per prepare: keep it listed once
    count = len(models)
    wrapped = accelerator.prepare_model(inner)
    if len(models) > count:
        models.pop()
    return wrapped


# ---------------------------------------------------------------------------------------------- layer decay
def _tower_ids(tower: nn.Module) -> dict[str, int]:
    """Block ids (1-based, 0 = embeddings) of the tower's parameter names that a depth map places."""
    from importlib.util import find_spec

    inner = next((c for n, c in tower.named_children() if callable(getattr(c, "group_matcher", None))), None)
    if inner is not None and find_spec("timm") is not None:
        from timm.models._manipulate import group_with_matcher

        prefix = next(n for n, c in tower.named_children() if c is inner) + "."
        named = [(n, None) for n, _ in inner.named_parameters()] + [("\0unmatched", None)]
        ids = group_with_matcher(named, inner.group_matcher(coarse=False), reverse=True)
        miss = ids.pop("\0unmatched")  # timm puts names its matcher misses on top, undecayed (timm #2712)
        return {prefix + n: i for n, i in ids.items() if i != miss}
    out = {}
    for name, _ in tower.named_parameters():
        found = _BLOCK.search(name)
        if found:
            out[name] = int(found.group(1)) + 1
    return out


def depth_map(module: nn.Module) -> dict[str, tuple[str, int, int]]:
    """Each parameter's ``(part, layer, depth)``: its tower (a child named ``*_encoder``) or ``heads``.

    A tower's depth map comes from timm's ``group_matcher`` (a wrapped timm model) or block indices in
    the names (``blocks.N``, ``layers.N``, ``encoder.layer.N``): embeddings are layer 0, block N is layer
    N + 1. A tower parameter the map does not place takes layer 0 before the tower's first block (in
    module order) and the top layer after it. Everything else is ``heads`` (layer = depth = 0).

    Example:
        >>> from sss.models.audio import AudioCNN
        >>> table = depth_map(nn.ModuleDict({"audio_encoder": AudioCNN(dim=8), "head": nn.Linear(8, 2)}))
        >>> table["audio_encoder.blocks.0.conv1.weight"][1:], table["head.weight"]
        ((1, 3), ('heads', 0, 0))
    """
    out: dict[str, tuple[str, int, int]] = {}
    for part, child in module.named_children():
        names = [n for n, _ in child.named_parameters()]
        if not part.endswith("_encoder") or not names:
            out.update({f"{part}.{n}": ("heads", 0, 0) for n in names})
            continue
        ids = _tower_ids(child)
        depth, seen = max(ids.values(), default=0), False
        for n in names:
            seen = seen or ids.get(n, 0) > 0
            out[f"{part}.{n}"] = (part, ids.get(n, depth if seen else 0), depth)
    out.update({n: ("heads", 0, 0) for n, _ in module.named_parameters(recurse=False)})
    return out


def lr_scales(module: nn.Module, optim: OptimConfig) -> dict[str, tuple[str, float]]:
    """Each parameter's ``(label, LR multiplier)``: ``layer_decay ** (depth + 1 - layer)`` in a tower, ``head_lr_scale``
    above the towers.

    Example:
        >>> from sss.testing import BoringModule
        >>> scales = lr_scales(BoringModule(), OptimConfig(layer_decay=0.5, head_lr_scale=10.0))
        >>> scales["audio_encoder.1.weight"], scales["fusion_head.head.weight"]
        (('audio_encoder.L0', 0.5), ('heads', 10.0))
    """
    decay, out = optim.layer_decay or 1.0, {}
    for name, (part, layer, depth) in depth_map(module).items():
        if part == "heads":
            out[name] = ("heads", optim.head_lr_scale)
        else:
            out[name] = (f"{part}.L{layer}", decay ** (depth + 1 - layer))
    return out


def scale_groups(
    module: nn.Module, groups: Iterable[dict[str, Any]], optim: OptimConfig, base_lr: float
) -> list[dict[str, Any]]:
    """`groups` split by LR multiplier, each part's ``lr`` = (its rule's lr or `base_lr`) x multiplier, and named.

    Example:
        >>> from sss.testing import BoringModule
        >>> m = BoringModule()
        >>> groups = scale_groups(m, m.parameter_groups(0.1), OptimConfig(head_lr_scale=10.0), base_lr=1e-3)
        >>> [(g["name"], len(g["params"]), g["lr"]) for g in groups][:2]
        [('image_encoder.L0', 1, 0.001), ('audio_encoder.L0', 1, 0.001)]
    """
    names, scales = {id(p): n for n, p in module.named_parameters()}, lr_scales(module, optim)
    out = []
    for group in groups:
        parts: dict[tuple[str, float], list[Any]] = {}
        for p in group["params"]:
            parts.setdefault(scales[names[id(p)]], []).append(p)
        for (label, scale), params in parts.items():
            name = f"{group['name']}.{label}" if group.get("name") else label
            out.append({**group, "params": params, "lr": group.get("lr", base_lr) * scale, "name": name})
    return out


def group_table(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer's groups as a table: name, parameters (tensors / elements), LR, weight decay.

    Example:
        >>> opt = torch.optim.AdamW([{"params": [nn.Parameter(torch.ones(3))], "name": "heads"}], lr=0.1)
        >>> print(group_table(opt))
        group        tensors    elements  lr         weight_decay
        heads              1           3  0.1        0.01
    """
    names = [g.get("name") or f"group_{i}" for i, g in enumerate(optimizer.param_groups)]
    width = max(12, *map(len, names))
    rows = [f"{'group':<{width}} tensors    elements  lr         weight_decay"]
    for name, g in zip(names, optimizer.param_groups, strict=True):
        size, lr = sum(p.numel() for p in g["params"]), g.get("initial_lr", g["lr"])  # before the schedule's warmup
        rows.append(f"{name:<{width}} {len(g['params']):>7} {size:>11}  {lr:<10.4g} {g.get('weight_decay', 0):.4g}")
    return "\n".join(rows)
