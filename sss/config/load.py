"""Loading a config: defaults <- YAML <- ``key=value`` overrides, merged by OmegaConf and checked."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import re
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sss.config._untrusted import refuse_interpolations, without_outside_files
from sss.config._yaml import check_size, read_yaml
from sss.config.errors import ConfigError
from sss.config.schema import SSSConfig

__all__ = ["closest_keys", "field_docs", "load_config", "to_yaml"]


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    sources: dict[str, str] | None = None,
    *,
    stored: Mapping[str, Any] | None = None,
    untrusted: bool = False,
) -> SSSConfig:
    """Merge defaults <- YAML file <- ``key=value`` overrides into a checked `SSSConfig`.

    Raises `ConfigError` naming the file (once) and the key on unknown keys, wrong types, bad
    values and duplicate YAML keys; a problem of an override names the override too. An unknown
    key names the closest valid keys anywhere in the schema and the config (``trainer.lr``: did
    you mean ``trainer.optim.optimizer.lr``?).
    A `sources` dict is filled with where each explicitly set value came from: dotted key ->
    the YAML file's path or ``"override"`` (keys left at their default are absent: a
    ``trainer.output_dir`` filled in as ``runs/<name>`` too). The returned config's
    `SSSConfig.output_dir_given` says whether ``trainer.output_dir`` was given.

    `stored` is a config already read as a mapping (a checkpoint's ``trainer_state.json`` ``config``);
    it takes the YAML file's place, and `path` then only names it in messages.
    ``untrusted=True`` is for a config that is data, not yours (a model folder's, a checkpoint's): a
    ``${...}`` anywhere in it is refused naming the key, its ``model:`` spec loses its pretrained-weight
    settings and may name no file, directory or URL (`sss.config._untrusted`). Any file is read within
    `sss.config._yaml`'s limits.

    Example:
        >>> sources = {}
        >>> cfg = load_config(None, ["trainer.max_steps=5", "name=demo"], sources)
        >>> cfg.trainer.max_steps, cfg.trainer.output_dir, sources["trainer.max_steps"], cfg.output_dir_given
        (5, 'runs/demo', 'override', False)
        >>> load_config(None, ["trainer=5"])
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: defaults: override 'trainer=5': trainer: expected a mapping ..., got int 5
        >>> load_config(None, ["trainer.lr=1e-4"])
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: defaults: override 'trainer.lr=1e-4': trainer.lr: Key 'lr' not in \
'TrainerConfig'. Did you mean trainer.optim.optimizer.lr?
        >>> load_config("run_42/trainer_state.json", stored={"trainer": {"max_steps": 7}}).trainer.max_steps
        7
    """
    where = str(path) if path is not None else "defaults"
    layers = _layers(path, overrides, where, stored, untrusted)
    config = _merged(layers, sources, where)
    if untrusted:
        config.model = without_outside_files(config.model, where)
    if not config.name:
        config.name = Path(path).stem if path is not None else "run"
    config.output_dir_given = config.trainer.output_dir is not None
    if not config.output_dir_given:
        config.trainer.output_dir = f"runs/{config.name}"
        if sources is not None:
            sources.pop("trainer.output_dir", None)  # written as null: the default all the same
    return config


def _layers(
    path: str | Path | None,
    overrides: list[str] | tuple[str, ...],
    where: str,
    stored: Mapping[str, Any] | None,
    untrusted: bool,
) -> list[tuple[str, Any]]:
    # What is merged over the defaults, in order, each with the prefix its messages get: the stored
    # config or the YAML file (no prefix), then one layer per override.
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if stored is not None:
        check_size(stored, where)
        if untrusted:
            refuse_interpolations(stored, where)
        try:
            layers = [("", OmegaConf.create(dict(stored)))]
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{where}: the stored config does not read: {str(exc).splitlines()[0]}") from None
    else:
        layers = [("", _read_yaml(Path(path), untrusted))] if path is not None else []  # its errors name the file
    for item in _checked_overrides(overrides, where):
        try:
            layers.append((f"override {item!r}: ", OmegaConf.from_dotlist([_yaml12_value(item)])))
        except OmegaConfBaseException as exc:  # e.g. an unclosed ${...}
            raise ConfigError(f"{where}: override {item!r}: {str(exc).splitlines()[0]}") from None
    return layers


def _merged(layers: list[tuple[str, Any]], sources: dict[str, str] | None, where: str) -> SSSConfig:
    # The schema's defaults <- each layer, recording where each value came from; then the checked dataclasses.
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    merged = OmegaConf.structured(SSSConfig)
    for origin, layer in layers:
        data = OmegaConf.to_container(layer)
        _record(sources, data, "override" if origin else where)
        try:
            merged = OmegaConf.merge(merged, layer)
        except (OmegaConfBaseException, TypeError) as exc:  # TypeError: a list and a mapping mixed up
            problem = _with_suggestion(_merge_problem(merged, data, exc), merged, data)
            raise ConfigError(f"{where}: {origin}{problem}") from None
    try:
        return OmegaConf.to_object(merged)  # runs every __post_init__
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{where}: {exc.full_key or '?'}: {str(exc).splitlines()[0]}") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


_UNKNOWN_KEY = re.compile(r"^(?P<key>[\w.\[\]]+): Key '[^']*' not in '\w+'")


def _with_suggestion(problem: str, merged: Any, data: Any) -> str:
    # OmegaConf suggests keys of the same section only (trainer.batch_size -> auto_batch_size); a
    # newcomer's key is often right but in another section: name the closest keys of the whole config.
    found = _UNKNOWN_KEY.match(problem)
    if found is None:
        return problem
    close = closest_keys(found["key"], _known_keys(merged, data))
    if not close:
        return problem
    head = problem.split(". Did you mean", 1)[0]
    return f"{head}. Did you mean {' or '.join(close)}?"


def closest_keys(key: str, known: list[str], n: int = 3) -> list[str]:
    """The dotted keys of `known` closest to the unknown `key`: same last name first, then similar spelling.

    Example:
        >>> closest_keys("trainer.lr", ["trainer.max_steps", "trainer.optim.optimizer.lr", "data.lr_x"])
        ['trainer.optim.optimizer.lr']
        >>> closest_keys("max_steps", ["trainer.max_steps", "trainer.max_epochs"])
        ['trainer.max_steps']
        >>> closest_keys("trainer.log.every_n_step", ["trainer.log.every_n_steps", "trainer.checkpoint.every_n_steps"])
        ['trainer.log.every_n_steps', 'trainer.checkpoint.every_n_steps']
    """
    import difflib

    def similarity(a: str, b: str) -> float:
        return difflib.SequenceMatcher(None, a, b).ratio()

    leaf = key.rsplit(".", 1)[-1]
    others = [k for k in dict.fromkeys(known) if k != key and not key.startswith(f"{k}.")]  # not its own section
    same = [k for k in others if k.rsplit(".", 1)[-1] == leaf]
    if same:  # the right name in another section: the nearest sections first
        return sorted(same, key=lambda k: -similarity(key, k))[:n]
    leaves = {k.rsplit(".", 1)[-1] for k in others}
    near = set(difflib.get_close_matches(leaf, leaves, n=n, cutoff=0.75))
    close = [k for k in others if k.rsplit(".", 1)[-1] in near]
    if not close:  # a misspelled section, say
        close = difflib.get_close_matches(key, others, n=n, cutoff=0.8)
    return sorted(close, key=lambda k: (-similarity(leaf, k.rsplit(".", 1)[-1]), -similarity(key, k)))[:n]


def _known_keys(merged: Any, data: Any) -> list[str]:
    """Every dotted key a config may set: the schema's, those the config itself has, and its parts' arguments."""
    from omegaconf import OmegaConf

    known = [key for key, _, _ in field_docs(SSSConfig)]
    tree = OmegaConf.to_container(merged) if merged is not None else {}
    known += _dotted(tree)
    for section, spec in (
        ("model", tree.get("model")),
        ("data", tree.get("data")),
        ("trainer.optim.optimizer", tree.get("trainer", {}).get("optim", {}).get("optimizer")),
        ("trainer.optim.scheduler", tree.get("trainer", {}).get("optim", {}).get("scheduler")),
    ):
        known += [f"{section}.{name}" for name in _own_argument_names(spec)]
    return [k for k in known if not k.endswith("._target_")]


def _dotted(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict):
        return []
    keys = []
    for key, value in tree.items():
        keys.append(f"{prefix}{key}")
        keys += _dotted(value, f"{prefix}{key}.")
    return keys


def _own_argument_names(spec: Any) -> list[str]:
    # The arguments of a part only where naming them imports nothing but sss and torch: a config may come
    # from a model folder, whose other targets must not be imported before the trust check.
    import inspect

    target = spec.get("_target_") if isinstance(spec, dict) else None
    if not isinstance(target, str) or not target.startswith(("sss.", "torch.")):
        return []
    try:
        from sss.config.instantiate import resolve_target

        obj = resolve_target(target)
        class_for = getattr(obj, "class_for", None)  # a factory of classes by name (sss.models.create_model)
        if callable(class_for) and isinstance(spec.get("name"), str):
            obj = class_for(spec["name"]) or obj
        params = inspect.signature(obj).parameters.values()
    except Exception:  # a suggestion is a nicety: a part that does not resolve is reported by sss check
        return []
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "params"]


def _merge_problem(base: Any, data: Any, exc: Exception) -> str:
    # OmegaConf leaves `full_key` empty when a whole section has the wrong kind (``trainer=5``), and a
    # list/mapping mix-up raises a bare TypeError; merging key by key finds the one that fails.
    found = _failing_key(base, data)
    if found is None:
        return f"{getattr(exc, 'full_key', None) or '?'}: {str(exc).splitlines()[0]}"
    key, node, value = found
    from omegaconf import DictConfig, ListConfig

    got = f"got {type(value).__name__} {value!r}"
    if isinstance(node, DictConfig) and not isinstance(value, dict):
        return f"{key}: expected a mapping of settings, {got}"
    if isinstance(node, ListConfig) and not isinstance(value, list):
        return f"{key}: expected a list, {got}"
    return f"{key}: {str(exc).splitlines()[0]}"


def _failing_key(base: Any, data: Any, prefix: str = "") -> tuple[str, Any, Any] | None:
    """``(dotted key, schema node, value)`` of the deepest key of `data` that does not merge into `base`."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(data, dict) or not isinstance(base, DictConfig):
        return None
    for key, value in data.items():
        try:
            OmegaConf.merge(base, {key: value})
        except (OmegaConfBaseException, TypeError):
            node = base.get(key) if key in base else None
            deeper = _failing_key(node, value, f"{prefix}{key}.") if isinstance(value, dict) else None
            return deeper or (f"{prefix}{key}", node, value)
    return None


def _record(sources: dict[str, str] | None, data: Any, origin: str, prefix: str = "") -> None:
    # Every key on the way down counts as set (``trainer`` and ``trainer.seed``), as a reader of the YAML sees it.
    if sources is None or not isinstance(data, dict):
        return
    for key, value in data.items():
        sources[f"{prefix}{key}"] = origin
        _record(sources, value, origin, f"{prefix}{key}.")


_YAML11_WORDS = re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF)$")


def _yaml12_value(item: str) -> str:
    # OmegaConf parses an override's value with YAML 1.1 rules (``no`` -> False): quote those words
    # so that ``trainer.mixed_precision=no`` means "no", as it does in a YAML file here.
    key, value = item.split("=", 1)
    return f"{key}='{value}'" if _YAML11_WORDS.match(value) else item


def _unknown_section(key: str) -> str:
    # OmegaConf's own wording for an unknown key, with the closest known names (read_yaml calls this
    # as soon as it reads the key, before the value under it is expanded).
    known = [*_TOP_LEVEL, *(k for k, _, _ in field_docs(SSSConfig))]
    close = closest_keys(key, known)
    hint = f" Did you mean {' or '.join(close)}?" if close else f" The sections are {', '.join(sorted(_TOP_LEVEL))}."
    return f"{key}: Key {key!r} not in 'SSSConfig'.{hint}"


def _read_yaml(path: Path, untrusted: bool = False) -> Any:
    # Within sss.config._yaml's limits (size, nesting, aliases); an unknown top-level key is named
    # before its value is read.
    from omegaconf import OmegaConf

    if not path.is_file():
        kind = " (it is a folder)" if path.is_dir() else " (not a regular file)" if path.exists() else ""
        raise ConfigError(f"{path}: no such config file{kind}")
    data = read_yaml(path, _TOP_LEVEL, _unknown_section)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (trainer:, model:, ...)")
    if untrusted:
        refuse_interpolations(data, str(path))
    return OmegaConf.create(data)


_TOP_LEVEL = tuple(f.name for f in dataclasses.fields(SSSConfig))


def _checked_overrides(overrides: list[str] | tuple[str, ...], where: str) -> list[str]:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"{where}: override {item!r}: write overrides as key=value, e.g. trainer.max_steps=100")
        if not item.split("=", 1)[1].strip():  # `trainer.max_steps=$STEPS` with STEPS unset: not a silent null
            key = item.split("=", 1)[0]
            raise ConfigError(
                f"{where}: override {item!r}: {key} has an empty value (an unset shell variable?); give one, "
                f"or write {key}=null to unset it"
            )
    return list(overrides)


def to_yaml(config: SSSConfig) -> str:
    """The resolved config as YAML (what ``sss config`` prints and runs save).

    Example:
        >>> "max_epochs: 10" in to_yaml(SSSConfig())
        True
    """
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(config))


def field_docs(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """``(yaml key, default, docstring)`` for every field of a config dataclass, nested ones included.

    Example:
        >>> from sss.config import TrainerConfig
        >>> field_docs(TrainerConfig)[0][:2]
        ('max_epochs', '10')
    """
    docs = _attribute_docstrings(cls)
    rows: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            rows += field_docs(type(default), prefix=f"{key}.")
        else:
            rows.append((key, "null" if default is None else str(default), docs.get(f.name, "")))
    return rows


def _attribute_docstrings(cls: type) -> dict[str, str]:
    # The docstring under a field is not kept at run time, so read it from the source.
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in itertools.pairwise(body):
        is_field = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        is_doc = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)
        if is_field and is_doc:
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs
