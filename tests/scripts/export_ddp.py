"""Run by tests/run/test_fit_export_ddp.py in 2 processes: `sss fit` (`run_fit`) with its export watched.

    python export_ddp.py OUT

Wraps `Accelerator.get_state_dict` to record, on each process, the file of each caller, then runs
`run_fit` on `BoringModule` / `BoringDataModule` with ``trainer.output_dir=OUT``. Each process writes
the callers it saw to ``OUT/calls.<rank>`` (JSON). Under FSDP or ZeRO-3 that gather is a collective:
a process that skipped it would hang the others (not observable on CPUs, where there is no sharding).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from accelerate import Accelerator, PartialState

from sss.config import load_config
from sss.run.fit import run_fit

out = Path(sys.argv[1])
callers: list[str] = []
original = Accelerator.get_state_dict


def recording(self: Accelerator, model: object, unwrap: bool = True) -> dict:
    callers.append(Path(sys._getframe(1).f_code.co_filename).as_posix())
    return original(self, model, unwrap)


Accelerator.get_state_dict = recording  # save_state calls it too: the callers tell the export's call apart
overrides = [
    "name=boring",
    "model._target_=sss.testing.BoringModule",
    "data._target_=sss.testing.BoringDataModule",
    "data.n_train=32",
    "data.n_val=16",
    "trainer.max_steps=4",
    "trainer.cpu=true",
    "trainer.log.progress=false",
    f"trainer.output_dir={out}",
]
run_fit(load_config(None, overrides))
(out / f"calls.{PartialState().process_index}").write_text(json.dumps(callers))
