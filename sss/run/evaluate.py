"""``sss validate`` / ``sss test``: evaluate a checkpoint or model folder, print the tables, write a JSON file
(and the robustness curve beside it, ``<json stem>_robustness.png``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from sss.checkpoint import MARKER
from sss.config import ConfigError, SSSConfig, load_config
from sss.config.instantiate import config_targets
from sss.evaluation import evaluate, print_evaluation
from sss.model_folder import UntrustedCodeError, load_trained_weights, recorded_preprocessing
from sss.run.folder import json_safe
from sss.run.parts import build_parts
from sss.trainer.trainer import SSSTrainer

__all__ = ["check_output", "load_stored_config", "robustness_plot_path", "run_evaluate", "untrusted_parts"]


def run_evaluate(
    cfg: Any,
    ckpt: str,
    split: str,
    output: str | None,
    ablation: bool = True,
    missing: dict[str, float] | None = None,
) -> dict[str, Any]:
    """``sss validate|test [CONFIG] --ckpt PATH``: evaluate a checkpoint or model folder, print, write metrics.json.

    `missing` (``--missing image=0.5``) makes those modalities absent from a seeded fraction of the samples in
    the fused pass; the JSON records it. With `ablation`, the robustness curve is drawn beside the JSON file.
    """
    parts = build_parts(cfg)  # classes and modalities, as at training time
    state, datamodule, module = parts.state, parts.datamodule, parts.module
    # A model folder's config no longer names the pretrained weights its image side was bound to (#25): decode with
    # the mean/std/filter its preprocessing.json records (a training checkpoint's config still names the weights).
    use = getattr(datamodule, "use_model_preprocessing", None)
    if callable(use) and (recorded := recorded_preprocessing(ckpt)):
        use(recorded)
    path = _output_path(cfg, ckpt, split, output) if state.is_main_process else None
    load_trained_weights(module, ckpt, "Evaluate with the config and overrides it was trained with.")
    quiet = dataclasses.replace(  # the whole split, whatever the training run limited
        cfg.trainer,
        limit_val_batches=None,
        fast_dev_run=0,
        overfit_batches=0,
        log=dataclasses.replace(cfg.trainer.log, progress=False, trackers=[]),
        checkpoint=dataclasses.replace(cfg.trainer.checkpoint, every_epoch=False, every_n_steps=None),
    )
    trainer = SSSTrainer(quiet)
    result = evaluate(trainer, module, datamodule, split=split, ablation=ablation, missing=missing)
    result = {"checkpoint": str(ckpt), "config": cfg.name, **result}
    if state.is_main_process:
        absent = "".join(f", {m} absent from {rate:.0%}" for m, rate in result["missing"].items())
        print_evaluation(result, f"sss {'validate' if split == 'val' else 'test'} {cfg.name}: {ckpt}{absent}")
        _write_new(path, lambda tmp: tmp.write_text(json.dumps(json_safe(result), indent=2)))
        print(f"written to {path}")
        if result.get("robustness"):
            from sss.callbacks.plots import robustness_figure

            figure = robustness_figure(result["robustness"], f"{split}: {Path(ckpt).name}, a modality absent")
            plot = robustness_plot_path(path)
            _write_new(plot, lambda tmp: figure.savefig(tmp, dpi=100, format="png"))
            print(f"written to {plot}")
    state.wait_for_everyone()
    return result


def robustness_plot_path(output: str | Path) -> Path:
    """Where the robustness curve of the evaluation written to `output` goes: beside it, ``<stem>_robustness.png``.

    Example:
        >>> robustness_plot_path("runs/x/eval/val_step_0000004.json").name
        'val_step_0000004_robustness.png'
    """
    path = Path(output)
    return path.with_name(f"{path.stem}_robustness.png")


def _write_new(path: Path, write: Any) -> None:
    # Written under a temporary name, then renamed: a failure leaves no half file under the name asked for.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _output_path(cfg: Any, ckpt: str, split: str, output: str | None) -> Path:
    # An explicit --output that exists is refused; the default, in the run folder the checkpoint
    # or model folder belongs to, never overwrites an earlier file.
    if output is not None:
        check_output(output)
        return Path(output)
    ckpt_path = Path(ckpt)
    if ckpt_path.parent.name == "checkpoints":
        run = ckpt_path.parent.parent
    elif (ckpt_path.parent / "results.json").is_file():
        run = ckpt_path.parent  # OUTPUT_DIR/model
    else:
        run = Path(cfg.trainer.output_dir)
    name, n = f"{split}_{ckpt_path.name}", 0
    path = run / "eval" / f"{name}.json"
    while path.exists() or robustness_plot_path(path).exists():
        n += 1
        path = run / "eval" / f"{name}_{n}.json"
    return path


def check_output(output: str, plot: bool = False) -> None:
    """Refuse an existing ``--output`` file, and with `plot` an existing robustness curve beside it (checked before
    any process starts).

    Example:
        >>> check_output("no/such/file.json", plot=True)
    """
    if Path(output).exists():
        raise FileExistsError(f"--output {output} already exists; choose another path or remove it")
    if plot and robustness_plot_path(output).exists():
        raise FileExistsError(
            f"--output {output}: its robustness curve {robustness_plot_path(output)} already exists; choose another "
            "path, remove it, or leave the curve out with --no-ablation"
        )


def load_stored_config(
    ckpt: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    trust_code: bool = False,
    command: str = "validate",
) -> SSSConfig:
    """The config `ckpt` was trained with, `overrides` merged over it (``sss validate --ckpt PATH [key=value ...]``).

    A training checkpoint keeps its run's config in ``trainer_state.json`` (``"config"``), a model
    folder in ``config.yaml`` (local absolute paths written as null: give them back as overrides,
    e.g. ``data.root=...``). Either is data someone may have handed you, so every ``_target_`` the
    command would build (``model:``, ``data:``) must be sss's own (`untrusted_parts`), unless
    `trust_code`; otherwise `UntrustedCodeError` is raised before anything it names is imported.
    It is read as data whatever `trust_code` says (``load_config(..., untrusted=True)``): no
    ``${...}`` interpolation, and the model spec names no file (the weights come from `ckpt`).

    Example:
        >>> import tempfile
        >>> from sss.config import SSSConfig
        >>> from sss.model_folder import export_model
        >>> from sss.testing import BoringModule
        >>> cfg = SSSConfig(name="demo", model={"_target_": "sss.testing.BoringModule"})
        >>> folder = export_model(BoringModule(), cfg, {}, tempfile.mkdtemp() + "/m")
        >>> load_stored_config(folder, ["trainer.seed=3"]).trainer.seed
        3
    """
    path = Path(ckpt)
    if (path / MARKER).is_file():
        source = path / MARKER
        try:
            stored = json.loads(source.read_text()).get("config")
        except (ValueError, AttributeError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
            raise ConfigError(f"{source}: not a readable checkpoint record ({str(exc)[:80]})") from None
        if not isinstance(stored, dict) or not stored:
            raise ConfigError(
                f"{source} holds no run config: give the config it was trained with: sss {command} CONFIG --ckpt {ckpt}"
            )
        cfg = load_config(source, overrides, stored=stored, untrusted=True)
    elif (path / "config.yaml").is_file():
        source = path / "config.yaml"
        cfg = load_config(source, overrides, untrusted=True)
    else:
        raise FileNotFoundError(
            f"{path} is neither an sss checkpoint ({MARKER}) nor a model folder (config.yaml): pass one of them to "
            f"--ckpt, or give the config yourself: sss {command} CONFIG --ckpt PATH"
        )
    found = untrusted_parts(cfg)
    if found and not trust_code:
        error = UntrustedCodeError(source, found)
        # The allowlist's message speaks of sss predict; say what this command takes.
        error.args = (
            f"{error} For sss {command}: add --trust-code, or give the config yourself (a config you pass is "
            f"trusted, as for sss fit): sss {command} CONFIG --ckpt {ckpt}",
        )
        raise error
    return cfg


def untrusted_parts(cfg: SSSConfig) -> list[tuple[str, Any]]:
    """The ``_target_`` entries of a stored config that evaluating or exporting it would run but sss does not ship.

    The parts that get built (``model:``, ``data:``, at any depth) must be in the model folder
    allowlist (`sss.models.registry.trusted_targets`) or be one of sss's own data modules; those
    that `sss.config.check_config` only imports to check their arguments (optimizer, scheduler,
    callbacks) must come from sss or torch, whose import runs nothing new. Imports none of them.

    Example:
        >>> from sss.config import load_config
        >>> cfg = load_config(None, ["model._target_=evil.Model", "data._target_=sss.data.IndustrialDataModule"])
        >>> untrusted_parts(cfg)
        [('model._target_', 'evil.Model')]
    """
    from sss.models.registry import trusted_targets

    built = trusted_targets() | _sss_data_modules()
    found = []
    for key, name in config_targets(cfg):
        section = key.split(".")[0].split("[")[0]
        if section in ("model", "data"):
            ok = isinstance(name, str) and name in built
        else:
            ok = isinstance(name, str) and name.split(".")[0] in ("sss", "torch")
        if not ok:
            found.append((key, name))
    return found


def _sss_data_modules() -> frozenset[str]:
    # sss's own data modules, under their sss.data name and their defining module's (as trusted_targets names models).
    import inspect

    import sss.data as family
    from sss.data.datamodule import DataModule
    from sss.testing import BoringDataModule

    own = [getattr(family, name) for name in family.__all__]
    own = [c for c in own if inspect.isclass(c) and issubclass(c, DataModule)]
    names = {f"sss.data.{c.__name__}" for c in own}
    return frozenset(names | {f"{c.__module__}.{c.__qualname__}" for c in [*own, BoringDataModule]})
