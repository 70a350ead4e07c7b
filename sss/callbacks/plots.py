"""`Plots`: the run's curves, one panel per metric family, and the validation confusion matrices, as PNGs at fit end."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sss._writing import writing_to
from sss.callbacks.base import Callback
from sss.callbacks.metrics_logger import read_metrics, step_figures

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["FAMILIES", "EvalPass", "Plots", "family_of", "is_curve", "robustness_figure"]

MISSING = (
    "Plots needs matplotlib, which sss installs with itself: pip install 'matplotlib>=3.7' "
    "(or reinstall sss), or turn the plots off with trainer.log.plots=false"
)

Series = dict[str, list[tuple[int, float]]]


@dataclass(frozen=True)
class Family:
    """A panel of ``metrics.png``: the metrics it holds, its title and y label, and whether its axis is logarithmic."""

    title: str
    ylabel: str
    log: bool
    match: Callable[[str], bool]


def _is(*names: str) -> Callable[[str], bool]:
    return lambda key: key in names


def _under(*prefixes: str) -> Callable[[str], bool]:
    return lambda key: key.startswith(prefixes)


FAMILIES = (
    Family("loss", "loss", False, lambda k: k.endswith("/loss")),
    Family("validation metrics", "score (0 to 1)", False, lambda k: False),  # filled by range, see family_of
    Family("retrieval", "recall at k (chance k / N)", False, lambda k: _retrieval(k) and not _median_rank(k)),
    # Linear: the ranks of a run often stay within one decade, where a log axis would show no tick label.
    Family("retrieval rank", "median rank of the true pair", False, lambda k: _retrieval(k) and _median_rank(k)),
    Family("learning rate", "learning rate", True, lambda k: k == "train/lr" or k.startswith("train/lr/")),
    Family("momentum", "momentum / beta1", False, _under("train/momentum/")),
    Family("gradient norm", "L2 norm, before clipping", True, lambda k: k.split("/")[:2] == ["train", "grad_norm"]),
    Family("gradient share", "share of the squared norm", False, _under("train/grad_share/")),
    Family("update ratio", "|Δθ| / |θ| per step", True, _is("train/update_ratio")),
    Family("throughput", "samples / s", False, _is("train/samples_per_sec")),
    Family("step time", "seconds / step", False, _is("train/step_time_s")),
    Family("data wait", "fraction of the step time", False, _is("train/data_wait_fraction")),
    Family("memory", "MB", False, _under("memory/")),
    Family("fp16 overflow", "steps", False, _under("train/overflow/")),
    Family("loss scale", "fp16 loss scale", True, _is("train/loss_scale")),
    Family("OGM-GE", "score ratio / coefficient", False, _under("train/ogm/")),
)
"""The panels of ``metrics.png``, in order; a metric that none holds gets a panel of its own."""

MARKERS = "osD^v<>ph*"

GROUPED = ("retrieval", "linear_probe")
"""``val/<group>/<metric>`` keys that are dataset-level figures (plotted), unlike per-class ``val/f1/<class>``."""

NOT_PLOTTED = ("train/epoch", "train/skipped_steps")  # a step counter, and what train/overflow/skipped shows


def _retrieval(key: str) -> bool:
    return key.startswith("val/retrieval/")


def _median_rank(key: str) -> bool:
    return key.endswith("_median_rank")


def is_curve(key: str) -> bool:
    """Whether the validation metric `key` gets a curve in ``metrics.png``: ``val/<name>`` or a `GROUPED` figure.

    Example:
        >>> [is_curve(k) for k in ("val/accuracy", "val/retrieval/audio_to_image_r1", "val/f1/dog", "train/loss")]
        [True, True, False, False]
    """
    parts = key.split("/")
    return parts[0] == "val" and (len(parts) == 2 or (len(parts) == 3 and parts[1] in GROUPED))


def family_of(key: str, values: Sequence[float] = ()) -> Family:
    """The panel of ``metrics.png`` that the metric `key` goes into.

    A validation metric other than the loss joins ``validation metrics`` when all its `values` lie
    in [0, 1] (accuracy, F1, mAP, BER, ``linear_probe/accuracy``, ...). The retrieval recalls share
    a ``retrieval`` panel and their median ranks a ``retrieval rank`` one. Any other metric that no
    `FAMILIES` entry holds gets a panel of its own, titled with its name.

    Example:
        >>> family_of("train/grad_norm/audio").title, family_of("val/loss").title
        ('gradient norm', 'loss')
        >>> family_of("val/accuracy", [0.5, 0.9]).ylabel, family_of("val/error_rate", [1.4]).title
        ('score (0 to 1)', 'val/error_rate')
        >>> family_of("val/retrieval/audio_to_image_r5").title, family_of("val/linear_probe/accuracy", [0.7]).title
        ('retrieval', 'validation metrics')
    """
    for fam in FAMILIES:
        if fam.match(key):
            return fam
    if key.startswith("val/") and values and all(0.0 <= v <= 1.0 for v in values):
        return FAMILIES[1]
    return Family(key, key.rsplit("/", 1)[-1], False, _is(key))


@dataclass(frozen=True)
class EvalPass:
    """The class predictions of one evaluation pass of the fit: the fused validation (``val``) or an ablation."""

    prefix: str
    """The pass's metric prefix: ``val`` (fused), ``val_image_only`` (audio absent), ``val_audio_only``."""
    step: int
    """``global_step`` when it ran."""
    preds: torch.Tensor
    target: torch.Tensor

    @property
    def what(self) -> str:
        """``fused (image + audio)``, ``image only (audio absent)``, ``audio only (image absent)`` or the suffix."""
        kept = self.prefix.partition("_")[2].removesuffix("_only")
        if not kept:
            return "fused (image + audio)"
        gone = {"image": "audio", "audio": "image"}.get(kept)
        return f"{kept} only ({gone} absent)" if gone else kept.replace("_", " ")

    @property
    def filename(self) -> str:
        """``confusion_matrix.png`` for the fused pass, ``confusion_matrix_<modality>_only.png`` for an ablation."""
        suffix = self.prefix.partition("_")[2]
        return f"confusion_matrix_{suffix}.png" if suffix else "confusion_matrix.png"


class Plots(Callback):
    """Writes ``OUTPUT_DIR/plots/*.png`` on the main process at FIT_END; lists them in `files`, keeps them in `figures`.

    * ``metrics.png``: one panel per metric family (`FAMILIES`: loss, validation metrics in [0, 1],
      learning rate, gradient norm, throughput, memory, ...), x the optimizer step, y the family's
      name and unit, a legend beside the panel (for one series, the title names it). Training figures every
      `every_n_steps` steps (the loss, the LR, and what health callbacks listed *before* this one
      published in ``state.logs``); validation figures at each fused validation, with the
      self-supervised ones (``val/retrieval/*``: a ``retrieval`` panel of the R@k curves and one of the
      median ranks; ``val/linear_probe/*`` among the scores). Per-class metrics (``val/f1/<class>``)
      are left to the trackers.
    * ``confusion_matrix.png``: predicted against true class of the latest *fused* validation pass,
      from the ``preds`` and ``target`` that `validation_step` returned (``state.eval_outputs``,
      gathered from all processes), ticks named by the datamodule's ``classes`` (indices otherwise).
      The modality ablation that ``sss fit`` runs at the end gets ``confusion_matrix_image_only.png``
      and ``confusion_matrix_audio_only.png``; each title says which pass, how many samples and the step.
    * ``robustness.png``: the headline metric against the fraction of samples with a modality absent, a
      line per modality (`robustness_figure`), when ``sss fit``'s final evaluation sets `robustness`.

    ``sss fit`` adds it by default (``trainer.log.plots: false`` turns it off). A resumed fit starts
    its curves with the history logged up to the resumed step, read from
    ``OUTPUT_DIR/logs/metrics.csv`` (the CSV tracker's cadence, ``log.every_n_steps``); without the
    CSV tracker the curves start at the resume. matplotlib is imported when the fit starts (and fails
    there, not after training, when it is missing).

    Example:
        >>> import tempfile
        >>> from sss import SSSTrainer
        >>> from sss.testing import boring_loader, BoringModule
        >>> plots = Plots(every_n_steps=1)
        >>> trainer = SSSTrainer(max_epochs=1, callbacks=[plots], mixed_precision="no", output_dir=tempfile.mkdtemp(),
        ...                      log={"progress": False, "trackers": []}, checkpoint={"every_epoch": False})
        sss: mixed precision no
        >>> _ = trainer.fit(BoringModule(), train_dataloaders=boring_loader(), val_dataloaders=boring_loader(n=16))
        sss: plots in ...: metrics.png, confusion_matrix.png
        >>> [ax.get_title() for ax in plots.figures["metrics"].axes]
        ['loss', 'validation metrics', 'learning rate: train/lr', 'gradient norm: train/grad_norm']
    """

    def __init__(self, every_n_steps: int | None = None, dpi: int = 100) -> None:
        self.every_n_steps = every_n_steps
        self.dpi = dpi
        self.files: list[Path] = []
        """The PNG files written at the latest FIT_END."""
        self.figures: dict[str, Figure] = {}
        """The matplotlib figures of those files, by file stem (``metrics``, ``confusion_matrix``, ...)."""
        self.train: Series = {}
        """Training figures: ``{key: [(step, value), ...]}``."""
        self.evals: Series = {}
        """Dataset-level figures of the fused validation passes: ``{"val/accuracy": [(step, value), ...]}``."""
        self.passes: dict[str, EvalPass] = {}
        """The latest class predictions of each evaluation pass, by prefix (``val``, ``val_audio_only``, ...)."""
        self.robustness: dict[str, Any] | None = None
        """A robustness report (`sss.evaluation.evaluate`'s ``robustness``) to draw as ``robustness.png``."""
        self.classes: list[str] | None = None
        self._capturing = False
        self._fitting = False
        self._history_until: int | None = None

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ModuleNotFoundError(MISSING) from None
        if self.every_n_steps is None:
            self.every_n_steps = trainer.config.log.every_n_steps
        self.train, self.evals, self.passes, self.files, self.figures = {}, {}, {}, [], {}
        self.robustness = None
        self._fitting = True
        start = trainer.state.global_step  # above 0 after a resume
        self._history_until = start if start and trainer.accelerator.is_main_process else None

    def on_epoch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._load_history(trainer)

    def _load_history(self, trainer: SSSTrainer) -> None:
        # Read once the fit has started, not at FIT_START: the metrics logger (a stock callback, so
        # after this one) sets aside the rows the interrupted run logged past the checkpoint there.
        until, self._history_until = self._history_until, None
        if until is None:
            return
        for row in read_metrics(trainer.output_dir / "logs" / "metrics.csv", up_to_step=until):
            step = int(row.pop("step", 0))
            for key, value in row.items():
                if is_curve(key):
                    self.evals.setdefault(key, []).append((step, value))
                elif _plotted(key):
                    self.train.setdefault(key, []).append((step, value))

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        state = trainer.state
        if state.step_was_skipped or state.global_step % self.every_n_steps:
            return
        # What the metrics logger writes at this step (so that a resume reads back the same history),
        # read from the device in one transfer with the other readers of this step (step_figures).
        figures = step_figures(state)
        values = {k: v for k, v in figures.items() if k not in NOT_PLOTTED or k in state.logs}
        for key, value in values.items():
            number = _number(value)
            if number is not None and _plotted(key):
                self.train.setdefault(key, []).append((state.global_step, number))

    def on_validation_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._capturing = self._fitting and trainer.state.stage == "val" and trainer.accelerator.is_main_process

    def on_validation_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if not self._capturing:
            return
        self._capturing = False
        state = trainer.state
        prefix = _prefix(state.eval_metrics)
        from sss.evaluation import is_robustness_pass  # imports the metrics, and torchmetrics imports matplotlib

        if is_robustness_pass(prefix):  # a point of the robustness curve, not a confusion matrix of its own
            return
        outputs = state.eval_outputs
        if "preds" in outputs and "target" in outputs:
            preds, target = outputs["preds"].long().cpu(), outputs["target"].long().cpu()
            self.passes[prefix] = EvalPass(prefix, state.global_step, preds, target)
        if prefix == "val":  # the ablation passes' figures are single points at the end: the results table has them
            for key, value in state.eval_metrics.items():
                if is_curve(key):  # per-class keys (val/f1/<class>) stay with the trackers
                    self.evals.setdefault(key, []).append((state.global_step, float(value)))

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._load_history(trainer)  # a resume with nothing left to train ran no epoch
        self._fitting = self._capturing = False
        if trainer.accelerator.is_main_process:
            classes = getattr(trainer.datamodule, "classes", None) or getattr(module, "classes", None)
            self.classes = [str(c) for c in classes] if classes else None
            folder = trainer.output_dir / "plots"
            self.files = self.write(folder, self.classes, getattr(module, "num_classes", None))
            print(f"sss: plots in {folder}: {', '.join(p.name for p in self.files)}", flush=True)

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._fitting = self._capturing = False
        self._history_until = None

    def build(self, classes: Sequence[str] | None = None, num_classes: int | None = None) -> dict[str, Figure]:
        """The figures of what was recorded, by file stem: ``metrics`` and one ``confusion_matrix*`` per pass.

        Example:
            >>> plots = Plots()
            >>> plots.train = {"train/loss": [(1, 0.9), (2, 0.7)], "train/lr": [(1, 1e-3), (2, 1e-3)]}
            >>> plots.passes = {"val": EvalPass("val", 2, torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]))}
            >>> figures = plots.build(classes=["ok", "fault"])
            >>> [(ax.get_title(), ax.get_ylabel()) for ax in figures["metrics"].axes]
            [('loss: train/loss', 'loss'), ('learning rate: train/lr', 'learning rate')]
            >>> [t.get_text() for t in figures["confusion_matrix"].axes[0].get_xticklabels()]
            ['ok', 'fault']
        """
        figures: dict[str, Figure] = {}
        panels = _panels({**self.train, **self.evals})
        if panels:
            figures["metrics"] = _curves(panels)
        # The fused pass first; its file keeps the plain name.
        for prefix in sorted(self.passes, key=lambda p: (p != "val", p)):
            one = self.passes[prefix]
            figures[one.filename.removesuffix(".png")] = _confusion(one, classes, num_classes)
        if self.robustness:
            figures["robustness"] = robustness_figure(self.robustness)
        return figures

    def write(self, folder: Path, classes: Sequence[str] | None = None, num_classes: int | None = None) -> list[Path]:
        """Draw the recorded curves and confusion matrices (`build`) into `folder`; returns the files written.

        Example:
            >>> import tempfile
            >>> from pathlib import Path
            >>> plots = Plots()
            >>> plots.train = {"train/loss": [(1, 0.9), (2, 0.7)], "train/lr": [(1, 1e-3), (2, 1e-3)]}
            >>> [p.name for p in plots.write(Path(tempfile.mkdtemp()))]
            ['metrics.png']
        """
        self.figures = self.build(classes, num_classes)
        files = []
        with writing_to(folder):  # a full disk names the plots folder
            folder.mkdir(parents=True, exist_ok=True)
            for stem, fig in self.figures.items():
                path = folder / f"{stem}.png"
                try:
                    fig.savefig(path, dpi=self.dpi)
                except BaseException:
                    path.unlink(missing_ok=True)  # no truncated PNG
                    raise
                files.append(path)
        return files


def _plotted(key: str) -> bool:
    return key.startswith(("train/", "memory/")) and key not in NOT_PLOTTED


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return number if math.isfinite(number) else None


def _prefix(metrics: dict[str, float]) -> str:
    # Which pass ran: validate(prefix=...) names its metrics <prefix>/<name>; the state does not carry it.
    return next(iter(metrics), "val/").split("/", 1)[0]


def _panels(series: Series) -> list[tuple[Family, Series]]:
    grouped: dict[str, tuple[Family, Series]] = {}
    for key, points in series.items():
        if not points:
            continue
        fam = family_of(key, [v for _, v in points])
        grouped.setdefault(fam.title, (fam, {}))[1][key] = points
    order = {fam.title: i for i, fam in enumerate(FAMILIES)}
    return sorted(grouped.values(), key=lambda item: order.get(item[0].title, len(order)))


def _curves(panels: list[tuple[Family, Series]]) -> Figure:
    fig = _figure(9.0, 0.6 + 2.4 * len(panels))
    # One step axis for all panels, so that a spike in one lines up with the others; each keeps its tick labels.
    axes = fig.subplots(len(panels), 1, squeeze=False, sharex=True)[:, 0]
    for ax, (fam, series) in zip(axes, panels, strict=True):
        for i, (name, points) in enumerate(series.items()):
            steps, values = zip(*sorted(points), strict=True)
            val = name.startswith("val")
            few = len(points) < 30 or val  # validation points are few and far between
            marker = MARKERS[i % len(MARKERS)] if few else None
            size = max(6.0 - 1.5 * i, 2.5)  # each smaller than the one before: equal series show as nested markers
            ax.plot(steps, values, marker=marker, markersize=size, linestyle="--" if val else "-", label=name)
        ax.tick_params(labelbottom=True)
        if fam.log and all(v > 0 for pts in series.values() for _, v in pts):
            from matplotlib.ticker import NullFormatter

            ax.set_yscale("log")  # LRs, norms and loss scales span orders of magnitude
            ax.yaxis.set_minor_formatter(NullFormatter())  # decades only: minor labels crowd a short axis
        only = next(iter(series)) if len(series) == 1 else None  # no legend for one series: the title names it
        ax.set_title(f"{fam.title}: {only}" if only and only != fam.title else fam.title, fontsize="medium")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(fam.ylabel)
        ax.grid(alpha=0.3)
        if len(series) > 1:  # beside the panel, so that it covers no data; the layout makes room for it
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    return fig


def _confusion(one: EvalPass, classes: Sequence[str] | None, num_classes: int | None) -> Figure:
    preds, target = one.preds, one.target
    seen = int(max(preds.max(), target.max())) + 1 if len(target) else 1
    n = max(num_classes or len(classes or ()) or seen, seen)
    matrix = torch.bincount(target * n + preds, minlength=n * n).reshape(n, n)
    names = list(classes) if classes is not None and len(classes) == n else [str(i) for i in range(n)]
    side = min(max(4.5, 0.55 * n + 2.5), 16.0)
    fig = _figure(side, side * 0.9)
    ax = fig.add_subplot()
    image = ax.imshow(matrix.numpy(), cmap="Blues", vmin=0)
    fig.colorbar(image, ax=ax, shrink=0.8, label="samples")
    if n <= 25:  # beyond that the numbers would not fit their cells
        peak = int(matrix.max()) or 1
        for t in range(n):
            for p in range(n):
                count = int(matrix[t, p])
                ax.text(p, t, str(count), ha="center", va="center", color="white" if count > peak / 2 else "black")
    slanted = max(map(len, names)) > 3  # long class names would run into each other
    ax.set_xticks(range(n), names, rotation=45 if slanted else 0, ha="right" if slanted else "center")
    ax.set_yticks(range(n), names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    accuracy = float((preds == target).double().mean()) if len(target) else math.nan
    split = one.prefix.partition("_")[0]
    ax.set_title(
        f"{split}, {one.what}: {len(target)} samples at step {one.step}\naccuracy {accuracy:.3f}", fontsize="medium"
    )
    return fig


def robustness_figure(report: dict[str, dict[str, dict[str, float]]], title: str = "") -> Figure:
    """The robustness curve: x the fraction of samples with the modality absent, y the headline metric, a line each.

    Example:
        >>> curve = lambda last: {"0.0": {"accuracy": 0.9}, "1.0": {"accuracy": last}}
        >>> report = {"image": curve(0.7), "audio": curve(0.5)}
        >>> ax = robustness_figure(report).axes[0]
        >>> ax.get_ylabel(), [line.get_label() for line in ax.get_lines()]
        ('accuracy', ['image absent', 'audio absent'])
    """
    from sss.evaluation import robustness_metric

    metric = robustness_metric(report)
    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot()
    rates: set[float] = set()
    for i, (modality, rows) in enumerate(report.items()):
        points = sorted((float(rate), row.get(metric, math.nan)) for rate, row in rows.items())
        rates |= {rate for rate, _ in points}
        xs, ys = zip(*points, strict=True) if points else ((), ())
        size = max(7.0 - 2.0 * i, 3.0)  # each smaller than the one before: equal curves show as nested markers
        ax.plot(xs, ys, marker=MARKERS[i % len(MARKERS)], markersize=size, label=f"{modality} absent")
    ax.set_xticks(sorted(rates))
    ax.set_xlabel("fraction of samples with the modality absent")
    ax.set_ylabel(metric)
    ax.set_title(title or f"robustness: {metric} with a modality absent", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", frameon=False)
    return fig


def _figure(width: float, height: float) -> Figure:
    # The object API, not pyplot: no global figure registry, no GUI backend chosen for the whole process.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")  # room for the legends beside the panels
    FigureCanvasAgg(fig)
    return fig
