"""Bounds for ``typing.Annotated`` argument types, which ``sss check`` reads off a ``_target_``'s signature.

A constructor states what it accepts in its signature, and `sss.config.check_config` refuses a
value outside it before anything is built or read::

    def __init__(self, batch_size: PositiveInt = 32, on_error: Literal["raise", "skip"] = "raise"): ...

``data.batch_size=0`` then fails in ``sss check`` (and at the start of ``sss fit``) with
``data.batch_size: must be >= 1, got 0``, not after the data was set up. The markers follow the
names of the ``annotated-types`` package (`Ge`, `Gt`, `Le`, `Lt`) without depending on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

__all__ = ["Bound", "Ge", "Gt", "Le", "Lt", "NonNegativeInt", "PositiveFloat", "PositiveInt", "UnitFloat"]


@dataclass(frozen=True)
class Bound:
    """A comparison a number must pass; `problem` says why a value fails it (None when it passes).

    Example:
        >>> Ge(1).problem(0), Ge(1).problem(3)
        ('must be >= 1', None)
        >>> Le(10, "ten at most").problem(11)
        'must be <= 10 (ten at most)'
    """

    bound: float
    note: str = ""
    """Why the bound is there, shown after it: ``must be <= 4096 (a side of 4096 pixels is ...)``."""
    symbol = "?"

    def passes(self, value: Any) -> bool:
        """Whether `value` passes the comparison."""
        raise NotImplementedError

    def problem(self, value: Any) -> str | None:
        """``"must be >= 1"`` when `value` fails, else None."""
        if self.passes(value):
            return None
        return f"must be {self.symbol} {self.bound!r}" + (f" ({self.note})" if self.note else "")


class Ge(Bound):
    """``value >= bound``."""

    symbol = ">="

    def passes(self, value: Any) -> bool:
        return value >= self.bound


class Gt(Bound):
    """``value > bound``."""

    symbol = ">"

    def passes(self, value: Any) -> bool:
        return value > self.bound


class Le(Bound):
    """``value <= bound``."""

    symbol = "<="

    def passes(self, value: Any) -> bool:
        return value <= self.bound


class Lt(Bound):
    """``value < bound``."""

    symbol = "<"

    def passes(self, value: Any) -> bool:
        return value < self.bound


PositiveInt = Annotated[int, Ge(1)]
"""A count that 0 cannot be: a batch size, a sample count, a side in pixels."""
NonNegativeInt = Annotated[int, Ge(0)]
"""A count where 0 means none (worker processes), or a seed."""
PositiveFloat = Annotated[float, Gt(0)]
"""A length, a rate or a learning rate."""
UnitFloat = Annotated[float, Ge(0), Le(1)]
"""A ratio between 0 and 1."""
