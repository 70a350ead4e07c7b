"""The portable model folder: export a trained module, load it back (`sss.load_model`).

A model folder holds ``model.safetensors`` (weights, no pickle), ``config.yaml`` (the run's
config: ``model:`` rebuilds the module), ``preprocessing.json`` (classes, task, image size,
sample rate, clip length, and what pretrained weights bind: image mean/std/filter, the source
weights' name: how inputs were prepared) and ``README.md`` (a model card, with a Preprocessing section). ``sss fit``
writes one to ``OUTPUT_DIR/model``; ``sss export`` writes one from any checkpoint.

A model folder is data someone hands you (a Hub download), so loading it runs no code sss does
not ship: every ``_target_`` in its ``model:`` spec must be in `sss.models.registry.trusted_targets`,
checked as text before anything is imported, unless the caller passes ``trust_code=True``. The
exported ``config.yaml`` and model card carry no absolute local paths (they become ``null``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import torch

from sss.checkpoint import MARKER
from sss.config import ConfigError, SSSConfig, check_target, instantiate, load_config
from sss.config.instantiate import find_targets, model_problems
from sss.errors import SSSError

__all__ = [
    "FILES",
    "PREPROCESSING",
    "SETTINGS",
    "WEIGHTS",
    "DamagedModelFolderError",
    "UntrustedCodeError",
    "add_onnx",
    "check_model_folder",
    "export_model",
    "export_onnx",
    "load_folder_config",
    "load_model",
    "load_trained_weights",
    "preprocessing",
    "read_preprocessing",
    "recorded_preprocessing",
    "require_complete",
    "untrusted_targets",
]

WEIGHTS = "model.safetensors"
PREPROCESSING = "preprocessing.json"
SETTINGS = ("image_size", "sample_rate", "clip_seconds", "event_frame_rate")
"""The datamodule settings a model folder records, so that prediction decodes inputs as training did."""
FILES = {
    WEIGHTS: "the weights",
    "config.yaml": "what builds the model",
    PREPROCESSING: "how inputs were prepared: classes, image size, sample rate; without it inputs would be decoded "
    "with defaults",
    "README.md": "the model card: what the model is and how it was trained",
}
"""The files of a model folder and what each holds; a folder without one of them is damaged."""


class DamagedModelFolderError(FileNotFoundError, SSSError):
    """A model folder with a file missing or unreadable (`FILES`); ``sss check FOLDER`` and ``sss predict`` refuse it.

    Example:
        >>> DamagedModelFolderError("m is a damaged model folder: ...").exit_code
        1
    """


class UntrustedCodeError(SSSError):
    """A model folder's config names code outside sss's allowlist; nothing it names was imported or called.

    `targets` holds ``(YAML key, dotted name)`` for each such ``_target_``. ``sss`` exits with 2.
    """

    exit_code = 2

    def __init__(self, source: str | Path, targets: list[tuple[str, Any]]) -> None:
        self.source, self.targets = Path(source), targets
        names = "\n".join(f"  {key}: {name}" for key, name in targets)
        super().__init__(
            f"{source} names code outside sss's registered models and parts; loading it would import each "
            f"module below (running its top-level code) and call the named object with the YAML's arguments:\n"
            f"{names}\nNothing was imported or called. A model folder is data (a Hub download, a file someone "
            "sent), so only the names in sss.models.registry.trusted_targets() build without asking. If you trust "
            "whoever wrote this folder and have their code installed, pass trust_code=True to sss.load_model, or "
            "--trust-code to sss predict: that runs the code named above, with your permissions."
        )


def untrusted_targets(spec: Any, key: str = "model") -> list[tuple[str, Any]]:
    """The ``_target_`` entries of `spec` (at any depth) that are not in sss's allowlist; imports none of them.

    The allowlist is `sss.models.registry.trusted_targets`. A ``_target_`` that is not a string is untrusted.

    Example:
        >>> spec = {"_target_": "sss.models.create_model", "name": "hunter_tiny",
        ...         "image_kwargs": {"drop_rate": {"_target_": "os.system", "command": "touch pwned"}}}
        >>> untrusted_targets(spec)
        [('model.image_kwargs.drop_rate._target_', 'os.system')]
    """
    from sss.models.registry import trusted_targets

    trusted = trusted_targets()
    return [(k, name) for k, name in find_targets(spec, key) if not isinstance(name, str) or name not in trusted]


def preprocessing(datamodule: Any) -> dict[str, Any]:
    """How a datamodule prepares inputs (classes, task and decoding settings), for the model folder.

    Example:
        >>> class DM:
        ...     classes, task, image_size, sample_rate, clip_seconds = ["a", "b"], "multiclass", 64, 16000, 1.0
        >>> preprocessing(DM())["classes"]
        ['a', 'b']
    """
    found = {key: getattr(datamodule, key) for key in SETTINGS if getattr(datamodule, key, None) is not None}
    classes = getattr(datamodule, "classes", None)
    return {"classes": list(classes) if classes else None, "task": getattr(datamodule, "task", None) or None, **found}


def recorded_preprocessing(folder: str | Path) -> dict[str, Any]:
    """The image mean/std/filter a model folder's weights were bound to; ``{}`` for a checkpoint or an older folder.

    Its config no longer names the pretrained weights, so ``sss validate --ckpt FOLDER`` hands these to
    ``datamodule.use_model_preprocessing`` to decode as training did.

    Example:
        >>> folder = Path(__import__("tempfile").mkdtemp())
        >>> _ = (folder / PREPROCESSING).write_text('{"classes": null, "image_size": 8, "image_mean": [0.5, 0.5, 0.5]}')
        >>> recorded_preprocessing(folder)
        {'image_mean': [0.5, 0.5, 0.5]}
    """
    prep = read_preprocessing(folder) if (Path(folder) / PREPROCESSING).is_file() else {}
    return {key: prep[key] for key in ("image_mean", "image_std", "image_interpolation") if key in prep}


def _with_weights_preprocessing(prep: dict[str, Any], module: torch.nn.Module) -> dict[str, Any]:
    # What the weights bind (`HunterModule.preprocessing`: image mean/std/filter, audio front-end, the source
    # weights' name) joins the data's settings; a data setting the weights also name was checked equal at fit.
    bound = getattr(module, "preprocessing", None)
    found = bound() if callable(bound) else {}
    return {**prep, **{k: v for k, v in (found or {}).items() if k not in prep}}


def export_model(
    module: torch.nn.Module,
    cfg: SSSConfig,
    metrics: dict[str, Any],
    folder: str | Path,
    datamodule: Any = None,
    *,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    weights_source: str | None = None,
) -> Path:
    """Write the portable model folder for `module` (trained with `cfg`, on `datamodule`) to `folder`.

    The weights are `state_dict` when given, else ``module.state_dict()``. Under FSDP or DeepSpeed
    ZeRO-3 each process holds only a shard, so pass the full state dict that
    ``accelerator.get_state_dict(model)`` gathers (called on every process), as ``sss fit`` does.
    `weights_source` says in the model card which weights these are when they are not the trained ones
    (``"ema (decay 0.999)"``: the `sss.callbacks.EMA` average).

    Example:
        >>> import tempfile
        >>> from sss.config import SSSConfig
        >>> cfg = SSSConfig(name="demo", model={"_target_": "sss.testing.BoringModule"})
        >>> folder = export_model(instantiate(cfg.model), cfg, {"val/accuracy": 0.5}, tempfile.mkdtemp() + "/m")
        >>> sorted(p.name for p in folder.iterdir())
        ['README.md', 'config.yaml', 'model.safetensors', 'preprocessing.json']
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if state_dict is not None and not state_dict:
        raise ValueError(
            f"export_model({folder}): the given state_dict is empty; under FSDP the full state dict is only on the "
            "main process: call accelerator.get_state_dict(model) on every process and export on the main one"
        )
    # Own contiguous copies: safetensors refuses tensors that share or view another's storage.
    weights = module.state_dict() if state_dict is None else state_dict
    state = {k: v.detach().cpu().contiguous().clone() for k, v in weights.items()}
    meta = {"format": "pt", "sss_model": type(module).__name__}
    if weights_source:
        meta["sss_weights"] = weights_source
    save_file(state, str(folder / WEIGHTS), metadata=meta)
    # The weights model.init_from started from are in model.safetensors now: the folder never names that run.
    cfg = dataclasses.replace(cfg, model={k: v for k, v in (cfg.model or {}).items() if k != "init_from"})
    published, dropped = _without_local_paths(cfg)
    (folder / "config.yaml").write_text(_config_yaml(published, dropped))
    prep = preprocessing(datamodule) if datamodule is not None else {"classes": None, "task": None}
    prep = _with_weights_preprocessing(prep, module)
    (folder / PREPROCESSING).write_text(json.dumps(prep, indent=2))
    (folder / "README.md").write_text(_model_card(module, cfg, published, dropped, metrics, prep, weights_source))
    return folder


def export_onnx(model_dir: str | Path, out: str | Path, trust_code: bool = False) -> Path:
    """Write to `out` the model folder `model_dir` plus its ``model.onnx`` (``sss export MODEL_DIR OUT --format onnx``).

    The folder's files are copied (weights, ``config.yaml``, ``preprocessing.json``, model card) and
    `add_onnx` adds the graph and its model card section. `out` must be new or empty; when the
    export fails, what was written there is removed and `sss.onnx_export.OnnxExportError` says why.
    Needs the ``onnx`` extra. `trust_code` as for `load_model`.

    Example:
        >>> export_onnx("no/such/model", "out")
        Traceback (most recent call last):
        ...
        FileNotFoundError: no/such/model is not an sss model folder: model.safetensors is missing ...
    """
    import shutil

    model_dir, out = Path(model_dir), Path(out)
    module = load_model(model_dir, trust_code=trust_code)
    with fresh_folder(out):
        for name in (WEIGHTS, "config.yaml", PREPROCESSING, "README.md"):
            if (model_dir / name).is_file():
                shutil.copyfile(model_dir / name, out / name)
        add_onnx(module, out)
    return out


def add_onnx(module: torch.nn.Module, folder: str | Path) -> Path:
    """Add ``model.onnx`` (`sss.onnx_export.write_onnx`, shapes from ``preprocessing.json``) and its model card part.

    Example:
        >>> add_onnx(torch.nn.Identity(), "no/such/folder")
        Traceback (most recent call last):
        ...
        FileNotFoundError: no/such/folder is not an sss model folder: preprocessing.json is missing ...
    """
    from sss.onnx_export import model_card_section, write_onnx

    folder = Path(folder)
    if not (folder / PREPROCESSING).is_file():
        raise FileNotFoundError(
            f"{folder} is not an sss model folder: {PREPROCESSING} is missing (write one with sss export or sss fit)"
        )
    found = write_onnx(module, folder, json.loads((folder / PREPROCESSING).read_text()))
    card = folder / "README.md"
    text = card.read_text().split("\n## ONNX\n")[0] if card.is_file() else ""
    card.write_text(text.rstrip("\n") + "\n" + model_card_section(found))
    return folder / "model.onnx"


@contextlib.contextmanager
def fresh_folder(out: str | Path) -> Iterator[Path]:
    """Create `out` (it must be new or empty) for an export; when the export raises, remove what it wrote.

    The folders it created (`out` and any missing parent) are removed too, so a failed export leaves
    the disk as it found it. A full or read-only disk names `out` (`sss._writing.writing_to`).

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "m"
        >>> try:
        ...     with fresh_folder(out):
        ...         _ = (out / "half.bin").write_text("x")
        ...         raise RuntimeError("export failed")
        ... except RuntimeError:
        ...     pass
        >>> out.exists()
        False
    """
    import shutil

    from sss._writing import writing_to

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} already exists and is not empty; choose another folder or remove it")
    created = [p for p in (out, *out.parents) if not p.exists()]  # innermost first
    try:
        with writing_to(out):
            out.mkdir(parents=True, exist_ok=True)
            yield out
    except BaseException:
        # `out` was empty or new: everything in it now is this export's own half-written output.
        for child in out.iterdir() if out.is_dir() else ():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        for folder in created:
            with contextlib.suppress(OSError):  # a parent that someone else wrote into meanwhile stays
                folder.rmdir()
        raise


def _without_local_paths(cfg: SSSConfig) -> tuple[dict[str, Any], list[str]]:
    # A model folder is what HubPush publishes: an absolute path (data.root, trainer.output_dir, a local
    # pretrained file) names the author's machine and means nothing on the reader's. Loading needs none
    # of them: the weights are in model.safetensors and the decoding settings in preprocessing.json.
    from omegaconf import OmegaConf

    dropped: list[str] = []

    def scrub(value: Any, key: str) -> Any:
        if isinstance(value, str) and _is_local_path(value):
            dropped.append(key)
            return None
        if isinstance(value, dict):
            return {k: scrub(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [scrub(v, f"{key}[{i}]") for i, v in enumerate(value)]
        return value

    return scrub(OmegaConf.to_container(OmegaConf.structured(cfg)), ""), dropped


def _is_local_path(text: str) -> bool:
    return text.startswith("~") or PurePosixPath(text).is_absolute() or PureWindowsPath(text).is_absolute()


def _config_yaml(published: dict[str, Any], dropped: list[str]) -> str:
    from omegaconf import OmegaConf

    text = OmegaConf.to_yaml(published)
    if not dropped:
        return text
    return (
        "# Local absolute paths were left out of this exported file (written as null): " + ", ".join(dropped) + ".\n"
        "# sss.load_model and sss predict do not need them; set them to train or evaluate from this config.\n" + text
    )


def _model_card(
    module: torch.nn.Module,
    cfg: SSSConfig,
    published: dict[str, Any],
    dropped: list[str],
    metrics: dict[str, Any],
    prep: dict[str, Any],
    weights: str | None = None,
) -> str:
    # `metrics` may carry what `sss fit` recorded of the run (results.json's keys: global_step,
    # mixed_precision as Accelerate used it, sss_version, ...); `sss export` and a Hub push pass the
    # metrics alone, and the card then says what was configured and when it was exported.
    from datetime import datetime, timezone

    from sss import __version__

    timing = {"segment_seconds", "train_samples_per_second", "train_seconds_total", "wall_seconds"}
    params = sum(p.numel() for p in module.parameters())
    rows = "\n".join(f"| {k} | {v:.4f} |" for k, v in metrics.items() if isinstance(v, float) and k not in timing)
    classes = prep.get("classes")
    task = {"multilabel": "multi-label classification", "segmentation": "shadow segmentation"}.get(
        prep.get("task") or "", "single-label classification"
    )
    t = cfg.trainer
    ran, precision = _what_ran(metrics, t), _precision(metrics, t)
    version = metrics.get("sss_version", __version__)
    commit = f", commit `{metrics['git_commit']}`" if metrics.get("git_commit") else ""
    when = (
        f"finished {metrics['finished_at']}"
        if metrics.get("finished_at")
        else f"exported {datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}"
    )
    return (
        f"# {cfg.name}\n\nA Shadow & Sound Hunter model trained with `sss` ({type(module).__name__}, "
        f"{params / 1e6:.2f} M parameters).\n\n"
        f"- task: {task}" + (f" over {list(classes)}" if classes else "") + "\n"
        f"- model: `{published['model']}`\n- data: `{published['data']}`\n"
        f"- training: {ran}; {precision}, accumulation {t.gradient_accumulation_steps}, "
        + (f"clip {t.max_grad_norm}" if t.max_grad_norm is not None else "no gradient clipping")
        + f", seed {t.seed}, optimizer `{t.optim.optimizer}`, "
        + (f"scheduler `{t.optim.scheduler}`" if t.optim.scheduler is not None else "no LR scheduler")
        + "\n"
        + (f"- weights: {weights}\n" if weights else "")
        + f"- sss {version}{commit}, {when}\n\n"
        f"| metric | value |\n|---|---|\n{rows}\n\n"
        "Load it with `sss.load_model(folder)`; predict with `sss predict FOLDER --input manifest.csv "
        "--output preds.csv`. The full training configuration is in `config.yaml`"
        + (f" (local paths left out: {', '.join(dropped)})" if dropped else "")
        + ".\n"
        + _card_preprocessing(prep)
    )


def _card_preprocessing(prep: dict[str, Any]) -> str:
    # The model card's account of preprocessing.json: what sss predict and the ONNX inputs are prepared with.
    from sss.data.manifest import ImageNorm

    rows = {k: v for k, v in prep.items() if k not in ("classes", "task") and not k.endswith("_weights")}
    if "image_size" in prep and "image_mean" not in prep:
        norm = ImageNorm.of(prep)  # a model without bound image weights: the defaults, said as such
        rows |= {
            "image_mean": f"{list(norm.mean)} (ImageNet default)",
            "image_std": f"{list(norm.std)} (ImageNet default)",
            "image_interpolation": f"{norm.interpolation} (default)",
        }
    table = "".join(f"| {key} | {value} |\n" for key, value in rows.items())
    sources = [f"{k.removesuffix('_weights')}: `{v}`" for k, v in prep.items() if k.endswith("_weights") and v]
    if not table and not sources:
        return ""  # a model whose data module records no decoding settings
    return (
        "\n## Preprocessing\n\nInputs are prepared as `preprocessing.json` records (`sss predict` and the ONNX "
        "graph's example inputs use it):\n\n| setting | value |\n|---|---|\n"
        + table
        + ("\nPretrained weights the settings are bound to: " + ", ".join(sources) + ".\n" if sources else "")
    )


def _what_ran(metrics: dict[str, Any], t: Any) -> str:
    # The model card's account of the training: what `sss fit` recorded, else the configured limits.
    limits = " / ".join(f"{v} {unit}" for unit, v in (("epochs", t.max_epochs), ("steps", t.max_steps)) if v)
    if "global_step" not in metrics:
        return f"up to {limits} (as configured; the steps run are not recorded here)"
    return (
        f"{metrics['global_step']} optimizer steps, {metrics.get('epochs_completed', '?')} epoch(s) completed"
        + (f" and {into} batch(es) of the next" if (into := metrics.get("batches_into_epoch")) else "")
        + f", {metrics.get('skipped_steps', 0)} skipped steps"
        + (f", {metrics['samples_total']} samples" if "samples_total" in metrics else "")
        + (f" on {metrics['num_processes']} process(es)" if "num_processes" in metrics else "")
        + f" (limits: {limits} max)"
    )


def _precision(metrics: dict[str, Any], t: Any) -> str:
    # The precision Accelerate used, when recorded (fp16 on a CPU runs as "no"), else the configured one.
    used = metrics.get("mixed_precision")
    if used is None:
        return f"precision {t.mixed_precision} (as configured)"
    precision = f"precision {used}" + (" (fp32)" if used == "no" else "")
    return precision + (f" (configured {t.mixed_precision})" if t.mixed_precision != used else "")


def load_model(folder: str | Path, device: str | torch.device = "cpu", trust_code: bool = False) -> torch.nn.Module:
    """Rebuild the module of a model folder and load its weights (strict); returned in eval mode.

    The ``model:`` spec of the folder's ``config.yaml`` is checked first, as text: a ``_target_``
    (at any depth) outside sss's registered models and parts raises `UntrustedCodeError` before
    anything it names is imported. ``trust_code=True`` skips that check and builds whatever the
    folder names: only for folders whose author you trust, with their code installed.

    Example:
        >>> import tempfile
        >>> from sss.config import SSSConfig
        >>> cfg = SSSConfig(name="demo", model={"_target_": "sss.testing.BoringModule"})
        >>> module = instantiate(cfg.model)
        >>> folder = export_model(module, cfg, {}, tempfile.mkdtemp() + "/m")
        >>> loaded = load_model(folder)
        >>> all(torch.equal(a, b) for a, b in zip(module.state_dict().values(), loaded.state_dict().values()))
        True
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in (WEIGHTS, "config.yaml"):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"{folder} is not an sss model folder: {name} is missing (write one with sss export or sss fit)"
            )
    cfg = load_config(folder / "config.yaml", untrusted=True)  # no ${...}, no file outside the folder
    if not trust_code and (found := untrusted_targets(cfg.model)):
        raise UntrustedCodeError(folder / "config.yaml", found)
    module = instantiate(cfg.model)
    state = load_file(str(folder / WEIGHTS), device=str(device))
    _load_weights(module, state, folder / WEIGHTS, "Was config.yaml edited after export?")
    return module.to(device).eval()


def check_model_folder(folder: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Problems of a model folder, found without importing what its config names (``sss check FOLDER``).

    Missing files, a config that does not load, ``_target_`` names outside sss's allowlist (the
    `UntrustedCodeError` message: nothing is imported then) and, for a clean folder, the model
    spec's argument errors. An empty list: `load_model` builds it without ``trust_code``.
    The config is read as untrusted data (`sss.config.load_config` with ``untrusted=True``): a
    ``${...}`` in it, or a model argument naming a file outside the folder, is a problem too.

    Example:
        >>> import tempfile
        >>> from sss.config import SSSConfig
        >>> cfg = SSSConfig(name="demo", model={"_target_": "sss.testing.BoringModule"})
        >>> folder = export_model(instantiate(cfg.model), cfg, {}, tempfile.mkdtemp() + "/m")
        >>> check_model_folder(folder)
        []
    """
    folder = Path(folder)
    try:
        require_complete(folder)
        cfg = load_config(folder / "config.yaml", overrides, untrusted=True)
    except (ConfigError, FileNotFoundError) as exc:
        return [str(exc)]
    if not cfg.model:
        return [f"{folder / 'config.yaml'}: model: missing; a model folder's config must say what builds the model"]
    if found := untrusted_targets(cfg.model):
        return [str(UntrustedCodeError(folder / "config.yaml", found))]
    problems = check_target(cfg.model, "model") or model_problems(cfg.model)  # the ranges `sss fit` refuses
    return [f"{folder / 'config.yaml'}: {problem}" for problem in problems]


def require_complete(folder: str | Path) -> None:
    """Raise `DamagedModelFolderError` naming each file of `FILES` that `folder` lacks, or a bad ``preprocessing.json``.

    Without ``model.safetensors`` and ``config.yaml`` it is not a model folder at all (`FileNotFoundError`).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> for name in (WEIGHTS, "config.yaml", "README.md"):
        ...     _ = (folder / name).write_text("")
        >>> require_complete(folder)
        Traceback (most recent call last):
        ...
        sss.model_folder.DamagedModelFolderError: ... is a damaged model folder: preprocessing.json is missing (how ...
    """
    folder = Path(folder)
    missing = [name for name in FILES if not (folder / name).is_file()]
    if WEIGHTS in missing and "config.yaml" in missing:
        where = f"{folder} is not an sss model folder: {', '.join(missing[:2])} missing"
        raise FileNotFoundError(f"{where} (write one with sss export or sss fit)")
    if missing:
        what = "; ".join(f"{name} is missing ({FILES[name]})" for name in missing)
        raise DamagedModelFolderError(
            f"{folder} is a damaged model folder: {what}. Export it again (sss export), or copy the file from "
            "where the folder came from"
        )
    read_preprocessing(folder)


def read_preprocessing(folder: str | Path) -> dict[str, Any]:
    """The folder's ``preprocessing.json``, checked as data; `DamagedModelFolderError` when missing or malformed.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / PREPROCESSING).write_text('{"classes": ["a", "b"], "task": null, "image_size": 64}')
        >>> read_preprocessing(folder)["image_size"]
        64
    """
    path = Path(folder) / PREPROCESSING
    if not path.is_file():
        raise DamagedModelFolderError(
            f"{Path(folder)} is a damaged model folder: {PREPROCESSING} is missing "
            f"({FILES[PREPROCESSING]}). Export it again (sss export)"
        )
    try:
        prep = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise DamagedModelFolderError(
            f"{path}: not readable JSON ({str(exc)[:80]}): the model folder is damaged; export it again (sss export)"
        ) from None
    problem = _preprocessing_problem(prep)
    if problem:
        raise DamagedModelFolderError(f"{path}: {problem}: the model folder is damaged; export it again (sss export)")
    return prep


def _preprocessing_problem(prep: Any) -> str | None:
    if not isinstance(prep, dict):
        return f"expected a JSON object, got {type(prep).__name__}"
    classes = prep.get("classes")
    if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        return "classes: expected a list of class names or null"
    if prep.get("task") is not None and not isinstance(prep["task"], str):
        return "task: expected a task name or null"
    for key in SETTINGS:
        value = prep.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
            return f"{key}: expected a positive number or null, got {value!r}"
    return _image_problem(prep)


def _image_problem(prep: dict[str, Any]) -> str | None:
    # The image settings bound to the weights (absent in folders exported before they were recorded).
    from sss.data.manifest import ImageNorm

    for key in ("image_mean", "image_std"):
        value = prep.get(key)
        numbers = isinstance(value, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        if value is not None and not numbers:
            return f"{key}: expected a list of 3 numbers, got {value!r}"
    if prep.get("image_interpolation") is not None and not isinstance(prep["image_interpolation"], str):
        return f"image_interpolation: expected a filter name, got {prep['image_interpolation']!r}"
    try:
        ImageNorm.of(prep)
    except ValueError as err:
        return str(err)
    return None


def load_folder_config(
    folder: str | Path, overrides: list[str] | tuple[str, ...] = (), sources: dict[str, str] | None = None
) -> SSSConfig:
    """The folder's ``config.yaml`` with `overrides` merged over it, read as untrusted data (as `load_model` does).

    No ``${...}`` interpolation is resolved (refused, naming the key) and the ``model:`` spec may
    name no file outside the folder (pretrained-weight settings are dropped: the weights come from
    ``model.safetensors``); see `sss.config.load_config`'s ``untrusted``. `sources` as there.

    Example:
        >>> import tempfile
        >>> from sss.config import SSSConfig
        >>> cfg = SSSConfig(name="demo", model={"_target_": "sss.testing.BoringModule"})
        >>> folder = export_model(instantiate(cfg.model), cfg, {}, tempfile.mkdtemp() + "/m")
        >>> load_folder_config(folder, ["trainer.seed=3"]).trainer.seed
        3
    """
    return load_config(Path(folder) / "config.yaml", overrides, sources, untrusted=True)


def _load_weights(module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path, hint: str) -> None:
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
        # Weights from before the missing-modality embeddings (#27) lack them: they keep their fixed initial value.
        missing = [key for key in missing if ".missing.tokens." not in key]
        problem = f"missing {missing[:5]}, unexpected {unexpected[:5]}" if missing or unexpected else ""
    except RuntimeError as exc:  # shape mismatches raise even when not strict
        problem = "; ".join(line.strip() for line in str(exc).splitlines()[1:4])
    if problem:
        raise RuntimeError(
            f"{source} does not fit the model the config builds ({type(module).__name__}): {problem}. {hint}"
        )


def load_trained_weights(module: torch.nn.Module, path: str | Path, hint: str) -> None:
    """Load into `module` the weights of a training checkpoint folder or of a model folder (both safetensors).

    Raises FileNotFoundError when `path` is neither, `DamagedCheckpointError` naming the file when a
    checkpoint folder does not verify against its manifest (as a resume would refuse it), and
    RuntimeError naming the mismatch (with `hint`) when the weights do not fit the module.
    """
    from safetensors.torch import load_file

    from sss.checkpoint import verify_checkpoint

    path = Path(path)
    if (path / MARKER).is_file():
        verify_checkpoint(path)  # sss export / validate / test read only what a resume would trust
    if not (path / WEIGHTS).is_file():
        raise FileNotFoundError(
            f"{path} holds no {WEIGHTS}: pass a checkpoint folder (OUTPUT_DIR/checkpoints/step_N, with {MARKER}) "
            "or a model folder (OUTPUT_DIR/model, or one written by sss export)"
        )
    state = load_file(str(path / WEIGHTS))
    if (path / MARKER).is_file():  # Accelerate saved the trainer's wrapper: its keys start with "module."
        state = {k.removeprefix("module."): v for k, v in state.items()}
    _load_weights(module, state, path / WEIGHTS, hint)
