"""Colab opens one notebook at a time, with nothing else from the repository. The first
code cell of every lesson and released assignment sets Colab up: anywhere else it must
do nothing; on Colab it pip-installs what Colab lacks and turns on Colab's widget
manager.

Each cell runs in a fresh interpreter (so the fakes below never touch this one) with
every way of starting a process replaced by a recorder: nothing is ever installed.
"""

import json
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

exec(compile(job["source"], "first cell", "exec"), {"__name__": "__main__"})
print(json.dumps({"calls": calls, "widget_manager": len(widget_manager),
                  "python": sys.executable}))
"""

NOTEBOOKS = LESSONS + RELEASES


def _first_code_cell(path):
    notebook = nbformat.read(path, as_version=4)
    return next(cell.source for cell in notebook.cells if cell.cell_type == "code")


def _run_first_cell(path, *, colab):
    done = subprocess.run(
        [sys.executable, "-c", HARNESS], input=json.dumps(
            {"source": _first_code_cell(path), "colab": colab}),
        capture_output=True, text=True, timeout=120, cwd=path.parent)
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
def test_first_cell_does_nothing_outside_colab(path):
    outcome = _run_first_cell(path, colab=False)
    assert outcome["calls"] == [] and outcome["widget_manager"] == 0


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_first_cell_on_colab_installs_and_enables_widgets(path):
    outcome = _run_first_cell(path, colab=True)
    assert outcome["widget_manager"] == 1, "output.enable_custom_widget_manager() once"
    assert len(outcome["calls"]) == 1, f"one pip install, got {outcome['calls']}"
    (call,) = outcome["calls"]
    assert call["kind"] == "subprocess.run" and call["check"] is True, \
        "a failed install stops the notebook (check=True)"
    requirements = _pip_installs(call, outcome["python"])
    assert requirements is not None, f"`{outcome['python']} -m pip install`, got {call['args']}"

    names = {r.name.lower() for r in requirements}
    expected = {"ipywidgets"}
    if "triton" in _first_code_cell(path):
        expected.add("triton")
    assert names == expected
    pins = _pins()
    for requirement in requirements:
        pin = pins[requirement.name.lower()]  # only student packages
        assert requirement.specifier.contains(pin), \
            f"{requirement} on Colab must allow the course's pin {pin}"
