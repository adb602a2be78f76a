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
It returns None, so a test cell that ends with it prints nothing. The message
names what the student wrote (numpy.var, torch.nn.LayerNorm), not the library's
internals that ran (numpy._core._methods._var, aten::native_layer_norm).
The visible test cells call it; the grader still decides with its own recorder.

The cell is written from the policy, never by hand: `refresh` rewrites it in the
source notebook before each release, so the rules a student validates against
are the grader's. Its code is machinery, not course material, so the cell opens
folded: JupyterLab hides a cell's source when its metadata says source_hidden,
and Colab shows only the title line of a cell whose cellView is "form".
"""

import json
import textwrap

import nbformat

from autograder.grading import forbidden

CELL_ID = "course_rules"

# The public name a student calls, for each Python library function a policy may
# list ({file: [function]}, as grading.forbidden reads it): Validate names what the
# student wrote, not the internal function that ran (np.var and an array's .var()
# both run numpy._core._methods._var).
NAMES_AS_WRITTEN = {
    "_methods": {"_var": "numpy.var", "_std": "numpy.std"},
    "nanfunctions": {"nanvar": "numpy.nanvar", "nanstd": "numpy.nanstd"},
    "function_base": {"cov": "numpy.cov", "corrcoef": "numpy.corrcoef"},
    "statistics": {name: f"statistics.{name}" for name in (
        "pvariance", "pstdev", "variance", "stdev", "covariance", "correlation")},
    "numpy/ma/core.py": {"var": "numpy.ma.var", "std": "numpy.ma.std"},
    # _std_var is what torch.masked's var and std share
    "torch/masked/_ops.py": {"var": "torch.masked.var", "std": "torch.masked.std",
                             "_std_var": "torch.masked.var"},
    # PyTorch's own Linear/Conv2d + BatchNorm folds
    "torch/nn/utils/fusion.py": {name: f"torch.nn.utils.fusion.{name}" for name in (
        "fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval",
        "fuse_linear_bn_weights")},
}

_HEADER = '''\
#@title The rules on library calls (read-only: run it, no need to read it)
# The test cells run your code through follows_rules, so Validate tells you,
# before you hand in, if an exercise's rule (stated at the top) is broken. The
# grader checks the same rules on its own.
import contextlib
import fnmatch
import re
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
    # Code that has not imported torch calls none of it: importing it here would
    # cost a numpy-only notebook seconds (and a cell its time limit on a busy
    # machine). follows_rules calls again if the call itself imported torch.
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    from torch.overrides import TorchFunctionMode, resolve_name
    from torch.utils._python_dispatch import TorchDispatchMode
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

    def listed_as(code):
        path = code.co_filename.replace("\\\\", "/")
        for where, names in library_functions.items():
            found = (path.endswith(where) if "/" in where
                     else where in path.rsplit("/", 1)[-1])
            if found and code.co_name in names:
                return where
        return None

    def note(frame, event, arg):
        if event != "call":
            return
        where = listed_as(frame.f_code)
        # np.std runs numpy's _var inside its _std: the student called one
        caller = frame.f_back
        if where and not (caller and listed_as(caller.f_code)):
            name = frame.f_code.co_name
            library_used.add(PUBLIC_NAMES[where][name])

    before = sys.getprofile()
    sys.setprofile(note)
    try:
        yield
    finally:
        sys.setprofile(before)


def _as_written(names):
    """The names a student wrote: torch's modules as torch.nn.<Module>, and
    torch's internals (aten operators, private names) only if nothing else."""
    shown = {re.sub(r"^torch\\.nn\\.modules\\.\\w+\\.", "torch.nn.", name)
             for name in names}
    public = {name for name in shown if not name.startswith("aten::")
              and not any(part.startswith("_") for part in name.split("."))}
    return sorted(public or shown)


def follows_rules(exercise, call, *, subject=None):
    """Call call() as the grader would; fail, saying the rule, if it runs
    something `exercise` forbids. Returns None."""
    rule = RULES[exercise]
    executed, library_used = set(), set()
    torch_before = "torch" in sys.modules
    with _noting_torch(executed), _noting_python(
            library_used, rule.get("library_functions", {})):
        call()
    if not torch_before and "torch" in sys.modules:
        # the call imported torch, so its torch calls went unnoted: call again
        with _noting_torch(executed), _noting_python(
                library_used, rule.get("library_functions", {})):
            call()
    if subject is not None:
        executed |= _torch_classes(subject if isinstance(subject, type)
                                   else type(subject))
    used = library_used | {name for name in executed if any(
        _covered(pattern, name) for pattern in rule["forbidden"])}
    assert not used, "\\n" + textwrap.fill(
        "while this test called your code, it used "
        + ", ".join(_as_written(used)) + ", which this exercise forbids. "
        + rule["rule"], width=78)
'''


def rules_source(assignment, *, policies_dir=forbidden.POLICIES_DIR):
    """The rules cell's code for `assignment`, or None when it has no policy."""
    cells = forbidden.read_policy(assignment, policies_dir)
    if not cells:
        return None
    rules = {gid: {key: cell[key] for key in ("rule", "forbidden", "library_functions")
                   if key in cell}
             for gid, cell in cells.items()}
    names = _names_as_written(assignment, rules)
    public = ("\n# What a student calls, for each library function above that the\n"
              "# test cells note by its file and name.\nPUBLIC_NAMES = "
              + _as_python_table(names) + "\n") if names else ""
    return (_HEADER + "RULES = " + _as_python(rules) + "\n" + public
            + _FUNCTIONS).rstrip("\n")


def _names_as_written(assignment, rules):
    """{file: {function: public name}} of the library functions `rules` list."""
    names = {}
    for cell in rules.values():
        for where, functions in cell.get("library_functions", {}).items():
            for function in functions:
                public = NAMES_AS_WRITTEN.get(where, {}).get(function)
                if public is None:
                    raise ValueError(
                        f"{assignment}'s policy lists {function} of {where}, which "
                        f"rules_cell.NAMES_AS_WRITTEN does not name: add the name a "
                        f"student calls it by, for Validate to show")
                names.setdefault(where, {})[function] = public
    return names


def _as_python_table(names):
    """{file: {function: public name}} as Python source, one pair a line."""
    lines = ["{"]
    for where, functions in names.items():
        lines.append(f"    {json.dumps(where)}: {{")
        for function, public in functions.items():
            pair = f"        {json.dumps(function)}: {json.dumps(public)},"
            lines += ([pair] if len(pair) <= 79 else
                      [f"        {json.dumps(function)}:", f"            {json.dumps(public)},"])
        lines.append("    },")
    return "\n".join(lines + ["}"])


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
        # 63: with its indent, quotes and "),", the last piece still fits
        pieces = textwrap.wrap(cell["rule"], width=63, drop_whitespace=False,
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
    folded = {"jupyter": {**cells[0].metadata.get("jupyter", {}), "source_hidden": True},
              "cellView": "form"}
    if cells[0].source == source and all(
            cells[0].metadata.get(key) == value for key, value in folded.items()):
        return False
    cells[0].source = source
    cells[0].metadata.update(folded)
    nbformat.write(notebook, notebook_path)
    return True
