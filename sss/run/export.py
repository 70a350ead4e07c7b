"""``sss export``: the model folder of a training checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from sss.callbacks.ema import ema_export_spec, load_ema_weights, weights_note
from sss.checkpoint import MARKER
from sss.config import SSSConfig
from sss.model_folder import WEIGHTS, add_onnx, export_model, fresh_folder, load_trained_weights
from sss.models.adapter import plain_export
from sss.run.parts import build_parts

__all__ = ["export_checkpoint"]


def export_checkpoint(cfg: SSSConfig, checkpoint: str | Path, out: str | Path, format: str = "safetensors") -> Path:
    """Write the model folder of a training checkpoint (``sss export [CONFIG] OUT --ckpt PATH``).

    `cfg` is the config it was trained with: the one given, or ``load_stored_config(checkpoint)``
    (`sss.run.evaluate.load_stored_config`), the one the checkpoint keeps.

    The weights come from the checkpoint's ``model.safetensors`` (its ``ema.safetensors`` when the
    config has ``callbacks: [{_target_: sss.callbacks.EMA, export: true}]``); the metrics for the
    model card from its ``trainer_state.json``. An existing non-empty `out` is refused, never overwritten.
    ``format="onnx"`` adds ``model.onnx`` and its model card part (`sss.model_folder.add_onnx`);
    when that export fails, `out` is left as it was. LoRA adapters (``model.adapter``) are merged into
    plain weights (no ``lora_`` keys in the safetensors or the ONNX graph), and the folder's ``config.yaml``
    has no ``model.adapter``: `sss.load_model` builds the plain model.
    """

    checkpoint, out = Path(checkpoint), Path(out)
    if not (checkpoint / MARKER).is_file() or not (checkpoint / WEIGHTS).is_file():
        raise FileNotFoundError(f"{checkpoint} is not a complete sss checkpoint (needs {MARKER} and {WEIGHTS})")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already exists and is not empty; choose another folder or remove it")
    parts = build_parts(cfg)  # also the settings that come from the data, such as an inferred clip length
    load_trained_weights(parts.module, checkpoint, "Export with the config and overrides it was trained with.")
    ema, note = ema_export_spec(cfg.callbacks), None
    if ema is not None:  # verified with the rest of the folder just above
        parts.module.load_state_dict(load_ema_weights(checkpoint))
        note = weights_note(ema)
    meta = json.loads((checkpoint / MARKER).read_text())
    metrics = dict(meta.get("metrics", {}))
    # LoRA adapters (model.adapter) merged into plain weights; the folder's config builds the plain model.
    module, cfg, _, note = plain_export(parts.module, cfg, None, note)
    with fresh_folder(out):  # a failed export leaves no folder behind, and a full disk names `out`
        export_model(module, cfg, metrics, out, parts.datamodule, weights_source=note)
        if format == "onnx":
            add_onnx(module, out)
    return out
