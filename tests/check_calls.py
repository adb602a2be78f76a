"""Calling a trusted check the way a test cell does: what it prints, or why it failed."""

import contextlib
import io

import pytest

from normref.checks import CheckFailed


def passes(check, *subject):
    """What `check(*subject)` prints when it passes (it raises otherwise)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check(*subject)
    return out.getvalue()


def fails(check, *subject):
    """The message of the CheckFailed that `check(*subject)` must raise."""
    with pytest.raises(CheckFailed) as failed, contextlib.redirect_stdout(io.StringIO()):
        check(*subject)
    return str(failed.value)
