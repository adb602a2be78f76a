"""The student edition's units and links (autograder/publishing/edition.py), pinned.

Each test fails on a small bug in autograder/publishing/edition.py (`make mutation`): a unit's
paths in the edition, a lesson's title, and the Binder, Colab and site links.
"""

import json
from pathlib import Path

import pytest

from autograder.course import Course
from autograder.publishing.edition import Repository, Unit, notebook_title, units


def _notebook(path, *cells):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": [
        {"cell_type": kind, "metadata": {}, "source": source} for kind, source in cells],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_unit_paths_in_the_edition():
    """A unit's number, its lesson's and assignment's paths in the edition, its page."""
    unit = Unit(slug="01_the_recipe", title="The recipe",
                lesson=Path("/course/notebooks/01_the_recipe_lesson.ipynb"),
                assignment=Path("/course/release/01_the_recipe/01_the_recipe.ipynb"))
    assert unit.number == "01"
    assert unit.lesson_path == "notebooks/01_the_recipe_lesson.ipynb"
    assert unit.assignment_path == "assignments/01_the_recipe/01_the_recipe.ipynb"
    assert unit.page == "notebooks/01_the_recipe_lesson.html"
    alone = Unit(slug="08_extra_bits", title="x", lesson=Path("08_extra_bits.ipynb"),
                 assignment=None)
    assert alone.assignment_path is None and alone.number == "08"


@pytest.mark.parametrize("heading, title", [
    ("# Lesson 01: the recipe", "The recipe"),
    ("# 02 Rows versus columns", "Rows versus columns"),
    ("# 03 · PyTorch's LayerNorm", "PyTorch's LayerNorm"),
    ("# UNIT 06 - low precision", "Low precision"),
    ("# assignment 7. fused kernel", "Fused kernel"),
    ("# the backward pass, for lesson 4", "The backward pass, for lesson 4"),
    ("#   Lesson 09:   spaced out  ", "Spaced out"),
])
def test_notebook_title_is_the_first_heading_without_its_number(tmp_path, heading, title):
    """The title: the first "# " heading of a markdown cell, without "Lesson 01:" and
    the like, its first letter capitalised (the rest as written)."""
    path = _notebook(tmp_path / "01_x.ipynb", ("code", "# a comment, not a title"),
                     ("markdown", ["Some intro\n", "## a subheading\n", f"{heading}\n"]),
                     ("markdown", "# A later heading"))
    assert notebook_title(path) == title


def test_notebook_title_without_a_heading_comes_from_the_file_name(tmp_path):
    """No "# " heading: the file name, without its number, in words."""
    path = _notebook(tmp_path / "04_backward_pass.ipynb", ("markdown", "##no space\ntext"),
                     ("code", "# Lesson 1: in code"))
    assert notebook_title(path) == "Backward pass"
    assert notebook_title(_notebook(tmp_path / "intro.ipynb")) == "Intro"


def test_units_pair_each_lesson_with_its_released_assignment(tmp_path):
    """Every lesson of notebooks/, in order, with the released assignment of its name
    (less the lesson's "_lesson") if there is one."""
    course = Course(tmp_path)
    _notebook(tmp_path / "notebooks" / "02_rows.ipynb", ("markdown", "# 02 Rows"))
    _notebook(tmp_path / "notebooks" / "01_recipe_lesson.ipynb",
              ("markdown", "# Lesson 01: Recipe"))
    (tmp_path / "notebooks" / "notes.txt").write_text("not a lesson")
    _notebook(course.release / "01_recipe" / "01_recipe.ipynb")
    (course.release / "02_rows").mkdir(parents=True)
    found = units(course)
    assert found == [
        Unit(slug="01_recipe", title="Recipe",
             lesson=tmp_path / "notebooks" / "01_recipe_lesson.ipynb",
             assignment=course.release / "01_recipe" / "01_recipe.ipynb"),
        Unit(slug="02_rows", title="Rows", lesson=tmp_path / "notebooks" / "02_rows.ipynb",
             assignment=None),
    ]


def test_repository_parse_reads_github_addresses():
    """owner and name from https://github.com/OWNER/NAME (.git and a slash allowed),
    the site on GitHub Pages by default, a given site ending in a slash."""
    repo = Repository.parse("  https://github.com/Norm-Course/layer-norm.git/ ")
    assert (repo.owner, repo.name, repo.branch) == ("Norm-Course", "layer-norm", "main")
    assert repo.site_url == "https://norm-course.github.io/layer-norm/"
    assert repo.url == "https://github.com/Norm-Course/layer-norm"
    mine = Repository.parse("https://github.com/a/b", branch="fall-2026",
                            site_url="https://course.example.edu/ln")
    assert mine.branch == "fall-2026" and mine.site_url == "https://course.example.edu/ln/"
    assert Repository.parse("https://github.com/a/b",
                            site_url="https://x.org/").site_url == "https://x.org/"
    assert Repository.parse("https://github.com/a/b.c").name == "b.c"


@pytest.mark.parametrize("url", [None, "", "http://github.com/a/b", "https://gitlab.com/a/b",
                                 "https://github.com/a", "https://github.com/a/b/tree/main",
                                 "https://github.com/-a/b"])
def test_repository_parse_refuses_other_addresses(url):
    """Binder and Colab open notebooks from GitHub: any other address is refused,
    with the form it must have."""
    with pytest.raises(ValueError, match=r"--repo-url must be a GitHub repository address, "
                                         r"https://github\.com/OWNER/NAME .* got "):
        Repository.parse(url)


def test_repository_parse_refuses_odd_branch_names():
    """A branch name with spaces or quotes (it goes into links) is refused."""
    for branch in ("a b", "", None, "x'y"):
        with pytest.raises(ValueError, match=r"^not a branch name: "):
            Repository.parse("https://github.com/a/b", branch=branch)


def test_links_into_binder_colab_and_the_site():
    """Binder opens the repository (at a notebook or folder, quoted), Colab a notebook
    at the branch, the site a page; as_dict is what the edition records."""
    repo = Repository.parse("https://github.com/norm/ln", branch="fall/2026",
                            site_url="https://x.org/ln/")
    assert repo.binder() == "https://mybinder.org/v2/gh/norm/ln/fall%2F2026"
    assert repo.binder("notebooks/01 the recipe.ipynb") == (
        "https://mybinder.org/v2/gh/norm/ln/fall%2F2026"
        "?urlpath=lab/tree/notebooks/01%20the%20recipe.ipynb")
    assert repo.colab("notebooks/01.ipynb") == (
        "https://colab.research.google.com/github/norm/ln/blob/fall/2026/notebooks/01.ipynb")
    assert repo.site() == "https://x.org/ln/"
    assert repo.site("notebooks/01.html") == "https://x.org/ln/notebooks/01.html"
    assert repo.as_dict() == {"repo_url": "https://github.com/norm/ln", "branch": "fall/2026",
                              "site_url": "https://x.org/ln/"}


def test_repository_parse_accepts_branch_names_in_capitals():
    """Git branch names may hold capitals ("Fall-2026", "release/V2"): they are kept as
    written, in the links too."""
    repo = Repository.parse("https://github.com/a/b", branch="Fall-2026")
    assert repo.branch == "Fall-2026"
    assert repo.binder() == "https://mybinder.org/v2/gh/a/b/Fall-2026"
    assert Repository.parse("https://github.com/a/b", branch="release/V2").colab("x.ipynb") == (
        "https://colab.research.google.com/github/a/b/blob/release/V2/x.ipynb")
