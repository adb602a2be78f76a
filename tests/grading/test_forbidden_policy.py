"""The forbidden-call policy and the static flags, pinned to what they report.

Each test fails on a small bug in autograder/grading/forbidden.py (`make mutation`),
among them a scan that forgets the names the instructor's cells import: a
self-made notebook whose instructor cell imports `torch.nn.functional as F`
and whose answer calls `F.group_norm` must break a policy that forbids it.
"""

import contextlib
import io
import json

import nbformat
import numpy as np
import pytest
import torch

from autograder.grading import forbidden
from normref.checks import _registry, _runner

# --- a self-made assignment: one GroupNorm exercise, its policy, its check -----------------

RULE = "While the grader calls your group_norm, it must not call torch's group norm."
POLICY = {"cells": {"gn_answer": {"rule": RULE,
                                  "forbidden": ["torch.*group_norm*", "aten::*group_norm*"]}}}
INSTRUCTOR = "import torch\nimport torch.nn.functional as F\n"
ALIASED = "def group_norm(x, groups):\n    return F.group_norm(x, groups)\n"
HONEST = ("def group_norm(x, groups):\n"
          "    g = x.reshape(x.shape[0], groups, -1)\n"
          "    mean = g.mean(-1, keepdim=True)\n"
          "    var = g.var(-1, unbiased=False, keepdim=True)\n"
          "    return ((g - mean) / torch.sqrt(var + 1e-5)).reshape(x.shape)\n")


def _notebook(answer):
    def meta(**nbgrader):
        return {"nbgrader": {"schema_version": 3, **nbgrader}}

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(INSTRUCTOR, metadata=meta(grade=False, solution=False,
                                                            locked=True, grade_id="setup")),
        nbformat.v4.new_code_cell(answer, metadata=meta(grade=False, solution=True,
                                                        locked=False, grade_id="gn_answer")),
    ]
    return nb


def _split(nb):
    """(student cells, instructor cells), as the grader splits a merged hand-in."""
    student, context = [], []
    for cell in nb.cells:
        (student if cell.metadata["nbgrader"]["solution"] else context).append(cell.source)
    return student, context


def _gn_cases(rng):
    return [("two groups", {"x": rng.standard_normal((2, 4, 3)), "groups": np.array(2)})]


def _gn_judge(case, output):
    x = case["x"].reshape(2, int(case["groups"]), -1)
    ref = ((x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5))
    return None if np.allclose(output["y"], ref.reshape(case["x"].shape), atol=1e-4) else "no"


def _gn_probe(subject, case):
    return {"y": subject(torch.from_numpy(case["x"]), int(case["groups"]))}


@pytest.fixture
def gn_check(monkeypatch):
    monkeypatch.setattr(_registry, "_all_checks",
                        lambda: {"gn": _registry.Check(_gn_cases, _gn_judge)})


def _violations(nb, tmp_path):
    """Run the notebook's cells in-process, the check on its answer; what the policy says."""
    (tmp_path / "07_groups.json").write_text(json.dumps(POLICY))
    namespace = {}
    for cell in nb.cells:
        exec(cell.source, namespace)
    with contextlib.redirect_stdout(io.StringIO()):
        _runner.run_check("gn", namespace["group_norm"], _gn_probe)
    assert _runner.last_recorder_intact is True
    policy = forbidden.load_policy("07_groups", tmp_path)
    return forbidden.executed_violations(policy["gn_answer"], _runner.last_executed)


def test_f_group_norm_through_the_instructors_alias_breaks_the_policy(gn_check, tmp_path):
    used = _violations(_notebook(ALIASED), tmp_path)
    assert "torch.nn.functional.group_norm" in used, used
    assert all(forbidden.pattern_matches("torch.*group_norm*", n)
               or forbidden.pattern_matches("aten::*group_norm*", n) for n in used)


def test_an_honest_group_norm_breaks_nothing(gn_check, tmp_path):
    assert _violations(_notebook(HONEST), tmp_path) == []


def test_replacing_f_group_norm_is_flagged_through_the_instructors_alias():
    nb = _notebook(HONEST + "F.group_norm = group_norm\n")
    student, context = _split(nb)
    assert forbidden.static_flags(student, context_code=context) == [
        "Student cell 1 ('def group_norm(x, groups):') replaces "
        "torch.nn.functional.group_norm, an attribute of an imported module."]
    reads = ["table = F.__dict__\n"]
    assert forbidden.static_flags(reads, context_code=context) == [
        "Student cell 1 ('table = F.__dict__') reads torch.nn.functional.__dict__, "
        "a module's names by string."]
    # Without the instructor's cells F is nobody's alias: nothing to flag.
    assert forbidden.static_flags(student) == []


def test_an_alias_of_a_later_student_cell_counts_too():
    assert forbidden.static_flags(["F.x = 1", "import torch.nn.functional as F"]) == [
        "Student cell 1 ('F.x = 1') replaces torch.nn.functional.x, "
        "an attribute of an imported module."]


def test_an_instructor_cell_that_does_not_parse_is_skipped():
    assert forbidden.static_flags(["F.x = 1"], context_code=["def (:", INSTRUCTOR]) == [
        "Student cell 1 ('F.x = 1') replaces torch.nn.functional.x, "
        "an attribute of an imported module."]
    assert forbidden.static_flags(["def (:", "x = 1"]) == []


# --- policies -------------------------------------------------------------------------------


def test_a_policy_gives_its_patterns_and_its_rules(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(
        {"cells": {"one": {"rule": "R.", "forbidden": ["torch.x"]}, "two": {}}}))
    assert forbidden.policy_path("a", tmp_path) == tmp_path / "a.json"
    assert forbidden.load_policy("a", tmp_path) == {"one": ["torch.x"], "two": []}
    assert forbidden.load_rules("a", tmp_path) == {"one": "R.", "two": ""}


def test_the_old_shape_and_a_missing_file(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"forbidden": {"a": ["torch.x", "y"]}}))
    assert forbidden.load_policy("old", tmp_path) == {"a": ["torch.x", "y"]}
    assert forbidden.load_rules("old", tmp_path) == {"a": ""}
    (tmp_path / "empty.json").write_text("{}")
    assert forbidden.load_policy("empty", tmp_path) == {}
    assert forbidden.load_policy("absent", tmp_path) == {}
    assert forbidden.load_rules("absent", tmp_path) == {}


def test_the_course_policies_live_in_the_package():
    assert forbidden.policy_path("x") == forbidden.POLICIES_DIR / "x.json"
    assert forbidden.POLICIES_DIR.name == "policies"


@pytest.mark.parametrize("pattern, name, matches", [
    ("autograd", "autograd", True),
    ("autograd", "autograds", False),
    ("torch.autograd", "torch.autograd.grad", True),
    ("torch.autograd", "torch.autograd_extra", False),
    ("torch.autograd.grad", "torch.autograd", False),
    ("aten::native_layer_norm", "aten::native_layer_norm.default", True),
    ("aten::native_layer_norm", "aten::native_layer_norm_backward", False),
    ("aten", "aten::add", True),
    ("aten::*batch_norm*", "aten::_native_batch_norm_legit", True),
    ("aten::*batch_norm*", "torch.batch_norm", False),
    ("torch.*layer_norm*", "torch.nn.functional.layer_norm", True),
    ("torch.?n", "torch.nn", True),
    ("torch.[mn]n", "torch.nn", True),
    ("torch.[m]n", "torch.nn", False),
    ("Torch.*", "torch.nn", False),
])
def test_pattern_matching(pattern, name, matches):
    assert forbidden.pattern_matches(pattern, name) is matches


def test_executed_violations_are_sorted_and_distinct():
    executed = ["torch.b.x", "aten::a", "torch.b.x", "torch.c", "autograd"]
    assert forbidden.executed_violations(["torch.b", "aten::*"], executed) == [
        "aten::a", "torch.b.x"]
    assert forbidden.executed_violations(iter(["torch.c", "autograd"]), executed) == [
        "autograd", "torch.c"]
    assert forbidden.executed_violations([], executed) == []


# --- static flags ---------------------------------------------------------------------------


@pytest.mark.parametrize("code, endings", [
    ("import torch.nn.functional as F\nf = getattr(F, 'layer' + '_norm')",
     ['calls getattr with a computed attribute name.']),
    ('import torch\nsetattr(torch.nn.functional, name, f)',
     ['calls setattr with a computed attribute name.']),
    ('delattr(obj, name)',
     ['calls delattr with a computed attribute name.']),
    ('hasattr(obj, name)',
     ['calls hasattr with a computed attribute name.']),
    ('getattr(self, name)',
     ['calls getattr with a computed attribute name.']),
    ('def f(self, name):\n    return getattr(self, name)',
     []),
    ('class A:\n    @classmethod\n    def f(cls, name):\n        return getattr(cls, name)',
     []),
    ('def f(self):\n    return self._cache',
     []),
    ('class A:\n    def f(self):\n        return super()._impl()',
     []),
    ('getattr(cls, name)',
     ['calls getattr with a computed attribute name.']),
    ("getattr(obj, 'x')",
     []),
    ('getattr(obj)',
     []),
    ("exec('y = 1')",
     ['uses exec, which runs code built from a string.']),
    ("y = eval('1 + 1')",
     ['uses eval, which runs code built from a string.']),
    ("code = compile('1', 'x', 'eval')",
     ['uses compile, which runs code built from a string.']),
    ("m = __import__('torch.nn.' + 'functional')",
     ['calls __import__ with a computed module name.']),
    ("m = __import__('ctypes')",
     ["imports ctypes, which can change the interpreter's memory."]),
    ("m = __import__('math')",
     []),
    ("import importlib\nF = importlib.import_module('torch.nn.functional')",
     ['imports importlib, which can import modules by computed names.']),
    ('import importlib\nF = importlib.import_module(name)',
     ['imports importlib, which can import modules by computed names.']),
    ('from importlib import import_module',
     ['imports importlib, which can import modules by computed names.']),
    ("import torch.nn.functional as F\nf = F.__dict__['layer_norm']",
     ["reads torch.nn.functional.__dict__, a module's names by string."]),
    ('class A: pass\nd = A.__dict__',
     ["reads .__dict__, which reaches into the interpreter's internals."]),
    ("import torch.nn.functional as F\nf = vars(F)['layer_norm']",
     ['calls vars(), which looks names up by string.']),
    ('v = vars()',
     ['calls vars(), which looks names up by string.']),
    ('v = vars(obj)',
     []),
    ("f = globals()['layer_norm']",
     ['uses globals(), which looks names up by string.']),
    ('f = locals()',
     ['uses locals(), which looks names up by string.']),
    ('b = __builtins__',
     ['reaches into __builtins__.']),
    ('import gc',
     ['imports gc, which can reach any object.']),
    ('import ctypes',
     ["imports ctypes, which can change the interpreter's memory."]),
    ('import builtins',
     ["imports builtins, which can replace Python's own functions."]),
    ('import ctypes.util',
     ["imports ctypes, which can change the interpreter's memory."]),
    ("import sys\nsys.modules['torch.nn.functional'] = None",
     ['edits sys.modules.', 'uses sys.modules, which reaches into the interpreter.']),
    ("import sys\ndel sys.modules['torch']",
     ['edits sys.modules.', 'uses sys.modules, which reaches into the interpreter.']),
    ("import sys\nsys.modules.pop('torch')",
     ['edits sys.modules.', 'uses sys.modules, which reaches into the interpreter.']),
    ('import sys\nsys.modules.update({})',
     ['edits sys.modules.', 'uses sys.modules, which reaches into the interpreter.']),
    ("import sys\nm = sys.modules['torch.nn.' + 'functional']",
     ['looks up sys.modules by a computed name.',
      'uses sys.modules, which reaches into the interpreter.']),
    ("import sys\nm = sys.modules['torch']",
     ['uses sys.modules, which reaches into the interpreter.']),
    ('import sys\nm = sys.modules.get(name)',
     ['looks up sys.modules by a computed name.',
      'uses sys.modules, which reaches into the interpreter.']),
    ("import sys\nm = sys.modules.get('torch')",
     ['uses sys.modules, which reaches into the interpreter.']),
    ('import sys\nm = sys.modules.keys()',
     ['uses sys.modules, which reaches into the interpreter.']),
    ('import torch\nwith torch._C.DisableTorchFunction():\n    pass',
     ['uses torch._C, a private part of torch.']),
    ('import torch\nx = torch._C._nn.layer_norm',
     ['uses torch._C, a private part of torch.']),
    ('from torch import _C',
     ['imports torch._C, a private part of torch.']),
    ('from torch import nn',
     []),
    ('from torch._C import _nn',
     ['imports torch._C, a private part of torch.']),
    ("import torch\nlib = torch.library.Library('aten', 'IMPL')",
     ['uses torch.library, a private part of torch.']),
    ('from torch.overrides import _pop_mode',
     ['imports torch.overrides, a private part of torch.']),
    ('import torch.utils._python_dispatch as d',
     ['imports torch.utils._python_dispatch, a private part of torch.']),
    ('from normref.checks import _runner',
     ["imports normref.checks, the grader's own package."]),
    ('import normref',
     ["imports normref, the grader's own package."]),
    ('import normrefx',
     ["imports normrefx, which is outside the course's libraries."]),
    ('try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    frame = e.__traceback__.tb_frame',
     ["reads .tb_frame, which reaches into the interpreter's internals.",
      "reads .__traceback__, which reaches into the interpreter's internals."]),
    ('f = g.__globals__',
     ["reads .__globals__, which reaches into the interpreter's internals."]),
    ('c = f.__code__',
     ["reads .__code__, which reaches into the interpreter's internals."]),
    ('x = o.cell_contents',
     ["reads .cell_contents, which reaches into the interpreter's internals."]),
    ('s = object.__subclasses__()',
     ["reads .__subclasses__, which reaches into the interpreter's internals."]),
    ('import threading\nthreading.Thread(target=print).start()',
     ['imports threading, which runs code outside the graded call.']),
    ("import os\nos.system('ls')",
     ["imports os, which is outside the course's libraries.",
      'uses os.system, which runs code outside the graded call.']),
    ("import os\nos.path.join('a')",
     ["imports os, which is outside the course's libraries."]),
    ('from os import system',
     ["imports os, which is outside the course's libraries.",
      'imports os.system, which runs code outside the graded call.']),
    ('from os import path',
     ["imports os, which is outside the course's libraries."]),
    ("import subprocess\nsubprocess.run(['ls'])",
     ['imports subprocess, which runs code outside the graded call.']),
    ('from concurrent.futures import ThreadPoolExecutor',
     ['imports concurrent.futures, which runs code outside the graded call.']),
    ('import sys\nsys.settrace(None)',
     ['uses sys.settrace, which reaches into the interpreter.']),
    ('from sys import _getframe',
     ['imports sys._getframe, which reaches into the interpreter.']),
    ('import inspect\ninspect.currentframe()',
     ["imports inspect, which is outside the course's libraries.",
      'uses inspect.currentframe, which reaches into the interpreter.']),
    ('import inspect\nf = inspect.stack',
     ["imports inspect, which is outside the course's libraries.",
      'uses inspect.stack, which reaches into the interpreter.']),
    ('from inspect import signature',
     ["imports inspect, which is outside the course's libraries."]),
    ('import torch\ntorch.nn.functional.layer_norm = print',
     ['replaces torch.nn.functional.layer_norm, an attribute of an imported module.']),
    ('import torch\ndel torch.nn.functional.layer_norm',
     ['replaces torch.nn.functional.layer_norm, an attribute of an imported module.']),
    ('obj.attr = 1',
     []),
    ('o.__getattribute__(name)',
     ['calls __getattribute__ with a computed attribute name.',
      "reads .__getattribute__, which reaches into the interpreter's internals."]),
    ('o.__getattr__(name)',
     ['calls __getattr__ with a computed attribute name.',
      "reads .__getattr__, which reaches into the interpreter's internals."]),
    ("o.__getattribute__('x')",
     ["reads .__getattribute__, which reaches into the interpreter's internals."]),
    ('import operator\nf = operator.attrgetter(name)',
     ['calls operator.attrgetter with a computed attribute name.']),
    ("import operator\nf = operator.attrgetter('x')",
     []),
    ('import operator\nf = operator.methodcaller(name)',
     ['calls operator.methodcaller with a computed attribute name.']),
    ("%%time\nimport torch.nn.functional as F\ny = getattr(F, 'layer' + '_norm')(x, (4,))\n",
     ['calls getattr with a computed attribute name (inside %%time).']),
    ("%%timeit -n 3\nexec('y = layer_norm(x)')\n",
     ['uses exec, which runs code built from a string (inside %%timeit).']),
    ("%%timeit -n 3 exec('1')\nx = 1\n",
     ["uses exec, which runs code built from a string (inside %%timeit's setup line)."]),
    ("%%timeit -r 2 -q exec('1')\nx = 1\n",
     ["uses exec, which runs code built from a string (inside %%timeit's setup line)."]),
    ('%%capture out\nimport normref\n',
     ["imports normref, the grader's own package (inside %%capture)."]),
    ("%%prun\nexec('1')\n",
     ['uses exec, which runs code built from a string (inside %%prun).']),
    ("%%debug\nexec('1')\n",
     ['uses exec, which runs code built from a string (inside %%debug).']),
    ("%time y = eval('f(x)')\n",
     ['uses eval, which runs code built from a string (inside %time).']),
    ("%timeit -n 5 -r 2 eval('1')\n",
     ['uses eval, which runs code built from a string (inside %timeit).']),
    ("%timeit -q eval('1')\n",
     ['uses eval, which runs code built from a string (inside %timeit).']),
    ("%prun eval('1')\n",
     ['uses eval, which runs code built from a string (inside %prun).']),
    ("%debug eval('1')\n",
     ['uses eval, which runs code built from a string (inside %debug).']),
    ('%time\n',
     []),
    ('!ls\nx = 1\n',
     ['runs the shell command !ls.']),
    ('files = !ls -l\n',
     ['runs the shell command !ls -l.']),
    ('%%bash\necho hi\n',
     ["uses the cell magic %%bash, which runs something other than this kernel's Python."]),
    ('%%writefile helper.py\nimport torch\n',
     ["uses the cell magic %%writefile, which runs something other than this kernel's Python."]),
    ('%run helper.py\n',
     ['uses the line magic %run helper.py.']),
    ('%load helper.py\n',
     ['uses the line magic %load helper.py.']),
    ('%cd /\n',
     ['uses the line magic %cd /.']),
    ('%matplotlib inline\n',
     []),
    ('%who\n',
     []),
    ("%config InlineBackend.figure_format = 'svg'\n",
     []),
    ("get_ipython().run_cell('x = 1')",
     ['calls get_ipython(), which can run magics and shell commands.']),
    ("get_ipython().run_line_magic(name, '')",
     ['calls get_ipython().run_line_magic with computed arguments.']),
    ("get_ipython().run_cell_magic('time', '', 'exec(1)')",
     ['uses exec, which runs code built from a string (inside %%time).']),
    ("get_ipython().system('ls')",
     ['runs the shell command !ls.']),
    ("get_ipython().getoutput('ls')",
     ['runs the shell command !ls.']),
    ('get_ipython().run_line_magic()',
     ['calls get_ipython().run_line_magic with computed arguments.']),
    ('%%time\n\n',
     []),
    ('%%time\ndef f(:\n',
     ['holds code in %%time that could not be read.']),
    ('import torch as T\nx = T._C',
     ['uses torch._C, a private part of torch.']),
    ('import torch._C as C',
     ['imports torch._C, a private part of torch.']),
    ('from torch import library',
     ['imports torch.library, a private part of torch.']),
    ('from multiprocessing import Pool',
     ['imports multiprocessing, which runs code outside the graded call.']),
    ('import pty',
     ['imports pty, which runs code outside the graded call.']),
    ('def f(:\n',
     []),
    ('x = 1',
     []),
    ('from . import x',
     ["imports from a relative package, which is outside the course's libraries."]),
    ('from .mod import _C',
     ["imports from a relative package, which is outside the course's libraries."]),
    ('e.__traceback__',
     ["reads .__traceback__, which reaches into the interpreter's internals."]),
    ('f.f_back',
     ["reads .f_back, which reaches into the interpreter's internals."]),
    ('g.gi_frame',
     ["reads .gi_frame, which reaches into the interpreter's internals."]),
    ('setattr(A, "__call__", f)',
     ["sets .__call__, which changes how Python treats the object."]),
    ('delattr(A, "__init__")',
     ["sets .__init__, which changes how Python treats the object."]),
    ('getattr(A, "__call__")',
     []),
    ('node = loss.grad_fn',
     ["reads .grad_fn, autograd's graph, whose nodes compute gradients without the "
      "autograd engine."]),
    ('for parent, _ in node.next_functions:\n    parent(g)',
     ["reads .next_functions, autograd's graph, whose nodes compute gradients without the "
      "autograd engine."]),
    # a custom autograd.Function's context holds what the student saved, no graph node
    ('class F(torch.autograd.Function):\n    @staticmethod\n    def backward(ctx, dy):\n'
     '        x, rstd = ctx.saved_tensors\n        return dy * rstd',
     []),
    ('def grads(node):\n    return node.saved_tensors',
     ["reads .saved_tensors, autograd's graph, whose nodes compute gradients without the "
      "autograd engine."]),
    ('class F(torch.autograd.Function):\n    @staticmethod\n    def backward(ctx, dy):\n'
     '        return dy.grad_fn.saved_tensors',
     ["reads .saved_tensors, autograd's graph, whose nodes compute gradients without "
      "the autograd engine.", "reads .grad_fn, autograd's graph, whose nodes compute "
      "gradients without the autograd engine."]),
])

def test_each_construct_gets_its_sentence(code, endings):
    flags = forbidden.static_flags([code])
    assert len(flags) == len(endings), flags
    for flag, ending in zip(flags, endings):
        assert flag.startswith("Student cell 1") and flag.endswith(" " + ending), flags


@pytest.mark.parametrize("code, endings", [
    # another library's module reached as an attribute of a course library is read as
    # that module, flagged once where the chain leaves the course's libraries
    ("import torch\ne = torch.os.environ",
     ["reaches os through torch.os, which is outside the course's libraries."]),
    ("import torch\np = torch.os.path.join",
     ["reaches os through torch.os, which is outside the course's libraries."]),
    ("import torch\ntorch.os.system('ls')",
     ["uses os.system, which runs code outside the graded call.",
      "reaches os through torch.os, which is outside the course's libraries."]),
    ("from torch import os as o\no.system('x')",
     ["reaches os through torch.os, which is outside the course's libraries.",
      "uses os.system, which runs code outside the graded call."]),
    ("import torch.nn.functional as F\nx = F.torch.os.getcwd",
     ["reaches os through torch.nn.functional.torch.os, which is outside the course's "
      "libraries."]),
    ("import torch\nx = torch.serialization.os",
     ["reaches os through torch.serialization.os, which is outside the course's libraries."]),
    ("import torch\nimport importlib\nx = torch.importlib",
     ["imports importlib, which can import modules by computed names.",
      "reaches importlib through torch.importlib, which is outside the course's libraries.",
      "uses importlib, which can import modules by computed names."]),
    # ... and a course library's own module reached so is read as itself
    ("import torch\nm = torch.sys.modules",
     ["uses sys.modules, which reaches into the interpreter."]),
    ("import torch\nx = torch.nn.modules.module.torch._C",
     ["uses torch.nn.modules.module.torch._C, a private part of torch."]),
    # private names of the course's libraries, and of sys and os
    ("import numpy as np\nx = np._core", ["uses numpy._core, a private part of numpy."]),
    ("import numpy.linalg as la\nx = la._umath_linalg",
     ["uses numpy.linalg._umath_linalg, a private part of numpy."]),
    ("import os\nx = os._exit", ["imports os, which is outside the course's libraries.",
                                 "uses os._exit, a private part of os."]),
    ("import sys\nf = sys._getframe", ["uses sys._getframe, which reaches into the interpreter."]),
])
def test_a_module_reached_through_a_course_library_is_read_as_itself(code, endings):
    """`torch.os` is os: what a course library's attribute leads to is judged as that
    module (flagged where the chain leaves the course's libraries), and private names
    are named with their library."""
    label = f"Student cell 1 ({code.splitlines()[0]!r}) "
    assert forbidden.static_flags([code]) == [label + ending for ending in endings]


@pytest.mark.parametrize("code, endings", [
    ("breakpoint()", ["calls breakpoint(), which runs a debugger's commands."]),
    ("f = open", ["passes open around, so what it reaches is decided at run time."]),
    ("v = vars", ["passes vars around, so what it reaches is decided at run time."]),
    ("i = __import__", ["passes __import__ around, so what it reaches is decided at run time."]),
    ("open(name)", ["opens a file named at run time or a system file."]),
    ("open('/proc/self/mem')", ["opens a file named at run time or a system file."]),
    ("open('notes.txt')", []),
    # a dunder is __name__ with at least one letter inside: x__ and ____ are not
    ("y = obj.x__", []),
    ("y = obj.____", ["reads .____, a private name of an object that is not its own."]),
    ("y = obj.__a__", ["reads .__a__, which reaches into the interpreter's internals."]),
    ("obj.__a__ = 1", ["sets .__a__, which changes how Python treats the object."]),
    ("y = getattr(obj, '__a__')",
     ["reads .__a__, which reaches into the interpreter's internals."]),
    ("x = __name__", []),
    ("y = __spec__", ["uses __spec__, one of the interpreter's own names."]),
    ("import operator\ng = operator.attrgetter('a.__globals__')",
     ["reads .__globals__, which reaches into the interpreter's internals."]),
    ("import operator\ng = operator.attrgetter('a.b')", []),
    # a name a library does not have is no module: nothing to flag, nothing to crash on
    ("import torch\nx = torch.not_a_thing.y", []),
    ("import torch.utils.cpp_extension",
     ["imports torch.utils.cpp_extension, which loads or compiles code the grader cannot "
      "read."]),
    ("import numpy._core", ["imports numpy._core, a private part of numpy."]),
    ("from numpy import _core", ["uses numpy._core, a private part of numpy."]),
    ("from torch.nn import functional\nfunctional._private_thing",
     ["uses torch.nn.functional._private_thing, a private part of torch."]),
    ("from sys import modules", ["uses sys.modules, which reaches into the interpreter."]),
    ("from torch.nn.functional import layer_norm", []),
    ("from torch.nn import _reduction", ["uses torch.nn._reduction, a private part of torch."]),
    ("from torch.utils.cpp_extension import load",
     ["imports torch.utils.cpp_extension, which loads or compiles code the grader cannot "
      "read."]),
    # `self` outside a method is no object's own
    ("def f():\n    return self._x",
     ["reads ._x, a private name of an object that is not its own."]),
    # an alias made in any order, however many steps away from the import
    ("import torch\nC = B._C\nB = A\nA = torch", ["uses torch._C, a private part of torch."]),
])
def test_more_constructs_get_their_sentences(code, endings):
    label = forbidden._label(1, code)
    assert forbidden.static_flags([code]) == [f"{label} {ending}" for ending in endings]


@pytest.mark.parametrize("code, endings", [
    ("def check_token_mean():\n    pass",
     ["defines check_token_mean, the name of one of the grader's checks."]),
    ("class check_token_mean:\n    pass",
     ["defines check_token_mean, the name of one of the grader's checks."]),
    ("check_token_mean = print",
     ["rebinds check_token_mean, the name of one of the grader's checks."]),
    ("x = check_token_mean.__wrapped__",
     ["reads .__wrapped__, which reaches into the interpreter's internals.",
      "reaches inside check_token_mean, one of the grader's checks."]),
    ("y = check_token_mean.cases",
     ["reaches inside check_token_mean, one of the grader's checks."]),
    ("get_ipython().run_cell_magic('time', '', 'check_token_mean = 1')",
     ["rebinds check_token_mean, the name of one of the grader's checks (inside %%time)."]),
    ("check_token_mean(token_mean)", []),
])
def test_the_checks_the_instructors_cells_import_may_be_called_not_touched(code, endings):
    """The instructor's cells import the grader's checks (from normref.checks import
    check_...): a student's cell may call one, and is flagged for defining, rebinding or
    reaching inside one, magics included."""
    label = forbidden._label(1, code)
    found = forbidden.static_flags(
        [code], context_code=["from normref.checks import check_token_mean"])
    assert found == [f"{label} {ending}" for ending in endings]


def test_only_operators_of_namespaces_torch_does_not_define_are_unrecordable():
    """An op registered outside torch (torch.library, an extension) hides what it runs;
    torch's own namespaces, and names that are no operator, are not listed."""
    assert forbidden.unrecordable_ops([
        "aten::add", "mylib::ln", "aten::mul.Tensor", "prims::x", "mylib::ln",
        "torch.nn.functional.layer_norm", "inductor::a", "my::lib::x", "quantized::q",
        "aten::x::y"]) == [
        "my::lib::x", "mylib::ln"]


@pytest.mark.parametrize("code, label", [
    ("exec('1')", "Student cell 1 (\"exec('1')\")"),
    ("\n\n   exec('1')  \n", "Student cell 1 (\"exec('1')\")"),
    ("exec('" + "a" * 40 + "')", "Student cell 1 (\"exec('" + "a" * 31 + "...\")"),
    ("exec('" + "a" * 32 + "')", "Student cell 1 (\"exec('" + "a" * 32 + "')\")"),
])
def test_a_cell_is_named_by_its_number_and_first_line(code, label):
    assert forbidden.static_flags(["x = 1", code]) == [
        label.replace("cell 1", "cell 2") + " uses exec, which runs code built from a string."]


def test_a_cell_without_a_first_line_and_a_labelled_cell():
    assert forbidden._label(3, "  \n \n") == "Student cell 3"
    assert forbidden._label(1, "x\ny") == "Student cell 1 ('x')"
    assert forbidden.static_flags([("layer_norm_answer", "exec('1')")]) == [
        "Cell layer_norm_answer uses exec, which runs code built from a string."]


def test_a_flag_is_given_once_per_cell_and_in_order():
    flags = forbidden.static_flags(["exec('1')\nexec('2')\nimport gc\n", "exec('3')"])
    assert flags == [
        "Student cell 1 (\"exec('1')\") uses exec, which runs code built from a string.",
        "Student cell 1 (\"exec('1')\") imports gc, which can reach any object.",
        "Student cell 2 (\"exec('3')\") uses exec, which runs code built from a string."]


def test_magics_nested_too_deep_are_flagged():
    code = "exec('1')\n"
    for _ in range(12):
        code = f"%%time\n{code}"
    flags = forbidden.static_flags([code])
    assert flags == ["Student cell 1 ('%%time') nests magics too deeply to read (%%time) "
                     "(inside %%time) (inside %%time) (inside %%time) (inside %%time) "
                     "(inside %%time) (inside %%time) (inside %%time) (inside %%time) "
                     "(inside %%time) (inside %%time) (inside %%time)."]
    code = "exec('1')\n"
    for _ in range(11):
        code = f"%%time\n{code}"
    assert forbidden.static_flags([code])[0].startswith(
        "Student cell 1 ('%%time') uses exec, which runs code built from a string (inside")


def test_an_alias_made_inside_a_magic_is_known_there():
    assert forbidden.static_flags(["%%time\nimport sys as s\ns.settrace(None)\n"]) == [
        "Student cell 1 ('%%time') uses sys.settrace, which reaches into the interpreter "
        "(inside %%time)."]


@pytest.mark.parametrize("line, statement", [
    ("-n 3 -r 2 f(x)", "f(x)"), ("-q f(x)", "f(x)"), ("-o -p 5 f(x) + 1", "f(x) + 1"),
    ("-T out.txt -D d f(x)", "f(x)"), ("-l 3 -s time f(x)", "f(x)"), ("f(x)", "f(x)"),
    ("-n", ""), ("", ""),
])
def test_the_statement_of_a_time_magic(line, statement):
    assert forbidden._magic_statement(line) == statement


def test_a_cell_that_cannot_be_read_is_skipped():
    assert forbidden.static_flags(["x = 1\x00", "exec(1)"]) == [
        "Student cell 2 ('exec(1)') uses exec, which runs code built from a string."]
    assert forbidden._parse("x = 1\x00") is None and forbidden._parse("def (:") is None


@pytest.mark.parametrize("code, flag", [
    ("from torch import nn as N\nN.x = 1",
     "replaces torch.nn.x, an attribute of an imported module."),
    ("import os.path\nos.system(1)", "uses os.system, which runs code outside the graded call."),
    ("%%time\n%time exec(1)\n",
     "uses exec, which runs code built from a string (inside %time) (inside %%time)."),
    ("%%capture\n%%bash\nls\n", "uses the cell magic %%bash, which runs something other than "
     "this kernel's Python (inside %%capture)."),
])
def test_aliases_and_nested_magics(code, flag):
    *_, found = forbidden.static_flags([code])  # after "imports os, ... outside ..."
    assert found.endswith(") " + flag), found


@pytest.mark.parametrize("code, flags", [
    # what getattr with a constant name reaches is what the attribute reaches
    ("import torch\nx = getattr(torch, '_C').foo", ["uses torch._C, a private part of torch."]),
    ("import torch\nx = getattr(getattr(torch, '_C'), '_nn')",
     ["uses torch._C, a private part of torch."]),
    ("import sys\nf = getattr(sys, 'settrace')",
     ["uses sys.settrace, which reaches into the interpreter."]),
    ("import os\ngetattr(os, 'system')('ls')",
     ["imports os, which is outside the course's libraries.",
      "uses os.system, which runs code outside the graded call."]),
    ("import torch\nx = getattr(torch, 'float32')", []),
    # a name bound to a module by plain assignment is that module, however many steps
    ("import torch\nT = torch\nlib = T.library.Library('x', 'DEF')",
     ["uses torch.library, a private part of torch."]),
    ("import torch.nn.functional as F\nT = F.torch\nU = T\nU.library.custom_op",
     ["uses torch.library, a private part of torch."]),
    ("import numpy as np\nn = np\nm = n.ctypeslib",
     ["uses numpy.ctypeslib, which loads or compiles code the grader cannot read."]),
    # a private name of anything but the method's own object is read as reaching in
    ("x = getattr(f(), '_C')", ["reads ._C, a private name of an object that is not its own."]),
    ("import torch\nx = hasattr(torch, '_C')", []),  # asks, reaches nothing
    # attrgetter names attributes in every argument, methodcaller in its first only
    ("import operator\nf = operator.attrgetter('x', name)",
     ["calls operator.attrgetter with a computed attribute name."]),
    ("import operator\nf = operator.methodcaller('x', name)", []),
    # an import_module with a constant name is read as that import
    ("import importlib\nm = importlib.import_module('ctypes')",
     ["imports importlib, which can import modules by computed names.",
      "imports ctypes, which can change the interpreter's memory."]),
    ("print('ctypes')", []),
    # a relative import leaves the notebook, whatever its name
    ("from .ctypes import x",
     ["imports from a relative package, which is outside the course's libraries."]),
    # a name nobody imported is read as written
    ("sys.settrace(None)", ["uses sys.settrace, which reaches into the interpreter."]),
    ("import os.path\nos.sep = '/'", ["imports os.path, which is outside the course's libraries.",
                                      "replaces os.sep, an attribute of an imported module."]),
    ("get_ipython().run_line_magic('pwd')", ["uses the line magic %pwd."]),
    ("%pwd\n", ["uses the line magic %pwd."]),
    ("get_ipython().run_cell_magic('time', '')", []),
    ("get_ipython().run_cell_magic('bash', '')", [
        "uses the cell magic %%bash, which runs something other than this kernel's Python."]),
])
def test_more_constructs_and_their_sentences(code, flags):
    found = forbidden.static_flags([code])
    assert len(found) == len(flags), found
    for flag, ending in zip(found, flags):
        assert flag.startswith("Student cell 1 (") and flag.endswith(") " + ending), found


def test_a_first_line_of_forty_one_characters_is_cut():
    line = "exec('" + "a" * 33 + "')"
    assert len(line) == 41
    assert forbidden._label(1, line) == "Student cell 1 (\"exec('" + "a" * 31 + "...\")"
    assert forbidden._label(1, line[:40] + "\n") == f"Student cell 1 ({line[:40]!r})"


@pytest.mark.parametrize("pattern, name", [
    ("torch.nn.X", "torch.nn.X.y"), ("torch.Xy", "torch.Xy::z"),
])
def test_a_pattern_without_glob_characters_matches_by_prefix(pattern, name):
    assert forbidden.pattern_matches(pattern, name) is True
