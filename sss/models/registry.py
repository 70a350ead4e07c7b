"""timm-style registries: `@register_model` entrypoints (`create_model(name, **overrides)`), and the parts a
model picks by name: `@register_fusion` classes (``model.fusion=NAME``) and `@register_encoder` builders."""

from __future__ import annotations

import difflib
import fnmatch
import inspect
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "EncoderSettings",
    "build_encoder",
    "create_model",
    "fusion_class",
    "list_encoders",
    "list_fusions",
    "list_models",
    "model_class",
    "register_encoder",
    "register_fusion",
    "register_model",
    "trusted_targets",
]

_REGISTRY: dict[str, Callable[..., Any]] = {}
_FUSIONS: dict[str, type] = {}
_ENCODERS: dict[str, dict[str, Callable[[EncoderSettings], Any]]] = {"image": {}, "audio": {}}
F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


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


# How `sss.config` finds the class a `create_model` spec builds (to check its arguments and settings)
# without importing this registry: it asks the factory it resolved from the spec's ``_target_``.
create_model.class_for = model_class  # type: ignore[attr-defined]


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


def register_fusion(name: str) -> Callable[[C], C]:
    """Register a fusion class under `name`: ``model.fusion=NAME`` builds it (and ``sss check`` accepts it).

    Every fusion has one constructor shape, ``cls(dim, num_classes, *, depth, heads, mlp_ratio, dropout,
    **own)``, and subclasses `sss.models.fusion.base.FusionHead` (``fuse``, ``classify``); its class
    attribute ``needs_both_modalities`` says whether data of one modality may use it (then its
    ``drop_stream(index)`` removes the missing stream's parameters). `HunterModule` passes the common
    settings, its ``num_bottlenecks`` where the constructor takes one, and ``fusion_kwargs`` as they are.

    Example:
        >>> from sss.models.fusion.late import LateFusion
        >>> @register_fusion("doc_late")
        ... class DocLate(LateFusion):
        ...     pass
        >>> "doc_late" in list_fusions(), fusion_class("doc_late") is DocLate
        (True, True)
    """

    def register(cls: C) -> C:
        if name in _FUSIONS and _FUSIONS[name] is not cls:
            raise ValueError(f"a fusion named {name!r} is already registered ({_FUSIONS[name].__module__})")
        _FUSIONS[name] = cls
        return cls

    return register


def list_fusions() -> list[str]:
    """Sorted names of the registered fusions (`register_fusion`), the values ``model.fusion`` takes.

    Example:
        >>> list_fusions()[:3]
        ['bottleneck', 'cross_attention', 'late']
    """
    _import_families()
    return sorted(_FUSIONS)


def fusion_class(name: str) -> type:
    """The fusion class registered under `name`.

    Raises:
        KeyError: No fusion of that name; the message lists the registered ones.

    Example:
        >>> fusion_class("late").__name__
        'LateFusion'
    """
    _import_families()
    if name not in _FUSIONS:
        raise KeyError(f"unknown fusion {name!r}; registered fusions: {', '.join(sorted(_FUSIONS))}")
    return _FUSIONS[name]


@dataclass(frozen=True)
class EncoderSettings:
    """What an encoder builder (`register_encoder`) gets: the model's settings for one modality's encoder.

    A builder reads the fields it needs and ignores the others, so every encoder has the one interface
    ``builder(settings) -> TokenEncoder`` whatever its own arguments.
    """

    dim: int
    """Token width the encoder returns."""
    width: int = 32
    """Channels of a CNN's first block (``model.audio_width``)."""
    depth: int = 3
    """Blocks or layers (``model.audio_depth``)."""
    heads: int = 4
    """Attention heads of a transformer (``model.heads``)."""
    mlp_ratio: float = 4.0
    """A transformer's MLP width as a multiple of its width (``model.mlp_ratio``)."""
    dropout: float = 0.0
    """A transformer's dropout (``model.dropout``)."""
    stem_stride: int = 1
    """Stride of a CNN's first convolution (``model.audio_stem_stride``)."""
    frontend: Any = None
    """Audio: the module from the batch's audio to a log-mel (built by the model, shared by its audio encoders)."""
    backbone: str = ""
    """Image: the backbone's name (``model.image_encoder``, a timm model name)."""
    pretrained: bool | str | os.PathLike[str] | None = False
    """Pretrained weights: ``model.image_pretrained`` (False, True or a file) or ``model.audio_pretrained``
    (None or a local file/folder)."""
    strict: bool = True
    """Refuse weights that fill fewer than all of the encoder's tensors (``model.*_strict``)."""
    sample_rate: int = 16000
    """Audio: the sample rate of ``batch["audio"]`` in Hz (``model.sample_rate``)."""
    n_mels: int = 64
    """Audio: mel bins of the model's front-end (``model.n_mels``)."""
    channels_last: bool = False
    """Image: run the backbone in channels-last memory format (``model.image_channels_last``)."""
    checkpointing: str = "backbone"
    """Image: what gradient checkpointing recomputes (``model.image_checkpointing``)."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """The encoder's own extra arguments (``model.image_kwargs`` / ``model.audio_kwargs``)."""


def register_encoder(modality: str, name: str) -> Callable[[F], F]:
    """Register an encoder builder ``builder(settings: EncoderSettings) -> TokenEncoder`` for `modality`.

    ``model.audio_encoder=NAME`` picks an audio builder; the image side has ``"timm"`` (any timm backbone).

    Example:
        >>> from sss.models.audio.cnn import AudioCNN
        >>> @register_encoder("audio", "doc_cnn")
        ... def doc_cnn(settings: EncoderSettings) -> AudioCNN:
        ...     return AudioCNN(settings.dim, width=4, depth=1)
        >>> build_encoder("audio", "doc_cnn", EncoderSettings(dim=8)).output_dim
        8
    """
    if modality not in _ENCODERS:
        raise ValueError(f"unknown modality {modality!r}; encoders are registered for {', '.join(_ENCODERS)}")

    def register(fn: F) -> F:
        known = _ENCODERS[modality]
        if name in known and known[name] is not fn:
            raise ValueError(f"{modality}: an encoder named {name!r} is already registered ({known[name].__module__})")
        known[name] = fn
        return fn

    return register


def list_encoders(modality: str) -> list[str]:
    """Sorted names of the registered encoders of `modality` (``"image"`` or ``"audio"``).

    Example:
        >>> list_encoders("audio")[:2], list_encoders("image")[:1]
        (['ast', 'cnn'], ['timm'])
    """
    _import_families()
    return sorted(_ENCODERS[modality])


def build_encoder(modality: str, name: str, settings: EncoderSettings) -> Any:
    """Build the `modality` encoder registered under `name` from `settings`.

    Raises:
        KeyError: No such encoder; the message lists the registered ones.

    Example:
        >>> build_encoder("image", "timm", EncoderSettings(dim=8, backbone="test_resnet")).output_dim
        8
    """
    _import_families()
    known = _ENCODERS[modality]
    if name not in known:
        raise KeyError(f"unknown {modality} encoder {name!r}; registered: {', '.join(sorted(known))}")
    return known[name](settings)


def _import_families() -> None:
    # Explicit imports register the families; done lazily so `import sss` stays light.
    import sss.models  # noqa: F401
