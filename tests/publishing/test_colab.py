"""Colab opens one notebook at a time, with nothing else from the repository. The first
code cell of every lesson and released assignment sets Colab up: anywhere else it must
do nothing; on Colab it turns on Colab's widget manager and leaves Colab's own
ipywidgets alone (upgrading it there has broken widgets before), installing only what
the runtime lacks (Triton, for unit 07, where the runtime has none).

Each cell runs in a fresh interpreter (so the fakes below never touch this one) with
every way of starting a process replaced by a recorder: nothing is ever installed.
"""

import json
import os
import re
import subprocess
import sys

import nbformat
import pytest
from packaging.requirements import Requirement

from conftest import LESSONS, RELEASES, REPO

# Runs the cell given on stdin; with "colab" true, a fake google.colab is importable.
HARNESS = r"""
import json, os, subprocess, sys, types

job = json.load(sys.stdin)
calls, widget_manager = [], []

def recorder(kind):
    def record(*args, **kwargs):
        command = args[0] if args else kwargs.get("args")
        calls.append({"kind": kind, "args": command if isinstance(command, str)
                      else list(command), "check": kwargs.get("check")})
        return subprocess.CompletedProcess(command, 0, "", "")
    return record

for name in ("run", "call", "check_call", "check_output", "Popen"):
    setattr(subprocess, name, recorder(f"subprocess.{name}"))
os.system = recorder("os.system")

for name in [m for m in sys.modules if m == "google" or m.startswith("google.")]:
    del sys.modules[name]
if job["colab"]:
    google, colab = types.ModuleType("google"), types.ModuleType("google.colab")
    output = types.ModuleType("google.colab.output")
    output.enable_custom_widget_manager = lambda: widget_manager.append(True)
    google.__path__, colab.__path__ = [], []
    google.colab, colab.output = colab, output
    sys.modules.update({"google": google, "google.colab": colab,
                        "google.colab.output": output})

if job.get("hide_triton"):
    sys.modules["triton"] = None  # importlib.util.find_spec("triton") is None
if job.get("cuda") is not None:
    import torch
    torch.cuda.is_available = lambda: job["cuda"]

namespace = {"__name__": "__main__"}
for number, source in enumerate(job["sources"]):
    exec(compile(source, f"code cell {number}", "exec"), namespace)
print(json.dumps({"calls": calls, "widget_manager": len(widget_manager),
                  "python": sys.executable, "device": str(namespace.get("DEVICE")),
                  "triton_interpret": os.environ.get("TRITON_INTERPRET")}))
"""

NOTEBOOKS = LESSONS + RELEASES


def _code_cells(path, count=1):
    notebook = nbformat.read(path, as_version=4)
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"][:count]


def _first_code_cell(path):
    return _code_cells(path)[0]


def _run_first_cell(path, *, colab, cells=1, **job):
    done = subprocess.run(
        [sys.executable, "-c", HARNESS], input=json.dumps(
            {"sources": _code_cells(path, cells), "colab": colab, **job}),
        capture_output=True, text=True, timeout=300, cwd=path.parent,
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _pins():
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            pins[requirement.name.lower()] = next(iter(requirement.specifier)).version
    return pins


def _pip_installs(call, python):
    """The requirements of `python -m pip install [options] REQ...` (pip of the
    kernel's own interpreter), or None if the call is not one."""
    args = call["args"]
    if isinstance(args, str) or args[:4] != [python, "-m", "pip", "install"]:
        return None
    return [Requirement(arg) for arg in args[4:] if not arg.startswith("-")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_notebook_opens_on_its_title_then_the_colab_cell(path):
    """The README's "run the first code cell" holds everywhere: the title cell, in one
    style ("# Lesson 01: ..." or "# Assignment 01: ..."), then the Colab cell."""
    cells = nbformat.read(path, as_version=4).cells
    kind = "Lesson" if path.parent.name == "notebooks" else "Assignment"
    number = path.name[:2]
    assert cells[0].cell_type == "markdown"
    assert re.match(rf"# {kind} {number}: \S", cells[0].source), cells[0].source[:80]
    assert cells[1].cell_type == "code" and "google.colab" in cells[1].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_first_cell_does_nothing_outside_colab(path):
    outcome = _run_first_cell(path, colab=False)
    assert outcome["calls"] == [] and outcome["widget_manager"] == 0


def _triton_pin_allowed(requirement):
    return requirement.specifier.contains(_pins()["triton"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_first_cell_on_colab_enables_widgets_and_installs_nothing_colab_has(path):
    outcome = _run_first_cell(path, colab=True)
    assert outcome["widget_manager"] == 1, "output.enable_custom_widget_manager() once"
    assert outcome["calls"] == [], \
        f"Colab's ipywidgets, PyTorch and Triton stay as they are, got {outcome['calls']}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_first_cell_on_colab_without_triton_installs_triton_alone(path):
    outcome = _run_first_cell(path, colab=True, hide_triton=True)
    assert outcome["widget_manager"] == 1
    if "triton" not in _first_code_cell(path):
        assert outcome["calls"] == []
        return
    assert len(outcome["calls"]) == 1, f"one pip install, got {outcome['calls']}"
    (call,) = outcome["calls"]
    assert call["kind"] == "subprocess.run" and call["check"] is True, \
        "a failed install stops the notebook (check=True)"
    requirements = _pip_installs(call, outcome["python"])
    assert requirements is not None, f"`{outcome['python']} -m pip install`, got {call['args']}"
    assert [r.name.lower() for r in requirements] == ["triton"], "never ipywidgets"
    assert _triton_pin_allowed(requirements[0]), \
        f"{requirements[0]} on Colab must allow the course's pin"


KERNEL_LESSON = REPO / "notebooks" / "07_fused_kernel_lesson.ipynb"


@pytest.mark.parametrize("cuda", [True, False], ids=["gpu-runtime", "cpu-runtime"])
def test_lesson_07_on_colab_compiles_on_a_gpu_and_interprets_on_a_cpu(cuda):
    """The first two code cells (Colab set-up, then the imports that choose where the
    kernels run) on a Colab runtime with and without a CUDA GPU."""
    outcome = _run_first_cell(KERNEL_LESSON, colab=True, cells=2, cuda=cuda)
    assert outcome["calls"] == [] and outcome["widget_manager"] == 1
    if cuda:
        assert outcome["device"] == "cuda"
        assert outcome["triton_interpret"] is None, "compiled kernels, not the interpreter"
    else:
        assert outcome["device"] == "cpu" and outcome["triton_interpret"] == "1"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_only_unit_07_asks_for_a_gpu_runtime_and_says_so_under_its_title(path):
    """A student on Colab learns which runtime to choose before running anything: the
    title cell of unit 07's lesson and assignment says that this unit alone needs a
    GPU runtime, and where Colab sets it; no other notebook asks for one."""
    title = " ".join(nbformat.read(path, as_version=4).cells[0].source.split())
    asks = "choose a GPU runtime" in title
    assert asks == path.name.startswith("07_"), title[:300]
    if asks:
        assert "*Runtime > Change runtime type > GPU*" in title
        assert "the only unit of the course that needs one" in title
