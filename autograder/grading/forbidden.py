"""What an exercise forbids, judged on what the student's code executed.

A policy file, autograder/policies/<assignment>.json, holds per grade cell a
rule that the assignment text can quote and the executed-name patterns that
break it:

    {"cells": {"ln_single_token": {
        "rule": "While the grader calls your layer_norm, it must not ...",
        "forbidden": ["torch.*layer_norm*", "aten::*layer_norm*", ...]}}}

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
frame walking, cell magics, ...) and only flags them for a person to look at.
"""

import ast
import fnmatch
import json

from IPython.core.inputtransformer2 import TransformerManager

from autograder.course import POLICIES_DIR

_transformer = TransformerManager()


def policy_path(assignment, policies_dir=POLICIES_DIR):
    """Where `assignment`'s policy file is (it may not exist)."""
    return policies_dir / f"{assignment}.json"


def _read_policy_file(assignment, policies_dir):
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
            for gid, cell in _read_policy_file(assignment, policies_dir).items()}


def load_rules(assignment, policies_dir=POLICIES_DIR):
    """{grade_id: rule sentence} for `assignment`, for the assignment text and reports."""
    return {gid: str(cell.get("rule", ""))
            for gid, cell in _read_policy_file(assignment, policies_dir).items()}


def pattern_matches(pattern, name):
    """True when executed `name` is covered by policy `pattern` (see the module doc)."""
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return (name == pattern or name.startswith(pattern + ".")
            or name.startswith(pattern + "::"))


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
                    "os.system", "os.popen", "os.fork", "os.execv", "os.execve", "os.execl",
                    "os.execvp", "os.spawnv", "os.posix_spawn", "pty")
INTERPRETER_HOOKS = ("sys.settrace", "sys.setprofile", "sys.meta_path", "sys.path_hooks",
                     "sys.addaudithook", "sys._getframe", "inspect.currentframe",
                     "inspect.stack", "inspect.trace", "inspect.getouterframes",
                     "traceback.walk_stack", "traceback.walk_tb")
INTERNAL_ATTRIBUTES = {"__globals__", "__closure__", "cell_contents", "__code__",
                       "__builtins__", "__subclasses__", "tb_frame", "f_back", "f_locals",
                       "f_globals", "gi_frame", "cr_frame", "ag_frame", "__traceback__"}
_SYS_MODULES_EDITS = {"pop", "popitem", "update", "setdefault", "clear", "__setitem__",
                      "__delitem__"}


def _parse(code):
    try:
        return ast.parse(_transformer.transform_cell(code))
    except (SyntaxError, ValueError):
        return None


def _aliases(tree):
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


class _Scanner(ast.NodeVisitor):
    """Collects one cell's flags (a set of sentences' endings)."""

    def __init__(self, aliases, found, depth):
        self.aliases = aliases
        self.found = found
        self.depth = depth

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
        self.generic_visit(node)

    def used(self, resolved, parent_resolved):
        """Flag the use of `resolved` (`parent_resolved`.name) where it hides what runs."""
        # report a chain once, at its longest private prefix
        if _under(resolved, PRIVATE_TORCH) and not (
                parent_resolved and _under(parent_resolved, PRIVATE_TORCH)):
            self.flag(f"uses {resolved}, a private part of torch")
        elif _under(resolved, INTERPRETER_HOOKS):
            self.flag(f"uses {resolved}, which reaches into the interpreter")
        elif _under(resolved, OUTSIDE_THE_CALL) and not (
                parent_resolved and _under(parent_resolved, OUTSIDE_THE_CALL)):
            self.flag(f"uses {resolved}, which runs code outside the graded call")
        elif _under(resolved, ["importlib"]) and not (
                parent_resolved and _under(parent_resolved, ["importlib"])):
            self.flag(f"uses {resolved}, which can import modules by computed names")

    def visit_Attribute(self, node):
        resolved = self.resolve(node)
        if node.attr in INTERNAL_ATTRIBUTES:
            self.flag(f"reads .{node.attr}, which reaches into the interpreter's internals")
        elif node.attr == "__dict__" and self.is_module(node.value):
            self.flag(f"reads {self.resolve(node.value)}.__dict__, a module's names by string")
        if resolved and isinstance(node.ctx, ast.Load):
            self.used(resolved, self.resolve(node.value))
        if isinstance(node.ctx, (ast.Store, ast.Del)) and self.is_module(node.value):
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
        if name in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2:
            target = node.args[0]
            if not _constant_string(node.args[1]) and not (
                    isinstance(target, ast.Name) and target.id in ("self", "cls")):
                self.flag(f"calls {name} with a computed attribute name")
            elif name == "getattr" and self.resolve(node):
                # getattr(torch, "_C") reaches what torch._C does
                self.used(self.resolve(node), self.resolve(target))
        if isinstance(func, ast.Attribute) and func.attr in ("__getattribute__", "__getattr__") \
                and node.args and not _constant_string(node.args[0]):
            self.flag(f"calls {func.attr} with a computed attribute name")
        # attrgetter's arguments are all attribute names; methodcaller's first one only
        names = node.args if resolved == "operator.attrgetter" else node.args[:1]
        if resolved in ("operator.attrgetter", "operator.methodcaller") and node.args \
                and not all(_constant_string(a) for a in names):
            self.flag(f"calls {resolved} with a computed attribute name")
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
        scanner = _Scanner({**self.aliases, **_aliases(tree)}, inner, self.depth + 1)
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
    may use. A flag never costs points; it asks a person to look.
    """
    aliases = {}
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
        _Scanner(aliases, found, 0).visit(tree)
        seen = set()
        for what in found:
            if what not in seen:
                seen.add(what)
                flags.append(f"{label} {what}.")
    return flags
