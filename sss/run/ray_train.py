"""``sss fit --engine ray``: the unchanged ``sss fit`` in the workers of Ray Train's ``TorchTrainer``.

Ray starts N worker processes (on one machine or across a Ray cluster), forms their torch process group
(gloo on CPUs, NCCL on GPUs) and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``; Accelerate's `PartialState` finds the group already formed and takes it as it is
(``MULTI_CPU`` / ``MULTI_GPU``, N processes). Each worker runs `sss.run.fit.run_fit` with
``--resume auto``: when a worker dies, Ray ends the group and starts a new one
(``FailureConfig(max_failures=K)``), which continues from the newest complete ``sss`` checkpoint in
OUTPUT_DIR. State lives in ``sss`` checkpoints only; Ray gets the metrics (`RayReport`).

Two things are not left to Ray's waiting and retrying. A cluster address where nothing answers is refused
within seconds, before ``ray.init`` (which would wait for minutes, silently). sss's own deterministic errors
in a worker (a `DataError`, a `ConfigError`, a refusal such as a finished run) are not retried, whatever
``--max-failures`` says: the same data or config fails the same way on every restart; the run stops at
once with that error's one line and exit code, as a 1-process ``sss fit`` would (`WorkerRefusal`).

Ray is imported inside the functions: ``sss --help`` and every other command never load it.
"""

from __future__ import annotations

import copy
import os
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sss._lock import folder_holder
from sss.callbacks.base import Callback
from sss.config import SSSConfig
from sss.errors import RunFolderError, SSSError
from sss.run.folder import ray_output_dir

__all__ = ["RAY_MISSING", "RayEngineError", "RayReport", "WorkerRefusal", "fit_with_ray"]

RAY_MISSING = "sss fit --engine ray needs Ray: pip install 'shadow-sound-hunter[ray]'"
"""The one line ``sss fit --engine ray`` prints where Ray Train is not installed."""

# Passed to every worker: MKL's pinned floating-point path (set before torch loads, as `sss` does for its
# own processes) and the data cache, so that a worker reads the data the driver's runs read.
_WORKER_ENV = ("MKL_CBWR", "SSS_CACHE", "HF_HOME", "CUBLAS_WORKSPACE_CONFIG")


class RayEngineError(SSSError):
    """``sss fit --engine ray`` cannot start, or its workers failed more often than ``--max-failures`` allows.

    Example:
        >>> RayEngineError("x").exit_code
        1
    """


class WorkerRefusal(SSSError):
    """sss's own deterministic error in a Ray worker (bad data, a bad config, a refusal): the run stops, no restart.

    Carries the worker's one line and its exit code to the driver, where ``sss`` prints them as a 1-process
    run would. ``sss_refusal`` is what Ray's controller-side check (`sss.run._ray_refusal`) looks for.

    Example:
        >>> import pickle
        >>> back = pickle.loads(pickle.dumps(WorkerRefusal("train.csv, line 3: bad.wav cannot be decoded", 1)))
        >>> str(back), back.exit_code, back.sss_refusal
        ('train.csv, line 3: bad.wav cannot be decoded', 1, True)
    """

    sss_refusal = True

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[Any, ...]:  # across processes with its exit code (Ray pickles it twice)
        return type(self), (str(self), self.exit_code)


class RayReport(Callback):
    """Report the run's metrics to Ray Train (``ray.train.report``) at logging steps, validations and the fit's end.

    Added by `fit_with_ray` to the callbacks of the Ray workers only. Every worker reports at the same
    points (Ray Train waits for all of them there); Ray keeps rank 0's values. The final evaluation's
    image-only and audio-only passes are not reported one by one: the report at FIT_END carries their
    headline figures and the fusion gain. No Ray checkpoint is reported: the run's state is in its
    ``sss`` checkpoints. A report waits until Ray's controller has collected the one before (it polls
    every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s): reports closer together slow the training down.

    Args:
        every_n_steps: Report after every N-th optimizer step (``trainer.log.every_n_steps``).

    Example:
        >>> RayReport(every_n_steps=20).every_n_steps
        20
    """

    def __init__(self, every_n_steps: int = 10) -> None:
        self.every_n_steps = every_n_steps

    def on_after_optimizer_step(self, trainer: Any, module: Any) -> None:
        state = trainer.state
        if state.step_was_skipped or state.global_step % self.every_n_steps:
            return
        self._report(trainer, {"train/loss": state.loss, "train/lr": state.lr})

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        metrics = dict(trainer.state.eval_metrics)
        split = next(iter(metrics), "").split("/")[0]
        if split in ("val", "test"):  # not an ablation pass (val_image_only/...): FIT_END reports those
            self._report(trainer, metrics)

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        self._report(trainer, {})

    def _report(self, trainer: Any, values: dict[str, Any]) -> None:
        import ray.train

        state = trainer.state
        metrics = {**state.metrics, **values, "step": state.global_step, "epoch": state.epoch}
        ray.train.report({k: _number(v) for k, v in metrics.items() if _number(v) is not None})


def _number(value: Any) -> float | int | None:
    # Ray refuses tensors in metrics; a one-element tensor becomes its number, anything else that is no number goes.
    if isinstance(value, bool | int | float):
        return value
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "numel", lambda: 0)() == 1:
        return item()
    return None


def fit_with_ray(
    cfg: SSSConfig,
    num_workers: int,
    address: str | None = None,
    max_failures: int = 0,
    resume: str | None = None,
    ray_callbacks: Sequence[Any] = (),
) -> dict[str, Any]:
    """Train `cfg` in `num_workers` Ray Train workers; return the run's results (OUTPUT_DIR/results.json).

    Without `address` a local Ray instance is started (as many CPUs as the machine has, at least
    `num_workers`) and stopped after; with one (``auto``, ``ray://host:10001``, ``host:6379``) the
    workers run on that cluster, whose every worker must reach OUTPUT_DIR (a shared file system).
    Workers get GPUs when the cluster has them and ``trainer.cpu`` is false.

    Args:
        cfg: The resolved config (`sss.config.load_config`).
        num_workers: Worker processes; each is one process of the run (``num_processes`` in results.json).
        address: A running Ray cluster's address; None starts a local one.
        max_failures: How often Ray starts the worker group again after a worker failed (-1: always);
            each restart continues from the newest complete checkpoint in OUTPUT_DIR.
        resume: None / ``never`` (a fresh run, in a folder of its own as ``sss fit`` picks it),
            ``auto`` or ``latest`` (as ``sss fit --resume``); None takes ``trainer.resume``.
        ray_callbacks: Ray Train ``UserCallback`` objects for the run (they run in Ray's controller).

    Raises:
        RayEngineError: Ray is missing, the arguments cannot work, nothing answers at `address`, or the run
            failed more than `max_failures` times (the checkpoints in OUTPUT_DIR stay; the same call continues).
        WorkerRefusal: a worker raised sss's own deterministic error (data, config): not retried.

    Example:
        >>> from sss.config import load_config
        >>> fit_with_ray(load_config(None, []), num_workers=2, resume="runs/x/checkpoints/step_0000010")
        Traceback (most recent call last):
        ...
        sss.run.ray_train.RayEngineError: sss fit --engine ray --resume runs/x/checkpoints/step_0000010: ...
    """
    resume = _checked_arguments(cfg, num_workers, max_failures, resume)
    _import_ray()
    import ray

    _check_address(address)
    cfg = copy.deepcopy(cfg)
    cfg.trainer.output_dir = str(_output_folder(cfg, resume).absolute())
    env = {name: os.environ[name] for name in _WORKER_ENV if name in os.environ}
    env.setdefault("MKL_CBWR", "AUTO,STRICT")
    started = not ray.is_initialized()
    if started:
        cpus = None if address else max(os.cpu_count() or 1, num_workers)
        ray.init(address=address, num_cpus=cpus, include_dashboard=False, runtime_env={"env_vars": env})
    try:
        return _fit(cfg, num_workers, max_failures, env, list(ray_callbacks))
    finally:
        if started:
            ray.shutdown()


def _checked_arguments(cfg: SSSConfig, num_workers: int, max_failures: int, resume: str | None) -> str | None:
    # The arguments a Ray run can work with, checked before Ray is imported; returns the resume mode.
    if num_workers < 1:
        raise RayEngineError(f"--num-workers must be >= 1, got {num_workers}")
    if max_failures < -1:
        raise RayEngineError(f"--max-failures must be >= -1 (-1: restart without limit), got {max_failures}")
    resume = cfg.trainer.resume if resume is None else resume
    resume = None if resume == "never" else resume
    if resume not in (None, "auto", "latest"):
        raise RayEngineError(
            f"sss fit --engine ray --resume {resume}: a Ray run continues from the newest checkpoint of its "
            "OUTPUT_DIR (--resume or --resume auto), since that is what a restarted worker group resumes; to "
            "continue from this checkpoint, run without --engine ray"
        )
    return resume


def _import_ray() -> None:
    try:
        import ray.train.torch  # noqa: F401
    except ImportError:
        raise RayEngineError(RAY_MISSING) from None


def _check_address(address: str | None) -> None:
    # ray.init waits for minutes, printing nothing useful, where nothing listens at a cluster's address
    # (its GCS port, or the Ray Client port of ray://): a short connect says so first. "auto" is found
    # by Ray itself, from RAY_ADDRESS or this machine's running cluster.
    import ray

    from sss._preflight import CONNECT_SECONDS, connect_error
    from sss._redact import redact_urls

    if ray.is_initialized():  # fit_with_ray works on the instance it finds
        return
    given, source = (address, "--ray-address") if address else (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS")
    if not given or given in ("auto", "local"):
        return
    client = given.startswith("ray://")
    try:
        parts = urllib.parse.urlsplit(given if client else f"//{given}")
        host, port = parts.hostname, parts.port or (10001 if client else 6379)
    except ValueError:
        raise RayEngineError(f"{source} {redact_urls(given)}: not host:port nor ray://host:port") from None
    why = connect_error(host, port) if host else "no host"
    if why is None:
        return
    start = f"ray start --head --ray-client-server-port {port}" if client else f"ray start --head --port {port}"
    raise RayEngineError(
        redact_urls(
            f"{source} {given}: no Ray cluster answered at {host}:{port} ({why}; a {CONNECT_SECONDS:g} s check). "
            f"Start one there (`{start}`), or give the address `ray start` printed, or drop {source} for a "
            "local Ray instance"
        )
    )


def _output_folder(cfg: SSSConfig, resume: str | None) -> Path:
    # Decided here, once, for every attempt: the workers continue this folder (--resume auto).
    try:
        return ray_output_dir(cfg, resume)
    except RunFolderError as exc:
        raise RayEngineError(str(exc)) from None


def _fit(cfg: SSSConfig, num_workers: int, max_failures: int, env: dict[str, str], callbacks: list[Any]) -> dict:
    import dataclasses
    import json

    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = Path(cfg.trainer.output_dir)
    gpus = ray.cluster_resources().get("GPU", 0)
    use_gpu = not cfg.trainer.cpu and gpus > 0
    if use_gpu and gpus < num_workers:
        raise RayEngineError(
            f"the Ray cluster has {gpus:g} GPU(s) for {num_workers} workers (one each): ask for --num-workers "
            f"{int(gpus)}, or train on the CPUs with trainer.cpu=true"
        )
    run: dict[str, Any] = {"name": "ray", "storage_path": str(out)}  # Ray's own records: OUTPUT_DIR/ray
    run["failure_config"] = FailureConfig(max_failures=max_failures)
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    if "worker_runtime_env" in fields:  # Ray Train v2 (the default from Ray 2.51)
        # sss prints its own lines: Ray's print patch would show each twice, its INFO lines every report
        run["worker_runtime_env"] = {"env_vars": {**env, "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}}
        from ray.train import LoggingConfig

        from sss.run._ray_refusal import StopOnRefusal

        run["logging_config"] = LoggingConfig(log_level="WARNING")
        callbacks = [StopOnRefusal(), *callbacks]  # sss's own errors end the run: FailureConfig retries the rest
    if callbacks:
        run["callbacks"] = callbacks
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"cfg": cfg, "cwd": os.getcwd(), "every_n_steps": cfg.trainer.log.every_n_steps},
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu),
        run_config=RunConfig(**run),
    )
    print(f"sss: Ray Train: {num_workers} worker(s) ({'GPU' if use_gpu else 'CPU'}) -> {out}", flush=True)
    try:
        trainer.fit()
    except Exception as exc:
        refusal = getattr(exc, "controller_failure", None)  # what StopOnRefusal raised in Ray's controller
        if getattr(refusal, "sss_refusal", False):
            raise refusal from None
        if not type(exc).__module__.startswith("ray."):
            raise
        why = " ".join(str(exc).split())[:2000]
        limit = "without limit" if max_failures < 0 else f"{max_failures} restart(s)"
        raise RayEngineError(
            f"sss fit --engine ray: the workers failed ({limit} allowed, --max-failures): {why}. The checkpoints "
            f"in {out / 'checkpoints'} are kept: the same command with --resume auto continues from the newest"
        ) from None
    results = out / "results.json"
    return json.loads(results.read_text()) if results.is_file() else {}


def _worker(config: dict[str, Any]) -> None:
    # One Ray Train worker: `sss fit`'s own path with --resume auto, in the driver's working directory when this
    # machine has it (Ray starts workers in a folder of its own), which is importable as under `sss fit`.
    from sss.run.fit import run_fit

    cwd = config["cwd"]
    if os.path.isdir(cwd):
        os.chdir(cwd)
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
    if os.environ.get("RANK") == "0":
        _wait_for_the_last_group(Path(config["cfg"].trainer.output_dir))
    from sss.config import ConfigError
    from sss.data import DataError
    from sss.run._ray_refusal import quiet_refusals

    # sss's own errors fail the same way on every restart: WorkerRefusal tells Ray's controller not to retry.
    quiet_refusals()  # the driver prints the refusal's one line; Ray would log its traceback here too
    try:
        run_fit(config["cfg"], resume="auto", callbacks=[RayReport(config["every_n_steps"])])
    except RunFolderError as exc:  # a refusal of the folder (a finished run): the same on every restart
        raise WorkerRefusal(str(exc), exc.exit_code) from None
    except (ConfigError, DataError) as exc:
        raise WorkerRefusal(" ".join(str(exc).split()), exc.exit_code) from None


def _wait_for_the_last_group(out: Path, seconds: float = 60) -> None:
    # Ray may start the next worker group while the processes of the last one are still ending; the last
    # rank 0 holds OUTPUT_DIR's lock until it has (the kernel drops it then, kill -9 too). Wait for that
    # holder, a Ray worker process, rather than refuse the folder; any other holder is refused by run_fit.
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        holder = folder_holder(out)
        if holder is None or "default_worker.py" not in str(holder.get("command", "")):
            return
        time.sleep(0.1)
