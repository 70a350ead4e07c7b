"""`DebugShapes`: what ``sss fit --debug`` adds: shapes at every stage of the first batches, anomaly detection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["DebugShapes", "describe"]


class DebugShapes(Callback):
    """Print the shapes of the first training and the first evaluation batch at each stage, with anomaly detection on.

    The batch as the module receives it, the output of each part (image encoder, audio encoder,
    fusion, heads) and the loss, once per stage (``fit``, ``val``, ``test``). Autograd anomaly
    detection names the forward operation whose backward produced a NaN (slow: debugging only).
    Main process only.

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule, boring_loader
        >>> trainer = SSSTrainer(max_steps=1, callbacks=[DebugShapes()], mixed_precision="no",
        ...                      log={"progress": False, "trackers": []}, checkpoint={"every_epoch": False})
        sss: mixed precision no
        >>> _ = trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=8, batch_size=4))  # doctest: +ELLIPSIS
        sss debug [fit] batch: audio float32 [4, 1, 16], image float32 [4, 3, 4, 4], index int64 [4], label int64 [4]
        sss debug [fit] image_encoder -> float32 [4, 8]
        sss debug [fit] audio_encoder -> float32 [4, 8]
        sss debug [fit] fusion_head -> float32 [4, 2]
        sss debug [fit] outputs -> float32 [4, 2]
        sss debug [fit] loss: ...
    """

    def __init__(self, anomaly_detection: bool = True) -> None:
        self.anomaly_detection = anomaly_detection
        self._handles: list[Any] = []
        self._shown: set[str] = set()
        self._anomaly_before = False

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._shown = set()
        self._anomaly_before = torch.is_anomaly_enabled()
        if self.anomaly_detection:
            torch.autograd.set_detect_anomaly(True)

    def on_batch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if "fit" not in self._shown and not self._handles:
            self._attach(trainer, module)

    def on_after_backward(self, trainer: SSSTrainer, module: LitModule) -> None:
        if "fit" in self._shown or not self._handles:
            return
        self._shown.add("fit")  # the first optimizer step's micro-batches were shown
        self._detach()
        norms = [p.grad.norm() for p in module.parameters() if p.grad is not None]
        norm = float(torch.stack(norms).norm()) if norms else float("nan")
        print(f"sss debug [fit] loss: {float(trainer.state.loss):.6g}, gradient norm {norm:.6g}", flush=True)

    def on_validation_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if trainer.state.stage not in self._shown and not self._handles:
            self._attach(trainer, module)

    def on_validation_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._detach()

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._close()

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._close()

    def _close(self) -> None:
        self._detach()
        torch.autograd.set_detect_anomaly(self._anomaly_before)

    def _attach(self, trainer: SSSTrainer, module: LitModule) -> None:
        # Hooks live for one batch only (attached at its start), so forwards outside the loop,
        # such as the model summary's dummy pass, print nothing.
        if not trainer.accelerator.is_main_process:
            return
        stage = trainer.state.stage
        self._handles = [
            module.register_forward_pre_hook(lambda _m, args: _show(stage, "batch:", args[0] if args else None))
        ]
        for name, part in module.named_children():
            self._handles.append(part.register_forward_hook(lambda _m, _a, out, n=name: _show(stage, f"{n} ->", out)))
        self._handles.append(module.register_forward_hook(lambda _m, _a, out: self._outputs(stage, out)))

    def _outputs(self, stage: str, outputs: Any) -> None:
        _show(stage, "outputs ->", outputs)
        if stage != "fit":  # evaluation: one batch per stage; training waits for its loss
            self._shown.add(stage)
            self._detach()

    def _detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _show(stage: str, what: str, value: Any) -> None:
    print(f"sss debug [{stage}] {what} {describe(value)}", flush=True)


def describe(value: Any) -> str:
    """A one-line description of tensors inside `value` (dicts and sequences are walked).

    Example:
        >>> describe({"image": torch.zeros(2, 3), "label": torch.tensor([1, 0]), "name": "x"})
        'image float32 [2, 3], label int64 [2], name str'
    """
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
    if isinstance(value, dict):
        return ", ".join(f"{key} {describe(item)}" for key, item in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(describe(item) for item in value) + ")"
    return type(value).__name__
