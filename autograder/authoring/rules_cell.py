"""The rules cell: an assignment's rules on library calls, checked by its visible tests.

The grader refuses, per graded cell, the library calls the assignment's policy
forbids (autograder/policies/<assignment>.json, read by grading.forbidden). A
student should learn that when validating, not from the grade. So every
assignment with a policy carries one read-only cell, grade_id `course_rules`,
that holds the same rules and patterns and defines

    follows_rules(exercise, call, *, subject=None)

which calls `call()` while noting what it executes, the way the grader's
recorder names it (torch functions by qualified name, aten ops as "aten::<op>",
the torch classes of the modules called and of the subject, "autograd" when the
engine runs, and the Python library functions a policy lists by file and name),
and fails with the grader's own sentence and the rule when a forbidden name ran.
The visible test cells call it; the grader still decides with its own recorder.

The cell is written from the policy, never by hand: `refresh` rewrites it in the
source notebook before each release, so the rules a student validates against
are the grader's.
"""

import json
import textwrap

import nbformat

from autograder.grading import forbidden

CELL_ID = "course_rules"

_HEADER = '''\
# The assignment's rules on library calls (read-only). The test cells call
# follows_rules to run your code while noting what it executes, so that
# Validate tells you, before you hand in, if an exercise's rule is broken.
# The grader checks the same rules on its own.
import contextlib
import fnmatch
import sys
import textwrap

'''

_FUNCTIONS = '''

AUTOGRAD_ENTRY_POINTS = {"torch.Tensor.backward", "torch.autograd.grad",
                         "torch.autograd.backward", "torch._make_dual"}


def _covered(pattern, name):
    """Does `pattern` (a name, a prefix of one, or a glob) cover `name`?"""
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return (name == pattern or name.startswith(pattern + ".")
            or name.startswith(pattern + "::"))


def _torch_classes(cls):
    return {f"{base.__module__}.{base.__qualname__}"
            for base in getattr(cls, "__mro__", ())
            if str(getattr(base, "__module__", "")).split(".")[0] == "torch"}


def _torch_name(func, resolve_name):
    schema = getattr(func, "_schema", None)
    if schema is not None:
        return str(schema.name)
    if getattr(func, "_qualified_op_name", None):
        return str(func._qualified_op_name)
    name = resolve_name(func) or "{}.{}".format(
        getattr(func, "__module__", None) or "torch",
        getattr(func, "__qualname__", None) or getattr(func, "__name__", "?"))
    return name.replace("._VariableFunctionsClass.", ".").replace(
        "torch._C._VariableFunctions.", "torch.")


@contextlib.contextmanager
def _noting_torch(executed):
    try:
        import torch
        from torch.overrides import TorchFunctionMode, resolve_name
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        yield
        return
    graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)

    class NoteFunctions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = _torch_name(func, resolve_name)
            executed.add(name)
            if name in AUTOGRAD_ENTRY_POINTS:
                executed.add("autograd")
            return func(*args, **(kwargs or {}))

    class NoteOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            executed.add(_torch_name(func, resolve_name))
            if graph_task_id() != -1:
                executed.add("autograd")
            return func(*args, **(kwargs or {}))

    def note_called(module, args):
        executed.update(_torch_classes(type(module)))

    def note_held(module, name, submodule):
        executed.update(_torch_classes(type(submodule)))

    modules = torch.nn.modules.module
    hooks = [modules.register_module_forward_pre_hook(note_called),
             modules.register_module_module_registration_hook(note_held)]
    try:
        with NoteFunctions(), NoteOps():
            yield
    finally:
        for hook in hooks:
            hook.remove()


@contextlib.contextmanager
def _noting_python(library_used, library_functions):
    if not library_functions:
        yield
        return

    def note(frame, event, arg):
        if event != "call":
            return
        path = frame.f_code.co_filename.replace("\\\\", "/")
        for where, names in library_functions.items():
            found = (path.endswith(where) if "/" in where
                     else where in path.rsplit("/", 1)[-1])
            if found and frame.f_code.co_name in names:
                module = frame.f_globals.get("__name__", where)
                library_used.add(f"{module}.{frame.f_code.co_name}")

    before = sys.getprofile()
    sys.setprofile(note)
    try:
        yield
    finally:
        sys.setprofile(before)


def follows_rules(exercise, call, *, subject=None):
    """Call call() as the grader would; fail, saying the rule, if it runs
    something `exercise` forbids. Returns what call() returns."""
    rule = RULES[exercise]
    executed, library_used = set(), set()
    with _noting_torch(executed), _noting_python(
            library_used, rule.get("library_functions", {})):
        result = call()
    if subject is not None:
        executed |= _torch_classes(subject if isinstance(subject, type)
                                   else type(subject))
    used = sorted(library_used | {name for name in executed if any(
        _covered(pattern, name) for pattern in rule["forbidden"])})
    # on lines short enough for Validate, which cuts longer ones
    assert not used, "\\n" + textwrap.fill(
        "while this test called your code, it used " + ", ".join(used)
        + ", which this exercise forbids. " + rule["rule"], width=78)
    return result
'''


def rules_source(assignment, *, policies_dir=forbidden.POLICIES_DIR):
    """The rules cell's code for `assignment`, or None when it has no policy."""
    cells = forbidden.read_policy(assignment, policies_dir)
    if not cells:
        return None
    rules = {gid: {key: cell[key] for key in ("rule", "forbidden", "library_functions")
                   if key in cell}
             for gid, cell in cells.items()}
    return (_HEADER + "RULES = " + _as_python(rules) + "\n" + _FUNCTIONS).rstrip("\n")


def _wrapped_items(items, indent):
    """Python literals, comma-separated, wrapped to the notebook's 79 columns."""
    return textwrap.wrap(", ".join(items) + ",", width=79 - indent, break_on_hyphens=False,
                         break_long_words=False)


def _as_python(rules):
    """RULES as Python source within 79 columns (the course's notebooks stay in 80)."""
    lines = ["{"]
    for gid, cell in rules.items():
        lines.append(f"    {json.dumps(gid)}: {{")
        lines.append('        "rule": (')
        pieces = textwrap.wrap(cell["rule"], width=64, drop_whitespace=False,
                               break_on_hyphens=False, break_long_words=False)
        lines += [f"            {json.dumps(piece, ensure_ascii=False)}" for piece in pieces]
        lines[-1] += "),"
        lines.append('        "forbidden": [')
        lines += ["            " + line for line in _wrapped_items(
            [json.dumps(p) for p in cell["forbidden"]], 12)]
        lines.append("        ],")
        if "library_functions" in cell:
            lines.append('        "library_functions": {')
            for where, names in cell["library_functions"].items():
                lines.append(f"            {json.dumps(where)}: [")
                lines += ["                " + line for line in _wrapped_items(
                    [json.dumps(name) for name in names], 16)]
                lines.append("            ],")
            lines.append("        },")
        lines.append("    },")
    return "\n".join(lines + ["}"])


def refresh(notebook_path, assignment, *, policies_dir=forbidden.POLICIES_DIR):
    """Rewrite the rules cell of the notebook at `notebook_path` from the policy.

    Returns True when the file changed. A notebook of an assignment with a policy
    must already hold the cell (where it stands is the author's choice)."""
    source = rules_source(assignment, policies_dir=policies_dir)
    notebook = nbformat.read(notebook_path, as_version=4)
    cells = [c for c in notebook.cells
             if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == CELL_ID]
    if source is None:
        return False
    if len(cells) != 1:
        raise ValueError(f"{notebook_path}: {assignment} has rules on library calls, so it "
                         f"needs one read-only code cell with grade_id {CELL_ID!r} "
                         f"(found {len(cells)})")
    if cells[0].source == source:
        return False
    cells[0].source = source
    nbformat.write(notebook, notebook_path)
    return True
