"""release/ is exactly what nbgrader builds from source/, and leaks nothing."""

import json
import shutil
import subprocess
import sys

import pytest

from autograder.course import Course
from autograder.release import find_leaks, release
from conftest import REPO, SOURCES


def _comparable(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        cell.pop("id", None)
    return nb


@pytest.fixture(scope="module")
def fresh_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(REPO / "source", root / "source")
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    course = Course(root)
    release(course=course)
    return course


def test_committed_release_equals_a_fresh_build(fresh_build):
    built = sorted(p.relative_to(fresh_build.release) for p in fresh_build.release.rglob("*")
                   if p.is_file())
    committed = sorted(p.relative_to(REPO / "release") for p in (REPO / "release").rglob("*")
                       if p.is_file())
    assert built == committed
    for relative in built:
        if relative.suffix == ".ipynb":
            assert _comparable(fresh_build.release / relative) == \
                _comparable(REPO / "release" / relative), f"{relative} is out of date: make release"


def test_release_leaks_nothing():
    course = Course.at(REPO)
    for assignment in course.assignments():
        assert find_leaks(course=course, assignment=assignment) == []


def test_leak_check_catches_solution_text(fresh_build):
    notebook = fresh_build.release_notebook("01_the_recipe")
    text = notebook.read_text()
    notebook.write_text(text.replace("# YOUR CODE HERE",
                                     "return (centred**2).sum(axis=-1) / x.shape[-1]", 1))
    try:
        assert any("solution text" in leak
                   for leak in find_leaks(course=fresh_build, assignment="01_the_recipe"))
    finally:
        notebook.write_text(text)


def _validate(path, env):
    return subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(path)],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.parent.name)
def test_source_validates_and_untouched_release_fails(path, venv_env):
    done = _validate(path, venv_env)
    assert "Success! Your notebook passes all the tests." in done.stdout, done.stdout[-3000:]
    released = REPO / "release" / path.parent.name / path.name
    done = _validate(released, venv_env)
    assert "NotImplementedError" in done.stdout or "failed" in done.stdout.lower(), \
        done.stdout[-2000:]
    assert "Success!" not in done.stdout


def test_failed_release_leaves_the_committed_release_untouched(tmp_path):
    """A source nbgrader refuses (two cells with one grade id) fails in one line and
    deletes or changes nothing in release/."""
    shutil.copytree(REPO / "source", tmp_path / "source", dirs_exist_ok=True)
    shutil.copytree(REPO / "release", tmp_path / "release")
    shutil.copy(REPO / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    course = Course(tmp_path)
    source = course.source_notebook("01_the_recipe")
    nb = json.loads(source.read_text())
    graded = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    graded[1]["metadata"]["nbgrader"]["grade_id"] = graded[0]["metadata"]["nbgrader"]["grade_id"]
    source.write_text(json.dumps(nb))
    before = {p: p.read_bytes() for p in course.release.rglob("*") if p.is_file()}
    done = subprocess.run([sys.executable, "-m", "autograder", "release", "01_the_recipe",
                           "--course", str(tmp_path)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "release/01_the_recipe is unchanged" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert {p: p.read_bytes() for p in course.release.rglob("*") if p.is_file()} == before
