"""Every committed notebook follows the course's conventions.

That every notebook runs top to bottom without an error is tested where it is run
for something more: each lesson in JupyterLab (tests/test_browser.py), in the student
edition's own packages under Colab's ipywidgets 7
(tests/publishing/test_colab_environment.py) and in the site's build
(tests/publishing/test_site.py); each source notebook by the grader,
as the reference solution of its sample class (tests/grading/test_grade.py), each
released one answered in the edition's environment."""

import ast
import json
import sys

import nbformat
import pytest

from conftest import LESSONS, RELEASES, REPO, SOURCES


@pytest.mark.parametrize("path", LESSONS + SOURCES + RELEASES,
                         ids=lambda p: str(p.relative_to(REPO)))
def test_notebook_is_committed_clean(path):
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None
            for line in "".join(cell["source"]).splitlines():
                assert len(line) <= 80, f"{path.name}: line over 80 columns: {line!r}"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    first = "".join(code[0]["source"])
    assert "google.colab" in first and "enable_custom_widget_manager" in first, \
        "the first code cell sets up Colab"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_assignment_cells_follow_the_conventions(path):
    nb = nbformat.read(path, as_version=4)
    students = [c for c in nb.cells if "nbgrader" not in c.metadata]
    assert all(c.cell_type == "code" and "scratch" in c.source.splitlines()[0]
               for c in students), \
        "every cell of an assignment carries nbgrader metadata but the student's scratch cells"
    graded = [c for c in nb.cells if "nbgrader" in c.metadata]
    ids = [c.metadata["nbgrader"].get("grade_id") for c in graded]
    assert all(ids) and len(ids) == len(set(ids))
    for cell in graded:
        meta = cell.metadata["nbgrader"]
        if meta.get("grade") and cell.cell_type == "code":
            assert meta["points"] > 0
            source = cell.source
            assert source.startswith('"""'), f"{meta['grade_id']} opens with a docstring"
            # the hidden check may run first, so that its diagnosis is what a
            # wrong answer shows; the student still sees an assert of their own
            before, hidden_and_after = source.split("### BEGIN HIDDEN TESTS")
            hidden, after = hidden_and_after.split("### END HIDDEN TESTS")
            assert "assert" in before + after, f"{meta['grade_id']} has a visible assert"
            assert "from normref.checks import" in hidden and "check_" in hidden


class _TopLevelNames(ast.NodeVisitor):
    """Names a cell binds at the notebook's top level (not inside its functions,
    classes or comprehensions), except `import m` binding m to itself."""

    def __init__(self):
        self.names = set()

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Store):
            self.names.add(node.id)

    def visit_FunctionDef(self, node):
        self.names.add(node.name)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Import(self, node):
        self.names.update(a.asname for a in node.names if a.asname)

    def visit_ImportFrom(self, node):
        self.names.update(a.asname or a.name for a in node.names)

    def visit_ExceptHandler(self, node):
        if node.name:
            self.names.add(node.name)
        self.generic_visit(node)

    def _own_scope(self, node):
        """A lambda or comprehension: its names are its own."""

    visit_Lambda = visit_ListComp = visit_SetComp = visit_DictComp = _own_scope
    visit_GeneratorExp = _own_scope


def _module_level_names(source):
    collector = _TopLevelNames()
    collector.visit(ast.parse(source))
    return collector.names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_instructor_cells_never_rebind_a_module_name_a_student_may_import(path):
    """A test cell that assigns `numbers = [...]` replaced a student's `import
    numbers` (what nn.LayerNorm itself checks shapes with): every later cell of a
    correct hand-in failed. The course's cells bind no name of a standard module."""
    taken = set(sys.stdlib_module_names)
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code" or cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        clashes = _module_level_names(cell.source) & taken
        assert not clashes, (f"{cell.metadata['nbgrader']['grade_id']} binds "
                             f"{sorted(clashes)}, a module a student may import")
