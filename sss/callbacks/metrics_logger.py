"""`MetricsLogger`: training and evaluation figures to Accelerate's trackers (CSV, TensorBoard, ...).

A resumed run continues the logs of the run it resumes: ``metrics.csv`` keeps every row up to the
checkpoint's global step, and TensorBoard keeps its earlier event files, both keyed by
``global_step``. The rows the interrupted run logged for later steps (which the resumed run logs
again) are moved to ``metrics.superseded.N.csv`` beside it, and TensorBoard's ``purge_step`` hides
their events, so that the steps of ``metrics.csv`` and of the TensorBoard curves stay monotonic.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import math
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate.tracking import GeneralTracker

from sss._preflight import check_trackers
from sss._writing import writing_to
from sss.callbacks.base import Callback
from sss.callbacks.export import export_run_model
from sss.warnings import SSSWarning

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = [
    "CSVTracker",
    "MetricsLogger",
    "host_floats",
    "make_trackers",
    "missing_trackers",
    "read_metrics",
    "step_figures",
]

_HOST_VALUE = "_sss_host_value"
"""The attribute a tensor read by `host_floats` keeps its value in, so the next reader pays no sync."""


def host_floats(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with each one-element tensor replaced by its Python float, all read in one transfer per device.

    Reading a device value is a host sync: the host waits for everything queued before it. One
    stacked ``.tolist()`` pays that once for all of them. Each tensor read keeps its value (an
    attribute of the tensor itself: no cache shared between readers, runs or trainers), so the next
    reader of the same tensor (the progress bar, the plots and the metrics logger at one logging
    step) pays nothing; a published value is a new tensor each time, never one changed in place.
    Other values pass through.

    Example:
        >>> t = torch.tensor(0.5)
        >>> host_floats({"train/loss": t, "train/lr": 0.1, "train/epoch": 2})
        {'train/loss': 0.5, 'train/lr': 0.1, 'train/epoch': 2}
    """
    out = dict(values)
    todo = {}
    for key, value in values.items():
        if isinstance(value, torch.Tensor):
            seen = getattr(value, _HOST_VALUE, None)
            if seen is None:
                todo[key] = value
            else:
                out[key] = seen
    if not todo:
        return out
    by_device: dict[torch.device, list[str]] = {}
    for key, value in todo.items():
        by_device.setdefault(value.device, []).append(key)
    for device, keys in by_device.items():
        dtype = torch.float32 if device.type == "mps" else torch.float64  # exact for fp32/bf16/fp16 values
        stacked = torch.stack([todo[k].detach().reshape(()).to(dtype) for k in keys])
        out.update(zip(keys, stacked.tolist(), strict=True))  # the one device sync
    for key, value in todo.items():
        setattr(value, _HOST_VALUE, out[key])
    return out


def step_figures(state: Any) -> dict[str, Any]:
    """The figures of a logging step on the host: loss, lr, epoch, grad norm, skipped steps and ``state.logs``.

    ``train/loss`` is the latest micro-batch's loss, ``train/grad_norm`` the norm the trainer clipped
    (when it clips); values in ``state.logs`` win over those. Callbacks may publish device tensors
    in ``state.logs``: all are read here in one transfer (`host_floats`) and replaced in
    ``state.logs`` by their floats, so later readers pay nothing.

    Example:
        >>> from sss.trainer.state import TrainState
        >>> state = TrainState(loss=torch.tensor(0.25), lr=0.1, logs={"train/grad_share/image": torch.tensor(0.5)})
        >>> step_figures(state)
        {'train/loss': 0.25, 'train/lr': 0.1, 'train/epoch': 0, 'train/skipped_steps': 0, 'train/grad_share/image': 0.5}
        >>> state.logs
        {'train/grad_share/image': 0.5}
    """
    values: dict[str, Any] = {"train/lr": state.lr, "train/epoch": state.epoch}
    if state.loss is not None:
        values = {"train/loss": state.loss, **values}
    if state.grad_norm is not None:
        values["train/grad_norm"] = state.grad_norm
    values["train/skipped_steps"] = state.skipped_steps
    values.update(state.logs)  # what other callbacks published since the last log
    figures = host_floats(values)
    state.logs.update({k: figures[k] for k in state.logs})
    return figures


class CSVTracker(GeneralTracker):
    """An Accelerate tracker writing ``metrics.csv``: one row per logged step, one column per name.

    Rows are appended to the file, which is never rebuilt from memory: a name seen for the first
    time adds a column by rewriting the file from its own content into ``metrics.csv.tmp`` and
    renaming that over it, so every earlier row stays (those of a run this one resumed too) and a
    kill mid-rewrite leaves the previous file whole. `continue_from` sets aside the rows a resumed
    run will log again.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> t = CSVTracker(d)
        >>> t.log({"train/loss": 0.5}, step=1); t.log({"val/accuracy": 0.9}, step=2)
        >>> print(open(f"{d}/metrics.csv").read().strip())
        step,train/loss,val/accuracy
        1,0.5,
        2,,0.9
        >>> again = CSVTracker(d)  # a later process (a resume) appends to the same file
        >>> again.log({"train/loss": 0.4, "train/lr": 0.1}, step=3)
        >>> print(open(f"{d}/metrics.csv").read().strip())
        step,train/loss,val/accuracy,train/lr
        1,0.5,,
        2,,0.9,
        3,0.4,,0.1
    """

    name = "csv"
    requires_logging_directory = True
    main_process_only = True

    def __init__(self, logging_dir: str | Path) -> None:
        super().__init__()
        self.path = Path(logging_dir) / "metrics.csv"
        self.columns: list[str] = []
        """The file's header; read from the file at the first use."""
        self._opened = False

    @property
    def tracker(self) -> Path:
        return self.path

    def start(self) -> None:
        """Read the header of an existing ``metrics.csv`` (Accelerate calls this in ``init_trackers``)."""
        if self._opened:
            return
        self._opened = True
        header, _, partial = _read(self.path)
        self.columns = header or ["step"]
        if partial is not None:  # a run killed mid-append: set the broken line aside before appending after it
            self.continue_from(math.inf)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """The run's configuration is saved by the CLI as ``config.yaml``; nothing to add here."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.start()
        row = {"step": step, **{k: v for k, v in values.items() if isinstance(v, (int, float))}}
        new = [k for k in row if k not in self.columns]
        if new or not self.path.exists():
            self._rewrite(self.columns + new)
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns, lineterminator="\n").writerow(row)

    def continue_from(self, step: float | None) -> tuple[Path, int] | None:
        """Keep the rows a run that continues after `step` builds on; move the others to ``metrics.superseded.N.csv``.

        Kept are the leading rows up to the first one logged after `step` (a resumed run logs
        those steps again); ``None`` keeps none (a fresh run in a folder that holds a file). A
        partial last line (a kill mid-write) is always set aside. The side file is written before
        ``metrics.csv`` is shortened, both atomically. Returns the side file and the number of
        rows moved there, or None when nothing moved.

        Example:
            >>> import tempfile
            >>> t = CSVTracker(tempfile.mkdtemp())
            >>> for s in (2, 4, 6): t.log({"train/loss": 1 / s}, step=s)
            >>> aside, moved = t.continue_from(step=4)
            >>> aside.name, moved, [r["step"] for r in read_metrics(t.path)]
            ('metrics.superseded.1.csv', 1, [2.0, 4.0])
        """
        self._opened = True
        header, body, partial = _read(self.path)
        rows = 0 if step is None else next((i for i, r in enumerate(body) if _step(r) > step), len(body))
        moved = body[rows:]
        if not moved and partial is None:
            self.columns = header or self.columns or ["step"]
            return None
        aside = _free_name(self.path)
        text = _csv_text(header, moved) + (partial + "\n" if partial is not None else "")
        _atomic_write(aside, text)  # first the copy, then the shortened original: a kill in between loses nothing
        if rows == 0:
            self.path.unlink()
            self.columns = ["step"]
        else:
            _atomic_write(self.path, _csv_text(header, body[:rows]))
            self.columns = header
        return aside, len(moved) + (partial is not None)

    def _rewrite(self, columns: list[str]) -> None:
        header, body, _ = _read(self.path)
        columns = header + [c for c in columns if c not in header]
        # the rows' own text, padded with empty cells: values are not re-parsed, so they stay as written
        padded = [r + [""] * (len(columns) - len(r)) for r in body]
        _atomic_write(self.path, _csv_text(columns, padded))
        self.columns = columns


def read_metrics(path: str | Path, up_to_step: int | None = None) -> list[dict[str, float]]:
    """The rows of a ``metrics.csv``, in order, as ``{name: value}`` of the cells they fill (``step`` too).

    With `up_to_step`, the rows stop before the first one logged after that step. A partial last
    line (a run killed while writing it) is left out; a missing file gives no rows.

    Example:
        >>> import tempfile
        >>> t = CSVTracker(tempfile.mkdtemp())
        >>> t.log({"train/loss": 0.5}, step=1); t.log({"val/accuracy": 0.9}, step=2)
        >>> read_metrics(t.path)
        [{'step': 1.0, 'train/loss': 0.5}, {'step': 2.0, 'val/accuracy': 0.9}]
        >>> read_metrics(t.path, up_to_step=1)
        [{'step': 1.0, 'train/loss': 0.5}]
    """
    header, body, _ = _read(Path(path))
    rows = []
    for cells in body:
        if up_to_step is not None and _step(cells) > up_to_step:
            break
        rows.append({k: x for k, v in zip(header, cells, strict=False) if (x := _number(v)) is not None})
    return rows


def _number(cell: str) -> float | None:
    try:
        return float(cell) if cell else None
    except ValueError:
        return None  # e.g. a bool a callback published, written as True


def _read(path: Path) -> tuple[list[str], list[list[str]], str | None]:
    """Header, complete data rows and the partial last line (None when the file ends with a newline)."""
    if not path.exists():
        return [], [], None
    with path.open(newline="") as f:  # the file's own line endings: a partial last line shows
        text = f.read()
    partial = None
    if text and not text.endswith("\n"):
        cut = text.rfind("\n") + 1
        text, partial = text[:cut], text[cut:]
    records = [r for r in csv.reader(io.StringIO(text)) if r]
    return (records[0], records[1:], partial) if records else ([], [], partial)


def _step(cells: list[str]) -> float:
    try:
        return float(cells[0])
    except (IndexError, ValueError):
        return float("-inf")  # a row logged without a step: it goes where its neighbours go


def _csv_text(header: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if header:
        writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def _free_name(path: Path) -> Path:
    n = 1
    while (aside := path.with_name(f"{path.stem}.superseded.{n}{path.suffix}")).exists():
        n += 1
    return aside


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself
    finally:
        os.close(fd)


def make_trackers(names: list[str], logging_dir: Path) -> list[Any]:
    """Accelerate ``log_with`` entries for tracker names; ``csv`` becomes a `CSVTracker`.

    Example:
        >>> [type(t).__name__ for t in make_trackers(["csv"], Path("/tmp/logs"))]
        ['CSVTracker']
    """
    return [CSVTracker(logging_dir) if name == "csv" else name for name in names]


class MetricsLogger(Callback):
    """Logs ``train/loss``, ``train/lr``, ``train/grad_norm`` every N steps and all metrics after each evaluation.

    Values reach every tracker of the Accelerator (on the main process), keyed by ``global_step``.
    A resume at global step N continues the same files: at FIT_START the rows of ``metrics.csv``
    after step N (the interrupted run logged them after the checkpoint; the resumed run logs those
    steps again) go to ``metrics.superseded.K.csv``, and TensorBoard gets ``purge_step=N+1``,
    which hides the interrupted run's events from step N+1 on. A fresh fit in a folder that
    already holds a ``metrics.csv`` sets all of it aside the same way (and hides older events).

    ``mlflow`` and ``wandb`` get the run config (flattened: ``trainer.max_steps``, ``model.name``, ...)
    as parameters, and their run id goes into checkpoints (`state_dict`), so that a resumed fit
    continues the same MLflow / W&B run. MLflow's experiment and W&B's project are named after the
    output folder, the run too; ``MLFLOW_TRACKING_URI`` / ``WANDB_MODE`` and the other variables of
    those libraries apply. At FIT_END the model folder (``OUTPUT_DIR/model``, exported there first)
    goes to the MLflow run as artifacts under ``model/`` (docs/tracking.md).

    Example:
        >>> MetricsLogger(every_n_steps=50).every_n_steps
        50
    """

    def __init__(self, every_n_steps: int = 10, trackers: Sequence[str] = ("csv", "tensorboard")) -> None:
        self.every_n_steps = every_n_steps
        self.trackers = list(trackers)
        self.run_ids: dict[str, str] = {}
        """The MLflow / W&B run this fit logs to, by tracker name; kept in checkpoints to continue it on resume."""

    def state_dict(self) -> dict[str, Any]:
        return {"run_ids": dict(self.run_ids)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_ids = dict(state.get("run_ids", {}))

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        from accelerate.tracking import filter_trackers

        accelerator, start = trainer.accelerator, trainer.state.global_step
        if not accelerator.log_with:  # an Accelerator built with its own log_with keeps it
            logging_dir = trainer.output_dir / "logs"
            accelerator.log_with = filter_trackers(make_trackers(self.trackers, logging_dir), logging_dir)
            if accelerator.is_main_process:
                _warn_missing(self.trackers, accelerator.log_with)
        run = {**(trainer.run_config or {}), "trainer": dataclasses.asdict(trainer.config)}  # the YAML's keys
        config = {k: str(v) for k, v in _flatten(run).items()}
        # purge_step: TensorBoard readers drop the earlier event files' points from that step on
        init_kwargs = {"tensorboard": {"purge_step": start + 1 if start else 0}, **self._run_kwargs(trainer)}
        check_trackers(accelerator.log_with, accelerator.is_main_process)  # seconds, not MLflow's minutes of retries
        _quiet_writer_threads()
        with writing_to(trainer.output_dir / "logs"):
            accelerator.init_trackers(trainer.output_dir.name or "sss", init_kwargs=init_kwargs)
            for tracker in accelerator.trackers:
                _store_config(tracker, config, start)
        self.run_ids.update(_run_ids(accelerator.trackers))
        for tracker in accelerator.trackers:
            with writing_to(trainer.output_dir / "logs"):
                moved = tracker.continue_from(start or None) if isinstance(tracker, CSVTracker) else None
            if moved is not None:
                why = f"logged after step {start}, which this run logs again," if start else "of an earlier fit"
                print(f"sss: {moved[1]} row(s) of {tracker.path} {why} moved to {moved[0].name}", flush=True)

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        state = trainer.state
        if state.step_was_skipped or state.global_step % self.every_n_steps:
            return
        values = step_figures(state)  # one device sync for all of them (none when the bar or plots read them first)
        with writing_to(trainer.output_dir / "logs"):  # a full disk names the logs folder
            trainer.accelerator.log(values, step=state.global_step)

    def on_validation_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if trainer.state.eval_metrics:
            with writing_to(trainer.output_dir / "logs"):
                trainer.accelerator.log(dict(trainer.state.eval_metrics), step=trainer.state.global_step)

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if "mlflow" in self.trackers and trainer.accelerator.log_with:
            _log_model_folder(trainer, module)
        self._finish(trainer)

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        # The run failed already: a tracker that cannot flush either (the same full disk) must not replace
        # that error with its own.
        with contextlib.suppress(Exception):
            self._finish(trainer)

    def _run_kwargs(self, trainer: SSSTrainer) -> dict[str, dict[str, Any]]:
        # Accelerate's init_kwargs of MLflow and W&B: the run's name, and the run to continue on a resume.
        name = trainer.output_dir.name or "sss"
        kwargs: dict[str, dict[str, Any]] = {"mlflow": {"run_name": name}, "wandb": {"name": name}}
        if "MLFLOW_RUN_ID" not in os.environ and "mlflow" in self.run_ids:
            kwargs["mlflow"]["run_id"] = self.run_ids["mlflow"]
        if "wandb" in self.run_ids:
            kwargs["wandb"].update(id=self.run_ids["wandb"], resume="allow")
        if "wandb" in self.trackers and "WANDB_DIR" not in os.environ:  # the run's folder, not ./wandb of the cwd
            (trainer.output_dir / "logs").mkdir(parents=True, exist_ok=True)
            kwargs["wandb"]["dir"] = str(trainer.output_dir / "logs")
        return kwargs

    def _finish(self, trainer: SSSTrainer) -> None:
        # Not accelerator.end_training(): it also destroys the process group, and evaluation or
        # export may still follow the fit.
        try:
            with writing_to(trainer.output_dir / "logs"):  # TensorBoard's last flush may find the disk full
                for tracker in trainer.accelerator.trackers:
                    tracker.finish()
        finally:
            trainer.accelerator.trackers.clear()


def _quiet_writer_threads() -> None:
    # TensorBoard writes its event files from a thread. A failed write (a full disk) ends that thread with a
    # raw "Exception in thread ... Traceback" on stderr, and TensorBoard raises the same exception again in
    # the thread that logs or flushes next (its _AsyncWriter checks the worker), where sss reports it as one
    # line naming the logs folder. So the writer thread's own print is dropped; every other thread's stays.
    previous = threading.excepthook
    if getattr(previous, "sss_quiet_writers", False):
        return

    def hook(args: Any) -> None:
        thread = type(args.thread)
        if not (thread.__name__ == "_AsyncWriterThread" and thread.__module__.startswith("tensorboard")):
            previous(args)

    hook.sss_quiet_writers = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def missing_trackers(requested: Sequence[str], kept: Sequence[Any]) -> list[str]:
    """The tracker names of `requested` that Accelerate's ``filter_trackers`` left out of `kept` (not installed).

    Example:
        >>> missing_trackers(["csv", "tensorboard", "wandb"], [CSVTracker("/tmp/logs"), "tensorboard"])
        ['wandb']
    """
    names = {str(getattr(t, "value", t)) for t in kept if not isinstance(t, GeneralTracker)}  # names or LoggerType
    return [n for n in requested if n != "csv" and n not in names]


def _warn_missing(requested: Sequence[str], kept: Sequence[Any]) -> None:
    # Accelerate drops an uninstalled tracker with a debug-level log line nobody sees.
    for name in missing_trackers(requested, kept):
        warnings.warn(
            f"tracker {name!r} of trainer.log.trackers is not installed, so nothing is logged to it: "
            f"pip install {name} (or remove it from trainer.log.trackers)",
            SSSWarning,
            stacklevel=3,
        )


def _run_ids(trackers: Sequence[Any]) -> dict[str, str]:
    ids = {}
    for tracker in trackers:
        if tracker.name == "mlflow" and getattr(tracker, "active_run", None) is not None:
            ids["mlflow"] = tracker.active_run.info.run_id
        elif tracker.name == "wandb" and getattr(tracker, "run", None) is not None:
            ids["wandb"] = tracker.run.id
    return ids


def _store_config(tracker: Any, config: dict[str, str], start: int) -> None:
    # MLflow refuses to change a parameter of a run ("Changing param values is not allowed"): a resumed
    # run logs the new keys, and the values a resume changed (more steps, say) as tags resumed_at_step_N.KEY.
    if tracker.name != "mlflow" or not start:
        tracker.store_init_configuration(config)
        return
    import mlflow

    logged = mlflow.get_run(tracker.active_run.info.run_id).data.params
    tracker.store_init_configuration({k: v for k, v in config.items() if k not in logged})
    changed = {f"resumed_at_step_{start}.{k}": v for k, v in config.items() if k in logged and logged[k] != v}
    if changed:
        mlflow.set_tags(changed)


def _log_model_folder(trainer: SSSTrainer, module: LitModule) -> None:
    # `sss fit` exports OUTPUT_DIR/model after fit returns, when the run is over: export it now (as HubPush
    # does; `sss fit` rewrites it later with the same weights) and send it to the MLflow run while it is open.
    # Decided from log_with, which every process holds alike (older Accelerates build trackers on the main
    # process only), so that all take part in the gather or none does.
    if "mlflow" not in {_tracker_name(t) for t in trainer.accelerator.log_with}:  # mlflow is not installed
        return
    folder = export_run_model(trainer, module, trainer.output_dir / "model", trainer.state.metrics)
    tracker = next((t for t in trainer.accelerator.trackers if t.name == "mlflow"), None)
    if folder is not None and tracker is not None:  # the main process
        tracker.log_artifacts(str(folder), artifact_path="model")


def _tracker_name(entry: Any) -> str:
    # A log_with entry: a tracker object, or a name (a string or Accelerate's LoggerType).
    return entry.name if isinstance(entry, GeneralTracker) else str(getattr(entry, "value", entry))


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
