"""Rank-tagged warnings, log records and tracebacks in a (simulated) launched process."""

from __future__ import annotations

import logging
import sys
import warnings

import pytest

from sss.trainer import _processes
from sss.trainer._processes import tag_warnings_with_rank


@pytest.fixture
def as_rank(monkeypatch):
    """Pretend to be rank N of a launched group; every hook is restored after the test."""
    monkeypatch.setattr(_processes, "_tagged", False)
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    factory = logging.getLogRecordFactory()
    yield lambda rank, world=2: (monkeypatch.setenv("RANK", str(rank)), monkeypatch.setenv("WORLD_SIZE", str(world)))
    logging.setLogRecordFactory(factory)


def _warning_text() -> str:
    return warnings.formatwarning("disk nearly full", UserWarning, "x.py", 3)


def _log_text(name: str = "sss.test") -> str:
    record = logging.getLogger(name).makeRecord(name, logging.WARNING, "x.py", 3, "loss is %s", ("nan",), None)
    return record.getMessage()


def _crash_text(capsys) -> str:
    try:
        raise ValueError("boom")
    except ValueError:
        sys.excepthook(*sys.exc_info())
    return capsys.readouterr().err


def test_a_non_main_rank_tags_warnings_logs_and_tracebacks_once(as_rank, capsys):
    as_rank(1)
    tag_warnings_with_rank()
    tag_warnings_with_rank()  # idempotent: one tag, not two
    assert _warning_text().startswith("[rank 1] x.py:3: UserWarning: disk nearly full")
    assert _log_text() == "[rank 1] loss is nan"
    err = _crash_text(capsys)
    assert err.startswith("[rank 1] uncaught ValueError in rank 1 of 2:\n")
    assert "Traceback" in err and "ValueError: boom" in err and err.count("[rank 1]") == 1


def test_captured_warnings_are_tagged_once(as_rank):
    as_rank(3, world=4)
    tag_warnings_with_rank()
    assert _log_text("py.warnings") == "loss is nan"  # logging.captureWarnings formats with the tagged formatwarning
    assert _log_text() == "[rank 3] loss is nan"


def test_the_main_process_keeps_its_output_but_tags_its_traceback(as_rank, capsys):
    as_rank(0)
    tag_warnings_with_rank()
    assert _warning_text().startswith("x.py:3: UserWarning")
    assert _log_text() == "loss is nan"
    assert _crash_text(capsys).startswith("[rank 0] uncaught ValueError in rank 0 of 2:\n")


def test_a_single_process_is_left_alone(as_rank, monkeypatch, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    hook = sys.excepthook
    tag_warnings_with_rank()
    assert sys.excepthook is hook and _log_text() == "loss is nan"
    assert not _processes._tagged
