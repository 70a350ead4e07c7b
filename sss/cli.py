"""The ``sss`` command: a table of subcommands, each a plain typed function.

Heavy modules (torch, accelerate) are imported inside the commands, so ``sss --help`` is instant.
Overrides (``key=value``, also ``--key=value`` and ``--key value``) go anywhere on the line; the
working directory is importable for ``_target_`` (as under ``python -m``).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sss._redact import redact_urls

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
    profile: bool = False,
    engine: str = "accelerate",
    num_workers: int | None = None,
    ray_address: str | None = None,
    max_failures: int | None = None,
) -> int:
    """Train the model of CONFIG; print a results table and write OUTPUT_DIR/results.json."""
    sources: dict[str, str] = {}
    cfg = _load_checked(config, overrides, sources)  # every check of `sss check`, before any data is read
    if cfg is None:
        return EXIT_CONFIG
    _RUN["config"] = cfg  # its output folder, for the message of a full disk or a Ctrl-C
    if cfg.trainer.deterministic:  # cuBLAS reads it once, at its first call: before anything touches CUDA
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    flags = {
        "num_processes": num_processes,
        "mixed_precision": mixed_precision,
        "gradient_accumulation_steps": gradient_accumulation_steps,
    }
    from sss.config import ConfigError
    from sss.run.launch import Rerun, apply_launch_settings, relaunch

    try:
        processes = apply_launch_settings(cfg, sources, flags, config_file, debug)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a value of Accelerate's config file that is no number, say
        raise ConfigError(f"{config_file or 'the Accelerate config file'}: {exc}") from exc
    if profile:  # a short torch.profiler window: a trace, TensorBoard's profile files and a summary
        cfg.callbacks = [*cfg.callbacks, {"_target_": "sss.callbacks.Profiler"}]
    if engine == "ray":  # Ray Train's workers run this same fit; Ray, not the process count above, starts them
        from sss.run.ray_train import fit_with_ray

        assert num_workers is not None  # _check_engine_flags asked for it
        fit_with_ray(cfg, num_workers, address=ray_address, max_failures=max_failures or 0, resume=resume)
        return 0
    if processes > 1 and "LOCAL_RANK" not in os.environ:
        resolved = [
            f"trainer.mixed_precision={cfg.trainer.mixed_precision}",
            f"trainer.gradient_accumulation_steps={cfg.trainer.gradient_accumulation_steps}",
        ]
        extra = (["--resume", resume] if resume else []) + (["--debug"] if debug else [])
        extra += ["--profile"] if profile else []
        words = _RUN.get("argv", ["fit", config, *overrides])
        rerun = Rerun.of(cfg.trainer.output_dir, words)  # for a rank lost to a signal: how to continue
        return relaunch(processes, ["fit", config, *overrides, *resolved, *extra], _RUN.get("traceback", False), rerun)
    from sss.run.fit import run_fit

    run_fit(cfg, resume=resume)  # its errors become one line and an exit code in main()
    return 0


def validate(
    config: str | None,
    overrides: list[str],
    ckpt: str,
    output: str | None = None,
    no_ablation: bool = False,
    num_processes: int | None = None,
    trust_code: bool = False,
) -> int:
    """Evaluate CKPT (a checkpoint or model folder) on the validation split: a table and a metrics JSON file.

    Without CONFIG, the config stored with CKPT is used (a checkpoint's trainer_state.json, a model
    folder's config.yaml), with the overrides merged over it.
    """
    return _evaluate("val", config, overrides, ckpt, output, no_ablation, num_processes, trust_code)


def test(
    config: str | None,
    overrides: list[str],
    ckpt: str,
    output: str | None = None,
    no_ablation: bool = False,
    num_processes: int | None = None,
    trust_code: bool = False,
) -> int:
    """Evaluate CKPT (a checkpoint or model folder) on the test split: a table and a metrics JSON file.

    Without CONFIG, the config stored with CKPT is used (a checkpoint's trainer_state.json, a model
    folder's config.yaml), with the overrides merged over it.
    """
    return _evaluate("test", config, overrides, ckpt, output, no_ablation, num_processes, trust_code)


def _evaluate(
    split: str,
    config: str | None,
    overrides: list[str],
    ckpt: str,
    output: str | None,
    no_ablation: bool,
    processes: int | None,
    trust_code: bool,
) -> int:
    from sss.run.evaluate import check_output
    from sss.run.launch import relaunch

    command = "validate" if split == "val" else "test"
    if output is not None and "LOCAL_RANK" not in os.environ:
        check_output(output)
    if processes and processes > 1 and "LOCAL_RANK" not in os.environ:
        extra = (["--output", output] if output else []) + (["--no-ablation"] if no_ablation else [])
        extra += ["--trust-code"] if trust_code else []
        words = [command, *([config] if config else []), *overrides, "--ckpt", ckpt, *extra]
        return relaunch(processes, words, _RUN.get("traceback", False))
    cfg = _config_for(command, config, overrides, ckpt, trust_code)
    if cfg is None:
        return EXIT_CONFIG
    from sss.run.evaluate import run_evaluate

    run_evaluate(cfg, ckpt, split, output, ablation=not no_ablation)
    return 0


def predict(
    model_dir: str,
    overrides: list[str],
    input: str,
    output: str,
    batch_size: int = 32,
    trust_code: bool = False,
    runtime: str = "torch",
) -> int:
    """Write per-sample predictions with class probabilities of MODEL_DIR for the rows of a manifest.

    Overrides: model.KEY=VALUE rebuilds the folder's model with a changed setting (it must still fit
    the weights); data.allow_outside_root=true accepts manifest paths outside the manifest's folder;
    data.on_error=skip leaves out rows whose files do not read (listed in <output stem>.skipped.csv).
    """
    from sss.run.predict import predict as run_predict

    # A folder naming code outside sss raises UntrustedCodeError (exit 2) before anything is imported.
    path = run_predict(
        model_dir, input, output, batch_size=batch_size, trust_code=trust_code, overrides=overrides, runtime=runtime
    )
    print(f"wrote {path}")
    return 0


def export(
    config: str | None,
    out: str,
    overrides: list[str],
    ckpt: str | None = None,
    trust_code: bool = False,
    format: str = "safetensors",
) -> int:
    """Write the portable model folder (model.safetensors, config.yaml, README.md) of checkpoint CKPT to OUT.

    Without CONFIG, the config stored in the checkpoint (trainer_state.json) is used, with the overrides merged over it.
    --format onnx adds model.onnx (onnxruntime; docs/deploy.md); so does `sss export MODEL_DIR OUT --format onnx`.
    """
    from sss.config import ConfigError

    if ckpt is None:  # sss export MODEL_DIR OUT --format onnx: the ONNX folder of a model folder
        if config is None or not Path(config).is_dir() or format != "onnx" or overrides:
            raise ConfigError(
                "sss export needs --ckpt PATH (sss export [CONFIG] OUT --ckpt PATH [--format onnx]), or a model "
                "folder and --format onnx without overrides (sss export MODEL_DIR OUT --format onnx)"
            )
        from sss.model_folder import export_onnx

        print(f"wrote {export_onnx(config, out, trust_code=trust_code)}")
        return 0
    if Path(out).is_file() or Path(out).suffix in (".yaml", ".yml"):
        raise ConfigError(
            f"sss export: OUT {out} looks like a config file, not the folder to write: "
            "sss export [CONFIG] OUT --ckpt PATH"
        )
    cfg = _config_for("export", config, overrides, ckpt, trust_code)
    if cfg is None:
        return EXIT_CONFIG
    from sss.run.export import export_checkpoint

    folder = export_checkpoint(cfg, ckpt, out, format=format)
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
            print(
                f"{config}: ok (model folder; it loads without --trust-code: it names only sss's own models; its "
                "config is read as data: no ${...} resolved, no file outside the folder opened)"
            )
        return EXIT_CONFIG if problems else 0
    cfg = _load_checked(config, overrides)
    if cfg is None:
        return EXIT_CONFIG
    from sss.config.instantiate import config_targets

    output, _ = planned_output_dir(cfg)
    parts = f"model {cfg.model.get('_target_')}, data {cfg.data.get('_target_')}, output {output}"
    print(f"{config}: ok ({parts})")
    print("sss fit imports and calls each _target_ of this config (your config is code, as in Hydra):")
    for key, target in config_targets(cfg):
        print(f"  {key}: {target}")
    return 0


def config(config: str, overrides: list[str]) -> int:
    """Print CONFIG resolved (defaults <- YAML <- overrides) as YAML, with the output folder a fresh sss fit uses."""
    from sss.config import load_config, to_yaml

    cfg = load_config(config, overrides)
    cfg.trainer.output_dir, taken = planned_output_dir(cfg)
    if taken:
        print(f"# trainer.output_dir: {taken} holds a run, so a fresh `sss fit` writes to {cfg.trainer.output_dir}")
    print(to_yaml(cfg), end="")
    return 0


def planned_output_dir(cfg: Any) -> tuple[str, str | None]:
    """The folder a fresh ``sss fit`` of `cfg` writes to, and the default folder it moved on from (or None).

    A given ``trainer.output_dir`` is used as it is; the default ``runs/<name>`` moves on to
    ``runs/<name>_1``, ``_2``, ... while the folder holds a run (results, checkpoints, or a live
    run's lock), as ``sss.run.fit`` decides when it claims the folder.

    Example:
        >>> from sss.config import load_config
        >>> planned_output_dir(load_config(None, ["name=nothing_here_yet"]))
        ('runs/nothing_here_yet', None)
    """
    chosen = cfg.trainer.output_dir
    numbered = chosen == f"runs/{cfg.name}" if cfg.output_dir_given is None else not cfg.output_dir_given
    if not numbered or not Path(chosen).exists():  # nothing to look at: no need to import the checkpoint module
        return chosen, None
    from sss.checkpoint import holds_run

    default, n = chosen, 0
    while holds_run(Path(chosen)):
        n += 1
        chosen = f"{default}_{n}"
    return chosen, (default if n else None)


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
    task: str = "default",
) -> int:
    """``sss data make industrial OUT``: write the synthetic industrial dataset (train/val/test) to OUT."""
    if action != "make" or kind != "industrial":
        print("error: the data command knows: sss data make industrial OUT [--n N] [--seed S]", file=sys.stderr)
        return EXIT_CONFIG
    n_val = max(1, n // 5) if n_val is None else n_val
    n_test = max(1, n // 5) if n_test is None else n_test
    # The generator's own limits, said with the flags' names (it says n_train, which no flag is called).
    limits = [
        ("--n", n, n >= 1, "at least 1"),
        ("--n-val", n_val, n_val >= 0, "0 or more"),
        ("--n-test", n_test, n_test >= 0, "0 or more"),
        ("--image-size", image_size, image_size >= 16, "at least 16 (pixels)"),
        ("--sample-rate", sample_rate, sample_rate >= 16000, "at least 16000 (the sounds reach 7 kHz)"),
        ("--clip-seconds", clip_seconds, clip_seconds >= 0.5, "at least 0.5 (room for a transient)"),
    ]
    for flag, value, ok, need in limits:
        if not ok:
            print(f"error: sss data make {flag} {value}: must be {need}", file=sys.stderr)
            return EXIT_CONFIG
    from sss.data import make_industrial

    path = make_industrial(
        out,
        n_train=n,
        n_val=n_val,
        n_test=n_test,
        seed=seed,
        image_size=image_size,
        sample_rate=sample_rate,
        clip_seconds=clip_seconds,
        task=task,
    )
    print(f"wrote {path}")
    return 0


def tune(
    what: str,
    config: str,
    overrides: list[str],
    steps: int = 100,
    min_lr: float = 1e-7,
    max_lr: float = 1.0,
    apply: bool = False,
    num_processes: int | None = None,
    mixed_precision: str | None = None,
    gradient_accumulation_steps: int | None = None,
    config_file: str | None = None,
) -> int:
    """``sss tune lr CONFIG``: the LR range test on a copy of the run; prints the suggested lr and a curve.

    The LR grows geometrically from --min-lr to --max-lr over --steps optimizer steps of the run's own
    data (cycled when shorter), stopping once the loss diverges; the suggestion is the LR of the
    steepest loss descent. Writes OUTPUT_DIR/tune/lr_find.png and lr_find.json (numbered on, never
    over a file). --apply prints the ready `sss fit` command line with the suggestion; the YAML is not edited.
    """
    if what != "lr":
        print("error: the tune command knows: sss tune lr CONFIG [key=value ...]", file=sys.stderr)
        return EXIT_CONFIG
    sources: dict[str, str] = {}
    cfg = _load_checked(config, overrides, sources)
    if cfg is None:
        return EXIT_CONFIG
    from sss.run.launch import apply_launch_settings, relaunch

    flags = {
        "num_processes": num_processes,
        "mixed_precision": mixed_precision,
        "gradient_accumulation_steps": gradient_accumulation_steps,
    }
    processes = apply_launch_settings(cfg, sources, flags, config_file, debug=False)
    if processes > 1 and "LOCAL_RANK" not in os.environ:
        resolved = [
            f"trainer.mixed_precision={cfg.trainer.mixed_precision}",
            f"trainer.gradient_accumulation_steps={cfg.trainer.gradient_accumulation_steps}",
        ]
        ranges = ["--steps", str(steps), "--min-lr", str(min_lr), "--max-lr", str(max_lr)]
        words = ["tune", "lr", config, *overrides, *resolved, *ranges, *(["--apply"] * apply)]
        return relaunch(processes, words, _RUN.get("traceback", False))
    from sss.run.tune import LR_KEY, lr_find, sparkline, write_result

    result = lr_find(cfg, steps=steps, min_lr=min_lr, max_lr=max_lr)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    json_path, png_path = write_result(result, Path(cfg.trainer.output_dir) / "tune")
    print(f"lr range test: {len(result.lrs)} steps, lr {result.lrs[0]:.2e} .. {result.lrs[-1]:.2e}")
    print(f"  {result.lrs[0]:.0e} {sparkline(result.lrs, result.losses)} {result.lrs[-1]:.0e}")
    print(f"curve: {png_path} and {json_path}")
    if result.suggestion is None:
        print("no suggestion: " + " ".join(result.notes), file=sys.stderr)
        return 1
    override = f"{LR_KEY}={result.suggestion:.2e}"
    print(f"suggested lr: {result.suggestion:.2e} (steepest descent of the smoothed loss); use {override}")
    if apply:
        kept = [o for o in overrides if not o.startswith(f"{LR_KEY}=")]
        print("sss fit " + " ".join([config, *kept, override]))
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
    "tune": tune,
}

POSITIONALS: dict[str, tuple[str, ...]] = {
    "fit": ("config",),
    "check": ("config",),
    "config": ("config",),
    "validate": ("config?",),
    "test": ("config?",),
    "export": ("config?", "out"),
    "predict": ("model_dir",),
    "tune": ("what", "config"),
}
"""The words (not ``key=value``) each command takes, in order; ``?``: may be left out (then it is None).
Every other word with ``=`` is an override; the commands not listed take none."""

USAGE = {
    "fit": "sss fit CONFIG [key=value ...] [--resume [PATH]] [--num-processes N] [--debug] [...]",
    "check": "sss check CONFIG|MODEL_DIR [key=value ...]",
    "config": "sss config CONFIG [key=value ...]",
    "validate": "sss validate [CONFIG] --ckpt PATH [key=value ...] [--output FILE] [--no-ablation] [--trust-code]",
    "test": "sss test [CONFIG] --ckpt PATH [key=value ...] [--output FILE] [--no-ablation] [--trust-code]",
    "export": "sss export [CONFIG] OUT --ckpt PATH [key=value ...] [--trust-code] [--format onnx] | "
    "sss export MODEL_DIR OUT --format onnx",
    "predict": "sss predict MODEL_DIR --input MANIFEST --output CSV [model.KEY=VALUE ...] "
    "[data.allow_outside_root=true] [data.on_error=skip] [--trust-code] [--runtime onnx]",
    "tune": "sss tune lr CONFIG [key=value ...] [--steps N] [--min-lr A] [--max-lr B] [--apply] [--num-processes N]",
}

_OVERRIDE = re.compile(r"^[A-Za-z_][\w.\[\]-]*=")
"""A ``key=value`` word; ``runs/lr=1e-3/model`` (a ``/`` before the ``=``) is a path."""
_SECTIONS = ("name", "trainer", "model", "data", "callbacks")
"""The top-level config keys: ``--trainer.max_steps=5`` is an override, not a flag."""


def _config_for(command: str, config: str | None, overrides: list[str], ckpt: str, trust_code: bool) -> Any:
    # CONFIG when given (your own file: trusted, as for sss fit); else the config stored with the
    # checkpoint or model folder, which must pass the model folder's allowlist unless --trust-code.
    if config is not None:
        return _load_checked(config, overrides)
    from sss.run.evaluate import load_stored_config

    cfg = load_stored_config(ckpt, overrides, trust_code=trust_code, command=command)
    return _checked(cfg, str(ckpt))


def _load_checked(path: str, overrides: list[str], sources: dict[str, str] | None = None) -> Any:
    # The config loaded and checked without building or reading anything; None when `check_config`
    # printed problems. A `ConfigError` of loading reaches main(), which prints it (exit 2).
    from sss.config import load_config

    return _checked(load_config(path, overrides, sources), path)


def _checked(cfg: Any, where: str) -> Any:
    from sss.config import check_config

    errors = check_config(cfg)
    for error in errors:
        print(f"error: {where}: {error}", file=sys.stderr)
    return None if errors else cfg


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
    epilog = f"{overrides}\n\nconfig fields:\n{fields}{parts}"
    for name in ("fit", "check", "config"):
        p = _sub(sub, name, epilog if name == "fit" else overrides)
        what = "YAML config file, e.g. examples/industrial.yaml" + (
            ", or a model folder (would loading it run code?)" if name == "check" else ""
        )
        p.add_argument("words", nargs="*", metavar="CONFIG key=value", help=f"CONFIG: {what}; then overrides")
        if name == "fit":
            _add_fit_flags(p)
    stored = "CONFIG: the YAML config it was trained with (default: the one stored with --ckpt); then overrides"
    trust = (
        "build the parts a stored config names outside sss's own models and data modules (imports and runs that "
        "code: trusted folders only); a CONFIG you give is trusted"
    )
    for name in ("validate", "test"):
        p = _sub(sub, name, overrides)
        p.add_argument("words", nargs="*", metavar="[CONFIG] key=value", help=stored)
        p.add_argument("--ckpt", required=True, help="checkpoint folder (run/checkpoints/step_N) or model folder")
        p.add_argument("--output", default=None, help="JSON file (default: <run folder>/eval/<split>_<ckpt>.json)")
        p.add_argument("--no-ablation", action="store_true", help="skip the image-only and audio-only passes")
        p.add_argument("--num-processes", "--num_processes", type=int, default=None, help="evaluate in N processes")
        p.add_argument("--trust-code", action="store_true", help=trust)
    p = _sub(sub, "export", overrides)
    p.add_argument(
        "words", nargs="*", metavar="[CONFIG] OUT key=value", help=f"{stored}; OUT: a new or empty folder to write"
    )
    p.add_argument(
        "--ckpt",
        default=None,
        help="checkpoint folder, e.g. runs/industrial/checkpoints/step_0000375 (not with a MODEL_DIR --format onnx)",
    )
    p.add_argument("--trust-code", action="store_true", help=trust)
    p.add_argument(
        "--format",
        choices=["safetensors", "onnx"],
        default="safetensors",
        help="onnx: also write model.onnx (needs the onnx extra; docs/deploy.md)",
    )
    p = _sub(sub, "predict", overrides)
    p.add_argument(
        "words",
        nargs="*",
        metavar="MODEL_DIR key=value",
        help="MODEL_DIR: a model folder (OUTPUT_DIR/model, or one written by sss export); then overrides",
    )
    p.add_argument("--input", required=True, help="manifest CSV/JSONL with image and/or audio columns")
    p.add_argument("--output", required=True, help="CSV to write (must not exist)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--runtime",
        choices=["torch", "onnx"],
        default="torch",
        help="onnx: run the folder's model.onnx with onnxruntime (sss export ... --format onnx; the onnx extra)",
    )
    p.add_argument(
        "--trust-code",
        action="store_true",
        help="build a model whose config.yaml names code outside sss (imports and runs it: trusted folders only)",
    )
    p = _sub(sub, "tune", overrides)
    p.add_argument("words", nargs="*", metavar="lr CONFIG key=value", help="lr, then CONFIG (YAML), then overrides")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps of the range test (default 100)")
    p.add_argument("--min-lr", "--min_lr", type=float, default=1e-7, help="the first step's LR (default 1e-7)")
    p.add_argument("--max-lr", "--max_lr", type=float, default=1.0, help="the last step's LR (default 1)")
    p.add_argument("--apply", action="store_true", help="print the `sss fit` command line with the suggested lr")
    p.add_argument("--num-processes", "--num_processes", type=int, default=None, help="run in N processes")
    p.add_argument("--mixed-precision", "--mixed_precision", choices=["auto", "no", "fp16", "bf16"], default=None)
    p.add_argument("--gradient-accumulation-steps", "--gradient_accumulation_steps", type=int, default=None)
    p.add_argument("--config-file", "--config_file", default=None, help="Accelerate config file")
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
    p.add_argument(
        "--task",
        choices=["default", "binding"],
        default="default",
        help="binding: match / mismatch, whether a grille shadow's slat angle (0 or 90 degrees) and a sound "
        "(beep or hiss) agree; each modality alone is at chance",
    )
    return parser


def _sub(sub: Any, name: str, epilog: str) -> argparse.ArgumentParser:
    import inspect

    doc = inspect.cleandoc(COMMANDS[name].__doc__ or "")
    return sub.add_parser(
        name,
        help=doc.splitlines()[0],
        description=doc,
        usage=USAGE[name],
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_fit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        help="resume the newest checkpoint in OUTPUT_DIR that verifies (an error when there is none), the one at "
        "PATH, or with `--resume auto` that one or a fresh start when there is none (trainer.resume: auto); "
        "`--resume hub://OWNER/REPO[@REVISION]` downloads the last-checkpoint/ that HubPush pushed there",
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
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile a few optimizer steps with torch.profiler (sss.callbacks.Profiler): a Chrome/Perfetto trace "
        "and TensorBoard profile files in OUTPUT_DIR/profile, and the top operators printed",
    )
    ray = p.add_argument_group("engine (docs/distributed.md#ray-train)")
    ray.add_argument(
        "--engine",
        choices=["accelerate", "ray"],
        default="accelerate",
        help="accelerate: this process, or --num-processes N through Accelerate's launcher (the default); ray: "
        "--num-workers N Ray Train workers, restarted after a failure and continued from OUTPUT_DIR's newest "
        "checkpoint (pip install 'shadow-sound-hunter[ray]')",
    )
    ray.add_argument("--num-workers", "--num_workers", type=int, default=None, help="--engine ray: worker processes")
    ray.add_argument(
        "--ray-address",
        "--ray_address",
        default=None,
        help="--engine ray: a running Ray cluster (auto, host:6379, ray://host:10001); default: a local instance",
    )
    ray.add_argument(
        "--max-failures",
        "--max_failures",
        type=int,
        default=None,
        help="--engine ray: restarts of the worker group after a failure (default 0; -1: no limit)",
    )


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
        command = COMMANDS[name]
        _gather_words(parser, name, args, extra)
        _RUN.clear()
        _RUN.update(argv=argv, traceback=traceback)  # for the processes a launch starts (sss.run.launch.relaunch)
        try:
            _check_flags(args)
            return command(**args)
        except BaseException as exc:
            launched = os.environ.get("SSS_RANK_ERRORS")  # a rank sss launched: `sys.exit("error: ...")` is a line too
            if traceback or (isinstance(exc, SystemExit) and not (launched and isinstance(exc.code, str))):
                raise
            message, code = (str(exc.code), 1) if isinstance(exc, SystemExit) else explain_error(exc)
            from sss.run.launch import record_rank_error

            cfg = _RUN.get("config")
            if record_rank_error(redact_urls(message), code, exc, cfg.trainer.output_dir if cfg else None):
                return code  # the launcher prints the line of the rank that failed first, once
            print(redact_urls(message), file=sys.stderr, flush=True)  # no URL's password on a terminal
            return code


_RUN: dict[str, Any] = {}
"""What the running command works on (``"config"``: the run's config), for the error messages."""


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
    if command is None or argv[command] not in POSITIONALS:
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
    """Sort the command's words into its positional arguments (`POSITIONALS`) and ``key=value`` overrides."""
    # argparse collects positionals up to the first flag and leaves the later ones in `extra`, in order.
    if command not in POSITIONALS:
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
    names = POSITIONALS[command]
    required = [name for name in names if not name.endswith("?")]
    if len(plain) < len(required):
        missing = required[len(plain) :]
        parser.error(f"missing {' '.join(n.upper() for n in missing)} (usage: {USAGE[command]})")
    given = list(names) if len(plain) >= len(names) else required  # the optional ones are the ones left out
    for name in names:
        args[name.rstrip("?")] = None
    for name, word in zip(given, plain, strict=False):
        args[name.rstrip("?")] = word
    # A word too many is an override without "=": load_config refuses it with the key=value advice.
    args["overrides"] = overrides + plain[len(given) :]


def _check_flags(args: dict[str, Any]) -> None:
    from sss.config import ConfigError

    for name in ("num_processes", "gradient_accumulation_steps"):
        value = args.get(name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    _check_engine_flags(args)


def _check_engine_flags(args: dict[str, Any]) -> None:
    from sss.config import ConfigError

    names = ("num_workers", "ray_address", "max_failures")
    ray_flags = [f"--{n.replace('_', '-')}" for n in names if args.get(n) is not None]
    if args.get("engine", "accelerate") != "ray":
        if ray_flags:
            raise ConfigError(f"{' '.join(ray_flags)}: only with --engine ray (sss fit CONFIG --engine ray ...)")
        return
    if args.get("num_processes") is not None:
        raise ConfigError(
            "--engine ray starts its own worker processes: give --num-workers N instead of --num-processes "
            f"{args['num_processes']} (or leave --engine ray off to launch through Accelerate)"
        )
    if args.get("num_workers") is None:
        raise ConfigError("--engine ray needs --num-workers N: the Ray Train worker processes, one per GPU or CPU slot")
    if args["num_workers"] < 1:
        raise ConfigError(f"--num-workers must be >= 1, got {args['num_workers']}")
    if args.get("max_failures") is not None and args["max_failures"] < -1:
        raise ConfigError(f"--max-failures must be >= -1 (-1: restart without limit), got {args['max_failures']}")


# ------------------------------------------------------------------ sss fit CONFIG --help: the parts' arguments
def _parts_help(argv: list[str]) -> str:
    # `sss fit CONFIG --help` adds the arguments of CONFIG's model and data module to the help (their
    # signatures and docstrings): what model.KEY=VALUE and data.KEY=VALUE can set.
    if len(argv) < 2 or argv[0] != "fit" or not {"-h", "--help"} & set(argv):
        return ""
    takes_value = {"--num-processes", "--num_processes", "--mixed-precision", "--mixed_precision"}
    takes_value |= {"--gradient-accumulation-steps", "--gradient_accumulation_steps", "--config-file", "--config_file"}
    words = [w for i, w in enumerate(argv[1:], 1) if not w.startswith("-") and argv[i - 1] not in takes_value]
    config = next((w for w in words if not _OVERRIDE.match(w)), None)
    if config is None or not Path(config).is_file():
        return ""
    from sss.config import load_config

    try:
        cfg = load_config(config, [w for w in words if _OVERRIDE.match(w)])
    except Exception as exc:  # the help still shows; sss check says the rest
        return f"\n\nthe parts of {config}: not shown, the config does not load: {exc}"
    head = f"\n\narguments of the parts of {config} (model.KEY=VALUE, data.KEY=VALUE; [set: ...] = CONFIG's value):"
    return head + "".join(_part_help(section, getattr(cfg, section)) for section in ("model", "data"))


def _part_help(section: str, spec: dict[str, Any]) -> str:
    import inspect
    import textwrap

    from sss.config import resolve_target

    target = spec.get("_target_") if spec else None
    if not isinstance(target, str):
        return f"\n  {section}: no _target_"
    try:
        obj = resolve_target(target)
    except ImportError as exc:
        return f"\n  {section}: {exc}"
    title = f"\n{section}: {target}"
    if target.endswith("create_model") and isinstance(spec.get("name"), str):
        from sss.models.registry import model_class

        cls = model_class(spec["name"])
        if cls is not None:
            title += f"(name={spec['name']!r}) -> {cls.__name__} (the entrypoint sets some defaults of its own)"
            obj = cls
    try:
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return f"{title}\n  (no signature to show)"
    docs = {**_docstring_args(obj.__doc__), **_docstring_args(getattr(obj, "__init__", None).__doc__)}
    lines = [title]
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == "self":
            continue
        kind = p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)
        text = f"  {section}.{p.name}" + (f": {kind}" if p.annotation is not p.empty else "")
        text += " (required)" if p.default is p.empty else f" = {p.default!r}"
        if p.name in spec:
            text += f"   [set: {spec[p.name]!r}]"
        lines.append(text)
        if p.name in docs:
            lines.append(textwrap.fill(docs[p.name], width=110, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines)


def _docstring_args(doc: str | None) -> dict[str, str]:
    """The ``Args:`` section of a Google-style docstring: argument name -> its text, on one line.

    Example:
        >>> _docstring_args('''Build it.
        ...
        ... Args:
        ...     size: Side in pixels,
        ...         a power of two.
        ...     rate (int): Samples per second.
        ...
        ... Raises:
        ...     ValueError: never.
        ... ''')
        {'size': 'Side in pixels, a power of two.', 'rate': 'Samples per second.'}
    """
    import inspect

    found: dict[str, str] = {}
    inside, indent, current = False, None, None
    for line in inspect.cleandoc(doc or "").splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            inside, indent, current = True, None, None
            continue
        if not inside or not stripped:
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:  # the next section (Raises:, Example:, ...)
            inside = False
            continue
        indent = depth if indent is None else indent
        head = re.match(r"^\*{0,2}(\w+)(?: \([^)]*\))?: ?(.*)$", stripped)
        if depth == indent and head:
            current = head[1]
            found[current] = head[2]
        elif current is not None:
            found[current] = f"{found[current]} {stripped}".strip()
    return found


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
    # The writers name the folder they write (sss._writing.writing_to): the outermost OSError of the chain.
    # A copy or a rename names its destination second (shutil.copyfile on a full disk: filename2).
    for link in _chain(exc):
        if isinstance(link, OSError) and (link.filename2 or link.filename):
            return Path(os.fsdecode(link.filename2 or link.filename))
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
    cfg = _RUN.get("config")
    if cfg is None:
        return "free some space and run the command again"
    from sss.checkpoint import complete_checkpoints

    # Checkpoints are written as step_N.tmp and renamed when complete; the next start removes the leftover.
    saved = complete_checkpoints(Path(cfg.trainer.output_dir or ".") / "checkpoints")
    if not saved:
        return "no checkpoint was saved yet: free some space, then run `sss fit CONFIG` again"
    return f"the checkpoint {saved[-1]} is intact: free some space, then continue with `sss fit CONFIG --resume`"


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


def _not_a_folder(exc: BaseException) -> bool:
    # mkdir of a path that is a file (trainer.output_dir=/dev/null): the OS says only "File exists".
    if not isinstance(exc, OSError) or not exc.filename or exc.errno not in (errno.EEXIST, errno.ENOTDIR):
        return False
    path = Path(os.fsdecode(exc.filename))
    return exc.errno == errno.ENOTDIR or (path.exists() and not path.is_dir())


def _not_a_folder_message(exc: BaseException) -> tuple[str, int]:
    assert isinstance(exc, OSError)
    path = Path(os.fsdecode(exc.filename))
    found = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
    cfg = _RUN.get("config")
    out = Path(cfg.trainer.output_dir) if cfg is not None and cfg.trainer.output_dir else None
    if out is not None and (out == path or out.absolute() in (path.absolute(), *path.absolute().parents)):
        return f"error: trainer.output_dir={out}: {found} exists and is not a folder; choose a folder path", 1
    return f"error: {found} exists and is not a folder, so nothing can be written in it; choose a folder path", 1


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


_NOT_DETERMINISTIC = re.compile(r"(\S+) does not have a deterministic implementation")
_CUBLAS = "because it uses CuBLAS"


def _not_deterministic(exc: BaseException) -> bool:
    return any(
        isinstance(link, RuntimeError) and (_NOT_DETERMINISTIC.search(str(link)) or _CUBLAS in str(link))
        for link in _chain(exc)
    )


def _nondeterministic_op(exc: BaseException) -> tuple[str, int]:
    # torch's own message says "turn off determinism just for this operation" in C++ terms; say it in sss's.
    text = next(str(link) for link in _chain(exc) if isinstance(link, RuntimeError))
    if _CUBLAS in text:
        return (
            "error: trainer.deterministic=true: cuBLAS is not deterministic without CUBLAS_WORKSPACE_CONFIG, which "
            "must be set before the first CUDA matmul: export CUBLAS_WORKSPACE_CONFIG=:4096:8 (sss fit sets it "
            "itself; from Python, set it before anything runs on the GPU), or set trainer.deterministic=false",
            1,
        )
    found = _NOT_DETERMINISTIC.search(text)
    op = found[1] if found else "an operation"
    return (
        f"error: trainer.deterministic=true: {op} has no deterministic implementation on this device, so "
        "torch.use_deterministic_algorithms refuses it: set trainer.deterministic=false, or replace the op in your "
        "model with one that has (torch's list: the torch.use_deterministic_algorithms documentation)",
        1,
    )


def _is_os(*codes: int) -> Callable[[BaseException], bool]:
    return lambda exc: isinstance(exc, OSError) and exc.errno in codes


ERRORS: list[tuple[Callable[[BaseException], bool], Callable[[BaseException], tuple[str, int]]]] = [
    (lambda exc: isinstance(exc, KeyboardInterrupt), _interrupted),  # a second Ctrl-C: the first one saves
    # SIGTERM/SIGINT after saving a checkpoint: the shell's 128 + signal number
    (_instance_of("sss.callbacks.checkpoint", "Preempted"), lambda exc: (f"sss: {exc}", 128 + exc.signum)),
    (_out_of_space, _disk_full),
    (_is_sss_error, lambda exc: (f"error: {exc}", getattr(exc, "exit_code", 1))),
    (_is_os(errno.EROFS, errno.EACCES, errno.EPERM), _not_allowed),
    (_not_a_folder, _not_a_folder_message),  # trainer.output_dir=/dev/null: "File exists" on its own says nothing
    (lambda exc: isinstance(exc, RuntimeError) and bool(_WRITE_FAILED.search(str(exc))), _write_failed),
    (_not_deterministic, _nondeterministic_op),  # under trainer.deterministic=true
    # sss raises these with a message naming the path and the fix; the OS's own name the path too
    (lambda exc: isinstance(exc, (OSError, RuntimeError)), lambda exc: (f"error: {exc}", 1)),
    (lambda exc: True, _unexpected),
]
"""``(matches, message)`` rows, first match wins: how `main` turns an exception into a line and an exit code."""


if __name__ == "__main__":
    raise SystemExit(main())
