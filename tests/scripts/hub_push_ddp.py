"""Run by tests/callbacks/test_hub.py in 2 processes: `HubPush(strategy="every_save")` against a local fake Hub.

    python hub_push_ddp.py ENDPOINT OUT

Trains `BoringModule` 4 steps with a checkpoint every 2. Each process writes ``OUT.<rank>`` (JSON):
its global step, its HubPush's successful pushes and errors, its final parameters, and the callers of
its ``Accelerator.get_state_dict`` (the gather every process must enter under FSDP / ZeRO-3).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState

from sss import SSSTrainer
from sss.callbacks import HubPush
from sss.callbacks.stock import add_stock_callbacks
from sss.testing import BoringModule, boring_loader

endpoint, out = sys.argv[1], sys.argv[2]
gathers: list[str] = []
get_state_dict = Accelerator.get_state_dict


def counted_get_state_dict(self, *args, **kwargs):
    caller = sys._getframe(1).f_code  # under DDP no collective: a gather on the main process only would not hang
    gathers.append(f"{Path(caller.co_filename).name}:{caller.co_name}")
    return get_state_dict(self, *args, **kwargs)


Accelerator.get_state_dict = counted_get_state_dict
warnings.simplefilter("ignore")
torch.manual_seed(0)
push = HubPush("tester/boring", strategy="every_save", endpoint=endpoint)
trainer = add_stock_callbacks(
    SSSTrainer(
        callbacks=[push],
        max_steps=4,
        output_dir=out + "_run",
        mixed_precision="no",
        log={"progress": False, "trackers": []},
        checkpoint={"every_n_steps": 2, "every_epoch": False},
        optim={"optimizer": {"_target_": "torch.optim.SGD", "lr": 0.1}},
    )
)
trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=64, batch_size=4))
params = {name: p.detach().tolist() for name, p in trainer.module.state_dict().items()}
result = {"step": trainer.state.global_step, "pushed": push.pushed, "errors": push.errors, "params": params}
result["gathers"] = gathers
with open(f"{out}.{trainer.accelerator.process_index}", "w") as f:
    json.dump(result, f)
state = PartialState()
state.wait_for_everyone()
state.destroy_process_group()
