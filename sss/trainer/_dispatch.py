"""The event dispatch table of `SSSTrainer._fire`: only the callbacks that override an event's method run for it."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from sss.callbacks.base import Callback, Event

__all__ = ["DispatchTable"]


class DispatchTable:
    """For each `Event`, the bound methods of the callbacks whose class (or instance) overrides that event's method.

    A `Callback` subclass that leaves a method as `Callback`'s no-op costs nothing for that event;
    an object that is not a `Callback` gets every event method it has. The table is a snapshot of
    the list it was built from: `current` says whether it still describes a list, and
    ``SSSTrainer._fire`` builds a new one when it does not (callbacks appended before ``fit``,
    or between ``fit`` and ``validate``). Order within an event is the list's order.

    Example:
        >>> class OnEnd(Callback):
        ...     def on_fit_end(self, trainer, module):
        ...         print("end")
        >>> callbacks = [Callback(), OnEnd()]
        >>> table = DispatchTable(callbacks)
        >>> len(table.methods[Event.FIT_END]), len(table.methods[Event.BATCH_END]), table.current(callbacks)
        (1, 0, True)
        >>> callbacks.append(OnEnd()); table.current(callbacks)
        False
    """

    def __init__(self, callbacks: Sequence[Any]) -> None:
        self.callbacks = list(callbacks)
        self.methods: dict[Event, list[Callable[..., Any]]] = {
            event: [getattr(c, event.value) for c in self.callbacks if _overrides(c, event.value)] for event in Event
        }

    def current(self, callbacks: Sequence[Any]) -> bool:
        """Whether `callbacks` holds the same objects, in the same order, as the list this table was built from."""
        # Identity, not ==: a dataclass callback equal to the one it replaced is still another object.
        return len(self.callbacks) == len(callbacks) and all(map(operator.is_, self.callbacks, callbacks))


def _overrides(callback: Any, name: str) -> bool:
    if not isinstance(callback, Callback):
        return hasattr(callback, name)  # duck-typed: whatever it has
    if name in getattr(callback, "__dict__", {}):
        return True  # set on the instance
    return getattr(type(callback), name) is not getattr(Callback, name)


EMPTY = DispatchTable(())
"""The table of an empty list: what `_fire` starts from before the first event."""
