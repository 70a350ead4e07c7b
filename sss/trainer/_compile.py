"""``trainer.compile``: torch.compile the whole module, or each of its repeated blocks (regional compilation).

Both compile in place (``nn.Module.compile``), so the module stays the object the user passed and its
state dict keeps its names: checkpoints load with or without compile. Accelerate's
``compile_regions`` is not used: it returns a copy whose blocks are wrapped in ``OptimizedModule``
(keys gain ``_orig_mod.``), and its in-place variants also compile every other leaf region, count two
LayerNorms in a ModuleList as repeated blocks and miss a ``nn.Sequential`` of blocks (timm's ViT).
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

__all__ = ["compile_module", "repeated_blocks"]


def repeated_blocks(module: nn.Module) -> list[str]:
    """Names of the containers of repeated blocks in `module`, outermost first.

    A container of repeated blocks is a ``nn.ModuleList`` or ``nn.Sequential`` of two or more
    children of one class, each with submodules of its own: transformer layers (sss's AST
    ``blocks``, the fusions' ``layers``, Hugging Face's ``encoder.layer``, timm's ViT ``blocks``),
    not a list of two LayerNorms. Blocks inside a container found are not searched.

    Example:
        >>> block = lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU())
        >>> model = nn.ModuleDict({"stem": nn.Linear(2, 4), "layers": nn.ModuleList([block(), block()]),
        ...                        "norms": nn.ModuleList([nn.LayerNorm(4), nn.LayerNorm(4)])})
        >>> repeated_blocks(model)
        ['layers']
    """
    found: list[str] = []

    def visit(prefix: str, part: nn.Module) -> None:
        children = list(part.children())
        if isinstance(part, (nn.ModuleList, nn.Sequential)) and len(children) >= 2:
            kinds = {type(child) for child in children}
            if len(kinds) == 1 and all(next(child.children(), None) is not None for child in children):
                found.append(prefix)
                return
        for name, child in part.named_children():
            visit(f"{prefix}.{name}" if prefix else name, child)

    visit("", module)
    return found


def compile_module(module: nn.Module, how: bool | str, **compile_kwargs: Any) -> list[str]:
    """Compile `module` in place as ``trainer.compile`` says; returns the names of the modules compiled.

    ``True``/``"full"``: the whole module (``[""]``). ``"regional"``: each block of each
    `repeated_blocks` container, once per distinct block (blocks of one class and shapes share one
    compiled graph); the rest of the model runs eagerly. A model without repeated blocks falls back
    to the whole module, with a one-line warning. ``False``: nothing.

    Args:
        module: The model; compiled in place.
        how: ``trainer.compile``: ``False``, ``True``, ``"full"`` or ``"regional"``.
        **compile_kwargs: Passed to ``nn.Module.compile`` (``backend``, ``mode``, ...).

    Returns:
        The qualified names of the compiled modules (``""``: the whole module).

    Example:
        >>> block = lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU())
        >>> model = nn.Sequential(nn.Linear(2, 4), nn.Sequential(block(), block()))
        >>> compile_module(model, "regional", backend="eager")
        ['1.0', '1.1']
        >>> list(model.state_dict())[:3]  # names unchanged: checkpoints load with or without compile
        ['0.weight', '0.bias', '1.0.0.weight']
    """
    if not how:
        return []
    if how == "regional":
        containers = repeated_blocks(module)
        if containers:
            names = [f"{c}.{name}" for c in containers for name, _ in module.get_submodule(c).named_children()]
            for name in names:
                module.get_submodule(name).compile(**compile_kwargs)
            return names
        warnings.warn(
            f"trainer.compile: regional found no repeated blocks (a ModuleList/Sequential of layers of one class) "
            f"in {type(module).__name__}: compiling the whole module instead, as trainer.compile: full does",
            stacklevel=2,
        )
    module.compile(**compile_kwargs)
    return [""]
