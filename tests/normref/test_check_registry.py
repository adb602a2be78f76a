"""The grader's registry of checks: finding them, making their cases, judging.

Each test fails on a small bug in normref/checks/_registry.py (`make mutation`).
The judging tests use checks made here, not the course's.
"""

import importlib
from pathlib import Path

import numpy as np
import pytest

import normref.checks
from normref.checks import _registry
from normref.checks._registry import Check


def _cases(rng):
    return [("first", {"x": rng.standard_normal(2)}), ("second", {"x": rng.standard_normal(3)})]


def _judge(case, output):
    return "" if np.allclose(output["y"], -case["x"]) else f"y is not {-case['x'][0]:.1f}"


@pytest.fixture
def negate(monkeypatch):
    monkeypatch.setattr(_registry, "_all_checks", lambda: {"negate": Check(_cases, _judge)})


def _right(cases):
    return {f"{i}/y": -case["x"] for i, (_, case) in enumerate(cases)}


def test_every_judges_module_is_found_and_nothing_else():
    folder = Path(normref.checks.__file__).parent
    expected = {}
    for path in sorted(folder.glob("*_judges.py")):
        expected.update(importlib.import_module(f"normref.checks.{path.stem}").CHECKS)
    assert expected, "no *_judges.py module holds a check"
    assert _registry.check_names() == sorted(expected)
    found = _registry._all_checks()
    assert found.keys() == expected.keys()
    assert all(found[name] is expected[name] for name in expected)


def test_an_unknown_check_is_a_key_error_that_names_it():
    with pytest.raises(KeyError, match="no check named 'no_such_check'"):
        _registry.make_cases("no_such_check")


def test_cases_come_from_the_seed(negate):
    for seed in (0, 7):
        made = _registry.make_cases("negate", seed=seed)
        expected = _cases(np.random.default_rng(seed))
        assert [label for label, _ in made] == ["first", "second"]
        for (_, got), (_, want) in zip(made, expected):
            np.testing.assert_array_equal(got["x"], want["x"])
    np.testing.assert_array_equal(_registry.make_cases("negate")[0][1]["x"],
                                  _cases(np.random.default_rng(0))[0][1]["x"])


def test_right_outputs_pass_and_the_message_lists_the_cases(negate):
    cases = _registry.make_cases("negate", seed=1)
    assert _registry.judge("negate", cases, _right(cases), {}) == {
        "passed": True, "message": "negate: all 2 cases passed (first, second)", "case": None}


def test_the_first_wrong_case_is_named_with_the_judges_sentence(negate):
    cases = [("first", {"x": np.array([1.0])}), ("second", {"x": np.array([2.0])})]
    wrong = {"0/y": np.array([9.0]), "1/y": np.array([9.0])}
    assert _registry.judge("negate", cases, wrong, {}) == {
        "passed": False, "message": "negate, first: y is not -1.0", "case": "first"}
    wrong["0/y"] = np.array([-1.0])
    assert _registry.judge("negate", cases, wrong, {}) == {
        "passed": False, "message": "negate, second: y is not -2.0", "case": "second"}


def test_the_students_exception_is_reported_as_raised(negate):
    cases = [("first", {"x": np.array([1.0])}), ("second", {"x": np.array([2.0])})]
    outputs = {"0/y": np.array([-1.0])}
    assert _registry.judge("negate", cases, outputs, {"1": "ValueError: no"}) == {
        "passed": False, "message": "negate, second: your code raised ValueError: no",
        "case": "second", "raised": True}
    # A wrong case before the one that raised is reported first.
    outputs = {"0/y": np.array([5.0])}
    verdict = _registry.judge("negate", cases, outputs, {"1": "ValueError: no"})
    assert verdict["case"] == "first" and "raised" not in verdict


def test_a_missing_output_is_named(negate):
    cases = [("first", {"x": np.array([1.0])})]
    assert _registry.judge("negate", cases, {}, {}) == {
        "passed": False, "message": "negate, first: your code returned no value for 'y'",
        "case": "first"}


def test_a_judge_that_says_nothing_is_a_pass(monkeypatch):
    monkeypatch.setattr(_registry, "_all_checks",
                        lambda: {"quiet": Check(_cases, lambda case, output: None)})
    cases = _registry.make_cases("quiet")
    assert _registry.judge("quiet", cases, {}, {})["passed"] is True
