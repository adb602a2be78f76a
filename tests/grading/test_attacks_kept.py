"""Hand-ins from an independent attack on the grader, kept as tests.

tests/attacks/<unit>/ holds, per unit, hand-ins written by someone who had
not read the grader's code: attacks that once earned points (a forbidden call
run in a logging thread or a Timer, a flood of junk names past the recorder's
list, a process spawned from the graded call, a fake Triton kernel class whose
__module__ claims Triton, a kernel message of deeply nested JSON, a loop that
ignores interrupts, escape sequences written to the grader's terminal) and
gradients taken numerically (complex steps, centred differences) where a
derived backward pass is asked for, and correct but unusual work that must
keep its points (ValueError subclasses, loops, a scratch comparison with
nn.LayerNorm).
expected.json gives each one's points per cell; each unit is graded once.
"""

import json
import shutil

import pytest

from autograder.course import Course
from autograder.grading.grade import grade_assignment
from autograder.grading.runner import RunSettings
from autograder.term.collect import collect
from conftest import GRADING_ENGINE, REPO

ATTACKS = REPO / "tests" / "attacks"
UNITS = sorted(p.name for p in ATTACKS.iterdir() if (p / "expected.json").exists())
SETTINGS = RunSettings(cell_timeout=30, handin_timeout=120)


@pytest.mark.parametrize("unit", UNITS)
def test_kept_attacks_grade_to_their_expected_points(unit, tmp_path):
    course = Course(tmp_path)
    for part in ("source", "release"):
        shutil.copytree(REPO / part / unit, tmp_path / part / unit)
    report = collect(course=course, assignment=unit, source_path=ATTACKS / unit)
    assert report.unmatched == ["expected.json (not a notebook)"], report.unmatched
    results = {r["student_id"]: r for r in grade_assignment(
        course=course, assignment=unit, settings=SETTINGS, workers=2,
        engine=GRADING_ENGINE)}
    expected = json.loads((ATTACKS / unit / "expected.json").read_text())
    got = {s: {c["grade_id"]: c["points"] for c in r["cells"]} for s, r in results.items()}
    explain = {s: {c["grade_id"]: c["reason"] for c in r["cells"] if c["reason"]}
               for s, r in results.items()}
    assert got == expected, explain
    assert all(r["status"] == "graded" for r in results.values())
    if unit == "01_the_recipe":
        assert "ignored the interrupt" in results["a01_r3_uninterruptible_loop"]["reason"]
        assert results["a01_r3_uninterruptible_loop"]["seconds"] < 90
