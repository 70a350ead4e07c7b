"""The portable model folder: export from a module or a checkpoint, load it back, predict with it.

A model folder holds ``model.safetensors`` (weights, no pickle), ``config.yaml`` (the run's
config: ``model:`` rebuilds the module), ``preprocessing.json`` (classes, task, image size,
sample rate, clip length: how inputs were prepared) and ``README.md`` (a model card). ``sss fit``
writes one to ``OUTPUT_DIR/model``; ``sss export`` writes one from any checkpoint.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import torch

from sss.config import SSSConfig, instantiate, load_config, to_yaml

__all__ = ["export_checkpoint", "export_model", "load_model", "predict", "preprocessing"]

WEIGHTS = "model.safetensors"
PREPROCESSING = "preprocessing.json"
_SETTINGS = ("image_size", "sample_rate", "clip_seconds", "event_frame_rate")


def preprocessing(datamodule: Any) -> dict[str, Any]:
    """How a datamodule prepares inputs (classes, task and decoding settings), for the model folder.

    Example:
        >>> class DM:
        ...     classes, task, image_size, sample_rate, clip_seconds = ["a", "b"], "multiclass", 64, 16000, 1.0
        >>> preprocessing(DM())["classes"]
        ['a', 'b']
    """
    found = {key: getattr(datamodule, key) for key in _SETTINGS if getattr(datamodule, key, None) is not None}
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

    from sss.trainer._checkpoint_io import MARKER

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


def export_checkpoint(cfg: SSSConfig, checkpoint: str | Path, out: str | Path) -> Path:
    """Write the model folder of a training checkpoint (``sss export CONFIG --ckpt PATH OUT``).

    The weights come from the checkpoint's ``model.safetensors``; the metrics for the model card
    from its ``trainer_state.json``. An existing non-empty `out` is refused, never overwritten.
    """

    from sss.trainer._checkpoint_io import MARKER

    checkpoint, out = Path(checkpoint), Path(out)
    if not (checkpoint / MARKER).is_file() or not (checkpoint / WEIGHTS).is_file():
        raise FileNotFoundError(f"{checkpoint} is not a complete sss checkpoint (needs {MARKER} and {WEIGHTS})")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already exists and is not empty; choose another folder or remove it")
    module = instantiate(cfg.model)
    load_trained_weights(module, checkpoint, "Export with the config and overrides it was trained with.")
    meta = json.loads((checkpoint / MARKER).read_text())
    datamodule = instantiate(cfg.data) if cfg.data else None
    if datamodule is not None and hasattr(datamodule, "setup"):
        datamodule.setup("fit")  # settings such as an inferred clip length are known after setup
    return export_model(module, cfg, dict(meta.get("metrics", {})), out, datamodule)


def predict(
    model_dir: str | Path, manifest: str | Path, output: str | Path, batch_size: int = 32, device: str = "cpu"
) -> Path:
    """Write per-sample predictions with class probabilities for the rows of `manifest` to `output` (CSV).

    `manifest` is a CSV or JSONL file like a training split (``image`` and/or ``audio`` columns,
    paths relative to its folder; labels optional). Inputs are decoded as in evaluation, with the
    model folder's ``preprocessing.json``. Columns: ``row`` (the manifest line), the input paths,
    ``prediction`` (the top class, or ``;``-joined classes over 0.5 for multi-label) and one
    ``prob_<class>`` per class.
    """
    from torch.utils.data import DataLoader

    from sss.data.manifest import ManifestDataset, collate
    from sss.trainer.module import _logits

    model_dir, manifest, output = Path(model_dir), Path(manifest), Path(output)
    if output.exists():
        raise FileExistsError(f"{output} already exists; choose another --output or remove it")
    prep_file = model_dir / PREPROCESSING
    prep = json.loads(prep_file.read_text()) if prep_file.is_file() else {}
    module = load_model(model_dir, device)
    settings = {key: prep[key] for key in _SETTINGS if key in prep}
    dataset = ManifestDataset(
        manifest.parent, manifest.stem, classes=prep.get("classes"), require_label=False, **settings
    )
    classes = prep.get("classes") or dataset.classes
    multilabel = prep.get("task") == "multilabel"
    rows = []
    with torch.no_grad():
        for i, batch in enumerate(DataLoader(dataset, batch_size=batch_size, collate_fn=collate)):
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            logits = _logits(module.predict_step(batch, i))
            if logits is None:
                raise RuntimeError(f"{type(module).__name__}.predict_step returned no class logits to write")
            probs = (logits.sigmoid() if multilabel else logits.softmax(-1)).float().cpu()
            for index, p in zip(batch["index"].tolist(), probs, strict=True):
                rows.append((index, p))
    names = classes or [str(k) for k in range(probs.shape[-1])]
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "image", "audio", "prediction", *(f"prob_{c}" for c in names)])
        for index, p in rows:
            top = (
                ";".join(c for c, q in zip(names, p, strict=True) if q > 0.5) if multilabel else names[int(p.argmax())]
            )
            inputs = [_relative(getattr(dataset, key), index, manifest.parent) for key in ("images", "audio")]
            writer.writerow([dataset.lines[index], *inputs, top, *(f"{float(q):.6f}" for q in p)])
    return output


def _relative(paths: list[str], index: int, root: Path) -> str:
    if index >= len(paths) or not paths[index]:
        return ""
    try:
        return str(Path(paths[index]).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(paths[index])
