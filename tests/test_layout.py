"""The grader's layout shows its pipeline: each step's package imports only the steps
before it, as its docstring says, and no module imports itself back through another."""

import ast
from pathlib import Path

import autograder

PACKAGE = Path(autograder.__file__).parent
# What each step may import, besides autograder.course and normref (its docstring says so).
MAY_IMPORT = {"authoring": {"grading"}, "term": set(), "grading": set(),
              "results": {"grading", "term"}, "publishing": {"authoring"}}


def _modules():
    return {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): p
            for p in PACKAGE.rglob("*.py") if "examples" not in p.parts}


def _imports(path):
    """The autograder modules `path` imports, at any depth (lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n.startswith("autograder")}
    return found


def test_each_step_imports_only_the_steps_its_docstring_allows():
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        parts = name.split(".")
        if len(parts) < 3:
            continue  # autograder.cli and autograder.course may import anything
        step = parts[1]
        for imported in _imports(path):
            other = imported.split(".")
            if len(other) > 1 and other[1] in MAY_IMPORT and other[1] != step \
                    and other[1] not in MAY_IMPORT[step]:
                wrong.append(f"{name} imports {imported}")
    assert wrong == []


def test_no_module_of_the_grader_imports_itself_back():
    modules = _modules()
    graph = {name: {m for m in modules if m in _imports(path) and m != name}
             for name, path in modules.items()}
    graph = {n: {m for m in deps if not m.endswith("__init__")} for n, deps in graph.items()}

    def cycle_from(start):
        todo, seen = [(start, [start])], set()
        while todo:
            node, trail = todo.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return trail + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append((nxt, trail + [nxt]))
        return None

    cycles = [c for c in map(cycle_from, graph) if c]
    assert cycles == []
