"""`export_run_model`: the one way a run writes its model folder (``sss fit``, `HubPush`, the MLflow artifact)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sss.callbacks.ema import exported_weights

if TYPE_CHECKING:
    from sss.config import SSSConfig
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["export_run_model"]


def export_run_model(
    trainer: SSSTrainer,
    module: LitModule,
    folder: str | Path,
    metrics: Mapping[str, Any],
    cfg: SSSConfig | None = None,
) -> Path | None:
    """Write the model folder of the run `trainer` trains to `folder`; call it on every process.

    Every process takes part in ``accelerator.get_state_dict`` (under FSDP / ZeRO-3 it gathers the
    shards); the main process then writes the folder and returns its path, the others return None.
    The weights are the `sss.callbacks.EMA` average when an EMA callback has ``export=True`` (the
    model card says so), else the trained ones, under the module's own names. The folder is
    `sss.model_folder.export_model`'s, with `metrics` in the model card and `cfg` as its
    ``config.yaml``; with no `cfg`, the run's ``OUTPUT_DIR/config.yaml`` (what ``sss fit`` stored),
    or, when there is none (plain Python use), ``model.safetensors`` alone. LoRA adapters
    (``model.adapter``) are merged into plain weights, and the folder's config has no ``model.adapter``.

    Example:
        >>> import tempfile
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule, boring_loader
        >>> out = tempfile.mkdtemp()
        >>> trainer = SSSTrainer(max_steps=2, mixed_precision="no", output_dir=out)
        sss: mixed precision no
        >>> module = BoringModule()
        >>> _ = trainer.fit(module, train_dataloaders=boring_loader())
        >>> folder = export_run_model(trainer, module, f"{out}/model", trainer.state.metrics)
        >>> sorted(p.name for p in folder.iterdir())  # no OUTPUT_DIR/config.yaml: the weights alone
        ['model.safetensors']
    """
    # On every process: under FSDP / ZeRO-3 this gathers the shards; keys are the trainer wrapper's "module.<name>"
    full = trainer.accelerator.get_state_dict(trainer.model)
    if not trainer.accelerator.is_main_process:
        return None
    weights, note = exported_weights(trainer, full)
    folder = Path(folder)
    stored = trainer.output_dir / "config.yaml"
    if cfg is None and stored.is_file():
        from sss.config import load_config

        cfg = load_config(stored)
    # LoRA adapters (model.adapter) are merged: the folder holds plain weights and a config without the adapter.
    from sss.models.adapter import plain_export  # here: importing sss.models loads torchmetrics and matplotlib

    module, cfg, weights, note = plain_export(module, cfg, weights, note)
    if cfg is None:
        return _weights_alone(module, weights, folder)
    from sss.model_folder import export_model

    return export_model(module, cfg, dict(metrics), folder, trainer.datamodule, state_dict=weights, weights_source=note)


def _weights_alone(module: LitModule, weights: Mapping[str, Any], folder: Path) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    # Own contiguous copies: safetensors refuses tensors that share or view another's storage.
    state = {k: v.detach().cpu().contiguous().clone() for k, v in weights.items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt", "sss_model": type(module).__name__})
    return folder
