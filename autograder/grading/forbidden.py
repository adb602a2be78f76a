"""What an exercise forbids, judged on what the student's code executed.

A policy file, autograder/policies/<assignment>.json, holds per grade cell a
rule that the assignment text can quote and the executed-name patterns that
break it:

    {"cells": {"ln_single_token": {
        "rule": "While the grader calls your layer_norm, it must not ...",
        "forbidden": ["torch.*layer_norm*", "aten::*layer_norm*", ...]}}}

A cell may also list "library_functions", {file: [function names]}: Python
functions (numpy's and the statistics module's variances) that the unit's own
check refuses by watching calls; the policy holds them only so that the
assignment's rules cell (authoring.rules_cell) can tell a student when validating.

The names come from the recorder in normref/checks/_runner.py, which notes
what torch executed while a check called the student's code: torch functions
by qualified name ("torch.nn.functional.layer_norm", "torch.Tensor.backward"),
aten ops as "aten::<op>" without the overload ("aten::native_layer_norm"),
torch classes of the modules called and of the subject
("torch.nn.modules.normalization.LayerNorm", a subclass counting as its torch
bases), and "autograd" when the autograd engine ran or a forward-mode dual
was made.

A pattern matches a name
- exactly ("autograd", "torch.nn.functional.layer_norm");
- as a prefix ending at a "." or "::" boundary: "torch.nn.modules.batchnorm"
  matches "torch.nn.modules.batchnorm.BatchNorm1d", "torch.autograd" matches
  "torch.autograd.grad", "aten::native_layer_norm" matches an overload
  "aten::native_layer_norm.default" but not "aten::native_layer_norm_backward";
- as a case-sensitive shell glob when it holds "*", "?" or "[":
  "aten::*batch_norm*" matches every aten op with batch_norm in its name
  (native_batch_norm, _native_batch_norm_legit, cudnn_batch_norm, ...).

Scoring uses only executed names (executed_violations). static_flags reads the
code for constructs that hide what runs (computed getattr, exec, importlib,
frame walking, cell magics, ...) and for anything outside the course's
vocabulary (COURSE_LIBRARIES; private and interpreter-level names), and only
flags them for a person to look at. The executed names are reported by the
student's own process, so they can be forged; every known way to forge them
starts outside that vocabulary, which is why reading it is the other half of the
rule (README, "What the grader knows").
"""

import ast
import contextlib
import fnmatch
import importlib
import json
import types
import warnings

from IPython.core.inputtransformer2 import TransformerManager

from autograder.course import POLICIES_DIR

_transformer = TransformerManager()


def policy_path(assignment, policies_dir=POLICIES_DIR):
    """Where `assignment`'s policy file is (it may not exist)."""
    return policies_dir / f"{assignment}.json"


def read_policy(assignment, policies_dir=POLICIES_DIR):
    """{grade_id: {"rule", "forbidden", and optionally "library_functions"}} as written."""
    path = policy_path(assignment, policies_dir)
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if "cells" in data:
        return {gid: dict(cell) for gid, cell in data["cells"].items()}
    # the old shape, {"forbidden": {grade_id: [names]}}, without rules
    return {gid: {"rule": "", "forbidden": list(names)}
            for gid, names in data.get("forbidden", {}).items()}


def load_policy(assignment, policies_dir=POLICIES_DIR):
    """{grade_id: [forbidden patterns]} for `assignment` (empty when no policy file)."""
    return {gid: list(cell.get("forbidden", []))
            for gid, cell in read_policy(assignment, policies_dir).items()}


def load_rules(assignment, policies_dir=POLICIES_DIR):
    """{grade_id: rule sentence} for `assignment`, for the assignment text and reports."""
    return {gid: str(cell.get("rule", ""))
            for gid, cell in read_policy(assignment, policies_dir).items()}


def pattern_matches(pattern, name):
    """True when executed `name` is covered by policy `pattern` (see the module doc)."""
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return (name == pattern or name.startswith(pattern + ".")
            or name.startswith(pattern + "::"))


# Operator namespaces torch itself defines. An op of any other namespace was
# registered by someone (torch.library, a compiled extension): the recorder sees
# the call but not what runs inside it.
TORCH_OP_NAMESPACES = {"aten", "prims", "rngprims", "quantized", "_quantized", "profiler",
                       "debugprims", "c10d", "_c10d_functional", "inductor"}


def unrecordable_ops(executed):
    """Sorted distinct ops in `executed` of a namespace torch does not define."""
    return sorted({name for name in executed if "::" in name
                   and name.split("::", 1)[0] not in TORCH_OP_NAMESPACES})


def executed_violations(patterns, executed):
    """Sorted distinct names in `executed` that any of `patterns` matches."""
    patterns = list(patterns)
    return sorted({name for name in executed
                   if any(pattern_matches(p, name) for p in patterns)})


# --- static flags ---------------------------------------------------------------------------

# Magics whose body (or line) is Python that IPython runs here: scanned like a cell.
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}
PYTHON_LINE_MAGICS = {"time", "timeit", "prun", "debug"}
# Line magics that neither run code nor touch files.
HARMLESS_LINE_MAGICS = {"matplotlib", "precision", "who", "who_ls", "whos", "pprint", "xmode",
                        "pinfo", "pinfo2", "psearch", "lsmagic", "magic", "pdoc", "pdef",
                        "psource", "pfile", "config"}
# Options of %time/%timeit/%prun that take a value (skipped before the statement).
_MAGIC_OPTIONS_WITH_VALUE = {"-n", "-r", "-p", "-l", "-s", "-T", "-D"}

PRIVATE_TORCH = ("torch._C", "torch.library", "torch.overrides", "torch.utils._python_dispatch")
OUTSIDE_THE_CALL = ("threading", "_thread", "multiprocessing", "concurrent", "subprocess",
                    "logging.handlers", "logging.config", "asyncio", "sched", "signal",
                    "os.system", "os.popen", "os.fork", "os.execv", "os.execve", "os.execl",
                    "os.execvp", "os.spawnv", "os.posix_spawn", "pty")
INTERPRETER_HOOKS = ("sys.settrace", "sys.setprofile", "sys.meta_path", "sys.path_hooks",
                     "sys.addaudithook", "sys._getframe", "inspect.currentframe",
                     "inspect.stack", "inspect.trace", "inspect.getouterframes",
                     "traceback.walk_stack", "traceback.walk_tb")
INTERNAL_ATTRIBUTES = {"__globals__", "__closure__", "cell_contents", "__code__",
                       "__builtins__", "__subclasses__", "tb_frame", "tb_next", "f_back",
                       "f_locals", "f_globals", "f_builtins", "f_code", "f_trace", "gi_frame",
                       "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "ag_frame", "ag_code",
                       "co_code", "co_consts", "__traceback__"}
# Autograd's graph: calling its nodes by hand runs torch's own derivative formulas
# without the autograd engine, so a rule against autograd cannot see it.
AUTOGRAD_GRAPH_ATTRIBUTES = {"grad_fn", "next_functions", "saved_tensors"}
# ...but ctx.saved_tensors in a torch.autograd.Function of the student's own is what it
# saved itself: `saved_tensors` on the first parameter of one of these methods is fine.
FUNCTION_CONTEXT_METHODS = {"forward", "backward", "setup_context", "jvp", "vjp"}

# The course's vocabulary: what an answer needs (arrays, torch, Triton, plots and
# the standard library's maths, containers and clocks). An import from outside
# it costs nothing; it is flagged so that a person sees what it is for, because
# every known way to forge what the grader is told (a client of the check
# socket, sys.modules edits, frames, threads, processes, memory) starts outside it.
COURSE_LIBRARIES = {"numpy", "torch", "triton", "matplotlib", "ipywidgets", "math", "cmath",
                    "fractions", "decimal", "numbers", "statistics", "random", "time",
                    "functools", "itertools", "collections", "operator", "typing",
                    "dataclasses", "enum", "abc", "copy", "warnings", "contextlib", "logging",
                    "sys"}
# sys is in the vocabulary for printing to stderr and the like; its other parts
# reach the interpreter (sys.modules, hooks, frames, exceptions' tracebacks).
SYS_HARMLESS = {"stdout", "stderr", "float_info", "int_info", "hash_info", "maxsize",
                "version", "version_info", "byteorder", "platform", "getsizeof",
                "getrecursionlimit", "setrecursionlimit", "float_repr_style"}
# Parts of those libraries that load code, files or processes, or compile
# Python where the scan cannot read it.
LOADS_OR_COMPILES = ("torch.utils", "torch.jit", "torch.compile", "torch.hub", "torch.package",
                     "torch.load", "torch.from_file", "torch.multiprocessing",
                     "torch.distributed", "torch.profiler", "torch.fx", "torch.export",
                     "torch.ops.load_library", "torch.classes", "torch.futures",
                     "numpy.ctypeslib", "numpy.load", "numpy.memmap", "numpy.fromfile",
                     "numpy.lib.format", "numpy.f2py", "numpy.distutils",
                     "numpy.testing.extbuild", "typing.get_type_hints", "matplotlib.use",
                     "matplotlib.pyplot.switch_backend")
# Dunder attributes that only name, compare, convert or call (anything else,
# __dict__, __mro__, __self__, __wrapped__, ..., reaches further).
HARMLESS_DUNDERS = {"__init__", "__call__", "__name__", "__qualname__", "__doc__", "__class__",
                    "__module__", "__version__", "__len__", "__getitem__", "__setitem__",
                    "__contains__", "__iter__", "__next__", "__repr__", "__str__", "__format__",
                    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__",
                    "__bool__", "__float__", "__int__", "__index__", "__array__", "__add__",
                    "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__matmul__",
                    "__rmatmul__", "__truediv__", "__rtruediv__", "__floordiv__", "__mod__",
                    "__pow__", "__neg__", "__pos__", "__abs__"}
HARMLESS_DUNDER_NAMES = {"__name__", "__doc__", "__file__", "__class__"}
# Builtins that look attributes up by a name given at run time when passed around.
_ATTRIBUTE_BUILTINS = {"getattr", "setattr", "delattr"}
_SYSTEM_PATHS = ("/proc", "/dev", "/sys")
_SYS_MODULES_EDITS = {"pop", "popitem", "update", "setdefault", "clear", "__setitem__",
                      "__delitem__"}


def _parse(code):
    try:
        return ast.parse(_transformer.transform_cell(code))
    except (SyntaxError, ValueError):
        return None


def _aliases(tree):
    """{name: the module path it stands for}: from imports, then from plain
    assignments of such a name or of an attribute chain on one (T = torch,
    nn2 = T.nn), however many steps."""
    found = _imported_names(tree)
    assignments = [(node.targets[0].id, _dotted(node.value)) for node in ast.walk(tree)
                   if isinstance(node, ast.Assign) and len(node.targets) == 1
                   and isinstance(node.targets[0], ast.Name) and _dotted(node.value)]
    for _ in range(len(assignments)):
        grew = False
        for target, dotted in assignments:
            head, _, rest = dotted.partition(".")
            if head in found and target not in found:
                found[target] = f"{found[head]}.{rest}" if rest else found[head]
                grew = True
        if not grew:
            break
    return found


def _imported_names(tree):
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    found[head] = head
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def _dotted(node):
    """'a.b.c' for a Name/Attribute chain or getattr(a.b, "c"); else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "getattr" and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        base = _dotted(node.args[0])
        return f"{base}.{node.args[1].value}" if base else None
    return None


def _under(name, prefixes):
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _constant_string(node):
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _label(index, code):
    first = next((line.strip() for line in code.splitlines() if line.strip()), "")
    if len(first) > 40:
        first = first[:37] + "..."
    return f"Student cell {index} ({first!r})" if first else f"Student cell {index}"


def _magic_statement(line):
    """The Python statement of a %time/%timeit/%prun line, its options removed."""
    words = line.split()
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in _MAGIC_OPTIONS_WITH_VALUE else 1
    return " ".join(words[i:])


def _module_path(dotted):
    """`dotted` with its module part named as the module names itself, following
    the real modules of a course library: "torch.sys.modules" -> "sys.modules",
    "np.random.seed" (np for numpy) -> "numpy.random.seed". Unchanged when its
    head is not a course library or cannot be imported; a private or missing
    part ends the walk."""
    parts = dotted.split(".")
    found = dotted
    if parts[0] in COURSE_LIBRARIES:
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = importlib.import_module(parts[0])
            for i, part in enumerate(parts[1:], start=1):
                if part.startswith("_"):
                    break
                value = getattr(value, part)
                if not isinstance(value, types.ModuleType):
                    break
                found = ".".join([value.__name__, *parts[i + 1:]])
    return found


def _is_dunder(name):
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _is_private(name):
    return name.startswith("_") and not _is_dunder(name)


class _Scanner(ast.NodeVisitor):
    """Collects one cell's flags (a set of sentences' endings).

    check_names: names the instructor's cells import from the grader's
    package (check_token_mean, ...): calling them is fine, rebinding them or
    reaching inside them is flagged.
    """

    def __init__(self, aliases, found, depth, check_names=frozenset()):
        self.aliases = aliases
        self.found = found
        self.depth = depth
        self.check_names = check_names
        self.own = []  # the first parameter of each enclosing function (self, cls)
        self.functions = []  # the name of each enclosing function
        self.callees = set()  # ids of Name nodes that are called directly

    def flag(self, what):
        self.found.append(what)

    def resolve(self, node):
        dotted = _dotted(node)
        if not dotted:
            return None
        head, _, rest = dotted.partition(".")
        resolved = self.aliases.get(head, head)
        return f"{resolved}.{rest}" if rest else resolved

    def is_module(self, node):
        dotted = _dotted(node)
        return bool(dotted) and dotted.split(".")[0] in self.aliases

    def is_own(self, node):
        """True for `self`/`cls` where it is the enclosing method's first parameter."""
        return isinstance(node, ast.Name) and bool(self.own) and node.id == self.own[-1]

    # functions: what `self` is
    def visit_FunctionDef(self, node):
        if node.name in self.check_names:
            self.flag(f"defines {node.name}, the name of one of the grader's checks")
        params = node.args.posonlyargs + node.args.args
        self.own.append(params[0].arg if params else None)
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()
        self.own.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.own.append(None)
        self.functions.append(None)
        self.generic_visit(node)
        self.functions.pop()
        self.own.pop()

    def visit_ClassDef(self, node):
        if node.name in self.check_names:
            self.flag(f"defines {node.name}, the name of one of the grader's checks")
        self.generic_visit(node)

    # imports
    def imported(self, module):
        if _under(module, ["normref"]):
            self.flag(f"imports {module}, the grader's own package")
        elif _under(module, ["importlib"]):
            self.flag(f"imports {module}, which can import modules by computed names")
        elif _under(module, ["gc"]):
            self.flag("imports gc, which can reach any object")
        elif _under(module, ["ctypes"]):
            self.flag("imports ctypes, which can change the interpreter's memory")
        elif _under(module, ["builtins"]):
            self.flag("imports builtins, which can replace Python's own functions")
        elif _under(module, PRIVATE_TORCH):
            self.flag(f"imports {module}, a private part of torch")
        elif _under(module, OUTSIDE_THE_CALL):
            self.flag(f"imports {module}, which runs code outside the graded call")
        elif module.split(".")[0] not in COURSE_LIBRARIES:
            self.flag(f"imports {module}, which is outside the course's libraries")
        elif _under(module, LOADS_OR_COMPILES):
            self.flag(f"imports {module}, which loads or compiles code the grader cannot read")
        elif any(_is_private(part) for part in module.split(".")):
            self.flag(f"imports {module}, a private part of {module.split('.')[0]}")

    def visit_Import(self, node):
        for alias in node.names:
            self.imported(alias.name)
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        if node.module and node.level == 0:
            self.imported(node.module)
            for alias in node.names:  # from torch import _C, from sys import _getframe
                full = f"{node.module}.{alias.name}"
                if _under(full, INTERPRETER_HOOKS):
                    self.flag(f"imports {full}, which reaches into the interpreter")
                elif _under(full, PRIVATE_TORCH) or _under(full, OUTSIDE_THE_CALL):
                    if not (_under(node.module, PRIVATE_TORCH)
                            or _under(node.module, OUTSIDE_THE_CALL)):
                        self.imported(full)
                elif node.module.split(".")[0] in COURSE_LIBRARIES:
                    self.used(full, node.module)
        elif node.level:
            self.flag("imports from a relative package, which is outside the course's libraries")
        self.generic_visit(node)

    # names, attributes, calls
    def visit_Name(self, node):
        if node.id in ("exec", "eval", "compile"):
            self.flag(f"uses {node.id}, which runs code built from a string")
        elif node.id == "__builtins__":
            self.flag("reaches into __builtins__")
        elif node.id in ("globals", "locals"):
            self.flag(f"uses {node.id}(), which looks names up by string")
        elif node.id == "get_ipython":  # magics are read in visit_Call, not here
            self.flag("calls get_ipython(), which can run magics and shell commands")
        elif node.id == "breakpoint":
            self.flag("calls breakpoint(), which runs a debugger's commands")
        elif node.id in _ATTRIBUTE_BUILTINS | {"open", "vars", "__import__"} \
                and id(node) not in self.callees and isinstance(node.ctx, ast.Load):
            self.flag(f"passes {node.id} around, so what it reaches is decided at run time")
        elif _is_dunder(node.id) and isinstance(node.ctx, ast.Load) \
                and node.id not in HARMLESS_DUNDER_NAMES | {"__import__"}:
            self.flag(f"uses {node.id}, one of the interpreter's own names")
        if node.id in self.check_names and isinstance(node.ctx, (ast.Store, ast.Del)):
            self.flag(f"rebinds {node.id}, the name of one of the grader's checks")
        self.generic_visit(node)

    def used(self, resolved, parent_resolved):
        """Flag the use of `resolved` (`parent_resolved`.name) where it hides what runs."""
        # report a chain once, at its longest private prefix
        if _under(resolved, PRIVATE_TORCH) and not (
                parent_resolved and _under(parent_resolved, PRIVATE_TORCH)):
            self.flag(f"uses {resolved}, a private part of torch")
        elif _under(resolved, INTERPRETER_HOOKS) or (
                resolved.startswith("sys.") and resolved.split(".")[1] not in SYS_HARMLESS
                and not (parent_resolved and parent_resolved.startswith("sys."))):
            self.flag(f"uses {resolved}, which reaches into the interpreter")
        elif _under(resolved, OUTSIDE_THE_CALL) and not (
                parent_resolved and _under(parent_resolved, OUTSIDE_THE_CALL)):
            self.flag(f"uses {resolved}, which runs code outside the graded call")
        elif _under(resolved, ["importlib"]) and not (
                parent_resolved and _under(parent_resolved, ["importlib"])):
            self.flag(f"uses {resolved}, which can import modules by computed names")
        elif _under(resolved, LOADS_OR_COMPILES) and not (
                parent_resolved and _under(parent_resolved, LOADS_OR_COMPILES)):
            self.flag(f"uses {resolved}, which loads or compiles code the grader cannot read")
        elif _is_private(resolved.rsplit(".", 1)[-1]) and resolved.split(".")[0] in \
                COURSE_LIBRARIES | {"sys", "os"} and not _under(resolved, PRIVATE_TORCH):
            self.flag(f"uses {resolved}, a private part of {resolved.split('.')[0]}")
        else:
            self.reached(resolved, parent_resolved)

    def reached(self, resolved, parent_resolved):
        """Flag a course library's attribute that is another library's module
        (torch.sys is sys): what it leads to is read as that module."""
        head = resolved.split(".")[0]
        if head not in COURSE_LIBRARIES:
            return
        real = _module_path(resolved)
        parent_real = _module_path(parent_resolved) if parent_resolved else None
        if real == resolved or real.split(".")[0] in COURSE_LIBRARIES:
            if real != resolved:
                self.used(real, parent_real)
            return
        if parent_real is None or parent_real.split(".")[0] in COURSE_LIBRARIES:
            self.flag(f"reaches {real.split('.')[0]} through {resolved}, which is outside "
                      "the course's libraries")
        self.used(real, parent_real)

    def attribute_named(self, name, base, store=False):
        """Flag reading (or with `store`, setting) attribute `name` of `base`."""
        if name in INTERNAL_ATTRIBUTES:
            self.flag(f"reads .{name}, which reaches into the interpreter's internals")
        elif name in AUTOGRAD_GRAPH_ATTRIBUTES and not (
                name == "saved_tensors" and self.is_own(base)
                and self.functions[-1] in FUNCTION_CONTEXT_METHODS):
            self.flag(f"reads .{name}, autograd's graph, whose nodes compute gradients "
                      "without the autograd engine")
        elif name == "__dict__" and self.is_module(base):
            self.flag(f"reads {self.resolve(base)}.__dict__, a module's names by string")
        elif _is_dunder(name) and store:
            self.flag(f"sets .{name}, which changes how Python treats the object")
        elif _is_dunder(name) and name not in HARMLESS_DUNDERS:
            self.flag(f"reads .{name}, which reaches into the interpreter's internals")
        elif _is_private(name) and not self.is_own(base) and not self.is_module(base) \
                and not (isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
                         and base.func.id == "super"):
            self.flag(f"reads .{name}, a private name of an object that is not its own")
        if isinstance(base, ast.Name) and base.id in self.check_names:
            self.flag(f"reaches inside {base.id}, one of the grader's checks")

    def visit_Attribute(self, node):
        resolved = self.resolve(node)
        store = isinstance(node.ctx, (ast.Store, ast.Del))
        self.attribute_named(node.attr, node.value, store=store)
        if resolved and isinstance(node.ctx, ast.Load):
            self.used(resolved, self.resolve(node.value))
        if store and self.is_module(node.value):
            self.flag(f"replaces {resolved}, an attribute of an imported module")
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if self.resolve(node.value) == "sys.modules":
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                self.flag("edits sys.modules")
            elif not _constant_string(node.slice):
                self.flag("looks up sys.modules by a computed name")
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        resolved = self.resolve(func)
        if self.magic(node):
            return
        if name is not None:
            self.callees.add(id(func))
        if name in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2:
            target = node.args[0]
            if not _constant_string(node.args[1]):
                if not self.is_own(target):
                    self.flag(f"calls {name} with a computed attribute name")
            else:
                self.attribute_named(node.args[1].value, target,
                                     store=name in ("setattr", "delattr"))
                if name == "getattr" and self.resolve(node):
                    # getattr(torch, "_C") reaches what torch._C does
                    self.used(self.resolve(node), self.resolve(target))
        if isinstance(func, ast.Attribute) and func.attr in ("__getattribute__", "__getattr__") \
                and node.args and not _constant_string(node.args[0]):
            self.flag(f"calls {func.attr} with a computed attribute name")
        # attrgetter's arguments are all attribute names; methodcaller's first one only
        names = node.args if resolved == "operator.attrgetter" else node.args[:1]
        if resolved in ("operator.attrgetter", "operator.methodcaller") and node.args:
            if not all(_constant_string(a) for a in names):
                self.flag(f"calls {resolved} with a computed attribute name")
            else:
                for attribute in (p for a in names for p in a.value.split(".")):
                    self.attribute_named(attribute, None)
        if name == "open" and not (node.args and _constant_string(node.args[0])
                                   and not node.args[0].value.startswith(_SYSTEM_PATHS)):
            self.flag("opens a file named at run time or a system file")
        if name == "__import__" or resolved in ("importlib.import_module",):
            if node.args and _constant_string(node.args[0]):
                self.imported(node.args[0].value)
            elif name == "__import__":
                self.flag("calls __import__ with a computed module name")
        if name == "vars" and (not node.args or self.is_module(node.args[0])):
            self.flag("calls vars(), which looks names up by string")
        if isinstance(func, ast.Attribute) and self.resolve(func.value) == "sys.modules":
            if func.attr in _SYS_MODULES_EDITS:
                self.flag("edits sys.modules")
            elif func.attr == "get" and node.args and not _constant_string(node.args[0]):
                self.flag("looks up sys.modules by a computed name")
        self.generic_visit(node)

    # IPython magics, as TransformerManager writes them
    def magic(self, node):
        """Read get_ipython().run_cell_magic(...) and friends; True when handled."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call)
                and isinstance(func.value.func, ast.Name)
                and func.value.func.id == "get_ipython"
                and func.attr in ("run_cell_magic", "run_line_magic", "system", "getoutput")):
            return False
        args = node.args
        if not args or not all(_constant_string(a) for a in args):
            self.flag(f"calls get_ipython().{func.attr} with computed arguments")
            return True
        if func.attr in ("system", "getoutput"):
            self.flag(f"runs the shell command !{args[0].value}")
            return True
        magic = args[0].value
        line = args[1].value if len(args) > 1 else ""
        if func.attr == "run_cell_magic":
            body = args[2].value if len(args) > 2 else ""
            if magic in PYTHON_CELL_MAGICS:
                self.nested(body, f"%%{magic}")
                if magic == "timeit":
                    self.nested(_magic_statement(line), f"%%{magic}'s setup line")
            else:
                self.flag(f"uses the cell magic %%{magic}, which runs "
                          "something other than this kernel's Python")
            return True
        if magic in PYTHON_LINE_MAGICS:
            self.nested(_magic_statement(line), f"%{magic}")
        elif magic not in HARMLESS_LINE_MAGICS:
            self.flag(f"uses the line magic %{magic} {line}".rstrip())
        return True

    def nested(self, code, where):
        if not code.strip():
            return
        if self.depth > 10:
            self.flag(f"nests magics too deeply to read ({where})")
            return
        inner = []
        tree = _parse(code)
        if tree is None:
            self.flag(f"holds code in {where} that could not be read")
            return
        scanner = _Scanner({**self.aliases, **_aliases(tree)}, inner, self.depth + 1,
                           self.check_names)
        scanner.visit(tree)
        self.found.extend(f"{what} (inside {where})" for what in inner)


def _sources(student_code):
    """[(label, code)] from strings or (label, code) pairs."""
    out = []
    for index, item in enumerate(student_code, start=1):
        if isinstance(item, tuple):
            label, code = item
            out.append((f"Cell {label}", code))
        else:
            out.append((_label(index, item), item))
    return out


def static_flags(student_code, *, context_code=()):
    """Sentences naming constructs in the student's cells that can hide what runs.

    student_code: the student's cells, as source strings (named "Student cell
    <n>", counted from 1 among them, with their first line) or (label, source)
    pairs (named "Cell <label>", e.g. a grade_id).
    context_code: the instructor's cells, whose imports the student's cells
    may use, and whose names from the grader's package (the checks) the
    student's cells may call but not rebind. A flag never costs points; it
    asks a person to look.
    """
    aliases, check_names = {}, set()
    for code in list(context_code):
        tree = _parse(code)
        if tree is not None:
            found = _aliases(tree)
            check_names.update(name for name, module in found.items()
                               if _under(module, ["normref"]))
    for code in list(context_code) + [c for _, c in _sources(student_code)]:
        tree = _parse(code)
        if tree is not None:
            aliases.update(_aliases(tree))
    flags = []
    for label, code in _sources(student_code):
        tree = _parse(code)
        if tree is None:
            continue
        found = []
        _Scanner(aliases, found, 0, frozenset(check_names)).visit(tree)
        seen = set()
        for what in found:
            if what not in seen:
                seen.add(what)
                flags.append(f"{label} {what}.")
    return flags
