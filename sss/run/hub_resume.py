"""``sss fit --resume hub://OWNER/REPO[@REVISION]``: fetch the checkpoint `HubPush` pushed, resume it as a local one.

`HubPush` (``strategy="every_save"``) commits each checkpoint to ``last-checkpoint/`` of the repo, so
the branch's head holds the newest one and the repo's history every one (a commit hash as REVISION
picks an older one). The main process downloads ``last-checkpoint/`` with ``huggingface_hub``
(the endpoint ``HF_ENDPOINT``, the token ``HF_TOKEN`` or ``hf auth login``) into
``OUTPUT_DIR/checkpoints/hub-<REVISION or main>/``, never over an existing folder, and verifies it
against its marker (sizes and CRC32s) before anything is built; the resume then refuses what a
local one refuses (a changed config, another process count, pickles that would run code).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from sss.checkpoint import MARKER, DamagedCheckpointError, verify_checkpoint
from sss.errors import HubResumeError

__all__ = ["HUB", "fetch_checkpoint", "hub_source"]

HUB = "hub://"
"""The prefix of a Hub resume: ``hub://OWNER/REPO[@REVISION]``."""
_FOLDER = "last-checkpoint"  # where HubPush puts each checkpoint in the repo


def hub_source(resume: str | None) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` of a ``hub://OWNER/REPO[@REVISION]`` resume (revision None: main); None for others.

    Example:
        >>> hub_source("hub://me/hunter@v1"), hub_source("hub://me/hunter"), hub_source("latest")
        (('me/hunter', 'v1'), ('me/hunter', None), None)
    """
    if resume is None or not resume.startswith(HUB):
        return None
    repo, _, revision = resume[len(HUB) :].partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")) or (not revision and "@" in resume):
        raise HubResumeError(
            f"--resume {resume}: not a Hub checkpoint address; write hub://OWNER/REPO or hub://OWNER/REPO@REVISION "
            "(a branch, tag or commit of the repo HubPush pushed to)"
        )
    return repo, revision or None


def fetch_checkpoint(resume: str, out: Path, state: Any) -> Path:
    """Download and verify the checkpoint of the Hub resume `resume` into ``out/checkpoints``; its folder.

    The main process downloads; every process gets its folder or raises its error
    (`HubResumeError`, or `DamagedCheckpointError` for a download that does not match its marker).

    Example:
        >>> from types import SimpleNamespace
        >>> one_process = SimpleNamespace(is_main_process=True, num_processes=1)
        >>> fetch_checkpoint("hub://hunter@v1", Path("runs/x"), one_process)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        sss.errors.HubResumeError: --resume hub://hunter@v1: not a Hub checkpoint address; write hub://OWNER/REPO ...
    """
    outcome: list[Any] = [None, f"--resume {resume}: the main process did not download it", "HubResumeError"]
    if state.is_main_process:
        try:
            outcome = [str(_download(resume, out / "checkpoints")), None, None]
        except (HubResumeError, DamagedCheckpointError) as exc:
            outcome = [None, str(exc), type(exc).__name__]
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(outcome)
    if outcome[1] is not None:
        raise (DamagedCheckpointError if outcome[2] == "DamagedCheckpointError" else HubResumeError)(outcome[1])
    return Path(outcome[0])


def _download(resume: str, checkpoints: Path) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    repo, revision = hub_source(resume)
    target = checkpoints / f"hub-{(revision or 'main').replace('/', '-')}"
    if target.exists():
        raise HubResumeError(
            f"--resume {resume}: {target} already exists (an earlier download?) and is never downloaded over: "
            f"resume it as it is (--resume {target}), or move it away to download {repo} again"
        )
    # HF_ENDPOINT as huggingface_hub reads it, but now: it reads it once, when first imported
    endpoint = os.environ.get("HF_ENDPOINT", "").rstrip("/") or constants.ENDPOINT
    where = f"{repo}{'@' + revision if revision else ''} on {endpoint}"
    if constants.HF_HUB_OFFLINE:
        raise HubResumeError(f"--resume {resume}: HF_HUB_OFFLINE is set, so {where} cannot be read; unset it")
    staging = checkpoints / f".{target.name}.download"  # our own leftover of an interrupted download, if any
    shutil.rmtree(staging, ignore_errors=True)
    try:
        snapshot_download(
            repo,
            revision=revision,
            allow_patterns=[f"{_FOLDER}/*"],
            local_dir=staging,
            cache_dir=staging / ".cache",  # the user's Hub cache keeps no copy of the checkpoint
            endpoint=endpoint,
        )
        if not (staging / _FOLDER / MARKER).is_file():
            raise HubResumeError(
                f"--resume {resume}: {where} holds no {_FOLDER}/ with a checkpoint: push checkpoints there with "
                f"HubPush(repo_id={repo!r}, strategy='every_save'), or name the revision that has one (@REVISION)"
            )
        (staging / _FOLDER).rename(target)
    except RevisionNotFoundError:
        raise HubResumeError(
            f"--resume {resume}: {repo} on {endpoint} has no revision {revision!r}: name a branch, tag or commit "
            f"of it (hub://{repo}@REVISION), or leave @REVISION out for main"
        ) from None
    except RepositoryNotFoundError:
        raise HubResumeError(
            f"--resume {resume}: {endpoint} has no repo {repo} that this token may read: check the name, and set "
            "HF_TOKEN (or run `hf auth login`) for a private repo"
        ) from None
    except HubResumeError:
        raise
    except Exception as exc:  # no network, a refused connection, the Hub down: huggingface_hub's errors vary
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise HubResumeError(
            f"--resume {resume}: cannot download {where} ({type(exc).__name__}: {reason}); check the network "
            "and HF_ENDPOINT, then run the same command again"
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _verified_download(resume, target, where, repo)


def _verified_download(resume: str, target: Path, where: str, repo: str) -> Path:
    # The downloaded checkpoint checked against its marker; a damaged one stays where it is, named.
    try:
        meta = verify_checkpoint(target)
    except DamagedCheckpointError as exc:
        raise DamagedCheckpointError(
            f"--resume {resume}: the download of {where} does not match its marker: {exc}. The download stays in "
            f"{target}: move it away and run the same command again, or resume another revision "
            f"(hub://{repo}@REVISION)"
        ) from None
    print(f"sss: --resume {resume}: downloaded step {meta['global_step']} of {where} to {target}", flush=True)
    return target
