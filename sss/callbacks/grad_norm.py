"""`GradNormMonitor`: global and per-modality gradient norms, and advice when they look unhealthy."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import torch

from sss.callbacks.base import Callback
from sss.callbacks.metrics_logger import host_floats
from sss.callbacks.ogm_ge import MODALITIES, OGMGE
from sss.warnings import SSSWarning

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["GradNormMonitor"]


def _warn_once(trainer: SSSTrainer, seen: set[str], key: str, message: str, local: bool = False) -> None:
    """Warn once per `key` as an `SSSWarning`; figures equal on every process warn on the main one only.

    `local` figures (what this process's data showed) warn on every process; a launched process's
    warnings carry ``[rank N]`` (`sss.trainer._processes.tag_warnings_with_rank`), so the message does not.
    """
    if key in seen:
        return
    seen.add(key)
    if trainer.accelerator.is_main_process or local:
        warnings.warn(message, SSSWarning, stacklevel=3)


class GradNormMonitor(Callback):
    """Every N steps: the gradient norm (unscaled, before clipping) overall and per part, with advice.

    Publishes ``train/grad_norm``, ``train/grad_norm/<part>`` and ``train/grad_share/<part>`` (share of
    the squared norm, so the shares sum to 1) for the parts of `LitModule.modality_groups`, and
    ``train/update_ratio`` (|Δθ| / |θ| of the step). It warns once per condition when, for `patience`
    checks in a row: the norm stays under `min_norm` or the update ratio under `min_update_ratio`
    (learning rate too small); the norm reaches ``trainer.max_grad_norm`` or the update ratio exceeds
    `max_update_ratio` (too large); image or audio gets under `min_share` of the two modalities' norm
    (imbalance). The learning-rate checks wait for a warm-up to end: while the schedule still raises
    the learning rate (below the optimizer's own ``lr``, and it has not fallen yet) they
    do not count, since a small LR, or the large first updates of an adaptive optimizer, are what a
    warm-up is for. Warnings are `sss.warnings.SSSWarning`, printed as one ``sss: warning: ...`` line.
    The figures stay on the device: they reach ``state.logs`` as tensors, which the metrics logger
    reads with the loss in one transfer, and the checks run at BATCH_END on those values (no device
    sync of their own when the logger reads at the same steps; one per check step without it).
    ``ogm_ge=True`` (with `ogm_alpha`, `ogm_noise`) also runs an `sss.callbacks.OGMGE` (Peng et al., CVPR 2022),
    which changes the gradients every step, right after this monitor has measured them: the same as listing
    ``OGMGE(alpha=ogm_alpha, noise=ogm_noise)`` after the monitor. Kept for configs that spell it so.

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule, boring_loader
        >>> monitor = GradNormMonitor(every_n_steps=1)
        >>> trainer = SSSTrainer(max_steps=2, callbacks=[monitor], mixed_precision="no",
        ...                      log={"progress": False, "trackers": []}, checkpoint={"every_epoch": False})
        sss: mixed precision no
        >>> _ = trainer.fit(BoringModule(), train_dataloaders=boring_loader())
        >>> sorted(k for k in trainer.state.logs if k.startswith("train/grad_share"))
        ['train/grad_share/audio', 'train/grad_share/fusion', 'train/grad_share/heads', 'train/grad_share/image']
    """

    def __init__(
        self,
        every_n_steps: int = 10,
        patience: int = 5,
        min_norm: float = 0.01,
        min_update_ratio: float = 1e-6,
        max_update_ratio: float = 0.1,
        min_share: float = 0.05,
        ogm_ge: bool = False,
        ogm_alpha: float = 0.5,
        ogm_noise: bool = True,
    ) -> None:
        self.every_n_steps = every_n_steps
        self.patience = patience
        self.min_norm, self.min_share = min_norm, min_share
        self.min_update_ratio, self.max_update_ratio = min_update_ratio, max_update_ratio
        self.ogm_ge, self.ogm_alpha, self.ogm_noise = ogm_ge, ogm_alpha, ogm_noise
        self.ogm = OGMGE(alpha=ogm_alpha, noise=ogm_noise) if ogm_ge else None
        """The `OGMGE` that ``ogm_ge=True`` runs after each measurement (None without it)."""
        if self.ogm is not None:
            self.ogm.name = "GradNormMonitor"
        self._norms: dict[str, Any] = {}
        self._pending: dict[str, Any] | None = None  # this step's figures and checks, run at BATCH_END
        self._streaks: dict[str, int] = {}
        self._warned: set[str] = set()
        self._before: list[torch.Tensor] | None = None
        self._last_ratio = math.inf
        self._lr_seen: float | None = None
        self._lr_fell = False

    @property
    def norms(self) -> dict[str, float]:
        """The latest per-part norms and ``total`` (read from the device on first use)."""
        self._norms = host_floats(self._norms)
        return self._norms

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._streaks.clear()
        self._pending = None
        self._last_ratio = math.inf
        self._lr_seen, self._lr_fell = None, False
        if self.ogm is not None:
            self.ogm.on_fit_start(trainer, module)

    def on_after_backward(self, trainer: SSSTrainer, module: LitModule) -> None:
        # the step about to be applied is number global_step + 1: the one the metrics logger logs
        if (trainer.state.global_step + 1) % self.every_n_steps == 0:
            self._measure(trainer, module)
            self._before = [p.detach().clone() for p in module.parameters() if p.requires_grad]
        if self.ogm is not None:  # after the measurement: the norms are those of the unmodulated gradients
            self.ogm.on_after_backward(trainer, module)

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._follow_lr(trainer)
        if self._before is None:
            return
        after = [p.detach() for p in module.parameters() if p.requires_grad]
        delta = _total_norm([a - b for a, b in zip(after, self._before, strict=True)])
        weight = _total_norm(self._before)
        self._before = None  # free the copy of the weights before the next step
        if trainer.state.step_was_skipped or self._pending is None:
            return
        ratio = delta.double() / weight.double().clamp_min(1e-12)
        trainer.state.logs["train/update_ratio"] = ratio
        self._pending.update(ratio=ratio, ratio_step=trainer.state.global_step, ratio_lr=trainer.state.lr)
        self._pending["logged"]["train/update_ratio"] = ratio
        self._pending["ratio_warming"] = self.warming_up(trainer)

    def on_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        # One read for the step's figures; none when the metrics logger (or the bar) read them already.
        values = host_floats({k: v for k, v in pending.items() if isinstance(v, torch.Tensor)})
        logs = trainer.state.logs
        for key, tensor in pending["logged"].items():  # floats in state.logs for later readers
            if logs.get(key) is tensor:
                logs[key] = values[f"log:{key}"] if key != "train/update_ratio" else values["ratio"]
        self._check_norms(trainer, pending, values)
        if "ratio" in pending:
            self._check_ratio(trainer, pending, values["ratio"])

    def _check_ratio(self, trainer: SSSTrainer, pending: dict[str, Any], ratio: float) -> None:
        self._last_ratio = ratio
        lr, step, warming = pending["ratio_lr"], pending["ratio_step"], pending["ratio_warming"]
        self._check(
            trainer,
            "lr_small_update",
            ratio < self.min_update_ratio,
            f"parameters moved by {ratio:.1e} of their norm per step (under {self.min_update_ratio:.0e}) for "
            f"{self.patience} checks: the learning rate may be too small (lr={lr:.1e}); raise it",
            lr_advice=True,
            warming=warming,
            step=step,
        )
        self._check(
            trainer,
            "lr_large_update",
            ratio > self.max_update_ratio,
            f"parameters moved by {ratio:.2f} of their norm per step (over {self.max_update_ratio}) for "
            f"{self.patience} checks: the learning rate may be too large (lr={lr:.1e}); lower it",
            lr_advice=True,
            warming=warming,
            step=step,
        )

    def _follow_lr(self, trainer: SSSTrainer) -> None:
        # Every optimizer step (a float read, no sync): whether the schedule has lowered the LR yet.
        lr = _current_lr(trainer)
        if lr is not None and self._lr_seen is not None and lr < self._lr_seen * (1 - 1e-9):
            self._lr_fell = True
        self._lr_seen = lr if lr is not None else self._lr_seen

    def warming_up(self, trainer: SSSTrainer) -> bool:
        """Whether the LR schedule is still in its warm-up: the learning rate has not fallen yet and is under
        its peak, the optimizer's own ``lr`` (``initial_lr``, which torch schedulers record; OneCycleLR's ``max_lr``).

        Example:
            >>> from sss import SSSTrainer
            >>> from sss.testing import BoringModule, boring_loader
            >>> warmup = {"_target_": "sss.trainer.cosine_with_warmup", "warmup_steps": 4}
            >>> monitor = GradNormMonitor(every_n_steps=1)
            >>> trainer = SSSTrainer(max_steps=2, callbacks=[monitor], mixed_precision="no",
            ...                      optim={"scheduler": warmup}, log={"progress": False, "trackers": []},
            ...                      checkpoint={"every_epoch": False})
            sss: mixed precision no
            >>> _ = trainer.fit(BoringModule(), train_dataloaders=boring_loader())
            >>> monitor.warming_up(trainer)  # 2 of 4 warm-up steps done
            True
        """
        lr = _current_lr(trainer)
        if lr is None or self._lr_fell:
            return False
        group = trainer.optimizer.param_groups[0]
        peak = group.get("max_lr", group.get("initial_lr"))
        return peak is not None and lr < peak * (1 - 1e-6)

    def _measure(self, trainer: SSSTrainer, module: LitModule) -> None:
        # Device tensors only: the values are read at BATCH_END, with the metrics logger's (see on_batch_end).
        groups = module.modality_groups()
        device = trainer.accelerator.device
        norms = {name: _norm(params, device).double() for name, params in groups.items()}
        total = torch.stack(list(norms.values())).square().sum().sqrt()
        self._norms = {**norms, "total": total}
        logs = trainer.state.logs
        logged = {"train/grad_norm": total}
        for name, value in norms.items():
            logged[f"train/grad_norm/{name}"] = value
            logged[f"train/grad_share/{name}"] = torch.where(total > 0, value.square() / total.square(), 0.0)
        logs.update(logged)
        self._pending = {
            **{f"log:{k}": v for k, v in logged.items()},
            **{f"norm:{k}": v for k, v in self._norms.items()},
            "logged": logged,
            "warming": self.warming_up(trainer),
            "step": trainer.state.global_step,
            "groups": {name: bool(params) for name, params in groups.items()},
        }

    def _check_norms(self, trainer: SSSTrainer, pending: dict[str, Any], values: dict[str, float]) -> None:
        norms = {k.removeprefix("norm:"): v for k, v in values.items() if k.startswith("norm:")}
        self._norms = dict(norms)
        total = norms.pop("total")
        warming, step = pending["warming"], pending["step"]
        clip = trainer.config.max_grad_norm
        self._check(
            trainer,
            "lr_small_norm",
            total < self.min_norm,
            f"the gradient norm stayed under {self.min_norm} for {self.patience} checks (latest {total:.2e}): "
            "the learning rate may be too small, or the loss is saturated",
            lr_advice=True,
            warming=warming,
            step=step,
        )
        self._check(
            trainer,
            "lr_large_clip",
            # clipped every step while the weights barely move is a small LR with large gradients, not a large LR
            clip is not None and total >= 0.99 * clip and self._last_ratio >= self.min_update_ratio,
            f"the gradient norm sat at the clip value trainer.max_grad_norm={clip} for {self.patience} checks "
            f"(latest {total:.2e}): every step is clipped; the learning rate may be too large "
            "(or the clip value too low for this model)",
            lr_advice=True,
            warming=warming,
            step=step,
        )
        present = [m for m in MODALITIES if getattr(trainer.module, f"{m}_encoder", None) is not None]
        both = sum(norms[m] for m in present)
        for m in present if len(present) == 2 else ():
            share = norms[m] / both if both > 0 else 0.0
            frozen = " (none of its parameters are trainable)" if not pending["groups"][m] else ""
            self._check(
                trainer,
                f"imbalance_{m}",
                share < self.min_share,
                f"modality imbalance: {m} gets {share:.1%} of the image+audio gradient norm{frozen} for "
                f"{self.patience} checks: that branch is starving. Try modality dropout, or "
                "GradNormMonitor(ogm_ge=true) to slow the dominant modality (OGM-GE)",
                step=step,
            )

    def _check(
        self,
        trainer: SSSTrainer,
        key: str,
        bad: bool,
        message: str,
        lr_advice: bool = False,
        warming: bool = False,
        step: int = 0,
    ) -> None:
        # Learning-rate advice during a warm-up would be about a schedule working as meant: the streak starts after it.
        # `warming` and `step` are those of when the figure was measured (the check runs at BATCH_END).
        counts = bad and not (lr_advice and warming)
        self._streaks[key] = self._streaks.get(key, 0) + 1 if counts else 0
        if self._streaks[key] >= self.patience:
            _warn_once(trainer, self._warned, key, f"GradNormMonitor (global_step {step}): {message}")

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._before, self._pending = None, None
        if self.ogm is not None:
            self.ogm.on_fit_end(trainer, module)

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._before, self._pending = None, None
        if self.ogm is not None:
            self.ogm.on_exception(trainer, module)


def _current_lr(trainer: SSSTrainer) -> float | None:
    # The optimizer's own value: state.lr is only set after the first step.
    optimizer = trainer.optimizer
    return float(optimizer.param_groups[0]["lr"]) if optimizer is not None and optimizer.param_groups else None


def _norm(params: list[torch.nn.Parameter], device: torch.device) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    return _total_norm(grads) if grads else torch.zeros((), device=device)


def _total_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    # one reduction per tensor, then one for the whole list; a device tensor (no sync)
    if not tensors:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors]))
