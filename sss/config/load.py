"""Loading a config: defaults <- YAML <- ``key=value`` overrides, merged by OmegaConf and checked."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
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

    Raises `ConfigError` naming the file and key on unknown keys, wrong types and bad values.
    A `sources` dict is filled with where each explicitly set value came from: dotted key ->
    the YAML file's path or ``"override"`` (keys left at their default are absent).

    Example:
        >>> sources = {}
        >>> cfg = load_config(None, ["trainer.max_steps=5", "name=demo"], sources)
        >>> cfg.trainer.max_steps, cfg.trainer.output_dir, sources["trainer.max_steps"]
        (5, 'runs/demo', 'override')
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    where = str(path) if path is not None else "defaults"
    merged = OmegaConf.structured(SSSConfig)
    try:
        if path is not None:
            data = _read_yaml(Path(path))
            _record(sources, OmegaConf.to_container(data), str(path))
            merged = OmegaConf.merge(merged, data)
        given = _parse_overrides(overrides)
        _record(sources, OmegaConf.to_container(given), "override")
        merged = OmegaConf.merge(merged, given)
        config: SSSConfig = OmegaConf.to_object(merged)  # runs every __post_init__
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        reason = str(exc).splitlines()[0]
        raise ConfigError(f"{where}: {key}: {reason}") from None
    except TypeError:  # a list where a mapping belongs, or the reverse; OmegaConf does not say where
        data = OmegaConf.to_container(_read_yaml(Path(path))) if path is not None else {}
        key = _container_mismatch(OmegaConf.structured(SSSConfig), data)
        raise ConfigError(f"{where}: {key}: a list and a mapping are mixed up here; see `sss config` output") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not config.name:
        config.name = Path(path).stem if path is not None else "run"
    if config.trainer.output_dir is None:
        config.trainer.output_dir = f"runs/{config.name}"
    return config


def _record(sources: dict[str, str] | None, data: Any, origin: str, prefix: str = "") -> None:
    # Every key on the way down counts as set (``trainer`` and ``trainer.seed``), as a reader of the YAML sees it.
    if sources is None or not isinstance(data, dict):
        return
    for key, value in data.items():
        sources[f"{prefix}{key}"] = origin
        _record(sources, value, origin, f"{prefix}{key}.")


def _read_yaml(path: Path) -> Any:
    import yaml
    from omegaconf import OmegaConf

    if not path.is_file():
        raise ConfigError(f"{path}: no such config file" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{line}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (trainer:, model:, ...)")
    return OmegaConf.create(data)


def _container_mismatch(schema: Any, data: Any, prefix: str = "") -> str:
    from omegaconf import DictConfig, ListConfig

    for key, value in data.items():
        expected = schema.get(key) if isinstance(schema, DictConfig) else None
        if isinstance(expected, ListConfig) and not isinstance(value, list):
            return f"{prefix}{key} (expected a list)"
        if isinstance(expected, DictConfig) and not isinstance(value, dict):
            return f"{prefix}{key} (expected a mapping)"
        if isinstance(expected, DictConfig) and isinstance(value, dict):
            found = _container_mismatch(expected, value, f"{prefix}{key}.")
            if found != "?":
                return found
    return "?"


def _parse_overrides(overrides: list[str] | tuple[str, ...]) -> Any:
    from omegaconf import OmegaConf

    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r}: write overrides as key=value, e.g. trainer.max_steps=100")
    return OmegaConf.from_dotlist(list(overrides))


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
