"""Run one rebuilt hand-in in a sandboxed kernel and log the trusted verdicts."""

import json
import os
import threading
import time
from dataclasses import dataclass, field

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
from traitlets import List

from autograder import sandbox
from autograder.checkserver import CheckServer

_KILL_GRACE_SECONDS = 15
_MAX_ERROR_LINE_CHARS = 10_000
_MAX_TRACEBACK_LINES = 200


@dataclass(frozen=True)
class RunSettings:
    """How long and how big one hand-in's run may be.

    cell_timeout: seconds any one cell may run (the first code cell gets
    startup_timeout, since it imports the libraries); handin_timeout: seconds
    for the whole notebook, after which the remaining cells are not run;
    max_output_chars: output kept per hand-in (errors are always kept).
    """

    cell_timeout: float = 30.0
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
        return list(self.command_prefix) + super().format_kernel_cmd(extra_arguments)


def _error_output(name, message):
    return nbformat.v4.new_output("error", ename=name, evalue=message, traceback=[message])


def _shortened(text, limit=_MAX_ERROR_LINE_CHARS):
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


def _shortened_error(msg):
    """A copy of an error message cut to a readable size.

    Errors are kept past the output budget, so a hand-in that raises a 100 MB
    message must not put 100 MB into the graded notebook and the feedback.
    """
    content = dict(msg["content"])
    lines = [_shortened(line) for line in content.get("traceback") or []]
    if len(lines) > _MAX_TRACEBACK_LINES:
        half = _MAX_TRACEBACK_LINES // 2
        lines = lines[:half] + [f"... [{len(lines) - 2 * half} more lines]"] + lines[-half:]
    content.update(ename=_shortened(content.get("ename", ""), 200),
                   evalue=_shortened(content.get("evalue", "")), traceback=lines)
    return {**msg, "content": content}


class _GradingClient(NotebookClient):
    """nbclient, telling the check server which cell runs and keeping a deadline."""

    def __init__(self, nb, *, server, settings, **kwargs):
        super().__init__(nb, **kwargs)
        self.server = server
        self.settings = settings
        self.deadline = None
        self.output_chars = 0
        self.output_capped = False
        self.first_code_index = next(
            (i for i, c in enumerate(nb.cells) if c.cell_type == "code"), None)

    def output(self, outs, msg, display_id, cell_index):
        # Past the hand-in's output budget, only errors are kept: a flood of
        # prints must not fill the grader's memory or the feedback page.
        if msg["msg_type"] != "error":
            self.output_chars += len(json.dumps(msg.get("content", {})))
            if self.output_chars > self.settings.max_output_chars:
                if not self.output_capped:
                    self.output_capped = True
                    outs.append(nbformat.v4.new_output(
                        "stream", name="stdout",
                        text="\n[the grader dropped further output: the hand-in printed "
                             f"more than {self.settings.max_output_chars} characters]\n"))
                return None
        else:
            msg = _shortened_error(msg)
        return super().output(outs, msg, display_id, cell_index)

    def cell_timeout_for(self, cell):
        remaining = max(1.0, self.deadline - time.monotonic())
        index = self.nb.cells.index(cell) if cell in self.nb.cells else None
        limit = (self.settings.startup_timeout if index == self.first_code_index
                 else self.settings.cell_timeout)
        return min(limit, remaining)

    async def async_execute_cell(self, cell, cell_index, execution_count=None,
                                 store_history=True):
        if self.deadline is None:
            self.deadline = time.monotonic() + self.settings.handin_timeout
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        self.server.current_cell = gid or f"cell {cell_index}"
        if cell.cell_type == "code" and time.monotonic() >= self.deadline:
            cell.outputs = [_error_output(
                "HandinTimeout",
                f"not run: the hand-in used up its {self.settings.handin_timeout:.0f} s")]
            return cell
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count,
                                                    store_history)
        finally:
            self.server.current_cell = None


@dataclass
class RunResult:
    notebook: object
    verdicts: list
    problem: str | None  # why the run stopped early, if it did
    seconds: float


def run_notebook(nb, *, workdir, settings, seed=0, hidden=()):
    """Execute `nb` (already rebuilt) in a sandboxed kernel with `workdir` as cwd.

    hidden: folders the kernel must not see (the course directory).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    client_dir = workdir.parent / f"{workdir.name}.client"
    sandbox.write_client_package(client_dir)
    socket_path = workdir / "grader.sock"
    started = time.monotonic()
    problem = None
    group = sandbox.ResourceGroup(f"autograder-{os.getpid()}-{workdir.parent.name}",
                                  settings.limits)
    with CheckServer(socket_path, seed=seed) as server:
        km = SandboxedKernelManager(
            kernel_name="python3", transport="ipc", ip=str(workdir / "kernel"),
            connection_file=str(workdir / "kernel.json"),
            command_prefix=group.prefix() + sandbox.kernel_prefix(
                workdir=workdir, client_dir=client_dir, limits=settings.limits,
                use_bwrap=settings.use_bwrap, hidden=hidden))
        client = _GradingClient(
            nb, server=server, settings=settings, km=km, allow_errors=True,
            interrupt_on_timeout=True, startup_timeout=settings.startup_timeout,
            kernel_name="python3", record_timing=False,
            resources={"metadata": {"path": str(workdir)}})
        client.timeout_func = client.cell_timeout_for
        env = sandbox.kernel_environment(socket_path=socket_path, client_dir=client_dir,
                                         workdir=workdir)
        killed = threading.Event()

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
            client.execute(env=env)
        except DeadKernelError as exc:
            problem = (f"stopped by force after {settings.handin_timeout:.0f} s"
                       if killed.is_set() else f"the kernel died ({exc})")
        except (TimeoutError, RuntimeError) as exc:
            problem = f"the run stopped: {type(exc).__name__}: {exc}"
        finally:
            watchdog.cancel()
            group.kill_all()
        verdicts = list(server.verdicts)
    return RunResult(nb, verdicts, problem, time.monotonic() - started)
