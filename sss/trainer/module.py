"""`LitModule`: the model a user subclasses. Encoders, a fusion head and `compute_loss`; no hooks.

A plain `nn.Module` contract: every method gets what it needs as arguments (the trainer passes the
class names, builds the optimizer over `LitModule.parameter_groups`), so a module is used and
tested without a trainer.
"""

from __future__ import annotations

import inspect
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor, nn

from sss.trainer._batches import batch_size
from sss.trainer._logged import Logged, new_buffer

__all__ = ["LitModule", "WrappedModel", "compute_metrics", "output_logits"]

Batch = dict[str, Any]


class LitModule(nn.Module):
    """A Shadow & Sound Hunter model: image encoder, audio encoder, fusion head, loss.

    Subclasses set the three parts in ``__init__`` and implement `compute_loss`. The defaults
    below cover the usual case; override any of them. Lifecycle code belongs in callbacks:
    the module has no ``on_*`` hooks, and no reference to the trainer that runs it.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import torch.nn.functional as F
        >>> class Tiny(LitModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.image_encoder = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 8))
        ...         self.audio_encoder = nn.Linear(16, 8)
        ...         self.fusion_head = FuseSum(8, 2)
        ...     def compute_loss(self, outputs, batch):
        ...         return F.cross_entropy(outputs, batch["label"])
        >>> class FuseSum(nn.Module):
        ...     def __init__(self, dim, classes):
        ...         super().__init__()
        ...         self.out = nn.Linear(dim, classes)
        ...     def forward(self, image, audio):
        ...         return self.out(image + audio.flatten(1))
        >>> batch = {"image": torch.randn(2, 3, 4, 4), "audio": torch.randn(2, 1, 16), "label": torch.tensor([0, 1])}
        >>> Tiny().training_step(batch, 0).shape
        torch.Size([])
    """

    image_encoder: nn.Module | None
    audio_encoder: nn.Module | None
    fusion_head: nn.Module | None
    metrics: list[str] | None = None
    """Metric names `compute_metrics` keeps (``*`` wildcards; the loss always); None: the task's defaults."""
    modality_keys: Mapping[str, str] = MappingProxyType({"image": "image", "audio": "audio"})
    """The batch key of each modality: what `forward` encodes, what the modality ablation zeroes and what
    the model summary's dummy batch holds. Set e.g. ``{"image": "images", "audio": "wave"}`` for data
    with other keys; a modality left out is not used."""
    ablation: bool = True
    """Whether `sss.evaluation.evaluate` (the end of ``sss fit``, ``sss validate``) also scores the model with each
    modality absent (the ablation and the robustness report); False for a model that needs both at once (the
    contrastive `sss.models.ContrastiveModule`)."""
    target_key: str | int | None = None
    """The batch key of the clip target that `validation_outputs` scores; None: ``"label"`` (class indices)
    or ``"labels"`` (multi-hot), as the data of `sss` names them. A key set here is read by its
    content: integer class indices ``[B]`` or multi-hot floats shaped like the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.image_encoder = None
        self.audio_encoder = None
        self.fusion_head = None
        self._logged = new_buffer()  # what self.log appends; the trainer collects it

    @property
    def input_keys(self) -> tuple[str, ...] | None:
        """The batch keys ``forward`` reads, of which the batch contract wants one (``docs/trainer.md``, Fail fast).

        By default the values of `modality_keys`; set a tuple of your own, or None for a module that
        takes another batch format (the contract is then not checked).

        Example:
            >>> from sss.testing import BoringModule
            >>> module = BoringModule()
            >>> module.input_keys
            ('image', 'audio')
            >>> module.modality_keys = {"image": "frames", "audio": "wave"}
            >>> module.input_keys
            ('frames', 'wave')
        """
        if "_input_keys" in self.__dict__:
            return self.__dict__["_input_keys"]
        return tuple(self.modality_keys.values())

    @input_keys.setter
    def input_keys(self, keys: Sequence[str] | None) -> None:
        self.__dict__["_input_keys"] = None if keys is None else tuple(keys)

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        loss_fn: Callable[[Any, Any], Tensor],
        *,
        inputs: Sequence[str | int] | str = ("image", "audio"),
        target: str | int | None = "label",
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        modality_keys: Mapping[str, str | int] | None = None,
    ) -> WrappedModel:
        """A `LitModule` around a plain ``nn.Module`` that keeps its signature: the port of a plain loop.

        The module's ``forward(batch)`` calls ``model(*[batch[k] for k in inputs])`` and its loss is
        ``loss_fn(outputs, batch[target])``; see `WrappedModel` and ``docs/port.md``.

        Args:
            model: Your model, e.g. with ``forward(images, audio)``; its parameters are the module's.
            loss_fn: ``loss_fn(outputs, target)``, e.g. ``F.cross_entropy``; a mean over the batch.
            inputs: The batch keys passed to ``model``, in order; positions (ints) for tuple batches
                (a ``TensorDataset``'s ``(images, audio, labels)``: ``inputs=(0, 1), target=2``).
            target: The batch key of the target; None passes the whole batch to ``loss_fn``.
            optimizer: Your optimizer over ``model.parameters()``; None: the trainer builds ``trainer.optim``.
            scheduler: Your LR scheduler of `optimizer` (stepped once per optimizer step), or None.
            modality_keys: The batch key of each modality for the ablation and the model summary; None:
                with two inputs, the first is the image and the second the audio; else none.

        Example:
            >>> import torch.nn.functional as F
            >>> class Net(nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.linear = nn.Linear(3 + 2, 4)
            ...     def forward(self, images, audio):
            ...         return self.linear(torch.cat([images, audio], dim=-1))
            >>> module = LitModule.from_model(Net(), F.cross_entropy, inputs=("images", "audio"), target="labels")
            >>> batch = {"images": torch.randn(2, 3), "audio": torch.randn(2, 2), "labels": torch.tensor([0, 3])}
            >>> module.training_step(batch, 0).shape, dict(module.modality_keys)
            (torch.Size([]), {'image': 'images', 'audio': 'audio'})
        """
        options = {"optimizer": optimizer, "scheduler": scheduler, "modality_keys": modality_keys}
        return WrappedModel(model, loss_fn, inputs=inputs, target=target, **options)

    def forward(self, batch: Batch) -> Any:
        """Encode each modality present in the batch and fuse them.

        A modality missing from the batch (or without an encoder) reaches the fusion head as None.
        """
        if self.fusion_head is None:
            raise NotImplementedError(
                f"{type(self).__name__} sets no fusion_head: set self.fusion_head in __init__ or override forward()"
            )
        keys = self.modality_keys
        image = batch.get(keys["image"]) if "image" in keys else None
        audio = batch.get(keys["audio"]) if "audio" in keys else None
        image_tokens = self.image_encoder(image) if self.image_encoder is not None and image is not None else None
        audio_tokens = self.audio_encoder(audio) if self.audio_encoder is not None and audio is not None else None
        return self.fusion_head(image_tokens, audio_tokens)

    def compute_loss(self, outputs: Any, batch: Batch) -> Tensor:
        """The scalar training loss of `outputs` (what `forward` returned) against the batch targets.

        Use a mean over the samples of the batch: the trainer relies on it to make gradient
        accumulation and multi-process training equal to one big batch.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement compute_loss(outputs, batch)")

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        """One micro-batch of training; returns the loss to backpropagate."""
        return self.compute_loss(self(batch), batch)

    def validation_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        """Per-sample outputs of one evaluation batch: `validation_outputs` of ``self(batch)``.

        Every value has the batch as its first dimension. The trainer gathers them across processes
        (dropping the samples a distributed sampler duplicated; it runs a possibly padded last batch
        of a multi-process evaluation sample by sample, so a batch-mean value never mixes them in)
        and hands the concatenation to `compute_metrics`.
        """
        return self.validation_outputs(self(batch), batch)

    def validation_outputs(self, outputs: Any, batch: Batch) -> dict[str, Tensor]:
        """The per-sample evaluation values of `forward`'s `outputs` on `batch`.

        The default: ``loss`` (the batch's `compute_loss`, repeated per sample) and, when the outputs
        hold class logits (`output_logits`): ``scores`` (logits ``[B, K]``) with ``target`` (class
        indices) and ``preds`` for a ``"label"`` batch, or with ``labels`` (multi-hot) for a
        ``"labels"`` batch. Models with more tasks add theirs (`HunterModule`: sound events, shadow
        masks, via `sss.metrics.task.task_outputs`).

        Example:
            >>> from sss.testing import BoringModule, boring_loader
            >>> module, batch = BoringModule(), next(iter(boring_loader(batch_size=4)))
            >>> {key: tuple(value.shape) for key, value in module.validation_outputs(module(batch), batch).items()}
            {'loss': (4,), 'scores': (4, 2), 'preds': (4,), 'target': (4,)}
        """
        logits = output_logits(outputs)
        size = logits.shape[0] if logits is not None else batch_size(batch)
        result = {"loss": self.compute_loss(outputs, batch).detach().float().expand(size)}
        kind, target = _clip_target(batch, self.target_key, logits)
        if kind == "target":
            result.update(scores=logits.float(), preds=logits.argmax(dim=-1), target=target)
        elif kind == "labels":
            result.update(scores=logits.float(), labels=target)
        return result

    def compute_metrics(self, outputs: dict[str, Tensor], classes: Sequence[str] | None = None) -> dict[str, float]:
        """Dataset-level metrics from the gathered `validation_step` outputs (names without a prefix).

        Default: mean ``loss`` plus the metrics of each task present (`sss.metrics.task_metrics`):
        accuracy, top-5 accuracy, macro/micro F1 and per-class P/R/F1 for single-label; mAP, mAUC
        and F1 for multi-label; segment- and event-based F1 and error rate for sound events; BER
        for shadow masks. Set ``metrics`` (a list of names with ``*`` wildcards) to keep fewer.

        Args:
            outputs: The gathered per-sample outputs.
            classes: Names of the clip classes, for per-class keys (``f1/<name>``); the trainer passes
                its datamodule's ``classes``. None: per-class keys by class index. (An override with
                the one-argument signature ``compute_metrics(self, outputs)`` still works; the trainer
                then passes no names.)

        Example:
            >>> from sss.testing import BoringModule
            >>> out = {"loss": torch.ones(2), "scores": torch.eye(2), "target": torch.tensor([0, 1])}
            >>> sorted(k for k in BoringModule().compute_metrics(out, classes=["cat", "dog"]) if k.startswith("f1/"))
            ['f1/cat', 'f1/dog']
        """
        from sss.metrics import task_metrics

        metrics = {"loss": float(outputs["loss"].float().mean())} if "loss" in outputs else {}
        names = list(classes) if classes else None
        return metrics | task_metrics(outputs, class_names=names, select=self.metrics)

    def log(
        self,
        name: str,
        value: Tensor | float,
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        batch_size: int | None = None,
    ) -> None:
        """Log a scalar from `training_step` or `validation_step` (or what they call); the trainer reports it.

        The value is kept (as a tensor: no device sync) in a buffer on this module, which the trainer
        collects after each step call; the module never sees the trainer. In `training_step` it is
        named ``train/<name>``; per step (the default) its mean over the optimizer step's micro-batches
        goes to the trackers at each logging step (``trainer.log.every_n_steps``), per epoch its mean
        over the epoch's samples on all processes goes to ``trainer.state.metrics`` and the trackers
        at the epoch's end; both: ``train/<name>_step`` and ``train/<name>_epoch``. In
        `validation_step` it is a mean over the evaluation pass on all processes, named
        ``val/<name>`` (``test/<name>``) beside the metrics of `compute_metrics`, where checkpoint
        monitors and early stopping find it. Means are weighted by `batch_size`. See ``docs/trainer.md``.

        Args:
            name: The name, without the stage prefix (a leading ``train/``, ``val/`` is not doubled).
            value: A number or a one-element tensor (detached here).
            on_step: Report the value per optimizer step; None: True in training, False in validation.
            on_epoch: Report its mean over the epoch; None: False in training (validation is per pass).
            prog_bar: Also put the latest value in ``trainer.state.bar`` for the progress bar.
            batch_size: The weight of the value in means; None: the size of the step's batch.

        Example:
            >>> from sss.testing import BoringModule, boring_loader
            >>> class Logging(BoringModule):
            ...     def training_step(self, batch, batch_idx):
            ...         loss = super().training_step(batch, batch_idx)
            ...         self.log("audio_rms", batch["audio"].pow(2).mean().sqrt(), on_epoch=True)
            ...         return loss
            >>> module = Logging()
            >>> _ = module.training_step(next(iter(boring_loader(batch_size=4))), 0)
            >>> [(entry.name, entry.on_epoch) for entry in module._logged]
            [('audio_rms', True)]
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"self.log needs a name (a non-empty string), got {name!r}")
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"self.log({name!r}, ...) needs a scalar, got a tensor of shape {tuple(value.shape)}: "
                    "log its mean (value.mean()) or one element"
                )
            value = value.detach().reshape(())
        elif not isinstance(value, numbers.Real):
            raise TypeError(f"self.log({name!r}, ...) takes a number or a one-element tensor, got {type(value)}")
        if on_step is False and on_epoch is False:
            raise ValueError(f"self.log({name!r}, ..., on_step=False, on_epoch=False) would report nothing")
        buffer = self.__dict__.get("_logged")
        if buffer is None:  # a subclass that set up its state without LitModule.__init__
            buffer = self._logged = new_buffer()
        buffer.append(Logged(name, value, on_step, on_epoch, prog_bar, batch_size))

    def log_dict(self, values: Mapping[str, Tensor | float], **options: Any) -> None:
        """`log` each ``name: value`` of `values` with the same options.

        Example:
            >>> from sss.testing import BoringModule
            >>> module = BoringModule()
            >>> module.log_dict({"a": 1.0, "b": torch.tensor(2.0)}, on_epoch=True)
            >>> [entry.name for entry in module._logged]
            ['a', 'b']
        """
        for name, value in values.items():
            self.log(name, value, **options)

    def predict_step(self, batch: Batch, batch_idx: int) -> Any:
        """Outputs for inference; default: `forward`."""
        return self(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer | tuple[torch.optim.Optimizer, Any] | None:
        """Your own optimizer, or ``(optimizer, scheduler)``; the default None lets the trainer build ``trainer.optim``.

        The trainer instantiates the config's optimizer over `parameter_groups` and its scheduler
        (with ``total_steps`` when the scheduler takes it), as torchtune instantiates
        ``cfg.optimizer`` with the model's parameters. Return a plain ``torch.optim`` optimizer (the
        one of a loop you port) or ``(optimizer, scheduler)`` for what a config cannot say (e.g.
        per-part learning rates); the trainer prepares it with Accelerate, and steps a scheduler
        returned here once per applied optimizer step, like the config's.

        Example:
            >>> from sss.testing import BoringModule
            >>> class WithSGD(BoringModule):
            ...     def configure_optimizers(self):
            ...         return torch.optim.SGD(self.parameters(), lr=0.1)
            >>> type(WithSGD().configure_optimizers()).__name__
            'SGD'
        """
        return None

    def parameter_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """The trainable parameters as optimizer groups: `weight_decay` on weight matrices and kernels only.

        Biases and norm parameters (tensors of one dimension) get no decay, as is common practice
        for AdamW. Empty groups are left out.

        Example:
            >>> from sss.testing import BoringModule
            >>> [(len(group["params"]), group["weight_decay"]) for group in BoringModule().parameter_groups(0.1)]
            [(3, 0.1), (3, 0.0)]
        """
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
        ]
        return [g for g in groups if g["params"]]

    def modality_groups(self) -> dict[str, list[nn.Parameter]]:
        """Trainable parameters by part: ``image``, ``audio``, ``fusion`` and ``heads`` (all the rest).

        Per-modality health callbacks read these; parts that are absent give empty lists.
        """
        groups: dict[str, list[nn.Parameter]] = {"image": [], "audio": [], "fusion": [], "heads": []}
        seen: set[int] = set()
        for key, part in (("image", self.image_encoder), ("audio", self.audio_encoder), ("fusion", self.fusion_head)):
            if part is not None:
                for p in part.parameters():
                    if p.requires_grad and id(p) not in seen:
                        groups[key].append(p)
                        seen.add(id(p))
        groups["heads"] = [p for p in self.parameters() if p.requires_grad and id(p) not in seen]
        return groups


class WrappedModel(LitModule):
    """A plain ``nn.Module`` as a `LitModule`, its ``forward`` signature kept; made by `LitModule.from_model`.

    ``forward(batch)`` is ``model(*[batch[k] for k in inputs])``, `compute_loss` is
    ``loss_fn(outputs, batch[target])`` and `configure_optimizers` returns the given optimizer (and
    scheduler). Evaluation scores the ``target`` key as `LitModule.target_key` says; the modality
    ablation and the model summary use `modality_keys`. The model is the submodule ``model``, so
    parameter names in checkpoints start with ``model.``. Its parameters all count as ``heads`` in
    `LitModule.modality_groups` (it has no ``image_encoder`` / ``audio_encoder`` to split by).

    Example:
        >>> import torch.nn.functional as F
        >>> module = WrappedModel(nn.Linear(4, 2), F.cross_entropy, inputs="x", target="y")
        >>> module({"x": torch.zeros(3, 4)}).shape, dict(module.modality_keys)
        (torch.Size([3, 2]), {})
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[Any, Any], Tensor],
        *,
        inputs: Sequence[str | int] | str = ("image", "audio"),
        target: str | int | None = "label",
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        modality_keys: Mapping[str, str | int] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.inputs = (inputs,) if isinstance(inputs, (str, int)) else tuple(inputs)
        self.target_key = target
        if modality_keys is None:
            modality_keys = dict(zip(("image", "audio"), self.inputs, strict=True)) if len(self.inputs) == 2 else {}
        unknown = sorted(set(modality_keys) - {"image", "audio"})
        if unknown:
            raise ValueError(f"modality_keys names the modalities image and audio, got {unknown}")
        self.modality_keys = dict(modality_keys)
        self.modalities = tuple(m for m in ("image", "audio") if m in self.modality_keys)
        if scheduler is not None and optimizer is None:
            raise ValueError("from_model got a scheduler without its optimizer: pass optimizer= too")
        self._optimizer, self._scheduler = optimizer, scheduler
        self.input_keys = None  # a plain model's batches are its own format, not the sss batch contract's

    def forward(self, batch: Batch) -> Any:
        missing = [key for key in self.inputs if not _has(batch, key)]
        if missing:
            raise KeyError(
                f"the batch has no {', '.join(map(repr, missing))} ({_keys_of(batch)}): "
                f"from_model(inputs={self.inputs!r}) names the batch keys passed to the model, in order"
            )
        return self.model(*(batch[key] for key in self.inputs))

    def compute_loss(self, outputs: Any, batch: Batch) -> Tensor:
        if self.target_key is None:
            return self.loss_fn(outputs, batch)
        if not _has(batch, self.target_key):
            raise KeyError(
                f"the batch has no {self.target_key!r} ({_keys_of(batch)}): from_model(target=...) names the "
                "batch key of the target"
            )
        return self.loss_fn(outputs, batch[self.target_key])

    def configure_optimizers(self) -> torch.optim.Optimizer | tuple[torch.optim.Optimizer, Any] | None:
        if self._optimizer is None:
            return None
        return (self._optimizer, self._scheduler) if self._scheduler is not None else self._optimizer


def _has(batch: Any, key: Any) -> bool:
    # A dict batch has named keys; a tuple batch (a TensorDataset's) has positions.
    if isinstance(batch, Mapping):
        return key in batch
    return isinstance(batch, (list, tuple)) and isinstance(key, int) and -len(batch) <= key < len(batch)


def _keys_of(batch: Any) -> str:
    if isinstance(batch, Mapping):
        return "it has " + ", ".join(map(repr, batch))
    size = len(batch) if isinstance(batch, (list, tuple)) else 0
    return f"it is a {type(batch).__name__} of {size}"


def _clip_target(batch: Any, key: Any, logits: Tensor | None) -> tuple[str | None, Tensor | None]:
    # ("target", class indices) or ("labels", multi-hot) for validation_outputs; (None, None) without one.
    if logits is None:
        return None, None
    if key is None:
        if _has(batch, "label"):
            return "target", batch["label"]
        return ("labels", batch["labels"]) if _has(batch, "labels") else (None, None)
    value = batch[key] if _has(batch, key) else None
    if not isinstance(value, Tensor):
        return None, None
    if value.is_floating_point() and value.shape == logits.shape:
        return "labels", value
    if not value.is_floating_point() and value.ndim == 1:
        return "target", value
    return None, None


def output_logits(outputs: Any) -> Tensor | None:
    """The class logits in a module's ``forward`` output: the tensor itself or its ``"logits"`` entry, else None.

    Example:
        >>> output_logits({"logits": torch.zeros(2, 3)}).shape
        torch.Size([2, 3])
    """
    if isinstance(outputs, Tensor):
        return outputs
    if isinstance(outputs, dict) and isinstance(outputs.get("logits"), Tensor):
        return outputs["logits"]
    return None


def compute_metrics(module: Any, outputs: dict[str, torch.Tensor], classes: list[str] | None) -> dict[str, float]:
    """Call ``module.compute_metrics`` with the class names, or without them for a one-argument override.

    Example:
        >>> class Old:  # an override with the one-argument signature of earlier versions
        ...     def compute_metrics(self, outputs):
        ...         return {"n": float(len(outputs["preds"]))}
        >>> compute_metrics(Old(), {"preds": torch.zeros(3)}, None)
        {'n': 3.0}
    """
    compute = module.compute_metrics
    params = inspect.signature(compute).parameters.values()
    if any(p.name == "classes" or p.kind is p.VAR_KEYWORD for p in params):
        return compute(outputs, classes=classes)
    if classes:  # an override with the one-argument signature of earlier versions
        warnings.warn(
            f"{type(module).__name__}.compute_metrics(outputs) takes no class names, so per-class metrics "
            "are named by class index: define it as compute_metrics(self, outputs, classes=None) and pass "
            "classes=classes on to super().compute_metrics",
            stacklevel=3,
        )
    return compute(outputs)
