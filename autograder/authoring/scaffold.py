"""Scaffold a trusted check for a new exercise (see docs/adding_an_exercise.md).

    python -m autograder new-check NAME --function FUNC --reference MODULE:FUNCTION \
        [--shapes "4,8 2,3,16"]

writes the check's two halves into normref/checks/: the probe `check_NAME(FUNC)`, which
calls the student's function on each case inside their kernel, into NAME_probes.py, and
the cases and judge, which compare with the reference on the grader's side, into
NAME_judges.py. Both are found by name (`from normref.checks import check_NAME` in a
hidden test; the grader registers every *_judges.py). The check works as written:
random float64 and float32 arrays of the given shapes, compared with the reference at
the course's tolerances. Edit the cases and the judge's hints to fit the exercise.
"""

import importlib
import keyword
import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "normref"

_PROBES_HEADER = '''"""The {name} check, the student-facing half: how the exercise is called."""

from normref.checks._runner import run_check
'''

_JUDGES_HEADER = '''"""The {name} check, the grader-facing half: {function}(x) compared with
{reference}."""

import importlib

import numpy as np

from normref.checks._registry import Check
from normref.checks.tolerances import mismatch
'''

_PROBE = '''

def _call_{name}(function, case):
    return {{"y": function(case["x"].copy())}}


def check_{name}({function}):
    """Check {function}(x) against the reference on the grader's inputs."""
    run_check("{name}", {function}, _call_{name})
'''

_JUDGE = '''
{upper}_SHAPES = {shapes!r}


def _{name}_reference(x):
    module, _, function = "{reference}".partition(":")
    return np.asarray(getattr(importlib.import_module(module), function)(x))


def _{name}_cases(rng):
    cases = []
    for shape in {upper}_SHAPES:
        cases.append((f"x of shape {{shape}}", {{"x": rng.normal(size=shape)}}))
        cases.append((f"a float32 x of shape {{shape}}",
                      {{"x": rng.normal(size=shape).astype(np.float32)}}))
    return cases


def _{name}_judge(case, output):
    x = case["x"]
    return mismatch(output["y"], _{name}_reference(x.astype(np.float64)), dtype=x.dtype,
                    what="{function}(x)")


CHECKS = {{"{name}": Check(_{name}_cases, _{name}_judge)}}
'''


class ScaffoldError(ValueError):
    """The scaffold cannot be written as asked; the message says why."""


def _identifier(value, what):
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", value) or keyword.iskeyword(value):
        raise ScaffoldError(f"{what} {value!r} must be a lower-case Python name")
    return value


def _shapes(text):
    try:
        shapes = [tuple(int(n) for n in part.split(",")) for part in text.split()]
    except ValueError:
        raise ScaffoldError(f"--shapes {text!r}: give shapes like \"4,8 2,3,16\"") from None
    if not shapes or any(not shape or min(shape) < 1 for shape in shapes):
        raise ScaffoldError(f"--shapes {text!r}: every shape needs positive sizes")
    return shapes


def _reference_exists(reference):
    module, _, function = reference.partition(":")
    if not module or not function:
        raise ScaffoldError(f"--reference {reference!r}: give MODULE:FUNCTION")
    try:
        found = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as problem:
        raise ScaffoldError(f"--reference {reference!r} cannot be imported: {problem}") from None
    if not callable(found):
        raise ScaffoldError(f"--reference {reference!r} is not a function")


def _defined(path, name):
    return re.search(rf"^def check_{name}\(|[\"']{name}[\"']: *Check\(", path.read_text(),
                     re.MULTILINE)


def scaffold_check(*, name, function, reference, shapes="4,8 2,3,16",
                   package_dir=PACKAGE_DIR):
    """Write check `name` (probe and judge) into package_dir/checks/; returns the two
    paths. Refuses a name that is taken, bad names and a reference that cannot be
    imported, before writing anything."""
    name, function = _identifier(name, "the check's name"), _identifier(function, "--function")
    shape_list = _shapes(shapes)
    _reference_exists(reference)
    checks_dir = Path(package_dir) / "checks"
    probes, judges = checks_dir / f"{name}_probes.py", checks_dir / f"{name}_judges.py"
    for path in sorted(checks_dir.glob("*_probes.py")) + sorted(checks_dir.glob("*_judges.py")):
        if _defined(path, name):
            raise ScaffoldError(f"a check named {name!r} already exists in {path.name}")
    for path in (probes, judges):
        if path.exists():
            raise ScaffoldError(f"{path.name} already exists")
    fields = {"name": name, "function": function, "reference": reference,
              "shapes": shape_list, "upper": name.upper()}
    probes.write_text(_PROBES_HEADER.format(**fields) + _PROBE.format(**fields))
    judges.write_text(_JUDGES_HEADER.format(**fields) + _JUDGE.format(**fields))
    return probes, judges
