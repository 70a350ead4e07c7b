"""Build pluggable parts from ``_target_`` specs, and check specs without building anything."""

from __future__ import annotations

import difflib
import importlib
import inspect
import typing
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sss.config.schema import SSSConfig

__all__ = ["check_config", "check_target", "instantiate", "resolve_target"]

# Arguments the framework passes when it builds a part, so a YAML spec may leave them out.
RUNTIME_ARGS: dict[str, frozenset[str]] = {
    "trainer.optim.optimizer": frozenset({"params"}),
    "trainer.optim.scheduler": frozenset({"optimizer", "total_steps"}),
}


def resolve_target(path: str) -> Any:
    """Import ``"package.module.Name"`` (or a nested attribute) and return the object.

    Example:
        >>> resolve_target("collections.OrderedDict").__name__
        'OrderedDict'
    """
    if not isinstance(path, str) or not path.strip():
        raise ImportError(f"_target_ must be a dotted path such as 'torch.optim.AdamW', got {path!r}")
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is not None and not ".".join(parts[:cut]).startswith(exc.name):
                raise  # the module exists but one of its own imports is missing: report that
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise ImportError(f"cannot import {path!r}: {obj.__name__!r} has no attribute {attr!r}")
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot import {path!r}: no module named {parts[0]!r}")


def instantiate(spec: Any, *args: Any, **kwargs: Any) -> Any:
    """Build ``spec["_target_"](*args, **spec_kwargs, **kwargs)``; nested specs are built first.

    Example:
        >>> instantiate({"_target_": "fractions.Fraction", "numerator": 3, "denominator": 6})
        Fraction(1, 2)
    """
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(spec, (DictConfig, ListConfig)):
        spec = OmegaConf.to_container(spec, resolve=True)
    if not isinstance(spec, dict) or "_target_" not in spec:
        raise ValueError(f"instantiate() needs a mapping with a '_target_' key, got {spec!r}")
    target = resolve_target(spec["_target_"])
    params = {k: _build(v) for k, v in spec.items() if k != "_target_"}
    params.update(kwargs)
    return target(*args, **params)


def _build(value: Any) -> Any:
    if isinstance(value, dict) and "_target_" in value:
        return instantiate(value)
    if isinstance(value, dict):
        return {k: _build(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_build(v) for v in value]
    return value


def check_target(spec: Any, key: str) -> list[str]:
    """Problems of one ``_target_`` spec at YAML path `key`, found without building anything.

    Imports the target, binds the given arguments to its signature (unknown names, missing
    required ones), checks simple annotated types, and recurses into nested specs.

    Example:
        >>> check_target({"_target_": "fractions.Fraction", "numerater": 1}, "model")
        ["model.numerater: unknown argument of fractions.Fraction (did you mean 'numerator'?); ..."]
    """
    if not isinstance(spec, dict):
        return [f"{key}: expected a mapping with '_target_', got {type(spec).__name__}"]
    if "_target_" not in spec:
        return [f"{key}._target_: missing; say which class or function builds this part (e.g. a dotted path)"]
    try:
        target = resolve_target(spec["_target_"])
    except ImportError as exc:
        return [f"{key}._target_: {exc}"]
    args = {k: v for k, v in spec.items() if k != "_target_"}
    errors = _check_signature(target, spec["_target_"], args, key)
    for name, value in args.items():
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, dict) and "_target_" in item:
                sub = f"{key}.{name}[{i}]" if isinstance(value, list) else f"{key}.{name}"
                errors += check_target(item, sub)
    return errors


def _check_signature(target: Any, path: str, args: dict[str, Any], key: str) -> list[str]:
    from sss.models.registry import create_model, model_class

    if target is create_model and isinstance(args.get("name"), str):
        try:
            cls = model_class(args["name"])
        except KeyError as exc:
            return [f"{key}.name: {exc.args[0]}"]
        if cls is not None:
            rest = {k: v for k, v in args.items() if k != "name"}
            return _check_signature(cls, f"{path}({args['name']!r}) -> {cls.__name__}", rest, key)
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []  # builtins without a signature cannot be checked ahead of time
    params = sig.parameters
    errors = []
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        valid = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        for name in args:
            if name not in params:
                close = difflib.get_close_matches(name, valid, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                errors.append(f"{key}.{name}: unknown argument of {path}{hint}; valid: {', '.join(valid)}")
    runtime = RUNTIME_ARGS.get(key, frozenset())
    for name, p in params.items():
        required = p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        if required and name not in args and name not in runtime:
            errors.append(f"{key}.{name}: required argument of {path} is missing")
    errors += _check_types(target, args, key)
    return errors


_SIMPLE = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _check_types(target: Any, args: dict[str, Any], key: str) -> list[str]:
    try:
        hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    except Exception:
        return []  # annotations that cannot be evaluated here are checked when the part is built
    errors = []
    for name, value in args.items():
        allowed = _simple_types(hints.get(name))
        if allowed is None or (value is None and type(None) in allowed):
            continue
        if not any(_fits(value, t) for t in allowed):
            want = " or ".join(_SIMPLE.get(t, t.__name__) for t in allowed if t is not type(None))
            errors.append(f"{key}.{name}: expected {want}, got {type(value).__name__} {value!r}")
    return errors


def _simple_types(hint: Any) -> tuple[type, ...] | None:
    options: Iterable[Any] = typing.get_args(hint) if _is_union(hint) else (hint,)
    options = tuple(options)
    if options and all(t in _SIMPLE or t is type(None) for t in options):
        return options
    return None


def _is_union(hint: Any) -> bool:
    import types

    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _fits(value: Any, t: type) -> bool:
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, t)


def check_config(config: SSSConfig) -> list[str]:
    """Problems of the pluggable parts (model, data, optimizer, scheduler, callbacks), each naming its key.

    Example:
        >>> from sss.config import load_config
        >>> check_config(load_config(None, ["model._target_=sss.models.create_model", "model.name=nope"]))[:1]
        ["model.name: unknown model 'nope'. ..."]
    """
    errors = [] if config.model else ["model: missing; add a model: section with a _target_"]
    if config.model:
        errors += check_target(config.model, "model")
    errors += (
        check_target(config.data, "data") if config.data else ["data: missing; add a data: section with a _target_"]
    )
    errors += check_target(config.trainer.optim.optimizer, "trainer.optim.optimizer")
    if config.trainer.optim.scheduler is not None:
        errors += check_target(config.trainer.optim.scheduler, "trainer.optim.scheduler")
    for i, spec in enumerate(config.callbacks):
        errors += check_target(spec, f"callbacks[{i}]")
    return errors
