"""The config schema: typed dataclasses, one per YAML section, each field documented under it.

Each field's docstring feeds ``sss fit --help``. Checks of single fields and across fields live
in ``__post_init__`` and name the YAML key. Pluggable parts (model, data, optimizer, scheduler,
callbacks) are ``_target_`` specs, checked by `sss.config.check_config` without building.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sss.config.errors import ConfigError, require
from sss.config.sharding import check_sharding

__all__ = [
    "COMPILE_MODES",
    "GROUP_KEYS",
    "PRECISIONS",
    "CheckpointConfig",
    "ConfigError",
    "FinetuneConfig",
    "LogConfig",
    "OptimConfig",
    "SSSConfig",
    "TrainerConfig",
]

PRECISIONS = ("auto", "no", "fp16", "bf16")
COMPILE_MODES = (False, True, "full", "regional")
"""Values of ``trainer.compile``: off, the whole module (``true`` = ``full``), or its repeated blocks (``regional``)."""


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule, built by the trainer over `LitModule.parameter_groups`.

    Example:
        >>> OptimConfig().optimizer["_target_"]
        'torch.optim.AdamW'
    """

    optimizer: dict[str, Any] = field(
        default_factory=lambda: {"_target_": "torch.optim.AdamW", "lr": 1e-3, "weight_decay": 0.01}
    )
    """``_target_`` spec of the optimizer; the trainer passes it the module's ``parameter_groups``."""
    scheduler: dict[str, Any] | None = None
    """``_target_`` spec of an LR scheduler stepped once per optimizer step (it receives the optimizer,
    and ``total_steps`` when it takes one), e.g. ``{_target_: sss.trainer.cosine_with_warmup, warmup_steps: 50}``."""
    param_groups: list[dict[str, Any]] = field(default_factory=list)
    """Per-part optimizer settings: ``[{params: "image_encoder.*", lr: 1.0e-4}, ...]``; ``params`` is a glob (or a
    list of globs) over parameter names, the first entry that matches a parameter wins, and the other keys
    (``lr``, ``weight_decay``, ``betas``, ... and an optional ``name`` for the LR logs) replace the optimizer's
    for it; parameters no entry matches keep the optimizer's. Weight decay stays off biases and norms; the
    scheduler scales every group. Empty: one setting for all parameters."""
    layer_decay: float | None = None
    """Layer-wise LR decay: a parameter ``k`` layers below the top of its own encoder (each tower has its own
    depth map) gets ``lr * layer_decay ** k``; the fusion and heads count as the top. Set on the param groups
    themselves, so every scheduler applies it. Null: none."""
    head_lr_scale: float = 1.0
    """LR multiplier of the parts above the encoders (fusion and heads), e.g. 10 for a fresh head on pretrained
    encoders."""

    def __post_init__(self) -> None:
        for i, group in enumerate(self.param_groups):
            key = f"trainer.optim.param_groups[{i}]"
            require(
                isinstance(group, dict), f"{key}: expected a mapping such as {{params: 'image_encoder.*', lr: 1e-4}}"
            )
            patterns = group.get("params")
            globs = [patterns] if isinstance(patterns, str) else patterns
            require(
                isinstance(globs, list) and bool(globs) and all(isinstance(g, str) and g.strip() for g in globs),
                f"{key}.params: expected a glob over parameter names such as 'image_encoder.*' (or a list of them), "
                f"got {patterns!r}",
            )
            for name, low in (("lr", "> 0"), ("weight_decay", ">= 0")):
                value = group.get(name)
                if value is None:
                    continue
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                require(number, f"{key}.{name}: expected a number, got {type(value).__name__} {value!r}")
                require(value > 0 if name == "lr" else value >= 0, f"{key}.{name}: must be {low}, got {value!r}")
        require(
            self.layer_decay is None or 0 < self.layer_decay <= 1,
            f"trainer.optim.layer_decay must be in (0, 1] (e.g. 0.75), or null for none; got {self.layer_decay!r}",
        )
        require(self.head_lr_scale > 0, f"trainer.optim.head_lr_scale must be > 0, got {self.head_lr_scale!r}")


GROUP_KEYS = ("params", "name")
"""Keys of a ``trainer.optim.param_groups`` entry that are not optimizer settings: the globs, the group's name."""


@dataclass
class FinetuneConfig:
    """Which pretrained parameters train, and from when (``trainer.finetune``).

    Example:
        >>> FinetuneConfig(freeze=["audio_encoder"], unfreeze_at_step=100).unfrozen_lr_scale
        1.0
    """

    freeze: list[str] = field(default_factory=list)
    """Parameter-name prefixes or globs to freeze, e.g. ``[audio_encoder, "image_encoder.blocks.0*"]``; frozen
    parameters stay out of the optimizer until `unfreeze_at_step`."""
    unfreeze_at_step: int | None = None
    """Optimizer step at which the frozen parameters join training (null: frozen for the whole run)."""
    unfrozen_lr_scale: float = 1.0
    """LR multiplier of the parameters unfrozen at `unfreeze_at_step` (on top of layer decay)."""
    train_bn: bool = False
    """Whether BatchNorm layers of frozen parts keep updating their running statistics (false: frozen means
    every tensor stays as loaded)."""

    def __post_init__(self) -> None:
        require(
            all(isinstance(p, str) and p.strip() for p in self.freeze),
            f"trainer.finetune.freeze: expected module-name prefixes or globs such as audio_encoder, "
            f"got {self.freeze!r}",
        )
        require(
            self.unfreeze_at_step is None or self.unfreeze_at_step >= 0,
            f"trainer.finetune.unfreeze_at_step must be >= 0 (or null: frozen for the whole run), "
            f"got {self.unfreeze_at_step}",
        )
        require(
            self.unfreeze_at_step is None or bool(self.freeze),
            "trainer.finetune.unfreeze_at_step is set but trainer.finetune.freeze is empty: name what to freeze",
        )
        require(
            self.unfrozen_lr_scale > 0, f"trainer.finetune.unfrozen_lr_scale must be > 0, got {self.unfrozen_lr_scale}"
        )


@dataclass
class CheckpointConfig:
    """When the stock checkpoint callback saves ``OUTPUT_DIR/checkpoints/step_NNNNNNN``.

    Example:
        >>> CheckpointConfig(every_n_steps=100).every_n_steps
        100
    """

    every_n_steps: int | None = None
    """Save every N optimizer steps (null: not by steps)."""
    every_epoch: bool = True
    """Save at the end of each epoch, after validation."""
    keep_last: int | None = 3
    """Keep the newest N checkpoints (null: keep all)."""
    keep_best: int = 0
    """Also keep the best N checkpoints by `monitor` (0: none); only checkpoints saved right after a validation rank."""
    monitor: str = "val/loss"
    """The metric that ranks checkpoints for keep_best, e.g. val/accuracy."""
    mode: str = "min"
    """min | max: whether a lower or a higher `monitor` is better."""
    on_signal: bool = True
    """On SIGTERM/SIGINT finish the current optimizer step, save a checkpoint and stop (preemption)."""

    def __post_init__(self) -> None:
        require(self.every_n_steps is None or self.every_n_steps >= 1, "trainer.checkpoint.every_n_steps must be >= 1")
        require(self.keep_last is None or self.keep_last >= 1, "trainer.checkpoint.keep_last must be >= 1 (or null)")
        require(self.keep_best >= 0, f"trainer.checkpoint.keep_best must be >= 0, got {self.keep_best}")
        require(self.mode in ("min", "max"), f"trainer.checkpoint.mode must be min or max, got {self.mode!r}")


@dataclass
class LogConfig:
    """Progress display and metric logging.

    Example:
        >>> LogConfig(progress=False).progress
        False
    """

    progress: bool = True
    """Show a progress bar (plain lines when stdout is not a terminal)."""
    summary: bool = True
    """With the progress display, print the model summary at fit start: parameters and multiply-adds per branch."""
    every_n_steps: int = 10
    """Log training metrics every N optimizer steps."""
    trackers: list[str] = field(default_factory=lambda: ["csv", "tensorboard"])
    """Accelerate trackers: ``csv`` (always available), ``tensorboard`` (installed with sss), ``wandb``, ...;
    an empty list turns metric logging off. A tracker that is not installed is skipped with a warning."""
    plots: bool = True
    """Write PNG plots at fit end: ``OUTPUT_DIR/plots/metrics.png`` (one panel per metric family) and the
    validation confusion matrices (`sss.callbacks.Plots`); false turns them off."""

    def __post_init__(self) -> None:
        require(self.every_n_steps >= 1, f"trainer.log.every_n_steps must be >= 1, got {self.every_n_steps}")


@dataclass
class TrainerConfig:
    """Everything `SSSTrainer` needs; YAML section ``trainer:``.

    Example:
        >>> TrainerConfig(max_steps=100, gradient_accumulation_steps=2).max_steps
        100
    """

    max_epochs: int | None = 10
    """Epochs to train (null: until max_steps)."""
    max_steps: int | None = None
    """Optimizer steps to train; stops at whichever of max_epochs and max_steps comes first."""
    mixed_precision: str = "auto"
    """auto | no | fp16 | bf16. auto: bf16 on a CUDA device that supports it, fp16 on other CUDA devices, else no."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step (a short last window is averaged over its real size)."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this value (null: no clipping and no grad_norm)."""
    seed: int = 42
    """Seed of model init, data order and augmentation."""
    output_dir: str | None = None
    """Where checkpoints, logs and the exported model go (null: runs/<config name>)."""
    resume: str = "never"
    """never | auto | PATH. auto: continue from the newest checkpoint in OUTPUT_DIR that verifies, or start fresh
    when there is none (what a requeued cluster job runs); PATH: that checkpoint. ``sss fit --resume`` overrides it."""
    resume_resize: bool = False
    """Allow resuming a checkpoint written by another number of processes: weights, optimizer, schedule and
    counters restore exactly, the data position by the samples seen in the epoch; not bitwise equal to an
    uninterrupted run, and refused under trainer.fsdp / trainer.deepspeed (docs/resume.md)."""
    val_every_n_epochs: int = 1
    """Validate every N epochs, and always when training ends."""
    val_every_n_steps: int | None = None
    """Also validate after every N-th optimizer step (global_step % N == 0), mid-epoch, as Lightning's integer
    ``val_check_interval``; checkpoints, early stopping and plots see these passes (docs/trainer.md)."""
    find_unused_parameters: bool = False
    """Allow parameters that get no gradient (DDP's find_unused_parameters); otherwise they are an error."""
    cpu: bool = False
    """Train on the CPU even when a GPU is present."""
    rendezvous_timeout: float = 300
    """Seconds every process of a launched run waits for all the others before anything is built; a missing one
    ends the run with an error naming the ranks seen, instead of a hang (docs/distributed.md#on-a-cluster)."""
    limit_train_batches: int | None = None
    """Train on at most N batches per epoch (null: all); the epoch's last window still steps."""
    limit_val_batches: int | None = None
    """Evaluate on at most N batches (null: all)."""
    sanity_val_batches: int = 2
    """Before training, run N validation batches through validation_step and compute_metrics and discard the
    result, so an evaluation bug fails in seconds, not after an epoch (0: off; skipped on resume)."""
    overfit_batches: int = 0
    """Train and validate on the same first N training batches every epoch (0: off); a model that cannot
    fit them has a bug."""
    fast_dev_run: int = 0
    """Smoke test: N training and N validation batches, one epoch, no checkpoints or trackers (0: off)."""
    auto_batch_size: bool = False
    """On out-of-memory, split each batch into twice as many micro-batches (the effective batch and the
    math stay the same) and retry; the split is kept for the rest of the run and in checkpoints."""
    compile: bool | str = False
    """torch.compile the module (in place: checkpoints keep their parameter names): ``true``/``full`` the whole
    module, ``regional`` each repeated block (transformer layers) once, which compiles in a fraction of the time."""
    deterministic: bool = False
    """Deterministic algorithms only (torch.use_deterministic_algorithms, cuDNN deterministic without benchmark,
    CUBLAS_WORKSPACE_CONFIG=:4096:8): the same seed gives bitwise the same weights in every fresh process on the
    same machine and software; an op without a deterministic implementation is an error naming it
    (docs/trainer.md#deterministic-mode)."""
    fsdp: dict[str, Any] | None = None
    """FSDP settings passed to Accelerate's FullyShardedDataParallelPlugin (GPUs only); see docs/distributed.md."""
    deepspeed: dict[str, Any] | None = None
    """DeepSpeed ZeRO settings passed to Accelerate's DeepSpeedPlugin (GPUs only); see docs/distributed.md."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        require(
            self.max_epochs is not None or self.max_steps is not None,
            "trainer.max_epochs and trainer.max_steps are both null: set at least one",
        )
        require(
            self.max_epochs is None or self.max_epochs >= 1, f"trainer.max_epochs must be >= 1, got {self.max_epochs}"
        )
        require(self.max_steps is None or self.max_steps >= 1, f"trainer.max_steps must be >= 1, got {self.max_steps}")
        require(
            self.mixed_precision in PRECISIONS,
            f"trainer.mixed_precision must be one of {', '.join(PRECISIONS)}, got {self.mixed_precision!r}",
        )
        require(
            self.gradient_accumulation_steps >= 1,
            f"trainer.gradient_accumulation_steps must be >= 1, got {self.gradient_accumulation_steps}",
        )
        require(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            f"trainer.max_grad_norm must be > 0 (or null to disable clipping), got {self.max_grad_norm}",
        )
        require(
            isinstance(self.deterministic, bool),
            f"trainer.deterministic must be true or false, got {self.deterministic!r}",
        )
        require(self.val_every_n_epochs >= 1, f"trainer.val_every_n_epochs must be >= 1, got {self.val_every_n_epochs}")
        require(
            self.val_every_n_steps is None or (type(self.val_every_n_steps) is int and self.val_every_n_steps >= 1),
            f"trainer.val_every_n_steps must be an integer >= 1 or null, got {self.val_every_n_steps!r}",
        )
        require(0 <= self.seed < 2**32, f"trainer.seed must be in 0 .. 2**32 - 1 (NumPy's range), got {self.seed}")
        require(
            self.output_dir is None or bool(self.output_dir.strip()),
            "trainer.output_dir is empty: name a folder, or leave it null for runs/<name>",
        )
        require(
            isinstance(self.resume, str) and bool(self.resume.strip()),
            f"trainer.resume must be never, auto, or the path of a checkpoint, got {self.resume!r}",
        )
        require(
            self.rendezvous_timeout > 0,
            f"trainer.rendezvous_timeout must be > 0 (seconds), got {self.rendezvous_timeout}",
        )
        for key in ("limit_train_batches", "limit_val_batches"):
            value = getattr(self, key)
            require(value is None or value >= 1, f"trainer.{key} must be >= 1 (or null for all), got {value}")
        require(
            self.sanity_val_batches >= 0,
            f"trainer.sanity_val_batches must be >= 0 (0 turns it off), got {self.sanity_val_batches}",
        )
        for key in ("overfit_batches", "fast_dev_run"):
            value = getattr(self, key)
            require(value >= 0, f"trainer.{key} must be >= 0 (0 turns it off), got {value}")
        self._check_features()

    def _check_features(self) -> None:
        require(
            self.compile in COMPILE_MODES,
            f"trainer.compile must be false, true, full or regional, got {self.compile!r}",
        )
        if self.fsdp is not None or self.deepspeed is not None:
            check_sharding(self.fsdp, self.deepspeed)
        require(
            not (self.auto_batch_size and self.deepspeed),
            "trainer.auto_batch_size does not work with trainer.deepspeed (DeepSpeed steps inside backward): "
            "set data.batch_size and trainer.gradient_accumulation_steps yourself",
        )


@dataclass
class SSSConfig:
    """A whole run: trainer settings plus the pluggable model, data and callbacks.

    Example:
        >>> cfg = SSSConfig(name="demo", model={"_target_": "sss.models.create_model", "name": "hunter_tiny"})
        >>> cfg.trainer.mixed_precision
        'auto'
    """

    name: str = ""
    """Run name (default: the config file's stem); output goes to runs/<name> unless trainer.output_dir is set."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    model: dict[str, Any] = field(default_factory=dict)
    """``_target_`` spec of the LitModule, e.g. ``{_target_: sss.models.create_model, name: hunter_small}``."""
    data: dict[str, Any] = field(default_factory=dict)
    """``_target_`` spec of the DataModule."""
    callbacks: list[dict[str, Any]] = field(default_factory=list)
    """``_target_`` specs of extra callbacks, run in this order before the stock ones."""

    @property
    def output_dir_given(self) -> bool | None:
        """Not a YAML key: `load_config` sets it on the config it returns, True when ``trainer.output_dir`` was
        written (in the YAML or an override), False when it was filled in as ``runs/<name>``. ``sss fit`` moves a
        default folder that holds a run on to ``runs/<name>_1``, ... but never a given one; None (a config built
        in Python): a ``runs/<name>`` folder counts as the default.

        Example:
            >>> cfg = SSSConfig()
            >>> cfg.output_dir_given is None
            True
            >>> cfg.output_dir_given = True
            >>> cfg.output_dir_given, SSSConfig().output_dir_given
            (True, None)
        """
        # An instance attribute outside the dataclass fields, so OmegaConf never sees it as a config key.
        return getattr(self, "_output_dir_given", None)

    @output_dir_given.setter
    def output_dir_given(self, given: bool | None) -> None:
        self._output_dir_given = given
