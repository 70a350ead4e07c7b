"""The arguments of a config's parts for ``sss fit CONFIG --help``: what ``model.KEY=VALUE``, ``data.KEY=VALUE`` set.

Each part's ``_target_`` is resolved (imported, not called) and its signature and docstring
(Google-style ``Args:``) are shown with the config's own values beside them.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from typing import Any

__all__ = ["docstring_args", "parts_help"]


def parts_help(config: str, overrides: list[str], model_class: Callable[[str], type | None] | None = None) -> str:
    """The help text for the model and data parts of the config file `config` with `overrides`.

    `model_class` names the class a ``create_model`` entrypoint builds for ``model.name`` (the
    model registry's lookup), so that its arguments are shown rather than the entrypoint's.

    Example:
        >>> print(parts_help("/no/such.yaml", []))  # doctest: +ELLIPSIS
        <BLANKLINE>
        <BLANKLINE>
        the parts of /no/such.yaml: not shown, the config does not load: ...
    """
    from sss.config import load_config

    try:
        cfg = load_config(config, overrides)
    except Exception as exc:  # the help still shows; sss check says the rest
        return f"\n\nthe parts of {config}: not shown, the config does not load: {exc}"
    head = f"\n\narguments of the parts of {config} (model.KEY=VALUE, data.KEY=VALUE; [set: ...] = CONFIG's value):"
    return head + "".join(_part_help(section, getattr(cfg, section), model_class) for section in ("model", "data"))


def _part_help(section: str, spec: dict[str, Any], model_class: Callable[[str], type | None] | None) -> str:
    from sss.config import resolve_target

    target = spec.get("_target_") if spec else None
    if not isinstance(target, str):
        return f"\n  {section}: no _target_"
    try:
        obj = resolve_target(target)
    except ImportError as exc:
        return f"\n  {section}: {exc}"
    title = f"\n{section}: {target}"
    if target.endswith("create_model") and isinstance(spec.get("name"), str) and model_class is not None:
        cls = model_class(spec["name"])
        if cls is not None:
            title += f"(name={spec['name']!r}) -> {cls.__name__} (the entrypoint sets some defaults of its own)"
            obj = cls
    try:
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return f"{title}\n  (no signature to show)"
    docs = {**docstring_args(obj.__doc__), **docstring_args(getattr(obj, "__init__", None).__doc__)}
    lines = [title]
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == "self":
            continue
        kind = p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)
        text = f"  {section}.{p.name}" + (f": {kind}" if p.annotation is not p.empty else "")
        text += " (required)" if p.default is p.empty else f" = {p.default!r}"
        if p.name in spec:
            text += f"   [set: {spec[p.name]!r}]"
        lines.append(text)
        if p.name in docs:
            lines.append(textwrap.fill(docs[p.name], width=110, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines)


def docstring_args(doc: str | None) -> dict[str, str]:
    """The ``Args:`` section of a Google-style docstring: argument name -> its text, on one line.

    Example:
        >>> docstring_args('''Build it.
        ...
        ... Args:
        ...     size: Side in pixels,
        ...         a power of two.
        ...     rate (int): Samples per second.
        ...
        ... Raises:
        ...     ValueError: never.
        ... ''')
        {'size': 'Side in pixels, a power of two.', 'rate': 'Samples per second.'}
    """
    found: dict[str, str] = {}
    inside, indent, current = False, None, None
    for line in inspect.cleandoc(doc or "").splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            inside, indent, current = True, None, None
            continue
        if not inside or not stripped:
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:  # the next section (Raises:, Example:, ...)
            inside = False
            continue
        indent = depth if indent is None else indent
        head = re.match(r"^\*{0,2}(\w+)(?: \([^)]*\))?: ?(.*)$", stripped)
        if depth == indent and head:
            current = head[1]
            found[current] = head[2]
        elif current is not None:
            found[current] = f"{found[current]} {stripped}".strip()
    return found
