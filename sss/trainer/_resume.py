"""What `SSSTrainer.load_checkpoint` decides before and while it restores: may this run resume that
checkpoint, and where in the epoch a resume on another process count (``trainer.resume_resize``) starts;
and what `SSSTrainer.save_checkpoint` records in the marker for it (`marker_meta`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accelerate import Accelerator

from sss import checkpoint as ckpt_io
from sss.config import ConfigError, TrainerConfig
from sss.trainer.state import TrainState

__all__ = ["check_resumable", "marker_meta", "restore_rng_and_position", "stream_of"]


def stream_of(loader: Any) -> Any:
    """The `sss.data.stream.StreamDataset` a (prepared) training loader reads, or None for any other loader.

    Example:
        >>> stream_of([1, 2]) is None
        True
    """
    dataset = getattr(loader, "dataset", None)
    return dataset if hasattr(dataset, "check_resume") else None


def check_resumable(
    path: Path, meta: dict[str, Any], config: TrainerConfig, procs: int, record: dict, stream: Any = None
) -> None:
    """Refuse a checkpoint this run cannot continue: another process count (unless resized), or changed math.

    A training stream (`stream`) must be read by the same plan (shards, seed, workers, processes) the checkpoint
    recorded, or its position would not be the saved one (`sss.data.stream.StreamDataset.check_resume`).

    Example:
        >>> meta = {"num_processes": 2, "config": {}}
        >>> check_resumable(Path("step_4"), meta, TrainerConfig(), 1, {})
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: step_4 was written by 2 process(es) and this run has 1: ...
    """
    saved_procs = meta.get("num_processes", 1)
    if saved_procs != procs and not config.resume_resize:
        raise ConfigError(
            f"{path} was written by {saved_procs} process(es) and this run has {procs}: the data shards and "
            f"RNG streams would differ. Resume with the same count (sss fit ... --num-processes {saved_procs}), "
            f"or set trainer.resume_resize=true to continue on {procs} process(es) (not bitwise equal to an "
            "uninterrupted run)."
        )
    sharded = [key for key in ("fsdp", "deepspeed") if getattr(config, key)]
    if saved_procs != procs and sharded:
        raise ConfigError(
            f"cannot resume {path} on {procs} process(es) with trainer.resume_resize: it was written by "
            f"{saved_procs} under trainer.{sharded[0]}, whose optimizer state is sharded per process and "
            f"cannot be re-split by sss. Resume with the same count (sss fit ... --num-processes {saved_procs})."
        )
    if stream is not None:
        stream.check_resume(meta.get("stream"), meta["resume_epoch"], meta["resume_batch"], procs)
    problems = ckpt_io.config_differences(meta.get("config", {}), record)
    if problems:
        raise ConfigError(
            f"cannot resume {path}: the config changed in fields that change the training math:\n  "
            + "\n  ".join(problems)
            + "\nSet them back to the checkpoint's values, or start a new run (another trainer.output_dir)."
        )


def restore_rng_and_position(path: Path, meta: dict[str, Any], accelerator: Accelerator) -> int:
    """After ``load_state``: check (or, on a new rank of a resized resume, seed) the RNG; the batch to resume at.

    On the saved process count that is the saved batch. On another (``trainer.resume_resize``) it is
    the batch that follows the samples already seen in the epoch (`sss.checkpoint.resized_resume_batch`),
    and ranks without a saved RNG file are seeded from process 0's (`sss.checkpoint.seed_missing_rng`).
    """
    saved_procs, procs, rank = int(meta.get("num_processes", 1)), accelerator.num_processes, accelerator.process_index
    if rank < saved_procs:
        ckpt_io.check_rng_restored(path, rank)
    else:  # nothing to check: a resized resume's new rank had no saved stream to restore
        accelerator.step = ckpt_io.seed_missing_rng(path, rank)
    if saved_procs == procs:
        return meta["resume_batch"]
    if accelerator.is_main_process:
        written, now = (f"{n} process{'es' if n != 1 else ''}" for n in (saved_procs, procs))
        print(
            f"sss: resuming {path.name} written by {written} on {now} (trainer.resume_resize): the data position "
            "is restored by samples seen; the result is not bitwise equal to an uninterrupted run",
            flush=True,
        )
    return ckpt_io.resized_resume_batch(
        meta["resume_batch"], saved_procs, procs, split_batches=accelerator.split_batches
    )


def marker_meta(
    state: TrainState,
    position: tuple[int, int],
    callbacks: list[dict[str, Any]],
    num_processes: int,
    config: dict[str, Any],
    resized: list[dict[str, int]],
    finetune: dict[str, Any] | None = None,
    stream: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The content of a checkpoint's ``trainer_state.json`` (the manifest is added by `sss.checkpoint.write_marker`).

    `position` is ``(resume_epoch, resume_batch)``: where a resume continues. Every value has the type and range
    the marker schema checks on load (`sss._marker`). `finetune` is the freeze state of ``trainer.finetune``
    (`sss.trainer.finetune.Finetuning.record`; None: nothing frozen), checked against the step on resume.
    `stream` is a training stream's position (`sss.data.stream.StreamDataset.position`), checked on resume.

    Example:
        >>> meta = marker_meta(TrainState(global_step=3), (0, 3), [], 1, {}, [])
        >>> meta["global_step"], meta["resume_batch"], "resized_from" in meta
        (3, 3, False)
    """
    return {
        "global_step": state.global_step,
        "skipped_steps": state.skipped_steps,
        "batch_splits": state.batch_splits,
        "epoch": state.epoch,
        "batch_idx": state.batch_idx,
        "resume_epoch": position[0],
        "resume_batch": position[1],
        "samples": state.samples,
        "metrics": state.metrics,
        "callbacks": callbacks,
        "num_processes": num_processes,
        "config_hash": ckpt_io.config_hash(config),
        "config": config,
        **({"resized_from": resized} if resized else {}),
        **({"finetune": finetune} if finetune else {}),
        **({"stream": stream} if stream else {}),
    }
