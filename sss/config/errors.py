"""`ConfigError`, the one error type of configuration problems."""

from __future__ import annotations

from sss.errors import SSSError

__all__ = ["ConfigError", "require"]


class ConfigError(ValueError, SSSError):
    """A configuration problem; the message names the file and the YAML key. ``sss`` exits with 2."""

    exit_code = 2


def require(ok: bool, message: str) -> None:
    """Raise `ConfigError` with `message` unless `ok`.

    Example:
        >>> require(True, "never shown")
    """
    if not ok:
        raise ConfigError(message)
