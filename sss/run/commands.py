"""The ``sss`` subcommands, each a plain typed function: its parameters are the command line's values.

`sss.cli` builds each subcommand's parser from its function's signature (the flags, their types,
defaults and choices) and docstring (the description, and each flag's help in ``Args:``), and
calls it with the parsed values; the function returns the exit code. Heavy modules (torch,
accelerate) are imported inside the functions, so ``sss --help`` stays instant.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "EXIT_CONFIG",
    "RUN",
    "check",
    "check_flags",
    "config",
    "export",
    "fit",
    "predict",
    "pretrain",
    "test",
    "tune",
]
__all__ += ["convert", "missing_rates", "validate"]

EXIT_CONFIG = 2
"""The exit code of a configuration problem (1: a problem while running; 130: Ctrl-C)."""

RUN: dict[str, Any] = {}
"""What the running command works on: ``"argv"`` and ``"traceback"`` (set by `sss.cli.main`, for the
processes a relaunch starts) and ``"config"`` (the run's config, for the error messages)."""

Precision = Literal["auto", "no", "fp16", "bf16"]


def fit(
    config: str,
    overrides: list[str],
    resume: str | None = None,
    num_processes: int | None = None,
    mixed_precision: Precision | None = None,
    gradient_accumulation_steps: int | None = None,
    config_file: str | None = None,
    debug: bool = False,
    profile: bool = False,
    engine: Literal["accelerate", "ray"] = "accelerate",
    num_workers: int | None = None,
    ray_address: str | None = None,
    max_failures: int | None = None,
) -> int:
    """Train the model of CONFIG; print a results table and write OUTPUT_DIR/results.json.

    Args:
        resume: resume the newest checkpoint in OUTPUT_DIR that verifies (an error when there is none), the one
            at PATH, or with `--resume auto` that one or a fresh start when there is none (trainer.resume: auto);
            `--resume hub://OWNER/REPO[@REVISION]` downloads the last-checkpoint/ that HubPush pushed there
        num_processes: launch N processes
        config_file: Accelerate config file (default: the one `accelerate config` wrote, if any)
        debug: 2 batches of training and validation in fp32, shapes printed, anomaly detection
        profile: profile a few optimizer steps with torch.profiler (sss.callbacks.Profiler): a Chrome/Perfetto
            trace and TensorBoard profile files in OUTPUT_DIR/profile, and the top operators printed
        engine: accelerate: this process, or --num-processes N through Accelerate's launcher (the default); ray:
            --num-workers N Ray Train workers, restarted after a failure and continued from OUTPUT_DIR's newest
            checkpoint (pip install 'shadow-sound-hunter[ray]')
        num_workers: --engine ray: worker processes
        ray_address: --engine ray: a running Ray cluster (auto, host:6379, ray://host:10001); default: a local
            instance
        max_failures: --engine ray: restarts of the worker group after a failure (default 0; -1: no limit)
    """
    return _train("fit", locals())


def pretrain(
    config: str,
    overrides: list[str],
    resume: str | None = None,
    num_processes: int | None = None,
    mixed_precision: Precision | None = None,
    gradient_accumulation_steps: int | None = None,
    config_file: str | None = None,
    debug: bool = False,
    profile: bool = False,
    engine: Literal["accelerate", "ray"] = "accelerate",
    num_workers: int | None = None,
    ray_address: str | None = None,
    max_failures: int | None = None,
) -> int:
    """Pretrain the encoders of CONFIG's model on image-audio pairs, without labels (docs/pretrain.md).

    The model learns which image and which sound belong together (contrastive, sss.models.ContrastiveModule,
    e.g. model.name=contrastive_small); the run is an sss fit run in every other respect (checkpoints, resume,
    processes, Ray) and reports retrieval R@1/5/10 and, on a labelled validation split, a linear probe. Then
    fine-tune: sss fit CONFIG model.init_from=OUTPUT_DIR.
    """
    return _train("pretrain", locals())


pretrain.__doc__ += "\n    Args:\n" + fit.__doc__.split("Args:\n")[1]  # the same flags as sss fit, the same help


def _train(command: str, args: dict[str, Any]) -> int:
    # sss fit and sss pretrain, with their flags (`args`): one run; pretrain refuses a model that needs labels.
    config, overrides, resume = args["config"], args["overrides"], args["resume"]
    sources: dict[str, str] = {}
    cfg = _load_checked(config, overrides, sources)  # every check of `sss check`, before any data is read
    if cfg is None:
        return EXIT_CONFIG
    if command == "pretrain":
        _require_pretraining_model(cfg, config)
    if cfg.model.get("init_from") and resume is None:  # a folder without weights: said before any data is read
        _check_init_from(cfg.model["init_from"])
    flags = {key: args[key] for key in ("num_processes", "mixed_precision", "gradient_accumulation_steps")}
    processes = _prepare_fit(cfg, sources, flags, args["config_file"], args["debug"])
    if args["profile"]:  # a short torch.profiler window: a trace, TensorBoard's profile files and a summary
        cfg.callbacks = [*cfg.callbacks, {"_target_": "sss.callbacks.Profiler"}]
    if args["engine"] == "ray":  # Ray Train's workers run this same fit; Ray, not the process count above, starts them
        from sss.run.ray_train import fit_with_ray

        assert args["num_workers"] is not None  # the command line's check asked for it
        failures = args["max_failures"] or 0
        fit_with_ray(cfg, args["num_workers"], address=args["ray_address"], max_failures=failures, resume=resume)
        return 0
    from sss.run.launch import Rerun, launch_or_run, resolved_overrides

    extra = [*(["--resume", resume] if resume else []), *["--debug"] * args["debug"], *["--profile"] * args["profile"]]
    rerun = Rerun.of(cfg.trainer.output_dir, RUN.get("argv", [command, config, *overrides]))  # after a lost rank
    words = [command, config, *overrides, *resolved_overrides(cfg), *extra]
    if (launched := launch_or_run(processes, words, RUN.get("traceback", False), rerun)) is not None:
        return launched
    from sss.run.fit import run_fit

    run_fit(cfg, resume=resume, command=command)  # its errors become one line and an exit code in sss.cli.main
    return 0


def _check_init_from(path: str) -> None:
    from sss.config import ConfigError
    from sss.run.init_from import init_source

    try:
        init_source(path)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None


def _require_pretraining_model(cfg: Any, config: str) -> None:
    # sss pretrain reads no label: a model whose loss needs them would fail at its first step, after the data.
    from sss.config import ConfigError
    from sss.config.instantiate import resolve_target
    from sss.models.contrastive import ContrastiveModule

    target = resolve_target(cfg.model["_target_"])
    if callable(getattr(target, "class_for", None)) and isinstance(cfg.model.get("name"), str):
        target = target.class_for(cfg.model["name"])
    if not (isinstance(target, type) and issubclass(target, ContrastiveModule)):
        name = cfg.model.get("name") or cfg.model["_target_"]
        raise ConfigError(
            f"{config}: sss pretrain learns without labels, but model {name!r} trains on them: use sss fit, or a "
            "contrastive model (model.name=contrastive_small, as examples/pretrain.yaml)"
        )


def _prepare_fit(cfg: Any, sources: dict[str, str], flags: dict[str, Any], config_file: str | None, debug: bool) -> int:
    # Before anything of the run: the config the error messages name, the environment CUDA reads at
    # start, and the launch settings (`sss.run.launch`); the number of processes to run in.
    from sss.config import ConfigError
    from sss.run.launch import apply_launch_settings

    RUN["config"] = cfg  # its output folder, for the message of a full disk or a Ctrl-C
    if cfg.trainer.deterministic:  # cuBLAS reads it once, at its first call: before anything touches CUDA
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        return apply_launch_settings(cfg, sources, flags, config_file, debug)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a value of Accelerate's config file that is no number, say
        raise ConfigError(f"{config_file or 'the Accelerate config file'}: {exc}") from exc


def validate(
    config: str | None,
    overrides: list[str],
    ckpt: str,
    output: str | None = None,
    no_ablation: bool = False,
    num_processes: int | None = None,
    trust_code: bool = False,
    missing: list[str] | None = None,
) -> int:
    """Evaluate CKPT (a checkpoint or model folder) on the validation split: tables and a metrics JSON file.

    Without CONFIG, the config stored with CKPT is used (a checkpoint's trainer_state.json, a model
    folder's config.yaml), with the overrides merged over it. The robustness report (each modality
    absent from 0, 25, 50 and 100 % of the samples) goes into the JSON and a PNG curve beside it.

    Args:
        ckpt: checkpoint folder (run/checkpoints/step_N) or model folder
        output: JSON file (default: <run folder>/eval/<split>_<ckpt>.json)
        no_ablation: skip the image-only and audio-only passes and the robustness report
        num_processes: evaluate in N processes
        trust_code: build the parts a stored config names outside sss's own models and data modules (imports
            and runs that code: trusted folders only); a CONFIG you give is trusted
        missing: evaluate with MODALITY absent from a seeded fraction RATE of the samples, e.g. image=0.5
            (repeat for both: --missing image=0.5 --missing audio=0.2)
    """
    flags = (output, no_ablation, num_processes, trust_code, missing)
    return _evaluate("val", config, overrides, ckpt, *flags)


def test(
    config: str | None,
    overrides: list[str],
    ckpt: str,
    output: str | None = None,
    no_ablation: bool = False,
    num_processes: int | None = None,
    trust_code: bool = False,
    missing: list[str] | None = None,
) -> int:
    """Evaluate CKPT (a checkpoint or model folder) on the test split: tables and a metrics JSON file.

    Without CONFIG, the config stored with CKPT is used (a checkpoint's trainer_state.json, a model
    folder's config.yaml), with the overrides merged over it. The robustness report (each modality
    absent from 0, 25, 50 and 100 % of the samples) goes into the JSON and a PNG curve beside it.

    Args:
        ckpt: checkpoint folder (run/checkpoints/step_N) or model folder
        output: JSON file (default: <run folder>/eval/<split>_<ckpt>.json)
        no_ablation: skip the image-only and audio-only passes and the robustness report
        num_processes: evaluate in N processes
        trust_code: build the parts a stored config names outside sss's own models and data modules (imports
            and runs that code: trusted folders only); a CONFIG you give is trusted
        missing: evaluate with MODALITY absent from a seeded fraction RATE of the samples, e.g. image=0.5
            (repeat for both: --missing image=0.5 --missing audio=0.2)
    """
    flags = (output, no_ablation, num_processes, trust_code, missing)
    return _evaluate("test", config, overrides, ckpt, *flags)


test.__test__ = False  # type: ignore[attr-defined]  # the `sss test` command: not a test when pytest is given this file


def _evaluate(
    split: str,
    config: str | None,
    overrides: list[str],
    ckpt: str,
    output: str | None,
    no_ablation: bool,
    processes: int | None,
    trust_code: bool,
    missing: list[str] | None = None,
) -> int:
    from sss.run.evaluate import check_output
    from sss.run.launch import launch_or_run

    command = "validate" if split == "val" else "test"
    rates = missing_rates(missing)
    if output is not None and "LOCAL_RANK" not in os.environ:
        check_output(output, plot=not no_ablation)
    extra = (["--output", output] if output else []) + (["--no-ablation"] if no_ablation else [])
    extra += ["--trust-code"] if trust_code else []
    extra += [word for item in missing or () for word in ("--missing", item)]
    words = [command, *([config] if config else []), *overrides, "--ckpt", ckpt, *extra]
    launched = launch_or_run(processes, words, RUN.get("traceback", False))
    if launched is not None:
        return launched
    cfg = _config_for(command, config, overrides, ckpt, trust_code)
    if cfg is None:
        return EXIT_CONFIG
    from sss.run.evaluate import run_evaluate

    run_evaluate(cfg, ckpt, split, output, ablation=not no_ablation, missing=rates)
    return 0


def missing_rates(missing: list[str] | None) -> dict[str, float]:
    """The ``--missing MODALITY=RATE`` flags as ``{modality: rate}``; `ConfigError` saying what is wrong with one.

    Example:
        >>> missing_rates(["image=0.5"])
        {'image': 0.5}
    """
    # --missing image=0.5: checked before any process starts; a bad value is a flag error (exit code 2).
    if not missing:
        return {}
    from sss.config import ConfigError
    from sss.data.presence import parse_missing

    try:
        return parse_missing(missing)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def predict(
    model_dir: str,
    overrides: list[str],
    input: str,
    output: str,
    batch_size: int = 32,
    runtime: Literal["torch", "onnx"] = "torch",
    trust_code: bool = False,
) -> int:
    """Write per-sample predictions with class probabilities of MODEL_DIR for a manifest, shards or a HF dataset.

    Overrides: model.KEY=VALUE rebuilds the folder's model with a changed setting (it must still fit
    the weights); data.allow_outside_root=true accepts manifest paths outside the manifest's folder;
    data.on_error=skip leaves out samples that do not read (listed in <output stem>.skipped.csv).

    Args:
        input: manifest CSV/JSONL with image and/or audio columns; or a folder written by sss data pack, or a
            Hugging Face dataset (save_to_disk folder, Hub Parquet folder, cached id owner/name), with :SPLIT
            (IN:val) or without (the first of test, val, train it has)
        output: CSV to write (must not exist)
        runtime: onnx: run the folder's model.onnx with onnxruntime (sss export ... --format onnx; the onnx extra)
        trust_code: build a model whose config.yaml names code outside sss (imports and runs it: trusted folders
            only)
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
    format: Literal["safetensors", "onnx"] = "safetensors",
) -> int:
    """Write the portable model folder (model.safetensors, config.yaml, README.md) of checkpoint CKPT to OUT.

    Without CONFIG, the config stored in the checkpoint (trainer_state.json) is used, with the overrides merged over it.
    --format onnx adds model.onnx (onnxruntime; docs/deploy.md); so does `sss export MODEL_DIR OUT --format onnx`.

    Args:
        ckpt: checkpoint folder, e.g. runs/industrial/checkpoints/step_0000375 (not with a MODEL_DIR --format onnx)
        trust_code: build the parts a stored config names outside sss's own models and data modules (imports
            and runs that code: trusted folders only); a CONFIG you give is trusted
        format: onnx: also write model.onnx (needs the onnx extra; docs/deploy.md)
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
    from sss.run.folder import planned_output_dir

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
    from sss.run.folder import planned_output_dir

    cfg = load_config(config, overrides)
    cfg.trainer.output_dir, taken = planned_output_dir(cfg)
    if taken:
        print(f"# trainer.output_dir: {taken} holds a run, so a fresh `sss fit` writes to {cfg.trainer.output_dir}")
    print(to_yaml(cfg), end="")
    return 0


def convert(what: Literal["panns"], src: str, out: str) -> int:
    """``sss convert panns IN.pth OUT.safetensors``: a PANNs checkpoint to safetensors (model.audio_pretrained).

    The pickle is read with torch.load(weights_only=True), only numpy's array and scalar globals allowed: a
    file naming anything else is refused without running it. OUT is never overwritten.

    Args:
        what: panns: PANNs' Cnn14 / Cnn10 / Cnn6 (32 kHz) checkpoints, e.g. Cnn14_mAP=0.431.pth
        src: the checkpoint to read (IN.pth)
        out: the safetensors file to write (must not exist)
    """
    from sss.run.convert import convert_panns

    convert_panns(src, out)
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
    mixed_precision: Precision | None = None,
    gradient_accumulation_steps: int | None = None,
    config_file: str | None = None,
) -> int:
    """``sss tune lr CONFIG``: the LR range test on a copy of the run; prints the suggested lr and a curve.

    The LR grows geometrically from --min-lr to --max-lr over --steps optimizer steps of the run's own
    data (cycled when shorter), stopping once the loss diverges; the suggestion is the LR of the
    steepest loss descent. Writes OUTPUT_DIR/tune/lr_find.png and lr_find.json (numbered on, never
    over a file). --apply prints the ready `sss fit` command line with the suggestion; the YAML is not edited.

    Args:
        steps: optimizer steps of the range test (default 100)
        min_lr: the first step's LR (default 1e-7)
        max_lr: the last step's LR (default 1)
        apply: print the `sss fit` command line with the suggested lr
        num_processes: run in N processes
        config_file: Accelerate config file
    """
    if what != "lr":
        print("error: the tune command knows: sss tune lr CONFIG [key=value ...]", file=sys.stderr)
        return EXIT_CONFIG
    sources: dict[str, str] = {}
    cfg = _load_checked(config, overrides, sources)
    if cfg is None:
        return EXIT_CONFIG
    from sss.run.launch import apply_launch_settings, launch_or_run, resolved_overrides

    flags = {"num_processes": num_processes, "mixed_precision": mixed_precision}
    flags["gradient_accumulation_steps"] = gradient_accumulation_steps
    processes = apply_launch_settings(cfg, sources, flags, config_file, debug=False)
    ranges = ["--steps", str(steps), "--min-lr", str(min_lr), "--max-lr", str(max_lr)]
    words = ["tune", "lr", config, *overrides, *resolved_overrides(cfg), *ranges, *(["--apply"] * apply)]
    launched = launch_or_run(processes, words, RUN.get("traceback", False))
    if launched is not None:
        return launched
    from sss.run.tune import lr_find, print_result

    result = lr_find(cfg, steps=steps, min_lr=min_lr, max_lr=max_lr)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    return print_result(result, Path(cfg.trainer.output_dir) / "tune", config, overrides, apply)


def check_flags(args: dict[str, Any]) -> None:
    """Refuse the command line's values that no parameter's type refuses: counts below 1, --engine ray's flags.

    Args:
        args: The parsed values by parameter name (those of all commands; the missing ones are not given).

    Example:
        >>> check_flags({"num_processes": 0})
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: --num-processes must be >= 1, got 0
    """
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
    # printed problems. A `ConfigError` of loading reaches sss.cli.main, which prints it (exit 2).
    from sss.config import load_config

    return _checked(load_config(path, overrides, sources), path)


def _checked(cfg: Any, where: str) -> Any:
    from sss.config import check_config

    errors = check_config(cfg)
    for error in errors:
        print(f"error: {where}: {error}", file=sys.stderr)
    return None if errors else cfg
