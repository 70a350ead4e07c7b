"""Every ```python block in docs/ runs (in a scratch folder that can see examples/)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
BLOCKS = [
    pytest.param(path, i, code, id=f"{path.name}-{i}")
    for path in sorted((ROOT / "docs").glob("*.md"))
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S))
]


@pytest.mark.slow
@pytest.mark.parametrize(("path", "index", "code"), BLOCKS)
def test_doc_example_runs(path, index, code, tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, f"{path.name} block {index} failed:\n{done.stderr[-4000:]}"


def test_readme_has_exactly_the_two_setup_commands():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    assert commands[0].strip().endswith("sss fit examples/industrial.yaml")
    assert commands[1].strip().endswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[dev]'" in ci and "python -m pytest" in ci
