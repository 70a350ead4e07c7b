"""Reading YAML with bounded work: a size, nesting and alias-expansion limit, unknown top-level keys first.

PyYAML composes an alias as a second reference to the anchored node, which costs nothing; whoever
walks the result afterwards (OmegaConf copies every value) pays for the expansion. Nine anchors of
nine references each ("billion laughs", under 1 KB) expand to 9^9 values: minutes of CPU. So the
composer here counts every value as it would be after expansion, and stops at `MAX_NODES`; it also
stops at `MAX_DEPTH` levels, before Python's recursion limit would (a 5,000-deep list), and a file
over `MAX_BYTES` is not parsed at all (the pure-Python parser reads about 1 MB a second).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import yaml

from sss.config.errors import ConfigError

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "check_size", "read_yaml"]

MAX_BYTES = 1_000_000
"""Largest config file read, in bytes (a real one is a few KB; larger is refused before parsing)."""
MAX_NODES = 10_000
"""Most values (keys, scalars, lists, mappings) a config may hold, its aliases expanded (a real one: ~100)."""
MAX_DEPTH = 64
"""Deepest nesting of lists and mappings a config may have, aliases expanded (a real one: ~6)."""

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
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")


def read_yaml(
    path: str | Path,
    top_level: Collection[str] | None = None,
    unknown_key: Callable[[str], str] | None = None,
) -> Any:
    """The data of the YAML file `path` (plain dicts, lists and scalars), read within the limits above.

    A key given twice in one mapping is refused (PyYAML keeps the last one silently). With
    `top_level`, a key of the top mapping outside it is refused as soon as it is read, before its
    value is (an unknown key holding an alias bomb names the key); `unknown_key(key)` gives that
    refusal's text after the file's name (the caller knows the schema: this module imports none).
    Every refusal is a `ConfigError` naming the file and line: too large (`MAX_BYTES`), too many
    values after expansion (`MAX_NODES`, naming the first alias), too deep (`MAX_DEPTH`), a
    recursive alias, not YAML, not UTF-8.

    Example:
        >>> import tempfile
        >>> bomb = Path(tempfile.mkdtemp()) / "bomb.yaml"
        >>> _ = bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\\n" + "".join(
        ...     f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\\n" for p, n in zip("abcdefgh", "bcdefghi")))
        >>> read_yaml(bomb)
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: .../bomb.yaml: line 5, column 8: the aliases expand to more than 10,000 values \
(first alias *a on line 2): ...
    """
    path = Path(path)
    with path.open("rb") as f:
        raw = f.read(MAX_BYTES + 1)  # never more: the file may be huge, or still growing
    if len(raw) > MAX_BYTES:
        raise ConfigError(
            f"{path}: over {MAX_BYTES // 1_000_000} MB ({path.stat().st_size / 1e6:.1f} MB); sss reads config files of "
            f"at most {MAX_BYTES // 1_000_000} MB (a real one is a few KB): is this the right file?"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    loader = BoundedLoader(text)
    loader.where, loader.top_level = path, frozenset(top_level) if top_level is not None else None
    loader.unknown_key = unknown_key or (lambda key: f"{key}: not a known section")
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
        problem = str(getattr(exc, "problem", None) or exc)
        kind = "" if problem.startswith("duplicate key") else " not valid YAML:"
        raise ConfigError(f"{path}:{line}{kind} {problem}") from None
    finally:
        loader.dispose()


def check_size(data: Any, where: str) -> None:
    """Refuse a config already read as data (a checkpoint's stored JSON) over `MAX_NODES` values or `MAX_DEPTH` deep.

    Example:
        >>> check_size({"trainer": {"max_steps": 5}}, "trainer_state.json")
        >>> check_size({"model": {"x": list(range(20_000))}}, "trainer_state.json")
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: trainer_state.json: the config holds more than 10,000 values; ...
    """
    count, stack = 0, [(data, 1)]
    while stack:  # no recursion: a 5,000-deep list is refused, not a RecursionError
        value, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ConfigError(f"{where}: the config holds more than {MAX_NODES:,} values; {_NODES_WHY}")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: the config nests deeper than {MAX_DEPTH} levels; {_DEPTH_WHY}")
        if isinstance(value, dict):
            stack += [(v, depth + 1) for v in value.values()]
            count += len(value)  # the keys
        elif isinstance(value, list):
            stack += [(v, depth + 1) for v in value]


_NODES_LIMIT = f"sss reads configs of at most {MAX_NODES:,} values (a real one holds about 100)"
_NODES_WHY = f"{_NODES_LIMIT}: is this the right file?"
_DEPTH_WHY = f"sss reads configs nested at most {MAX_DEPTH} deep (a real one nests about 6)"


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader with the limits of `read_yaml`, YAML 1.2 floats and booleans, and no duplicate keys."""

    where: Path = Path("?")
    top_level: frozenset[str] | None = None
    unknown_key: Callable[[str], str] = staticmethod(lambda key: f"{key}: not a known section")

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.total, self.depth, self.first_alias = 0, 0, None
        self.sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values after expansion, levels)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None:  # an undefined one: PyYAML's own error
                self._count_alias(event, node)
            return super().compose_node(parent, index)
        mark = self.peek_event().start_mark
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self._refuse(mark, f"nested deeper than {MAX_DEPTH} levels; {_DEPTH_WHY}")
        self._add(1, mark)
        node = super().compose_node(parent, index)
        self.depth -= 1
        if isinstance(node, yaml.MappingNode):
            children = [c for pair in node.value for c in pair]
        else:
            children = node.value if isinstance(node, yaml.SequenceNode) else []
        counted = [self.sizes[id(c)] for c in children]
        self.sizes[id(node)] = (1 + sum(n for n, _ in counted), 1 + max((d for _, d in counted), default=0))
        if self.depth == 1 and index is None and isinstance(parent, yaml.MappingNode):
            self._check_top_key(node)  # before its value is composed
        return node

    def _count_alias(self, event: Any, node: Any) -> None:
        mark, name = event.start_mark, f"alias *{event.anchor}"
        if id(node) not in self.sizes:
            self._refuse(mark, f"{name} refers to a value that holds it (a recursive alias)")
        self.first_alias = self.first_alias or (event.anchor, event.start_mark.line + 1)
        size, levels = self.sizes[id(node)]
        if self.depth + levels > MAX_DEPTH:
            self._refuse(mark, f"{name} nests deeper than {MAX_DEPTH} levels; {_DEPTH_WHY}")
        self._add(size, mark)

    def _add(self, n: int, mark: Any) -> None:
        self.total += n
        if self.total <= MAX_NODES:
            return
        if self.first_alias is None:
            self._refuse(mark, f"more than {MAX_NODES:,} values; {_NODES_WHY}")
        anchor, line = self.first_alias
        self._refuse(
            mark,
            f"the aliases expand to more than {MAX_NODES:,} values (first alias *{anchor} on line {line}): an "
            f"alias bomb? {_NODES_LIMIT}; write the values out, or use fewer aliases",
        )

    def _check_top_key(self, node: Any) -> None:
        key = node.value if isinstance(node, yaml.ScalarNode) else None
        if self.top_level is None or key in self.top_level or key == "<<":
            return
        raise ConfigError(f"{self.where}: {self.unknown_key(str(key))}")

    def _refuse(self, mark: Any, problem: str) -> None:
        raise ConfigError(f"{self.where}: line {mark.line + 1}, column {mark.column + 1}: {problem}")

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults`: SafeLoader merges it, and a key given here wins, as YAML says
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


BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
# YAML 1.2 booleans: only true/false. PyYAML's YAML 1.1 also reads yes/no/on/off as booleans,
# which turns `mixed_precision: no` into False; a boolean field still accepts those words.
BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in BoundedLoader.yaml_implicit_resolvers.items()
}
BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
