"""A failed rank of a launched run, reported once: its own ``error:`` line and exit code, without the launcher's noise.

``sss fit --num-processes N`` (`sss.run.launch.relaunch`) and ``python -m sss.run.cluster launch`` run Accelerate's
launcher (torchrun) in their own process. A rank that fails prints nothing itself: ``sss``'s ``main()`` writes the
line it would have printed, and its exit code, to ``rank<N>.json`` in the folder named by `ENV` (`record_rank_error`).
When the launcher reports the failure, the launching process prints the line of the rank that failed first, once,
and exits with that rank's code (`choose_line`); a rank ended by a signal without a line of its own (kill -9,
the OOM killer) is named with the signal, the newest checkpoint that verifies and the command that resumes.
torchrun's log lines (``Sending process ... closing signal``, ``failed (exitcode: 1)``) and its ``ChildFailedError``
banner stay hidden; with ``sss --traceback`` or ``SSS_DEBUG=1`` (passed on to the ranks) everything shows as before.

Why files and not the ranks' captured stderr: the ranks keep their terminal, so progress bars and prompt output of a
healthy run are untouched, and the choice of line needs no parsing of mixed output. Why ``logging.disable`` and not
``LOGLEVEL``: torch reads ``LOGLEVEL`` when its modules are imported (possibly before this runs) and the ranks would
inherit it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ENV", "Rerun", "choose_line", "launch_ranks", "read_records", "record_rank_error"]

ENV = "SSS_RANK_ERRORS"
"""The folder where each rank of a run that sss launched writes its error line (set by the launching process)."""

# What a rank sees when another one failed first: a consequence, never the cause.
_PEER_LOST = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|remote worker crash|failed to pass monitoredBarrier|"
    r"NCCL communicator was aborted|lost the master's store|ProcessGroup.*(abort|shut ?down)",
    re.IGNORECASE,
)
_HANDLED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torchrun's agent takes these over and keeps them


@dataclass(frozen=True)
class Rerun:
    """How a launched ``sss fit`` continues after a rank was lost: its output folder and the resuming command.

    Example:
        >>> Rerun.of("runs/x", ["fit", "x.yaml", "--num-processes", "2"]).command
        ['sss', 'fit', 'x.yaml', '--num-processes', '2', '--resume']
        >>> Rerun.of("runs/x", ["fit", "x.yaml", "--resume", "auto"]).command[-2:]  # resumes already
        ['--resume', 'auto']
    """

    output_dir: str | None
    command: list[str] | None

    @classmethod
    def of(cls, output_dir: str | None, argv: list[str]) -> Rerun:
        """The rerun of ``sss ARGV`` (the user's words) with ``--resume`` added where it has none."""
        words = ["sss", *argv]
        if not any(word == "--resume" or word.startswith("--resume=") for word in words):
            words.append("--resume")
        return cls(output_dir, words)


def record_rank_error(line: str, code: int, exc: BaseException | None = None, output_dir: str | None = None) -> bool:
    """Note that this process failed with `line` and `code`; True when sss launched it and its launcher prints the line.

    A failed rank does not wait for its peers at exit (`sss.trainer._processes`' exit barrier: a peer still
    training would never come, and the wait took 60 s). In a rank started by `launch_ranks` (`ENV` set) the line
    goes to ``rank<RANK>.json`` for the launcher instead of the terminal, where N ranks would print it N times.

    Example:
        >>> record_rank_error("error: x", 1)  # not launched by sss: the caller prints the line itself
        False
    """
    stopped = sys.modules.get("sss.callbacks.checkpoint")
    clean_stop = stopped is not None and isinstance(exc, stopped.Preempted)  # all ranks saved: the barrier is safe
    processes = sys.modules.get("sss.trainer._processes")  # loaded where a trainer ran; importing it loads torch
    if processes is not None and not clean_stop:
        processes.mark_failed()
    folder = os.environ.get(ENV)
    if not folder or not Path(folder).is_dir():
        return False
    rank = int(os.environ.get("RANK") or 0)
    record = {"rank": rank, "line": line, "code": code, "time": time.time(), "peer": _peer_lost(exc)}
    record["output_dir"] = output_dir
    tmp = Path(folder) / f".rank{rank}.json.tmp"
    try:
        tmp.write_text(json.dumps(record), encoding="utf-8")
        tmp.replace(Path(folder) / f"rank{rank}.json")  # whole or absent for the launcher
    except OSError:
        return False  # no room for a few bytes: print it here after all
    return True


def _peer_lost(exc: BaseException | None) -> bool:
    dist = sys.modules.get("torch.distributed")
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        if dist is not None and isinstance(exc, getattr(dist, "DistError", ())):
            return True
        if _PEER_LOST.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def read_records(folder: Path) -> dict[int, dict[str, Any]]:
    """The records the ranks wrote into `folder`, by rank (unreadable ones left out)."""
    found = {}
    for path in folder.glob("rank*.json"):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text(encoding="utf-8"))
            found[int(record["rank"])] = record
    return found


def choose_line(
    records: dict[int, dict[str, Any]],
    codes: dict[int, int],
    world: int,
    rerun: Rerun | None = None,
    stopped: int | None = None,
) -> tuple[str, int]:
    """The one line to print for a failed launch, and the exit code: the cause, not its echoes on the other ranks.

    `records` are the ranks' own lines (`read_records`), `codes` the launcher's exit code of each failed rank
    (negative: killed by that signal). First the earliest line of a rank's own error (a bad row, a config key,
    a stop after saving); then a rank ended by a signal without a line (kill -9, the OOM killer), with the
    newest checkpoint that verifies and the command that resumes; then a lost-peer error; then a bare exit code.
    `stopped` is the launcher's own exit code when a signal to it (Ctrl-C, scancel) stopped the ranks.

    Example:
        >>> own = {"rank": 1, "line": "error: train.csv, line 3: ...", "code": 1, "time": 2.0, "peer": False}
        >>> echo = {"rank": 0, "line": "error: Connection closed by peer", "code": 1, "time": 3.0, "peer": True}
        >>> choose_line({0: echo, 1: own}, {0: 1, 1: 1}, world=2)
        ('error: train.csv, line 3: ...', 1)
        >>> choose_line({0: echo}, {1: -9}, world=2)[1]
        137
    """
    ordered = sorted(records.values(), key=lambda r: (r.get("time", 0), r["rank"]))
    own = [r for r in ordered if not r.get("peer")]
    if own:
        return str(own[0]["line"]), int(own[0]["code"])
    killed = sorted(rank for rank, code in codes.items() if code < 0 and rank not in records)
    if killed:
        found = next((r["output_dir"] for r in ordered if r.get("output_dir")), None)
        output_dir = found or (rerun.output_dir if rerun else None)
        return _killed(killed[0], -codes[killed[0]], world, output_dir, rerun), 128 - codes[killed[0]]
    if ordered:
        return str(ordered[0]["line"]), int(ordered[0]["code"])
    if stopped is not None and not codes:
        return f"sss: stopped by {_signal_name(stopped - 128)}: the launcher stopped the ranks", stopped
    rank, code = min(codes.items()) if codes else (0, 1)
    code = code if code >= 0 else 128 - code
    return (
        f"error: rank {rank} of {world} exited with code {code} without an error line of its own (its output "
        "above may say why; `sss --traceback ...` shows the launcher's report)",
        code or 1,
    )


def _killed(rank: int, signum: int, world: int, output_dir: str | None, rerun: Rerun | None) -> str:
    head = f"error: rank {rank} of {world} was killed by {_signal_name(signum)} (signal {signum})"
    if rerun is None:
        return f"{head}; run the command again"
    how = f"`{shlex.join(rerun.command)}`" if rerun.command else "the job run again (with --resume auto)"
    if output_dir is None:
        return f"{head}; {how} continues from the newest checkpoint that verifies"
    from sss.checkpoint import newest_verified

    folder = Path(output_dir) / "checkpoints"
    newest, _ = newest_verified(folder)
    if newest is None:
        return f"{head}; {folder} holds no checkpoint that verifies: run the command again to start over"
    return f"{head}; the newest checkpoint that verifies is {newest}: {how} continues from it"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@contextlib.contextmanager
def _quiet_launcher(folder: Path) -> Iterator[None]:
    # The ranks find the folder in their environment (the launcher copies this process's); torchrun's logging in
    # this process is off, and the signal handlers its agent installs (and never restores) are put back.
    before = os.environ.get(ENV)
    handlers = {name: signal.getsignal(getattr(signal, name)) for name in _HANDLED if hasattr(signal, name)}
    disabled = logging.root.manager.disable
    os.environ[ENV] = str(folder)
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(disabled)
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
        for name, handler in handlers.items():
            if handler is not None:
                signal.signal(getattr(signal, name), handler)


def launch_ranks(parsed: Any, debug: bool = False, rerun: Rerun | None = None) -> tuple[int, dict[int, int]]:
    """Run Accelerate's launcher for `parsed` (``launch_command_parser``'s) here; its exit code and the failed ranks'.

    A failure prints `choose_line`'s one line; the failed ranks' codes (negative: killed by that signal) are the
    second value. With `debug` (``--traceback``, ``SSS_DEBUG=1``) the launcher runs as it is, its logs shown, and
    a failure prints its traceback (torchrun's ``ChildFailedError`` banner) instead. Errors of the launcher itself
    (the machines' rendezvous) propagate.
    """
    folder = Path(tempfile.mkdtemp(prefix="sss-ranks-"))
    try:
        with contextlib.nullcontext() if debug else _quiet_launcher(folder):
            codes, stopped, failure = _run(parsed)
        if not codes and not stopped:
            return 0, {}
        if debug:
            if failure is not None:
                traceback.print_exception(failure)
            first = next(iter(codes.values()), stopped or 1)
            return (first if first > 0 else 128 - first), codes
        line, code = choose_line(read_records(folder), codes, int(parsed.num_processes or 1), rerun, stopped)
        print(line, file=sys.stderr, flush=True)
        return code, codes
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(parsed: Any) -> tuple[dict[int, int], int | None, BaseException | None]:
    # The failed ranks' exit codes, the launcher's own code when a signal to it stopped the ranks, the launcher's error.
    from accelerate.commands.launch import launch_command
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        launch_command(parsed)
    except ChildFailedError as exc:  # torchrun: each failed rank, by global rank
        return {int(rank): int(failure.exitcode) for rank, failure in exc.failures.items()}, None, exc
    except subprocess.CalledProcessError as exc:  # one process: Accelerate's plain launcher
        return {0: exc.returncode}, None, exc
    except SystemExit as exc:  # Accelerate's torchrun wrapper, after a signal to the agent: 128 + N
        return {}, exc.code if isinstance(exc.code, int) else 1, None
    except SignalException as exc:  # the same with an Accelerate that lets torchrun's exception through
        return {}, 128 + int(exc.sigval), None
    return {}, None, None
