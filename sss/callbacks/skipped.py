"""`SkippedRows`: the data rows left out under ``data.on_error: skip``, summarised and written to ``skipped.csv``."""

from __future__ import annotations

import csv
from typing import TYPE_CHECKING, Any

from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["SkippedRows"]

FIELDS = ("manifest", "row", "file", "reason")


class SkippedRows(Callback):
    """At each epoch end, prints how many data rows were skipped and writes ``OUTPUT_DIR/skipped.csv``.

    Reads ``trainer.datamodule.skipped`` (a list of ``{manifest, row, file, reason}``), gathered
    over processes (each keeps its own log) and deduplicated. A stock callback: it does nothing
    when the datamodule has no ``skipped`` or nothing was skipped.

    Example:
        >>> SkippedRows().written
        0
    """

    def __init__(self) -> None:
        self.written = 0
        """Rows in ``skipped.csv`` after the latest write."""

    def on_epoch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._report(trainer)

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._report(trainer)

    def _report(self, trainer: SSSTrainer) -> None:
        rows = getattr(trainer.datamodule, "skipped", None)
        if rows is None:
            return
        rows = list(rows)
        if trainer.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            rows = gather_object([rows])  # one list per process
            rows = [row for part in rows for row in part]
        unique = sorted(
            {(r["manifest"], int(r["row"])): r for r in rows}.values(), key=lambda r: (r["manifest"], r["row"])
        )
        if not trainer.accelerator.is_main_process or len(unique) == self.written:
            return
        path = trainer.output_dir / "skipped.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(unique)
        first = unique[0]
        print(
            f"sss: {len(unique)} data row(s) skipped so far (data.on_error=skip), listed in {path}; "
            f"first: {first['manifest']}, line {first['row']}: {first['reason']}",
            flush=True,
        )
        self.written = len(unique)

    def state_dict(self) -> dict[str, Any]:
        return {"written": self.written}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.written = int(state.get("written", 0))
