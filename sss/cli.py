"""The ``sss`` command: a table of subcommands, each a plain typed function.

Heavy modules (torch, accelerate) are imported inside the commands, so ``sss --help`` is instant.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
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
    cfg = _load_checked(config, overrides, sources)
    if cfg is None:
        return EXIT_CONFIG
    flags = {
        "num_processes": num_processes,
        "mixed_precision": mixed_precision,
        "gradient_accumulation_steps": gradient_accumulation_steps,
    }
    from sss.run.launch import apply_launch_settings, relaunch

    try:
        processes = apply_launch_settings(cfg, sources, flags, config_file, debug)
    except Exception as exc:  # ConfigError, or a bad value that the config's own checks refuse
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if processes > 1 and "LOCAL_RANK" not in os.environ:
        resolved = [
            f"trainer.mixed_precision={cfg.trainer.mixed_precision}",
            f"trainer.gradient_accumulation_steps={cfg.trainer.gradient_accumulation_steps}",
        ]
        extra = (["--resume", resume] if resume else []) + (["--debug"] if debug else [])
        return relaunch(processes, ["fit", config, *overrides, *resolved, *extra])
    from sss.callbacks.checkpoint import Preempted
    from sss.data import DataError
    from sss.run.fit import run_fit

    try:
        run_fit(cfg, resume=resume)
    except Preempted as stop:
        print(f"sss: {stop}", file=sys.stderr, flush=True)
        return 128 + stop.signum  # the shell's convention for "ended by this signal"
    except (DataError, FileExistsError) as exc:  # they name the file and what to do: a traceback adds nothing
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
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
        try:
            check_output(output)
        except FileExistsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if processes and processes > 1 and "LOCAL_RANK" not in os.environ:
        extra = (["--output", output] if output else []) + (["--no-ablation"] if no_ablation else [])
        command = "validate" if split == "val" else "test"
        return relaunch(processes, [command, config, *overrides, "--ckpt", ckpt, *extra])
    cfg = _load_checked(config, overrides)
    if cfg is None:
        return EXIT_CONFIG
    from sss.data import DataError
    from sss.run.evaluate import run_evaluate

    try:
        run_evaluate(cfg, ckpt, split, output, ablation=not no_ablation)
    except (FileNotFoundError, FileExistsError, DataError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def predict(model_dir: str, input: str, output: str, batch_size: int = 32) -> int:
    """Write per-sample predictions with class probabilities of MODEL_DIR for the rows of a manifest."""
    from sss.data import DataError
    from sss.run.predict import predict as run_predict

    try:
        path = run_predict(model_dir, input, output, batch_size=batch_size)
    except (FileNotFoundError, FileExistsError, DataError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


def export(config: str, overrides: list[str], ckpt: str, out: str) -> int:
    """Write the portable model folder (model.safetensors, config.yaml, README.md) of checkpoint CKPT to OUT."""
    cfg = _load_checked(config, overrides)
    if cfg is None:
        return EXIT_CONFIG
    from sss.run.export import export_checkpoint

    try:
        folder = export_checkpoint(cfg, ckpt, out)
    except (FileNotFoundError, FileExistsError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {folder}")
    return 0


def check(config: str, overrides: list[str]) -> int:
    """Validate CONFIG without building anything: unknown keys, wrong types, bad _target_ arguments."""
    cfg = _load_checked(config, overrides)
    if cfg is None:
        return EXIT_CONFIG
    parts = f"model {cfg.model.get('_target_')}, data {cfg.data.get('_target_')}, output {cfg.trainer.output_dir}"
    print(f"{config}: ok ({parts})")
    return 0


def config(config: str, overrides: list[str]) -> int:
    """Print CONFIG resolved (defaults <- YAML <- overrides) as YAML."""
    from sss.config import ConfigError, load_config, to_yaml

    try:
        print(to_yaml(load_config(config, overrides)), end="")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
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
    from sss.config import ConfigError, check_config, load_config

    try:
        cfg = load_config(path, overrides, sources)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    errors = check_config(cfg)
    for error in errors:
        print(f"error: {path}: {error}", file=sys.stderr)
    return None if errors else cfg


def _parser() -> argparse.ArgumentParser:
    from sss.config import SSSConfig, field_docs

    fields = "\n".join(f"  {key} (default {default})\n      {doc}" for key, default, doc in field_docs(SSSConfig))
    parser = argparse.ArgumentParser(prog="sss", description="Train Shadow & Sound Hunter models (image + audio).")
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
        p.add_argument("config", help="YAML config file, e.g. examples/industrial.yaml")
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
    """Entry point of the ``sss`` console script."""
    # MKL may take another floating-point path in a fresh process, breaking bitwise resume and
    # 1-vs-N-process parity (seen here: 4 of 75 fresh processes); it must be set before torch loads MKL.
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    args = vars(_parser().parse_args(argv))
    command = COMMANDS[args.pop("command")]
    return command(**args)


if __name__ == "__main__":
    raise SystemExit(main())
