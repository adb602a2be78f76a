"""Run one rebuilt hand-in in a sandboxed kernel and log the trusted verdicts."""

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty

import nbformat
import zmq
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
from nbclient.util import ensure_async
from traitlets import List

from autograder.grading import sandbox
from autograder.grading.checkserver import CheckServer

_KILL_GRACE_SECONDS = 15
_MAX_ERROR_CHARS = 16_000  # one kept error, traceback included
_MAX_ERROR_LINES = 120
# The grader's memory for one kernel's messages stays under about
# _MAX_ZMQ_MESSAGE_BYTES * _MAX_QUEUED_MESSAGES per channel, whatever it sends:
# past that, ZeroMQ drops (iopub) or holds back (shell) the kernel's messages.
_MAX_ZMQ_MESSAGE_BYTES = 4 * 1024**2
_MAX_QUEUED_MESSAGES = 32
_MAX_REPLY_BYTES = 64 * 1024**2
_SEND_TIMEOUT_MS = 5000
_ALWAYS_PROCESSED = {"status", "execute_input"}
_INTERRUPT_GRACE_SECONDS = 10


@dataclass(frozen=True)
class RunSettings:
    """How long and how big one hand-in's run may be.

    cell_timeout: seconds any one cell may run (the first code cell gets
    startup_timeout, since it imports the libraries); cell_timeouts: tighter
    limits for the cells with these grade ids (scaled from the reference
    solution's own times, see grade.scaled_timeouts); handin_timeout: seconds
    for the whole notebook, after which the remaining cells are not run;
    max_output_chars: every byte of output the hand-in sends (streams,
    displays and their updates, widget messages, errors) counts against it;
    past it only one short error per cell is kept.
    """

    cell_timeout: float = 30.0
    cell_timeouts: dict = field(default_factory=dict)  # {grade_id: seconds}
    startup_timeout: float = 120.0
    handin_timeout: float = 300.0
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    use_bwrap: bool | None = None
    max_output_chars: int = 2_000_000


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager that starts its kernel behind a command prefix."""

    command_prefix = List([])

    @property
    def kernel_spec(self):
        # A signal would hit bwrap, not the kernel: ask the kernel to interrupt itself.
        spec = super().kernel_spec
        if spec is not None:
            spec.interrupt_mode = "message"
        return spec

    def format_kernel_cmd(self, extra_arguments=None):
        # The check client is imported before any student code runs, so that
        # a package the hand-in writes to its cwd or sys.path cannot stand in
        # for it, and the recorder keeps the genuine runner to compare with.
        # Its parent is the sandbox's init (pid 1 in there), which ipykernel would
        # take for a dead parent: it dies with the sandbox instead.
        preload = ["--IPKernelApp.exec_lines=['import normref.checks']",
                   "--IPKernelApp.parent_handle=1"]
        return (list(self.command_prefix)
                + super().format_kernel_cmd(list(extra_arguments or []) + preload))

    def client(self, **kwargs):
        # A hostile kernel must not make the grader hold huge or many messages,
        # nor block it on a send. Replies (shell) may be larger than outputs
        # (iopub): a long error's reply must arrive, its iopub twin may not.
        kc = super().client(**kwargs)
        kc.context.setsockopt(zmq.RCVHWM, _MAX_QUEUED_MESSAGES)
        kc.context.setsockopt(zmq.SNDTIMEO, _SEND_TIMEOUT_MS)
        create = kc._create_connected_socket

        def create_bounded(channel, identity=None):
            kc.context.setsockopt(zmq.MAXMSGSIZE, _MAX_REPLY_BYTES if channel == "shell"
                                  else _MAX_ZMQ_MESSAGE_BYTES)
            return create(channel, identity)

        kc._create_connected_socket = create_bounded
        return kc

    def write_connection_file(self, **kwargs):
        # The kernel runs as another, unprivileged user: it must read this file.
        super().write_connection_file(**kwargs)
        os.chmod(self.connection_file, 0o644)


def _error_output(name, message):
    return nbformat.v4.new_output("error", ename=name, evalue=message, traceback=[message])


def _shortened(text, limit):
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


def _short_error(content, *, with_traceback=True):
    """An error output cut to a readable, bounded size (at most _MAX_ERROR_CHARS).

    A hand-in that raises a 100 MB message must not put 100 MB into the graded
    notebook and the feedback page.
    """
    lines = [str(line) for line in content.get("traceback") or []] if with_traceback else []
    if len(lines) > _MAX_ERROR_LINES:
        half = _MAX_ERROR_LINES // 2
        lines = lines[:half] + [f"... [{len(lines) - 2 * half} more lines]"] + lines[-half:]
    budget = _MAX_ERROR_CHARS // 2
    kept = []
    for line in lines:
        line = _shortened(line, max(budget, 200))
        budget -= len(line)
        kept.append(line)
        if budget <= 0:
            kept.append("... [the rest of the traceback was cut]")
            break
    return nbformat.v4.new_output(
        "error", ename=_shortened(content.get("ename", ""), 200),
        evalue=_shortened(content.get("evalue", ""), 2000), traceback=kept)


HIDDEN_TESTS_MARK = "### BEGIN HIDDEN TESTS"
KERNEL_DIED_IN_CELL = ("the kernel died while this cell ran (a crash, such as a "
                       "load or store past the end of a tensor), so the "
                       "cells after it did not run")


class _GradingClient(NotebookClient):
    """nbclient, telling the check server which cell runs, keeping a deadline
    and an output budget that every message of the hand-in counts against."""

    def __init__(self, nb, *, server, settings, on_first_cell, **kwargs):
        super().__init__(nb, **kwargs)
        self.server = server
        self.settings = settings
        self.on_first_cell = on_first_cell
        self.deadline = None
        self.output_chars = 0
        self.output_capped = False
        self.cells_with_error = set()
        self.stopped_because = None
        # The imports allowance goes to the instructor's first code cell, never to
        # a cell the student put before it.
        code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        instructor = [i for i in code if self._grade_id(nb.cells[i])
                      and not nb.cells[i].get("metadata", {}).get("nbgrader", {}).get("solution")]
        self.first_code_index = (instructor or code or [None])[0]
        # From the first hidden test on, the hand-in's code can read the hidden tests
        # (IPython keeps every cell's source) and the checks' inputs: what it shows
        # then must stay in those cells, which the student's page leaves out.
        self.first_hidden_index = next(
            (i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and HIDDEN_TESTS_MARK in c.source), None)
        self.running_index = None
        self.timed_out = {}  # cell index -> its limit, for the cells stopped at it
        self.started_cells = None  # when the first cell started (the kernel is up)
        self.cell_seconds = {}  # {grade_id or "cell N": seconds}
        self.phase_seconds = {"imports": 0.0, "answer_cells": 0.0, "test_cells": 0.0,
                              "other_cells": 0.0}

    def _over_budget(self, msg):
        """Count `msg` against the budget; True once the budget is spent.

        A display with a display_id already shown rewrites every output shown
        under that id (nbclient copies it into each), so it counts once per copy:
        the budget is what the page will show, not what was sent."""
        content = msg.get("content", {})
        copies = 1
        display_id = (content.get("transient") or {}).get("display_id") \
            if isinstance(content, dict) else None
        if display_id in self._display_id_map:
            copies = sum(len(outputs) for outputs in self._display_id_map[display_id].values())
            copies = max(copies, 1) + (msg.get("msg_type") == "display_data")
        self.output_chars += copies * len(json.dumps(content, default=str))
        return self.output_chars > self.settings.max_output_chars

    def _note_cap(self, outs):
        if not self.output_capped:
            self.output_capped = True
            outs.append(nbformat.v4.new_output(
                "stream", name="stdout",
                text="\n[the grader dropped further output: the hand-in sent more than "
                     f"{self.settings.max_output_chars} characters]\n"))

    def process_message(self, msg, cell, cell_index):
        msg_type = msg["msg_type"]
        if msg_type == "status" and msg.get("content", {}).get("execution_state") == "idle":
            self.saw_idle = True
        if msg_type in _ALWAYS_PROCESSED:
            return super().process_message(msg, cell, cell_index)
        over = self._over_budget(msg)
        if msg_type == "error":
            # One short error per cell is always kept: it decides the cell's fate.
            if cell_index in self.cells_with_error:
                return None
            self.cells_with_error.add(cell_index)
            error = _short_error(msg["content"], with_traceback=not over)
            cell.outputs.append(error)
            return error
        if over:
            self._note_cap(cell.outputs)
            return None
        return super().process_message(msg, cell, cell_index)

    def _update_display_id(self, display_id, msg):
        """Update the outputs shown under `display_id`; once a hidden test has run,
        only those in cells from the first hidden test on (an update of a display
        shown earlier would carry what the hidden tests hold to the student's page)."""
        locations = self._display_id_map.get(display_id)
        first = self.first_hidden_index
        if (locations is None or first is None or self.running_index is None
                or self.running_index < first):
            return super()._update_display_id(display_id, msg)
        before = {i: outs for i, outs in locations.items() if i < first}
        self._display_id_map[display_id] = {i: o for i, o in locations.items() if i >= first}
        try:
            return super()._update_display_id(display_id, msg)
        finally:
            self._display_id_map[display_id] = {**before, **self._display_id_map[display_id]}

    async def _async_handle_timeout(self, timeout, cell=None):
        """Interrupt the cell, then find out within a grace period why it is late.

        The kernel's own reply (a KeyboardInterrupt, usually) is the cell's
        reply. A kernel that answers a kernel_info request instead is idle: the
        cell's reply was lost (too large to receive), so the cell fails and the
        run goes on. A kernel that answers nothing ignores interrupts: it is
        stopped, and the cells after this one do not run.
        """
        await self._async_check_alive()
        if cell is not None and cell in self.nb.cells:
            self.timed_out[self.nb.cells.index(cell)] = timeout
        await ensure_async(self.km.interrupt_kernel())
        try:
            probe = self.kc.kernel_info()
        except zmq.ZMQError:  # the kernel cannot even be asked
            probe = None
        deadline = time.monotonic() + _INTERRUPT_GRACE_SECONDS
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=remaining))
            except Empty:
                break
            if msg.get("msg_type") == "execute_reply":
                return msg
            if msg.get("parent_header", {}).get("msg_id") == probe:
                return self._fail_cell(cell, "CellTimeout",
                                       f"the cell ran past its {timeout:.0f} s, or its "
                                       "reply was too large for the grader to receive")
        self._fail_cell(cell, "CellTimeout", f"the cell ran past its {timeout:.0f} s and "
                        "ignored the interrupt: the kernel was stopped")
        self.stopped_because = (f"a cell ran past its {timeout:.0f} s and ignored the "
                                "interrupt; the kernel was stopped and later cells were "
                                "not run")
        raise DeadKernelError(self.stopped_because)

    async def _check_raise_for_error(self, cell, cell_index, exec_reply):
        # An error whose iopub message was too large to receive still fails its cell.
        content = (exec_reply or {}).get("content", {})
        if cell.get("execution_count") is None and content.get("execution_count"):
            cell["execution_count"] = content["execution_count"]  # its iopub twin was lost
        if content.get("status") == "error" and cell_index not in self.cells_with_error:
            self.cells_with_error.add(cell_index)
            cell.outputs.append(_short_error(content))
        return await super()._check_raise_for_error(cell, cell_index, exec_reply)

    async def _reopen_iopub(self, cell):
        """Subscribe again to a kernel whose outputs stopped arriving.

        ZeroMQ ends a subscription for good when one message is larger than
        _MAX_ZMQ_MESSAGE_BYTES (a protocol error, never reconnected): without a
        new one, every later cell would lose its outputs and wait nbclient's
        iopub_timeout for a status it never gets."""
        cell.outputs.append(nbformat.v4.new_output(
            "stream", name="stdout",
            text="\n[the grader lost the rest of this cell's output: the hand-in sent "
                 "more of it, or larger messages, than the grader receives]\n"))
        self.kc.iopub_channel.close()
        self.kc._iopub_channel = None
        iopub = self.kc.iopub_channel
        # A new subscription takes a moment to reach the kernel: wait for the
        # status of a request made after it, so the next cell's outputs are seen.
        probe = self.kc.kernel_info()
        deadline = time.monotonic() + _INTERRUPT_GRACE_SECONDS
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                msg = await ensure_async(iopub.get_msg(timeout=remaining))
            except Empty:
                break
            if msg.get("parent_header", {}).get("msg_id") == probe:
                break

    def _name_the_timeout(self, cell, limit):
        """A cell stopped at its time limit says so, instead of KeyboardInterrupt."""
        message = f"the cell ran past its {limit:.0f} s limit and was stopped"
        cell.outputs = [_error_output("CellTimeout", message)
                        if o.get("output_type") == "error" and o.get("ename") == "KeyboardInterrupt"
                        else o for o in cell.outputs]

    def _fail_cell(self, cell, name, message):
        """Give `cell` one error output (unless it has one); a reply saying so."""
        if cell is not None:
            index = self.nb.cells.index(cell) if cell in self.nb.cells else None
            if index not in self.cells_with_error:
                self.cells_with_error.add(index)
                cell.outputs.append(_error_output(name, message))
        return {"content": {"status": "error", "ename": name, "evalue": message,
                            "traceback": []}}

    @staticmethod
    def _grade_id(cell):
        return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")

    def cell_timeout_for(self, cell):
        remaining = max(1.0, self.deadline - time.monotonic())
        index = self.nb.cells.index(cell) if cell in self.nb.cells else None
        gid = self._grade_id(cell)
        scaled = self.settings.cell_timeouts
        if index == self.first_code_index:
            limit = self.settings.startup_timeout
        elif gid in scaled:
            limit = scaled[gid]
        elif scaled:  # a cell the reference does not have: the longest scaled limit
            limit = min(self.settings.cell_timeout, max(scaled.values()))
        else:
            limit = self.settings.cell_timeout
        return min(limit, remaining)

    def _phase_of(self, cell, cell_index):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell_index == self.first_code_index:
            return "imports"
        if meta.get("grade") and not meta.get("solution"):
            return "test_cells"
        return "answer_cells" if meta.get("solution") else "other_cells"

    async def async_execute_cell(self, cell, cell_index, execution_count=None,
                                 store_history=True):
        if self.deadline is None:
            self.started_cells = time.monotonic()
            self.deadline = self.started_cells + self.settings.handin_timeout
            self.on_first_cell()
        meta = cell.get("metadata", {}).get("nbgrader", {})
        gid = meta.get("grade_id")
        if meta.get("grade") and not meta.get("solution"):
            # A test cell's source (its hidden tests) stays out of the kernel's input
            # history (In, _ih, _i): a student's function it calls could read it there.
            store_history = False
        self.server.current_cell = gid or f"cell {cell_index}"
        self.running_index = cell_index
        if cell.cell_type == "code" and time.monotonic() >= self.deadline:
            cell.outputs = [_error_output(
                "HandinTimeout",
                f"not run: the hand-in used up its {self.settings.handin_timeout:.0f} s")]
            return cell
        began = time.monotonic()
        # nbclient sends no empty cell to the kernel: no status will come for it
        self.saw_idle = cell.cell_type != "code" or not cell.source.strip()
        try:
            try:
                executed = await super().async_execute_cell(cell, cell_index,
                                                            execution_count, store_history)
            except DeadKernelError:
                # The cell may have started (it has an execution count) and shows no
                # error: without one it would read as a cell that ran to its end.
                self._fail_cell(cell, "DeadKernelError", KERNEL_DIED_IN_CELL)
                raise
            if not self.saw_idle and cell_index not in self.timed_out:
                await self._reopen_iopub(cell)
            return executed
        finally:
            self.server.current_cell = None
            if cell_index in self.timed_out:
                self._name_the_timeout(cell, self.timed_out[cell_index])
            if cell.cell_type == "code":
                spent = time.monotonic() - began
                self.cell_seconds[gid or f"cell {cell_index}"] = round(spent, 3)
                self.phase_seconds[self._phase_of(cell, cell_index)] += spent


@dataclass
class RunResult:
    notebook: object
    verdicts: list
    refusals: list  # requests the check server refused
    problem: str | None  # why the run stopped early, if it did
    seconds: float
    phases: dict = field(default_factory=dict)  # seconds: kernel_start, imports, ...
    cell_seconds: dict = field(default_factory=dict)  # {grade_id or "cell N": seconds}


def _why_the_kernel_did_not_start(startup_log):
    """The last line the kernel wrote before it died (its exception), if any."""
    lines = startup_log.read_text(errors="replace")[-4096:].strip().splitlines()
    return f" (the kernel said: {lines[-1][:300]})" if lines else ""


def run_notebook(nb, *, workdir, settings, cell_checks, record_cells=(), seed=0,
                 hidden=()):
    """Execute `nb` (already rebuilt) in a sandboxed kernel.

    workdir: a fresh host folder for this run's sockets and client package
    (the kernel itself writes only to its own tmpfs); cell_checks and
    record_cells: what the check server may serve (see CheckServer); hidden:
    folders the kernel must not see (the course directory).
    """
    uid = sandbox.new_run_uid()
    link_dir, client_dir, host_home = sandbox.prepare_run_dirs(workdir, uid=uid)
    socket_path = link_dir / "grader.sock"
    started = time.monotonic()
    problem = None
    group = sandbox.ResourceGroup(Path(workdir).name, settings.limits)
    home = sandbox.kernel_home(use_bwrap=settings.use_bwrap, host_home=host_home)
    with CheckServer(socket_path, cell_checks=cell_checks, record_cells=record_cells,
                     seed=seed) as server:
        os.chmod(socket_path, 0o666)  # the kernel connects as another user
        km = SandboxedKernelManager(
            kernel_name="python3", transport="ipc", ip=str(link_dir / "kernel"),
            connection_file=str(link_dir / "kernel.json"),
            command_prefix=group.launcher() + sandbox.kernel_prefix(
                link_dir=link_dir, client_dir=client_dir, limits=settings.limits, uid=uid,
                use_bwrap=settings.use_bwrap, hidden=hidden))
        client = _GradingClient(
            nb, server=server, settings=settings,
            on_first_cell=lambda: sandbox.close_link_dir(link_dir),
            km=km, allow_errors=True,
            interrupt_on_timeout=True, startup_timeout=settings.startup_timeout,
            kernel_name="python3", record_timing=False, shutdown_kernel="immediate",
            resources={"metadata": {"path": str(host_home)}})
        client.timeout_func = client.cell_timeout_for
        env = sandbox.kernel_environment(socket_path=socket_path, client_dir=client_dir,
                                         home=home)
        killed = threading.Event()
        startup_log = Path(workdir) / "kernel-stderr"

        def kill_overdue_run():
            # A kernel that ignores interrupts is stopped by force, with its children.
            killed.set()
            group.kill_all()
            process = getattr(km.provisioner, "process", None)
            if process is not None:
                process.kill()

        watchdog = threading.Timer(settings.handin_timeout + _KILL_GRACE_SECONDS,
                                   kill_overdue_run)
        watchdog.start()
        try:
            # The kernel gets none of the grader's open files: not its terminal, not its log.
            # It is stopped when the run ends (nbclient leaves running a kernel whose
            # manager it was given; without cgroups nothing else would stop it).
            # Its standard error goes to a file the grader reads only if the kernel
            # dies before the first cell, when no student code has run.
            with open(startup_log, "wb") as kernel_stderr:
                client.execute(env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=kernel_stderr, cleanup_kc=True)
        except DeadKernelError as exc:
            problem = (f"stopped by force after {settings.handin_timeout:.0f} s"
                       if killed.is_set() else client.stopped_because
                       or f"the kernel died ({exc})")
        except Exception as exc:  # noqa: BLE001 - whatever the kernel sent, a result
            problem = f"the run stopped: {type(exc).__name__}: {str(exc)[:300]}"
            if client.started_cells is None:
                problem += _why_the_kernel_did_not_start(startup_log)
        finally:
            watchdog.cancel()
            group.kill_all()
        verdicts, refusals = list(server.verdicts), list(server.refusals)
    ended = time.monotonic()
    phases = {"kernel_start": round((client.started_cells or ended) - started, 3),
              **{k: round(v, 3) for k, v in client.phase_seconds.items()}}
    phases["kernel_stop"] = round(ended - started - sum(phases.values()), 3)
    return RunResult(nb, verdicts, refusals, problem, ended - started, phases,
                     dict(client.cell_seconds))
