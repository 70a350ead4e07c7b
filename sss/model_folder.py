"""The portable model folder: export a trained module, load it back (`sss.load_model`).

A model folder holds ``model.safetensors`` (weights, no pickle), ``config.yaml`` (the run's
config: ``model:`` rebuilds the module), ``preprocessing.json`` (classes, task, image size,
sample rate, clip length: how inputs were prepared) and ``README.md`` (a model card). ``sss fit``
writes one to ``OUTPUT_DIR/model``; ``sss export`` writes one from any checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from sss.checkpoint import MARKER
from sss.config import SSSConfig, instantiate, load_config, to_yaml

__all__ = [
    "PREPROCESSING",
    "SETTINGS",
    "WEIGHTS",
    "export_model",
    "load_model",
    "load_trained_weights",
    "preprocessing",
]

WEIGHTS = "model.safetensors"
PREPROCESSING = "preprocessing.json"
SETTINGS = ("image_size", "sample_rate", "clip_seconds", "event_frame_rate")
"""The datamodule settings a model folder records, so that prediction decodes inputs as training did."""


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


def export_model(
    module: torch.nn.Module,
    cfg: SSSConfig,
    metrics: dict[str, Any],
    folder: str | Path,
    datamodule: Any = None,
) -> Path:
    """Write the portable model folder for `module` (trained with `cfg`, on `datamodule`) to `folder`.

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
    # Own contiguous copies: safetensors refuses tensors that share or view another's storage.
    state = {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()}
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt", "sss_model": type(module).__name__})
    (folder / "config.yaml").write_text(to_yaml(cfg))
    prep = preprocessing(datamodule) if datamodule is not None else {"classes": None, "task": None}
    (folder / PREPROCESSING).write_text(json.dumps(prep, indent=2))
    (folder / "README.md").write_text(_model_card(module, cfg, metrics, prep))
    return folder


def _model_card(module: torch.nn.Module, cfg: SSSConfig, metrics: dict[str, Any], prep: dict[str, Any]) -> str:
    params = sum(p.numel() for p in module.parameters())
    rows = "\n".join(f"| {k} | {v:.4f} |" for k, v in metrics.items() if isinstance(v, float))
    classes = prep.get("classes")
    task = {"multilabel": "multi-label classification", "segmentation": "shadow segmentation"}.get(
        prep.get("task") or "", "single-label classification"
    )
    t = cfg.trainer
    return (
        f"# {cfg.name}\n\nA Shadow & Sound Hunter model trained with `sss` ({type(module).__name__}, "
        f"{params / 1e6:.2f} M parameters).\n\n"
        f"- task: {task}" + (f" over {list(classes)}" if classes else "") + "\n"
        f"- model: `{cfg.model}`\n- data: `{cfg.data}`\n"
        f"- training: {t.max_epochs} epochs / {t.max_steps} steps max, precision {t.mixed_precision}, "
        f"accumulation {t.gradient_accumulation_steps}, clip {t.max_grad_norm}, seed {t.seed}, "
        f"optimizer `{t.optim.optimizer}`, scheduler `{t.optim.scheduler}`\n\n"
        f"| metric | value |\n|---|---|\n{rows}\n\n"
        "Load it with `sss.load_model(folder)`; predict with `sss predict FOLDER --input manifest.csv "
        "--output preds.csv`. The full training configuration is in `config.yaml`.\n"
    )


def load_model(folder: str | Path, device: str | torch.device = "cpu") -> torch.nn.Module:
    """Rebuild the module of a model folder and load its weights (strict); returned in eval mode.

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
    cfg = load_config(folder / "config.yaml")
    module = instantiate(cfg.model)
    state = load_file(str(folder / WEIGHTS), device=str(device))
    _load_weights(module, state, folder / WEIGHTS, "Was config.yaml edited after export?")
    return module.to(device).eval()


def _load_weights(module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path, hint: str) -> None:
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
        problem = f"missing {missing[:5]}, unexpected {unexpected[:5]}" if missing or unexpected else ""
    except RuntimeError as exc:  # shape mismatches raise even when not strict
        problem = "; ".join(line.strip() for line in str(exc).splitlines()[1:4])
    if problem:
        raise RuntimeError(
            f"{source} does not fit the model the config builds ({type(module).__name__}): {problem}. {hint}"
        )


def load_trained_weights(module: torch.nn.Module, path: str | Path, hint: str) -> None:
    """Load into `module` the weights of a training checkpoint folder or of a model folder (both safetensors).

    Raises FileNotFoundError when `path` is neither, and RuntimeError naming the mismatch (with
    `hint`) when the weights do not fit the module.
    """
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / WEIGHTS).is_file():
        raise FileNotFoundError(
            f"{path} holds no {WEIGHTS}: pass a checkpoint folder (OUTPUT_DIR/checkpoints/step_N, with {MARKER}) "
            "or a model folder (OUTPUT_DIR/model, or one written by sss export)"
        )
    state = load_file(str(path / WEIGHTS))
    if (path / MARKER).is_file():  # Accelerate saved the trainer's wrapper: its keys start with "module."
        state = {k.removeprefix("module."): v for k, v in state.items()}
    _load_weights(module, state, path / WEIGHTS, hint)
