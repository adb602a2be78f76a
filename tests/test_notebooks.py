"""Every lesson and every source notebook runs top to bottom without an error,
and every committed notebook follows the course's conventions."""

import json

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import LESSONS, RELEASES, REPO, SOURCES

# Only a guard against a cell that hangs: how long the notebooks take is a figure
# for a benchmark on a quiet machine, not an assertion of the suite (a loaded CI
# machine ran quick lessons past a minute).
CELL_TIMEOUT_SECONDS = 300


@pytest.mark.parametrize("path", LESSONS + SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_notebook_runs_top_to_bottom(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=CELL_TIMEOUT_SECONDS, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


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
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    assert all(ids), "every cell of an assignment carries nbgrader metadata"
    assert len(ids) == len(set(ids))
    for cell in nb.cells:
        meta = cell.metadata["nbgrader"]
        if meta.get("grade") and cell.cell_type == "code":
            assert meta["points"] > 0
            source = cell.source
            assert source.startswith('"""'), f"{meta['grade_id']} opens with a docstring"
            visible = source.split("### BEGIN HIDDEN TESTS")[0]
            assert "assert" in visible, f"{meta['grade_id']} has a visible assert"
            hidden = source.split("### BEGIN HIDDEN TESTS")[1]
            assert "from normref.checks import" in hidden and "check_" in hidden
