"""Calls that may not earn an exercise's points, found on the syntax tree.

A policy file, autograder/policies/<assignment>.json, names them per grade
cell as fully qualified names: {"forbidden": {"ln_single_token":
["torch.nn.functional.layer_norm", ...]}}. A name also forbids everything
under it; a name starting with a dot, like ".backward" or ".requires_grad",
forbids that attribute on any object and that keyword argument in any call
(`y.backward()`, `torch.tensor(x, requires_grad=True)`). normref is forbidden
everywhere. Import aliases (`import
torch.nn.functional as F`, `from torch.nn import LayerNorm as LN`) and
`getattr(module, "name")` are resolved, so renaming does not hide a call.
"""

import ast
import json

from IPython.core.inputtransformer2 import TransformerManager

from autograder.course import POLICIES_DIR

FORBIDDEN_EVERYWHERE = ["normref"]
_transformer = TransformerManager()


def load_policy(assignment, policies_dir=POLICIES_DIR):
    """{grade_id: [qualified names]} for `assignment` (empty when no policy file)."""
    path = policies_dir / f"{assignment}.json"
    if not path.exists():
        return {}
    return {k: list(v) for k, v in json.loads(path.read_text())["forbidden"].items()}


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


def referenced_names(student_code, *, context_code=()):
    """Fully qualified names that `student_code` cells refer to.

    context_code: the instructor's cells, whose imports students may use.
    """
    aliases = {}
    trees = []
    for code in list(context_code) + list(student_code):
        tree = _parse(code)
        if tree is not None:
            aliases.update(_aliases(tree))
    for code in student_code:
        tree = _parse(code)
        if tree is not None:
            trees.append(tree)
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            if isinstance(node, ast.Attribute):
                names.add(f".{node.attr}")
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(f".{node.arg}")
            dotted = _dotted(node)
            if dotted:
                head, _, rest = dotted.partition(".")
                resolved = aliases.get(head, head)
                names.add(f"{resolved}.{rest}" if rest else resolved)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("__import__",) and node.args
                    and isinstance(node.args[0], ast.Constant)):
                names.add(str(node.args[0].value))
            if (isinstance(node, ast.Call) and _dotted(node.func) in
                    ("importlib.import_module", "import_module") and node.args
                    and isinstance(node.args[0], ast.Constant)):
                names.add(str(node.args[0].value))
    return names


def violations(policy, student_code, *, context_code=(), grade_ids=()):
    """{grade_id: sorted forbidden names used} for every cell with a violation."""
    used = referenced_names(student_code, context_code=context_code)

    def hits(forbidden):
        return sorted({name for name in used for f in forbidden
                       if name == f or name.startswith(f + ".")})

    found = {}
    everywhere = hits(FORBIDDEN_EVERYWHERE)
    for gid in set(grade_ids) | set(policy):
        names = sorted(set(everywhere) | set(hits(policy.get(gid, []))))
        if names:
            found[gid] = names
    return found
