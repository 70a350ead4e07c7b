"""Process-level plumbing for launched runs: a clean exit of the process group, rank-tagged output."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import warnings
from datetime import timedelta
from types import TracebackType
from typing import Any

import torch.distributed as dist

from sss.warnings import use_short_format

__all__ = ["destroy_group_at_exit", "mark_failed", "tag_warnings_with_rank"]

_registered = False
_tagged = False
_failed = False  # set by the excepthook and `mark_failed`: a failing process does not wait for its peers at exit


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


def mark_failed() -> None:
    """Say that this process ends with an error: at exit it leaves the process group without waiting for its peers.

    ``sss``'s ``main()`` calls it for an error it reports as one line (no uncaught exception reaches the
    excepthook then): a peer still training would never reach the exit barrier, and the wait took 60 s
    before the peers learnt of the failure.

    Example:
        >>> mark_failed()  # the exit handler of `destroy_group_at_exit` skips its barrier (none without a group)
    """
    global _failed
    _failed = True


def _destroy() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        return
    if not _failed:
        # Wait for the others first: a process that tears its connections down while another is
        # still finishing (saving, printing) made that one abort (2 of 18 two-node runs).
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=60))
            else:
                dist.barrier()
        except Exception:  # a peer that already failed: exit anyway
            pass
    dist.destroy_process_group()


def tag_warnings_with_rank() -> None:
    """In a process of a launched group, say which rank a warning, log record or crash came from.

    N processes write to one terminal, so an untagged warning shows up N times or once with no
    way to tell whose it is. Non-main processes prefix ``warnings`` messages and ``logging``
    records with ``[rank N] ``; the main process (rank 0) keeps its output as it is. On every
    process, sss's own advice (`sss.warnings.SSSWarning`) prints as one line ``sss: warning: ...``
    (`sss.warnings.use_short_format`), without a file path or source line. An uncaught
    exception's traceback starts with a ``[rank N]`` line on every rank, rank 0 included, since
    tracebacks of several ranks interleave. Reads ``RANK`` and ``WORLD_SIZE`` (set by torchrun,
    ``accelerate launch`` and ``notebook_launcher``); a single process is otherwise left alone. Calling it
    again changes nothing.

    Example:
        >>> tag_warnings_with_rank()  # one process (no WORLD_SIZE > 1): nothing to tag
    """
    global _tagged
    use_short_format()  # sss's own advice as one line; below, the rank tag goes in front of it too
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if _tagged or world <= 1:
        return
    _tagged = True
    sys.excepthook = _RankExcepthook(rank, world, sys.excepthook)
    if rank == 0:
        return
    prefix = f"[rank {rank}] "
    format_warning = warnings.formatwarning

    def tagged_warning(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
    ) -> str:
        return prefix + format_warning(message, category, filename, lineno, line)

    tagged_warning.sss_short = getattr(format_warning, "sss_short", False)  # type: ignore[attr-defined]

    # `formatwarning` (not `showwarning`) so that pytest, IPython and logging.captureWarnings, which
    # replace `showwarning`, still print the tag; the records of catch_warnings(record=True) stay untouched.
    warnings.formatwarning = tagged_warning
    make_record = logging.getLogRecordFactory()

    def tagged_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        if record.name != "py.warnings":  # captured warnings already carry the tag from formatwarning
            record.msg = prefix + str(record.msg)
        return record

    logging.setLogRecordFactory(tagged_record)


class _RankExcepthook:
    """``sys.excepthook`` that heads the traceback with the rank, then hands over to the previous hook."""

    def __init__(self, rank: int, world: int, previous: Any) -> None:
        self.rank, self.world, self.previous = rank, world, previous

    def __call__(self, kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        global _failed
        _failed = True
        print(f"[rank {self.rank}] uncaught {kind.__name__} in rank {self.rank} of {self.world}:", file=sys.stderr)
        self.previous(kind, value, tb)
