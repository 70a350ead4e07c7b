"""`redact_urls`: the passwords and tokens of URLs taken out of a message before sss prints it.

A tracking server's or a proxy's URL may carry its credentials (``http://user:password@host``,
``https://TOKEN@host``); a message built from such a value (``MLFLOW_TRACKING_URI``, an error that
quotes a URL) would print them to a terminal, a CI log or a bug report. The ``sss`` command's
``error:`` line and sss's warnings pass through `redact_urls`.

This module imports nothing, so every layer of sss may use it.
"""

from __future__ import annotations

import re

__all__ = ["redact_urls"]

# scheme://USERINFO@ where USERINFO runs to the last "@" before the host: a password may hold "@" or ":"
# unescaped; "/", "?", "#" and white space end the authority. One slash too: a URL that went through a
# file path (pathlib keeps one of the two) still carries the password, as "http:/user:password@host".
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*:/{1,2})(?P<userinfo>[^\s/?#]*)@")


def redact_urls(text: str) -> str:
    """`text` with each URL's password replaced by ``***`` (a user name alone, often a token, too).

    Example:
        >>> redact_urls("MLflow at http://alice:s3cret@10.0.0.5:5000 did not answer")
        'MLflow at http://alice:***@10.0.0.5:5000 did not answer'
        >>> redact_urls("https://ghp_TOKEN@github.com/me/repo.git and user@example.com")
        'https://***@github.com/me/repo.git and user@example.com'
        >>> redact_urls("data root http:/user:pw@example.com/x is not a folder")  # a path made of a URL
        'data root http:/user:***@example.com/x is not a folder'
        >>> redact_urls("http://127.0.0.1:5000/api?x=a@b file:/home/me/a@b")
        'http://127.0.0.1:5000/api?x=a@b file:/home/me/a@b'
    """

    def hide(found: re.Match[str]) -> str:
        user, colon, _ = found["userinfo"].partition(":")
        return f"{found['scheme']}{user}:***@" if colon and user else f"{found['scheme']}***@"

    return _USERINFO.sub(hide, text)
