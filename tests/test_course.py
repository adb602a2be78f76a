"""Where things live in a course (autograder/course.py), pinned.

Each test fails on a small bug in autograder/course.py (`make mutation`): the
course's folders, its assignments and their notebooks, and who handed in what.
"""

import os
import sys
from pathlib import Path

import pytest

from autograder import course as course_module
from autograder.course import Course


def _touch(path, text="{}"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_folders_of_a_course(tmp_path):
    """source/, release/, submitted/, autograded/ and reports/ under the root."""
    course = Course(tmp_path)
    assert (course.source, course.release, course.submitted, course.autograded,
            course.reports) == (tmp_path / "source", tmp_path / "release",
                                tmp_path / "submitted", tmp_path / "autograded",
                                tmp_path / "reports")


def test_course_at_resolves_the_root_and_defaults_to_this_repository(tmp_path, monkeypatch):
    """Course.at: the given folder made absolute, or the repository the package is in."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c").mkdir()
    assert Course.at("c").root == tmp_path / "c"
    assert Course.at().root == course_module.REPO_ROOT
    assert (course_module.REPO_ROOT / "autograder" / "course.py").is_file()
    assert course_module.PACKAGE_DIR == course_module.REPO_ROOT / "autograder"


def test_assignments_are_the_source_folders_holding_a_notebook(tmp_path):
    """Sorted folder names of source/ with a notebook; empty folders, stray files and
    a missing source/ give none."""
    course = Course(tmp_path)
    assert course.assignments() == []
    _touch(course.source / "02_rows" / "02_rows.ipynb")
    _touch(course.source / "01_recipe" / "01_recipe.ipynb")
    _touch(course.source / "03_empty" / "notes.txt")
    _touch(course.source / "stray.ipynb")
    assert course.assignments() == ["01_recipe", "02_rows"]


def test_notebooks_of_an_assignment(tmp_path):
    """notebook_names: sorted, an error naming an empty assignment; notebook_name and
    the source and release paths only for one-notebook assignments."""
    course = Course(tmp_path)
    _touch(course.source / "one" / "one.ipynb")
    _touch(course.source / "two" / "b.ipynb")
    _touch(course.source / "two" / "a.ipynb")
    _touch(course.source / "two" / "data.csv")
    (course.source / "none").mkdir()
    assert course.notebook_names("two") == ["a.ipynb", "b.ipynb"]
    assert course.notebook_name("one") == "one.ipynb"
    assert course.source_notebook("one") == tmp_path / "source" / "one" / "one.ipynb"
    assert course.release_notebook("one") == tmp_path / "release" / "one" / "one.ipynb"
    with pytest.raises(FileNotFoundError, match=r"^source/none holds no notebook$"):
        course.notebook_names("none")
    with pytest.raises(ValueError, match=r"^source/two holds 2 notebooks: use notebook_names$"):
        course.notebook_name("two")


def test_students_are_those_with_a_hand_in_folder(tmp_path):
    """Students with submitted/<student>/<assignment>/, sorted; none without submitted/."""
    course = Course(tmp_path)
    assert course.students("hw") == []
    for student in ("zoe", "ada"):
        (course.submitted / student / "hw").mkdir(parents=True)
    (course.submitted / "bob" / "other").mkdir(parents=True)
    _touch(course.submitted / "cy" / "hw")
    assert course.students("hw") == ["ada", "zoe"]


def test_path_with_tools_puts_this_interpreters_bin_first_once(monkeypatch):
    """nbgrader, alembic and jupyter-book are looked for beside this interpreter
    first; bin/ elsewhere on PATH moves to the front rather than appearing twice."""
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join(["/opt/x", bin_dir, "/usr/bin"]))
    assert course_module.path_with_tools() == os.pathsep.join([bin_dir, "/opt/x", "/usr/bin"])
    monkeypatch.setenv("PATH", "/usr/local/bin")
    assert course_module.path_with_tools() == os.pathsep.join([bin_dir, "/usr/local/bin"])


def test_path_with_tools_without_path_keeps_the_default_search_path(monkeypatch):
    """No PATH: bin/, then os.defpath (where programs are looked for without one);
    never an empty entry, which would mean the current folder."""
    monkeypatch.delenv("PATH", raising=False)
    found = course_module.path_with_tools()
    assert found == os.pathsep.join([str(Path(sys.executable).parent), os.defpath])
    assert "" not in found.split(os.pathsep)
