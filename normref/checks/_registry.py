"""Grader side of the checks: find a check's cases and judge, give a verdict.

Every module `normref/checks/*_judges.py` defines CHECKS = {name: Check}.
This side holds the references; it never runs inside the student's sandbox.
"""

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import normref.checks as _package
from normref.checks import _wire


@dataclass(frozen=True)
class Check:
    """cases(rng) -> [(label, {key: array})];
    judge(case, output) -> None if right, else a sentence for the student."""

    cases: Callable
    judge: Callable


def _all_checks():
    found = {}
    for info in pkgutil.iter_modules(_package.__path__):
        if info.name.endswith("_judges"):
            module = importlib.import_module(f"normref.checks.{info.name}")
            found.update(module.CHECKS)
    return found


def check_names():
    return sorted(_all_checks())


def _get(name):
    checks = _all_checks()
    if name not in checks:
        raise KeyError(f"no check named {name!r}")
    return checks[name]


def make_cases(name, seed=0):
    """The inputs of check `name`, generated from `seed`."""
    return _get(name).cases(np.random.default_rng(seed))


def judge(name, cases, outputs, errors):
    """Compare the student's outputs ({"i/key": array}) with the reference.

    Returns {"passed": bool, "message": str, "case": label or None}; the
    message names the first case that failed and what looks wrong (it may
    quote reference values: it is for the feedback report), or lists the
    cases that passed; "case" is the label of the first failing case.
    """
    check = _get(name)
    per_case = _wire.unflatten_cases([label for label, _ in cases], outputs)
    for i, (label, case) in enumerate(cases):
        if str(i) in errors:
            message = f"{name}, {label}: your code raised {errors[str(i)]}"
            return {"passed": False, "message": message, "case": label, "raised": True}
        try:
            problem = check.judge(case, per_case[i][1])
        except KeyError as missing:
            problem = f"your code returned no value for {missing}"
        if problem:
            return {"passed": False, "message": f"{name}, {label}: {problem}", "case": label}
    labels = ", ".join(label for label, _ in cases)
    return {"passed": True, "message": f"{name}: all {len(cases)} cases passed ({labels})",
            "case": None}
