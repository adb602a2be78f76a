"""Runs a check: get the inputs, call the student's code, get a verdict.

Two modes, same code path for the student's side:
- in-process (an instructor's `nbgrader validate`, the test suite): the cases
  and the verdict come from the judges in this package;
- client (inside the grading sandbox, where NORMREF_GRADER_SOCKET is set): the
  cases and the verdict come from the grader over a Unix socket, and only the
  student's outputs, as plain arrays, are sent back. The grader keeps its own
  log of verdicts; what this process prints or raises decides nothing.
"""

import os
import socket

import numpy as np

from normref.checks import _wire

SOCKET_ENV = "NORMREF_GRADER_SOCKET"


class CheckFailed(AssertionError):
    """A graded check did not pass; the message says what to look at."""


def to_array(value, *, what="the result"):
    """Turn a student's return value into a plain numpy array, or explain why not.

    torch tensors are detached and moved to the CPU; anything numpy would only
    hold as an object (a custom class, ragged lists) is refused.
    """
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()
        if str(value.dtype) in ("torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2"):
            value = value.float()
        value = value.numpy()
    array = np.asarray(value)
    if array.dtype == object:
        raise TypeError(f"{what} is a {type(value).__name__}, not an array of numbers")
    return array.copy()


def _probe_all(subject, cases, probe):
    outputs, errors = {}, {}
    for i, (_, case) in enumerate(cases):
        try:
            result = probe(subject, case)
            for key, value in result.items():
                outputs[f"{i}/{key}"] = to_array(value)
        except Exception as exc:  # the student's code may raise anything
            errors[str(i)] = f"{type(exc).__name__}: {exc}"[:2000]
    return outputs, errors


def _ask_grader(header, arrays=None):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(os.environ[SOCKET_ENV])
        _wire.send(sock, header, arrays)
        return _wire.receive(sock)


def run_check(name, subject, probe):
    """Run check `name` on `subject` (the student's function, class or values).

    probe(subject, case) -> {key: array} calls the student's code on one case.
    Prints the verdict's message; raises CheckFailed when the check fails.
    """
    if os.environ.get(SOCKET_ENV):
        reply, arrays = _ask_grader({"op": "cases", "check": name})
        cases = _wire.unflatten_cases(reply["labels"], arrays)
        outputs, errors = _probe_all(subject, cases, probe)
        verdict, _ = _ask_grader({"op": "judge", "check": name, "errors": errors}, outputs)
    else:
        from normref.checks import _registry

        cases = _registry.make_cases(name)
        outputs, errors = _probe_all(subject, cases, probe)
        verdict = _registry.judge(name, cases, outputs, errors)
    if not verdict["passed"]:
        raise CheckFailed(verdict["message"])
    print(verdict["message"])
