"""Forbidden calls judged on what runs: the recorder in normref/checks/_runner.py,
the executed-name policies and the static flags of autograder/grading/forbidden.py.

Everything runs in-process (no sandbox): the checks record what torch executed
while they called the student's code, and the last run's names are in
_runner.last_executed.
"""

import contextlib
import functools
import importlib
import io
import json
import re
import socket
import subprocess
import sys
import threading

import nbformat
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from IPython.core.inputtransformer2 import TransformerManager
from torch import nn

from autograder.course import POLICIES_DIR
from autograder.grading import forbidden
from conftest import REPO
from normref.checks import (
    CheckFailed,
    _registry,
    _runner,
    _wire,
    check_layer_norm_backward_dx,
    check_layer_norm_backward_params,
    check_layer_norm_batches,
    check_my_layer_norm_forward,
    check_my_layer_norm_parameters,
)

ASSIGNMENTS = sorted(p.stem for p in POLICIES_DIR.glob("*.json"))
POLICIES = {a: forbidden.load_policy(a) for a in ASSIGNMENTS}
LN_CELL = POLICIES["01_the_recipe"]["ln_handles_batches"]
MLN_CELL = POLICIES["03_pytorch_layernorm"]["mln_forward"]
DX_CELL = POLICIES["04_backward_pass"]["gn_backward_dx"]


def _t(array):
    return torch.from_numpy(np.asarray(array))


def _record(check, *subject):
    """(executed names, recorder intact) of one in-process check; its verdict aside."""
    _runner.last_executed, _runner.last_recorder_intact = None, None
    with contextlib.suppress(CheckFailed), contextlib.redirect_stdout(io.StringIO()):
        check(*subject)
    assert _runner.last_executed is not None, "the check recorded nothing"
    return set(_runner.last_executed), _runner.last_recorder_intact


def _forbidden_run(patterns, check, *subject):
    executed, intact = _record(check, *subject)
    assert intact
    return forbidden.executed_violations(patterns, executed)


# --- students who hide a library layer norm ----------------------------------------------


def direct_layer_norm(x, gamma, beta, eps=1e-5):
    return F.layer_norm(_t(x), x.shape[-1:], _t(gamma), _t(beta), eps).numpy()


def getattr_layer_norm(x, gamma, beta, eps=1e-5):
    hidden = getattr(F, "layer" + "_norm")
    return hidden(_t(x), x.shape[-1:], _t(gamma), _t(beta), eps).numpy()


def importlib_layer_norm(x, gamma, beta, eps=1e-5):
    functional = importlib.import_module("torch.nn." + "functional")
    return functional.layer_norm(_t(x), x.shape[-1:], _t(gamma), _t(beta), eps).numpy()


def exec_layer_norm(x, gamma, beta, eps=1e-5):
    scope = {"x": x, "gamma": gamma, "beta": beta, "eps": eps}
    exec("import torch\n"
         "t = torch.from_numpy\n"
         "y = torch.nn.functional.layer_norm(t(x), x.shape[-1:], t(gamma), t(beta), eps)",
         scope)
    return scope["y"].numpy()


def aten_layer_norm(x, gamma, beta, eps=1e-5):
    out = torch.ops.aten.native_layer_norm(_t(x), list(x.shape[-1:]), _t(gamma), _t(beta), eps)
    return out[0].numpy()


def encoder_norm1_layer_norm(x, gamma, beta, eps=1e-5):
    """A LayerNorm found inside a transformer layer, under another name."""
    layer = nn.TransformerEncoderLayer(x.shape[-1], 1, dim_feedforward=4, dtype=_t(x).dtype)
    norm = layer.norm1
    norm.eps = eps
    with torch.no_grad():
        norm.weight.copy_(_t(gamma))
        norm.bias.copy_(_t(beta))
        return norm(_t(x)).numpy()


def group_norm_as_layer_norm(x, gamma, beta, eps=1e-5):
    d = x.shape[-1]
    y = F.group_norm(_t(x).reshape(-1, 1, d), 1, eps=eps).reshape(x.shape)
    return (y * _t(gamma) + _t(beta)).numpy()


@pytest.mark.parametrize("student, expected", [
    (direct_layer_norm, ["aten::native_layer_norm", "torch.nn.functional.layer_norm"]),
    (getattr_layer_norm, ["aten::native_layer_norm", "torch.nn.functional.layer_norm"]),
    (importlib_layer_norm, ["aten::native_layer_norm", "torch.nn.functional.layer_norm"]),
    (exec_layer_norm, ["aten::native_layer_norm", "torch.nn.functional.layer_norm"]),
    (aten_layer_norm, ["aten::native_layer_norm"]),
    (encoder_norm1_layer_norm, ["aten::native_layer_norm", "torch.nn.functional.layer_norm",
                                "torch.nn.modules.normalization.LayerNorm"]),
    (group_norm_as_layer_norm, ["aten::native_group_norm", "torch.nn.functional.group_norm"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_a_hidden_library_norm_is_recorded_however_it_was_reached(student, expected):
    assert _forbidden_run(LN_CELL, check_layer_norm_batches, student) == expected


def test_the_names_of_a_direct_call_are_exactly_what_ran():
    executed, intact = _record(check_layer_norm_batches, direct_layer_norm)
    # torch.from_numpy (not a torch function: only its aten op shows), the call, .numpy()
    assert executed == {"aten::lift_fresh", "torch.nn.functional.layer_norm",
                        "aten::native_layer_norm", "torch.Tensor.numpy", "aten::detach"}
    assert intact


class SubclassedLayerNorm(nn.LayerNorm):
    """nn.LayerNorm under another name."""


def test_a_subclass_of_layer_norm_is_recorded_even_before_it_runs():
    assert _forbidden_run(MLN_CELL, check_my_layer_norm_forward, SubclassedLayerNorm) == [
        "aten::native_layer_norm", "torch.nn.functional.layer_norm",
        "torch.nn.modules.normalization.LayerNorm"]
    # the parameters check only builds the module: its torch base is what shows
    assert _forbidden_run(MLN_CELL, check_my_layer_norm_parameters, SubclassedLayerNorm) == [
        "torch.nn.modules.normalization.LayerNorm"]


class NormThatLooksAround:
    """A layer_norm object whose modules(), which the recorder calls to look at
    the subject, runs torch's layer norm before the graded call starts."""

    def modules(self):
        torch.nn.functional.layer_norm(torch.ones(1, 4), (4,))
        return []

    def __call__(self, x, gamma, beta, eps=1e-5):
        x = np.asarray(x, dtype=float)
        mu = x.mean(axis=-1, keepdims=True)
        return gamma * (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) + beta


def test_what_the_subject_runs_while_it_is_looked_at_is_recorded_too():
    assert _forbidden_run(LN_CELL, check_layer_norm_batches, NormThatLooksAround()) == [
        "aten::native_layer_norm", "torch.nn.functional.layer_norm"]


# --- unit 04: the autograd engine in a backward exercise -----------------------------------


def numpy_forward(x, gamma, beta, eps=1e-5):
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=-1)
    rstd = 1.0 / np.sqrt(x.var(axis=-1) + eps)
    y = gamma * (x - mean[..., None]) * rstd[..., None] + beta
    return y, {"x": x, "gamma": gamma, "beta": beta, "eps": eps, "mean": mean, "rstd": rstd}


def _torch_graph(cache):
    x = _t(cache["x"]).requires_grad_(True)
    gamma = _t(cache["gamma"]).double().requires_grad_(True)
    beta = _t(cache["beta"]).double().requires_grad_(True)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x, gamma, beta), (x - mean) / torch.sqrt(var + cache["eps"]) * gamma + beta


def backward_by_backward(dy, cache):
    (x, gamma, beta), y = _torch_graph(cache)
    y.backward(_t(dy))
    return x.grad.numpy(), gamma.grad.numpy(), beta.grad.numpy()


def backward_by_autograd_grad(dy, cache):
    inputs, y = _torch_graph(cache)
    return tuple(g.numpy() for g in torch.autograd.grad(y, inputs, _t(dy)))


def backward_by_func_vjp(dy, cache):
    def forward(x, gamma, beta):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + cache["eps"]) * gamma + beta

    _, vjp = torch.func.vjp(forward, _t(cache["x"]), _t(cache["gamma"]).double(),
                            _t(cache["beta"]).double())
    return tuple(g.numpy() for g in vjp(_t(dy)))


@pytest.mark.parametrize("backward, expected", [
    (backward_by_backward, ["autograd", "torch.Tensor.backward"]),
    (backward_by_autograd_grad, ["autograd", "torch.autograd.grad"]),
    # torch.func's vjp runs its backward with grad mode on: differentiating again
    (backward_by_func_vjp, ["autograd", "autograd.inside_backward", "torch.autograd.grad"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_the_autograd_engine_in_a_backward_exercise_is_recorded(backward, expected):
    assert _forbidden_run(DX_CELL, check_layer_norm_backward_dx, numpy_forward,
                          backward) == expected



# --- honest work executes nothing its cell forbids -----------------------------------------

_transformer = TransformerManager()


def _grade_cells(path):
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nbformat.read(path, 4).cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")}


def _hidden_tests(assignment, grade_id):
    cell = _grade_cells(REPO / "source" / assignment / f"{assignment}.ipynb")[grade_id]
    found = re.search(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", cell.source, re.S)
    return found.group(1)


@functools.lru_cache
def _namespace(path):
    """The notebook's cells run in order, test cells left out: its answers and context
    (a scratch cell left as `raise NotImplementedError()` is passed over)."""
    scope = {"__name__": "__notebook__"}
    with contextlib.redirect_stdout(io.StringIO()):
        for cell in nbformat.read(path, 4).cells:
            if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade"):
                code = compile(_transformer.transform_cell(cell.source), str(path), "exec")
                with contextlib.suppress(NotImplementedError):
                    exec(code, scope)
    return scope


HONEST = [(assignment, gid, who) for assignment in ASSIGNMENTS for gid in POLICIES[assignment]
          for who in ("solution", "ada_perfect")]


@pytest.mark.parametrize("assignment, grade_id, who", HONEST)
def test_honest_answers_execute_none_of_their_cells_forbidden_names(assignment, grade_id, who):
    path = (REPO / "source" / assignment / f"{assignment}.ipynb" if who == "solution"
            else REPO / "autograder" / "examples" / assignment / f"{who}.ipynb")
    _runner.last_executed, _runner.last_recorder_intact = None, None
    with contextlib.redirect_stdout(io.StringIO()):
        exec(_hidden_tests(assignment, grade_id), dict(_namespace(path)))  # passes, or raises
    assert _runner.last_executed is not None and _runner.last_recorder_intact
    assert forbidden.executed_violations(POLICIES[assignment][grade_id],
                                         _runner.last_executed) == []


def _sum_over_tokens(values, grad=None):
    """A numpy helper whose keyword happens to be called grad."""
    return values.reshape(-1, values.shape[-1]).sum(axis=0) if grad is None else grad


class NumpyLayerNorm:
    """A CS231n-style layer with its own backward() method: numpy, no autograd."""

    def __init__(self, gamma, eps):
        self.gamma, self.eps = gamma, eps

    def forward(self, x):
        self.x_hat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True)
                                                               + self.eps)
        self.rstd = 1.0 / np.sqrt(x.var(-1) + self.eps)
        return self.x_hat

    def backward(self, dy):
        g = dy * self.gamma
        dx = self.rstd[..., None] * (g - g.mean(-1, keepdims=True)
                                     - self.x_hat * (g * self.x_hat).mean(-1, keepdims=True))
        return dx, _sum_over_tokens(dy * self.x_hat, grad=None), _sum_over_tokens(dy)


def layer_object_forward(x, gamma, beta, eps=1e-5):
    layer = NumpyLayerNorm(gamma, eps)
    x = np.asarray(x, dtype=np.float64)
    y = gamma * layer.forward(x) + beta
    return y, {"layer": layer, "mean": x.mean(-1), "rstd": layer.rstd}


def layer_object_backward(dy, cache):
    return cache["layer"].backward(np.asarray(dy, dtype=np.float64))


def test_a_numpy_layer_with_its_own_backward_and_a_grad_keyword_is_not_autograd():
    for check in (check_layer_norm_backward_dx, check_layer_norm_backward_params):
        with contextlib.redirect_stdout(io.StringIO()):
            check(layer_object_forward, layer_object_backward)  # passes
        assert _runner.last_executed == frozenset() and _runner.last_recorder_intact


def test_autograd_outside_the_probed_call_is_not_recorded():
    # the scratch cell compares with torch's autograd; then the check runs
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    F.layer_norm(x, (8,)).pow(2).sum().backward()
    assert x.grad is not None
    with contextlib.redirect_stdout(io.StringIO()):
        check_layer_norm_backward_dx(layer_object_forward, layer_object_backward)
    assert _runner.last_executed == frozenset()
    assert torch.overrides._get_current_function_mode_stack() == []
    assert torch.utils._python_dispatch._get_current_dispatch_mode_stack() == []


def test_in_process_a_check_prints_only_its_verdict(capsys):
    check_layer_norm_batches(direct_layer_norm)
    out = capsys.readouterr().out
    assert out.startswith("layer_norm_batches: all ") and out.count("\n") == 1


# --- tampering with the recorder -----------------------------------------------------------


def _pops_the_function_mode(x, gamma, beta, eps=1e-5):
    torch.overrides._pop_mode()  # and leaves it popped
    return direct_layer_norm(x, gamma, beta, eps)


def _pops_the_function_mode_and_puts_it_back(x, gamma, beta, eps=1e-5):
    with torch.overrides._pop_mode_temporarily():
        return direct_layer_norm(x, gamma, beta, eps)


def _pops_the_dispatch_mode_and_puts_it_back(x, gamma, beta, eps=1e-5):
    with torch.utils._python_dispatch._pop_mode_temporarily():
        return direct_layer_norm(x, gamma, beta, eps)


def _disables_torch_function(x, gamma, beta, eps=1e-5):
    with torch._C.DisableTorchFunction():
        return direct_layer_norm(x, gamma, beta, eps)


def _disables_torch_dispatch(x, gamma, beta, eps=1e-5):
    with torch._C._DisableTorchDispatch():
        return direct_layer_norm(x, gamma, beta, eps)


def _pushes_its_own_mode(x, gamma, beta, eps=1e-5):
    torch.overrides.BaseTorchFunctionMode().__enter__()
    return direct_layer_norm(x, gamma, beta, eps)


def _patches_the_runner(x, gamma, beta, eps=1e-5):
    original = _runner._probe_one
    _runner._probe_one = lambda *args: original(*args)
    return direct_layer_norm(x, gamma, beta, eps)


@pytest.mark.parametrize("student", [
    _pops_the_function_mode, _pops_the_function_mode_and_puts_it_back,
    _pops_the_dispatch_mode_and_puts_it_back, _disables_torch_function,
    _disables_torch_dispatch, _pushes_its_own_mode, _patches_the_runner,
], ids=lambda f: f.__name__.strip("_"))
def test_a_student_who_disturbs_the_recorder_is_reported(student, monkeypatch):
    monkeypatch.setattr(_runner, "_probe_one", _runner._probe_one)  # undone afterwards
    executed, intact = _record(check_layer_norm_batches, student)
    assert intact is False
    # what the other half saw is still there
    assert executed & {"torch.nn.functional.layer_norm", "aten::native_layer_norm"}
    # and the stacks are back as they were
    assert torch.overrides._get_current_function_mode_stack() == []
    assert torch.utils._python_dispatch._get_current_dispatch_mode_stack() == []


def test_honest_code_leaves_the_recorder_intact():
    assert _record(check_layer_norm_batches, direct_layer_norm)[1] is True


# --- the wire: the grader asks for a record, the client sends it ----------------------------


class _FakeGrader:
    """A grader that serves one check's cases and keeps every request's header."""

    def __init__(self, path, record):
        self.record, self.headers = record, []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                header, arrays = _wire.receive(conn)
                self.headers.append(header)
                cases = _registry.make_cases(header["check"])
                if header["op"] == "cases":
                    labels, flat = _wire.flatten_cases(cases)
                    reply = {"labels": labels}
                    if self.record is not None:
                        reply["record"] = self.record
                    _wire.send(conn, reply, flat)
                else:
                    _wire.send(conn, _registry.judge(header["check"], cases, arrays,
                                                     header["errors"]))


@pytest.mark.parametrize("record", [True, False, None])
def test_the_judge_request_carries_the_record_only_when_asked(record, tmp_path, monkeypatch):
    grader = _FakeGrader(tmp_path / "grader.sock", record)
    monkeypatch.setenv(_runner.SOCKET_ENV, str(tmp_path / "grader.sock"))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            check_layer_norm_batches(direct_layer_norm)
    finally:
        grader.sock.close()
    judge = grader.headers[-1]
    assert judge["op"] == "judge"
    assert set(judge) == {"op", "check", "errors", "executed", "recorder_intact"}
    assert judge["recorder_intact"] is True
    if record:
        assert judge["executed"] == sorted(set(judge["executed"]))
        assert {"torch.nn.functional.layer_norm", "aten::native_layer_norm"} <= set(
            judge["executed"])
    else:
        assert judge["executed"] == []


def test_the_names_sent_are_capped(tmp_path, monkeypatch):
    grader = _FakeGrader(tmp_path / "grader.sock", True)
    monkeypatch.setenv(_runner.SOCKET_ENV, str(tmp_path / "grader.sock"))
    monkeypatch.setattr(_runner, "MAX_EXECUTED", 3)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            check_layer_norm_batches(direct_layer_norm)
    finally:
        grader.sock.close()
    assert len(grader.headers[-1]["executed"]) == 3


def test_numpy_checks_do_not_import_torch_but_a_student_who_does_is_recorded():
    script = """
import sys
import numpy as np
import normref.checks
from normref.checks import _runner

def probe(f, case):
    return {"y": f(case["x"])}

cases = [("one", {"x": np.arange(4.0)})]
plain = _runner._Recording()
_runner._probe_all(lambda x: x - x.mean(), cases, probe, plain)
print("torch" in sys.modules, sorted(plain.names))

def sneaky(x):
    import torch
    return torch.nn.functional.layer_norm(torch.from_numpy(x), x.shape)

recorded = _runner._Recording()
outputs, errors = _runner._probe_all(sneaky, cases, probe, recorded)
print(errors, recorded.intact, "torch.nn.functional.layer_norm" in recorded.names,
      "aten::native_layer_norm" in recorded.names)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.stdout.split("\n")[:2] == ["False []", "{} True True True"], done.stderr


# --- static flags ---------------------------------------------------------------------------


@pytest.mark.parametrize("code, construct", [
    ("import torch.nn.functional as F\nf = getattr(F, 'layer' + '_norm')",
     "calls getattr with a computed attribute name"),
    ("import torch\nsetattr(torch.nn.functional, name, f)",
     "calls setattr with a computed attribute name"),
    ("exec('y = 1')", "uses exec"),
    ("y = eval('1 + 1')", "uses eval"),
    ("code = compile('1', 'x', 'eval')", "uses compile"),
    ("m = __import__('torch.nn.' + 'functional')",
     "calls __import__ with a computed module name"),
    ("import importlib\nF = importlib.import_module('torch.nn.functional')",
     "imports importlib"),
    ("from importlib import import_module", "imports importlib"),
    ("import torch.nn.functional as F\nf = F.__dict__['layer_norm']",
     "reads torch.nn.functional.__dict__"),
    ("import torch.nn.functional as F\nf = vars(F)['layer_norm']", "calls vars()"),
    ("f = globals()['layer_norm']", "uses globals()"),
    ("import gc\nobjects = gc.get_objects()", "imports gc"),
    ("import ctypes", "imports ctypes"),
    ("import sys\nsys.modules['torch.nn.functional'] = None", "edits sys.modules"),
    ("import sys\nsys.modules.pop('torch')", "edits sys.modules"),
    ("import sys\nm = sys.modules['torch.nn.' + 'functional']",
     "looks up sys.modules by a computed name"),
    ("import torch\nwith torch._C.DisableTorchFunction():\n    pass",
     "uses torch._C, a private part of torch"),
    ("from torch import _C", "imports torch._C"),
    ("import torch\nlib = torch.library.Library('aten', 'IMPL')", "uses torch.library"),
    ("from torch.overrides import _pop_mode", "imports torch.overrides"),
    ("import torch.utils._python_dispatch as d", "imports torch.utils._python_dispatch"),
    ("from normref.checks import _runner", "imports normref.checks, the grader's own package"),
    ("import normref", "imports normref"),
    ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    frame = e.__traceback__.tb_frame",
     "reads .tb_frame"),
    ("import threading\nthreading.Thread(target=print).start()", "imports threading"),
    ("import torch\ntorch.nn.functional.layer_norm = print",
     "replaces torch.nn.functional.layer_norm"),
    ("%%time\nimport torch.nn.functional as F\ny = getattr(F, 'layer' + '_norm')(x, (4,))\n",
     "calls getattr with a computed attribute name (inside %%time)"),
    ("%%timeit -n 3\nexec('y = layer_norm(x)')\n", "uses exec, which runs code built from a "
     "string (inside %%timeit)"),
    ("%%capture out\nimport normref\n", "imports normref, the grader's own package "
     "(inside %%capture)"),
    ("%time y = eval('f(x)')\n", "uses eval, which runs code built from a string (inside %time)"),
    ("!ls\nx = 1\n", "runs the shell command !ls"),
    ("files = !ls -l\n", "runs the shell command !ls -l"),
    ("%%bash\necho hi\n", "uses the cell magic %%bash"),
    ("%%sh\necho hi\n", "uses the cell magic %%sh"),
    ("%%script bash\necho hi\n", "uses the cell magic %%script"),
    ("%%writefile helper.py\nimport torch\n", "uses the cell magic %%writefile"),
    ("%%javascript\nalert(1)\n", "uses the cell magic %%javascript"),
    ("%%html\n<b>hi</b>\n", "uses the cell magic %%html"),
    ("%%python3\nprint(1)\n", "uses the cell magic %%python3"),
    ("%run helper.py\n", "uses the line magic %run helper.py"),
    ("%load helper.py\n", "uses the line magic %load helper.py"),
    ("get_ipython().run_cell('x = 1')", "calls get_ipython()"),
])
def test_static_flags_name_the_construct_and_the_cell(code, construct):
    flags = forbidden.static_flags(["x = 1", code])
    assert flags, code
    assert all(flag.startswith("Student cell 2 (") for flag in flags)
    assert any(construct in flag for flag in flags), flags


def test_a_time_magic_is_read_not_flagged_and_plain_code_inside_it_is_fine():
    hidden = "%%time\nimport torch.nn.functional as F\ny = F.layer_norm(x, (4,))\n"
    assert forbidden.static_flags([hidden]) == []  # what it runs is the recorder's to see
    assert forbidden.static_flags(["%matplotlib inline\nx = 1\n"]) == []


def test_labelled_cells_are_named_by_their_label():
    flags = forbidden.static_flags([("layer_norm_answer", "exec('1')")])
    assert flags == ["Cell layer_norm_answer uses exec, which runs code built from a string."]


def _student_and_context(path):
    student, context = [], []
    for cell in nbformat.read(path, 4).cells:
        if cell.cell_type == "code":
            meta = cell.metadata.get("nbgrader", {})
            (student if (meta.get("solution") or not meta) else context).append(cell.source)
    return student, context


@pytest.mark.parametrize("path", sorted((REPO / "source").glob("*/*.ipynb"))
                         + sorted((REPO / "autograder" / "examples").glob("*/ada_perfect.ipynb")),
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_honest_notebooks_raise_no_flags(path):
    student, context = _student_and_context(path)
    assert forbidden.static_flags(student, context_code=context) == []


# --- policies -------------------------------------------------------------------------------


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_policy_loads_and_names_only_real_grade_cells(assignment):
    policy = forbidden.load_policy(assignment)
    rules = forbidden.load_rules(assignment)
    raw = json.loads((POLICIES_DIR / f"{assignment}.json").read_text())
    assert set(raw) == {"cells"} and set(policy) == set(rules) == set(raw["cells"])
    assert policy and all(patterns and all(isinstance(p, str) and p for p in patterns)
                          for patterns in policy.values())
    assert all(rule.startswith("While the grader ") and rule.endswith(".")
               for rule in rules.values())
    grade_ids = set(_grade_cells(REPO / "source" / assignment / f"{assignment}.ipynb"))
    assert set(policy) <= grade_ids


def test_load_policy_reads_the_old_shape_and_a_missing_file(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"forbidden": {"a": ["torch.x"]}}))
    assert forbidden.load_policy("old", tmp_path) == {"a": ["torch.x"]}
    assert forbidden.load_policy("absent", tmp_path) == {}


@pytest.mark.parametrize("pattern, name, matches", [
    ("autograd", "autograd", True),
    ("torch.autograd", "torch.autograd.grad", True),
    ("torch.autograd", "torch.autograd_extra", False),
    ("aten::native_layer_norm", "aten::native_layer_norm", True),
    ("aten::native_layer_norm", "aten::native_layer_norm.default", True),
    ("aten::native_layer_norm", "aten::native_layer_norm_backward", False),
    ("aten", "aten::add", True),
    ("torch.nn.modules.batchnorm", "torch.nn.modules.batchnorm.BatchNorm1d", True),
    ("aten::*batch_norm*", "aten::_native_batch_norm_legit", True),
    ("torch.*layer_norm*", "torch.nn.functional.layer_norm", True),
    ("torch.*layer_norm*", "torch.nn.modules.normalization.LayerNorm", False),
])
def test_pattern_matching(pattern, name, matches):
    assert forbidden.pattern_matches(pattern, name) is matches


def test_executed_violations_are_sorted_and_distinct():
    executed = ["torch.Tensor.add", "aten::native_layer_norm", "torch.nn.functional.layer_norm",
                "aten::add", "autograd"]
    assert forbidden.executed_violations(LN_CELL, executed) == [
        "aten::native_layer_norm", "torch.nn.functional.layer_norm"]
    assert forbidden.executed_violations(DX_CELL, executed) == [
        "aten::native_layer_norm", "autograd", "torch.nn.functional.layer_norm"]
    assert forbidden.executed_violations([], executed) == []
