"""The ``sss`` command: a table of subcommands, each a plain typed function (`sss.run.commands`).

Each subcommand's parser is generated from its function: the flags from the signature (names,
types, defaults, ``Literal`` choices), the description and each flag's help from the docstring
(its ``Args:``); the row in `COMMANDS` adds what a signature cannot say (the words it takes, the
usage line, argument groups). Adding a subcommand is one typed function and one row.

Heavy modules (torch, accelerate) are imported inside the commands, so ``sss --help`` is instant.
Overrides (``key=value``, also ``--key=value`` and ``--key value``) go anywhere on the line; the
working directory is importable for ``_target_`` (as under ``python -m``).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sss._redact import redact_urls
from sss.run import commands, data_commands
from sss.run.commands import EXIT_CONFIG, RUN, check_flags
from sss.run.explain import explain_error

__all__ = ["COMMANDS", "EXIT_CONFIG", "Command", "explain_error", "main", "version_line"]


@dataclass(frozen=True)
class Command:
    """One row of the command table: the typed function, and what its signature does not say.

    Example:
        >>> COMMANDS["check"].words, COMMANDS["data"].words
        (('config',), None)
    """

    run: Callable[..., int]
    words: tuple[str, ...] | None = None
    """The words (not ``key=value``) it takes, in order; ``?``: may be left out (then None). Every other
    word is an override. None: no overrides, the function's own parameters without default are positionals."""
    metavar: str = ""
    """The words' name in the help: ``CONFIG key=value``."""
    words_help: str = ""
    """What the words are, in the help."""
    usage: str | None = None
    """The usage line of its help and of a missing word's error."""
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Argument group title -> the parameters shown under it."""
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Parameter -> argparse settings a type does not give (``--resume``'s optional value)."""
    fields: bool = False
    """Whether the help ends with the config's fields and, with a CONFIG, its parts' arguments."""


_YAML = "YAML config file, e.g. examples/industrial.yaml"
_STORED = "CONFIG: the YAML config it was trained with (default: the one stored with --ckpt); then overrides"
_LAUNCH = "launch flags (highest precedence: flag > sss YAML/override > Accelerate config file > default)"
_EVALUATE = "[CONFIG] --ckpt PATH [key=value ...] [--output FILE] [--no-ablation] [--missing MODALITY=RATE] [...]"
_MISSING = {"missing": {"action": "append", "metavar": "MODALITY=RATE"}}  # repeatable: image=0.5 and audio=0.2
_TRAIN_GROUPS = {
    _LAUNCH: ("num_processes", "mixed_precision", "gradient_accumulation_steps", "config_file"),
    "engine (docs/distributed.md#ray-train)": ("engine", "num_workers", "ray_address", "max_failures"),
}  # sss fit and sss pretrain
_RESUME = {"resume": {"nargs": "?", "const": "latest"}}  # --resume alone: the newest checkpoint that verifies
_PRETRAIN = "CONFIG: YAML config of a contrastive model, e.g. examples/pretrain.yaml; then overrides"
_PRETRAIN_USAGE = "sss pretrain CONFIG [key=value ...] [--resume [PATH]] [--num-processes N] [...]"
COMMANDS: dict[str, Command] = {
    "fit": Command(
        commands.fit,
        ("config",),
        "CONFIG key=value",
        f"CONFIG: {_YAML}; then overrides",
        "sss fit CONFIG [key=value ...] [--resume [PATH]] [--num-processes N] [--debug] [...]",
        groups=_TRAIN_GROUPS,
        options=_RESUME,
        fields=True,
    ),
    "pretrain": Command(
        commands.pretrain, ("config",), "CONFIG key=value", _PRETRAIN, _PRETRAIN_USAGE, _TRAIN_GROUPS, _RESUME, True
    ),
    "check": Command(
        commands.check,
        ("config",),
        "CONFIG key=value",
        f"CONFIG: {_YAML}, or a model folder (would loading it run code?); then overrides",
        "sss check CONFIG|MODEL_DIR [key=value ...]",
    ),
    "config": Command(
        commands.config,
        ("config",),
        "CONFIG key=value",
        f"CONFIG: {_YAML}; then overrides",
        "sss config CONFIG [key=value ...]",
    ),
    "validate": Command(
        commands.validate, ("config?",), "[CONFIG] key=value", _STORED, f"sss validate {_EVALUATE}", options=_MISSING
    ),
    "test": Command(
        commands.test, ("config?",), "[CONFIG] key=value", _STORED, f"sss test {_EVALUATE}", options=_MISSING
    ),
    "export": Command(
        commands.export,
        ("config?", "out"),
        "[CONFIG] OUT key=value",
        f"{_STORED}; OUT: a new or empty folder to write",
        "sss export [CONFIG] OUT --ckpt PATH [key=value ...] [--trust-code] [--format onnx] | "
        "sss export MODEL_DIR OUT --format onnx",
    ),
    "predict": Command(
        commands.predict,
        ("model_dir",),
        "MODEL_DIR key=value",
        "MODEL_DIR: a model folder (OUTPUT_DIR/model, or one written by sss export); then overrides",
        "sss predict MODEL_DIR --input MANIFEST|SHARDS[:SPLIT]|HF_DATASET[:SPLIT] --output CSV [model.KEY=VALUE ...] "
        "[data.allow_outside_root=true] [data.on_error=skip] [--trust-code] [--runtime onnx]",
    ),
    "tune": Command(
        commands.tune,
        ("what", "config"),
        "lr CONFIG key=value",
        "lr, then CONFIG (YAML), then overrides",
        "sss tune lr CONFIG [key=value ...] [--steps N] [--min-lr A] [--max-lr B] [--apply] [--num-processes N]",
    ),
    "data": Command(
        data_commands.data, options={"kind": {"metavar": "industrial|SRC"}, "out": {"metavar": "OUT"}, **_MISSING}
    ),
    "convert": Command(commands.convert),
}
"""The subcommands, in the order ``sss --help`` lists them."""

_UNDERSCORED = {"num_processes", "mixed_precision", "gradient_accumulation_steps", "config_file", "min_lr", "max_lr"}
_UNDERSCORED |= {"num_workers", "ray_address", "max_failures"}
"""Flags also spelled with ``_`` (``--num_processes``), as Accelerate's launcher spells its own."""
_FIT_VALUE_FLAGS = {"--num-processes", "--num_processes", "--mixed-precision", "--mixed_precision", "--config-file"}
_FIT_VALUE_FLAGS |= {"--gradient-accumulation-steps", "--gradient_accumulation_steps", "--config_file"}
"""The launch flags whose value the parts help of ``sss fit CONFIG --help`` skips when it looks for CONFIG."""
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.\[\]-]*=")
"""A ``key=value`` word; ``runs/lr=1e-3/model`` (a ``/`` before the ``=``) is a path."""
_SECTIONS = ("name", "trainer", "model", "data", "callbacks")
"""The top-level config keys: ``--trainer.max_steps=5`` is an override, not a flag."""


def version_line() -> str:
    """What ``sss --version`` prints: the versions of sss, torch, accelerate and Python (for bug reports).

    Example:
        >>> version_line().startswith("sss ")
        True
    """
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import sss

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    return (
        f"sss {sss.__version__} (torch {of('torch')}, accelerate {of('accelerate')}, "
        f"python {platform.python_version()})"
    )


class _Version(argparse.Action):
    # Computed when asked for, so that building the parser reads no package metadata.
    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(version_line())
        parser.exit()


def _parser(parts: str = "") -> argparse.ArgumentParser:
    from sss.config import SSSConfig, field_docs

    fields = "\n".join(f"  {key} (default {default})\n      {doc}" for key, default, doc in field_docs(SSSConfig))
    parser = argparse.ArgumentParser(prog="sss", description="Train Shadow & Sound Hunter models (image + audio).")
    parser.add_argument(
        "--traceback", action="store_true", help="show the full traceback of an error, not one line (or SSS_DEBUG=1)"
    )
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        default=argparse.SUPPRESS,
        help="print the sss, torch and accelerate versions",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    overrides = (
        "overrides: key=value (also --key=value or --key value), anywhere on the line, e.g. trainer.max_steps=100"
    )
    for name, row in COMMANDS.items():
        _add_command(sub, name, row, f"{overrides}\n\nconfig fields:\n{fields}{parts}" if row.fields else overrides)
    return parser


def _add_command(sub: Any, name: str, row: Command, epilog: str) -> None:
    # The subparser of one row: its description and flags' help from the docstring, its flags from the signature.
    from sss.config.help import docstring_args

    about = inspect.cleandoc(row.run.__doc__ or "").split("\n\nArgs:\n")[0]
    if row.words is None:  # no words, no overrides: argparse's own positionals and usage
        p = sub.add_parser(name, help=about, description=about)
    else:
        style = {"usage": row.usage, "epilog": epilog, "formatter_class": argparse.RawDescriptionHelpFormatter}
        p = sub.add_parser(name, help=about.splitlines()[0], description=about, **style)
        p.add_argument("words", nargs="*", metavar=row.metavar, help=row.words_help)
    helps, hints, groups = docstring_args(row.run.__doc__), typing.get_type_hints(row.run), {}
    taken = {word.rstrip("?") for word in row.words or ()} | {"overrides"}
    for param in inspect.signature(row.run).parameters.values():
        if param.name in taken:
            continue
        title = next((title for title, names in row.groups.items() if param.name in names), None)
        if title is not None and title not in groups:
            groups[title] = p.add_argument_group(title)
        names, settings = _argument(param, hints[param.name], positional=row.words is None)
        settings |= row.options.get(param.name, {})
        if param.name in helps:
            settings["help"] = helps[param.name]
        groups.get(title, p).add_argument(*names, **settings)


def _argument(param: inspect.Parameter, hint: Any, positional: bool) -> tuple[list[str], dict[str, Any]]:
    """An argparse argument's names and settings from a typed parameter: ``--flag-name`` (or a positional),
    ``bool`` a switch, ``int``/``float`` its type, ``Literal`` its choices, no default required."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # `X | None`: an X or not given
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    settings: dict[str, Any] = {}
    if typing.get_origin(hint) is Literal:
        settings["choices"] = list(typing.get_args(hint))
    elif hint in (int, float):
        settings["type"] = hint
    if positional and param.default is param.empty:
        return [param.name], settings
    names = [f"--{param.name.replace('_', '-')}", *([f"--{param.name}"] if param.name in _UNDERSCORED else [])]
    if hint is bool:
        return names, {"action": "store_true"}
    if param.default is param.empty:
        return names, {**settings, "required": True}
    return names, {**settings, "default": param.default}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``sss`` console script.

    Errors end as one line on stderr and an exit code (2: configuration, 1: while running, 130:
    Ctrl-C); ``sss --traceback ...`` or ``SSS_DEBUG=1`` shows the full traceback instead. While a
    command runs, the working directory is on ``sys.path`` (first, as ``python -m`` puts it), so
    that a ``_target_: mymodule.MyModel`` next to the YAML imports; ``python -P`` or
    ``PYTHONSAFEPATH=1`` leaves it off.

    Example:
        >>> main(["fit", "missing.yaml"])
        2
    """
    # MKL may take another floating-point path in a fresh process, breaking bitwise resume and
    # 1-vs-N-process parity (seen here: 4 of 75 fresh processes); it must be set before torch loads MKL.
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    argv = _flag_overrides(list(sys.argv[1:] if argv is None else argv))
    with _working_directory_importable():
        parser = _parser(_parts_help(argv))  # the parts of `sss fit CONFIG --help` may be the user's own modules
        namespace, extra = parser.parse_known_args(argv)
        args = vars(namespace)
        traceback = args.pop("traceback") or os.environ.get("SSS_DEBUG", "") not in ("", "0")
        name = args.pop("command")
        _gather_words(parser, name, args, extra)
        RUN.clear()
        RUN.update(argv=argv, traceback=traceback)  # for the processes a launch starts (sss.run.launch.relaunch)
        try:
            check_flags(args)
            return COMMANDS[name].run(**args)
        except BaseException as exc:
            launched = os.environ.get("SSS_RANK_ERRORS")  # a rank sss launched: `sys.exit("error: ...")` is a line too
            if traceback or (isinstance(exc, SystemExit) and not (launched and isinstance(exc.code, str))):
                raise
            return _report(exc)


def _report(exc: BaseException) -> int:
    # One line on stderr (or, in a rank sss launched, for its launcher to print once) and the exit code.
    from sss.run.launch import record_rank_error

    cfg = RUN.get("config")
    message, code = (str(exc.code), 1) if isinstance(exc, SystemExit) else explain_error(exc, cfg)
    if record_rank_error(redact_urls(message), code, exc, cfg.trainer.output_dir if cfg else None):
        return code  # the launcher prints the line of the rank that failed first, once
    print(redact_urls(message), file=sys.stderr, flush=True)  # no URL's password on a terminal
    return code


@contextlib.contextmanager
def _working_directory_importable() -> Iterator[None]:
    # `python -m sss` puts the working directory first on sys.path; the console script puts its own
    # bin folder there instead, and `_target_: mymodule.MyModel` beside the YAML would not import.
    # Taken off again afterwards, for callers of main() in a long-lived process (tests, notebooks).
    cwd = os.getcwd()
    add = not getattr(sys.flags, "safe_path", False) and not any(os.path.abspath(p or ".") == cwd for p in sys.path)
    if add:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if add and cwd in sys.path:
            sys.path.remove(cwd)


def _flag_overrides(argv: list[str]) -> list[str]:
    # `--trainer.max_steps=5` and `--trainer.max_steps 5` (Lightning CLI's spelling) become
    # `trainer.max_steps=5`, after a command that takes overrides; flags of sss itself never start
    # with a config section's name.
    command = next((i for i, word in enumerate(argv) if not word.startswith("-")), None)
    row = None if command is None else COMMANDS.get(argv[command])
    if row is None or row.words is None:  # no command yet, or one that takes no overrides
        return argv
    out, i = argv[: command + 1], command + 1
    while i < len(argv):
        word = argv[i]
        key = word[2:].split("=", 1)[0]
        if not word.startswith("--") or re.split(r"[.\[]", key, maxsplit=1)[0] not in _SECTIONS:
            out.append(word)
        elif "=" in word:
            out.append(word[2:])
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append(f"{key}={argv[i + 1]}")
            i += 1
        else:
            out.append(key)  # no value: load_config asks for key=value
        i += 1
    return out


def _gather_words(parser: argparse.ArgumentParser, command: str, args: dict[str, Any], extra: list[str]) -> None:
    """Sort the command's words into its positional arguments (`Command.words`) and ``key=value`` overrides."""
    # argparse collects positionals up to the first flag and leaves the later ones in `extra`, in order.
    row = COMMANDS[command]
    if row.words is None:
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return
    first = args.pop("words")
    flags = [word for word in extra if word.startswith("-")]
    if flags:
        parser.error(f"unrecognized arguments: {' '.join(flags)}")
    resume = args.get("resume")
    if isinstance(resume, str) and _OVERRIDE.match(resume):  # `--resume trainer.max_steps=70`: the latest checkpoint
        first, args["resume"] = [*first, resume], "latest"
    words = [*first, *extra]
    overrides = [word for word in words if _OVERRIDE.match(word)]
    plain = [word for word in words if not _OVERRIDE.match(word)]
    if not plain and isinstance(resume, str) and resume.endswith((".yaml", ".yml")) and Path(resume).is_file():
        plain, args["resume"] = [resume], "latest"  # `sss fit --resume my.yaml`: the config, resuming the latest
    required = [name for name in row.words if not name.endswith("?")]
    if len(plain) < len(required):
        missing = required[len(plain) :]
        parser.error(f"missing {' '.join(n.upper() for n in missing)} (usage: {row.usage})")
    given = list(row.words) if len(plain) >= len(row.words) else required  # the optional ones are the ones left out
    for name in row.words:
        args[name.rstrip("?")] = None
    for name, word in zip(given, plain, strict=False):
        args[name.rstrip("?")] = word
    # A word too many is an override without "=": load_config refuses it with the key=value advice.
    args["overrides"] = overrides + plain[len(given) :]


def _parts_help(argv: list[str]) -> str:
    # `sss fit|pretrain CONFIG --help` adds the arguments of CONFIG's model and data module to the help (their
    # signatures and docstrings): what model.KEY=VALUE and data.KEY=VALUE can set.
    if len(argv) < 2 or argv[0] not in ("fit", "pretrain") or not {"-h", "--help"} & set(argv):
        return ""
    words = [w for i, w in enumerate(argv[1:], 1) if not w.startswith("-") and argv[i - 1] not in _FIT_VALUE_FLAGS]
    config = next((w for w in words if not _OVERRIDE.match(w)), None)
    if config is None or not Path(config).is_file():
        return ""
    from sss.config.help import parts_help

    return parts_help(config, [w for w in words if _OVERRIDE.match(w)], _model_class)


def _model_class(name: str) -> type | None:
    # The class a `create_model` entrypoint builds for `model.name`: imported only when a config names one.
    from sss.models.registry import model_class

    return model_class(name)


if __name__ == "__main__":
    raise SystemExit(main())
