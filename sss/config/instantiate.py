"""Build pluggable parts from ``_target_`` specs, and check specs without building anything."""

from __future__ import annotations

import difflib
import importlib
import inspect
import typing
from typing import TYPE_CHECKING, Annotated, Any

from sss.config.constraints import Bound, Ge, Le, Lt, NonNegativeInt, PositiveFloat, PositiveInt, UnitFloat
from sss.config.errors import both_warmups, workers_only

if TYPE_CHECKING:
    from sss.config.schema import SSSConfig

__all__ = [
    "ADAPTER_KEYS",
    "adapter_problems",
    "check_config",
    "check_target",
    "config_targets",
    "find_targets",
    "init_from_problems",
    "instantiate",
    "model_problems",
    "param_group_problems",
    "resolve_target",
    "split_model_spec",
]

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
    raise ImportError(f"cannot import {path!r}: no module named {parts[0]!r} {_searched(parts[0])}")


def _searched(module: str) -> str:
    # `python -m sss` and the sss command look in the working directory first; a plain Python program
    # does not (its script's folder instead), which is where a `mymodule.MyModel` next to the YAML goes missing.
    import os
    import sys

    cwd = os.getcwd()
    on_path = any(os.path.abspath(entry or ".") == cwd for entry in sys.path)
    where = f"the working directory {cwd}" + ("" if on_path else " (not on sys.path here)")
    return (
        f"(looked in {where} and the {len(sys.path) - on_path} other folders of sys.path: PYTHONPATH and the "
        f"installed packages); run from the folder that holds {module}.py or {module}/, add that folder to "
        "PYTHONPATH, or pip install the package"
    )


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


def find_targets(spec: Any, key: str) -> list[tuple[str, Any]]:
    """Every ``_target_`` in `spec`, at any depth (mappings and lists), as ``(YAML key, value)``; imports nothing.

    The key is that of the ``_target_`` entry itself, e.g. ``model.image_kwargs.drop_rate._target_``.
    A ``_target_`` anywhere counts, also where `instantiate` would not build it, so a check over
    this list never misses what a build would import and call.

    Example:
        >>> find_targets({"_target_": "a.B", "layers": [{"_target_": "os.system", "command": "x"}]}, "model")
        [('model._target_', 'a.B'), ('model.layers[0]._target_', 'os.system')]
    """
    found: list[tuple[str, Any]] = []
    if isinstance(spec, dict):
        if "_target_" in spec:
            found.append((f"{key}._target_", spec["_target_"]))
        for name, value in spec.items():
            if name != "_target_":
                found += find_targets(value, f"{key}.{name}")
    elif isinstance(spec, (list, tuple)):
        for i, item in enumerate(spec):
            found += find_targets(item, f"{key}[{i}]")
    return found


def config_targets(config: SSSConfig) -> list[tuple[str, Any]]:
    """Every ``_target_`` that building the parts of `config` imports and calls, with its YAML key.

    Covers what ``sss fit`` builds: ``model``, ``data``, the optimizer, the scheduler and the callbacks.

    Example:
        >>> from sss.config import load_config
        >>> config_targets(load_config(None, ["model._target_=sss.testing.BoringModule"]))
        [('model._target_', 'sss.testing.BoringModule'), ('trainer.optim.optimizer._target_', 'torch.optim.AdamW')]
    """
    optim = config.trainer.optim
    sections = [
        ("model", config.model),
        ("data", config.data),
        ("trainer.optim.optimizer", optim.optimizer),
        ("trainer.optim.scheduler", optim.scheduler),
        ("callbacks", config.callbacks),
    ]
    return [found for key, spec in sections for found in find_targets(spec, key)]


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
    if not callable(target):  # math.pi imports fine, but building the part calls what _target_ names
        kind = type(target).__name__
        return [f"{key}._target_: {spec['_target_']!r} is a {kind}, not a class or function that builds the part"]
    args = {k: v for k, v in spec.items() if k != "_target_"}
    errors = _check_signature(target, spec["_target_"], args, key)
    for name, value in args.items():
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, dict) and "_target_" in item:
                sub = f"{key}.{name}[{i}]" if isinstance(value, list) else f"{key}.{name}"
                errors += check_target(item, sub)
    return errors


def _class_for(target: Any) -> Any:
    # A factory that builds a class it picks by its ``name`` argument, as `sss.models.create_model` does, says
    # which through its ``class_for(name) -> type | None`` (KeyError: no such name): the checks then read that
    # class's signature and setting rules. The config knows the protocol, never the model registry behind it.
    class_for = getattr(target, "class_for", None)
    return class_for if callable(class_for) else None


def _check_signature(target: Any, path: str, args: dict[str, Any], key: str) -> list[str]:
    class_for = _class_for(target)
    if class_for is not None and isinstance(args.get("name"), str):
        try:
            cls = class_for(args["name"])
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
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    errors += _check_types(target, {k: v for k, v in args.items() if takes_any or k in params}, key)
    return errors


MAX_IMAGE_SIZE = 4096
"""The largest ``data.image_size`` (pixels per side) `check_config` accepts."""
MAX_CLIP_SECONDS = 3600
"""The largest ``data.clip_seconds`` `check_config` accepts."""

# Arguments whose signature types cannot judge a YAML value (torch.optim takes ``lr: float | Tensor``)
# but whose valid range every target of that section shares, by YAML section and argument name.
# They apply only where the target takes the argument.
KNOWN_ARGS: dict[str, dict[str, Any]] = {
    "trainer.optim.optimizer": {
        "lr": PositiveFloat,
        "weight_decay": Annotated[float, Ge(0)],
        "momentum": Annotated[float, Ge(0)],
        "dampening": Annotated[float, Ge(0)],
        "alpha": Annotated[float, Ge(0)],
        "eps": PositiveFloat,
        "betas": tuple[Annotated[float, Ge(0), Lt(1)], Annotated[float, Ge(0), Lt(1)]],
        "nesterov": bool,
        "amsgrad": bool,
    },
    "trainer.optim.scheduler": {
        "warmup_steps": NonNegativeInt | None,
        "warmup_ratio": Annotated[float, Ge(0), Lt(1)] | None,  # a fraction of the run's optimizer steps
        "decay_ratio": Annotated[float, Ge(0), Lt(1)] | None,
        "min_lr_ratio": UnitFloat,
    },
    "model": {"num_classes": PositiveInt},
    # the loader keys every data module that takes them passes to its DataLoaders (sss.data.folder.loader_options)
    "data": {
        "num_workers": NonNegativeInt,
        "pin_memory": bool | typing.Literal["auto"],
        "persistent_workers": bool | None,
        "prefetch_factor": PositiveInt | None,
        # Sizes of one sample: a larger one is no dataset but a typo, which would otherwise end in a MemoryError
        # blamed on the first file read (its rows are fine).
        "image_size": Annotated[int, Le(MAX_IMAGE_SIZE, "pixels per side; 4096 is 200 MB per float32 image")],
        "clip_seconds": Annotated[float, Le(MAX_CLIP_SECONDS, "seconds of audio per sample; 3600 is an hour")],
    },
}
"""Ranges by YAML section and argument name, checked after the target's own annotation (which decides null)."""

_SIMPLE = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}


class _Verdict(typing.NamedTuple):
    kind: str  # "ok", "unknown" (a type this check cannot judge), "type" (wrong kind of value), "value" (out of range)
    text: str = ""  # "type": what was expected ("an integer"); "value": why not ("must be >= 1")


_OK, _UNKNOWN = _Verdict("ok"), _Verdict("unknown")


def _check_types(target: Any, args: dict[str, Any], key: str) -> list[str]:
    try:
        hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target, include_extras=True)
    except Exception:
        hints = {}  # annotations that cannot be evaluated here are checked when the part is built
    known = KNOWN_ARGS.get(key, {})
    errors = []
    for name, value in args.items():
        if (name not in hints and name not in known) or (isinstance(value, dict) and "_target_" in value):
            continue  # a nested spec becomes an object when built; check_target checks it on its own
        verdict = _judge(value, hints[name]) if name in hints else _UNKNOWN
        # The known range applies to what the target's own annotation lets through; a null it took is its call.
        if name in known and verdict.kind in ("ok", "unknown") and not (value is None and verdict.kind == "ok"):
            verdict = _judge(value, known[name])
        if verdict.kind == "type":
            got = "null" if value is None else f"{type(value).__name__} {value!r}{_hint(value)}"
            errors.append(f"{key}.{name}: expected {verdict.text}, got {got}")
        elif verdict.kind == "value":
            errors.append(f"{key}.{name}: {verdict.text}, got {value!r}")
    return errors


def _judge(value: Any, hint: Any) -> _Verdict:
    """Whether `value` (as YAML gives it: numbers, strings, lists, mappings, null) fits the annotation `hint`.

    Understands the simple types, None, unions, ``Literal[...]``, ``Annotated[..., Ge(1)]`` bounds
    (`sss.config.constraints`) and fixed-length tuples; anything else is "unknown" and left to the build.
    """
    origin, options = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and hint in _SIMPLE:
        return _OK if _fits(value, hint) else _Verdict("type", _SIMPLE[hint])
    if origin is typing.Annotated:
        verdict = _judge(value, options[0])
        problems = [m.problem(value) for m in options[1:] if isinstance(m, Bound)] if verdict.kind == "ok" else []
        return next((_Verdict("value", p) for p in problems if p), verdict)
    if origin is typing.Literal:
        if any(value == choice and type(value) is type(choice) for choice in options):
            return _OK
        return _Verdict("value", "must be one of " + ", ".join(repr(choice) for choice in options))
    if _is_union(hint):
        verdicts = [_judge(value, option) for option in options]
        if _OK in verdicts or _UNKNOWN in verdicts:
            return _OK if _OK in verdicts else _UNKNOWN
        out_of_range = [v.text for v in verdicts if v.kind == "value"]
        if out_of_range:  # the value has the right type for an option, but not its range
            return _Verdict("value", out_of_range[0] + (" (or null)" if type(None) in options else ""))
        return _Verdict("type", " or ".join(v.text for v in verdicts))
    if origin is dict and len(options) == 2:  # data.columns: {audio: wav}
        if not isinstance(value, dict):
            return _Verdict("type", "a mapping (key: value)")
        for key, item in value.items():
            for part, hint_of in ((key, options[0]), (item, options[1])):
                verdict = _judge(part, hint_of)
                if verdict.kind == "type":
                    return _Verdict("value", f"entry {key!r}: {part!r} is not {verdict.text}")
        return _OK
    if origin is tuple and options and options[-1] is not Ellipsis:
        if not isinstance(value, (list, tuple)):
            return _Verdict("type", f"a list of {len(options)} values")
        if len(value) != len(options):
            return _Verdict("value", f"must be a list of {len(options)} values")
        for i, (item, option) in enumerate(zip(value, options, strict=True)):
            verdict = _judge(item, option)
            if verdict.kind in ("type", "value"):
                text = f"expected {verdict.text}" if verdict.kind == "type" else verdict.text
                return _Verdict("value", f"item {i} ({item!r}): {text}")
        return _OK
    return _UNKNOWN


def _hint(value: Any) -> str:
    # PyYAML reads 1e-3 (no dot) as text; the file loader reads it as a number, but an old habit shows here.
    try:
        number = float(value) if isinstance(value, str) else None
    except ValueError:
        return ""
    return " (a number in quotes? write it without them)" if number is not None else ""


def _is_union(hint: Any) -> bool:
    import types

    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _fits(value: Any, t: type) -> bool:
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if t is type(None):
        return value is None
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
        model, adapter = split_model_spec(config.model)  # adapter, init_from: applied to the built model
        errors += check_target(model, "model")
        errors += [] if errors else model_problems(model)
        errors += adapter_problems(adapter) + init_from_problems(config.model.get("init_from"))
    errors += (
        check_target(config.data, "data") if config.data else ["data: missing; add a data: section with a _target_"]
    )
    errors += check_target(config.trainer.optim.optimizer, "trainer.optim.optimizer")
    if config.trainer.optim.scheduler is not None:
        errors += check_target(config.trainer.optim.scheduler, "trainer.optim.scheduler")
    for i, spec in enumerate(config.callbacks):
        errors += check_target(spec, f"callbacks[{i}]")
    errors += _check_trackers(config.trainer.log.trackers)
    errors += _conflicts(config)
    if not errors:  # it imports the optimizer, which the checks above have just accepted
        errors += _rate_problems(config) + param_group_problems(config.trainer.optim)
    return errors


def model_problems(spec: dict[str, Any]) -> list[str]:
    """What the model's class refuses in the settings of `spec` (a checked ``model:`` section), building nothing.

    A class states its settings' rules with two methods, ``resolve_settings(overrides, variant)`` (the
    arguments it would get; None when it cannot tell) and ``setting_problems(settings)`` (``(argument, why)``), as
    `sss.models.HunterModule` does: fusion and encoder names, widths, the sample rate. Other models
    are checked by their signatures alone.

    Example:
        >>> model_problems({"_target_": "sss.models.create_model", "name": "hunter_tiny", "dim": 30, "heads": 4})
        ['model.dim: dim=30 must be divisible by heads=4 (model.dim / model.heads)']
    """
    found = _model_settings(spec)
    if found is None:
        return []
    cls, settings = found
    return [f"model.{name}: {why}" for name, why in cls.setting_problems(settings)]


def _model_settings(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]] | None:
    # The class `spec` builds and the arguments it would get, for a class that resolves its settings; else None.
    target, args, variant = resolve_target(spec["_target_"]), dict(split_model_spec(spec)[0]), None
    del args["_target_"]
    class_for = _class_for(target)
    if class_for is not None:
        variant = args.pop("name")
        target = class_for(variant)
        args = {k: v for k, v in args.items() if v is not None}  # the factory drops them: the variant's defaults win
    if not all(callable(getattr(target, method, None)) for method in ("resolve_settings", "setting_problems")):
        return None
    settings = target.resolve_settings(args, variant)
    return None if settings is None else (target, settings)


def _rate_problems(config: SSSConfig) -> list[str]:
    # The data's sample rate must be the one the model's audio front-end was built for: a data.sample_rate=1
    # would otherwise fail inside the model after the data was read (and 22050 Hz audio under a 16 kHz
    # front-end trains on mislabelled frequencies without a word).
    found = _model_settings(config.model) if config.model and config.data else None
    data = _parameters(config.data) if found is not None else {}
    if found is None or "sample_rate" not in found[1] or "sample_rate" not in data:
        return []
    model_rate = found[1]["sample_rate"]
    rate = config.data.get("sample_rate", data["sample_rate"].default)
    if rate is inspect.Parameter.empty or "audio" not in found[1].get("modalities", ("audio",)) or rate == model_rate:
        return []
    return [
        f"data.sample_rate={rate} differs from model.sample_rate={model_rate}, the rate the model's audio front-end "
        f"is built for: set data.sample_rate={model_rate}, or both to your audio's rate "
        "(model.sample_rate=R data.sample_rate=R)"
    ]


def _conflicts(config: SSSConfig) -> list[str]:
    # Keys valid one by one that the build refuses together, with the build's own messages (cosine_with_warmup,
    # sss.data.folder.loader_options): refused here, before any data is read.
    # As for KNOWN_ARGS, they apply wherever the target takes the arguments.
    problems = []
    scheduler, key = config.trainer.optim.scheduler or {}, "trainer.optim.scheduler"
    if _parameters(scheduler).keys() >= {"warmup_steps", "warmup_ratio"}:
        steps, ratio = scheduler.get("warmup_steps"), scheduler.get("warmup_ratio")
        if steps is not None and ratio is not None:
            problems.append(both_warmups(key, steps, ratio))
    params = _parameters(config.data)
    workers = config.data.get("num_workers", params["num_workers"].default) if "num_workers" in params else None
    for name in ("persistent_workers", "prefetch_factor"):
        value = config.data.get(name)
        if workers == 0 and name in params and value not in (None, False):
            problems.append(workers_only(name, value))
    encoder = (config.model or {}).get("audio_encoder")
    if config.data.get("cache") == "features" and encoder in OWN_FRONTENDS:
        problems.append(
            f"data.cache=features stores sss's own log-mel, but model.audio_encoder={encoder} computes the log-mel its "
            "weights were trained on, on the device: remove data.cache (or set data.cache=null)"
        )
    # A data module's own rules across its keys (ManifestDataModule: the record layouts' options), named by a hook
    # on its class, so this layer imports no data code: `config_problems(**arguments) -> list[str]`.
    hook = getattr(_target(config.data), "config_problems", None)
    if callable(hook):
        problems += hook(**{name: config.data.get(name, p.default) for name, p in params.items() if name != "self"})
    return problems


OWN_FRONTENDS = ("hf", "cnn14", "cnn10", "cnn6")
"""Audio encoders whose front-end is bound to their pretrained weights (so sss's feature cache cannot feed them)."""


def _target(spec: Any) -> Any:
    # A spec's target, or None when it has none that imports (reported elsewhere).
    try:
        return resolve_target(spec["_target_"])
    except (ImportError, KeyError, TypeError, ValueError):
        return None


def _parameters(spec: Any) -> typing.Mapping[str, inspect.Parameter]:
    # The named parameters of a spec's target; none when it has no target that imports (reported elsewhere).
    try:
        return inspect.signature(_target(spec)).parameters
    except (TypeError, ValueError):
        return {}


def _check_trackers(names: list[str]) -> list[str]:
    # Accelerate refuses an unknown tracker only when the trackers start, after the data was set up.
    from accelerate.utils import LoggerType

    known = ["csv", *LoggerType.list()]
    return [
        f"trainer.log.trackers[{i}]: unknown tracker {name!r}; known: {', '.join(known)}"
        for i, name in enumerate(names)
        if name not in known
    ]


def param_group_problems(optim: Any) -> list[str]:
    """Settings of ``trainer.optim.param_groups`` that the optimizer does not take, each naming its key.

    torch keeps any key of a parameter group without a word, so a misspelled ``lrr`` would change
    nothing; this imports the optimizer's ``_target_`` (call it after a model folder's trust check)
    and compares the keys with its arguments.

    Example:
        >>> from sss.config import OptimConfig
        >>> optim = OptimConfig(param_groups=[{"params": "image_encoder.*", "lrr": 1e-4}])
        >>> param_group_problems(optim)  # doctest: +ELLIPSIS
        ["trainer.optim.param_groups[0].lrr: not a setting of torch.optim.AdamW (did you mean 'lr'?); ..."]
    """
    from sss.config.schema import GROUP_KEYS

    if not optim.param_groups:
        return []
    name = optim.optimizer.get("_target_")
    try:
        params = inspect.signature(resolve_target(name)).parameters
    except (ImportError, TypeError, ValueError):
        return []  # an optimizer that does not import is reported as such; one without a signature: no check
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    valid = [n for n, p in params.items() if n != "params" and p.kind is not p.VAR_POSITIONAL]
    problems = []
    for i, group in enumerate(optim.param_groups):
        for key in group:
            if key not in GROUP_KEYS and key not in valid:
                close = difflib.get_close_matches(key, valid, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(
                    f"trainer.optim.param_groups[{i}].{key}: not a setting of {name}{hint}; "
                    f"a group may set: {', '.join(valid)} (and params, name)"
                )
    return problems


ADAPTER_KEYS: dict[str, Any] = {
    "type": typing.Literal["lora"],
    "r": PositiveInt,
    "alpha": PositiveFloat,
    "dropout": Annotated[float, Ge(0), Lt(1)],
    "target": str | list[str],
}
"""The settings of ``model.adapter`` and what each takes (``type`` and ``target`` are required)."""


MODEL_EXTRAS = ("adapter", "init_from")
"""The ``model:`` keys that are no argument of the model: `sss.run.parts.build_parts` applies them to the built one."""


def split_model_spec(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``model:`` without the `MODEL_EXTRAS` entries (what the model is built from), and its ``adapter`` entry.

    ``model.adapter`` wraps the built model (`sss.models.adapter.apply_adapter`) and ``model.init_from`` loads
    its encoders (`sss.run.init_from.init_encoders_from`); neither is an argument of the model.

    Example:
        >>> split_model_spec({"_target_": "a.B", "init_from": "runs/pre", "adapter": {"type": "lora", "target": ["x"]}})
        ({'_target_': 'a.B'}, {'type': 'lora', 'target': ['x']})
    """
    rest = {k: v for k, v in spec.items() if k not in MODEL_EXTRAS}
    adapter = spec.get("adapter")
    return rest, (dict(adapter) if isinstance(adapter, typing.Mapping) else adapter)


def init_from_problems(value: Any) -> list[str]:
    """What ``model.init_from`` gets wrong as a value (the folder is read when the run starts).

    Example:
        >>> init_from_problems(3)
        ['model.init_from: expected the path of a run, model or checkpoint folder, got int 3']
    """
    if value is None or (isinstance(value, str) and value.strip()):
        return []
    got = "an empty string" if isinstance(value, str) else f"{type(value).__name__} {value!r}"
    return [f"model.init_from: expected the path of a run, model or checkpoint folder, got {got}"]


def adapter_problems(adapter: Any) -> list[str]:
    """What ``model.adapter`` gets wrong, each naming its key, building nothing (None: no adapter, no problem).

    Whether the targets match modules of the model is known only once it is built (`apply_adapter`).

    Example:
        >>> adapter_problems({"type": "lora", "r": 0, "target": ["audio_encoder"], "dropuot": 0.1})
        ["model.adapter.dropuot: unknown setting (did you mean 'dropout'?); valid: type, r, alpha, dropout, target",
         'model.adapter.r: must be >= 1, got 0']
    """
    if adapter is None:
        return []
    if not isinstance(adapter, dict):
        return [
            f"model.adapter: expected a mapping such as {{type: lora, r: 8, target: [audio_encoder]}}, got {adapter!r}"
        ]
    problems = []
    for key in adapter:
        if key not in ADAPTER_KEYS:
            close = difflib.get_close_matches(str(key), list(ADAPTER_KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"model.adapter.{key}: unknown setting{hint}; valid: {', '.join(ADAPTER_KEYS)}")
    for key in ("type", "target"):
        if adapter.get(key) is None:
            example = "lora (the one adapter type sss builds)" if key == "type" else "[audio_encoder]"
            problems.append(f"model.adapter.{key}: missing; set it, e.g. model.adapter.{key}={example.split()[0]}")
    for key, hint in ADAPTER_KEYS.items():
        value = adapter.get(key)
        verdict = _OK if value is None else _judge(value, hint)
        if verdict.kind == "type":
            problems.append(f"model.adapter.{key}: expected {verdict.text}, got {type(value).__name__} {value!r}")
        elif verdict.kind == "value":
            problems.append(f"model.adapter.{key}: {verdict.text}, got {value!r}")
    target = adapter.get("target")
    names = [target] if isinstance(target, str) else target
    if target is not None and not (isinstance(names, list) and names and all(isinstance(t, str) and t for t in names)):
        problems.append(f"model.adapter.target: expected module names or globs (e.g. [audio_encoder]), got {target!r}")
    return problems
