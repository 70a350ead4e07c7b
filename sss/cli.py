"""The ``sss`` command: a table of subcommands, each a plain typed function.

Heavy modules (torch, accelerate) are imported inside the commands, so ``sss --help`` is instant.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_CONFIG = 2


def fit(
    config: str,
    overrides: list[str],
    resume: str | None = None,
    num_processes: int | None = None,
    mixed_precision: str | None = None,
    gradient_accumulation_steps: int | None = None,
    config_file: str | None = None,
    debug: bool = False,
) -> int:
    """Train the model of CONFIG; print a results table and write OUTPUT_DIR/results.json."""
    sources: dict[str, str] = {}
    cfg = _load_checked(config, overrides, sources)  # every check of `sss check`, before any data is read
    if cfg is None:
        return EXIT_CONFIG
    _RUN["config"] = cfg  # its output folder, for the message of a full disk or a Ctrl-C
    flags = {
        "num_processes": num_processes,
        "mixed_precision": mixed_precision,
        "gradient_accumulation_steps": gradient_accumulation_steps,
    }
    from sss.config import ConfigError
    from sss.run.launch import apply_launch_settings, relaunch

    try:
        processes = apply_launch_settings(cfg, sources, flags, config_file, debug)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a value of Accelerate's config file that is no number, say
        raise ConfigError(f"{config_file or 'the Accelerate config file'}: {exc}") from exc
    if processes > 1 and "LOCAL_RANK" not in os.environ:
        resolved = [
            f"trainer.mixed_precision={cfg.trainer.mixed_precision}",
            f"trainer.gradient_accumulation_steps={cfg.trainer.gradient_accumulation_steps}",
        ]
        extra = (["--resume", resume] if resume else []) + (["--debug"] if debug else [])
        return relaunch(processes, ["fit", config, *overrides, *resolved, *extra])
    from sss.run.fit import run_fit

    run_fit(cfg, resume=resume)  # its errors become one line and an exit code in main()
    return 0


def validate(
    config: str,
    overrides: list[str],
    ckpt: str,
    output: str | None = None,
    no_ablation: bool = False,
    num_processes: int | None = None,
) -> int:
    """Evaluate CKPT (a checkpoint or model folder) on the validation split: a table and a metrics JSON file."""
    return _evaluate("val", config, overrides, ckpt, output, no_ablation, num_processes)


def test(
    config: str,
    overrides: list[str],
    ckpt: str,
    output: str | None = None,
    no_ablation: bool = False,
    num_processes: int | None = None,
) -> int:
    """Evaluate CKPT (a checkpoint or model folder) on the test split: a table and a metrics JSON file."""
    return _evaluate("test", config, overrides, ckpt, output, no_ablation, num_processes)


def _evaluate(
    split: str,
    config: str,
    overrides: list[str],
    ckpt: str,
    output: str | None,
    no_ablation: bool,
    processes: int | None,
) -> int:
    from sss.run.evaluate import check_output
    from sss.run.launch import relaunch

    if output is not None and "LOCAL_RANK" not in os.environ:
        check_output(output)
    if processes and processes > 1 and "LOCAL_RANK" not in os.environ:
        extra = (["--output", output] if output else []) + (["--no-ablation"] if no_ablation else [])
        command = "validate" if split == "val" else "test"
        return relaunch(processes, [command, config, *overrides, "--ckpt", ckpt, *extra])
    cfg = _load_checked(config, overrides)
    if cfg is None:
        return EXIT_CONFIG
    from sss.run.evaluate import run_evaluate

    run_evaluate(cfg, ckpt, split, output, ablation=not no_ablation)
    return 0


def predict(model_dir: str, input: str, output: str, batch_size: int = 32, trust_code: bool = False) -> int:
    """Write per-sample predictions with class probabilities of MODEL_DIR for the rows of a manifest."""
    from sss.run.predict import predict as run_predict

    # A folder naming code outside sss raises UntrustedCodeError (exit 2) before anything is imported.
    path = run_predict(model_dir, input, output, batch_size=batch_size, trust_code=trust_code)
    print(f"wrote {path}")
    return 0


def export(config: str, overrides: list[str], ckpt: str, out: str) -> int:
    """Write the portable model folder (model.safetensors, config.yaml, README.md) of checkpoint CKPT to OUT."""
    cfg = _load_checked(config, overrides)
    if cfg is None:
        return EXIT_CONFIG
    from sss.run.export import export_checkpoint

    folder = export_checkpoint(cfg, ckpt, out)
    print(f"wrote {folder}")
    return 0


def check(config: str, overrides: list[str]) -> int:
    """Validate CONFIG (or a model folder) without building anything; list what its _target_s will call."""
    if Path(config).is_dir():  # a model folder: would sss.load_model / sss predict run code it names?
        from sss.model_folder import check_model_folder

        problems = check_model_folder(config, overrides)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        if not problems:
            print(f"{config}: ok (model folder; it loads without --trust-code: it names only sss's own models)")
        return EXIT_CONFIG if problems else 0
    cfg = _load_checked(config, overrides)
    if cfg is None:
        return EXIT_CONFIG
    from sss.config.instantiate import config_targets

    parts = f"model {cfg.model.get('_target_')}, data {cfg.data.get('_target_')}, output {cfg.trainer.output_dir}"
    print(f"{config}: ok ({parts})")
    print("sss fit imports and calls each _target_ of this config (your config is code, as in Hydra):")
    for key, target in config_targets(cfg):
        print(f"  {key}: {target}")
    return 0


def config(config: str, overrides: list[str]) -> int:
    """Print CONFIG resolved (defaults <- YAML <- overrides) as YAML."""
    from sss.config import load_config, to_yaml

    print(to_yaml(load_config(config, overrides)), end="")
    return 0


def data(
    action: str,
    kind: str,
    out: str,
    n: int = 2000,
    seed: int = 0,
    n_val: int | None = None,
    n_test: int | None = None,
    image_size: int = 64,
    sample_rate: int = 16000,
    clip_seconds: float = 1.0,
) -> int:
    """``sss data make industrial OUT``: write the synthetic industrial dataset (train/val/test) to OUT."""
    if action != "make" or kind != "industrial":
        print("error: the data command knows: sss data make industrial OUT [--n N] [--seed S]", file=sys.stderr)
        return EXIT_CONFIG
    from sss.data import make_industrial

    n_val = max(1, n // 5) if n_val is None else n_val
    n_test = max(1, n // 5) if n_test is None else n_test
    path = make_industrial(
        out,
        n_train=n,
        n_val=n_val,
        n_test=n_test,
        seed=seed,
        image_size=image_size,
        sample_rate=sample_rate,
        clip_seconds=clip_seconds,
    )
    print(f"wrote {path}")
    return 0


COMMANDS: dict[str, Callable[..., int]] = {
    "fit": fit,
    "validate": validate,
    "test": test,
    "check": check,
    "config": config,
    "export": export,
    "predict": predict,
    "data": data,
}


def _load_checked(path: str, overrides: list[str], sources: dict[str, str] | None = None) -> Any:
    # The config loaded and checked without building or reading anything; None when `check_config`
    # printed problems. A `ConfigError` of loading reaches main(), which prints it (exit 2).
    from sss.config import check_config, load_config

    cfg = load_config(path, overrides, sources)
    errors = check_config(cfg)
    for error in errors:
        print(f"error: {path}: {error}", file=sys.stderr)
    return None if errors else cfg


def _parser() -> argparse.ArgumentParser:
    from sss.config import SSSConfig, field_docs

    fields = "\n".join(f"  {key} (default {default})\n      {doc}" for key, default, doc in field_docs(SSSConfig))
    parser = argparse.ArgumentParser(prog="sss", description="Train Shadow & Sound Hunter models (image + audio).")
    parser.add_argument(
        "--traceback", action="store_true", help="show the full traceback of an error, not one line (or SSS_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    epilog = f"overrides are key=value pairs, e.g. trainer.max_steps=100\n\nconfig fields:\n{fields}"
    for name in ("fit", "check", "config"):
        p = sub.add_parser(
            name,
            help=COMMANDS[name].__doc__,
            description=COMMANDS[name].__doc__,
            epilog=epilog if name == "fit" else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument(
            "config",
            help="YAML config file, e.g. examples/industrial.yaml"
            + (", or a model folder (would loading it run code?)" if name == "check" else ""),
        )
        p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.max_steps=100")
        if name == "fit":
            _add_fit_flags(p)
    for name in ("validate", "test"):
        p = sub.add_parser(name, help=COMMANDS[name].__doc__, description=COMMANDS[name].__doc__)
        p.add_argument("config", help="the YAML config the model was trained with")
        p.add_argument("overrides", nargs="*", help="key=value overrides used in training")
        p.add_argument("--ckpt", required=True, help="checkpoint folder (run/checkpoints/step_N) or model folder")
        p.add_argument("--output", default=None, help="JSON file (default: <run folder>/eval/<split>_<ckpt>.json)")
        p.add_argument("--no-ablation", action="store_true", help="skip the image-only and audio-only passes")
        p.add_argument("--num-processes", "--num_processes", type=int, default=None, help="evaluate in N processes")
    p = sub.add_parser("export", help=export.__doc__, description=export.__doc__)
    p.add_argument("config", help="the YAML config the checkpoint was trained with")
    p.add_argument("out", help="output folder (must not exist or be empty)")
    p.add_argument("overrides", nargs="*", help="key=value overrides used in training")
    p.add_argument("--ckpt", required=True, help="checkpoint folder, e.g. runs/industrial/checkpoints/step_0000375")
    p = sub.add_parser("predict", help=predict.__doc__, description=predict.__doc__)
    p.add_argument("model_dir", help="a model folder (OUTPUT_DIR/model, or one written by sss export)")
    p.add_argument("--input", required=True, help="manifest CSV/JSONL with image and/or audio columns")
    p.add_argument("--output", required=True, help="CSV to write (must not exist)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--trust-code",
        action="store_true",
        help="build a model whose config.yaml names code outside sss (imports and runs it: trusted folders only)",
    )
    p = sub.add_parser("data", help=data.__doc__, description=data.__doc__)
    p.add_argument("action", choices=["make"])
    p.add_argument("kind", choices=["industrial"])
    p.add_argument("out", help="output folder")
    p.add_argument("--n", type=int, default=2000, help="training samples")
    p.add_argument("--n-val", type=int, default=None, help="validation samples (default n/5)")
    p.add_argument("--n-test", type=int, default=None, help="test samples (default n/5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-size", type=int, default=64, help="image side in pixels")
    p.add_argument("--sample-rate", type=int, default=16000, help="audio sample rate in Hz")
    p.add_argument("--clip-seconds", type=float, default=1.0, help="audio clip length")
    return parser


def _add_fit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        help="resume the latest complete checkpoint in OUTPUT_DIR, or the one at PATH",
    )
    launch = p.add_argument_group(
        "launch flags (highest precedence: flag > sss YAML/override > Accelerate config file > default)"
    )
    launch.add_argument("--num-processes", "--num_processes", type=int, default=None, help="launch N processes")
    launch.add_argument("--mixed-precision", "--mixed_precision", choices=["auto", "no", "fp16", "bf16"], default=None)
    launch.add_argument("--gradient-accumulation-steps", "--gradient_accumulation_steps", type=int, default=None)
    launch.add_argument(
        "--config-file",
        "--config_file",
        default=None,
        help="Accelerate config file (default: the one `accelerate config` wrote, if any)",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="2 batches of training and validation in fp32, shapes printed, anomaly detection",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``sss`` console script.

    Errors end as one line on stderr and an exit code (2: configuration, 1: while running, 130:
    Ctrl-C); ``sss --traceback ...`` or ``SSS_DEBUG=1`` shows the full traceback instead.

    Example:
        >>> main(["fit", "missing.yaml"])
        2
    """
    # MKL may take another floating-point path in a fresh process, breaking bitwise resume and
    # 1-vs-N-process parity (seen here: 4 of 75 fresh processes); it must be set before torch loads MKL.
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    parser = _parser()
    namespace, extra = parser.parse_known_args(argv)
    args = vars(namespace)
    traceback = args.pop("traceback") or os.environ.get("SSS_DEBUG", "") not in ("", "0")
    command = COMMANDS[args.pop("command")]
    _gather_overrides(parser, args, extra)
    _RUN.clear()
    try:
        _check_flags(args)
        return command(**args)
    except BaseException as exc:
        if traceback or isinstance(exc, SystemExit):
            raise
        message, code = explain_error(exc)
        print(message, file=sys.stderr, flush=True)
        return code


_RUN: dict[str, Any] = {}
"""What the running command works on (``"config"``: the run's config), for the error messages."""


def _gather_overrides(parser: argparse.ArgumentParser, args: dict[str, Any], extra: list[str]) -> None:
    # argparse stops collecting positionals at the first flag, and `--resume` takes the next word:
    # `sss fit C --resume trainer.max_steps=70 a=1` has two overrides, and a value with `=` is never a path.
    overrides = args.get("overrides")
    if isinstance(args.get("resume"), str) and "=" in args["resume"] and overrides is not None:
        overrides.append(args["resume"])
        args["resume"] = "latest"
    unknown = [item for item in extra if item.startswith("-") or "=" not in item or overrides is None]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if overrides is not None:
        overrides.extend(extra)


def _check_flags(args: dict[str, Any]) -> None:
    from sss.config import ConfigError

    for name in ("num_processes", "gradient_accumulation_steps"):
        value = args.get(name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


# ------------------------------------------------------------------ errors -> one line and an exit code
LOW_DISK = 1 << 30
"""Free bytes under which a failed write counts as a full disk (torch.save's errors do not say why)."""
# What torch.save and safetensors raise when a write fails (a full disk among other causes).
_WRITE_FAILED = re.compile(r"unexpected pos|PytorchStreamWriter failed|file write failed", re.IGNORECASE)
_NO_SPACE = re.compile(r"No space left on device|StorageFull|Disk quota exceeded", re.IGNORECASE)


def explain_error(exc: BaseException) -> tuple[str, int]:
    """The line `main` prints for `exc`, and the exit code: the first row of `ERRORS` that matches.

    Example:
        >>> import errno
        >>> explain_error(PermissionError(errno.EACCES, "Permission denied", "/srv/runs"))  # doctest: +ELLIPSIS
        ('error: permission denied: /srv/runs; ...', 1)
        >>> explain_error(KeyError("x"))  # doctest: +ELLIPSIS
        ("error: KeyError: 'x' (unexpected: `sss --traceback ...` shows where it happened)", 1)
    """
    for matches, message in ERRORS:
        if matches(exc):
            return message(exc)
    raise AssertionError("the last row of ERRORS matches everything")  # pragma: no cover


def _instance_of(module: str, name: str) -> Callable[[BaseException], bool]:
    # Matching without importing: an instance of the class exists only if its module was loaded,
    # so a config error does not pay for importing torch to be reported.
    def matches(exc: BaseException) -> bool:
        cls = getattr(sys.modules.get(module), name, None)
        return cls is not None and isinstance(exc, cls)

    return matches


def _is_sss_error(exc: BaseException) -> bool:
    from sss.errors import SSSError

    # sss.checkpoint's errors (an unsafe or damaged checkpoint, a folder in use) name the folder and the fix.
    return isinstance(exc, SSSError) or (isinstance(exc, Exception) and type(exc).__module__ == "sss.checkpoint")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return seen


def _out_of_space(exc: BaseException) -> bool:
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if _NO_SPACE.search(str(link)):
            return True
        if isinstance(link, RuntimeError) and _WRITE_FAILED.search(str(link)):
            return _free_bytes(_write_target(exc)) < LOW_DISK
    return False


def _write_target(exc: BaseException) -> Path:
    for link in _chain(exc):
        if isinstance(link, OSError) and link.filename:
            return Path(os.fsdecode(link.filename))
    cfg = _RUN.get("config")
    return Path(cfg.trainer.output_dir) if cfg is not None and cfg.trainer.output_dir else Path.cwd()


def _free_bytes(path: Path) -> int:
    for folder in (path, *path.absolute().parents):  # the nearest folder that exists (the output may not yet)
        if folder.exists():
            return shutil.disk_usage(folder).free
    return shutil.disk_usage(Path.cwd()).free


def _disk_full(exc: BaseException) -> tuple[str, int]:
    path = _write_target(exc)
    free = _free_bytes(path) // 2**20
    return f"error: disk full at {path}, {free} MB free; {_after_write_failure()}", 1


def _after_write_failure() -> str:
    if "config" not in _RUN:
        return "free some space and run the command again"
    # Checkpoints are written as step_N.tmp and renamed when complete; the next start removes the leftover.
    return "the previous checkpoint is intact: free some space, then continue with `sss fit CONFIG --resume`"


def _write_failed(exc: BaseException) -> tuple[str, int]:
    path = _write_target(exc)
    free = _free_bytes(path) // 2**20
    reason = str(exc).strip().splitlines()[0]
    return (
        f"error: writing to {path} failed ({reason}) with {free} MB free there (a quota, a network file system "
        f"or a failing disk?); {_after_write_failure()}",
        1,
    )


def _not_allowed(exc: BaseException) -> tuple[str, int]:
    assert isinstance(exc, OSError)
    path = Path(os.fsdecode(exc.filename)) if exc.filename else Path.cwd()
    head = f"{path} is on a read-only file system" if exc.errno == errno.EROFS else f"permission denied: {path}"
    cfg = _RUN.get("config")
    out = Path(cfg.trainer.output_dir).absolute() if cfg is not None and cfg.trainer.output_dir else None
    target = path.absolute()
    # The output folder, a file in it, or a folder above it that had to be created.
    if out is not None and (target == out or out in target.parents or target in out.parents):
        fix = "choose a writable output folder (trainer.output_dir=PATH), or make this one writable for this user"
    else:
        fix = "make it readable and writable for this user (chmod, chown), or use another path"
    return f"error: {head}; {fix}", 1


def _interrupted(exc: BaseException) -> tuple[str, int]:
    cfg = _RUN.get("config")
    folder = Path(cfg.trainer.output_dir) / "checkpoints" if cfg is not None else None
    saved = folder is not None and folder.is_dir() and any(p.name[-4:] != ".tmp" for p in folder.glob("step_*"))
    if not saved:
        return "sss: interrupted (Ctrl-C)" + (", before any checkpoint was saved" if folder else ""), 130
    return (
        f"sss: interrupted (Ctrl-C): stopped at once, without saving; the checkpoints in {folder} are "
        "intact: `sss fit CONFIG --resume` continues from the newest",
        130,
    )


def _unexpected(exc: BaseException) -> tuple[str, int]:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"error: {type(exc).__name__}: {first} (unexpected: `sss --traceback ...` shows where it happened)", 1


def _is_os(*codes: int) -> Callable[[BaseException], bool]:
    return lambda exc: isinstance(exc, OSError) and exc.errno in codes


ERRORS: list[tuple[Callable[[BaseException], bool], Callable[[BaseException], tuple[str, int]]]] = [
    (lambda exc: isinstance(exc, KeyboardInterrupt), _interrupted),  # a second Ctrl-C: the first one saves
    # SIGTERM/SIGINT after saving a checkpoint: the shell's 128 + signal number
    (_instance_of("sss.callbacks.checkpoint", "Preempted"), lambda exc: (f"sss: {exc}", 128 + exc.signum)),
    (_out_of_space, _disk_full),
    (_is_sss_error, lambda exc: (f"error: {exc}", getattr(exc, "exit_code", 1))),
    (_is_os(errno.EROFS, errno.EACCES, errno.EPERM), _not_allowed),
    (lambda exc: isinstance(exc, RuntimeError) and bool(_WRITE_FAILED.search(str(exc))), _write_failed),
    # sss raises these with a message naming the path and the fix; the OS's own name the path too
    (lambda exc: isinstance(exc, (OSError, RuntimeError)), lambda exc: (f"error: {exc}", 1)),
    (lambda exc: True, _unexpected),
]
"""``(matches, message)`` rows, first match wins: how `main` turns an exception into a line and an exit code."""


if __name__ == "__main__":
    raise SystemExit(main())
