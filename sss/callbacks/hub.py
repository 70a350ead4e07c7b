"""`HubPush`: push the exported model (and, on request, every checkpoint) to the Hugging Face Hub, losing none."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sss.callbacks.base import Callback
from sss.callbacks.export import export_run_model
from sss.errors import HubPushError

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["HubPush"]


class _PushesFailed(HubPushError, RuntimeError):
    """Pushes that failed at FIT_END: a `HubPushError` (what `sss fit` tells apart), still the RuntimeError it was."""


class HubPush(Callback):
    """Pushes to the Hub repo `repo_id` from a worker thread, on the main process only.

    * At FIT_START it checks the token and the network (``whoami``), creates the repo (and the
      `revision` branch) and fails there with a clear message, before any training.
    * ``strategy="every_save"``: each checkpoint is pushed to ``last-checkpoint/`` in the repo, one
      commit per checkpoint, so the repo's history holds every one and the latest can be resumed.
      The folder is hard-linked aside first, so the checkpoint rotation cannot delete it mid-push.
    * At FIT_END (both strategies) the model folder `model_dir` (default ``OUTPUT_DIR/model``) goes to
      the repo root. If nothing exported it yet, it is exported there first: the full folder
      (weights, ``config.yaml``, model card) when ``OUTPUT_DIR/config.yaml`` exists, as under ``sss fit``,
      else ``model.safetensors`` alone. The weights are the full state dict every process gathers
      with ``accelerator.get_state_dict`` (whole under FSDP / ZeRO-3 too); the main process pushes.
    * Pushes queue up: none is skipped while another runs (unlike transformers#30724). FIT_END waits
      for the queue; failed pushes (after `retries` tries) raise `sss.errors.HubPushError` there (a
      RuntimeError too), naming what to upload by hand.

    The token comes from ``HF_TOKEN`` or ``hf auth login``: there is no token argument, so it can
    never end up in a config, a checkpoint or a log. `endpoint` defaults to ``HF_ENDPOINT``.

    Example:
        >>> push = HubPush("me/hunter", strategy="every_save", private=True)
        >>> push.strategy, push.pushed
        ('every_save', [])
    """

    def __init__(
        self,
        repo_id: str,
        strategy: str = "end",
        private: bool = False,
        revision: str | None = None,
        endpoint: str | None = None,
        model_dir: str | None = None,
        retries: int = 3,
    ) -> None:
        if strategy not in ("end", "every_save"):
            raise ValueError(f"HubPush strategy must be 'end' or 'every_save', got {strategy!r}")
        self.repo_id, self.strategy, self.private, self.revision = repo_id, strategy, private, revision
        self.endpoint, self.model_dir, self.retries = endpoint, model_dir, retries
        self.pushed: list[str] = []
        """Commit messages of the pushes that succeeded, in order."""
        self.errors: list[str] = []
        """Pushes that failed after all retries."""
        self._api: Any = None
        self._queue: queue.Queue[tuple[Path, str, str, bool] | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._reported = 0

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        accelerator = trainer.accelerator
        error = [self._connect() if accelerator.is_main_process else None]
        if accelerator.num_processes > 1:  # every process stops, not only the main one
            from accelerate.utils import broadcast_object_list

            broadcast_object_list(error)
        if error[0]:
            raise RuntimeError(error[0])
        if accelerator.is_main_process and self._worker is None:
            self.pushed, self.errors, self._reported = [], [], 0
            self._worker = threading.Thread(target=self._work, name="sss-hub-push", daemon=True)
            self._worker.start()

    def _connect(self) -> str | None:
        from huggingface_hub import HfApi, constants

        where = f"{self.repo_id} on {self.endpoint or constants.ENDPOINT}"
        if constants.HF_HUB_OFFLINE:
            return f"HubPush: HF_HUB_OFFLINE is set, so nothing can be pushed to {where}; unset it or remove HubPush."
        try:
            self._api = HfApi(endpoint=self.endpoint)
            user = self._api.whoami()
            self._api.create_repo(self.repo_id, private=self.private, exist_ok=True)
            if self.revision:
                self._api.create_branch(self.repo_id, branch=self.revision, exist_ok=True)
        except Exception as exc:  # no token, a rejected token, no network: all end the same way
            reason = (str(exc).strip().splitlines() or [""])[0].rstrip(".")
            return (
                f"HubPush: cannot push to {where}: {type(exc).__name__}: {reason}. Training has not started. "
                "Set HF_TOKEN to a token with write access (or run `hf auth login`), check the network and "
                "HF_ENDPOINT, or remove HubPush from callbacks."
            )
        print(f"sss: HubPush to {where} as {user.get('name', '?')}", flush=True)
        return None

    def on_save_checkpoint(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._worker is None or self.strategy != "every_save" or trainer.state.last_checkpoint is None:
            return
        source = Path(trainer.state.last_checkpoint)
        staged = trainer.output_dir / ".hub_staging" / f"{source.name}-{time.monotonic_ns()}"
        shutil.copytree(source, staged, copy_function=_link_or_copy)
        self._queue.put((staged, "last-checkpoint", f"checkpoint {source.name}", True))
        self._report_errors()

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        accelerator = trainer.accelerator
        folder = Path(self.model_dir) if self.model_dir else trainer.output_dir / "model"
        export = [self._worker is not None and not (folder / "model.safetensors").exists()]
        if accelerator.num_processes > 1:  # the main process decides; all take part in the gather below
            from accelerate.utils import broadcast_object_list

            broadcast_object_list(export)
        if export[0]:  # every process: the gather; the main process writes the folder
            export_run_model(trainer, module, folder, trainer.state.metrics)
        if self._worker is None:
            return
        self._queue.put((folder, ".", f"model after global_step {trainer.state.global_step}", False))
        self._drain()
        with contextlib.suppress(OSError):  # the staging folder, empty unless a push failed
            (trainer.output_dir / ".hub_staging").rmdir()
        if self.errors:
            raise _PushesFailed(
                f"HubPush: {len(self.errors)} push(es) to {self.repo_id} failed: "
                + "; ".join(self.errors)
                + f". The folders are still on disk: `hf upload {self.repo_id} <folder> <path in repo>` pushes them."
            )

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._worker is not None:
            self._drain()  # checkpoints already queued are what a resume needs
            self._report_errors()

    def _drain(self) -> None:
        self._queue.put(None)
        self._worker.join()
        self._worker = None

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            folder, path_in_repo, message, staged = item
            for attempt in range(self.retries):
                try:
                    self._api.upload_folder(
                        repo_id=self.repo_id,
                        folder_path=str(folder),
                        path_in_repo=path_in_repo,
                        revision=self.revision,
                        commit_message=message,
                    )
                    self.pushed.append(message)
                    if staged:
                        shutil.rmtree(folder, ignore_errors=True)
                    break
                except Exception as exc:
                    failure = f"{message} (from {folder}): {type(exc).__name__}: {str(exc).strip()[:300]}"
                    if attempt + 1 < self.retries:
                        time.sleep(min(2**attempt, 30))
            else:
                self.errors.append(failure)  # a staged copy stays on disk: the rotation may have deleted the original

    def _report_errors(self) -> None:
        for failure in self.errors[self._reported :]:
            warnings.warn(f"HubPush: push failed after {self.retries} tries: {failure}", stacklevel=2)
        self._reported = len(self.errors)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # instant and no extra disk; the rotation deleting the original keeps this one
    except OSError:
        shutil.copy2(src, dst)
