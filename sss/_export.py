"""The portable model folder: export from a module or a checkpoint, and load it back.

A model folder holds ``model.safetensors`` (weights, no pickle), ``config.yaml`` (the run's
config: ``model:`` rebuilds the module) and ``README.md`` (a model card). ``sss fit`` writes one
to ``OUTPUT_DIR/model``; ``sss export`` writes one from any checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from sss.config import SSSConfig, instantiate, load_config, to_yaml

__all__ = ["export_checkpoint", "export_model", "load_model"]

WEIGHTS = "model.safetensors"


def export_model(module: torch.nn.Module, cfg: SSSConfig, metrics: dict[str, Any], folder: str | Path) -> Path:
    """Write the portable model folder for `module` (trained with `cfg`) to `folder`.

    Example:
        >>> import tempfile
        >>> from sss.config import SSSConfig
        >>> cfg = SSSConfig(name="demo", model={"_target_": "sss.testing.BoringModule"})
        >>> folder = export_model(instantiate(cfg.model), cfg, {"val/accuracy": 0.5}, tempfile.mkdtemp() + "/m")
        >>> sorted(p.name for p in folder.iterdir())
        ['README.md', 'config.yaml', 'model.safetensors']
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # Own contiguous copies: safetensors refuses tensors that share or view another's storage.
    state = {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()}
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt", "sss_model": type(module).__name__})
    (folder / "config.yaml").write_text(to_yaml(cfg))
    (folder / "README.md").write_text(_model_card(module, cfg, metrics))
    return folder


def _model_card(module: torch.nn.Module, cfg: SSSConfig, metrics: dict[str, Any]) -> str:
    params = sum(p.numel() for p in module.parameters())
    rows = "\n".join(f"| {k} | {v:.4f} |" for k, v in metrics.items() if isinstance(v, float))
    classes = getattr(module, "classes", None) or getattr(getattr(module, "hparams", None), "classes", None)
    task = "multi-label" if getattr(module, "multi_label", False) else "single-label classification"
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


def export_checkpoint(cfg: SSSConfig, checkpoint: str | Path, out: str | Path) -> Path:
    """Write the model folder of a training checkpoint (``sss export CONFIG --ckpt PATH OUT``).

    The weights come from the checkpoint's ``model.safetensors``; the metrics for the model card
    from its ``trainer_state.json``. An existing non-empty `out` is refused, never overwritten.
    """
    from safetensors.torch import load_file

    from sss.trainer._checkpoint_io import MARKER

    checkpoint, out = Path(checkpoint), Path(out)
    if not (checkpoint / MARKER).is_file() or not (checkpoint / WEIGHTS).is_file():
        raise FileNotFoundError(f"{checkpoint} is not a complete sss checkpoint (needs {MARKER} and {WEIGHTS})")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already exists and is not empty; choose another folder or remove it")
    module = instantiate(cfg.model)
    # Accelerate saved the trainer's wrapper around the module: its keys start with "module.".
    state = {k.removeprefix("module."): v for k, v in load_file(str(checkpoint / WEIGHTS)).items()}
    _load_weights(module, state, checkpoint / WEIGHTS, "Export with the config and overrides it was trained with.")
    meta = json.loads((checkpoint / MARKER).read_text())
    return export_model(module, cfg, dict(meta.get("metrics", {})), out)
