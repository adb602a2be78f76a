"""Unit 07 checks, the student-facing half: launching the student's Triton kernels.

The contract: the student passes the @triton.jit kernels themselves,

    rms_norm_fwd_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE)
    rms_norm_bwd_kernel(DX, DY, X, W, Rstd, PartialDW, row_stride, M, N,
                        rows_per_program, BLOCK_SIZE)

and the probe launches them: the forward with one program per row, the backward
with one program per run of `rows_per_program` consecutive rows, each writing
its share of dW as one float32 row of PartialDW. The memory is laid out to make
mistakes visible and harmless: rows sit `row_stride` >= BLOCK_SIZE elements
apart; the lanes of x, dy and w past N hold NaN, so a kernel that loads them
gets NaN; the outputs (y, dx, their padding, Rstd, PartialDW) start as
UNWRITTEN, so what was never stored and what was stored past N both show; and
every buffer has room for BLOCK_SIZE lanes past its last row, and the backward's
for rows_per_program rows past it (NaN in x, dy and rstd), so no kernel can touch
memory outside it (which can crash the interpreter): a last program that runs past
row M - 1 shows as rows of dx stored past the last.

Before launching, the probe makes sure the object is a kernel (verify_kernel_object):
exactly Triton's JITFunction, or the interpreter's InterpretedFunction under
TRITON_INTERPRET=1 (type(), not isinstance(), which a __class__ can fool); a Python
function with its source behind it, decorated with @triton.jit; and a body that
stays inside Triton. Under the interpreter a kernel body is plain Python that
could call torch or numpy, so its syntax tree may name only the kernel's
arguments and locals, tl/triton (the real modules, and their real functions),
@triton.jit helpers (checked the same way), constants and a few builtins; no
imports, no dunder or private attributes, no `.handle` (the interpreter's numpy
data); no hooks that run code at launch, and Triton's launch machinery unchanged.
"""

import numpy as np

from normref.checks._runner import answer_text, run_check

UNWRITTEN = -1024.0  # exact in float16, bfloat16 and float32; no case's output is near it
FORWARD_SIGNATURE = "rms_norm_fwd_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE)"
BACKWARD_SIGNATURE = ("rms_norm_bwd_kernel(DX, DY, X, W, Rstd, PartialDW, row_stride, M, N, "
                      "rows_per_program, BLOCK_SIZE)")


# Builtins a kernel body may call: none of them reaches outside Triton.
KERNEL_BUILTINS = frozenset({"range", "min", "max", "abs", "int", "float", "bool", "len",
                             "print", "isinstance", "tuple", "zip", "enumerate"})
# Attributes a kernel has no use for: the interpreter keeps a tensor's numpy data in
# `.handle`, and dunder and private attributes lead to Python's internals.
REFUSED_ATTRIBUTES = frozenset({"handle"})
# What the interpreter's InterpretedFunction holds; anything else was put there.
_INTERPRETED_ATTRIBUTES = frozenset({"fn", "rewriter", "kwargs", "pre_run_hooks", "arg_names"})


class KernelRefused(TypeError):
    """The object passed is not a Triton kernel the grader can run as one."""


def _triton_types():
    from triton.runtime.interpreter import FunctionRewriter, InterpretedFunction
    from triton.runtime.jit import JITFunction

    return JITFunction, InterpretedFunction, FunctionRewriter


def _triton_root():
    import os

    import triton

    return os.path.dirname(os.path.realpath(triton.__file__)) + os.sep


def _is_kernel_module(value):
    """triton or triton.language (and its submodules), the real ones: the only
    modules a kernel body may name."""
    import sys
    import types

    return (type(value) is types.ModuleType and sys.modules.get(value.__name__) is value
            and (value.__name__ in ("triton", "triton.language")
                 or value.__name__.startswith("triton.language.")))


def _comes_from_triton(value):
    """True for Triton's own language (tl.load, tl.float32, tl.constexpr, tl.sum,
    triton.cdiv, ...), false for other modules and for anything put in its place."""
    import os
    import types

    if isinstance(value, types.ModuleType):
        return _is_kernel_module(value)
    if type(value) is types.FunctionType:
        filename = os.path.realpath(value.__code__.co_filename)
        return (filename.startswith(_triton_root())
                and str(value.__module__ or "").startswith("triton"))
    if type(value) in _triton_types()[:2]:  # a @triton.jit function of Triton's own
        return _comes_from_triton(value.fn)
    if isinstance(value, type):
        return _class_from_triton(value)
    if isinstance(value, (types.BuiltinFunctionType, types.MethodType)):
        return False
    return _class_from_triton(type(value))


def _class_from_triton(cls):
    """A class of Triton's own: it says so, and the code of every method along its
    MRO lives in Triton's package or Python's standard library. `__module__` alone
    is a string anyone can set."""
    import os
    import sysconfig

    if not str(getattr(cls, "__module__", "")).startswith("triton"):
        return False
    homes = (_triton_root(), os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep)
    for klass in cls.__mro__:
        for value in vars(klass).values():
            targets = ((value.fget, value.fset, value.fdel) if isinstance(value, property)
                       else (getattr(value, "__func__", value),))
            for target in targets:
                code = getattr(target, "__code__", None)
                if code is not None and not os.path.realpath(code.co_filename).startswith(homes):
                    return False
    return True


def _is_constant(value):
    import triton.language as tl

    if type(value) is tl.constexpr:
        value = value.value
    return value is None or type(value) in (bool, int, float, str)


def _dotted(node):
    """["tl", "math", "sqrt"] for tl.math.sqrt; None for anything else."""
    import ast

    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id] + parts[::-1]
    return None


def _kernel_source(kernel, fn):
    """The source the kernel runs from: what the interpreter re-reads and executes
    (from the `def` line on), or what a compiled kernel is compiled from."""
    import inspect
    import textwrap

    JITFunction, _, _ = _triton_types()
    try:
        lines, _ = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        raise KernelRefused("the kernel's source code cannot be found: define it with "
                            "@triton.jit in a cell (or a file), not with exec or eval") from None
    full = textwrap.dedent("".join(lines))
    defs = [i for i, line in enumerate(lines) if line.strip().startswith("def ")]
    if len(defs) != 1:
        raise KernelRefused("the kernel's source must hold exactly one `def` line (no nested "
                            "functions, no docstring line starting with 'def ')")
    body = textwrap.dedent("".join(lines[defs[0]:]))
    if type(kernel) is JITFunction and kernel.src.strip() != body.strip():
        raise KernelRefused("the kernel's compiled source is not the source of its function")
    return full, body


_ALLOWED = ("Under the interpreter a kernel body is plain Python and could call torch or "
            "numpy, so the grader accepts only tl.* (and triton.*) operations, the kernel's "
            "arguments and local variables, @triton.jit helpers, constants and the builtins "
            + ", ".join(sorted(KERNEL_BUILTINS)))


def _check_tree(tree, fn, where, checked, first_line=1):
    """Refuse names and attributes that reach outside Triton; returns the number
    of calls into Triton's language that the body (and its helpers) make."""
    import ast
    import builtins

    def refuse(node, text):
        raise KernelRefused(f"{where}, line {first_line + node.lineno - 1}: {text}")

    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise KernelRefused(f"{where}: the source should be a single function definition")
    func = tree.body[0]
    if not any((_dotted(d.func if isinstance(d, ast.Call) else d) or [""])[-1] == "jit"
               for d in func.decorator_list):
        raise KernelRefused(f"{where}: the function is not decorated with @triton.jit")
    args = func.args
    local = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    local |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    local |= {node.id for node in ast.walk(func)
              if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del))}
    parents = {child: node for node in ast.walk(func) for child in ast.iter_child_nodes(node)}
    in_decorators = {id(n) for d in func.decorator_list for n in ast.walk(d)}
    fn_globals = fn.__globals__
    triton_calls = 0
    for node in ast.walk(func):
        if node is not func and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                  ast.Lambda, ast.ClassDef)):
            refuse(node, "a kernel body defines no functions or classes of its own")
        if isinstance(node, ast.Raise):
            raised = _dotted(node.exc.func if isinstance(node.exc, ast.Call) else node.exc)
            if raised and raised[-1] == "NotImplementedError":
                refuse(node, "the kernel still raises NotImplementedError: its body is not "
                             "written yet")
            refuse(node, "a kernel body cannot raise Python exceptions (tl.device_assert "
                         "checks a condition)")
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal,
                             ast.Await, ast.Yield, ast.YieldFrom)):
            refuse(node, f"`{ast.unparse(node)}` has no place in a kernel body")
        if isinstance(node, ast.Attribute) and (node.attr.startswith("_")
                                                or node.attr in REFUSED_ATTRIBUTES):
            refuse(node, f"the attribute .{node.attr} leads out of Triton (the interpreter "
                         "keeps numpy arrays and Python internals behind it); use tl "
                         "operations only")
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
            continue
        name = node.id
        if name.startswith("__"):
            refuse(node, f"`{name}` is Python's internals, not Triton")
        if name in local:
            continue
        if name not in fn_globals:
            if name in KERNEL_BUILTINS:
                continue
            refuse(node, f"`{name}` is not an argument, a local variable, tl or triton, nor "
                         "one of the builtins a kernel may use ("
                         + ", ".join(sorted(KERNEL_BUILTINS)) + ")"
                         + (": it is a Python builtin that leads out of Triton"
                            if hasattr(builtins, name) else ""))
        value = fn_globals[name]
        if type(value) in _triton_types()[:2] and not _comes_from_triton(value):
            # a @triton.jit helper of the student's: the same rules, and its tl calls count
            triton_calls += _check_kernel_function(value, checked)
            continue
        if _is_constant(value):
            continue
        if not _comes_from_triton(value):
            what = (f"the module {value.__name__}" if isinstance(value, type(builtins))
                    else f"a {type(value).__name__}")
            refuse(node, f"the kernel uses `{name}` ({what}), which is not Triton. {_ALLOWED}")
        # tl.x.y: follow the whole chain; every step must be Triton's own, and it may
        # not end on a module (a module held in a variable would escape this check)
        top, parts = node, [name]
        while isinstance(parents.get(top), ast.Attribute):
            top = parents[top]
            parts.append(top.attr)
        for i, attr in enumerate(parts[1:], start=1):
            shown = ".".join(parts[: i + 1])
            if not hasattr(value, attr):
                refuse(node, f"{shown} does not exist in Triton")
            value = getattr(value, attr)
            if not _comes_from_triton(value):
                refuse(node, f"{shown} is not Triton's own (a module or function from "
                             "outside Triton, or something put in its place). " + _ALLOWED)
        if isinstance(value, type(builtins)):
            refuse(node, f"{'.'.join(parts)} is a module: use its operations "
                         f"({'.'.join(parts)}.something(...)), do not pass it around")
        call = parents.get(top)
        if isinstance(call, ast.Call) and call.func is top and id(call) not in in_decorators:
            triton_calls += 1
    return triton_calls


def _plain_jit_options(options):
    """@triton.jit's own options (debug=True, do_not_specialize=[...]) and no callables."""
    if type(options) is not dict:
        return False
    for key, value in options.items():
        if key in ("launch_metadata", "repr"):
            if value is not None:
                return False
        elif type(value) in (list, tuple):
            if not all(_is_constant(v) for v in value):
                return False
        elif not _is_constant(value):
            return False
    return True


def _check_kernel_function(kernel, checked):
    """Check one @triton.jit function (the kernel or a helper it calls)."""
    import ast
    import types

    JITFunction, InterpretedFunction, FunctionRewriter = _triton_types()
    if id(kernel) in checked:
        return 0
    checked.add(id(kernel))
    fn = kernel.fn
    name = getattr(fn, "__name__", "the kernel")
    if type(fn) is not types.FunctionType:
        raise KernelRefused(f"{name} wraps a {type(fn).__name__}, not a Python function with "
                            "Triton source")
    if fn.__code__.co_freevars:
        raise KernelRefused(f"{name} uses variables of an enclosing function "
                            f"({', '.join(fn.__code__.co_freevars)}); define the kernel at the "
                            "top level of a cell")
    defaults = list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
    if not all(_is_constant(value) for value in defaults):
        raise KernelRefused(f"{name} has a default argument that is not a constant")
    if type(kernel) is InterpretedFunction:
        extra = set(vars(kernel)) - _INTERPRETED_ATTRIBUTES
        if (extra or type(kernel.rewriter) is not FunctionRewriter
                or kernel.rewriter.fn is not fn or not _plain_jit_options(kernel.kwargs)):
            raise KernelRefused(f"{name} has been changed after @triton.jit made it"
                                + (f" ({', '.join(sorted(extra))})" if extra else ""))
        # the interpreter caches the rewritten function by fn: run from the source checked here
        InterpretedFunction.rewritten_fn.pop(fn, None)
    else:  # a compiled kernel: nothing of the instance may stand in for a method
        import inspect

        shadowing = sorted(attr for attr in vars(kernel)
                           if callable(inspect.getattr_static(type(kernel), attr, None))
                           and not isinstance(inspect.getattr_static(type(kernel), attr),
                                              property))
        if shadowing:
            raise KernelRefused(f"{name} has been changed after @triton.jit made it "
                                f"({', '.join(shadowing)})")
    if list(kernel.pre_run_hooks):
        raise KernelRefused(f"{name} has pre-run hooks: code that runs outside the kernel "
                            "at each launch")
    full, body = _kernel_source(kernel, fn)
    try:
        tree = ast.parse(full)
    except SyntaxError as exc:
        raise KernelRefused(f"the source of {name} does not parse: {exc}") from None
    return _check_tree(tree, fn, f"in {name}", checked, first_line=fn.__code__.co_firstlineno)


def _check_launch_hooks(kernel):
    """A compiled launch calls Triton's launch and cache hooks: code outside the
    kernel that could compute the outputs itself. The grading needs none."""
    from triton import knobs
    from triton.knobs import HookChain

    if kernel.launch_metadata is not None:
        raise KernelRefused("the kernel has a launch_metadata hook: code that runs outside "
                            "the kernel at each launch")
    runtime = knobs.runtime
    for name in ("launch_enter_hook", "launch_exit_hook"):
        chain = getattr(runtime, name)
        if type(chain) is not HookChain or chain.calls:
            raise KernelRefused(f"triton.knobs.runtime.{name} is set: code that runs outside "
                                "the kernel at each launch")
    for name in ("jit_cache_hook", "jit_post_compile_hook", "add_stages_inspection_hook"):
        if getattr(runtime, name) is not None:
            raise KernelRefused(f"triton.knobs.runtime.{name} is set: code that runs outside "
                                "the kernel when it is compiled")


def _launch_machinery_problem():
    """What of Triton's launch machinery was replaced (methods, the interpreter's
    cache), or None: the kernel is only what runs if Triton itself runs it."""
    import os

    from triton.runtime import interpreter, jit

    root = _triton_root()
    methods = [(jit.KernelInterface, "__getitem__"), (jit.JITFunction, "run"),
               (interpreter.InterpretedFunction, "run"),
               (interpreter.InterpretedFunction, "rewrite"),
               (interpreter.FunctionRewriter, "rewrite_ast"),
               (interpreter.FunctionRewriter, "_compile_and_exec"),
               (interpreter.GridExecutor, "__call__")]
    for cls, attr in methods:
        method = cls.__dict__.get(attr)
        code = getattr(method, "__code__", None)
        if code is None or not os.path.realpath(code.co_filename).startswith(root):
            return f"{cls.__name__}.{attr}"
    if type(interpreter.InterpretedFunction.__dict__.get("rewritten_fn")) is not dict:
        return "InterpretedFunction.rewritten_fn"
    return None


def verify_kernel_object(kernel, signature=FORWARD_SIGNATURE):
    """Refuse, with the reason, anything but a real @triton.jit kernel whose body
    stays inside Triton. Returns "cpu" (interpreter) or "cuda" (compiled)."""
    import torch

    JITFunction, InterpretedFunction, _ = _triton_types()
    kind = type(kernel)  # type(), not isinstance(): __class__ can be made to lie
    if kind is not InterpretedFunction and kind is not JITFunction:
        raise KernelRefused(f"pass the @triton.jit kernel itself ({signature}), "
                            f"not {kind.__name__}")
    replaced = _launch_machinery_problem()
    if replaced:
        raise KernelRefused(f"Triton's own {replaced} has been replaced: the grader only runs "
                            "kernels through Triton itself")
    if not _check_kernel_function(kernel, set()):
        raise KernelRefused("the kernel's body calls no tl. operation: it must load, compute "
                            "and store with Triton (tl.load, tl.sum, tl.store, ...)")
    if kind is InterpretedFunction:
        return "cpu"
    _check_launch_hooks(kernel)
    if torch.cuda.is_available():
        return "cuda"
    raise RuntimeError("your kernel was compiled for a GPU and there is none: set "
                       "os.environ['TRITON_INTERPRET'] = '1' before the kernels are defined "
                       "(@triton.jit reads it; restart the kernel and run the cells from "
                       "the top)")


def _padded(values, width, length, dtype, device):
    """A NaN buffer of `length` elements holding `values` (rows, N) at rows `width` apart."""
    import torch

    buffer = torch.full((length,), float("nan"), dtype=dtype, device=device)
    rows = values.reshape(-1, values.shape[-1])
    grid = buffer[: rows.shape[0] * width].view(rows.shape[0], width)
    grid[:, : rows.shape[1]] = rows.to(dtype)
    return buffer


def _tensor(case, key, device):
    import torch

    return torch.from_numpy(np.asarray(case[key], dtype=np.float32)).to(device)


def _layout(case, device):
    """(dtype, M, N, BLOCK_SIZE, row_stride, buffer length) for a case."""
    import torch

    m, n = np.asarray(case["x"]).shape
    block = 1 << (n - 1).bit_length()  # next power of two >= n
    stride = block + int(case["pad"])
    return getattr(torch, str(case["dtype"])), m, n, block, stride, m * stride + block


def _rows(buffer, m, n, block, stride):
    """(values (M, N) as float32, how many lanes past N were written)."""
    rows = buffer[: m * stride].view(m, stride)
    return rows[:, :n].float(), np.array(int((rows[:, n:block] != UNWRITTEN).sum()))


def _launch_forward(kernel, case):
    import torch

    device = verify_kernel_object(kernel, FORWARD_SIGNATURE)
    dtype, m, n, block, stride, size = _layout(case, device)
    x = _padded(_tensor(case, "x", device), stride, size, dtype, device)
    w = _padded(_tensor(case, "gamma", device), block, block, dtype, device)
    y = torch.full((size,), UNWRITTEN, dtype=dtype, device=device)
    rstd = torch.full((m + block,), UNWRITTEN, dtype=torch.float32, device=device)
    kernel[(m,)](x, y, w, rstd, stride, n, float(case["eps"]), BLOCK_SIZE=block)
    values, padding_written = _rows(y, m, n, block, stride)
    return {"y": values, "rstd": rstd[:m], "padding_written": padding_written}


def _launch_backward(kernel, case):
    import torch

    device = verify_kernel_object(kernel, BACKWARD_SIGNATURE)
    dtype, m, n, block, stride, size = _layout(case, device)
    rows_per_program = int(case["rows_per_program"])
    programs = -(-m // rows_per_program)
    # rows_per_program spare rows past the last, NaN in x, dy and rstd: a last program
    # that runs past row M - 1 reads them (and dx shows what it stored there) instead
    # of memory the interpreter does not own, which can crash the kernel
    size += rows_per_program * stride
    x = _padded(_tensor(case, "x", device), stride, size, dtype, device)
    dy = _padded(_tensor(case, "dy", device), stride, size, dtype, device)
    w = _padded(_tensor(case, "gamma", device), block, block, dtype, device)
    rstd = torch.full((m + rows_per_program,), float("nan"), dtype=torch.float32,
                      device=device)
    rstd[:m] = _tensor(case, "rstd", device)  # float32, computed by the grader
    dx = torch.full((size,), UNWRITTEN, dtype=dtype, device=device)
    # room for a row per row of x, so that a kernel storing by row instead of by
    # program stays inside the buffer (and shows in partial_overrun)
    partial = torch.full(((m + rows_per_program) * n + block,), UNWRITTEN,
                         dtype=torch.float32, device=device)
    kernel[(programs,)](dx, dy, x, w, rstd, partial, stride, m, n, rows_per_program,
                        BLOCK_SIZE=block)
    values, padding_written = _rows(dx, m, n, block, stride)
    past_last_row = max(m * stride, (m - 1) * stride + block)
    return {"dx": values, "partial_dw": partial[: programs * n].view(programs, n),
            "padding_written": padding_written,
            "rows_past_m_written": np.array(int((dx[past_last_row:] != UNWRITTEN).sum())),
            "partial_overrun": np.array(int((partial[programs * n:] != UNWRITTEN).sum()))}


def check_rms_forward_rows(rms_norm_fwd_kernel):
    """Check the forward kernel's y on float32 rows whose N is a power of two."""
    run_check("rms_forward_rows", rms_norm_fwd_kernel, _launch_forward)


def check_rms_forward_ragged_rows(rms_norm_fwd_kernel):
    """Check the forward kernel's y on rows whose N is not a power of two."""
    run_check("rms_forward_ragged", rms_norm_fwd_kernel, _launch_forward)


def check_rms_forward_rstd(rms_norm_fwd_kernel):
    """Check the rstd the forward kernel saves for the backward pass."""
    run_check("rms_forward_rstd", rms_norm_fwd_kernel, _launch_forward)


def check_rms_forward_half_precision(rms_norm_fwd_kernel):
    """Check the forward kernel on float16 and bfloat16 rows."""
    run_check("rms_forward_half", rms_norm_fwd_kernel, _launch_forward)


def check_rms_backward_dx(rms_norm_bwd_kernel):
    """Check dx from the backward kernel, float32 and half precision."""
    run_check("rms_backward_dx", rms_norm_bwd_kernel, _launch_backward)


def check_rms_backward_partial_dw(rms_norm_bwd_kernel):
    """Check each program's share of dW (the rows of PartialDW) and their sum."""
    run_check("rms_backward_partial_dw", rms_norm_bwd_kernel, _launch_backward)


def _answer_as_text(answer, case):
    return {"answer": np.array(answer_text(answer))}


def check_llama_bytes(llama_eager_bytes):
    """Check the bytes the eight eager kernels of LlamaRMSNorm move in bfloat16."""
    run_check("rms_llama_bytes", llama_eager_bytes, _answer_as_text)


def check_backward_bytes(backward_bytes):
    """Check the bytes the whole two-stage backward (kernel and sum) moves."""
    run_check("rms_backward_bytes", backward_bytes, _answer_as_text)



def check_fused_fraction_of_peak(fused_fraction_of_peak):
    """Check the fraction of the A100's peak bandwidth the quoted fused RMSNorm reached."""
    run_check("rms_fused_fraction_of_peak", fused_fraction_of_peak, _answer_as_text)


def check_eager_time_prediction(predicted_eager_ms):
    """Check the eager LlamaRMSNorm's time predicted from its bytes and the fused rate."""
    run_check("rms_eager_time_prediction", predicted_eager_ms, _answer_as_text)


# --- the autograd.Function ------------------------------------------------------------

FUNCTION_LAUNCHERS = ("launch_rms_forward", "launch_rms_backward")


def _function_class(function):
    """The student's class, if it is a torch.autograd.Function subclass."""
    import torch

    if not (isinstance(function, type) and issubclass(function, torch.autograd.Function)):
        raise TypeError("pass the class itself, a subclass of torch.autograd.Function "
                        f"(got a {type(function).__name__})")
    return function


def _like_rows(values, x):
    """`values` (M, N) in x's dtype, laid out as the launchers lay out their results:
    rows x.stride(0) apart."""
    import torch

    m, n = x.shape
    stride = x.stride(0)
    memory = torch.empty(m * stride + n, dtype=x.dtype, device=x.device)
    rows = memory[: m * stride].view(m, stride)[:, :n]
    rows.copy_(values)
    return rows


def _launcher_layout_problem(x, dy=None):
    if x.dim() != 2 or x.stride(1) != 1:
        return (f"the launchers take rows (M, N) whose features are adjacent; got shape "
                f"{tuple(x.shape)} with strides {tuple(x.stride())}")
    if dy is not None and dy.stride() != x.stride():
        return (f"dy must be laid out like x: strides {tuple(dy.stride())} and "
                f"{tuple(x.stride())}; hand launch_rms_backward an x and a dy laid out "
                "alike (both made contiguous, for instance)")
    return None


def _eager_forward(x, weight, eps=1e-5):
    """launch_rms_forward's contract, in float32 like the kernel."""
    problem = _launcher_layout_problem(x)
    if problem:
        raise ValueError(problem)
    rows = x.float()
    rstd = rows.pow(2).mean(-1).add(eps).rsqrt()  # M
    return _like_rows(rows * rstd[:, None] * weight.float(), x), rstd


def _eager_backward(dy, x, weight, rstd, rows_per_program=None):
    """launch_rms_backward's contract, in float32 like the kernel, from the rstd given."""
    problem = _launcher_layout_problem(x, dy)
    if problem:
        raise ValueError(problem)
    rstd = rstd.float()[:, None]  # M,1
    x_hat, g = x.float() * rstd, dy.float() * weight.float()
    dx = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    return _like_rows(dx, x), (dy.float() * x_hat).sum(0)


def _stand_in_launchers(function, calls):
    """Put eager stand-ins for the launchers, their calls counted, where the Function
    finds the assignment's: the Function is graded on its own (a slip in a kernel costs
    only that kernel's cells, and launchers of the hand-in's own are not used). The
    backward stand-in also counts the rstd tensors it gets that are not one the forward
    stand-in returned (a recomputed rstd). Returns a function that puts the originals
    back."""
    import torch

    namespace = getattr(getattr(function, "forward", None), "__globals__", None)
    if not isinstance(namespace, dict):
        return lambda: None
    missing = object()
    originals = {name: namespace.get(name, missing) for name in FUNCTION_LAUNCHERS}

    returned_rstd = []  # data pointers of the rstd tensors launch_rms_forward returned

    def forward(*args, **kwargs):
        calls["launch_rms_forward"] += 1
        y, rstd = _eager_forward(*args, **kwargs)
        returned_rstd.append(rstd.data_ptr())
        return y, rstd

    def backward(dy, x, weight, rstd, *args, **kwargs):
        calls["launch_rms_backward"] += 1
        if not isinstance(rstd, torch.Tensor) or rstd.data_ptr() not in returned_rstd:
            calls["rstd_not_saved"] += 1
        return _eager_backward(dy, x, weight, rstd, *args, **kwargs)

    namespace["launch_rms_forward"], namespace["launch_rms_backward"] = forward, backward

    def restore():
        for name, launcher in originals.items():
            if launcher is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = launcher
    return restore


def _sliced_leaf(values, width, dtype, device):
    """(leaf, view): a leaf tensor of rows `width` wide, and its first N columns."""
    import torch

    n = values.shape[-1]
    wide = torch.zeros(values.shape[:-1] + (width,), dtype=dtype, device=device)
    wide[..., :n] = values.to(dtype)
    return wide, wide[..., :n]


def _call_function(function, case):
    """Run RMSNormFunction.apply(x, w, eps), then backward with the case's dy."""
    import torch

    function = _function_class(function)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, str(case["dtype"]))
    shape = tuple(int(s) for s in case["shape"])
    n = shape[-1]
    x_values = _tensor(case, "x", device).reshape(shape)
    x_leaf, x = _sliced_leaf(x_values, int(case["x_width"]), dtype, device)
    x_leaf.requires_grad_()
    x = x_leaf[..., :n]
    w = _tensor(case, "gamma", device).to(dtype).requires_grad_()
    _, dy = _sliced_leaf(_tensor(case, "dy", device).reshape(shape),
                         int(case["dy_width"]), dtype, device)
    calls = dict.fromkeys(FUNCTION_LAUNCHERS + ("rstd_not_saved",), 0)
    restore = _stand_in_launchers(function, calls)
    try:
        y = function.apply(x, w, float(case["eps"]))
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != shape:
            raise TypeError(f"forward returned {type(y).__name__} of shape "
                            f"{tuple(getattr(y, 'shape', ()))}; it must return y, shaped "
                            f"like x {shape}")
        y.backward(dy)
    finally:
        restore()
    missing = np.full(shape, UNWRITTEN, np.float32)
    dx = x_leaf.grad[..., :n].float() if x_leaf.grad is not None else missing
    dw = w.grad.float() if w.grad is not None else missing[(0,) * (len(shape) - 1)]
    return {"y": y.float(), "dx": dx, "dw": dw,
            "dx_missing": np.array(int(x_leaf.grad is None)),
            "dw_missing": np.array(int(w.grad is None)),
            "forward_calls": np.array(calls["launch_rms_forward"]),
            "backward_calls": np.array(calls["launch_rms_backward"]),
            "rstd_not_saved": np.array(calls["rstd_not_saved"])}


def check_rms_autograd_function(RMSNormFunction):
    """Check y, x.grad and weight.grad of the student's torch.autograd.Function."""
    run_check("rms_autograd_function", RMSNormFunction, _call_function)
