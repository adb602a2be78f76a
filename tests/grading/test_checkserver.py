"""The check server, request by request, with a check made for the test.

Each test fails on a small bug in autograder/grading/checkserver.py (`make mutation`),
among them the one that matters most: a refused, malformed or failed request
answered with `passed: True`.
"""

import shutil
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from autograder.grading import checkserver
from autograder.grading.checkserver import MAX_EXECUTED_NAMES, CheckServer, Refusal, Verdict
from normref.checks import _registry, _wire

CALLS = {"cases": 0}


def _double_cases(rng):
    CALLS["cases"] += 1
    return [("small", {"x": rng.standard_normal(3)}), ("large", {"x": 100 * np.ones(2)})]


def _double_judge(case, output):
    if not np.allclose(output["y"], 2 * case["x"]):
        return f"y should be {2 * case['x']}"
    return None


CHECKS = {"double": _registry.Check(_double_cases, _double_judge),
          "other": _registry.Check(_double_cases, _double_judge)}


@pytest.fixture
def fake_checks(monkeypatch):
    monkeypatch.setattr(_registry, "_all_checks", lambda: dict(CHECKS))
    CALLS["cases"] = 0


@pytest.fixture
def sock_dir():
    folder = Path(tempfile.mkdtemp(prefix="cs"))  # short: a socket path has 108 bytes
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _ask(path, header, arrays=None):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)  # a server that never answers fails the test, not hangs it
        s.connect(str(path))
        _wire.send(s, header, arrays)
        return _wire.receive(s)


def _answers(cases):
    return {k.replace("/x", "/y"): 2 * v for k, v in cases.items()}


def _serve(sock_dir, **kwargs):
    kwargs.setdefault("cell_checks", {"c1": ("double",)})
    return CheckServer(sock_dir / f"s{len(list(sock_dir.iterdir()))}.sock", **kwargs)


def test_a_right_answer_passes_and_is_logged_against_the_running_cell(fake_checks, sock_dir):
    with _serve(sock_dir, seed=5) as server:
        server.current_cell = "c1"
        reply, cases = _ask(server.path, {"op": "cases", "check": "double"})
        assert reply == {"labels": ["small", "large"], "record": False}
        assert sorted(cases) == ["0/x", "1/x"]
        reply, extra = _ask(server.path, {"op": "judge", "check": "double"}, _answers(cases))
    assert reply == {"passed": True, "message": "double: passed"} and extra == {}
    assert server.verdicts == [Verdict("c1", "double", True,
                                       "double: all 2 cases passed (small, large)")]
    assert server.refusals == []
    assert CALLS["cases"] == 1  # made once, kept for the verdict


def test_a_wrong_answer_fails_and_the_kernel_learns_only_the_case(fake_checks, sock_dir):
    with _serve(sock_dir) as server:
        server.current_cell = "c1"
        _, cases = _ask(server.path, {"op": "cases", "check": "double"})
        wrong = _answers(cases)
        wrong["1/y"] = wrong["1/y"] + 1
        reply, _ = _ask(server.path, {"op": "judge", "check": "double"}, wrong)
    assert reply == {"passed": False, "message": "double: failed on the case 'large'. "
                     "The feedback report says what was wrong."}
    [verdict] = server.verdicts
    assert verdict.passed is False and verdict.message.startswith("double, large: y should")


def test_the_students_own_exception_goes_back_in_full(fake_checks, sock_dir):
    with _serve(sock_dir) as server:
        server.current_cell = "c1"
        _ask(server.path, {"op": "cases", "check": "double"})
        reply, _ = _ask(server.path, {"op": "judge", "check": "double",
                                      "errors": {"0": "ValueError: " + "v" * 3000}})
    message = "double, small: your code raised ValueError: " + "v" * (2000 - 12)
    assert reply == {"passed": False, "message": message}
    assert server.verdicts[0].message == message and server.verdicts[0].passed is False


@pytest.mark.parametrize("header, why", [
    ({"op": "cases", "check": "other"}, "the running cell c1 does not call other"),
    ({"op": "judge", "check": "double"}, "double was asked for a verdict before its inputs"),
    ({"op": "guess", "check": "double"}, "unknown request"),
    ({"check": "double"}, "unknown request"),
])
def test_a_refused_request_never_passes(fake_checks, sock_dir, header, why):
    with _serve(sock_dir) as server:
        server.current_cell = "c1"
        reply, arrays = _ask(server.path, header)
    assert reply == {"passed": False, "refused": True,
                     "message": f"the grader refused this request: {why}"}
    assert arrays == {} and server.verdicts == []
    assert server.refusals == [Refusal("c1", header["check"], str(header.get("op")), why)]


def test_nothing_is_served_between_cells(fake_checks, sock_dir):
    with _serve(sock_dir) as server:
        reply, _ = _ask(server.path, {"op": "cases", "check": "double"})
        server.current_cell = "not_graded"
        reply2, _ = _ask(server.path, {"op": "cases", "check": "double"})
    for answer in (reply, reply2):
        assert answer["passed"] is False and answer["refused"] is True
    assert [r.why for r in server.refusals] == ["no graded test cell is running"] * 2
    assert [r.cell for r in server.refusals] == ["None", "not_graded"]


def test_each_call_of_a_check_is_served_once_and_no_more(fake_checks, sock_dir):
    with _serve(sock_dir, cell_checks={"c1": ("double", "double")}) as server:
        server.current_cell = "c1"
        served = [_ask(server.path, {"op": "cases", "check": "double"})[1] for _ in range(2)]
        reply, _ = _ask(server.path, {"op": "cases", "check": "double"})
        assert reply["passed"] is False and reply["refused"] is True
        for cases in served:
            ok, _ = _ask(server.path, {"op": "judge", "check": "double"}, _answers(cases))
            assert ok["passed"] is True
        reply, _ = _ask(server.path, {"op": "judge", "check": "double"}, _answers(cases))
    assert reply["passed"] is False and reply["refused"] is True
    assert [r.why for r in server.refusals] == [
        "double was already asked for its cases in c1",
        "double was asked for a verdict before its inputs"]
    assert len(server.verdicts) == 2


def test_a_verdict_waits_for_its_own_inputs_each_time(fake_checks, sock_dir):
    with _serve(sock_dir, cell_checks={"c1": ("double", "double")}) as server:
        server.current_cell = "c1"
        _, cases = _ask(server.path, {"op": "cases", "check": "double"})
        _ask(server.path, {"op": "judge", "check": "double"}, _answers(cases))
        reply, _ = _ask(server.path, {"op": "judge", "check": "double"}, _answers(cases))
    assert reply["refused"] is True and reply["passed"] is False
    assert server.refusals[0].why == "double was asked for a verdict before its inputs"


@pytest.mark.parametrize("frame, error", [
    (b"\x00\x00\x00\x02\x00\x00\x00\x00[]", "FrameRefused"),
    (b"\x00\x00\x00\x03\x00\x00\x00\x04{}xPK\x03\x04", "JSONDecodeError"),
    (b"\xff\xff\xff\xff\x00\x00\x00\x00", "FrameRefused")])
def test_a_malformed_request_is_refused_and_the_server_goes_on(fake_checks, sock_dir, frame,
                                                               error):
    with _serve(sock_dir) as server:
        server.current_cell = "c1"
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(server.path)
            s.sendall(frame)
            reply, arrays = _wire.receive(s)
        assert reply == {"passed": False, "refused": True,
                         "message": "the grader refused a malformed request"}
        assert arrays == {}
        good, _ = _ask(server.path, {"op": "cases", "check": "double"})
        assert good["labels"] == ["small", "large"]
    [refusal] = server.refusals
    assert refusal.cell == "c1" and refusal.check == "?" and refusal.op == "?"
    assert refusal.why == f"malformed request ({error})"


def test_a_client_that_hangs_up_does_not_stop_the_server(fake_checks, sock_dir):
    with _serve(sock_dir, cell_checks={"c1": ("double", "double")}) as server:
        server.current_cell = "c1"
        for _ in range(20):  # the reply meets a closed socket (EPIPE or ECONNRESET)
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(server.path)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00"
                             b"\x00\x00")
                _wire.send(s, {"op": "cases", "check": "nothing"})
        time.sleep(0.2)
        reply, _ = _ask(server.path, {"op": "cases", "check": "double"})
    assert reply["labels"] == ["small", "large"]


def _inputs(sock_dir, served, **kwargs):
    """[(cell, first input)] of every (cell, check) request in `served`, in order."""
    inputs = []
    with _serve(sock_dir, **kwargs) as server:
        for cell, check in served:
            server.current_cell = cell
            _, cases = _ask(server.path, {"op": "cases", "check": check})
            inputs.append((cell, tuple(cases["0/x"])))
    return inputs


def test_every_call_of_a_check_gets_inputs_of_its_own(fake_checks, sock_dir):
    # answers worked out from one call's inputs, outside any recording, are of no
    # use for the next call: a replay must fail
    served = [("c1", "double"), ("c1", "double"), ("c2", "double")]
    cells = {"c1": ("double", "double"), "c2": ("double",)}
    first = _inputs(sock_dir, served, cell_checks=cells, seed=5)
    assert len({x for _, x in first}) == 3
    assert _inputs(sock_dir, served, cell_checks=cells, seed=5) == first  # reproducible
    other = _inputs(sock_dir, served, cell_checks=cells, seed=6)
    assert not {x for _, x in other} & {x for _, x in first}


def test_the_default_seed_is_zero_and_the_thread_never_holds_the_grader(fake_checks,
                                                                       sock_dir):
    with _serve(sock_dir) as server:
        assert server._thread.daemon is True
    assert _inputs(sock_dir, [("c1", "double")]) == _inputs(sock_dir, [("c1", "double")],
                                                            seed=0)


def test_the_server_stops_serving_when_closed(fake_checks, sock_dir):
    with _serve(sock_dir) as server:
        server.current_cell = "c1"
        _ask(server.path, {"op": "cases", "check": "double"})
        time.sleep(0.3)  # the thread is back in accept(), waiting for the next request
    server._thread.join(timeout=5)
    assert not server._thread.is_alive(), "the server thread still waits for requests"
    with socket.socket(socket.AF_UNIX) as s, pytest.raises(OSError):
        s.connect(server.path)


def test_cells_with_a_policy_are_asked_to_record(fake_checks, sock_dir):
    with _serve(sock_dir, cell_checks={"c1": ("double",), "c2": ("double",)},
                record_cells=["c2"]) as server:
        server.current_cell = "c2"
        reply, _ = _ask(server.path, {"op": "cases", "check": "double"})
        assert reply["record"] is True
        server.current_cell = "c1"
        reply, _ = _ask(server.path, {"op": "cases", "check": "double"})
        assert reply["record"] is False


def _judged(sock_dir, **header):
    with _serve(sock_dir) as server:
        server.current_cell = "c1"
        _, cases = _ask(server.path, {"op": "cases", "check": "double"})
        _ask(server.path, {"op": "judge", "check": "double", **header}, _answers(cases))
    return server.verdicts[0]


def test_the_executed_names_are_kept_sorted_distinct_and_short(fake_checks, sock_dir):
    verdict = _judged(sock_dir, executed=["torch.b", "torch.a", "torch.b", "x" * 300])
    assert verdict.executed == ("torch.a", "torch.b", "x" * 200)
    assert verdict.recorder_intact is True
    assert _judged(sock_dir).executed == () and _judged(sock_dir).recorder_intact is True


def test_names_past_the_cap_are_not_even_read(fake_checks, sock_dir):
    names = [f"n{i:05d}" for i in range(MAX_EXECUTED_NAMES + 1)] + ["a.late.name"]
    verdict = _judged(sock_dir, executed=names)
    assert "a.late.name" not in verdict.executed and verdict.recorder_intact is False


@pytest.mark.parametrize("header, intact", [
    ({"recorder_intact": False}, False),
    ({"recorder_intact": "yes"}, False),
    ({"recorder_intact": True}, True),
    ({"executed": [f"n{i:05d}" for i in range(MAX_EXECUTED_NAMES - 1)]}, True),
    ({"executed": [f"n{i:05d}" for i in range(MAX_EXECUTED_NAMES)]}, False),
    ({"executed": [f"n{i:05d}" for i in range(MAX_EXECUTED_NAMES + 50)]}, False),
])
def test_a_recorder_cut_or_disturbed_is_not_intact(fake_checks, sock_dir, header, intact):
    verdict = _judged(sock_dir, **header)
    assert verdict.recorder_intact is intact
    assert len(verdict.executed) == min(len(header.get("executed", [])), MAX_EXECUTED_NAMES)


def test_the_student_reply_of_a_verdict():
    assert checkserver.student_reply("k", {"passed": True, "message": "secret"}) == {
        "passed": True, "message": "k: passed"}
    assert checkserver.student_reply("k", {"passed": False, "message": "m", "raised": True,
                                           "case": "c"}) == {"passed": False, "message": "m"}
    assert checkserver.student_reply("k", {"passed": False, "message": "ref 1.5",
                                           "case": "c"}) == {
        "passed": False,
        "message": "k: failed on the case 'c'. The feedback report says what was wrong."}
    assert checkserver.student_reply("k", {"passed": False, "message": "m", "raised": False,
                                           "case": None})["message"].startswith(
        "k: failed on the case 'None'.")


def test_a_verdict_and_a_refusal_hold_what_they_were_given():
    verdict = Verdict("c", "k", True, "m")
    assert verdict.executed == () and verdict.recorder_intact is True
    assert Refusal("c", "k", "cases", "w").why == "w"


def test_a_cell_is_served_only_its_own_checks_not_another_cells(fake_checks, sock_dir):
    with _serve(sock_dir, cell_checks={"c1": ("double",), "c2": ("other",)}) as server:
        server.current_cell = "c1"
        stolen, _ = _ask(server.path, {"op": "cases", "check": "other"})
        own, _ = _ask(server.path, {"op": "cases", "check": "double"})
        server.current_cell = "c2"
        late, _ = _ask(server.path, {"op": "cases", "check": "double"})
        mine, _ = _ask(server.path, {"op": "cases", "check": "other"})
    assert stolen["refused"] is True and late["refused"] is True
    assert own["labels"] == mine["labels"] == ["small", "large"]
    assert [(r.cell, r.why) for r in server.refusals] == [
        ("c1", "the running cell c1 does not call other"),
        ("c2", "the running cell c2 does not call double")]


def test_the_judges_are_loaded_before_any_cell_runs(sock_dir):
    """Loading the judges imports torch (seconds): a hand-in's first graded cell
    must not be charged for it under its scaled time limit."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from autograder.grading.checkserver import CheckServer\n"
        f"with CheckServer({str(sock_dir / 's')!r}, cell_checks={{}}):\n"
        "    print('torch' in sys.modules)\n")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True,
                           text=True, timeout=120, check=True).stdout.split()
    assert shown == ["True"]
