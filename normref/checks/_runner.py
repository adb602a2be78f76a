"""Runs a check: get the inputs, call the student's code, get a verdict.

Two modes, same code path for the student's side:
- in-process (an instructor's `nbgrader validate`, the test suite): the cases
  and the verdict come from the judges in this package;
- client (inside the grading sandbox, where NORMREF_GRADER_SOCKET is set): the
  cases and the verdict come from the grader over a Unix socket, and only the
  student's outputs, as plain arrays, are sent back. The grader keeps its own
  log of verdicts; what this process prints or raises decides nothing.

While a probe calls the student's code, a recorder can note what torch
actually executed (see _Recording): the grader asks for it with "record": true
in its reply to "cases", and gets back, with the outputs, "executed" (sorted
distinct names) and "recorder_intact". In-process, every check records, and
the last run's names are left in `last_executed` / `last_recorder_intact`.
"""

import contextlib
import decimal
import numbers
import os
import socket
import sys
import threading

import numpy as np

from normref.checks import _wire

SOCKET_ENV = "NORMREF_GRADER_SOCKET"
MAX_EXECUTED = 2000  # names sent to the grader, at most

# The engine's entry points (reverse mode) and forward-mode duals; any of them
# also records the name "autograd".
AUTOGRAD_MARK = "autograd"
# An op that runs with grad mode on inside the engine's backward pass: a backward that
# differentiates again (torch.enable_grad, torch.autograd.grad, torch.func) instead of
# computing its gradient. The checks run backward without create_graph, so grad mode
# is off there unless the student's own backward turned it on.
AUTOGRAD_IN_BACKWARD_MARK = "autograd.inside_backward"
_AUTOGRAD_FUNCTIONS = frozenset({
    "torch.Tensor.backward", "torch.autograd.grad", "torch.autograd.backward",
    "torch._make_dual",
})

last_executed = frozenset()  # in-process: what the last run_check recorded
last_recorder_intact = True


class CheckFailed(AssertionError):
    """A graded check did not pass; the message says what to look at."""


def calling_own_functions(subject, names, call):
    """call(), and whether it ran any of the student's functions `names`, found
    beside `subject` in its notebook, by their code (so under any other name too).
    A watch replaced during the call counts as a run: what ran is then unknown.
    -> (call's result, ran)"""
    found = getattr(subject, "__globals__", {})
    watched = {getattr(found.get(name), "__code__", None) for name in names} - {None}
    return calling_code(lambda code: code in watched, call)


def calling_code(is_watched, call):
    """call(), and whether a Python function whose code object is_watched(code)
    ran during it. A watch replaced during the call counts as a run.
    -> (call's result, ran)"""
    seen = []

    def watch(frame, event, arg):
        if event == "call" and is_watched(frame.f_code):
            seen.append(frame.f_code.co_name)

    before = sys.getprofile()
    sys.setprofile(watch)
    try:
        result = call()
    finally:
        replaced = sys.getprofile() is not watch
        sys.setprofile(before)
    return result, bool(seen) or replaced


def answer_text(value):
    """An answer as the text it travels as. A one-number tensor or numpy scalar
    travels as its number in full: str() of a tensor keeps about five significant
    digits (805,306,368 prints as 8.0531e+08). A tensor is detached first, so
    that its text holds no grad_fn."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            number = value.item()
        except (ValueError, RuntimeError, TypeError):
            number = None
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            return repr(number)
    if hasattr(value, "detach"):
        value = value.detach()
    return str(value)


def to_array(value, *, what="the result"):
    """Turn a student's return value into a plain numpy array, or explain why not.

    The one conversion every probe uses, for arrays and single numbers alike.
    torch tensors (0-d ones too) are detached and moved to the CPU; numpy
    scalars are read as they are; the standard library's exact numbers (a
    Fraction, a Decimal, a large int), alone or in a list, become float64.
    Anything else numpy would only hold as an object (a custom class, ragged
    lists, None) is refused.
    """
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()
        if str(value.dtype) in ("torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2"):
            value = value.float()
        value = value.numpy()
    array = np.asarray(value)
    if array.dtype == object:
        numbers_read = _exact_numbers_as_floats(array)
        if numbers_read is None:
            raise TypeError(f"{what} is a {type(value).__name__}, not an array of numbers")
        return numbers_read
    return array.copy()


def _exact_numbers_as_floats(array):
    """An object array whose entries are all real numbers (Fraction, Decimal, int,
    float, numpy scalars), as float64; None when any entry is something else."""
    entries = array.ravel()
    if entries.size == 0 or not all(
            isinstance(entry, (numbers.Real, decimal.Decimal)) for entry in entries):
        return None
    try:
        return np.array([float(entry) for entry in entries],
                        dtype=np.float64).reshape(array.shape)
    except (ArithmeticError, TypeError, ValueError):  # an int past float64's range
        return None


# --- the recorder -------------------------------------------------------------------------

_NAME_CACHE = {}
_CLASS_CACHE = {}
_TORCH = {}  # what the recorder uses of torch, taken once torch is there


def _function_name(func):
    """'torch.nn.functional.layer_norm', 'torch.Tensor.add', 'aten::native_layer_norm'."""
    try:
        return _NAME_CACHE[func]
    except (KeyError, TypeError):
        pass
    schema = getattr(func, "_schema", None)  # an OpOverload: torch.ops.aten.x.default
    if schema is not None:
        name = str(schema.name)
    elif getattr(func, "_qualified_op_name", None):  # an OpOverloadPacket: torch.ops.aten.x
        name = str(func._qualified_op_name)
    else:
        name = _TORCH["resolve_name"](func)
        if not name:
            module = getattr(func, "__module__", None) or "torch"
            qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
            name = f"{module}.{qualname or type(func).__name__}"
        name = name.replace("._VariableFunctionsClass.", ".").replace(
            "torch._C._VariableFunctions.", "torch.")
    with contextlib.suppress(TypeError):
        _NAME_CACHE[func] = name
    return name


def _torch_classes(cls):
    """Qualified names of the torch classes in cls's MRO (a subclass counts as its bases)."""
    try:
        return _CLASS_CACHE[cls]
    except (KeyError, TypeError):
        pass
    names = tuple(f"{base.__module__}.{base.__qualname__}" for base in getattr(cls, "__mro__", ())
                  if str(getattr(base, "__module__", "")).split(".")[0] == "torch")
    with contextlib.suppress(TypeError):
        _CLASS_CACHE[cls] = names
    return names


def _load_torch():
    """Build the two mode classes the first time torch is there (never imports it)."""
    if _TORCH:
        return _TORCH
    # only called once torch is in sys.modules. torch imports _dynamo on the first call
    # made under a mode; imported then, inside a check's watched call, it would run under
    # the profile hook (6 s instead of 1 s)
    import torch
    import torch._dynamo  # noqa: F401
    from torch.overrides import TorchFunctionMode, resolve_name
    from torch.utils import _python_dispatch
    from torch.utils._python_dispatch import TorchDispatchMode

    c = torch._C
    graph_task_id = getattr(c, "_current_graph_task_id", None) or (lambda: -1)
    grad_enabled = c.is_grad_enabled
    f_len, f_at = c._len_torch_function_stack, c._get_function_stack_at
    d_len, d_at = c._len_torch_dispatch_stack, c._get_dispatch_stack_at
    all_disabled = c._is_torch_function_all_disabled
    excluded, python_key = c._dispatch_tls_is_dispatch_key_excluded, c.DispatchKey.Python
    function_names, autograd_names = _function_name, _AUTOGRAD_FUNCTIONS

    class FunctionRecorder(TorchFunctionMode):
        """Sees every torch-level function call: F.layer_norm, Tensor.backward, ..."""

        def __init__(self, recording):
            super().__init__()
            self.recording = recording
            self.depth = 0  # > 0 while a torch function we were handed runs
            self.dispatch = None

        def __torch_function__(self, func, types, args=(), kwargs=None):
            recording = self.recording
            name = function_names(func)
            recording.names.add(name)
            if name in autograd_names:
                recording.names.add(AUTOGRAD_MARK)
            dispatch = self.dispatch
            if dispatch is not None and not dispatch.depth:
                n = d_len()
                if not n or d_at(n - 1) is not dispatch or excluded(python_key):
                    recording.tampered("the dispatch recorder was not active")
            self.depth += 1
            try:
                return func(*args, **(kwargs or {}))
            finally:
                self.depth -= 1

    class DispatchRecorder(TorchDispatchMode):
        """Sees every aten op however it was reached (modules, subclasses, torch.ops)."""

        def __init__(self, recording, function_recorder):
            super().__init__()
            self.recording = recording
            self.function = function_recorder
            self.depth = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            recording = self.recording
            recording.names.add(function_names(func))
            if graph_task_id() != -1:  # the autograd engine is running a backward pass
                recording.names.add(AUTOGRAD_MARK)
                if grad_enabled():
                    recording.names.add(AUTOGRAD_IN_BACKWARD_MARK)
            function = self.function
            if not function.depth and not self.depth:
                # an op that no torch function led to: torch function must still be on
                n = f_len()
                if all_disabled() or not n or f_at(n - 1) is not function:
                    recording.tampered("the function recorder was not active")
            self.depth += 1
            try:
                return func(*args, **(kwargs or {}))
            finally:
                self.depth -= 1

    class ThreadFunctionRecorder(TorchFunctionMode):
        """Lives in every thread the student's code starts: while a check is
        recording, what the thread runs is recorded too (modes are per thread)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if _RECORDING_NOW:
                name = function_names(func)
                _RECORDING_NOW[-1].names.add(name)
                if name in autograd_names:
                    _RECORDING_NOW[-1].names.add(AUTOGRAD_MARK)
            return func(*args, **(kwargs or {}))

    class ThreadDispatchRecorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if _RECORDING_NOW:
                _RECORDING_NOW[-1].names.add(function_names(func))
                if graph_task_id() != -1:
                    _RECORDING_NOW[-1].names.add(AUTOGRAD_MARK)
                    if grad_enabled():
                        _RECORDING_NOW[-1].names.add(AUTOGRAD_IN_BACKWARD_MARK)
            return func(*args, **(kwargs or {}))

    def module_hook(module, args):
        if _RECORDING_NOW:
            _RECORDING_NOW[-1].names.update(_torch_classes(type(module)))

    def submodule_hook(module, name, submodule):
        # A module the student's code builds or holds (nn.LayerNorm inside a
        # wrapper, a borrowed encoder layer's norm1) counts even if never called.
        if _RECORDING_NOW and submodule is not None:
            _RECORDING_NOW[-1].names.update(_torch_classes(type(submodule)))

    _TORCH.update(
        torch=torch, resolve_name=resolve_name, FunctionRecorder=FunctionRecorder,
        DispatchRecorder=DispatchRecorder, module_hook=module_hook,
        ThreadFunctionRecorder=ThreadFunctionRecorder,
        ThreadDispatchRecorder=ThreadDispatchRecorder,
        submodule_hook=submodule_hook,
        register_submodule_hook=(
            torch.nn.modules.module.register_module_module_registration_hook),
        submodule_hooks=torch.nn.modules.module._global_module_registration_hooks,
        f_len=f_len, f_at=f_at, d_len=d_len, d_at=d_at, all_disabled=all_disabled,
        excluded=excluded, python_key=python_key,
        f_pop=c._pop_torch_function_stack, f_push=c._push_on_torch_function_stack,
        d_pop=_python_dispatch._pop_mode, d_push=_python_dispatch._push_mode,
        module_module=torch.nn.modules.module,
        register_hook=torch.nn.modules.module.register_module_forward_pre_hook,
        global_hooks=torch.nn.modules.module._global_forward_pre_hooks,
        handlers={
            ("FunctionRecorder", "__torch_function__"):
                FunctionRecorder.__dict__["__torch_function__"],
            ("DispatchRecorder", "__torch_dispatch__"):
                DispatchRecorder.__dict__["__torch_dispatch__"]},
    )
    return _TORCH


_RECORDING_NOW = []  # the module hook's target; a stack in case a check nests


class _TorchImportWatcher:
    """A meta-path finder that starts the recorder the moment torch is imported
    inside the student's call, so numpy-only checks never import torch themselves."""

    def __init__(self, on_import):
        self.on_import = on_import
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or self.busy:
            return None
        self.busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.busy = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original, on_import = loader.exec_module, self.on_import

        def exec_module(module):
            original(module)
            on_import()

        loader.exec_module = exec_module
        return spec


class _Recording:
    """What the student's code executed during one check, and whether the
    recorder stayed in place.

    names: torch functions by qualified name ("torch.nn.functional.layer_norm",
    "torch.Tensor.backward"), aten ops as "aten::<op>" without the overload,
    torch classes ("torch.nn.modules.normalization.LayerNorm") of every module
    called and of the subject itself (a subclass counts as its torch bases),
    and "autograd" when the autograd engine ran or a forward-mode dual was made.
    """

    def __init__(self):
        self.names = set()
        self.intact = True
        self.problems = []
        self._active = None  # (function mode, dispatch mode, expected stacks, hook)

    def tampered(self, why):
        self.intact = False
        if len(self.problems) < 20:
            self.problems.append(why)

    def note_subject(self, subject):
        items = subject if isinstance(subject, (tuple, list)) else (subject,)
        for item in items:
            self.names.update(_torch_classes(item if isinstance(item, type) else type(item)))
            modules = getattr(item, "modules", None)
            if not isinstance(item, type) and callable(modules):
                with contextlib.suppress(Exception):
                    for module in modules():
                        self.names.update(_torch_classes(type(module)))

    def _start(self):
        if self._active is not None:
            return
        try:
            t = _load_torch()
            f_before = [t["f_at"](i) for i in range(t["f_len"]())]
            d_before = [t["d_at"](i) for i in range(t["d_len"]())]
            function = t["FunctionRecorder"](self)
            dispatch = t["DispatchRecorder"](self, function)
            function.dispatch = dispatch
        except Exception as exc:  # a torch broken before the call: nothing can be recorded
            self.tampered(f"the recorder could not start ({type(exc).__name__})")
            return
        entered, hooks = [], []
        try:
            for mode in (function, dispatch):
                mode.__enter__()
                entered.append(mode)
            hooks.append(t["register_hook"](t["module_hook"]))
            hooks.append(t["register_submodule_hook"](t["submodule_hook"]))
        except Exception as exc:
            self.tampered(f"the recorder could not start ({type(exc).__name__})")
            # a hook left registered would record into every later check
            for hook in reversed(hooks):
                with contextlib.suppress(Exception):
                    hook.remove()
            for mode in reversed(entered):
                with contextlib.suppress(Exception):
                    mode.__exit__(None, None, None)
            return
        hook, submodule_hook = hooks
        self._active = (function, dispatch, f_before + [function], d_before + [dispatch], hook,
                        submodule_hook)

    def _stop(self):
        t = _TORCH
        function, dispatch, f_expected, d_expected, hook, submodule_hook = self._active
        self._active = None
        f_now = [t["f_at"](i) for i in range(t["f_len"]())]
        d_now = [t["d_at"](i) for i in range(t["d_len"]())]
        if len(f_now) != len(f_expected) or any(a is not b for a, b in zip(f_now, f_expected)):
            self.tampered("the torch function mode stack changed")
            self._restore(f_expected, t["f_len"], t["f_pop"], t["f_push"])
        if len(d_now) != len(d_expected) or any(a is not b for a, b in zip(d_now, d_expected)):
            self.tampered("the torch dispatch mode stack changed")
            self._restore(d_expected, t["d_len"], t["d_pop"], t["d_push"])
        if t["all_disabled"]() or t["excluded"](t["python_key"]):
            self.tampered("torch function or Python dispatch was left disabled")
        if hook.id not in t["global_hooks"] or \
                t["module_module"]._global_forward_pre_hooks is not t["global_hooks"]:
            self.tampered("the module hook was removed")
        if submodule_hook.id not in t["submodule_hooks"] or \
                t["module_module"]._global_module_registration_hooks is not t["submodule_hooks"]:
            self.tampered("the submodule hook was removed")
        for (cls_name, attr), handler in t["handlers"].items():
            if t[cls_name].__dict__.get(attr) is not handler:
                self.tampered(f"{cls_name}.{attr} was replaced")
        for mode in (function, dispatch):
            if type(mode) not in (t["FunctionRecorder"], t["DispatchRecorder"]) or any(
                    k.startswith("__torch_") for k in vars(mode)) or mode.recording is not self:
                self.tampered("a recorder was altered")
        for undo in (lambda: dispatch.__exit__(None, None, None),
                     lambda: function.__exit__(None, None, None), hook.remove,
                     submodule_hook.remove):
            try:
                undo()
            except Exception as exc:
                self.tampered(f"the recorder could not be taken down ({type(exc).__name__})")

    @staticmethod
    def _restore(expected, length, pop, push):
        """Put a mode stack back to `expected` so that the modes can be exited."""
        with contextlib.suppress(Exception):
            while length():
                pop()
            for mode in expected:
                push(mode)

    @contextlib.contextmanager
    def watching(self):
        """Record while the body runs; check afterwards that the recorder held."""
        watcher = None
        alive, reaped = _process_census()
        if alive:
            self.tampered("a process of the hand-in's was running while the grader "
                          "called its code")
        _RECORDING_NOW.append(self)
        try:
            if "torch" in sys.modules:
                self._start()
            else:
                watcher = _TorchImportWatcher(self._start)
                sys.meta_path.insert(0, watcher)
            yield self
        finally:
            if watcher is not None:
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(watcher)
            if self._active is not None:
                self._stop()
            if _RECORDING_NOW and _RECORDING_NOW[-1] is self:
                _RECORDING_NOW.pop()
            else:
                self.tampered("the recorder's own bookkeeping changed")
            if not _runner_unchanged():
                self.tampered("the check runner's functions were replaced")
            if _process_census() != (alive, reaped):
                self.tampered("the hand-in's code started a process while the grader "
                              "called it")

    def executed(self):
        return sorted(self.names)


# --- running a check ----------------------------------------------------------------------


def _probe_one(subject, case, probe):
    """(outputs {key: array}, error text or None) for one case."""
    try:
        result = probe(subject, case)
        return {key: to_array(value) for key, value in result.items()}, None
    except Exception as exc:  # the student's code may raise anything
        return {}, f"{type(exc).__name__}: {exc}"[:2000]


def _probe_all(subject, cases, probe, recording=None):
    """Call probe on every case; with a recording, record while each call and
    its results' conversion run (a result may be a lazy object of the student's)."""
    outputs, errors = {}, {}
    for i, (_, case) in enumerate(cases):
        if recording is None:
            result, error = _probe_one(subject, case, probe)
        else:
            with recording.watching():
                result, error = _probe_one(subject, case, probe)
        if error is not None:
            errors[str(i)] = error
        for key, value in result.items():
            outputs[f"{i}/{key}"] = value
    return outputs, errors


def _note_subject(recording, subject):
    """Note the subject's torch classes while recording: looking at the subject
    calls its own code (modules()), which counts like any other call."""
    with recording.watching():
        recording.note_subject(subject)


def _ask_grader(header, arrays=None):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(os.environ[SOCKET_ENV])
        _wire.send(sock, header, arrays)
        return _wire.receive(sock)


def run_check(name, subject, probe):
    """Run check `name` on `subject` (the student's function, class or values).

    probe(subject, case) -> {key: array} calls the student's code on one case.
    Prints the verdict's message; raises CheckFailed when the check fails.
    """
    global last_executed, last_recorder_intact
    if os.environ.get(SOCKET_ENV):
        reply, arrays = _ask_grader({"op": "cases", "check": name})
        cases = _wire.unflatten_cases(reply["labels"], arrays)
        recording = _Recording() if reply.get("record") is True else None
        if recording is not None:
            _note_subject(recording, subject)
        outputs, errors = _probe_all(subject, cases, probe, recording)
        header = {"op": "judge", "check": name, "errors": errors,
                  "executed": recording.executed()[:MAX_EXECUTED] if recording else [],
                  "recorder_intact": recording.intact if recording else True}
        verdict, _ = _ask_grader(header, outputs)
    else:
        from normref.checks import _registry

        cases = _registry.make_cases(name)
        recording = _Recording()
        _note_subject(recording, subject)
        outputs, errors = _probe_all(subject, cases, probe, recording)
        last_executed = frozenset(recording.names)
        last_recorder_intact = recording.intact
        verdict = _registry.judge(name, cases, outputs, errors)
    if not verdict["passed"]:
        raise CheckFailed(verdict["message"])
    print(verdict["message"])


_ORIGINALS = {name: globals()[name] for name in (
    "run_check", "_probe_all", "_probe_one", "to_array", "_ask_grader", "_Recording",
    "_note_subject",
    "_load_torch", "_function_name", "_torch_classes", "_TorchImportWatcher")}
_ORIGINAL_CODE = {name: getattr(value, "__code__", None) for name, value in _ORIGINALS.items()}
_ORIGINAL_METHODS = {name: getattr(_Recording, name) for name in (
    "watching", "_start", "_stop", "tampered", "note_subject", "executed")}


def _arm_new_thread(frame, event, arg):
    """Profile hook of every thread started through `threading` after this
    module loaded: once torch is there, the thread records into whatever check
    is recording, then the hook removes itself."""
    if "torch" not in sys.modules:
        return
    sys.setprofile(None)
    try:
        t = _load_torch()
        t["ThreadFunctionRecorder"]().__enter__()
        t["ThreadDispatchRecorder"]().__enter__()
    except Exception:  # noqa: BLE001 - a broken torch records nothing anywhere
        return


def _process_census():
    """(children alive, CPU seconds of reaped children) of this process.

    Counted as the kernel's children: a process the hand-in started, still
    running or already reaped.
    """
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    alive = 0
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                alive += len(f.read().split())
    return alive, usage.ru_utime + usage.ru_stime


# Only in a grading kernel (the grader gives it the check socket before anything
# runs): a grader or a notebook outside grading must not have torch modes entered in
# every thread it starts (a thread that ends with a mode entered aborts the process
# when it exits during interpreter shutdown).
if os.environ.get(SOCKET_ENV):
    threading.setprofile(_arm_new_thread)


def _runner_unchanged():
    """False when this module's functions, or the recorder's methods, were swapped."""
    here = globals()
    for name, value in _ORIGINALS.items():
        if here.get(name) is not value or getattr(value, "__code__", None) is not \
                _ORIGINAL_CODE[name]:
            return False
    return all(getattr(_Recording, name) is value for name, value in _ORIGINAL_METHODS.items())
