"""Behaviour unchanged, measured: train the same config with an earlier commit and with this tree, compare weights.

A refactoring that claims "no behaviour change" must export bitwise-equal weights. This script
checks the reference commit out into a temporary folder (``git worktree``), runs ``sss fit`` with
each tree in a fresh process (same config, same data cache, MKL pinned), and compares every
tensor of the two exported ``model.safetensors``. It prints one line per run and the verdict;
the exit code is 0 only when every tensor is equal.

    python benchmarks/bitwise.py --ref 58a84c3                       # the default config
    python benchmarks/bitwise.py --ref HEAD~3 trainer.max_steps=40   # overrides for both runs
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fit(tree: Path, out: Path, config: str, overrides: list[str], env: dict[str, str]) -> float:
    # PYTHONPATH puts the tree's own `sss` ahead of the editable install of this checkout.
    cmd = [sys.executable, "-m", "sss", "fit", config, f"trainer.output_dir={out}", *overrides]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=tree, env={**env, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"sss fit failed in {tree} (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    used = subprocess.run(
        [sys.executable, "-c", "import sss; print(sss.__file__)"],
        cwd=tree,
        env={**env, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not used.startswith(str(tree)):
        sys.exit(f"the run in {tree} imported sss from {used}: the comparison would be meaningless")
    return time.perf_counter() - start


def _compare(a: Path, b: Path) -> tuple[int, list[str]]:
    from safetensors.torch import load_file

    left, right = load_file(str(a)), load_file(str(b))
    problems = [f"only in one: {k}" for k in sorted(set(left) ^ set(right))]
    for key in sorted(set(left) & set(right)):
        x, y = left[key], right[key]
        if x.shape != y.shape or x.dtype != y.dtype:
            problems.append(f"{key}: {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}")
        elif not bool((x == y).all()):
            problems.append(f"{key}: max abs diff {float((x.double() - y.double()).abs().max()):.3g}")
    return len(left), problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", required=True, help="the commit to compare with (e.g. the last one before a refactor)")
    parser.add_argument("--config", default="examples/industrial.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for both runs")
    args = parser.parse_args()
    env = {**os.environ, "MKL_CBWR": "AUTO,STRICT"}
    env.setdefault("SSS_CACHE", str(Path.home() / ".cache" / "sss"))  # one generated dataset for both runs
    with tempfile.TemporaryDirectory(prefix="sss-bitwise-") as tmp:
        ref_tree = Path(tmp) / "ref"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(ref_tree), args.ref], check=True)
        try:
            sha = subprocess.run(
                ["git", "-C", str(ref_tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            seconds_ref = _fit(ref_tree, Path(tmp) / "run_ref", args.config, args.overrides, env)
            print(f"reference {args.ref} ({sha}): sss fit {args.config} in {seconds_ref:.1f} s")
            seconds_now = _fit(ROOT, Path(tmp) / "run_now", args.config, args.overrides, env)
            print(f"this tree ({ROOT}): sss fit {args.config} in {seconds_now:.1f} s")
            count, problems = _compare(
                Path(tmp) / "run_ref" / "model" / "model.safetensors",
                Path(tmp) / "run_now" / "model" / "model.safetensors",
            )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref_tree)], check=False)
    if problems:
        print(f"DIFFERENT: {len(problems)} of {count} tensors differ:\n  " + "\n  ".join(problems[:20]))
        return 1
    print(f"bitwise equal: all {count} tensors of model.safetensors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
