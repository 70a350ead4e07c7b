"""Process-level plumbing for launched runs: a clean exit of the process group."""

from __future__ import annotations

import atexit

import torch.distributed as dist

__all__ = ["destroy_group_at_exit"]

_registered = False


def destroy_group_at_exit() -> None:
    """Destroy the default process group when the interpreter exits, if nobody did before.

    A gloo group left for interpreter teardown aborts the process now and then ("terminate
    called without an active exception", exit -6 under ``accelerate launch``) after the
    training itself succeeded; torch asks for ``destroy_process_group()`` before exit.

    Example:
        >>> destroy_group_at_exit()  # a no-op until a process group exists at exit
    """
    global _registered
    if not _registered:
        atexit.register(_destroy)
        _registered = True


def _destroy() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
