"""ProgressBar on a real pseudo-terminal: the bar renders, fits the terminal's width, and validation lines show."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "progress_fit.py"
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")  # colours, cursor moves, titles


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    return {**env, "TERM": "xterm-256color", "OMP_NUM_THREADS": "1"}


def _run_on_terminal(width: int) -> list[str]:
    """The script's terminal output at `width` columns, as the lines a terminal would show, escapes removed."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, width, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT)], stdin=slave, stdout=slave, stderr=subprocess.PIPE, env=_env(), close_fds=True
    )
    os.close(slave)
    chunks = []
    while select.select([master], [], [], 120)[0]:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()[-3000:]
    text = ESCAPES.sub("", b"".join(chunks).decode())
    return re.split(r"\r\n|\r|\n", text)  # each redraw starts with \r


@pytest.mark.slow
@pytest.mark.parametrize("width", [60, 100])
def test_the_bar_renders_on_a_terminal_within_its_width(width):
    lines = _run_on_terminal(width)
    assert max(len(line) for line in lines) <= width, [line for line in lines if len(line) > width]
    bars = [line for line in lines if "━" in line]
    assert bars, lines
    final = [line for line in bars if "16/16" in line]  # 2 epochs x 8 steps, drawn at the end
    assert final and final[-1].startswith("epoch 1 "), bars[-3:]
    info = [line for line in lines if "loss " in line and "samples/s" in line]
    assert info and all(" lr " in line for line in info)
    assert any("grad_share/image" in line for line in info)  # a health figure the monitor published
    shown = [line for line in lines if line.startswith("[val] val/loss ")]  # the stage label is not eaten as markup
    assert len(shown) == 2, lines


@pytest.mark.slow
def test_without_a_terminal_it_prints_plain_lines():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "━" not in done.stdout and "\x1b[" not in done.stdout
    steps = [line.split(" lr ")[0] for line in done.stdout.splitlines() if line.startswith("epoch ")]
    assert [s.split(" loss ")[0] for s in steps] == [
        "epoch 0 step 4/16",
        "epoch 0 step 8/16",
        "epoch 1 step 12/16",
        "epoch 1 step 16/16",
    ]
    assert sum(line.startswith("[val] val/loss ") for line in done.stdout.splitlines()) == 2
