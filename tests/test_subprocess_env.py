"""Child processes of the tests run the checkout under test, and the CLI pins MKL's floating-point path itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sss.testing import subprocess_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"
WHERE = "import sss, fit_pause; print(sss.__file__); print(fit_pause.__file__)"


def _files(env: dict[str, str] | None, cwd: Path) -> list[Path]:
    done = subprocess.run([sys.executable, "-c", WHERE], cwd=cwd, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return [Path(line).resolve() for line in done.stdout.split()]


def test_a_child_started_with_subprocess_env_imports_the_checkout_and_the_scripts(tmp_path):
    # With PYTHONPATH=tests/scripts alone a child imports the installed sss: the tests of resume_resize and
    # SIGUSR1 passed with those features broken in the checkout.
    sss_file, script = _files(subprocess_env(SCRIPTS), tmp_path)
    assert sss_file == ROOT / "sss" / "__init__.py"
    assert script == SCRIPTS / "fit_pause.py"


def test_a_child_that_inherits_the_environment_imports_the_checkout(tmp_path):
    # tests/conftest.py puts the checkout on this process's PYTHONPATH for every child that inherits it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.environ["PYTHONPATH"], str(SCRIPTS)])}
    assert _files(env, tmp_path)[0] == ROOT / "sss" / "__init__.py"


# The console script's steps (`from sss.cli import main; sys.exit(main())`), recording MKL_CBWR at the moment
# torch is first imported: MKL reads it when torch loads, so a later setting changes nothing.
CONSOLE = """
import os, sys
seen = []
def hook(event, args):
    if event == "import" and args[0] == "torch":
        seen.append(os.environ.get("MKL_CBWR"))
sys.addaudithook(hook)
sys.argv = ["sss", "check", sys.argv[1]]
from sss.cli import main
code = main()
print("MKL_CBWR when torch loaded:", seen)
sys.exit(code)
"""


def test_the_cli_sets_mkl_cbwr_before_torch_loads(tmp_path):
    # tests/conftest.py sets MKL_CBWR for the test process, so only a child without it sees the CLI's own setting
    env = subprocess_env()
    env.pop("MKL_CBWR", None)
    example = str(ROOT / "examples" / "industrial.yaml")
    command = [sys.executable, "-c", CONSOLE, example]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MKL_CBWR when torch loaded: ['AUTO,STRICT']" in done.stdout, done.stdout
