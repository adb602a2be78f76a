"""How a graded run becomes points (score_run): each cell earns its points only when
every check it calls passed in that cell, nothing in it raised, and it executed
nothing its rule forbids; a tampered recorder, an operator registered outside torch
or a refused request is flagged. Verdict logs are made by hand, so every way a cell
can fail to earn its points is tried without running a kernel.
"""

import nbformat

from autograder.grading.checkserver import Refusal, Verdict
from autograder.grading.grade import score_run
from autograder.grading.runner import KERNEL_DIED_IN_CELL

SOURCE = nbformat.v4.new_notebook(cells=[
    nbformat.v4.new_code_cell(
        "check_token_mean(token_mean)\ncheck_token_var(token_var)",
        metadata={"nbgrader": {"grade": True, "grade_id": "both", "points": 2,
                               "solution": False, "locked": True}}),
    nbformat.v4.new_code_cell(
        "check_layer_norm_token(layer_norm)",
        metadata={"nbgrader": {"grade": True, "grade_id": "ln", "points": 3,
                               "solution": False, "locked": True}}),
])


def _ran(errors=None):
    """The source notebook as run: every cell executed, `errors` {gid: ename}."""
    run = nbformat.from_dict(nbformat.v4.new_notebook(cells=[dict(c) for c in SOURCE.cells]))
    for cell in run.cells:
        cell.execution_count = 1
        gid = cell.metadata["nbgrader"]["grade_id"]
        cell.outputs = ([nbformat.v4.new_output("error", ename=errors[gid], evalue="x",
                                                traceback=[])]
                        if errors and gid in errors else [])
    return run


def _points(verdicts, *, run=None, policy=None, refusals=()):
    cells, flags = score_run(source_nb=SOURCE, run_nb=run or _ran(), verdicts=verdicts,
                             policy=policy, refusals=refusals)
    return {c["grade_id"]: c["points"] for c in cells}, {c["grade_id"]: c for c in cells}, flags


PASS_ALL = [Verdict("both", "token_mean", True, "ok"), Verdict("both", "token_var", True, "ok"),
            Verdict("ln", "layer_norm_token", True, "ok")]


def test_every_check_passed_earns_every_point():
    points, _, flags = _points(PASS_ALL)
    assert points == {"both": 2, "ln": 3} and flags == []


def test_a_check_that_left_no_verdict_costs_the_cell_without_a_crash():
    """Both checks called, one passed, the other never reported."""
    points, cells, _ = _points(PASS_ALL[:1] + PASS_ALL[2:])
    assert points == {"both": 0, "ln": 3}
    assert cells["both"]["reason"] == "one of the checks this cell calls never ran"


def test_a_failed_check_costs_the_cell_and_its_message_is_the_reason():
    verdicts = [PASS_ALL[0], Verdict("both", "token_var", False, "token_var, case: wrong")]
    points, cells, flags = _points(verdicts + PASS_ALL[2:])
    assert points == {"both": 0, "ln": 3}
    assert cells["both"]["reason"] == "token_var, case: wrong"
    assert any("reported success but the grader's check did not pass" in f for f in flags)


def test_verdicts_of_another_cell_or_check_count_for_nothing():
    verdicts = [Verdict("ln", "token_mean", True, "ok"), Verdict("ln", "token_var", True, "ok")]
    points, _, flags = _points(verdicts + PASS_ALL[2:])
    assert points == {"both": 0, "ln": 3}
    assert any("which it does not call" in f for f in flags)


def test_an_error_in_the_cell_costs_it_even_when_the_checks_passed():
    points, cells, _ = _points(PASS_ALL, run=_ran({"ln": "AssertionError"}))
    assert points == {"both": 2, "ln": 0}
    assert cells["ln"]["reason"].startswith("AssertionError")


def test_a_cell_the_kernel_died_in_costs_its_points_with_the_reason_and_no_forgery_flag():
    """The runner gives the cell running at a crash a DeadKernelError: a crash is a
    reason, not a notebook that reported success the grader's check denies."""
    run = _ran()
    died = run.cells[0]
    died.outputs = [nbformat.v4.new_output("error", ename="DeadKernelError",
                                           evalue=KERNEL_DIED_IN_CELL, traceback=[])]
    for verdicts in (PASS_ALL[:1] + PASS_ALL[2:], PASS_ALL[2:]):  # died in its 2nd check, 1st
        points, cells, flags = _points(verdicts, run=run)
        assert points == {"both": 0, "ln": 3}
        assert cells["both"]["reason"] == f"DeadKernelError: {KERNEL_DIED_IN_CELL}"
        assert not any("reported success" in f for f in flags)


def test_an_executed_forbidden_call_costs_only_the_cell_that_forbids_it():
    verdicts = [Verdict("both", "token_mean", True, "ok", executed=("aten::mean",)),
                Verdict("both", "token_var", True, "ok"),
                Verdict("ln", "layer_norm_token", True, "ok",
                        executed=("aten::native_layer_norm", "torch.nn.functional.layer_norm"))]
    policy = {"ln": ["aten::*layer_norm*"], "both": ["aten::*layer_norm*"]}
    points, cells, _ = _points(verdicts, policy=policy)
    assert points == {"both": 2, "ln": 0}
    assert "aten::native_layer_norm" in cells["ln"]["reason"]
    assert cells["ln"]["executed_forbidden"] == ["aten::native_layer_norm"]


def test_a_tampered_recorder_costs_the_cell_and_flags_the_hand_in():
    verdicts = PASS_ALL[:2] + [Verdict("ln", "layer_norm_token", True, "ok",
                                       recorder_intact=False)]
    points, _, flags = _points(verdicts, policy={"ln": ["aten::*layer_norm*"]})
    assert points == {"both": 2, "ln": 0}
    assert any("tampered" in f for f in flags)


def test_an_operator_registered_outside_torch_costs_a_cell_with_a_rule_and_flags_it():
    """torch.library can register an op whose kernel runs aten's layer norm: the
    recorder sees the op, never what runs inside it, so the rule cannot be checked."""
    verdicts = [Verdict("both", "token_mean", True, "ok", executed=("studc1::c",)),
                Verdict("both", "token_var", True, "ok"),
                Verdict("ln", "layer_norm_token", True, "ok",
                        executed=("aten::lift_fresh", "studc1::c", "prims::add"))]
    points, cells, flags = _points(verdicts, policy={"ln": ["aten::*layer_norm*"]})
    assert points == {"both": 2, "ln": 0}  # "both" has no rule to keep
    assert "studc1::c" in cells["ln"]["reason"] and "prims" not in cells["ln"]["reason"]
    assert flags == ["ln: the hand-in ran operators registered outside torch (studc1::c)"]


def test_refused_requests_flag_the_hand_in_but_cost_no_honest_points():
    refusal = Refusal("cell 3", "layer_norm_token", "cases", "no graded test cell is running")
    points, _, flags = _points(PASS_ALL, refusals=[refusal])
    assert points == {"both": 2, "ln": 3}
    assert flags == ["cell 3: the check server refused a request for layer_norm_token "
                     "(no graded test cell is running)"]
