"""Run statuses: a ``str`` enum that compares, prints and formats as its plain value, and how a
run that ended with an exception is recorded (FINISHED, KILLED for a stop request, FAILED)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foxhunt.runs.status import OK_RESULTS, TERMINAL, Status, ending_status

errors = st.sampled_from([ValueError, RuntimeError, MemoryError, OSError, KeyError, ArithmeticError, Exception])


@given(status=st.sampled_from(list(Status)), width=st.integers(0, 12))
def test_a_status_is_its_plain_string_everywhere(status, width):
    value = status.value
    assert status == value and Status(value) is status
    assert str(status) == value and f"{status}" == value and f"{status:<{width}}" == f"{value:<{width}}"
    assert json.loads(json.dumps({"state": status})) == {"state": value}


def test_terminal_and_ok_statuses():
    assert set(TERMINAL) == {"FINISHED", "FAILED", "KILLED"}
    assert set(OK_RESULTS) == {"FINISHED", "SKIPPED"}


def test_no_exception_is_finished_and_a_stop_request_is_killed():
    assert ending_status(None) is Status.FINISHED
    for stop in (KeyboardInterrupt(), SystemExit(), SystemExit(0), SystemExit(143)):
        assert ending_status(stop) is Status.KILLED, stop


def test_lightnings_sigterm_is_a_stop_request():
    exceptions = pytest.importorskip("lightning.pytorch.utilities.exceptions")
    assert ending_status(exceptions.SIGTERMException()) is Status.KILLED


@given(error=errors, message=st.text(max_size=20))
def test_any_other_exception_is_failed(error, message):
    assert ending_status(error(message)) is Status.FAILED
