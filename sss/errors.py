"""`SSSError`: the base of the errors that sss raises for the user to fix, each with its exit code.

A config problem (`sss.config.ConfigError`), a bad input file (`sss.data.DataError`), a failed
Hub push after a finished run (`HubPushError`), a checkpoint a Hub resume cannot fetch
(`HubResumeError`) or a run folder that cannot be used as asked (`RunFolderError`) subclasses
`SSSError`, so the ``sss`` command
prints its message as one ``error:`` line and exits with `SSSError.exit_code` instead of
showing a traceback (``sss --traceback ...`` or ``SSS_DEBUG=1`` shows it).

This module imports nothing, so every layer of sss may use it.
"""

from __future__ import annotations

__all__ = ["HubPushError", "HubResumeError", "RunFolderError", "SSSError"]


class SSSError(Exception):
    """A problem the user can fix; the message names the file, the config key or the folder, and the fix.

    Example:
        >>> class OutOfTea(SSSError):
        ...     exit_code = 3
        >>> OutOfTea("kitchen: no tea left; buy some").exit_code, SSSError("x").exit_code
        (3, 1)
    """

    exit_code: int = 1
    """What ``sss`` exits with: 2 for configuration problems, 1 for problems found while running."""


class HubPushError(SSSError):
    """The run finished and its results are written, but pushing to the Hugging Face Hub failed.

    The message names the folders still on disk and the ``hf upload`` command that pushes them.

    Example:
        >>> str(HubPushError("HubPush: 1 push(es) to me/model failed: ..."))
        'HubPush: 1 push(es) to me/model failed: ...'
    """


class HubResumeError(SSSError):
    """``--resume hub://OWNER/REPO[@REVISION]`` found no checkpoint to download: no such repo or revision,
    no ``last-checkpoint/`` in it, the Hub out of reach, or the download folder already there.

    The message names the repo and what to do.

    Example:
        >>> HubResumeError("--resume hub://me/model: ...").exit_code
        1
    """


class RunFolderError(SSSError):
    """The run folder cannot be used as asked: ``--resume`` finds nothing to continue, a finished run, or a
    damaged checkpoint given by path; nothing was trained and no file was changed.

    Raised by `sss.run.folder` (and so by `sss.run.fit.run_fit`) instead of ending the process: ``sss fit``
    prints it as one ``error:`` line and exits with 1, a Python caller catches it.

    Example:
        >>> RunFolderError("--resume: no complete checkpoint in runs/x/checkpoints").exit_code
        1
    """
