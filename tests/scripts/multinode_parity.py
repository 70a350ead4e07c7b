"""`ddp_parity.py` for tests/trainer/test_multinode.py: the same run, then the ending of `sss fit`.

Across two launchers, a process that left its gloo group to interpreter exit aborted now and then
after training ("terminate called without an active exception", 2 of 18 loopback runs), and the
other launcher then waited minutes for it. `sss fit` (``sss.run.fit.run_fit``) ends with a barrier and
``destroy_process_group()`` on every process (0 aborts in 16 runs); so does this script.
"""

from __future__ import annotations

import sys

from accelerate import PartialState
from ddp_parity import run

if __name__ == "__main__":
    run(int(sys.argv[1]), sys.argv[2])
    state = PartialState()
    state.wait_for_everyone()
    state.destroy_process_group()
