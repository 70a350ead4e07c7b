"""ProgressBar on a real pseudo-terminal: the epoch and run bars render with their time left, fit the terminal's
width and keep theirs; validation lines name epoch and step; sss's advice prints as one clean line, and none about
the learning rate during a warm-up."""

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


def _run_on_terminal(width: int) -> tuple[list[str], str]:
    """The script's output at `width` columns, as the lines a terminal would show (escapes removed), and stderr."""
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
    return re.split(r"\r\n|\r|\n", text), proc.stderr.read().decode()  # each redraw starts with \r


BAR = "━╸╺"
VAL = re.compile(r"^\[val\] epoch (\d+) step (\d+): loss \d\.\d{4} accuracy \d\.\d{4}")


def _flat(text: str) -> str:
    return " ".join(text.split())  # a long line wrapped by the terminal, read as one


@pytest.mark.slow
@pytest.mark.parametrize("width", [60, 100])
def test_the_bars_render_on_a_terminal_within_its_width(width):
    lines, stderr = _run_on_terminal(width)
    assert max(len(line) for line in lines) <= width, [line for line in lines if len(line) > width]
    bars = [line for line in lines if any(c in line for c in BAR)]
    assert bars and all(line.startswith(("epoch ", "total ")) for line in bars), bars[:4]
    # two bars, the epoch's and the run's, each with a count and the time left (or taken, at the end)
    assert any(re.match(r"epoch 0 .* 3/8 +eta \d:\d\d:\d\d", line) for line in bars), bars[:6]
    assert any(re.match(r"total .* 11/16 +eta \d:\d\d:\d\d", line) for line in bars), bars
    assert re.match(r"epoch 1 .* 8/8 +took ", bars[-2]) and re.match(r"total .* 16/16 +took ", bars[-1]), bars[-2:]
    # the bars keep one width, whatever the status line holds: the health figures live on their own line
    widths = {sum(line.count(c) for c in BAR) for line in bars}
    assert len(widths) == 1 and widths.pop() >= width - 30, bars[:4]
    info = [line for line in lines if "loss " in line and "samples/s" in line]
    assert info and all(" lr " in line for line in info)
    assert any("grad_share/image" in line for line in info)  # a health figure the monitor published
    shown = [VAL.match(line) for line in lines if line.startswith("[val]")]  # "[val]" is not eaten as markup
    assert [(m.group(1), m.group(2)) for m in shown if m] == [("0", "8"), ("1", "16")], lines
    # sss's advice: one "sss: warning:" line (the terminal may wrap it), no file path, no source line
    text = _flat("\n".join(lines) + "\n" + stderr)
    assert "sss: warning: GradNormMonitor (global_step " in text and "modality imbalance: audio gets 0.0%" in text
    assert ".py:" not in text and "warnings.warn" not in text and "Warning:" not in text
    # clipped at every step with an LR far too large, but still warming up: no learning-rate advice
    assert "learning rate may be" not in text


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
    shown = [VAL.match(line) for line in done.stdout.splitlines() if line.startswith("[val]")]
    assert [(m.group(1), m.group(2)) for m in shown if m] == [("0", "8"), ("1", "16")], done.stdout
    warned = [line for line in done.stderr.splitlines() if "GradNormMonitor" in line]
    assert len(warned) == 1 and warned[0].startswith("sss: warning: GradNormMonitor (global_step "), done.stderr
    assert "modality imbalance" in warned[0] and ".py:" not in done.stderr, done.stderr


def test_values_the_module_logs_for_the_bar_are_shown(capsys):
    import torch

    from sss import SSSTrainer
    from sss.callbacks import ProgressBar
    from sss.testing import BoringModule, boring_loader

    class Logs(BoringModule):
        def training_step(self, batch, batch_idx):
            self.log("mine", torch.tensor(0.25), prog_bar=True)
            return super().training_step(batch, batch_idx)

    trainer = SSSTrainer(
        max_steps=4, mixed_precision="no", log={"every_n_steps": 2}, callbacks=[ProgressBar(every_n_steps=2)]
    )
    trainer.fit(Logs(), train_dataloaders=boring_loader(n=32))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert lines and all("mine 0.25" in line for line in lines), lines
