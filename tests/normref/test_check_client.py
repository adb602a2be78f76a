"""The check client, normref/checks/_runner.py: converting the student's results,
recording what their code executed, noticing a disturbed recorder, and running
a check in-process or against the grader's socket.

Each test fails on a small bug in _runner.py (`make mutation`). The checks run
here are made in the test ("negate"), so the tests depend on no course check.
"""

import contextlib
import io
import os
import socket
import subprocess
import sys
import threading
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normref.checks import CheckFailed, _registry, _runner, _wire
from normref.checks._registry import Check


def _cases(rng):
    return [("one", {"x": np.array([1.0, -2.0])}), ("two", {"x": np.array([[3.0], [4.0]])})]


def _judge(case, output):
    return None if np.allclose(output["y"], -case["x"]) else "y is not -x"


@pytest.fixture
def negate(monkeypatch):
    """A check named "negate": y = -x on two cases."""
    monkeypatch.setattr(_registry, "_all_checks", lambda: {"negate": Check(_cases, _judge)})
    monkeypatch.delenv(_runner.SOCKET_ENV, raising=False)


def _probe(subject, case):
    return {"y": subject(case["x"])}


@pytest.fixture
def torch_state(monkeypatch):
    """The recorder's machinery built afresh for the test (new, empty caches, so that
    _load_torch, _function_name and _torch_classes really run; the module's own are put
    back afterwards); mode stacks and hooks checked clean afterwards."""
    for cache in ("_TORCH", "_NAME_CACHE", "_CLASS_CACHE"):
        monkeypatch.setattr(_runner, cache, {})
    module_module = torch.nn.modules.module
    hooks_before = (dict(module_module._global_forward_pre_hooks),
                    dict(module_module._global_module_registration_hooks))
    t = _runner._load_torch()
    yield t
    # a recorder hook left registered would record into every later check
    assert (dict(module_module._global_forward_pre_hooks),
            dict(module_module._global_module_registration_hooks)) == hooks_before
    assert torch.overrides._get_current_function_mode_stack() == []
    assert torch.utils._python_dispatch._get_current_dispatch_mode_stack() == []
    assert not torch._C._is_torch_function_all_disabled()


def _watch(body, recording=None):
    recording = recording or _runner._Recording()
    with recording.watching():
        body()
    return recording


def _t(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


# ---------------------------------------------------------------- the package


def test_the_package_offers_every_probe_check_and_check_failed():
    """normref.checks (__init__.py) gathers the check_ functions of every *_probes module."""
    import importlib
    import pathlib

    import normref.checks as package

    folder = pathlib.Path(package.__file__).parent
    expected = {}
    for path in folder.glob("*_probes.py"):
        module = importlib.import_module(f"normref.checks.{path.stem}")
        expected.update({name: getattr(module, name) for name in dir(module)
                         if name.startswith("check_")})
    assert len(expected) >= 10
    assert sorted(package.__all__) == sorted(["CheckFailed", *expected])
    assert all(getattr(package, name) is func for name, func in expected.items())
    assert package.CheckFailed is _runner.CheckFailed
    assert issubclass(CheckFailed, AssertionError)


# ---------------------------------------------------------------- to_array


def test_a_tensor_that_needs_grad_becomes_a_plain_array():
    x = torch.tensor([1.5, -2.0], dtype=torch.float32, requires_grad=True) * 2
    array = _runner.to_array(x)
    assert isinstance(array, np.ndarray) and array.dtype == np.float32
    np.testing.assert_array_equal(array, [3.0, -4.0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_formats_numpy_cannot_hold_arrive_as_float32(dtype):
    """bfloat16 and the float8 formats have no numpy dtype: sent as float32."""
    array = _runner.to_array(torch.tensor([0.5, -2.0, 3.0]).to(dtype))
    assert array.dtype == np.float32
    np.testing.assert_array_equal(array, [0.5, -2.0, 3.0])


def test_float16_stays_float16():
    assert _runner.to_array(torch.tensor([0.5], dtype=torch.float16)).dtype == np.float16


def test_numbers_lists_and_arrays_are_copied():
    source = np.array([1.0, 2.0])
    array = _runner.to_array(source)
    array[0] = 9.0
    assert source[0] == 1.0
    np.testing.assert_array_equal(_runner.to_array([[1, 2], [3, 4]]), [[1, 2], [3, 4]])
    assert _runner.to_array(3.5) == 3.5


def test_fractions_and_decimals_are_read_as_floats():
    """Exact numbers are numbers: a Fraction or a Decimal, alone or in a list,
    arrives as float64, not refused as an object."""
    from decimal import Decimal
    from fractions import Fraction

    assert _runner.to_array(Fraction(1, 4)) == 0.25
    assert _runner.to_array(Fraction(1, 4)).dtype == np.float64
    assert _runner.to_array(Decimal("0.125")) == 0.125
    array = _runner.to_array([Fraction(1, 2), Decimal("1.5"), 2.0])
    assert array.dtype == np.float64
    np.testing.assert_array_equal(array, [0.5, 1.5, 2.0])
    with pytest.raises(TypeError, match="not an array of numbers"):
        _runner.to_array([Fraction(1, 2), "x"])


class OnlyDetach:
    """Looks a little like a tensor: a detach() method but no cpu()."""

    def detach(self):
        return self


class OnlyCpu:
    def cpu(self):
        return self


@pytest.mark.parametrize("thing", [OnlyDetach(), OnlyCpu(), object()])
def test_an_object_is_refused_with_its_class_named(thing):
    name = type(thing).__name__
    with pytest.raises(TypeError, match=f"^the result is a {name}, not an array of numbers$"):
        _runner.to_array(thing)
    with pytest.raises(TypeError, match=f"^the new mean is a {name}, not an array"):
        _runner.to_array(thing, what="the new mean")


@pytest.mark.parametrize("number, expected", [
    (Fraction(1, 3), 1 / 3), (Decimal("1.5"), 1.5), (np.float32(2.5), 2.5),
    (np.int64(7), 7.0), (torch.tensor(3.25), 3.25), (torch.tensor(0.5).double(), 0.5),
    ([Fraction(1, 2), Decimal("0.25"), 1], [0.5, 0.25, 1.0]),
])
def test_every_exact_number_type_a_student_may_return_is_read(number, expected):
    """One conversion for every probe: the standard library's exact numbers (alone or
    in a list), numpy scalars and 0-d tensors all become plain numbers."""
    array = _runner.to_array(number)
    assert array.dtype != object
    np.testing.assert_allclose(array.astype(np.float64), expected, rtol=1e-7)


@pytest.mark.parametrize("thing", [[Fraction(1, 2), "a"], [Decimal(1), None], 10**400])
def test_a_list_mixing_numbers_with_other_things_is_still_refused(thing):
    with pytest.raises(TypeError, match="not an array of numbers"):
        _runner.to_array(thing)


# ---------------------------------------------------------------- names


def test_function_names(torch_state):
    """Torch functions by qualified name, aten ops as aten::<op> without the overload."""
    names = {
        torch.ops.aten.add.Tensor: "aten::add",
        torch.ops.aten.native_layer_norm: "aten::native_layer_norm",
        F.layer_norm: "torch.nn.functional.layer_norm",
        torch.Tensor.add: "torch.Tensor.add",
        torch.add: "torch.add",
        torch.autograd.grad: "torch.autograd.grad",
        torch._adaptive_avg_pool2d: "torch._adaptive_avg_pool2d",  # resolve_name: None
    }
    for func, name in names.items():
        assert _runner._function_name(func) == name
        assert _runner._function_name(func) == name  # cached


def student_helper(x):
    return x


class CallableThing:
    def __call__(self):
        return None


class ModuleLess:
    __module__ = None

    def __call__(self):
        return None


def test_names_of_functions_torch_does_not_know(torch_state):
    assert _runner._function_name(student_helper) == f"{__name__}.student_helper"
    named = CallableThing()
    named.__name__ = "helper"
    assert _runner._function_name(named) == f"{__name__}.helper"
    assert _runner._function_name(CallableThing()) == f"{__name__}.CallableThing"
    assert _runner._function_name(ModuleLess()) == "torch.ModuleLess"


def test_a_builtin_of_the_variable_functions_is_named_as_torchs(torch_state):
    """Older torch builds name their builtins torch._C._VariableFunctions.<op>."""

    def erf_(x):
        return x

    erf_.__module__ = "torch._C._VariableFunctions"
    erf_.__qualname__ = "erf_"
    assert _runner._function_name(erf_) == "torch.erf_"


class StudentNorm(nn.LayerNorm):
    pass


class Unhashable(type(nn.Module)):
    __hash__ = None


class UnhashableNorm(nn.LayerNorm, metaclass=Unhashable):
    pass


def test_torch_classes_of_a_class_are_its_torch_bases():
    expected = ("torch.nn.modules.normalization.LayerNorm", "torch.nn.modules.module.Module")
    assert _runner._torch_classes(StudentNorm) == expected
    assert _runner._torch_classes(StudentNorm) == expected  # cached
    assert _runner._torch_classes(UnhashableNorm) == expected
    assert _runner._torch_classes(UnhashableNorm) == expected
    assert _runner._torch_classes(nn.GELU) == ("torch.nn.modules.activation.GELU",
                                               "torch.nn.modules.module.Module")
    assert _runner._torch_classes(np.ndarray) == ()
    assert _runner._torch_classes(3) == ()  # not a class


def test_a_module_merely_named_like_torch_is_not_torch():
    tv = type("Fake", (), {"__module__": "torchvision.models"})
    inner = type("Fake", (), {"__module__": "mine.torch"})
    assert _runner._torch_classes(tv) == ()
    assert _runner._torch_classes(inner) == ()


# ---------------------------------------------------------------- what gets recorded


def direct_layer_norm(x):
    return F.layer_norm(_t(x), x.shape[-1:]).numpy()


def test_the_names_of_a_forward_call_are_exactly_what_ran(torch_state):
    rec = _watch(lambda: direct_layer_norm(np.arange(4.0)))
    assert rec.executed() == ["aten::detach", "aten::lift_fresh", "aten::native_layer_norm",
                              "torch.Tensor.numpy", "torch.nn.functional.layer_norm"]
    assert rec.intact and rec.problems == []


def test_backward_marks_autograd(torch_state):
    def backward():
        x = torch.ones(3, requires_grad=True)
        (x * 2).sum().backward()

    names = _watch(backward).names
    assert {"autograd", "torch.Tensor.backward", "aten::mul"} <= names


def test_grad_marks_autograd(torch_state):
    def grad():
        x = torch.ones(3, requires_grad=True)
        torch.autograd.grad((x * 2).sum(), x)

    assert {"autograd", "torch.autograd.grad"} <= _watch(grad).names


def test_the_engine_run_directly_is_still_autograd(torch_state):
    """No torch function names the engine here: the dispatch recorder sees the
    backward pass running."""
    from torch.autograd.variable import Variable

    def sneaky():
        x = torch.ones(3, requires_grad=True)
        y = (x * 2).sum()
        Variable._execution_engine.run_backward((y,), (torch.ones(()),), False, False, (),
                                                True, True)

    rec = _watch(sneaky)
    assert "autograd" in rec.names
    assert not {n for n in rec.names if "backward" in n or n.startswith("torch.autograd")}


def test_a_module_built_and_called_inside_is_recorded(torch_state):
    def builds():
        nn.GELU()(torch.ones(2))

    assert "torch.nn.modules.activation.GELU" in _watch(builds).names

    def holds():
        wrapper = nn.Module()
        wrapper.norm = nn.LayerNorm(2)  # registered, never called

    names = _watch(holds).names
    assert "torch.nn.modules.normalization.LayerNorm" in names


def test_the_subject_is_noted_with_what_it_holds():
    rec = _runner._Recording()
    rec.note_subject(StudentNorm)
    assert rec.names == {"torch.nn.modules.normalization.LayerNorm",
                         "torch.nn.modules.module.Module"}
    rec = _runner._Recording()
    holder = nn.Sequential(nn.Linear(2, 2), nn.GELU())
    rec.note_subject((student_helper, holder))
    assert {"torch.nn.modules.linear.Linear", "torch.nn.modules.activation.GELU",
            "torch.nn.modules.container.Sequential"} <= rec.names
    rec = _runner._Recording()
    rec.note_subject((torch.ones(1), 3.0))  # values, as some checks pass
    assert rec.names == {"torch.Tensor", "torch._C.TensorBase"}
    rec = _runner._Recording()
    rec.note_subject([nn.GELU])  # a class: its modules() is not called
    assert rec.names == {"torch.nn.modules.activation.GELU", "torch.nn.modules.module.Module"}

    class BadModules:
        def modules(self):
            raise RuntimeError("no")

    rec = _runner._Recording()
    rec.note_subject(BadModules())
    assert rec.names == set()


def test_executed_is_sorted():
    rec = _runner._Recording()
    rec.names.update({"b", "a", "c"})
    assert rec.executed() == ["a", "b", "c"]


def test_problems_are_kept_up_to_twenty():
    rec = _runner._Recording()
    for i in range(25):
        rec.tampered(f"problem {i}")
    assert rec.intact is False
    assert rec.problems == [f"problem {i}" for i in range(20)]


# ---------------------------------------------------------------- the mode classes, directly


def _modes(t):
    rec = _runner._Recording()
    function = t["FunctionRecorder"](rec)
    dispatch = t["DispatchRecorder"](rec, function)
    function.dispatch = dispatch
    return rec, function, dispatch


def _add():
    return (torch.ones(1), torch.ones(1))


class PassDispatch(torch.utils._python_dispatch.TorchDispatchMode):
    """Another dispatch mode (a profiler's, say) that lets every op through."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_the_function_recorder_checks_the_dispatch_recorder_is_on_top(torch_state):
    rec, function, dispatch = _modes(torch_state)
    assert function.depth == 0 and dispatch.depth == 0
    function.__torch_function__(torch.add, (), _add())
    assert rec.names == {"torch.add"} and rec.problems == ["the dispatch recorder was not active"]
    rec, function, dispatch = _modes(torch_state)
    dispatch.depth = 1  # inside an op the dispatch recorder is running: not checked
    function.__torch_function__(torch.add, (), _add())
    assert rec.intact
    rec, function, dispatch = _modes(torch_state)
    function.dispatch = None  # before the dispatch recorder exists
    assert function.__torch_function__(torch.add, (), _add()).item() == 2.0
    assert rec.intact and function.depth == 0


def test_the_function_recorder_accepts_its_dispatch_recorder_on_top(torch_state):
    rec, function, dispatch = _modes(torch_state)
    args = _add()
    with dispatch:
        function.__torch_function__(torch.mul, (), args)
    assert rec.intact, rec.problems
    assert rec.names == {"torch.mul", "aten::mul"}
    with dispatch, PassDispatch():
        function.__torch_function__(torch.mul, (), args)
    assert rec.problems == ["the dispatch recorder was not active"]
    rec, function, dispatch = _modes(torch_state)
    with dispatch, torch._C._DisableTorchDispatch():
        function.__torch_function__(torch.mul, (), args)
    assert rec.problems == ["the dispatch recorder was not active"]


def test_the_dispatch_recorder_checks_the_function_recorder_is_on(torch_state):
    rec, function, dispatch = _modes(torch_state)
    op = torch.ops.aten.add.Tensor
    out = dispatch.__torch_dispatch__(op, (), _add())
    assert out.item() == 2.0 and dispatch.depth == 0
    assert rec.names == {"aten::add"} and rec.problems == ["the function recorder was not active"]
    rec, function, dispatch = _modes(torch_state)
    function.depth = 1  # an op a torch function led to
    dispatch.__torch_dispatch__(op, (), _add())
    assert rec.intact
    rec, function, dispatch = _modes(torch_state)
    dispatch.depth = 1  # an op inside an op
    dispatch.__torch_dispatch__(op, (), _add())
    assert rec.intact
    rec, function, dispatch = _modes(torch_state)
    args = _add()
    with function:
        dispatch.__torch_dispatch__(op, (), args)
    assert rec.intact, rec.problems
    with function, torch.overrides.BaseTorchFunctionMode():
        dispatch.__torch_dispatch__(op, (), args)
    assert rec.problems == ["the function recorder was not active"]
    rec, function, dispatch = _modes(torch_state)
    with function, torch._C.DisableTorchFunction():
        dispatch.__torch_dispatch__(op, (), args)
    assert rec.problems == ["the function recorder was not active"]
    assert "autograd" not in rec.names


def test_depth_is_back_to_zero_after_an_error(torch_state):
    rec, function, dispatch = _modes(torch_state)
    with pytest.raises(RuntimeError):
        function.__torch_function__(torch.mm, (), (torch.ones(2, 3), torch.ones(2, 3)))
    assert function.depth == 0
    with pytest.raises(RuntimeError):
        dispatch.__torch_dispatch__(torch.ops.aten.mm.default, (),
                                    (torch.ones(2, 3), torch.ones(2, 3)))
    assert dispatch.depth == 0


def _run_in_armed_thread(work):
    """Run `work` in a new thread armed as a student's thread is (the recorder's thread
    modes pushed), with the modes popped again before the thread ends; wait for it."""
    def armed():
        _runner._arm_new_thread(None, "call", None)
        try:
            work()
        finally:
            torch.utils._python_dispatch._pop_mode()
            torch._C._pop_torch_function_stack()

    worker = threading.Thread(target=armed)
    worker.start()
    worker.join()


def test_threads_record_into_the_check_that_is_recording(torch_state):
    """A thread the student starts records what it runs (modes are per thread)."""
    results = {}
    rec = _runner._Recording()

    def thread_body():
        _runner._arm_new_thread(None, "call", None)
        stack = torch.overrides._get_current_function_mode_stack()
        results["modes"] = [type(m).__name__ for m in stack] + [
            type(m).__name__ for m in
            torch.utils._python_dispatch._get_current_dispatch_mode_stack()]
        results["profile"] = sys.getprofile()
        torch.add(torch.ones(1), 1)
        results["sum"] = torch.add(torch.ones(2), torch.ones(2), alpha=4).tolist()
        x = torch.ones(2, requires_grad=True)
        (x * 3).sum().backward()
        torch.utils._python_dispatch._pop_mode()
        torch._C._pop_torch_function_stack()

    with rec.watching():
        sys.setprofile(lambda *a: None)
        worker = threading.Thread(target=lambda: (sys.setprofile(lambda *a: None),
                                                  thread_body()))
        sys.setprofile(None)
        worker.start()
        worker.join()
    assert results["modes"] == ["ThreadFunctionRecorder", "ThreadDispatchRecorder"]
    assert results["profile"] is None
    assert results["sum"] == [5.0, 5.0]
    assert {"torch.add", "aten::add", "torch.Tensor.backward", "autograd"} <= rec.names


def test_a_thread_outside_a_check_records_nothing(torch_state):
    before = set()
    results = {}

    def thread_body():
        torch.add(torch.ones(1), 1)
        x = torch.ones(2, requires_grad=True)
        (x * 3).sum().backward()
        results["done"] = True

    rec = _runner._Recording()
    _run_in_armed_thread(thread_body)
    assert results == {"done": True} and rec.names == before


def test_the_engine_in_a_thread_is_autograd(torch_state):
    from torch.autograd.variable import Variable

    rec = _runner._Recording()
    results = {}

    def thread_body():
        x = torch.ones(3, requires_grad=True)
        y = (x * 2).sum()
        Variable._execution_engine.run_backward((y,), (torch.ones(()),), False, False, (),
                                                True, True)
        results["grad"] = x.grad.tolist()

    with rec.watching():
        _run_in_armed_thread(thread_body)
    assert results["grad"] == [2.0, 2.0, 2.0]
    assert "autograd" in rec.names


def test_arming_a_thread_waits_for_torch(monkeypatch):
    """Before torch is imported, the profile hook stays for a later call."""
    marker = []

    def profile(*args):
        marker.append(args)

    monkeypatch.delitem(sys.modules, "torch")
    sys.setprofile(profile)
    try:
        _runner._arm_new_thread(None, "call", None)
        assert sys.getprofile() is profile
    finally:
        sys.setprofile(None)


# ---------------------------------------------------------------- a disturbed recorder


def test_a_mode_popped_for_a_while_is_found_by_the_other_recorder(torch_state):
    """Put back before the end, so only the other recorder saw it missing."""
    def without_dispatch():
        with torch.utils._python_dispatch._pop_mode_temporarily():
            torch.add(torch.ones(1), 1)

    rec = _watch(without_dispatch)
    assert rec.problems[0] == "the dispatch recorder was not active"
    assert set(rec.problems) == {"the dispatch recorder was not active"}

    def without_function():
        with torch.overrides._pop_mode_temporarily():
            torch.add(torch.ones(1), 1)

    rec = _watch(without_function)
    assert rec.problems[0] == "the function recorder was not active"
    assert set(rec.problems) == {"the function recorder was not active"}


def test_keyword_arguments_reach_the_function_and_the_op(torch_state):
    """The recorders pass keywords on: a watched call computes what an unwatched one does."""
    a, b = torch.ones(2), torch.full((2,), 3.0)
    results = []

    def body():
        results.append(torch.add(a, b, alpha=2))
        results.append(torch.sum(torch.ones(2, 3), dim=0))
        results.append(torch.ops.aten.add.Tensor(a, b, alpha=3))

    rec = _watch(body)
    assert results[0].tolist() == [7.0, 7.0]
    assert results[1].tolist() == [2.0, 2.0, 2.0]
    assert results[2].tolist() == [10.0, 10.0]
    assert rec.intact, rec.problems


def test_a_function_mode_left_on_is_found_and_the_stack_put_back(torch_state):
    mode = torch.overrides.BaseTorchFunctionMode()
    rec = _watch(lambda: mode.__enter__())
    assert rec.problems == ["the torch function mode stack changed"]


def test_a_function_mode_swapped_in_is_found(torch_state):
    """Same length, another mode in the recorder's place."""
    def swap():
        torch._C._pop_torch_function_stack()
        torch._C._push_on_torch_function_stack(torch.overrides.BaseTorchFunctionMode())

    rec = _watch(swap)
    assert "the torch function mode stack changed" in rec.problems


def test_a_dispatch_mode_left_on_is_found_and_the_stack_put_back(torch_state):
    rec = _watch(lambda: torch.utils._python_dispatch._push_mode(PassDispatch()))
    assert rec.problems == ["the torch dispatch mode stack changed"]


def test_a_dispatch_mode_swapped_in_is_found(torch_state):
    def swap():
        torch.utils._python_dispatch._pop_mode()
        torch.utils._python_dispatch._push_mode(PassDispatch())

    rec = _watch(swap)
    assert "the torch dispatch mode stack changed" in rec.problems


def test_the_stacks_below_the_recorder_are_kept(torch_state):
    """A mode the grader's own code had on before the check stays, under the recorder."""
    outer = torch.overrides.BaseTorchFunctionMode()
    with outer:
        rec = _watch(lambda: torch.overrides.BaseTorchFunctionMode().__enter__())
        assert torch.overrides._get_current_function_mode_stack() == [outer]
    assert rec.problems == ["the torch function mode stack changed"]
    outer = PassDispatch()
    with outer:
        rec = _watch(lambda: torch.add(torch.ones(1), 1))
        assert torch.utils._python_dispatch._get_current_dispatch_mode_stack() == [outer]
    assert rec.intact, rec.problems


def test_torch_function_left_disabled_is_found(torch_state):
    guard = torch._C.DisableTorchFunction()
    try:
        rec = _watch(guard.__enter__)
    finally:
        guard.__exit__(None, None, None)
    assert "torch function or Python dispatch was left disabled" in rec.problems


def test_python_dispatch_left_disabled_is_found(torch_state):
    guard = torch._C._DisableTorchDispatch()
    try:
        rec = _watch(guard.__enter__)
    finally:
        guard.__exit__(None, None, None)
    assert "torch function or Python dispatch was left disabled" in rec.problems


@pytest.mark.parametrize("attribute, problem", [
    ("_global_forward_pre_hooks", "the module hook was removed"),
    ("_global_module_registration_hooks", "the submodule hook was removed"),
])
@pytest.mark.parametrize("how", ["cleared", "replaced"])
def test_a_removed_hook_is_found(attribute, problem, how, torch_state):
    module = torch.nn.modules.module
    original = getattr(module, attribute)
    saved = dict(original)

    def body():
        if how == "cleared":
            getattr(module, attribute).clear()
        else:
            setattr(module, attribute, type(original)(original))  # a copy, hook included

    try:
        rec = _watch(body)
    finally:
        setattr(module, attribute, original)
        original.clear()
        original.update(saved)
    assert rec.problems == [problem]


@pytest.mark.parametrize("cls, attr", [("FunctionRecorder", "__torch_function__"),
                                       ("DispatchRecorder", "__torch_dispatch__")])
def test_a_replaced_handler_is_found(cls, attr, torch_state):
    klass = torch_state[cls]
    original = klass.__dict__[attr]

    def body():
        setattr(klass, attr, lambda self, func, types, args=(), kwargs=None: func(
            *args, **(kwargs or {})))

    try:
        rec = _watch(body)
    finally:
        setattr(klass, attr, original)
    assert f"{cls}.{attr} was replaced" in rec.problems


def _top_modes():
    return (torch.overrides._get_current_function_mode_stack()[-1],
            torch.utils._python_dispatch._get_current_dispatch_mode_stack()[-1])


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("how", ["handler", "recording", "class"])
def test_an_altered_recorder_is_found(which, how, torch_state):
    def body():
        mode = _top_modes()[which]
        if how == "handler":
            name = "__torch_function__" if which == 0 else "__torch_dispatch__"
            setattr(mode, name, lambda *a, **k: None)
        elif how == "recording":
            mode.recording = _runner._Recording()
        else:
            base = type(mode).__mro__[1]
            mode.__class__ = type("Look", (base,), dict(type(mode).__dict__))

    rec = _watch(body)
    assert "a recorder was altered" in rec.problems


def test_an_attribute_of_the_recorder_that_is_not_a_handler_is_allowed(torch_state):
    rec = _watch(lambda: setattr(_top_modes()[0], "note", 1))
    assert rec.intact, rec.problems


def test_a_recorder_that_cannot_be_taken_down_is_found(torch_state):
    def body():
        dispatch = _top_modes()[1]
        dispatch.__exit__ = lambda *a: (_ for _ in ()).throw(OSError("no"))

    rec = _watch(body)
    assert rec.problems == ["the recorder could not be taken down (OSError)"]
    torch.utils._python_dispatch._pop_mode()  # what __exit__ did not do


def test_a_recorder_that_cannot_start_is_found(monkeypatch, torch_state):
    monkeypatch.setitem(torch_state, "f_len", lambda: 1 / 0)
    rec = _watch(lambda: torch.add(torch.ones(1), 1))
    assert rec.problems == ["the recorder could not start (ZeroDivisionError)"]
    assert rec.names == set()


def test_a_hook_that_cannot_be_set_leaves_no_mode_on(monkeypatch, torch_state):
    def refuse(hook):
        raise PermissionError("no hooks")

    monkeypatch.setitem(torch_state, "register_submodule_hook", refuse)
    rec = _watch(lambda: torch.add(torch.ones(1), 1))
    assert rec.problems == ["the recorder could not start (PermissionError)"]
    # torch_state checks the mode stacks are empty again, and the module hook removed


def test_a_hook_that_cannot_be_removed_while_starting_still_leaves_no_mode_on(
        monkeypatch, torch_state):
    class Stuck:
        def remove(self):
            raise RuntimeError("cannot remove")

    def refuse(hook):
        raise PermissionError("no hooks")

    monkeypatch.setitem(torch_state, "register_hook", lambda hook: Stuck())
    monkeypatch.setitem(torch_state, "register_submodule_hook", refuse)
    rec = _watch(lambda: torch.add(torch.ones(1), 1))
    assert rec.problems == ["the recorder could not start (PermissionError)"]
    # torch_state checks the mode stacks are empty again


def test_a_mode_that_cannot_be_exited_while_starting_is_ignored(monkeypatch, torch_state):
    def refuse(hook):
        raise PermissionError("no hooks")

    monkeypatch.setitem(torch_state, "register_hook", refuse)
    rec = _runner._Recording()
    rec._start()
    assert rec._active is None
    assert rec.problems == ["the recorder could not start (PermissionError)"]


def test_starting_twice_starts_once(torch_state):
    rec = _runner._Recording()
    rec._start()
    first = rec._active
    rec._start()
    assert rec._active is first
    assert len(torch.overrides._get_current_function_mode_stack()) == 1
    rec._stop()
    assert rec.intact and rec._active is None


def test_restore_puts_the_expected_stack_back():
    stack = [1, 2, 3]
    _runner._Recording._restore(["a", "b"], lambda: len(stack), stack.pop, stack.append)
    assert stack == ["a", "b"]

    def broken_pop():
        raise RuntimeError("stuck")

    _runner._Recording._restore(["a"], lambda: 1, broken_pop, stack.append)  # no error


def test_a_process_started_by_the_hand_in_is_found(torch_state):
    def starts():
        subprocess.run([sys.executable, "-c", "pass"], check=True)

    rec = _watch(starts)
    assert rec.problems == ["the hand-in's code started a process while the grader called it"]


def test_a_process_running_before_the_call_is_found(torch_state):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        rec = _watch(lambda: None)
    finally:
        child.kill()
        child.wait()
    assert rec.problems[0] == ("a process of the hand-in's was running while the grader "
                               "called its code")


def test_the_bookkeeping_of_the_recorder_is_checked(torch_state):
    rec = _watch(lambda: _runner._RECORDING_NOW.append("mine"))
    assert rec.problems == ["the recorder's own bookkeeping changed"]
    assert _runner._RECORDING_NOW.pop() == "mine"
    assert _runner._RECORDING_NOW == [rec]
    _runner._RECORDING_NOW.clear()
    rec = _watch(lambda: _runner._RECORDING_NOW.clear())
    assert rec.problems == ["the recorder's own bookkeeping changed"]


def test_a_replaced_runner_function_is_found(monkeypatch, torch_state):
    rec = _watch(lambda: monkeypatch.setattr(_runner, "to_array", lambda v, **k: v))
    assert rec.problems == ["the check runner's functions were replaced"]


# ---------------------------------------------------------------- the runner unchanged


def test_runner_unchanged(monkeypatch):
    assert _runner._runner_unchanged() is True
    with monkeypatch.context() as m:
        m.setattr(_runner, "_probe_one", lambda *a: a)
        assert _runner._runner_unchanged() is False
    with monkeypatch.context() as m:
        # a different code object in the same function (with the same free variables:
        # under mutmut the function is a trampoline with a closure)
        m.setattr(_runner.to_array, "__code__",
                  _runner.to_array.__code__.replace(co_name="to_array_replaced"))
        assert _runner._runner_unchanged() is False
    with monkeypatch.context() as m:
        m.setattr(_runner._Recording, "executed", lambda self: [])
        assert _runner._runner_unchanged() is False
    with monkeypatch.context() as m:
        m.delattr(_runner, "_TorchImportWatcher")
        assert _runner._runner_unchanged() is False
    assert _runner._runner_unchanged() is True


# ---------------------------------------------------------------- processes


def test_the_census_counts_children_of_every_thread():
    ready, stop = threading.Event(), threading.Event()
    children = []

    def other_thread():
        children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
        ready.set()
        stop.wait(30)

    helper = threading.Thread(target=other_thread)
    helper.start()
    ready.wait(30)
    children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
    try:
        alive, _ = _runner._process_census()
        assert alive == 2
    finally:
        for child in children:
            child.kill()
            child.wait()
        stop.set()
        helper.join()
    assert _runner._process_census()[0] == 0


def test_the_census_adds_up_the_cpu_time_of_reaped_children():
    # children that spend time in the kernel (stat) as well as in Python, until the
    # system time is well above the clock's 10 ms tick on however fast a machine, so
    # that user + system differs from user - system or user alone
    for _ in range(30):
        subprocess.run([sys.executable, "-c",
                        "import os\nfor _ in range(200_000): os.stat('.')"], check=True)
        if os.times().children_system >= 0.1:
            break
    times = os.times()
    _, cpu = _runner._process_census()
    assert times.children_system >= 0.1
    assert cpu == pytest.approx(times.children_user + times.children_system, abs=0.02)


def test_the_census_without_proc_counts_nothing(monkeypatch):
    def no_proc(path):
        raise FileNotFoundError(path)

    monkeypatch.setattr(_runner.os, "listdir", no_proc)
    assert _runner._process_census()[0] == 0


# ---------------------------------------------------------------- probing


def test_probe_one_converts_or_reports():
    outputs, error = _runner._probe_one(lambda x: -x, {"x": np.arange(2.0)}, _probe)
    assert error is None and list(outputs) == ["y"]
    np.testing.assert_array_equal(outputs["y"], [-0.0, -1.0])

    def raises(x):
        raise ZeroDivisionError("x" * 3000)

    outputs, error = _runner._probe_one(raises, {"x": np.arange(2.0)}, _probe)
    assert outputs == {} and len(error) == 2000
    assert error.startswith("ZeroDivisionError: xxx")
    outputs, error = _runner._probe_one(lambda x: object(), {"x": 1}, _probe)
    assert error == "TypeError: the result is a object, not an array of numbers"


def test_probe_all_numbers_outputs_and_errors_by_case():
    cases = [("a", {"x": np.array([1.0])}), ("b", {"x": np.array([0.0])}),
             ("c", {"x": np.array([2.0])})]

    def student(x):
        if x[0] == 0:
            raise ValueError("zero")
        return -x

    for recording in (None, _runner._Recording()):
        outputs, errors = _runner._probe_all(student, cases, _probe, recording)
        assert sorted(outputs) == ["0/y", "2/y"]
        np.testing.assert_array_equal(outputs["2/y"], [-2.0])
        assert errors == {"1": "ValueError: zero"}


def test_probe_all_records_only_with_a_recording(torch_state):
    cases = [("a", {"x": np.array([1.0, 2.0])})]
    rec = _runner._Recording()
    _runner._probe_all(direct_layer_norm, cases, _probe, rec)
    assert "torch.nn.functional.layer_norm" in rec.names
    assert _runner._RECORDING_NOW == []


# ---------------------------------------------------------------- run_check in-process


def test_in_process_a_passing_check_prints_its_verdict(negate, capsys, torch_state):
    _runner.run_check("negate", lambda x: -x, _probe)
    assert capsys.readouterr().out == "negate: all 2 cases passed (one, two)\n"
    assert _runner.last_executed == frozenset() and _runner.last_recorder_intact is True


def test_in_process_a_failing_check_raises_with_the_judges_sentence(negate, capsys):
    with pytest.raises(CheckFailed) as failed:
        _runner.run_check("negate", lambda x: x, _probe)
    assert str(failed.value) == "negate, one: y is not -x"
    assert capsys.readouterr().out == ""


def test_in_process_the_last_record_is_kept(negate, torch_state):
    def with_torch(x):
        return -_t(x).numpy()

    with contextlib.redirect_stdout(io.StringIO()):
        _runner.run_check("negate", StudentNorm, lambda s, case: {"y": with_torch(case["x"])})
    assert {"aten::lift_fresh", "torch.nn.modules.normalization.LayerNorm"} <= \
        _runner.last_executed
    assert isinstance(_runner.last_executed, frozenset)
    with contextlib.redirect_stdout(io.StringIO()):
        _runner.run_check("negate", lambda x: -x,
                          lambda s, case: {"y": (torch.overrides.BaseTorchFunctionMode()
                                                 .__enter__(), s(case["x"]))[1]})
    assert _runner.last_recorder_intact is False


# ---------------------------------------------------------------- run_check against the grader


class FakeGrader:
    """Serves the "negate" check over a Unix socket and keeps every request."""

    def __init__(self, path, record=None, verdict=None):
        self.record, self.verdict, self.requests = record, verdict, []
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
                self.requests.append((header, arrays))
                if header["op"] == "cases":
                    labels, flat = _wire.flatten_cases(_cases(None))
                    reply = {"labels": labels}
                    if self.record is not None:
                        reply["record"] = self.record
                    _wire.send(conn, reply, flat)
                else:
                    verdict = self.verdict or _registry.judge(
                        "negate", _cases(None), arrays, header["errors"])
                    _wire.send(conn, verdict)


@pytest.fixture
def grader(tmp_path, monkeypatch, negate):
    made = []

    def make(**kwargs):
        path = tmp_path / f"grader{len(made)}.sock"
        made.append(FakeGrader(path, **kwargs))
        monkeypatch.setenv(_runner.SOCKET_ENV, str(path))
        return made[-1]

    yield make
    for g in made:
        g.sock.close()


def test_the_client_asks_for_cases_and_sends_outputs(grader, capsys, torch_state):
    fake = grader()
    _runner.last_executed = "untouched"
    _runner.run_check("negate", lambda x: -_t(x).numpy(), _probe)
    assert capsys.readouterr().out == "negate: all 2 cases passed (one, two)\n"
    (ask, none), (judge, outputs) = fake.requests
    assert ask == {"op": "cases", "check": "negate"} and none == {}
    assert judge == {"op": "judge", "check": "negate", "errors": {}, "executed": [],
                     "recorder_intact": True}
    assert sorted(outputs) == ["0/y", "1/y"]
    np.testing.assert_array_equal(outputs["1/y"], [[-3.0], [-4.0]])
    assert _runner.last_executed == "untouched"  # the grader keeps the record, not us


@pytest.mark.parametrize("record", [1, "true", False])
def test_only_record_true_turns_the_recorder_on(record, grader, torch_state):
    fake = grader(record=record)
    with contextlib.redirect_stdout(io.StringIO()):
        _runner.run_check("negate", StudentNorm, lambda s, case: {"y": (-_t(case["x"])).numpy()})
    assert fake.requests[1][0]["executed"] == []


def test_when_asked_the_client_sends_what_ran(grader, torch_state):
    fake = grader(record=True)
    with contextlib.redirect_stdout(io.StringIO()):
        _runner.run_check("negate", StudentNorm, lambda s, case: {"y": (-_t(case["x"])).numpy()})
    judge = fake.requests[1][0]
    assert judge["executed"] == ["aten::detach", "aten::lift_fresh", "aten::neg",
                                 "torch.Tensor.neg", "torch.Tensor.numpy",
                                 "torch.nn.modules.module.Module",
                                 "torch.nn.modules.normalization.LayerNorm"]
    assert judge["recorder_intact"] is True


def test_the_names_sent_are_capped(grader, monkeypatch, torch_state):
    fake = grader(record=True)
    monkeypatch.setattr(_runner, "MAX_EXECUTED", 2)
    with contextlib.redirect_stdout(io.StringIO()):
        _runner.run_check("negate", StudentNorm, lambda s, case: {"y": (-_t(case["x"])).numpy()})
    assert fake.requests[1][0]["executed"] == ["aten::detach", "aten::lift_fresh"]


def test_a_disturbed_recorder_is_reported_to_the_grader(grader, torch_state):
    fake = grader(record=True)

    def student(x):
        torch.overrides.BaseTorchFunctionMode().__enter__()
        return -x

    with contextlib.redirect_stdout(io.StringIO()):
        _runner.run_check("negate", student, _probe)
    assert fake.requests[1][0]["recorder_intact"] is False


def test_the_client_reports_errors_and_raises_the_graders_verdict(grader):
    fake = grader()

    def student(x):
        if x.ndim == 2:
            raise KeyError("two")
        return -x

    with pytest.raises(CheckFailed) as failed:
        _runner.run_check("negate", student, _probe)
    assert str(failed.value) == "negate, two: your code raised KeyError: 'two'"
    assert fake.requests[1][0]["errors"] == {"1": "KeyError: 'two'"}


def test_the_client_obeys_the_grader_not_its_own_judges(grader, capsys):
    grader(verdict={"passed": False, "message": "the grader says no"})
    with pytest.raises(CheckFailed, match="^the grader says no$"):
        _runner.run_check("negate", lambda x: -x, _probe)
    grader(verdict={"passed": True, "message": "the grader says yes"})
    _runner.run_check("negate", lambda x: x, _probe)
    assert capsys.readouterr().out == "the grader says yes\n"


def test_an_empty_socket_variable_means_in_process(negate, monkeypatch, capsys):
    monkeypatch.setenv(_runner.SOCKET_ENV, "")
    _runner.run_check("negate", lambda x: -x, _probe)
    assert capsys.readouterr().out.startswith("negate: all 2 cases passed")


# ---------------------------------------------------------------- importing torch late


def test_the_import_watcher_hands_on_other_modules_and_finds_torch():
    calls = []
    watcher = _runner._TorchImportWatcher(lambda: calls.append("started"))
    assert watcher.find_spec("numpy") is None
    sys.meta_path.insert(0, watcher)
    try:
        spec = watcher.find_spec("torch")
    finally:
        sys.meta_path.remove(watcher)
    assert spec is not None and spec.name == "torch"
    assert watcher.busy is False and calls == []
    watcher.busy = True  # while it looks for torch itself
    assert watcher.find_spec("torch") is None


def test_the_import_watcher_without_a_finder_for_torch():
    class Nothing:
        def find_spec(self, fullname, path=None, target=None):
            return None

    watcher = _runner._TorchImportWatcher(lambda: None)
    saved = list(sys.meta_path)
    sys.meta_path[:] = [watcher, object(), Nothing()]
    try:
        assert watcher.find_spec("torch") is None
    finally:
        sys.meta_path[:] = saved
    assert watcher.busy is False


def test_the_import_watcher_returns_a_spec_without_a_loader():
    import importlib.machinery

    spec = importlib.machinery.ModuleSpec("torch", None)

    class Finder:
        def find_spec(self, fullname, path=None, target=None):
            return spec

    watcher = _runner._TorchImportWatcher(lambda: None)
    saved = list(sys.meta_path)
    sys.meta_path[:] = [watcher, Finder()]
    try:
        assert watcher.find_spec("torch") is spec
    finally:
        sys.meta_path[:] = saved


def test_the_import_watcher_calls_back_after_the_module_ran():
    import importlib.machinery

    events = []

    class Loader:
        def exec_module(self, module):
            events.append(("exec", module))

    spec = importlib.machinery.ModuleSpec("torch", Loader())

    class Finder:
        def find_spec(self, fullname, path=None, target=None):
            events.append(("find", fullname, path, target))
            return spec

    watcher = _runner._TorchImportWatcher(lambda: events.append("started"))
    saved = list(sys.meta_path)
    sys.meta_path[:] = [watcher, Finder()]
    try:
        found = watcher.find_spec("torch", ["p"], "t")
    finally:
        sys.meta_path[:] = saved
    assert found is spec and events == [("find", "torch", ["p"], "t")]
    found.loader.exec_module("module")
    assert events[1:] == [("exec", "module"), "started"]


class Holder:
    def method(self):
        return None


class UnhashableCallable:
    def __eq__(self, other):
        return self is other

    def __call__(self):
        return None


def test_a_callable_without_a_module_attribute_is_named_under_torch(torch_state):
    """A method-wrapper has no __module__ at all (not even None): named torch.<qualname>."""
    assert not hasattr((1).__add__, "__module__")
    assert _runner._function_name((1).__add__) == "torch.int.__add__"


def test_a_method_is_named_by_its_qualified_name(torch_state):
    """The class a method belongs to is part of its name, not just the method's own name."""
    assert _runner._function_name(Holder.method) == f"{__name__}.Holder.method"
    assert _runner._function_name(Holder().method) == f"{__name__}.Holder.method"


def test_an_unhashable_op_packet_is_named_and_not_cached(torch_state):
    """An op-like callable that cannot be a dict key is still named; the cache is left alone."""
    thing = UnhashableCallable()
    thing._qualified_op_name = "student::op"
    cached = dict(_runner._NAME_CACHE)
    assert _runner._function_name(thing) == "student::op"
    assert _runner._NAME_CACHE == cached


def test_a_thread_that_only_computes_is_not_autograd(torch_state):
    """Ops a student's thread runs outside a backward pass are recorded without "autograd"."""
    rec = _runner._Recording()
    results = {}

    def thread_body():
        results["sum"] = torch.add(torch.ones(2), torch.ones(2)).tolist()

    with rec.watching():
        _run_in_armed_thread(thread_body)
    assert results["sum"] == [2.0, 2.0]
    assert {"torch.add", "aten::add"} <= rec.names and "autograd" not in rec.names


def test_a_module_built_before_the_check_is_recorded_when_called(torch_state):
    """The module hook names the torch classes of a module called inside the check, even
    one built outside it (no registration hook saw it) and not the subject."""
    norm = nn.LayerNorm(3)
    rec = _watch(lambda: norm(torch.ones(2, 3)))
    assert {"torch.nn.modules.normalization.LayerNorm",
            "torch.nn.modules.module.Module"} <= rec.names


def test_a_module_built_while_the_bookkeeping_is_emptied_does_not_fail(torch_state):
    """Hand-in code that empties the recorder's stack for a while and builds a module
    meanwhile gets its module: the submodule hook then has nowhere to record, and stays
    quiet."""
    rec = _runner._Recording()
    built = {}

    def body():
        saved = list(_runner._RECORDING_NOW)
        _runner._RECORDING_NOW.clear()
        try:
            built["model"] = nn.Sequential(nn.Linear(2, 2))
        finally:
            _runner._RECORDING_NOW[:] = saved

    _watch(body, rec)
    assert isinstance(built["model"], nn.Sequential)
    assert "torch.nn.modules.linear.Linear" not in rec.names


def test_the_torch_classes_of_a_class_are_cached(torch_state):
    """A second look-up gives the same names, from the cache."""
    first = _runner._torch_classes(StudentNorm)
    assert _runner._CLASS_CACHE[StudentNorm] == first
    assert _runner._torch_classes(StudentNorm) == first
    assert "torch.nn.modules.normalization.LayerNorm" in first


def test_a_class_without_a_module_attribute_has_no_torch_classes(torch_state):
    """A class made by type() where no __name__ is defined has no __module__: not torch."""
    anonymous = eval("type('Anonymous', (), {})", {"__builtins__": __builtins__})
    assert not hasattr(anonymous, "__module__")
    assert _runner._torch_classes(anonymous) == ()


def test_a_class_hiding_its_mro_has_no_torch_classes(torch_state):
    """A hand-in's class whose metaclass hides __mro__ is no torch class, and noting it
    as the subject is no crash."""
    class Meta(type):
        def __getattribute__(cls, name):
            if name == "__mro__":
                raise AttributeError(name)
            return super().__getattribute__(name)

    class Hidden(metaclass=Meta):
        pass

    assert not hasattr(Hidden, "__mro__")
    assert _runner._torch_classes(Hidden) == ()
    rec = _runner._Recording()
    rec.note_subject(Hidden)
    assert rec.names == set()


def test_a_torch_without_graph_task_ids_marks_no_autograd(monkeypatch):
    """A hand-in may delete torch._C._current_graph_task_id before the first check:
    the recorder then cannot tell a backward pass, and marks none, rather than marking
    every op autograd (a cell forbidding autograd would lose its points) or failing to
    start."""
    for cache in ("_TORCH", "_NAME_CACHE", "_CLASS_CACHE"):
        monkeypatch.setattr(_runner, cache, {})
    monkeypatch.delattr(torch._C, "_current_graph_task_id")
    rec = _watch(lambda: torch.ones(2) + 1)
    assert rec.intact, rec.problems
    assert "aten::add" in rec.names and _runner.AUTOGRAD_MARK not in rec.names


class Registry:
    """A class subject with a class-level modules(): the class itself is no module."""

    @classmethod
    def modules(cls):
        return [nn.LayerNorm(2)]


def test_a_class_subject_is_noted_without_calling_its_modules():
    """Only an instance's modules() are looked at; a class's own modules() is not called."""
    rec = _runner._Recording()
    rec.note_subject(Registry)
    assert rec.names == set()


class SpecOnce:
    """A meta-path finder that, the first time it is asked for torch, asks `watcher` too."""

    def __init__(self, watcher, answer=None):
        self.watcher, self.answer, self.nested = watcher, answer, []

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch" and self.watcher is not None and not self.nested:
            self.nested.append(self.watcher.find_spec(fullname, path, target))
        return self.answer


def test_the_import_watcher_does_not_look_for_torch_within_its_own_search():
    """While the watcher searches the other finders for torch, it answers None itself."""
    watcher = _runner._TorchImportWatcher(lambda: None)
    spy = SpecOnce(watcher)
    sys.meta_path.insert(0, spy)
    try:
        spec = watcher.find_spec("torch")
    finally:
        sys.meta_path.remove(spy)
    assert spec is not None and spec.name == "torch"
    assert spy.nested == [None]
    assert watcher.busy is False


class LoaderWithoutExecModule:
    """An old-style loader: load_module only."""

    def load_module(self, fullname):
        raise ImportError(fullname)


def test_a_torch_spec_whose_loader_cannot_exec_is_passed_on_unchanged():
    """A spec whose loader has no exec_module is handed back as found, not wrapped."""
    import importlib.machinery

    loader = LoaderWithoutExecModule()
    found = importlib.machinery.ModuleSpec("torch", loader)
    finder = SpecOnce(None, found)
    watcher = _runner._TorchImportWatcher(lambda: None)
    sys.meta_path.insert(0, finder)
    try:
        spec = watcher.find_spec("torch")
    finally:
        sys.meta_path.remove(finder)
    assert spec is found and not hasattr(loader, "exec_module")


def test_a_mode_whose_exit_fails_while_a_start_is_undone_is_ignored(monkeypatch, torch_state):
    """When the hooks cannot be set, the modes already entered are exited; an error from
    that exit is swallowed, and the start's own failure is what is reported."""
    def refuse(hook):
        raise PermissionError("no hooks")

    def exit_then_fail(self, *exc_info):
        torch.utils._python_dispatch.TorchDispatchMode.__exit__(self, *exc_info)
        raise RuntimeError("exit failed")

    monkeypatch.setitem(torch_state, "register_hook", refuse)
    monkeypatch.setattr(torch_state["DispatchRecorder"], "__exit__", exit_then_fail)
    rec = _runner._Recording()
    rec._start()
    assert rec._active is None
    assert rec.problems == ["the recorder could not start (PermissionError)"]


def test_backward_in_the_check_and_in_a_thread_records_only_names(torch_state):
    """Tensor.backward, in the check's thread or in one it starts, adds the name
    "autograd" and nothing that is not a name."""
    rec = _runner._Recording()

    def body():
        torch.ones(2, requires_grad=True).sum().backward()
        _run_in_armed_thread(lambda: torch.ones(2, requires_grad=True).sum().backward())

    _watch(body, rec)
    assert "autograd" in rec.names
    assert all(isinstance(name, str) for name in rec.names)


def test_depth_counts_calls_nested_inside_each_other(torch_state):
    """A torch function (or op) run inside another one still counts as inside after
    the inner one returns: the recorders count depth, they do not just flag it."""
    rec, function, dispatch = _modes(torch_state)
    inner_depths = []

    def outer_function(*args):
        function.__torch_function__(torch.add, (), args)
        inner_depths.append(function.depth)
        # an op the outer function leads to, with the recorder off the stack (as it
        # is while its own handler runs): not a sign of tampering
        dispatch.__torch_dispatch__(torch.ops.aten.add.Tensor, (), args)
        return args[0]

    function.dispatch = None
    function.__torch_function__(outer_function, (), _add())
    assert inner_depths == [1] and function.depth == 0
    assert rec.intact, rec.problems

    rec, function, dispatch = _modes(torch_state)
    inner_depths.clear()

    def outer_op(*args):
        dispatch.__torch_dispatch__(torch.ops.aten.add.Tensor, (), args)
        inner_depths.append(dispatch.depth)
        return args[0]

    function.depth = 1  # a torch function led to the outer op
    dispatch.__torch_dispatch__(outer_op, (), _add())
    function.depth = 0
    assert inner_depths == [1] and dispatch.depth == 0
    assert rec.intact, rec.problems
