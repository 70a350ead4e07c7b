"""`SSSWarning`, the category of sss's advice, and the one-line format it prints in.

A training-health callback that sees something wrong (a starving modality, a learning rate that
looks too large, a skipped fp16 step) says so with ``warnings.warn(..., SSSWarning)``. Python's
default format would print the file path and the source line of the ``warnings.warn`` call, which
say nothing to the user; `use_short_format` prints these as ``sss: warning: <advice>`` and leaves
every other warning as it was. Filter them like any warning category::

    warnings.filterwarnings("ignore", category=SSSWarning)   # or: python -W ignore::sss.warnings.SSSWarning

A URL's password in a message is printed as ``***`` (`sss._redact.redact_urls`), in sss's warnings and
in every other category's while the short format is in use.

This module imports nothing from sss but `sss._redact` (which imports nothing), so any layer can use it.
"""

from __future__ import annotations

import warnings

from sss._redact import redact_urls

__all__ = ["SSSWarning", "use_short_format"]


class SSSWarning(UserWarning):
    """Advice from sss about a run (training health, missing trackers); a `UserWarning`, so shown by default.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warnings.warn("GradNormMonitor: modality imbalance", SSSWarning)
        >>> caught[0].category.__name__, issubclass(caught[0].category, UserWarning)
        ('SSSWarning', True)
    """


def use_short_format() -> None:
    """Print `SSSWarning` as one line ``sss: warning: <message>``; other warnings keep their format.

    Replaces ``warnings.formatwarning`` (not ``showwarning``, which pytest, IPython and
    ``logging.captureWarnings`` replace) by a function that handles `SSSWarning` and hands every
    other category to the previous one; a URL's password is printed as ``***`` in either.
    ``SSSTrainer`` calls it; calling it again changes nothing.

    Example:
        >>> use_short_format()
        >>> warnings.formatwarning("audio starves", SSSWarning, "/x/grad_norm.py", 29, "warnings.warn(...)")
        'sss: warning: audio starves\\n'
        >>> warnings.formatwarning("other", UserWarning, "x.py", 3, "").startswith("x.py:3: UserWarning: other")
        True
        >>> warnings.formatwarning("no reply from http://me:pw@host", SSSWarning, "x.py", 3, "")
        'sss: warning: no reply from http://me:***@host\\n'
    """
    previous = warnings.formatwarning
    if getattr(previous, "sss_short", False):
        return

    def short(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
    ) -> str:
        if isinstance(category, type) and issubclass(category, SSSWarning):
            return redact_urls(f"sss: warning: {' '.join(str(message).split())}\n")  # one line, whatever it holds
        # A library's warning may quote a URL with its credentials too (a tracking server's, a proxy's).
        return redact_urls(previous(message, category, filename, lineno, line))

    short.sss_short = True  # type: ignore[attr-defined]  # what a wrapper around it copies (the rank tag)
    warnings.formatwarning = short
