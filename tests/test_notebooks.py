"""Every committed notebook follows the course's conventions.

That every notebook runs top to bottom without an error is tested where it is run
for something more: each lesson in JupyterLab (tests/test_browser.py), in the student
edition's own environment (tests/publishing/test_edition_environment.py) and in the
site's build (tests/publishing/test_site.py); each source notebook by nbgrader
validate (tests/authoring/test_release.py), each released one answered in the
edition's environment."""

import json

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
