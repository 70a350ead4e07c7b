"""`OGMGE`: on-the-fly gradient modulation with generalization enhancement (Peng et al., CVPR 2022)."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import torch

from sss.callbacks.base import Callback
from sss.warnings import SSSWarning

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["MODALITIES", "OGMGE"]

MODALITIES = ("image", "audio")


class OGMGE(Callback):
    """Slows the gradients of the modality that dominates, then adds noise of the gradients' scale; every step.

    At each AFTER_BACKWARD (true-scale gradients, before clipping) each modality's score is the
    summed softmax probability of the true class when the model runs, in eval mode, on that
    modality alone (the other one absent, as `LitModule.forward` allows), on the latest micro-batch;
    the scores are summed over processes. The dominant modality, with score ratio ρ > 1, gets its
    encoder gradients multiplied by 1 - tanh(`alpha`·ρ) (Peng et al., eq. 10); with `noise`, each
    encoder gradient then gets Gaussian noise with the gradient's own std (the GE part), drawn from a
    generator seeded by the step so every process adds the same noise. The fusion head and other
    parts are left alone. Publishes ``train/ogm/score_ratio``, ``train/ogm/coeff_image`` and
    ``train/ogm/coeff_audio`` in ``state.logs``. ``GradNormMonitor(ogm_ge=True)`` runs one of these
    after its own measurement, so its norms are those before the modulation.

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule, boring_loader
        >>> trainer = SSSTrainer(max_steps=2, callbacks=[OGMGE(alpha=0.5)], mixed_precision="no",
        ...                      log={"progress": False, "trackers": []}, checkpoint={"every_epoch": False})
        sss: mixed precision no
        >>> _ = trainer.fit(BoringModule(), train_dataloaders=boring_loader())
        >>> sorted(k for k in trainer.state.logs if k.startswith("train/ogm/"))
        ['train/ogm/coeff_audio', 'train/ogm/coeff_image', 'train/ogm/score_ratio']
    """

    def __init__(self, alpha: float = 0.5, noise: bool = True) -> None:
        self.alpha, self.noise = alpha, noise
        self.name = "OGMGE"
        """How its warnings name it (``GradNormMonitor`` when that monitor runs it for ``ogm_ge=True``)."""
        self._warned = False
        self._batch: Any = None
        self._hook: Any = None

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._hook is None:
            # The scores need the batch; the loop does not hand batches to callbacks, so keep a
            # reference to the latest one the module saw (no copy).
            self._hook = module.register_forward_pre_hook(self._remember_batch)

    def _remember_batch(self, module: LitModule, args: tuple[Any, ...]) -> None:
        if module.training and args and isinstance(args[0], dict):
            self._batch = args[0]

    def on_after_backward(self, trainer: SSSTrainer, module: LitModule) -> None:
        batch = self._batch
        if batch is None or "label" not in batch:
            if not self._warned and trainer.accelerator.is_main_process:
                message = f"{self.name}: OGM-GE needs the class of each sample in batch['label']; not modulating"
                warnings.warn(message, SSSWarning, stacklevel=2)
            self._warned = True
            return
        ratio = self._score_ratio(trainer, module, batch)
        coeffs = {"image": 1.0, "audio": 1.0}
        if ratio > 1:
            coeffs["image"] = 1 - math.tanh(self.alpha * ratio)
        elif ratio < 1:
            coeffs["audio"] = 1 - math.tanh(self.alpha / max(ratio, 1e-12))
        self._modulate(trainer, module, coeffs)
        logs = trainer.state.logs
        logs["train/ogm/score_ratio"] = ratio
        logs["train/ogm/coeff_image"], logs["train/ogm/coeff_audio"] = coeffs["image"], coeffs["audio"]

    def _score_ratio(self, trainer: SSSTrainer, module: LitModule, batch: dict[str, Any]) -> float:
        scores = []
        module.eval()  # the extra passes must not move batch-norm statistics (nor draw dropout masks)
        try:
            with torch.no_grad():
                for kept in MODALITIES:
                    alone = {k: v for k, v in batch.items() if k not in MODALITIES or k == kept}
                    probs = torch.softmax(_logits(module(alone)).float(), dim=-1)
                    scores.append(probs.gather(1, batch["label"].long().view(-1, 1)).sum())
        finally:
            module.train()
        scores_t = torch.stack(scores)
        if trainer.accelerator.num_processes > 1:
            scores_t = trainer.accelerator.reduce(scores_t, reduction="sum")
        s_image, s_audio = scores_t.tolist()  # the one device sync of OGM-GE per step: the coefficients need it
        return s_image / max(s_audio, 1e-12)

    def _modulate(self, trainer: SSSTrainer, module: LitModule, coeffs: dict[str, float]) -> None:
        groups = module.modality_groups()
        generator = torch.Generator().manual_seed(trainer.config.seed * 1_000_003 + trainer.state.global_step)
        for m in MODALITIES:
            for p in groups[m]:
                if p.grad is None:
                    continue
                p.grad.mul_(coeffs[m])
                if self.noise and p.grad.numel() > 1:
                    noise = torch.randn(p.grad.shape, generator=generator, dtype=torch.float32)
                    p.grad.add_(noise.to(p.grad) * p.grad.float().std())

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._release()

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._release()

    def _release(self) -> None:
        if self._hook is not None:
            self._hook.remove()
        self._hook, self._batch = None, None


def _logits(outputs: Any) -> torch.Tensor:
    if isinstance(outputs, dict):
        outputs = outputs["logits"]
    return outputs
