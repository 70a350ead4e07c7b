"""`EMA`: an exponential moving average of the weights (timm's ``ModelEmaV3``), validated, checkpointed, exported.

The average is timm's own (``timm.utils.model_ema.ModelEmaV3``: its decay, warm-up and foreach
update); this callback only decides when it is updated, evaluated, saved, restored and exported.
The EMA weights of a checkpoint are ``ema.safetensors`` in its folder, written by a save-state hook
of Accelerate before the marker, so they are in the manifest and verified like every other file.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sss.callbacks.base import Callback
from sss.checkpoint import get_rng_state, set_rng_state
from sss.config.constraints import NonNegativeInt, PositiveFloat, PositiveInt, UnitFloat

if TYPE_CHECKING:
    from timm.utils.model_ema import ModelEmaV3

    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["EMA", "EMA_WEIGHTS", "ema_export_spec", "load_ema_weights", "weights_note"]

EMA_WEIGHTS = "ema.safetensors"
"""The EMA weights in a checkpoint folder (the module's state dict names, no ``module.`` prefix)."""
_TARGETS = ("sss.callbacks.EMA", "sss.callbacks.ema.EMA")
PREFIX = "val_ema"


class EMA(Callback):
    """Keeps an exponential moving average of the module's weights, and evaluates and exports it.

    After each optimizer step that was applied (every `every_n_steps`-th; fp16 skipped steps do not
    count) the average moves towards the module's weights: ``ema = decay * ema + (1 - decay) * w``
    over parameters and floating buffers (integer buffers are copied; `exclude_buffers` copies all
    buffers), by timm's ``ModelEmaV3.update(module, step=global_step)``. Its first update copies
    the weights. With `warmup` the decay grows as ``1 - (1 + step / warmup_gamma) ** -warmup_power``
    up to `decay` (timm's ``use_warmup``), so that early, poor weights fade out fast.

    Each process updates its own copy of the unwrapped module: data-parallel processes hold equal
    weights, so their averages stay equal without communication. The average is kept in float32
    even for a half-precision module (Accelerate's autocast leaves the parameters in float32).
    Under FSDP or DeepSpeed, where a process holds a shard, it is refused.

    With `eval`, after each validation of the fit the EMA weights are swapped into the module,
    evaluated on the same validation data as ``val_ema/<metric>`` (in ``trainer.state.metrics``, so
    checkpoint ranking and early stopping may monitor them), and the trained weights are put back
    bit for bit. The other callbacks see no second pass: the figures join the validation's
    ``eval_metrics`` for the callbacks after this one in the list (``sss fit``'s stock callbacks
    all are; put `EarlyStopping` on ``val_ema/...`` after it). The RNG is restored after the pass,
    so adding the callback leaves the training itself bitwise unchanged.

    With ``model.adapter`` (LoRA) the average covers the whole module as it trains: the adapter weights
    (each of LoRA's A and B averaged on its own, as for any other parameter) and the frozen weights under
    them, which stay as they are. An exported average is merged like the trained weights
    (`sss.models.adapter.plain_export`): the model folder holds plain weights.

    Checkpoints hold the average (``ema.safetensors``) and a resume continues it exactly. With
    `export`, the exported model folder (``sss fit``'s ``OUTPUT_DIR/model``, ``sss export --ckpt``)
    holds the EMA weights instead of the trained ones, and its model card says so.

    Args:
        decay: the EMA decay per update.
        warmup: ramp the decay up (timm's ``use_warmup``), with `warmup_gamma` and `warmup_power`.
        min_decay: the floor of the warmed-up decay.
        update_after_step: copy the weights (decay 0) up to this optimizer step.
        every_n_steps: update at every N-th optimizer step.
        exclude_buffers: copy buffers (BatchNorm statistics) instead of averaging them.
        export: export the EMA weights instead of the trained ones.
        eval: evaluate the EMA weights after each validation (``val_ema/...``).
        device: keep the average on this device (e.g. ``"cpu"`` to spare GPU memory); default the module's.
        dataloaders: the validation loader for the EMA pass when ``fit`` was given loaders rather
            than a datamodule (a callback cannot reach a loader passed to ``fit``).

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule, boring_loader
        >>> ema = EMA(decay=0.9, dataloaders=boring_loader(n=16))
        >>> trainer = SSSTrainer(max_steps=4, mixed_precision="no", callbacks=[ema])
        sss: mixed precision no
        >>> val = boring_loader(n=16)
        >>> metrics = trainer.fit(BoringModule(), train_dataloaders=boring_loader(), val_dataloaders=val)
        >>> ema.updates, "val_ema/accuracy" in metrics, "val/accuracy" in metrics
        (4, True, True)
    """

    def __init__(
        self,
        decay: UnitFloat = 0.999,
        warmup: bool = False,
        warmup_gamma: PositiveFloat = 1.0,
        warmup_power: PositiveFloat = 2 / 3,
        min_decay: UnitFloat = 0.0,
        update_after_step: NonNegativeInt = 0,
        every_n_steps: PositiveInt = 1,
        exclude_buffers: bool = False,
        export: bool = False,
        eval: bool = True,
        device: str | None = None,
        dataloaders: Any = None,
    ) -> None:
        if not 0.0 <= decay <= 1.0 or not 0.0 <= min_decay <= 1.0:
            raise ValueError(f"EMA: decay and min_decay must be in [0, 1], got {decay} and {min_decay}")
        if every_n_steps < 1 or update_after_step < 0 or warmup_gamma <= 0 or warmup_power <= 0:
            raise ValueError(
                "EMA: every_n_steps >= 1, update_after_step >= 0, warmup_gamma > 0 and warmup_power > 0 are needed "
                f"(got {every_n_steps}, {update_after_step}, {warmup_gamma}, {warmup_power})"
            )
        self.decay, self.warmup, self.warmup_gamma, self.warmup_power = decay, warmup, warmup_gamma, warmup_power
        self.min_decay, self.update_after_step, self.every_n_steps = min_decay, update_after_step, every_n_steps
        self.exclude_buffers, self.export, self.eval, self.device = exclude_buffers, export, eval, device
        self.dataloaders = dataloaders
        self.ema: ModelEmaV3 | None = None
        """timm's ``ModelEmaV3``; its ``module`` holds the average (None before the fit starts)."""
        self.updates = 0
        """EMA updates since step 0 of the run (a resume continues the count)."""
        self._restored = False
        self._in_epoch = False
        self._loader: Any = None
        self._hooked: Any = None  # the Accelerator whose save_state writes our file, and the hook's handle
        self._handle: Any = None
        self._outer: dict[str, float] | None = None
        self._warned = False

    # ------------------------------------------------------------------ the average
    def _new(self, module: torch.nn.Module) -> ModelEmaV3:
        from timm.utils.model_ema import ModelEmaV3

        half = any(p.is_floating_point() and p.dtype in (torch.float16, torch.bfloat16) for p in module.parameters())
        return ModelEmaV3(
            module,
            decay=self.decay,
            min_decay=self.min_decay,
            update_after_step=self.update_after_step,
            use_warmup=self.warmup,
            warmup_gamma=self.warmup_gamma,
            warmup_power=self.warmup_power,
            device=torch.device(self.device) if self.device is not None else None,
            dtype=torch.float32 if half else None,  # a half-precision average would round most updates away
            exclude_buffers=self.exclude_buffers,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "decay": self.decay}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state.get("updates", 0))

    def weights(self) -> dict[str, torch.Tensor]:
        """The EMA weights, by the module's state dict names (what `export` writes to the model folder)."""
        if self.ema is None:
            raise RuntimeError("EMA: no average yet: it is created when the fit starts")
        return dict(self.ema.module.state_dict())

    # ------------------------------------------------------------------ events
    def on_load_checkpoint(self, trainer: SSSTrainer, module: LitModule) -> None:
        from safetensors.torch import load_file

        # Before FIT_START: the average is built on the restored module, then given the saved average.
        module = _unwrapped(trainer)
        self.ema, self._restored = self._new(module), True
        file = Path(str(trainer.state.last_checkpoint)) / EMA_WEIGHTS
        if not file.is_file():
            warnings.warn(
                f"EMA: {file.parent} holds no {EMA_WEIGHTS} (saved without the EMA callback): the average starts "
                "from the checkpoint's weights",
                stacklevel=2,
            )
            self.updates = 0
            return
        device = next(iter(self.ema.module.state_dict().values())).device
        self.ema.module.load_state_dict(load_file(str(file), device=str(device)))

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        from accelerate.utils import DistributedType

        if trainer.accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            raise ValueError(
                "EMA keeps a full copy of the weights on each process, and under FSDP / DeepSpeed a process holds "
                "a shard: remove the EMA callback, or train without sharding"
            )
        if not self._restored:  # a fresh run: the average starts at the initial weights
            self.ema, self.updates = self._new(_unwrapped(trainer)), 0
        self._restored, self._loader, self._warned = False, None, False
        if self._hooked is not trainer.accelerator:
            if self._handle is not None:
                self._handle.remove()
            self._handle = trainer.accelerator.register_save_state_pre_hook(self._save_hook(trainer.accelerator))
            self._hooked = trainer.accelerator

    def on_epoch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._in_epoch = True

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        state = trainer.state
        if self.ema is None or state.step_was_skipped or state.global_step % self.every_n_steps:
            return
        self.ema.update(_unwrapped(trainer), step=state.global_step)
        self.updates += 1

    def on_validation_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        state = trainer.state
        ours = self._in_epoch and state.stage == "val" and any(k.startswith("val/") for k in state.eval_metrics)
        if not (self.eval and ours and self.ema is not None):
            return  # a standalone validate(), the end-of-fit ablation passes, or no average to evaluate
        loader = self._val_loader(trainer)
        if loader is None:
            return
        self._outer = dict(state.eval_metrics)
        ema_metrics = self._evaluate(trainer, loader)
        # The callbacks after this one see the validation's figures and the EMA's as one pass.
        state.eval_metrics = {**self._outer, **ema_metrics}

    def on_epoch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._in_epoch = False
        if self._outer is not None:  # what follows the epoch (the end-of-fit evaluation) sees the plain pass
            trainer.state.eval_metrics, self._outer = self._outer, None

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._in_epoch, self._loader = False, None

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._in_epoch, self._loader = False, None

    # ------------------------------------------------------------------ evaluation and saving
    def _val_loader(self, trainer: SSSTrainer) -> Any:
        if self._loader is None:
            if self.dataloaders is not None:
                self._loader = self.dataloaders
            elif hasattr(trainer.datamodule, "val_dataloader"):
                self._loader = trainer.datamodule.val_dataloader()  # once per fit: the same split, in order
        if self._loader is None and not self._warned:
            self._warned = True
            warnings.warn(
                "EMA: no val_ema metrics: this fit got its validation loader directly, which a callback cannot "
                "reach; pass it as EMA(dataloaders=...) too, or set EMA(eval=False)",
                stacklevel=2,
            )
        return self._loader

    def _evaluate(self, trainer: SSSTrainer, loader: Any) -> dict[str, float]:
        state, module = trainer.state, trainer.module
        outputs, callbacks, rng = state.eval_outputs, trainer.callbacks, get_rng_state()
        live = list(module.state_dict().values())  # views of the module's own tensors
        trained = [t.clone() for t in live]
        try:
            with torch.no_grad():
                for tensor, averaged in zip(live, self.ema.module.state_dict().values(), strict=True):
                    tensor.copy_(averaged)
            trainer.callbacks = []  # no callback takes this pass for a validation of its own
            return trainer.validate(module, dataloaders=loader, prefix=PREFIX)
        finally:
            trainer.callbacks = callbacks
            with torch.no_grad():
                for tensor, kept in zip(live, trained, strict=True):
                    tensor.copy_(kept)
            set_rng_state(rng)  # the loader's iteration drew from it: the training goes on as without the EMA
            state.eval_outputs = outputs

    def _save_hook(self, accelerator: Any) -> Any:
        def save(models: Any, weights: Any, output_dir: str) -> None:
            # Called by save_state on every process, before its files and before sss writes the marker.
            from safetensors.torch import save_file

            each_node = accelerator.project_configuration.save_on_each_node
            writer = accelerator.is_local_main_process if each_node else accelerator.is_main_process
            if self.ema is None or not writer:
                return
            # Own contiguous copies: safetensors refuses tensors that share storage (tied weights).
            state = {k: v.detach().cpu().contiguous().clone() for k, v in self.ema.module.state_dict().items()}
            meta = {"format": "pt", "ema_decay": str(self.decay), "ema_updates": str(self.updates)}
            save_file(state, str(Path(output_dir) / EMA_WEIGHTS), metadata=meta)

        return save


def _unwrapped(trainer: SSSTrainer) -> torch.nn.Module:
    # The prepared model is the trainer's step router (in DDP's wrapper); its .module is the LitModule.
    return trainer.accelerator.unwrap_model(trainer.model).module


def ema_export_spec(callbacks: list[Any]) -> dict[str, Any] | None:
    """The ``callbacks:`` entry of an `EMA` with ``export: true``, if a config has one (read as text, nothing imported).

    Example:
        >>> ema_export_spec([{"_target_": "sss.callbacks.EMA", "decay": 0.998, "export": True}])["decay"]
        0.998
        >>> ema_export_spec([{"_target_": "sss.callbacks.EMA"}]) is None
        True
    """
    for spec in callbacks or []:
        if isinstance(spec, dict) and spec.get("_target_") in _TARGETS and spec.get("export") is True:
            return spec
    return None


def weights_note(spec_or_callback: Any) -> str:
    """How a model card names EMA weights: ``ema (decay 0.998)``, with the warm-up when there is one.

    Example:
        >>> weights_note({"decay": 0.998, "warmup": True})
        'ema (decay 0.998, warm-up power 0.6667)'
    """
    get = spec_or_callback.get if isinstance(spec_or_callback, dict) else lambda k, d: getattr(spec_or_callback, k, d)
    note = f"ema (decay {get('decay', 0.999)}"
    if get("warmup", False):
        note += f", warm-up power {round(float(get('warmup_power', 2 / 3)), 4)}"
    return note + ")"


def load_ema_weights(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """The EMA weights a checkpoint folder holds (``ema.safetensors``); FileNotFoundError naming it when absent.

    Example:
        >>> load_ema_weights("/nonexistent")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        FileNotFoundError: /nonexistent/ema.safetensors is missing: ...
    """
    from safetensors.torch import load_file

    file = Path(checkpoint) / EMA_WEIGHTS
    if not file.is_file():
        raise FileNotFoundError(
            f"{file} is missing: the config exports EMA weights (callbacks: EMA with export: true) but this checkpoint "
            "was saved without the EMA callback. Export a checkpoint of the EMA run, or set export: false"
        )
    return load_file(str(file))


def exported_weights(trainer: SSSTrainer, full: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], str | None]:
    """The weights every model folder of a run holds, and the card's note on them.

    `full` is ``accelerator.get_state_dict(trainer.model)`` (gathered on every process). With an `EMA`
    callback whose ``export`` is on, the folder holds its average and the note names it; otherwise the
    trained weights, under the module's own names. `sss fit`, `HubPush` and the MLflow artifact all
    export through this, so the three folders hold the same weights.

    Example:
        >>> from types import SimpleNamespace
        >>> weights, note = exported_weights(SimpleNamespace(callbacks=[]), {"module.w": torch.ones(1)})
        >>> list(weights), note
        (['w'], None)
    """
    ema = next((c for c in trainer.callbacks if isinstance(c, EMA) and c.export and c.ema is not None), None)
    if ema is None:
        return {k.removeprefix("module."): v for k, v in full.items()}, None
    return ema.weights(), weights_note(ema)
