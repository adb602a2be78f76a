"""The notebook runner: bounded errors, time limits, the output budget, phases.

Each test fails on a small bug in autograder/grading/runner.py (`make mutation`). Most
call the runner's pieces directly (the grading client's handlers get the
messages a kernel would send, time is a fake clock where the order of events
matters); the last few run tiny notebooks in the real sandboxed kernel, one
each (a second or two), for what only a real run shows: the preloaded check
client, the check server's view of which cell runs, per-cell limits, a kernel
that ignores interrupts, and the watchdog.
"""

import asyncio
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import warnings
from pathlib import Path
from queue import Empty
from types import SimpleNamespace

import nbformat
import numpy as np
import psutil
import pytest
import zmq
from nbclient.exceptions import CellExecutionError, DeadKernelError

from autograder.grading import checkserver, runner, sandbox
from autograder.grading.runner import RunSettings, _GradingClient, _short_error, _shortened
from normref.checks import _registry, _wire

# The check server judges with the registry: load it once, when the module is
# imported (collected), not inside a timed test.
_registry.check_names()

MD = nbformat.v4.new_markdown_cell
CODE = nbformat.v4.new_code_cell


def _cell(source="", *, gid=None, solution=False, grade=False):
    cell = CODE(source)
    if gid is not None:
        cell.metadata["nbgrader"] = {"grade_id": gid, "solution": solution, "grade": grade}
    return cell


def _notebook(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def _client(nb=None, **settings):
    nb = nb if nb is not None else _notebook(_cell("x = 1"))
    client = _GradingClient(nb, server=SimpleNamespace(current_cell=None),
                            settings=RunSettings(**settings), on_first_cell=lambda: None,
                            allow_errors=True, record_timing=False)
    client.clear_before_next_output = False  # as nbclient sets it when a cell starts
    return client


def _msg(msg_type, content, parent="m1"):
    return {"msg_type": msg_type, "content": content, "header": {"msg_type": msg_type},
            "parent_header": {"msg_id": parent}, "metadata": {}}


def _stream(text):
    return _msg("stream", {"name": "stdout", "text": text})


def _size(msg):
    return len(json.dumps(msg["content"]))


# --- bounded text -------------------------------------------------------------------------


def test_shortened_keeps_text_up_to_the_limit_and_says_how_much_was_cut():
    """A limit off by one, or a wrong count of the characters cut, misleads the reader."""
    assert _shortened("abcd", 4) == "abcd"
    assert _shortened(1234, 4) == "1234"
    assert _shortened("abcdef", 4) == "abcd... [2 more characters]"
    assert _shortened("", 0) == ""


def test_a_short_error_is_kept_whole():
    """An error that fits is passed on unchanged: name, message, traceback."""
    out = _short_error({"ename": "ValueError", "evalue": "bad x",
                        "traceback": ["Traceback", "  line 1", "ValueError: bad x"]})
    assert out == {"output_type": "error", "ename": "ValueError", "evalue": "bad x",
                   "traceback": ["Traceback", "  line 1", "ValueError: bad x"]}


def test_an_error_without_fields_is_an_empty_error():
    """A reply with no name, message or traceback still gives a well-formed error."""
    out = _short_error({})
    assert (out.ename, out.evalue, out.traceback) == ("", "", [])
    assert _short_error({"traceback": None, "ename": "E"}).traceback == []


def test_a_traceback_of_exactly_120_lines_is_kept():
    """The line cap starts after 120 lines, not at 120."""
    lines = [f"L{i}" for i in range(120)]
    assert _short_error({"traceback": lines}).traceback == lines


def test_a_deep_traceback_keeps_its_first_and_last_60_lines():
    """A recursion error's 3000 frames must not reach the feedback page; both ends stay."""
    lines = [f"L{i}" for i in range(130)]
    kept = _short_error({"traceback": lines}).traceback
    assert kept == lines[:60] + ["... [10 more lines]"] + lines[-60:]
    kept = _short_error({"traceback": lines[:121]}).traceback
    assert kept == lines[:60] + ["... [1 more lines]"] + lines[61:121]


def test_a_huge_traceback_is_cut_at_about_8000_characters():
    """Each line is cut to what is left of 8000 characters, and the rest is dropped."""
    lines = ["a" * 3000, "b" * 3000, "c" * 3000, "d" * 10]
    kept = _short_error({"traceback": lines}).traceback
    assert kept == ["a" * 3000, "b" * 3000, "c" * 2000 + "... [1000 more characters]",
                    "... [the rest of the traceback was cut]"]


def test_the_traceback_is_cut_once_the_budget_is_exactly_spent():
    """8000 characters used up exactly: what follows is cut, not kept."""
    kept = _short_error({"traceback": ["a" * 4000, "b" * 4000, "c"]}).traceback
    assert kept == ["a" * 4000, "b" * 4000, "... [the rest of the traceback was cut]"]


def test_a_line_near_the_end_of_the_budget_still_gets_200_characters():
    """With under 200 characters left, a line keeps its first 200 (a readable bit)."""
    kept = _short_error({"traceback": ["a" * 7900, "b" * 500]}).traceback
    assert kept == ["a" * 7900, "b" * 200 + "... [300 more characters]",
                    "... [the rest of the traceback was cut]"]


def test_huge_error_names_and_messages_are_cut():
    """A 100 MB exception message must not reach the graded notebook."""
    out = _short_error({"ename": "E" * 300, "evalue": "v" * 5000, "traceback": ["t"]})
    assert out.ename == "E" * 200 + "... [100 more characters]"
    assert out.evalue == "v" * 2000 + "... [3000 more characters]"
    exact = _short_error({"ename": "E" * 200, "evalue": "v" * 2000})
    assert (exact.ename, exact.evalue) == ("E" * 200, "v" * 2000)


def test_an_error_past_the_output_budget_keeps_no_traceback():
    """with_traceback=False drops the traceback, keeps name and message."""
    out = _short_error({"ename": "E", "evalue": "v", "traceback": ["x"]}, with_traceback=False)
    assert (out.ename, out.evalue, out.traceback) == ("E", "v", [])


# --- the kernel manager -------------------------------------------------------------------


def _manager(tmp_path, prefix=()):
    return runner.SandboxedKernelManager(
        kernel_name="python3", transport="ipc", ip=str(tmp_path / "kernel"),
        connection_file=str(tmp_path / "kernel.json"), command_prefix=list(prefix))


def test_the_kernel_is_interrupted_by_message_not_by_a_signal(tmp_path):
    """A signal would reach bwrap, not the kernel: interrupts must be messages."""
    assert _manager(tmp_path).kernel_spec.interrupt_mode == "message"


def test_the_kernel_command_is_the_prefix_then_the_kernel_with_the_client_preloaded(tmp_path):
    """The sandbox prefix comes first; the check client is imported before student code,
    and the kernel does not take the sandbox's init for a dead parent."""
    km = _manager(tmp_path, prefix=["bwrap", "--die-with-parent", "--"])
    preload = ["--IPKernelApp.exec_lines=['import normref.checks']",
               "--IPKernelApp.parent_handle=1"]
    cmd = km.format_kernel_cmd(["--extra"])
    assert cmd[:3] == ["bwrap", "--die-with-parent", "--"]
    assert cmd[-3:] == ["--extra"] + preload
    assert str(tmp_path / "kernel.json") in cmd
    assert "ipykernel_launcher" in cmd
    assert km.format_kernel_cmd()[-2:] == preload
    assert km.format_kernel_cmd()[:3] == cmd[:3]


def test_the_client_bounds_what_the_kernel_can_make_the_grader_hold(tmp_path):
    """Few queued messages, a send timeout, and a size cap per message: 64 MiB for
    replies (shell), 4 MiB for everything else."""
    kc = _manager(tmp_path).client()
    sockets = []
    try:
        assert kc.context.getsockopt(zmq.RCVHWM) == 32
        assert kc.context.getsockopt(zmq.SNDTIMEO) == 5000
        for channel, cap in (("shell", 64 * 1024**2), ("iopub", 4 * 1024**2),
                             ("control", 4 * 1024**2), ("stdin", 4 * 1024**2)):
            sock = kc._create_connected_socket(channel, b"me")
            sockets.append(sock)
            assert sock.getsockopt(zmq.MAXMSGSIZE) == cap, channel
            assert sock.getsockopt(zmq.RCVHWM) == 32
            assert sock.identity == b"me"
        assert sock.type == zmq.DEALER  # the channel's own kind of socket
    finally:
        for sock in sockets:
            sock.close(linger=0)


def test_the_connection_file_is_readable_by_the_kernel_s_user(tmp_path):
    """The kernel runs as another user: the file is world-readable, not writable."""
    km = _manager(tmp_path)
    km.write_connection_file()
    assert stat.S_IMODE(os.stat(tmp_path / "kernel.json").st_mode) == 0o644
    assert json.loads((tmp_path / "kernel.json").read_text())["transport"] == "ipc"


# --- which cell is which ------------------------------------------------------------------


def test_the_imports_allowance_goes_to_the_instructor_s_first_code_cell():
    """A code cell the student put before it (no grade id, or a solution) is not it."""
    nb = _notebook(MD("intro"), _cell("import os"), _cell("x = 1", gid="answer", solution=True),
                   _cell("import torch", gid="imports"), _cell("y", gid="later"))
    assert _client(nb).first_code_index == 3


def test_without_grade_ids_the_first_code_cell_gets_the_imports_allowance():
    assert _client(_notebook(MD("m"), _cell("a"), _cell("b"))).first_code_index == 1
    assert _client(_notebook(MD("m"), _cell("a", gid="s", solution=True),
                             _cell("b"))).first_code_index == 1
    assert _client(_notebook(MD("only text"))).first_code_index is None


def test_cells_are_sorted_into_phases():
    """Imports, answers (solution cells), tests (graded, not solution), the rest."""
    nb = _notebook(_cell("i", gid="imports"), _cell("a", gid="a", solution=True),
                   _cell("t", gid="t", grade=True), _cell("s", gid="s", solution=True, grade=True),
                   _cell("o"), _cell("o2", gid="desc"))
    client = _client(nb)
    assert [client._phase_of(c, i) for i, c in enumerate(nb.cells)] == [
        "imports", "answer_cells", "test_cells", "answer_cells", "other_cells", "other_cells"]


def test_grade_id_of_a_cell():
    assert _GradingClient._grade_id(_cell("x", gid="g1")) == "g1"
    assert _GradingClient._grade_id(_cell("x")) is None
    assert _GradingClient._grade_id({}) is None


# --- per-cell time limits -----------------------------------------------------------------


def _timed_client(**settings):
    nb = _notebook(MD("m"), _cell("import x", gid="imports"), _cell("a", gid="fast"),
                   _cell("b", gid="slow"), _cell("c", gid="new"), _cell("d"))
    client = _client(nb, **settings)
    client.deadline = runner.time.monotonic() + 1000
    return client, nb.cells


def test_each_cell_gets_its_own_limit():
    """The first code cell gets the startup allowance; scaled cells their own limit; a
    cell the reference lacks gets the longest scaled limit, at most cell_timeout."""
    client, cells = _timed_client(cell_timeout=30, startup_timeout=120,
                                  cell_timeouts={"fast": 5, "slow": 7, "imports": 2})
    assert [client.cell_timeout_for(c) for c in cells[1:]] == [120, 5, 7, 7, 7]
    client, cells = _timed_client(cell_timeout=6, cell_timeouts={"fast": 5, "slow": 7})
    assert client.cell_timeout_for(cells[4]) == 6
    assert client.cell_timeout_for(cells[3]) == 7


def test_without_scaled_limits_every_later_cell_gets_cell_timeout():
    client, cells = _timed_client(cell_timeout=30, startup_timeout=120)
    assert [client.cell_timeout_for(c) for c in cells[1:]] == [120, 30, 30, 30, 30]
    assert client.cell_timeout_for(_cell("not in the notebook", gid="slow")) == 30


def test_no_cell_outlives_the_hand_in_s_deadline():
    """A cell's limit is cut to the time left; past the deadline it still gets 1 s."""
    client, cells = _timed_client(cell_timeout=30, startup_timeout=120)
    client.deadline = runner.time.monotonic() + 3
    assert 2 < client.cell_timeout_for(cells[1]) <= 3
    assert 2 < client.cell_timeout_for(cells[2]) <= 3
    client.deadline = runner.time.monotonic() - 50
    assert client.cell_timeout_for(cells[2]) == 1.0


# --- the output budget --------------------------------------------------------------------


def test_output_counts_against_the_budget_until_it_is_spent():
    """Output up to the budget is kept; past it, dropped with one note naming the budget."""
    first = _stream("hello world")
    budget = 2 * _size(first)
    client = _client(max_output_chars=budget)
    cell = _cell("print()")
    assert client.process_message(first, cell, 0).text == "hello world"
    assert client.process_message(_stream("hello again"), cell, 0).text == "hello again"
    assert client.process_message(_stream("x"), cell, 0) is None
    assert client.process_message(_stream("y"), cell, 0) is None
    texts = [o.text for o in cell.outputs]
    assert texts[:2] == ["hello world", "hello again"]
    assert len(texts) == 3, texts  # one note, however many messages were dropped
    assert texts[2] == ("\n[the grader dropped further output: the hand-in sent more than "
                        f"{budget} characters]\n")
    assert cell.outputs[2].name == "stdout"
    later = _cell("print()")
    assert client.process_message(_stream("z"), later, 1) is None
    assert later.outputs == []  # the note is given once per hand-in


def test_status_and_input_messages_do_not_count_against_the_budget():
    """A busy/idle status or an execute_input is the kernel's, not the hand-in's output."""
    kept = _stream("hello world")
    client = _client(max_output_chars=_size(kept))
    cell = _cell("print()")
    assert client.process_message(_msg("status", {"execution_state": "busy"}), cell, 0) is None
    assert client.process_message(
        _msg("execute_input", {"code": "print()", "execution_count": 4}), cell, 0) is None
    assert cell.execution_count == 4
    assert client.process_message(kept, cell, 0).text == "hello world"
    assert client.output_capped is False


def test_one_error_per_cell_is_kept_even_past_the_budget():
    """The error decides the cell's fate: kept (without its traceback once the budget
    is spent), once per cell; a second error in the same cell is dropped."""
    error = {"ename": "ValueError", "evalue": "bad", "traceback": ["tb line"]}
    client = _client(max_output_chars=_size(_msg("error", error)))
    cell = _cell("raise")
    out = client.process_message(_msg("error", error), cell, 0)
    assert (out.ename, out.evalue, out.traceback) == ("ValueError", "bad", ["tb line"])
    assert client.process_message(_msg("error", error), cell, 0) is None
    assert cell.outputs == [out]
    other = _cell("raise")
    out = client.process_message(_msg("error", error), other, 1)
    assert (out.ename, out.evalue, out.traceback) == ("ValueError", "bad", [])
    assert other.outputs == [out]


def test_the_budget_counts_every_message_s_content():
    """A display update counts too: it is how a hand-in floods without printing."""
    update = _msg("update_display_data", {"data": {"text/plain": "x" * 50}, "metadata": {},
                                          "transient": {"display_id": "d"}})
    client = _client(max_output_chars=_size(update) + 5)
    cell = _cell("display")
    client.process_message(update, cell, 0)
    assert client.process_message(_stream("123456789"), cell, 0) is None
    assert client.output_capped


def test_an_update_of_a_display_shown_many_times_counts_once_per_copy():
    """200 outputs under one display_id, then one update: nbclient writes the update
    into all 200, so the page grows by 200 copies and the budget counts them (each
    repeated display rewrites the copies before it, and counts them too)."""
    cell = _cell("display")
    client = _client(_notebook(cell), max_output_chars=3_000_000)
    shown = _msg("display_data", {"data": {"text/plain": "s"}, "metadata": {},
                                  "transient": {"display_id": "d"}})
    for _ in range(200):
        client.process_message(shown, cell, 0)
    assert len(cell.outputs) == 200
    before = client.output_chars
    update = _msg("update_display_data", {"data": {"text/plain": "x" * 10_000},
                                          "metadata": {}, "transient": {"display_id": "d"}})
    assert client.process_message(update, cell, 0) is None
    assert client.output_chars - before == 200 * _size(update)
    assert client.output_capped  # the 2 MB it would show is past what was left
    assert all(out.data["text/plain"] == "s" for out in cell.outputs[:200])


def test_after_a_hidden_test_a_display_is_updated_only_from_the_hidden_tests_on():
    """A display shown in an answer cell, updated after the hidden tests ran (with
    what they hold), would carry them to the student's page: only the copies from
    the first hidden test on take the update."""
    answer, hidden, scratch = (_cell("show()"), _cell("### BEGIN HIDDEN TESTS\nx\n"
                                                      "### END HIDDEN TESTS"), _cell("leak()"))
    client = _client(_notebook(answer, hidden, scratch))
    shown = _msg("display_data", {"data": {"text/plain": "waiting"}, "metadata": {},
                                  "transient": {"display_id": "d"}})
    update = _msg("update_display_data", {"data": {"text/plain": "the hidden tests"},
                                          "metadata": {}, "transient": {"display_id": "d"}})
    client.running_index = 0
    client.process_message(shown, answer, 0)
    client.process_message(update, answer, 0)
    assert answer.outputs[0].data["text/plain"] == "the hidden tests"  # before: as usual
    client.running_index = 2
    client.process_message(shown, scratch, 2)
    client.process_message(update, scratch, 2)
    assert answer.outputs[0].data["text/plain"] == "the hidden tests"
    assert scratch.outputs[0].data["text/plain"] == "the hidden tests"
    leak = _msg("update_display_data", {"data": {"text/plain": "LEAK"}, "metadata": {},
                                        "transient": {"display_id": "d"}})
    client.process_message(leak, scratch, 2)
    assert answer.outputs[0].data["text/plain"] == "the hidden tests"
    assert scratch.outputs[0].data["text/plain"] == "LEAK"
    assert set(client._display_id_map["d"]) == {0, 2}  # both copies still known


# --- a cell past its time -----------------------------------------------------------------


class _Shell:
    def __init__(self, msgs):
        self.msgs, self.timeouts = list(msgs), []

    async def get_msg(self, timeout=None):
        self.timeouts.append(timeout)
        if not self.msgs:
            raise Empty
        return self.msgs.pop(0)


class _KernelClient:
    def __init__(self, msgs, probe="probe-1", alive=True):
        self.shell_channel, self.probe, self.alive = _Shell(msgs), probe, alive

    async def is_alive(self):
        return self.alive

    def kernel_info(self):
        if isinstance(self.probe, Exception):
            raise self.probe
        return self.probe


class _KernelManager:
    def __init__(self):
        self.interrupts = 0

    async def interrupt_kernel(self):
        self.interrupts += 1


def _late(msgs, probe="probe-1", alive=True):
    nb = _notebook(_cell("import x", gid="imports"), _cell("while True: pass", gid="slow"),
                   _cell("after"))
    client = _client(nb)
    client.km, client.kc = _KernelManager(), _KernelClient(msgs, probe, alive)
    return client, nb.cells[1]


def test_a_late_cell_is_interrupted_and_its_own_reply_is_its_result():
    """The KeyboardInterrupt reply stands; the cell is noted as stopped at its limit."""
    reply = {"msg_type": "execute_reply", "parent_header": {"msg_id": "run"},
             "content": {"status": "error", "ename": "KeyboardInterrupt"}}
    other = {"msg_type": "comm_info_reply", "parent_header": {"msg_id": "elsewhere"},
             "content": {}}
    client, cell = _late([other, reply])
    assert asyncio.run(client._async_handle_timeout(7, cell)) is reply
    assert client.km.interrupts == 1
    assert client.timed_out == {1: 7}
    assert cell.outputs == []
    assert all(0 < t <= 10 for t in client.kc.shell_channel.timeouts)


def test_an_idle_kernel_means_the_reply_was_lost_and_the_cell_fails():
    """The kernel answers the probe, not the cell: the cell fails, the run goes on."""
    info = {"msg_type": "kernel_info_reply", "parent_header": {"msg_id": "probe-1"},
            "content": {}}
    client, cell = _late([info])
    reply = asyncio.run(client._async_handle_timeout(7.2, cell))
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "CellTimeout"
    (out,) = cell.outputs
    assert out.output_type == "error" and out.ename == "CellTimeout"
    assert out.evalue == ("the cell ran past its 7 s, or its reply was too large for the "
                          "grader to receive")
    assert out.evalue == reply["content"]["evalue"]
    assert client.stopped_because is None


def test_a_kernel_that_ignores_the_interrupt_is_stopped():
    """No answer within the grace period: the cell fails, the run stops, and says why."""
    client, cell = _late([])
    with pytest.raises(DeadKernelError, match="ignored the interrupt"):
        asyncio.run(client._async_handle_timeout(7, cell))
    (out,) = cell.outputs
    assert out.ename == "CellTimeout"
    assert out.evalue == ("the cell ran past its 7 s and ignored the interrupt: the kernel "
                          "was stopped")
    assert client.stopped_because == ("a cell ran past its 7 s and ignored the interrupt; "
                                      "the kernel was stopped and later cells were not run")
    assert client.timed_out == {1: 7}


def test_a_kernel_that_cannot_even_be_asked_is_stopped():
    """A failed kernel_info request is no crash: no answer, so the kernel is stopped."""
    client, cell = _late([], probe=zmq.ZMQError())
    with pytest.raises(DeadKernelError):
        asyncio.run(client._async_handle_timeout(7, cell))
    assert cell.outputs[0].ename == "CellTimeout"


def test_a_dead_kernel_is_not_interrupted():
    client, cell = _late([], alive=False)
    with pytest.raises(DeadKernelError, match="Kernel died"):
        asyncio.run(client._async_handle_timeout(7, cell))
    assert client.km.interrupts == 0 and client.timed_out == {}


def test_a_timeout_outside_any_cell_fails_nothing():
    """nbclient may time out with no cell: nothing is noted, no output is added."""
    client, cell = _late([])
    with pytest.raises(DeadKernelError):
        asyncio.run(client._async_handle_timeout(7, None))
    assert client.timed_out == {} and cell.outputs == []
    client, _ = _late([])
    stranger = _cell("not in the notebook")
    with pytest.raises(DeadKernelError):
        asyncio.run(client._async_handle_timeout(7, stranger))
    assert client.timed_out == {}


def test_the_reply_counts_however_short_the_grace_period(monkeypatch):
    """The grace period is waited for as a whole, even when short (here 0.5 s)."""
    monkeypatch.setattr(runner, "_INTERRUPT_GRACE_SECONDS", 0.5)
    reply = {"msg_type": "execute_reply", "parent_header": {"msg_id": "run"}, "content": {}}
    client, cell = _late([reply])
    assert asyncio.run(client._async_handle_timeout(7, cell)) is reply
    assert 0 < client.kc.shell_channel.timeouts[0] <= 0.5


def test_the_grace_period_ends_when_no_time_is_left(monkeypatch):
    """With the grace period already used up, the kernel is stopped, not waited for."""
    clock = iter([100.0, 110.0, 110.0])
    monkeypatch.setattr(runner, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    reply = {"msg_type": "execute_reply", "parent_header": {"msg_id": "run"}, "content": {}}
    client, cell = _late([reply])
    with pytest.raises(DeadKernelError):
        asyncio.run(client._async_handle_timeout(7, cell))


def test_a_cell_stopped_at_its_limit_says_so_instead_of_keyboardinterrupt():
    client = _client()
    cell = _cell("while True: pass")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="started\n"),
                    nbformat.v4.new_output("error", ename="KeyboardInterrupt", evalue="",
                                           traceback=["KeyboardInterrupt"]),
                    nbformat.v4.new_output("error", ename="ValueError", evalue="x",
                                           traceback=[])]
    client._name_the_timeout(cell, 4.4)
    stream, named, other = cell.outputs
    assert stream.text == "started\n" and other.ename == "ValueError"
    assert named.output_type == "error" and named.ename == "CellTimeout"
    assert named.evalue == "the cell ran past its 4 s limit and was stopped"
    assert named.traceback == [named.evalue]


def test_a_failed_cell_gets_one_error_however_often_it_fails():
    nb = _notebook(_cell("a"), _cell("b"))
    client = _client(nb)
    reply = client._fail_cell(nb.cells[1], "CellTimeout", "late")
    assert reply == {"content": {"status": "error", "ename": "CellTimeout", "evalue": "late",
                                 "traceback": []}}
    client._fail_cell(nb.cells[1], "CellTimeout", "late again")
    assert [(o.ename, o.evalue) for o in nb.cells[1].outputs] == [("CellTimeout", "late")]
    assert client._fail_cell(None, "X", "y")["content"]["ename"] == "X"
    assert nb.cells[0].outputs == []
    client._fail_cell(nb.cells[0], "CellTimeout", "late too")
    assert [o.evalue for o in nb.cells[0].outputs] == ["late too"]


def test_a_cell_that_already_has_its_error_is_not_failed_twice():
    nb = _notebook(_cell("a"), _cell("b"))
    client = _client(nb)
    client.process_message(_msg("error", {"ename": "E", "evalue": "v", "traceback": []}),
                           nb.cells[1], 1)
    client._fail_cell(nb.cells[1], "CellTimeout", "late")
    assert [o.ename for o in nb.cells[1].outputs] == ["E"]


# --- a cell's reply -----------------------------------------------------------------------


def test_an_error_reply_whose_iopub_message_was_lost_still_fails_the_cell():
    """The reply alone (its iopub twin too large) gives the cell its error and its count."""
    client = _client()
    cell = _cell("raise")
    reply = {"content": {"status": "error", "execution_count": 3, "ename": "MemoryError",
                         "evalue": "big", "traceback": ["tb"]}}
    assert asyncio.run(client._check_raise_for_error(cell, 0, reply)) is None
    assert cell.execution_count == 3
    assert [(o.ename, o.evalue, o.traceback) for o in cell.outputs] == [
        ("MemoryError", "big", ["tb"])]
    asyncio.run(client._check_raise_for_error(cell, 0, reply))  # already has its error
    assert len(cell.outputs) == 1


def test_a_reply_keeps_the_cell_s_own_count_and_adds_nothing_when_ok():
    client = _client()
    cell = _cell("x")
    cell.execution_count = 2
    asyncio.run(client._check_raise_for_error(
        cell, 0, {"content": {"status": "ok", "execution_count": 9}}))
    assert cell.execution_count == 2 and cell.outputs == []
    fresh = _cell("y")
    asyncio.run(client._check_raise_for_error(fresh, 1, {"content": {"status": "ok"}}))
    assert fresh.execution_count is None and fresh.outputs == []
    assert asyncio.run(client._check_raise_for_error(fresh, 1, None)) is None


def test_an_error_whose_iopub_message_arrived_is_not_doubled():
    client = _client()
    cell = _cell("raise")
    error = {"ename": "ValueError", "evalue": "v", "traceback": []}
    client.process_message(_msg("error", error), cell, 0)
    asyncio.run(client._check_raise_for_error(
        cell, 0, {"content": {"status": "error", **error}}))
    assert len(cell.outputs) == 1


def test_errors_still_raise_where_the_client_does_not_allow_them():
    """The grading client adds to nbclient's handling, it does not replace it."""
    client = _GradingClient(_notebook(_cell("x")), server=SimpleNamespace(current_cell=None),
                            settings=RunSettings(), on_first_cell=lambda: None,
                            allow_errors=False)
    cell = _cell("raise")
    with pytest.raises(CellExecutionError):
        asyncio.run(client._check_raise_for_error(
            cell, 0, {"content": {"status": "error", "ename": "E", "evalue": "v",
                                  "traceback": []}}))


# --- one cell's run, on a fake clock ------------------------------------------------------


class _Clock:
    def __init__(self, now=100.0):
        self.now = now

    def monotonic(self):
        return self.now


def _clocked(monkeypatch, nb, **settings):
    """A client whose cells take `step` seconds each on a fake clock; cells with no
    source are not sent to a kernel (nbclient skips them), so none is needed."""
    clock = _Clock()
    monkeypatch.setattr(runner, "time", clock)
    starts = []
    client = _client(nb, **settings)
    client.on_first_cell = lambda: starts.append(clock.now)
    client.kc = object()
    seen = []

    def on_cell_start(cell, cell_index):
        seen.append(client.server.current_cell)
        clock.now += clock.step

    clock.step = 0.0
    client.on_cell_start = on_cell_start
    return client, clock, starts, seen


def _run(client, index):
    return asyncio.run(client.async_execute_cell(client.nb.cells[index], index))


def test_each_cell_s_time_goes_to_its_name_and_its_phase(monkeypatch):
    nb = _notebook(MD("m"), _cell(gid="imports"), _cell(gid="answer", solution=True),
                   _cell(gid="test", grade=True), _cell(), _cell(gid="answer2", solution=True))
    client, clock, starts, seen = _clocked(monkeypatch, nb, handin_timeout=300)
    for index, step in enumerate([5.0, 1.5, 2.25, 0.5, 0.125, 1.0]):
        clock.step = step
        _run(client, index)
    assert starts == [100.0]  # the first cell, whatever it is, starts the clock
    assert client.started_cells == 100.0 and client.deadline == 400.0
    assert seen == ["cell 0", "imports", "answer", "test", "cell 4", "answer2"]
    assert client.server.current_cell is None
    assert client.cell_seconds == {"imports": 1.5, "answer": 2.25, "test": 0.5,
                                   "cell 4": 0.125, "answer2": 1.0}
    assert client.phase_seconds == {"imports": 1.5, "answer_cells": 3.25, "test_cells": 0.5,
                                    "other_cells": 0.125}


def test_a_cell_s_seconds_are_rounded_to_the_millisecond(monkeypatch):
    nb = _notebook(_cell(gid="imports"))
    client, clock, _, _ = _clocked(monkeypatch, nb)
    clock.step = 1.23456
    _run(client, 0)
    assert client.cell_seconds == {"imports": 1.235}
    assert client.phase_seconds["imports"] == pytest.approx(1.23456)


def test_a_kernel_that_dies_in_a_cell_fails_that_cell_with_the_reason(monkeypatch):
    """A crash leaves the started cell an error, so the scoring never reads it as a
    cell that ran to its end (and reported success)."""
    nb = _notebook(_cell(gid="imports"), _cell("check()", gid="test", grade=True))
    client, _, _, _ = _clocked(monkeypatch, nb)
    _run(client, 0)

    def dies(cell, cell_index):
        cell["execution_count"] = 2  # the kernel took the cell, then crashed
        raise DeadKernelError("Kernel died")

    client.on_cell_start = dies
    with pytest.raises(DeadKernelError):
        _run(client, 1)
    (out,) = nb.cells[1].outputs
    assert out.ename == "DeadKernelError" and out.evalue == runner.KERNEL_DIED_IN_CELL
    assert nb.cells[0].get("outputs", []) == []


def test_a_code_cell_at_the_deadline_is_not_run(monkeypatch):
    """Once the hand-in's time is used up, code cells get a HandinTimeout error."""
    nb = _notebook(_cell(gid="imports"), _cell("x = 1", gid="answer"), MD("after"),
                   _cell("y = 2"))
    client, clock, _, seen = _clocked(monkeypatch, nb, handin_timeout=30)
    clock.step = 30.0
    _run(client, 0)
    assert clock.now == client.deadline
    _run(client, 1)
    (out,) = nb.cells[1].outputs
    assert out.ename == "HandinTimeout"
    assert out.evalue == "not run: the hand-in used up its 30 s"
    assert seen == ["imports"]  # the late code cell never reached the kernel
    assert "answer" not in client.cell_seconds
    _run(client, 2)  # text is still passed through nbclient
    assert seen == ["imports", "cell 2"] and "outputs" not in nb.cells[2]
    clock.now += 1
    _run(client, 3)
    assert nb.cells[3].outputs[0].ename == "HandinTimeout"


def test_a_cell_that_timed_out_is_named_when_it_ends(monkeypatch):
    nb = _notebook(_cell(gid="imports"), _cell(gid="slow"))
    client, _, _, _ = _clocked(monkeypatch, nb)
    client.timed_out[1] = 9
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="KeyboardInterrupt",
                                                  evalue="", traceback=[])]
    _run(client, 1)
    assert nb.cells[1].outputs[0].ename == "CellTimeout"
    assert "9 s limit" in nb.cells[1].outputs[0].evalue


# --- a run that stops early, without a kernel ---------------------------------------------


@pytest.fixture
def no_kernel(monkeypatch):
    """run_notebook with nbclient's execute replaced: `how(client)` runs instead of
    the notebook. The cgroup is kept from being made; its kill_all is recorded."""
    kills = []
    monkeypatch.setattr(sandbox, "_cgroup_v1_dir", lambda controller: None)
    monkeypatch.setattr(sandbox.ResourceGroup, "kill_all", lambda self: kills.append(self))

    def run(tmp_path, how, **settings):
        def execute(self, **kwargs):
            assert kwargs["env"][sandbox._runner.SOCKET_ENV].endswith("grader.sock")
            how(self)

        monkeypatch.setattr(_GradingClient, "execute", execute)
        return runner.run_notebook(_notebook(_cell("x = 1", gid="imports")),
                                   workdir=tmp_path / "work",
                                   settings=RunSettings(**settings), cell_checks={})

    run.kills = kills
    return run


def _raise(exc):
    def how(client):
        raise exc
    return how


def test_an_unexpected_error_is_the_run_s_problem_cut_to_300_characters(no_kernel, tmp_path):
    result = no_kernel(tmp_path, _raise(RuntimeError("x" * 1000)))
    assert result.problem == "the run stopped: RuntimeError: " + "x" * 300
    assert no_kernel.kills, "the kernel's group is killed after every run"
    assert result.verdicts == [] and result.refusals == [] and result.cell_seconds == {}
    assert result.phases["kernel_start"] == pytest.approx(result.seconds, abs=0.002)
    assert result.phases["kernel_stop"] == pytest.approx(0, abs=0.002)
    assert result.notebook.cells[0].source == "x = 1"


def test_a_dead_kernel_is_the_run_s_problem(no_kernel, tmp_path):
    result = no_kernel(tmp_path, _raise(DeadKernelError("Kernel died")))
    assert result.problem == "the kernel died (Kernel died)"


def test_a_kernel_stopped_for_ignoring_an_interrupt_says_so(no_kernel, tmp_path):
    def how(client):
        client.stopped_because = "a cell ran past its 3 s and ignored the interrupt"
        raise DeadKernelError("Kernel died")

    result = no_kernel(tmp_path, how)
    assert result.problem == "a cell ran past its 3 s and ignored the interrupt"


def test_a_run_that_ends_normally_has_no_problem(no_kernel, tmp_path):
    result = no_kernel(tmp_path, lambda client: None)
    assert result.problem is None


def test_the_client_is_set_up_for_grading(no_kernel, tmp_path):
    """The kernel gets startup_timeout to start; a cell's error does not stop the run;
    each cell gets its own limit; the graded notebook gets no timing metadata."""
    seen = {}

    def how(client):
        seen.update(startup=client.startup_timeout, allow_errors=client.allow_errors,
                    record_timing=client.record_timing, limit=client.timeout_func,
                    client=client)

    no_kernel(tmp_path, how, startup_timeout=90)
    client = seen["client"]
    assert seen["startup"] == 90 and seen["allow_errors"] is True
    assert seen["record_timing"] is False
    assert seen["limit"] == client.cell_timeout_for


def test_the_watchdog_fires_handin_timeout_plus_15_s_after_the_run_starts(
        no_kernel, tmp_path, monkeypatch):
    """Its firing kills the kernel's group and makes the problem "stopped by force";
    a run that ends first cancels it."""
    timers = []

    class Timer:
        def __init__(self, interval, function):
            self.interval, self.function, self.cancelled = interval, function, False
            self.started = False
            timers.append(self)

        def start(self):
            self.started = True

        def cancel(self):
            self.cancelled = True

    monkeypatch.setattr(runner, "threading", SimpleNamespace(Timer=Timer, Event=threading.Event))

    def how(client):
        assert timers[-1].started and not timers[-1].cancelled
        kills_before = len(no_kernel.kills)
        timers[-1].function()
        assert len(no_kernel.kills) == kills_before + 1
        raise DeadKernelError("Kernel died")

    result = no_kernel(tmp_path, how, handin_timeout=100)
    assert result.problem == "stopped by force after 100 s"
    assert [t.interval for t in timers] == [115] and timers[0].cancelled
    result = no_kernel(tmp_path / "again", _raise(DeadKernelError("Kernel died")),
                       handin_timeout=100)
    assert result.problem == "the kernel died (Kernel died)"  # not fired: not by force
    assert timers[1].cancelled


# --- real runs ----------------------------------------------------------------------------

needs_bwrap = pytest.mark.skipif(not sandbox.bwrap_available(),
                                 reason="bubblewrap is not installed")
CHECK = "add_layer_norm_module"


def _digest(arrays):
    return hashlib.sha256(b"".join(np.asarray(arrays[k]).tobytes()
                                   for k in sorted(arrays))).hexdigest()


def _texts(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@needs_bwrap
def test_a_notebook_runs_in_the_sandbox_with_checks_budget_and_phases(tmp_path):
    """One real run: the client is preloaded, the kernel holds none of the grader's
    stdin, stdout or stderr, the check server serves the running cell (with this
    run's seed and recording), output past the budget is dropped, errors are kept,
    no hand-in code runs after its last cell (atexit), and the phases add up to the
    run's time."""
    secret = tmp_path / "course"
    secret.mkdir()
    (secret / "answers.txt").write_text("42")
    ask = ("from normref.checks import _runner\n"
           f"reply, arrays = _runner._ask_grader({{'op': 'cases', 'check': {CHECK!r}}})\n")
    nb = _notebook(
        MD("intro"),
        _cell("import sys, os, hashlib, json, numpy as np\n"
              "print('preloaded', 'normref.checks' in sys.modules)\n"
              "held = [list(os.stat(f'/proc/self/fd/{fd}')[1:3]) for fd in "
              "os.listdir('/proc/self/fd') if os.path.exists(f'/proc/self/fd/{fd}')]\n"
              "print('held', json.dumps(held))",
              gid="imports"),
        _cell("def f(x):\n    return 2 * x", gid="answer", solution=True),
        _cell(ask + "print('record', reply.get('record'), 'refused', reply.get('refused'))\n"
              "print('labels', json.dumps(reply.get('labels')))\n"
              "print('digest', hashlib.sha256(b''.join(np.asarray(arrays[k]).tobytes() "
              "for k in sorted(arrays))).hexdigest())\n"
              f"verdict, _ = _runner._ask_grader({{'op': 'judge', 'check': {CHECK!r}, "
              "'errors': {}, 'executed': [], 'recorder_intact': True})\n"
              "print('judged', verdict['passed'])", gid="test_f", grade=True),
        _cell(ask + f"print('refused', reply.get('refused'), os.path.exists({str(secret)!r}"
              " + '/answers.txt'))"),
        _cell("print('y' * 5000)"),
        _cell("print('dropped')"),
        _cell("import atexit\natexit.register(_runner._ask_grader, "
              "{'op': 'cases', 'check': 'after the last cell'})"),
        _cell("raise ValueError('boom')"),
    )
    settings = RunSettings(cell_timeout=60, startup_timeout=120, handin_timeout=240,
                           max_output_chars=4000)
    # The grader's stdin is a pipe, its stdout and stderr files: the kernel gets none.
    read_end, write_end = os.pipe()
    files = [open(tmp_path / name, "wb") for name in ("stdout", "stderr")]
    grader_fds = [read_end] + [f.fileno() for f in files]
    theirs = [[os.fstat(fd).st_ino, os.fstat(fd).st_dev] for fd in grader_fds]
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    for fd, replacement in zip((0, 1, 2), grader_fds):
        os.dup2(replacement, fd)
    try:
        result = runner.run_notebook(nb, workdir=tmp_path / "work", settings=settings,
                                     cell_checks={"test_f": [CHECK]}, record_cells=["test_f"],
                                     seed=7, hidden=[secret])
    finally:
        for fd, original in zip((0, 1, 2), saved):
            os.dup2(original, fd)
            os.close(original)
        for fd in (read_end, write_end):
            os.close(fd)
        for f in files:
            f.close()
    cells = result.notebook.cells
    assert result.problem is None
    if sandbox.grader_is_root():  # the link folder was closed once the kernel was up
        assert stat.S_IMODE((tmp_path / "work" / "link").stat().st_mode) == 0o755
    first, held = _texts(cells[1]).splitlines()
    assert first == "preloaded True"
    held = json.loads(held.split(" ", 1)[1])
    assert len(held) > 3 and not any(fd in held for fd in theirs), (held, theirs)
    assert not any("execution" in c.metadata for c in cells)  # no timing metadata
    expected_labels, expected_arrays = _wire.flatten_cases(_registry.make_cases(
        CHECK, seed=checkserver.case_seed(7, cell="test_f", check=CHECK, call=0)))
    _, seed0_arrays = _wire.flatten_cases(_registry.make_cases(CHECK, seed=0))
    assert _digest(expected_arrays) != _digest(seed0_arrays)
    lines = _texts(cells[3]).splitlines()
    assert lines[0] == "record True refused None"
    assert json.loads(lines[1].split(" ", 1)[1]) == expected_labels
    assert lines[2] == f"digest {_digest(expected_arrays)}"
    assert lines[3] == "judged False"
    assert [(v.cell, v.check, v.passed) for v in result.verdicts] == [("test_f", CHECK, False)]
    assert _texts(cells[4]) == "refused True False\n"
    assert [(r.cell, r.check, r.op) for r in result.refusals] == [("cell 4", CHECK, "cases")]
    assert "no graded test cell is running" in result.refusals[0].why
    assert "y" * 100 not in _texts(cells[5])
    assert "more than 4000 characters" in _texts(cells[5])
    assert cells[6].outputs == []
    (error,) = cells[8].outputs
    assert (error.ename, error.evalue, error.traceback) == ("ValueError", "boom", [])
    assert [c.execution_count for c in cells[1:]] == list(range(1, 9))
    assert set(result.cell_seconds) == {"imports", "answer", "test_f", "cell 4", "cell 5",
                                        "cell 6", "cell 7", "cell 8"}
    phases = result.phases
    assert list(phases) == ["kernel_start", "imports", "answer_cells", "test_cells",
                            "other_cells", "kernel_stop"]
    assert phases["kernel_start"] > 0.1 and phases["kernel_stop"] >= 0
    assert all(v == round(v, 3) for v in [*phases.values(), *result.cell_seconds.values()])
    assert sum(phases.values()) == pytest.approx(result.seconds, abs=0.01)
    assert phases["imports"] == pytest.approx(result.cell_seconds["imports"], abs=0.002)
    assert phases["answer_cells"] == pytest.approx(result.cell_seconds["answer"], abs=0.002)
    assert phases["test_cells"] == pytest.approx(result.cell_seconds["test_f"], abs=0.002)
    assert phases["other_cells"] == pytest.approx(
        sum(result.cell_seconds[f"cell {i}"] for i in range(4, 9)), abs=0.005)


@pytest.fixture
def scratch():
    """A fresh folder as grade.py makes one (mkdtemp), which a kernel run without bwrap
    as another user can reach (pytest's tmp_path is private to the grader's user)."""
    folder = Path(tempfile.mkdtemp(prefix="runner-test-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_bwrap
def test_late_cells_are_stopped_and_cells_past_the_deadline_are_not_run(scratch):
    """A cell past its scaled limit is interrupted and says so, the next one runs; a
    cell still running at the hand-in's deadline is stopped there, the rest not run.
    (Without bwrap the kernel's home, and cwd, is the run's own folder.)"""
    nb = _notebook(
        _cell("import os, time\nprint(os.environ['HOME'] == os.getcwd(), os.getcwd())",
              gid="imports"),
        _cell("time.sleep(60)", gid="slow"),
        _cell("print('after')"),
        _cell("time.sleep(60)", gid="long"),
        _cell("print('never')"),
    )
    settings = RunSettings(cell_timeout=60, cell_timeouts={"slow": 1.5, "long": 60},
                           handin_timeout=4, use_bwrap=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = runner.run_notebook(nb, workdir=scratch, settings=settings, cell_checks={})
    cells = result.notebook.cells
    assert result.problem is None
    assert _texts(cells[0]) == f"True {scratch / 'home'}\n"
    (slow,) = [o for o in cells[1].outputs if o.output_type == "error"]
    assert (slow.ename, slow.evalue) == ("CellTimeout",
                                         "the cell ran past its 2 s limit and was stopped")
    assert _texts(cells[2]) == "after\n"
    (late,) = [o for o in cells[3].outputs if o.output_type == "error"]
    assert late.ename == "CellTimeout"
    (never,) = cells[4].outputs
    assert (never.ename, never.evalue) == ("HandinTimeout",
                                           "not run: the hand-in used up its 4 s")
    assert 1.4 < result.cell_seconds["slow"] < 10


def test_a_test_cells_source_never_reaches_the_kernels_input_history(scratch):
    """A student's function called from a test cell cannot read that cell's hidden
    tests from IPython's history (In, _ih, _i), where every other cell's source is."""
    nb = _notebook(
        _cell("import numpy", gid="imports"),
        _cell("def leak():\n    return repr((In, _ih, _i, _ii, _iii))", gid="answer",
              solution=True),
        _cell("seen = leak()\nHIDDEN_MARKER = 1", gid="tests", grade=True),
        _cell("print('HIDDEN_MARKER' in seen, 'def leak' in seen)"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = runner.run_notebook(nb, workdir=scratch, settings=RunSettings(
            use_bwrap=False), cell_checks={})
    assert result.problem is None
    assert _texts(result.notebook.cells[3]) == "False True\n"


@needs_bwrap
def test_a_hand_in_graded_right_after_a_fork_bomb_starts_and_runs(tmp_path):
    """Processes a killed fork bomb leaves behind (still dying, or dead and not yet
    reaped by the host's init) count against their user's process limit. The next
    hand-in graded by the same process must not inherit them: its kernel would
    fail to start its threads and die before the first cell, and every one of its
    cells would score 0. Each run has a user of its own when the grader is root."""
    settings = RunSettings(cell_timeout=30, cell_timeouts={"bomb": 3}, handin_timeout=60,
                           limits=sandbox.Limits(processes=64))
    bomb = _notebook(
        _cell("import os", gid="imports"),
        _cell("while True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
              gid="bomb"))
    honest = _notebook(_cell("import os, threading", gid="imports"),
                       _cell("print(os.getuid(), threading.active_count() > 0)"))
    uids = []
    for round_ in range(2):
        runner.run_notebook(bomb, workdir=tmp_path / f"bomb{round_}", settings=settings,
                            cell_checks={})
        result = runner.run_notebook(honest, workdir=tmp_path / f"next{round_}",
                                     settings=settings, cell_checks={})
        assert result.problem is None, result.problem
        uid, started = _texts(result.notebook.cells[1]).split()
        uids.append(uid)
    if sandbox.grader_is_root():
        assert len(set(uids)) == 2


@needs_bwrap
def test_a_kernel_that_ignores_interrupts_stops_the_run(tmp_path, monkeypatch):
    """The run's problem says a cell ignored the interrupt; later cells are not run;
    the kernel is gone when the run ends, even where no cgroup holds it."""
    monkeypatch.setattr(runner, "_INTERRUPT_GRACE_SECONDS", 1)
    monkeypatch.setattr(sandbox, "_cgroup_v1_dir", lambda controller: None)
    nb = _notebook(
        _cell("import signal", gid="imports"),
        _cell("signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass", gid="spin"),
        _cell("print('never')"),
    )
    settings = RunSettings(cell_timeout=60, cell_timeouts={"spin": 1}, handin_timeout=120)
    result = runner.run_notebook(nb, workdir=tmp_path / "work", settings=settings,
                                 cell_checks={})
    assert result.problem == ("a cell ran past its 1 s and ignored the interrupt; the kernel "
                              "was stopped and later cells were not run")
    assert result.notebook.cells[1].outputs[-1].ename == "CellTimeout"
    assert result.notebook.cells[2].outputs == []
    assert psutil.Process().children(recursive=True) == []


@needs_bwrap
def test_the_watchdog_stops_a_run_past_the_hand_in_s_time(tmp_path, monkeypatch):
    """A run still going handin_timeout + 15 s after it began is killed, with its
    kernel, and the problem says so: here on a machine without cgroups, where only
    the kernel's own process can be killed. (The watchdog fires here once the
    spinning cell has started, whatever the machine's speed.)"""
    monkeypatch.setattr(sandbox, "_cgroup_v1_dir", lambda controller: None)
    started = threading.Event()
    timers = []

    class Watchdog:
        def __init__(self, interval, function):
            self.interval, self.function, self.cancelled = interval, function, False
            timers.append(self)

        def start(self):
            def fire():
                started.wait(60)
                if not self.cancelled:
                    self.function()
            threading.Thread(target=fire, daemon=True).start()

        def cancel(self):
            self.cancelled = True

    close = sandbox.close_link_dir

    def first_cell(link_dir):
        close(link_dir)
        threading.Timer(1.0, started.set).start()

    monkeypatch.setattr(runner, "threading", SimpleNamespace(Timer=Watchdog,
                                                             Event=threading.Event))
    monkeypatch.setattr(sandbox, "close_link_dir", first_cell)
    nb = _notebook(_cell("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                         "while True:\n    pass", gid="imports"), _cell("print('never')"))
    settings = RunSettings(cell_timeout=600, startup_timeout=600, handin_timeout=100)
    result = runner.run_notebook(nb, workdir=tmp_path / "work", settings=settings,
                                 cell_checks={})
    assert [t.interval for t in timers] == [115]
    assert result.problem == "stopped by force after 100 s"
    assert result.notebook.cells[1].outputs == []



def test_a_message_too_large_to_receive_costs_only_its_own_cell_s_output(scratch):
    """One print larger than a message may be (4 MiB) ends ZeroMQ's subscription
    for good; the runner subscribes again, so later cells' outputs still arrive."""
    nb = _notebook(
        _cell("x = 1", gid="imports"),
        _cell(f"print('spam ' * {runner._MAX_ZMQ_MESSAGE_BYTES // 4})"),
        _cell("print('after')"),
        _cell("print('and after')"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = runner.run_notebook(nb, workdir=scratch, settings=RunSettings(
            use_bwrap=False), cell_checks={})
    cells = result.notebook.cells
    assert result.problem is None
    assert "lost the rest of this cell's output" in _texts(cells[1])
    assert "spam" not in _texts(cells[1])
    assert _texts(cells[2]) == "after\n"
    assert _texts(cells[3]) == "and after\n"
