"""`sss fit CONFIG --debug` wall time against the [scale] budget (30 s), in a fresh process like a user's.

    python benchmarks/debug.py                       # examples/industrial.yaml, data cache as it is
    python benchmarks/debug.py --empty-cache         # the dataset is generated first, as on a first run

Prints the wall time of the whole command (imports, data, model, 2+2 batches, export) and its
ratio to the budget; run it from any folder (the debug run goes to a temporary one).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_SECONDS = 30.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(Path(__file__).parents[1] / "examples" / "industrial.yaml"))
    parser.add_argument("--empty-cache", action="store_true", help="generate the dataset into a fresh cache")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ)
        if args.empty_cache:
            env["SSS_CACHE"] = str(Path(scratch) / "cache")
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "sss", "fit", args.config, "--debug"], cwd=scratch, env=env, capture_output=True
        )
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"sss fit --debug failed:\n{done.stderr.decode()[-3000:]}")
    cache = "empty cache" if args.empty_cache else "cache as it is"
    print(f"sss fit {Path(args.config).name} --debug ({cache}): {seconds:.1f} s wall")
    verdict = "met" if seconds < BUDGET_SECONDS else "NOT met"
    print(f"budget {BUDGET_SECONDS:.0f} s: ratio {seconds / BUDGET_SECONDS:.2f} ({verdict})")


if __name__ == "__main__":
    main()
