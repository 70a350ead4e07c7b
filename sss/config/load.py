"""Loading a config: defaults <- YAML <- ``key=value`` overrides, merged by OmegaConf and checked."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import re
import textwrap
from pathlib import Path
from typing import Any

from sss.config.errors import ConfigError
from sss.config.schema import SSSConfig

__all__ = ["field_docs", "load_config", "to_yaml"]


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    sources: dict[str, str] | None = None,
) -> SSSConfig:
    """Merge defaults <- YAML file <- ``key=value`` overrides into a checked `SSSConfig`.

    Raises `ConfigError` naming the file (once) and the key on unknown keys, wrong types, bad
    values and duplicate YAML keys; a problem of an override names the override too.
    A `sources` dict is filled with where each explicitly set value came from: dotted key ->
    the YAML file's path or ``"override"`` (keys left at their default are absent).

    Example:
        >>> sources = {}
        >>> cfg = load_config(None, ["trainer.max_steps=5", "name=demo"], sources)
        >>> cfg.trainer.max_steps, cfg.trainer.output_dir, sources["trainer.max_steps"]
        (5, 'runs/demo', 'override')
        >>> load_config(None, ["trainer=5"])
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: defaults: override 'trainer=5': trainer: expected a mapping ..., got int 5
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    where = str(path) if path is not None else "defaults"
    layers = [("", _read_yaml(Path(path)))] if path is not None else []  # its errors name the file already
    for item in _checked_overrides(overrides, where):
        try:
            layers.append((f"override {item!r}: ", OmegaConf.from_dotlist([item])))
        except OmegaConfBaseException as exc:  # e.g. an unclosed ${...}
            raise ConfigError(f"{where}: override {item!r}: {str(exc).splitlines()[0]}") from None
    merged = OmegaConf.structured(SSSConfig)
    for origin, layer in layers:
        data = OmegaConf.to_container(layer)
        _record(sources, data, "override" if origin else where)
        try:
            merged = OmegaConf.merge(merged, layer)
        except (OmegaConfBaseException, TypeError) as exc:  # TypeError: a list and a mapping mixed up
            raise ConfigError(f"{where}: {origin}{_merge_problem(merged, data, exc)}") from None
    try:
        config: SSSConfig = OmegaConf.to_object(merged)  # runs every __post_init__
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{where}: {exc.full_key or '?'}: {str(exc).splitlines()[0]}") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not config.name:
        config.name = Path(path).stem if path is not None else "run"
    if config.trainer.output_dir is None:
        config.trainer.output_dir = f"runs/{config.name}"
    return config


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


# YAML 1.2 floats: PyYAML (YAML 1.1) reads ``1e-3`` without a dot as the string "1e-3" (OmegaConf's own
# loader makes the same fix), which would reach an optimizer as text.
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


@functools.cache
def _loader() -> type:
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        """SafeLoader that refuses a key given twice in one mapping: PyYAML keeps the last one silently."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:
                    continue  # an unhashable key: SafeLoader reports it itself
                if first != key_node.start_mark.line + 1:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first on line {first}); a later value would silently win: keep one",
                        key_node.start_mark,
                    )
            return super().construct_mapping(node, deep=deep)

    UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    return UniqueKeyLoader


def _read_yaml(path: Path) -> Any:
    import yaml
    from omegaconf import OmegaConf

    if not path.is_file():
        raise ConfigError(f"{path}: no such config file" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
        problem = str(getattr(exc, "problem", exc))
        kind = "" if problem.startswith("duplicate key") else " not valid YAML:"
        raise ConfigError(f"{path}:{line}{kind} {problem}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (trainer:, model:, ...)")
    return OmegaConf.create(data)


def _checked_overrides(overrides: list[str] | tuple[str, ...], where: str) -> list[str]:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"{where}: override {item!r}: write overrides as key=value, e.g. trainer.max_steps=100")
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
