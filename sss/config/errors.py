"""`ConfigError`, the one error type of configuration problems."""

from __future__ import annotations

__all__ = ["ConfigError", "require"]


class ConfigError(ValueError):
    """A configuration problem; the message names the file and the YAML key."""


def require(ok: bool, message: str) -> None:
    """Raise `ConfigError` with `message` unless `ok`.

    Example:
        >>> require(True, "never shown")
    """
    if not ok:
        raise ConfigError(message)
