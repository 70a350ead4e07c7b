"""A timm-style model registry: `@register_model` entrypoints, `create_model(name, **overrides)`."""

from __future__ import annotations

import difflib
import fnmatch
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["create_model", "list_models", "model_class", "register_model", "trusted_targets"]

_REGISTRY: dict[str, Callable[..., Any]] = {}
F = TypeVar("F", bound=Callable[..., Any])


def register_model(fn: F) -> F:
    """Register a model entrypoint under its function name.

    An entrypoint takes keyword overrides and returns the module; its return annotation names
    the class whose constructor the overrides must fit (``sss check`` validates against it).

    Example:
        >>> from torch import nn
        >>> @register_model
        ... def doc_linear(**overrides) -> nn.Linear:
        ...     return nn.Linear(**{"in_features": 2, "out_features": 1, **overrides})
        >>> create_model("doc_linear", out_features=3).out_features
        3
    """
    if fn.__name__ in _REGISTRY and _REGISTRY[fn.__name__] is not fn:
        raise ValueError(f"a model named {fn.__name__!r} is already registered ({_REGISTRY[fn.__name__].__module__})")
    _REGISTRY[fn.__name__] = fn
    return fn


def list_models(pattern: str = "*") -> list[str]:
    """Sorted names of the registered models matching a glob pattern.

    Example:
        >>> "hunter_tiny" in list_models("hunter_*")
        True
    """
    _import_families()
    return sorted(name for name in _REGISTRY if fnmatch.fnmatch(name, pattern))


def _entrypoint(name: str) -> Callable[..., Any]:
    _import_families()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown model {name!r}.{hint} Known models: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def model_class(name: str) -> type | None:
    """The class a registered entrypoint returns (from its return annotation), or None if unannotated.

    Example:
        >>> model_class("hunter_tiny").__name__
        'HunterModule'
    """
    fn = _entrypoint(name)
    hints = typing.get_type_hints(fn)
    ret = hints.get("return")
    return ret if inspect.isclass(ret) else None


def create_model(name: str, **overrides: Any) -> Any:
    """Build a registered model; ``None`` overrides are dropped so the variant's defaults win.

    Example:
        >>> model = create_model("hunter_tiny", num_classes=3)
        >>> type(model).__name__
        'HunterModule'
    """
    fn = _entrypoint(name)
    return fn(**{k: v for k, v in overrides.items() if v is not None})


def trusted_targets() -> frozenset[str]:
    """The ``_target_`` dotted names a model folder's ``config.yaml`` may name without ``trust_code``.

    The one allowlist of `sss.load_model` and ``sss predict``: `create_model` (as ``sss.create_model``,
    ``sss.models.create_model`` and ``sss.models.registry.create_model``), every registered entrypoint
    and the class it returns, the modules `sss.models` exports (encoders, fusions, heads,
    `HunterModule`), each under its ``sss.models`` name and its defining module's name, and the test
    model ``sss.testing.BoringModule``. Entrypoints registered by a user's own package count: that
    package is already imported, so building them imports nothing new. Names are compared as
    strings, so checking a config against this set imports nothing it names.

    Example:
        >>> names = trusted_targets()
        >>> {"sss.models.create_model", "sss.models.HunterModule", "sss.models.hunter.hunter_tiny"} <= names
        True
        >>> "os.system" in names
        False
    """
    from torch import nn

    import sss.models as family

    objects: list[Any] = [create_model, *_entrypoints_and_classes()]
    names = {"sss.create_model", "sss.models.create_model", "sss.testing.BoringModule"}
    for export in family.__all__:
        obj = getattr(family, export)
        if (inspect.isclass(obj) and issubclass(obj, nn.Module)) or obj in _REGISTRY.values():
            names.add(f"sss.models.{export}")
            objects.append(obj)
    names.update(f"{obj.__module__}.{obj.__qualname__}" for obj in objects)
    return frozenset(names)


def _entrypoints_and_classes() -> list[Any]:
    found: list[Any] = []
    for name in list_models():
        found.append(_REGISTRY[name])
        try:
            cls = model_class(name)
        except Exception:  # an annotation that no longer evaluates: the entrypoint alone is trusted
            continue
        if cls is not None:
            found.append(cls)
    return found


def _import_families() -> None:
    # Explicit imports register the families; done lazily so `import sss` stays light.
    import sss.models  # noqa: F401
