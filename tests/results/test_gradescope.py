"""A Gradescope autograder (`python -m autograder gradescope ASSIGNMENT`): the zip that
Gradescope's "Upload Autograder" takes, and what its run_autograder does with an upload.

The layout is Gradescope's own, from its specification
(https://gradescope-autograders.readthedocs.io/en/latest/specs/): setup.sh and
run_autograder at the root of the zip, unpacked into /autograder/source; the upload in
/autograder/submission, submission_metadata.json beside it
(.../latest/submission_metadata/: "users", a list of {"email", "id", "name"}), and
results.json written into /autograder/results with "score" and "tests" entries of
"name", "score", "max_score", "output". Here /autograder is a temporary folder
(run_autograder reads AUTOGRADER_ROOT), and the grader's Python this checkout's.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder import cli
from autograder.course import EXAMPLES_DIR, REPO_ROOT
from autograder.results.gradescope import match_notebooks

A = "01_the_recipe"
EXPECTED = json.loads((EXAMPLES_DIR / A / "expected.json").read_text())


@pytest.fixture(scope="module")
def autograder_zip(tmp_path_factory):
    path = tmp_path_factory.mktemp("gradescope") / "autograder.zip"
    assert cli.main(["gradescope", A, "--output", str(path)]) == 0
    return path


def gradescope_container(tmp_path, autograder_zip, uploads, user_id=4711):
    """/autograder as Gradescope lays it out for one submission."""
    root = tmp_path / "autograder"
    for folder in ("source", "submission", "results"):
        (root / folder).mkdir(parents=True)
    with zipfile.ZipFile(autograder_zip) as archive:
        archive.extractall(root / "source")
    shutil.copyfile(root / "source" / "run_autograder", root / "run_autograder")
    for name, notebook in uploads.items():
        target = root / "submission" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, target) if not isinstance(notebook, bytes) \
            else target.write_bytes(notebook)
    (root / "submission_metadata.json").write_text(json.dumps(
        {"id": 1, "users": [{"email": "ada@example.edu", "id": user_id, "name": "Ada"}]}))
    return root


def run_autograder(root, *, without_bwrap=False, tmp_path=None):
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
    if without_bwrap:  # as in Gradescope's containers, where bwrap cannot start
        tools = tmp_path / "path-without-bwrap"
        tools.mkdir()
        for folder in os.environ["PATH"].split(os.pathsep):
            for program in Path(folder).glob("*") if Path(folder).is_dir() else ():
                if program.name != "bwrap" and not (tools / program.name).exists():
                    (tools / program.name).symlink_to(program)
        env["PATH"] = str(tools)
    done = subprocess.run(["bash", str(root / "run_autograder")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text()), done.stdout


def example(student):
    return nbformat.read(EXAMPLES_DIR / A / f"{student}.ipynb", as_version=4)


def test_the_zip_has_gradescopes_two_scripts_at_its_root_and_only_this_assignment(
        autograder_zip):
    with zipfile.ZipFile(autograder_zip) as archive:
        names = archive.namelist()
        modes = {info.filename: info.external_attr >> 16 for info in archive.infolist()}
        requirements = archive.read("requirements.txt").decode()
    assert {"setup.sh", "run_autograder", "requirements.txt"} <= set(names)
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR
    assert f"course/source/{A}/{A}.ipynb" in names  # the hidden tests, for the grader
    assert f"course/release/{A}/{A}.ipynb" in names
    notebooks = [n for n in names if n.startswith(("course/source/", "course/release/"))]
    assert all(n.split("/")[2] == A for n in notebooks)  # no other assignment's tests
    assert not [n for n in names if "/examples/" in n or "__pycache__" in n]
    for pin in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        if pin and not pin.startswith("#"):
            assert pin in requirements.splitlines()


def test_the_zip_is_refused_for_an_assignment_that_is_not_released(tmp_path, capsys):
    (tmp_path / "source" / "09_new").mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "source" / "09_new" / "09.ipynb")
    assert cli.main(["gradescope", "09_new", "--course", str(tmp_path)]) == 2
    assert "release/09_new holds no notebook" in capsys.readouterr().err


@pytest.mark.parametrize("student", ["cy_d_minus_1", "kim_unusual_correct"])
def test_an_upload_under_any_name_scores_what_the_class_grader_gives_it(
        tmp_path, autograder_zip, student):
    root = gradescope_container(tmp_path, autograder_zip,
                                {f"Copy of {student} (2).ipynb": example(student)})
    results, _ = run_autograder(root)
    assert results["score"] == sum(EXPECTED[student].values())
    tests = {t["name"]: t for t in results["tests"]}
    assert {name: t["score"] for name, t in tests.items()
            if name in EXPECTED[student]} == EXPECTED[student]
    assert all(t["max_score"] >= t["score"] and isinstance(t["output"], str)
               for t in tests.values())
    assert (root / "source" / "course" / "submitted" / "4711" / A / f"{A}.ipynb").exists()


HOSTILE_CELL = """
import json, os, pathlib, subprocess, sys
root = pathlib.Path({root!r})
stolen = ""
try:
    stolen = (root / "source/course/source/{a}/{a}.ipynb").read_text()
except OSError as problem:
    print("could not read the tests:", type(problem).__name__)
forged = json.dumps({{"score": 1000, "output": "forged " + stolen[:5000], "tests": []}})
try:
    (root / "results/results.json").write_text(forged)
except OSError as problem:
    print("could not write the results:", type(problem).__name__)
# and a process that outlives the kernel, to write them once the grader has
subprocess.Popen([sys.executable, "-c", "import time, pathlib; time.sleep(4); "
                  "pathlib.Path(%r).write_text(%r)" % (str(root / "results/results.json"),
                                                       forged)],
                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""


@pytest.mark.parametrize("without_bwrap", [False, True], ids=["bwrap", "container-without-bwrap"])
def test_an_upload_can_neither_read_the_hidden_tests_nor_forge_its_results(
        tmp_path, autograder_zip, without_bwrap):
    import time

    notebook = example("ada_perfect")
    root_placeholder = tmp_path / "autograder"
    notebook.cells.insert(2, nbformat.v4.new_code_cell(
        HOSTILE_CELL.format(root=str(root_placeholder), a=A)))
    root = gradescope_container(tmp_path, autograder_zip, {f"{A}.ipynb": notebook})
    results, log = run_autograder(root, without_bwrap=without_bwrap, tmp_path=tmp_path)
    time.sleep(6)  # the detached writer's sleep, and more
    on_disk = json.loads((root / "results" / "results.json").read_text())
    # what the grader wrote stays (the process the cell started costs it points: starting
    # processes disturbs the grader's record of what ran)
    assert on_disk == results
    assert "forged" not in json.dumps(results)
    assert "BEGIN HIDDEN TESTS" not in json.dumps(results)
    graded = (root / "source" / "course" / "autograded" / "4711" / A / f"{A}.ipynb").read_text()
    assert "could not read the tests" in graded and "could not write the results" in graded
    if without_bwrap:
        assert "bubblewrap cannot run in this container" in log


def test_an_upload_without_the_notebook_gets_zero_and_says_what_to_upload(
        tmp_path, autograder_zip):
    root = gradescope_container(tmp_path, autograder_zip, {
        "notes.ipynb": example("ada_perfect"), "draft.ipynb": example("dee_blank")})
    results, _ = run_autograder(root)
    assert results["score"] == 0 and results["tests"] == []
    assert f"none is named {A}.ipynb: upload {A}.ipynb alone" in results["output"]


def test_a_broken_upload_is_graded_zero_with_a_reason(tmp_path, autograder_zip):
    root = gradescope_container(tmp_path, autograder_zip, {f"{A}.ipynb": b"{not json"})
    results, _ = run_autograder(root)
    assert results["score"] == 0
    assert results["output"]


def test_notebooks_are_matched_by_name_when_an_assignment_has_several():
    part1, part2, extra = Path("a/part1.ipynb"), Path("part2.ipynb"), Path("scratch.ipynb")
    assert match_notebooks([part1, part2, extra], ["part1.ipynb", "part2.ipynb"]) == {
        "part1.ipynb": part1, "part2.ipynb": part2}
    with pytest.raises(ValueError, match="missing: part2.ipynb"):
        match_notebooks([part1, extra], ["part1.ipynb", "part2.ipynb"])
    with pytest.raises(ValueError, match="no notebook was uploaded"):
        match_notebooks([], ["hw.ipynb"])


def test_a_flagged_upload_shows_its_flags_to_the_staff_only(tmp_path, autograder_zip):
    """A flag is for a person to read, and the container is thrown away after the run:
    results.json carries the flags in a test that Gradescope shows to course staff only
    (visibility "hidden"), worth nothing."""
    root = gradescope_container(tmp_path, autograder_zip, {f"{A}.ipynb": example("hal_cheats")})
    results, _ = run_autograder(root)
    assert results["score"] == sum(EXPECTED["hal_cheats"].values())
    [flags] = [t for t in results["tests"] if t["name"] == "flags for the instructor"]
    assert flags["visibility"] == "hidden" and flags["max_score"] == 0 and flags["output"]
    assert all(t["visibility"] == "visible" for t in results["tests"] if t is not flags)
