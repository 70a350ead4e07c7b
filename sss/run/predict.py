"""``sss predict``: per-sample predictions of a model folder for the rows of a manifest."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch

from sss.model_folder import PREPROCESSING, SETTINGS, load_model

__all__ = ["predict"]


def predict(
    model_dir: str | Path,
    manifest: str | Path,
    output: str | Path,
    batch_size: int = 32,
    device: str = "cpu",
    trust_code: bool = False,
) -> Path:
    """Write per-sample predictions with class probabilities for the rows of `manifest` to `output` (CSV).

    The model is built with `sss.load_model`: a folder whose config names code outside sss's
    registered models raises `sss.model_folder.UntrustedCodeError` before anything is imported,
    unless `trust_code` (``sss predict --trust-code``).

    `manifest` is a CSV or JSONL file like a training split (``image`` and/or ``audio`` columns,
    paths relative to its folder; labels optional). Inputs are decoded as in evaluation, with the
    model folder's ``preprocessing.json``. Columns: ``row`` (the manifest line), the input paths,
    ``prediction`` (the top class, or ``;``-joined classes over 0.5 for multi-label) and one
    ``prob_<class>`` per class.
    """
    from torch.utils.data import DataLoader

    from sss.data.manifest import ManifestDataset, collate
    from sss.trainer.module import output_logits

    model_dir, manifest, output = Path(model_dir), Path(manifest), Path(output)
    if output.exists():
        raise FileExistsError(f"{output} already exists; choose another --output or remove it")
    prep_file = model_dir / PREPROCESSING
    prep = json.loads(prep_file.read_text()) if prep_file.is_file() else {}
    module = load_model(model_dir, device, trust_code=trust_code)
    settings = {key: prep[key] for key in SETTINGS if key in prep}
    dataset = ManifestDataset(
        manifest.parent, manifest.stem, classes=prep.get("classes"), require_label=False, **settings
    )
    classes = prep.get("classes") or dataset.classes
    multilabel = prep.get("task") == "multilabel"
    rows = []
    with torch.no_grad():
        for i, batch in enumerate(DataLoader(dataset, batch_size=batch_size, collate_fn=collate)):
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            logits = output_logits(module.predict_step(batch, i))
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
