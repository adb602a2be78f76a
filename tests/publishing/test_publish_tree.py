"""The student edition (autograder/publishing/publish.py), pinned on a tiny self-made course.

Each test fails on a small bug in publish.py (`make mutation`). The course here has
two units: 01_alpha with a lesson, a source notebook (a solution and hidden tests)
and its release; 02_beta with a lesson only. Everything runs in-process, without
the site (a fake built site stands in for it where one is needed).
"""

import hashlib
import io
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml

from autograder.authoring.release import LeakError
from autograder.course import Course
from autograder.publishing import publish as pub
from autograder.publishing.edition import Repository

URL = "https://github.com/example-course/layernorm-student"
REPO_ = Repository.parse(URL)
SITE = "https://example-course.github.io/layernorm-student/"
COLAB = "https://colab.research.google.com/github/example-course/layernorm-student/blob/main/"
BINDER = "https://mybinder.org/v2/gh/example-course/layernorm-student/main"

SOLUTION_LINE = "return (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)"
HIDDEN_LINE = "assert np.allclose(layer_norm(big_input), expected_output)"
HIDDEN_25 = "assert check(a, b, c, d)1"  # 25 characters: long enough to count
HIDDEN_24 = "assert check(a, b, c, d)"  # 24 characters: too short to count
AFTER_HIDDEN = "print('after the hidden tests, the cell is visible again')"
UNCLOSED = "assert hidden_region_never_closed_in_its_cell()"
NEXT_CELL = "print('a line of the next cell, visible to students')"

REQUIREMENTS = ("# The student environment, pinned.\n"
                "numpy==1.26.4\n"
                "\n"
                "PyYAML == 6.0.1   # upper-case name, spaces around ==\n"
                "torch==2.1.0+cpu\n"
                'triton==3.7.1 ;sys_platform == "linux"  # a platform marker kept\n')
ENVIRONMENT = {"name": "layernorm-course", "channels": ["conda-forge"],
               "dependencies": ["python=3.11", "pip",
                                {"pip": ["numpy==1.26.4", "PyYAML==6.0.1"]}]}


def _meta(grade_id, **flags):
    return {"nbgrader": {"schema_version": 3, "grade_id": grade_id, "locked": False,
                         "solution": False, "grade": False, **flags}}


def _notebook(cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    return nb


def make_course(root, *, with_assignment=True):
    """The tiny course at `root`: returns its Course."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "requirements.txt").write_text(REQUIREMENTS)
    (root / "environment.yml").write_text("# the course's own comment\n"
                                          + yaml.safe_dump(ENVIRONMENT, sort_keys=False))
    (root / "notebooks").mkdir()
    code = nbformat.v4.new_code_cell
    md = nbformat.v4.new_markdown_cell
    nbformat.write(_notebook([md("# Lesson 01: The alpha recipe"), code("x = 1")]),
                   root / "notebooks" / "01_alpha.ipynb")
    nbformat.write(_notebook([md("# 02 · The beta relatives"), code("y = 2")]),
                   root / "notebooks" / "02_beta.ipynb")
    source = root / "source" / "01_alpha"
    source.mkdir(parents=True)
    nbformat.write(_notebook([
        code(f"def layer_norm(x):\n    ### BEGIN SOLUTION\n    {SOLUTION_LINE}\n"
             "    ### END SOLUTION", metadata=_meta("answer", solution=True)),
        code(f"assert layer_norm(np.ones((2, 3))).shape == (2, 3)\n### BEGIN HIDDEN TESTS\n"
             f"{HIDDEN_LINE}\n    {HIDDEN_25}   \n{HIDDEN_24}\n### END HIDDEN TESTS\n"
             f"{AFTER_HIDDEN}", metadata=_meta("tests", grade=True, points=2)),
        code(f"### BEGIN HIDDEN TESTS\n{UNCLOSED}", metadata=_meta("more", grade=True)),
        code(NEXT_CELL, metadata=_meta("last")),
    ]), source / "01_alpha.ipynb")
    if with_assignment:
        release = root / "release" / "01_alpha"
        release.mkdir(parents=True)
        nbformat.write(_notebook([
            code("def layer_norm(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()",
                 metadata=_meta("answer", solution=True)),
            code("assert layer_norm(np.ones((2, 3))).shape == (2, 3)",
                 metadata=_meta("tests", grade=True, points=2)),
        ]), release / "01_alpha.ipynb")
        (release / "data").mkdir()
        (release / "data" / "table.csv").write_text("a,b\n1,2\n")
        (release / ".ipynb_checkpoints").mkdir()
        (release / ".ipynb_checkpoints" / "01_alpha-checkpoint.ipynb").write_text("{}")
        (release / "__pycache__").mkdir()
        (release / "__pycache__" / "helper.cpython-311.pyc").write_bytes(b"\0\1")
    return Course(root)


def fake_site(course, folder, repo=REPO_):
    """A folder that passes for a site built by `make site` for `repo`."""
    from autograder.publishing.site import SITE_INFO, lessons_digest

    folder.mkdir(parents=True)
    (folder / "index.html").write_text("<html><body><p>The course</p></body></html>")
    (folder / "notebooks").mkdir()
    (folder / "notebooks" / "01_alpha.html").write_text("<p>lesson</p>")
    (folder / SITE_INFO).write_text(json.dumps({**repo.as_dict(),
                                                "lessons": lessons_digest(course)}))
    return folder


def _tree(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and ".git" not in p.parts}


@pytest.fixture
def course(tmp_path):
    return make_course(tmp_path / "course")


def _publish(course, dest, **kwargs):
    log = io.StringIO()
    outcome = pub.publish(course=course, dest=dest, repo=REPO_, log=log, **kwargs)
    return outcome, log.getvalue()


# -- the files of the edition ----------------------------------------------------------

def test_requirements_pin_every_package_of_the_course_and_nothing_else(course):
    """A parser that keeps comments, blank lines, or mangles `PyYAML == 6.0.1` (case,
    spaces) pins the wrong packages for students."""
    pinned = ["numpy==1.26.4", "PyYAML==6.0.1", "torch==2.1.0+cpu",
              'triton==3.7.1; sys_platform == "linux"']
    assert pub._pins(course) == pinned
    text = pub.requirements_txt(course)
    assert [line for line in text.splitlines() if not line.startswith("#")] == pinned
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert len(header) == 3 and text.startswith("# ")
    assert "pip install -r requirements.txt" in header[1] and "Python 3.11" in header[1]
    assert "The course's Python packages, pinned" in header[0]
    assert "environment.yml" in header[0]


def test_environment_yml_is_the_courses_environment_under_a_student_header(course):
    """A header that is not all comments breaks Binder's YAML; a dump that sorts keys or
    flows lists on one line garbles the file; commands in the wrong case do not run."""
    text = pub.environment_yml(course)
    assert yaml.safe_load(text) == ENVIRONMENT
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body[0] == "name: layernorm-course" and body[1] == "channels:"
    assert "- python=3.11" in body and not any("{" in line or "[" in line for line in body)
    header = text[:text.index("name:")]
    assert all(line.startswith("# ") for line in header.splitlines())
    assert len(header.splitlines()) == 4 and "own comment" not in text
    for words in ("The course's Python environment", "Binder builds it",
                  "conda env create -f environment.yml", "pip install -r requirements.txt",
                  "PyTorch's CPU build", "smaller than the GPU one"):
        assert words in header, words


WHAT_IS_HERE = """notebooks/       the lessons, one notebook per unit
assignments/     the assignments, one folder per unit
docs/            the site: the lessons as web pages, run and rendered
environment.yml  the course's Python packages, pinned (also in requirements.txt)
postBuild        Binder's finishing step"""


def test_readme_lists_each_unit_with_its_links_and_the_layout(course):
    """The README's table, badges, site line and layout: a wrong link, a missing
    "none" for a unit without assignment, or a layout that lists the site when there
    is none, misleads students."""
    text = pub.readme(course, REPO_)
    lines = text.splitlines()
    assert (f"| 01 The alpha recipe | [read]({SITE}notebooks/01_alpha.html) · "
            f"[Colab]({COLAB}notebooks/01_alpha.ipynb) · "
            f"[Binder]({BINDER}?urlpath=lab/tree/notebooks/01_alpha.ipynb) | "
            f"[Colab]({COLAB}assignments/01_alpha/01_alpha.ipynb) · "
            f"[Binder]({BINDER}?urlpath=lab/tree/assignments/01_alpha/01_alpha.ipynb) · "
            f"[file](assignments/01_alpha/01_alpha.ipynb) |") in lines
    assert (f"| 02 The beta relatives | [read]({SITE}notebooks/02_beta.html) · "
            f"[Colab]({COLAB}notebooks/02_beta.ipynb) · "
            f"[Binder]({BINDER}?urlpath=lab/tree/notebooks/02_beta.ipynb) | none |") in lines
    assert "| unit | lesson | assignment |" in lines
    assert f"({BINDER}?urlpath=lab/tree/notebooks)" in text
    assert f"colab-badge.svg)]({COLAB}notebooks/01_alpha.ipynb)" in text
    assert f"**Read the lessons online:** <{SITE}>" in text
    assert "A course in 2 units" in text and "`01_alpha.ipynb`" in text
    assert "git clone https://github.com/example-course/layernorm-student.git" in text
    assert WHAT_IS_HERE in text

    bare = pub.readme(course, REPO_, with_site=False)
    assert "[read]" not in bare and "Read the lessons online" not in bare
    assert SITE not in bare and "docs/" not in bare
    bare_lines = bare.splitlines()
    assert (f"| 02 The beta relatives | [Colab]({COLAB}notebooks/02_beta.ipynb) · "
            f"[Binder]({BINDER}?urlpath=lab/tree/notebooks/02_beta.ipynb) | none |") \
        in bare_lines
    assert "| unit | lesson | assignment |" in bare_lines
    assert WHAT_IS_HERE.replace(
        "docs/            the site: the lessons as web pages, run and rendered\n", "") in bare


CPU_TORCH = "--extra-index-url https://download.pytorch.org/whl/cpu"


def _command_blocks(text):
    """[(language, [command])] of the README's fenced blocks."""
    return [(language, [line.strip() for line in body.splitlines() if line.strip()])
            for language, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S)]


def test_readme_laptop_steps_work_when_typed_in_the_order_given(course):
    """A student types each block top to bottom: the menus are switched off before
    `jupyter lab` takes the terminal, pip runs in the activated environment, PowerShell
    is allowed to run Activate.ps1 before it is asked to, and what changes a command
    (the CPU build of torch) is said before the command, not after it."""
    text = pub.readme(course, REPO_, with_site=False)
    launches = [(language, lines) for language, lines in _command_blocks(text)
                if "jupyter lab" in lines]
    assert [language for language, _ in launches] == ["bash", "powershell", "bash"]
    for language, lines in launches:
        assert lines[-1] == "jupyter lab"
        for tool in pub.STUDENT_TOOLS_ONLY:
            assert lines.index(tool) < lines.index("jupyter lab"), (language, tool)
        installed = [i for i, line in enumerate(lines)
                     if line.startswith(("pip install", "conda env create"))]
        activated = [i for i, line in enumerate(lines)
                     if "activate" in line.lower() and "conda env" not in line]
        assert len(installed) == len(activated) == 1, lines
        assert max(installed + activated) < lines.index(pub.STUDENT_TOOLS_ONLY[0])
    (linux, powershell, conda) = (lines for _, lines in launches)
    assert linux[2:5] == ["python3.11 -m venv .venv", ". .venv/bin/activate",
                          "pip install -r requirements.txt"]
    assert powershell[2:6] == ["py -3.11 -m venv .venv",
                               "Set-ExecutionPolicy -Scope CurrentUser RemoteSigned",
                               ".venv\\Scripts\\Activate.ps1",
                               "pip install -r requirements.txt"]
    assert ".venv\\Scripts\\activate.bat" in text  # cmd.exe needs no policy change
    assert conda[:2] == ["conda env create -f environment.yml",
                         "conda activate layernorm-course"]
    first_block = text.index("```bash")
    for check in ("`python3.11 --version`", "`py -3.11 --version`"):
        assert text.index(check) < first_block, check
    assert text.index("https://www.python.org/downloads/") < first_block
    assert text.index(f"`pip install {CPU_TORCH} -r requirements.txt`") < first_block
    assert CPU_TORCH not in "".join(line for _, lines in launches for line in lines)


def test_readme_says_plainly_that_only_unit_07_needs_a_gpu_runtime_on_colab(course):
    text = " ".join(pub.readme(course, REPO_, with_site=False).split())
    assert "Only unit 07 needs a GPU runtime" in text
    assert "*Runtime > Change runtime type > GPU*" in text
    assert "Units 01 to 06 run on Colab's default CPU runtime" in text


def test_readme_of_a_course_whose_first_unit_has_no_assignment(tmp_path):
    """The hand-in example falls back to the lesson's name when unit 01 has no
    assignment (a README that crashes there stops publishing)."""
    course = make_course(tmp_path / "course", with_assignment=False)
    text = pub.readme(course, REPO_, with_site=False)
    assert "`01_alpha.ipynb`" in text and text.count("| none |") == 2


def test_the_edition_holds_exactly_the_students_files(course, tmp_path):
    """Staging writes the README, environment, pins, an executable postBuild, the
    lessons and the released assignments (without checkpoints or caches), and the site
    only when there is one."""
    dest = tmp_path / "new" / "edition"
    outcome, log = _publish(course, dest)
    expected = [".gitignore", "README.md", "assignments/01_alpha/01_alpha.ipynb",
                "assignments/01_alpha/data/table.csv", "environment.yml",
                "nbgrader_config.py", "notebooks/01_alpha.ipynb", "notebooks/02_beta.ipynb",
                "postBuild", "requirements.txt"]
    assert outcome == {"files": expected, "written": 10, "removed": []}
    assert sorted(_tree(dest)) == sorted(expected + [pub.MANIFEST])
    assert (dest / "postBuild").stat().st_mode & 0o777 == 0o755
    assert (dest / "postBuild").read_text() == pub.POST_BUILD
    assert (dest / "nbgrader_config.py").read_text() == pub.NBGRADER_CONFIG
    assert (dest / ".gitignore").read_text() == pub.GITIGNORE
    assert (dest / "requirements.txt").read_text() == pub.requirements_txt(course)
    assert (dest / "environment.yml").read_text() == pub.environment_yml(course)
    assert (dest / "README.md").read_text() == pub.readme(course, REPO_, with_site=False)
    assert (dest / "notebooks" / "02_beta.ipynb").read_bytes() == \
        (course.root / "notebooks" / "02_beta.ipynb").read_bytes()
    assert (dest / "assignments/01_alpha/01_alpha.ipynb").read_bytes() == \
        (course.release / "01_alpha" / "01_alpha.ipynb").read_bytes()
    manifest = json.loads((dest / pub.MANIFEST).read_text())
    assert manifest == {"files": sorted(expected + [pub.MANIFEST])}
    assert (dest / pub.MANIFEST).read_text().startswith('{\n "files": [\n  ".edition')
    assert (dest / pub.MANIFEST).read_text().endswith('"requirements.txt"\n ]\n}\n')
    assert log == f"edition in {dest.resolve()}: 10 files, 10 written, 0 removed\n"


def test_the_edition_with_a_site_holds_it_under_docs(course, tmp_path):
    """With a site, it lands in docs/ and the README links to its pages."""
    site = fake_site(course, tmp_path / "site")
    dest = tmp_path / "edition"
    outcome, _ = _publish(course, dest, site=site)
    assert "docs/index.html" in outcome["files"] and "docs/site.json" in outcome["files"]
    assert (dest / "docs" / "notebooks" / "01_alpha.html").read_text() == "<p>lesson</p>"
    assert (dest / "README.md").read_text() == pub.readme(course, REPO_, with_site=True)


def test_a_site_built_for_another_repository_or_older_lessons_is_refused(course, tmp_path):
    """A site whose links point at another repository, or that shows older lessons,
    must not be published; nothing is written."""
    other = Repository.parse("https://github.com/someone/else")
    site = fake_site(course, tmp_path / "site", repo=other)
    dest = tmp_path / "edition"
    with pytest.raises(pub.PublishError) as e:
        _publish(course, dest, site=site)
    assert str(e.value) == (
        "the site does not fit this edition:\n"
        "  the site was built for repo_url 'https://github.com/someone/else', not "
        f"'{URL}': make site\n"
        "  the site was built for site_url 'https://someone.github.io/else/', not "
        f"'{SITE}': make site")
    assert not dest.exists()


# -- the leak check --------------------------------------------------------------------

def test_visible_lines_of_a_notebook_are_its_sources_and_outputs(tmp_path):
    """Every line a reader sees in a notebook: each cell's source (given as a list of
    lines), stream text and text/plain results; a secret in any of them is found."""
    nb = {"cells": [
        {"cell_type": "code", "source": ["first = 1\n", "  second line  \n", "third"],
         "outputs": [{"output_type": "stream", "text": ["printed one\n", "printed two"]},
                     {"output_type": "execute_result",
                      "data": {"text/plain": ["result one\n", "result two"]}}]},
        {"cell_type": "markdown", "source": "words"},
        {"cell_type": "raw"},
    ]}
    lines = pub._visible_lines(Path("x.ipynb"), json.dumps(nb))
    assert lines >= {"first = 1", "second line", "third", "printed one", "printed two",
                     "result one", "result two", "words"}
    assert lines - {""} == {"first = 1", "second line", "third", "printed one",
                            "printed two", "result one", "result two", "words"}


@pytest.mark.parametrize("suffix", [".html", ".js"])
def test_visible_lines_of_a_page_are_its_text_without_tags(suffix):
    """A page shows its text, not its markup: a hidden-test line split by syntax
    highlighting and escaped entities must still be seen."""
    page = ('<div class="highlight"><pre><span class="k">assert</span> '
            '<span class="n">f</span>(<span class="s">&quot;a &amp; b&quot;</span>) '
            '&gt; 0</pre>\n<p>next</p></div>')
    lines = pub._visible_lines(Path("page" + suffix), page)
    assert 'assert f("a & b") > 0' in lines and "next" in lines


def test_visible_lines_of_plain_text_keep_their_markup():
    """A Markdown or Python file is read as it is (no tag stripping there)."""
    lines = pub._visible_lines(Path("notes.md"), "  <b>bold</b>  \nplain &amp; simple\n")
    assert lines == {"<b>bold</b>", "plain &amp; simple"}


def test_hidden_test_lines_are_those_between_the_markers(course):
    """Only stripped lines of 25 characters or more inside BEGIN/END HIDDEN TESTS, in
    each cell on its own: an off-by-one length, a region that does not end at END or
    at the cell's end, or solution lines, would miss leaks or cry wolf."""
    assert pub._hidden_test_lines(course) == {HIDDEN_LINE, HIDDEN_25, UNCLOSED}


def test_a_source_cell_without_source_text_is_no_error(course):
    """A cell that lacks "source" (hand-edited JSON) holds no hidden test; the leak
    check reads on."""
    path = course.source_notebook("01_alpha")
    notebook = json.loads(path.read_text())
    notebook["cells"].insert(0, {"cell_type": "markdown", "metadata": {}})
    path.write_text(json.dumps(notebook))
    assert pub._hidden_test_lines(course) == {HIDDEN_LINE, HIDDEN_25, UNCLOSED}


def test_scan_reports_markers_and_hidden_lines_per_file(tmp_path):
    """Each marker and each hidden line shown, per file, with its path; binary files
    are read without crashing; a shown line in a notebook counts."""
    root = tmp_path / "edition"
    (root / "notebooks").mkdir(parents=True)
    nb = {"cells": [{"cell_type": "markdown", "source": ["intro\n", HIDDEN_LINE + "\n",
                                                         HIDDEN_25]}]}
    (root / "notebooks" / "a.ipynb").write_text(json.dumps(nb))
    (root / "notes.md").write_text("uses normref\n### BEGIN SOLUTION\n")
    (root / "logo.png").write_bytes(b"\x89PNG\xff\xfe normref " + HIDDEN_LINE.encode())
    leaks = pub._scan(sorted(p for p in root.rglob("*") if p.is_file()), root,
                      {HIDDEN_LINE, HIDDEN_25})
    assert leaks == [
        "logo.png: contains 'normref'",
        f"notebooks/a.ipynb: shows hidden-test text {HIDDEN_25!r}",
        f"notebooks/a.ipynb: shows hidden-test text {HIDDEN_LINE!r}",
        "notes.md: contains 'BEGIN SOLUTION'",
        "notes.md: contains 'normref'",
    ]


def test_files_under_takes_files_and_folders_but_not_links(tmp_path):
    """The scan reads every file below each entry (and an entry that is a file), never
    a folder or a link."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "deep.txt").write_text("x")
    (tmp_path / "a" / "top.txt").write_text("x")
    (tmp_path / "single.md").write_text("x")
    (tmp_path / "outside.txt").write_text("x")
    (tmp_path / "a" / "link.txt").symlink_to(tmp_path / "outside.txt")
    found = pub._files_under([tmp_path / "a", tmp_path / "single.md"])
    assert found == sorted([tmp_path / "a" / "b" / "deep.txt", tmp_path / "a" / "top.txt",
                            tmp_path / "single.md"])


def test_edition_leaks_cover_assignments_lessons_and_any_file_but_git(course, tmp_path):
    """A solution line in a released assignment, a hidden-test line in a lesson and a
    marker anywhere are each reported once; .git is not part of the edition."""
    folder = tmp_path / "edition"
    (folder / "assignments" / "01_alpha").mkdir(parents=True)
    nb = {"cells": [{"cell_type": "code", "source": f"def f(x):\n    {SOLUTION_LINE}\n"}]}
    (folder / "assignments" / "01_alpha" / "01_alpha.ipynb").write_text(json.dumps(nb))
    (folder / "assignments" / "stray.txt").write_text("nothing\n")
    (folder / "assignments" / "02_beta").mkdir()  # a later assignment, clean
    (folder / "assignments" / "02_beta" / "02_beta.ipynb").write_text('{"cells": []}')
    (folder / "notebooks").mkdir()
    lesson = {"cells": [{"cell_type": "markdown", "source": f"```\n{HIDDEN_LINE}\n```"}]}
    (folder / "notebooks" / "01_alpha.ipynb").write_text(json.dumps(lesson))
    (folder / "README.md").write_text("see normref\n")
    (folder / ".git").mkdir()
    (folder / ".git" / "COMMIT_EDITMSG").write_text("normref ### BEGIN SOLUTION\n")
    leaks = pub.find_edition_leaks(course=course, folder=folder)
    assert leaks == [
        f"release/01_alpha/01_alpha.ipynb: shows solution text {SOLUTION_LINE!r}",
        "README.md: contains 'normref'",
        f"notebooks/01_alpha.ipynb: shows hidden-test text {HIDDEN_LINE!r}",
    ]


def test_edition_leaks_of_an_edition_without_assignments(course, tmp_path):
    """An edition with no assignments/ folder is scanned, not crashed on."""
    folder = tmp_path / "edition"
    folder.mkdir()
    (folder / "README.md").write_text("### END HIDDEN TESTS\n")
    assert pub.find_edition_leaks(course=course, folder=str(folder)) == [
        "README.md: contains 'END HIDDEN TESTS'"]


def test_the_same_leak_is_reported_once(course, tmp_path, monkeypatch):
    """Two checks that find the same thing give one line, in the order found."""
    folder = tmp_path / "edition"
    (folder / "assignments" / "01_alpha").mkdir(parents=True)
    monkeypatch.setattr(pub, "find_leaks",
                        lambda **_: ["README.md: contains 'normref'", "b: twice", "b: twice"])
    (folder / "README.md").write_text("normref\n")
    assert pub.find_edition_leaks(course=course, folder=folder) == [
        "README.md: contains 'normref'", "b: twice"]


def test_strangers_are_top_level_entries_the_edition_is_not_made_of(tmp_path):
    """Anything but the edition's own entries is named, sorted."""
    for name in ("README.md", "notebooks", "zeta", "alpha.txt", "docs"):
        (tmp_path / name).mkdir()
    assert pub._strangers(tmp_path) == ["alpha.txt", "zeta"]


def test_a_leak_is_refused_and_nothing_is_written(course, tmp_path):
    """A lesson showing a hidden-test line stops publishing: LeakError naming the file,
    and no folder made."""
    nb = nbformat.read(course.root / "notebooks" / "02_beta.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell(HIDDEN_LINE))
    nb.cells.append(nbformat.v4.new_markdown_cell("normref.checks"))
    nbformat.write(nb, course.root / "notebooks" / "02_beta.ipynb")
    dest = tmp_path / "edition"
    with pytest.raises(LeakError) as error:
        _publish(course, dest)
    assert str(error.value) == (
        "the edition would show grading material; nothing was written:\n"
        "  notebooks/02_beta.ipynb: contains 'normref'\n"
        f"  notebooks/02_beta.ipynb: shows hidden-test text {HIDDEN_LINE!r}")
    assert not dest.exists()


def test_a_leak_is_refused_when_updating_an_edition_too(course, tmp_path):
    """Updating an existing edition runs the same check on what would be written."""
    dest = tmp_path / "edition"
    _publish(course, dest)
    before = _tree(dest)
    (course.release / "01_alpha" / "data" / "answers.txt").write_text("### BEGIN SOLUTION\n")
    with pytest.raises(LeakError) as error:
        _publish(course, dest)
    assert str(error.value) == (
        "the edition would show grading material; nothing was written:\n"
        "  release/01_alpha/data/answers.txt: contains 'BEGIN SOLUTION'\n"
        "  assignments/01_alpha/data/answers.txt: contains 'BEGIN SOLUTION'")
    assert _tree(dest) == before


def test_a_stranger_in_the_staged_edition_is_refused(course, tmp_path, monkeypatch):
    """If staging ever wrote a file the edition is not made of, publishing refuses."""
    real_stage = pub._stage

    def stage_too_much(**kwargs):
        real_stage(**kwargs)
        (kwargs["folder"] / "gradebook.db").write_text("grades")

    monkeypatch.setattr(pub, "_stage", stage_too_much)
    with pytest.raises(LeakError, match="gradebook.db: not part of a student edition"):
        _publish(course, tmp_path / "edition")


def test_the_repositorys_own_files_are_scanned_but_not_git(course, tmp_path):
    """A file the repository holds besides the edition (a LICENSE, a notes folder) is
    published too, so a leak there is refused; .git is never scanned."""
    dest = tmp_path / "clone"
    (dest / ".git").mkdir(parents=True)
    (dest / ".git" / "config").write_text("normref\n")
    (dest / "README.md").write_text("# placeholder mentioning normref\n")  # replaced
    (dest / "LICENSE").write_text("MIT\n")
    outcome, _ = _publish(course, dest)
    assert (dest / "LICENSE").read_text() == "MIT\n" and "LICENSE" not in outcome["files"]
    (dest / "extras").mkdir()
    (dest / "extras" / "notes.md").write_text(f"```\n{HIDDEN_LINE}\n```\n")
    before = _tree(dest)
    with pytest.raises(LeakError, match="extras/notes.md: shows hidden-test text"):
        _publish(course, dest)
    assert _tree(dest) == before


def test_a_leak_left_inside_the_editions_folders_is_refused(course, tmp_path):
    """A file put into the clone's assignments/ by hand (not written by publish, so kept
    by an update) is published with the edition: a solution there must be refused."""
    dest = tmp_path / "clone"
    _publish(course, dest)
    leak = dest / "assignments" / "01_alpha" / "01_alpha_solutions.ipynb"
    leak.write_text(json.dumps({"cells": [{"cell_type": "code",
                                           "source": "### BEGIN SOLUTION\nx = 1\n"}]}))
    before = _tree(dest)
    with pytest.raises(LeakError, match="01_alpha_solutions.ipynb: contains 'BEGIN SOLUTION'"):
        _publish(course, dest)
    assert _tree(dest) == before


def test_a_file_the_update_removes_is_not_held_against_it(course, tmp_path):
    """A file of the last edition that this one drops is removed, not scanned: an
    edition that dropped a leaky page can be published."""
    dest = tmp_path / "clone"
    _publish(course, dest)
    (dest / "notebooks" / "00_old.ipynb").write_text("### BEGIN SOLUTION\n")
    manifest = json.loads((dest / pub.MANIFEST).read_text())
    manifest["files"].append("notebooks/00_old.ipynb")
    (dest / pub.MANIFEST).write_text(json.dumps(manifest))
    outcome, _ = _publish(course, dest)
    assert outcome["removed"] == ["notebooks/00_old.ipynb"]
    assert not (dest / "notebooks" / "00_old.ipynb").exists()


# -- where it may write ----------------------------------------------------------------

def test_destinations_inside_or_around_the_course_are_refused(course, tmp_path):
    """The course itself, a folder holding it, and its grading folders are never
    written into; each refusal says why."""
    root = course.root.resolve()
    cases = {root: "holds the course itself", root.parent: "holds the course itself"}
    for part in ("source", "release", "normref", "autograder", "notebooks", "tests"):
        cases[root / part / "edition"] = f"lies inside the course's {part}/"
    for dest, message in cases.items():
        with pytest.raises(pub.PublishError, match=message):
            pub._check_destination(course, dest)
    pub._check_destination(course, root / "build" / "edition")  # beside them: fine
    pub._check_destination(course, tmp_path / "sourcery")


def test_a_destination_that_is_a_file_or_someone_elses_folder_is_refused(course, tmp_path):
    """A file, or a folder of other work, is not overwritten; a fresh GitHub clone
    (.git, README, LICENSE) or a former edition is fine."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(pub.PublishError, match="is not a folder"):
        pub._check_destination(course, afile)
    work = tmp_path / "work"
    work.mkdir()
    for index in range(10):
        (work / f"thesis{index}.tex").write_text("mine")
    (work / "LICENSE").write_text("mine")
    with pytest.raises(pub.PublishError) as error:
        pub._check_destination(course, work)
    names = ", ".join(f"thesis{i}.tex" for i in range(8))
    assert str(error.value) == (f"{work} is neither empty nor a student edition (it holds "
                                f"{names}); publish into an empty folder or a clone of "
                                "the edition's repository")
    fresh = tmp_path / "fresh"
    (fresh / ".git").mkdir(parents=True)
    for name in (".github", "README.md", ".gitignore", "LICENSE.md"):
        (fresh / name).write_text("x")
    pub._check_destination(course, fresh)
    (work / pub.MANIFEST).write_text('{"files": []}')
    pub._check_destination(course, work)
    pub._check_destination(course, tmp_path / "not-yet")


# -- writing in place ------------------------------------------------------------------

def _staged(folder, files):
    for relative, content in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(content)
    return folder


def test_a_second_run_rewrites_changed_files_and_removes_dropped_ones(tmp_path):
    """An update rewrites only what changed, removes the files (and emptied folders) the
    edition no longer has, and leaves .git and files it never wrote alone."""
    dest = tmp_path / "dest"
    first = _staged(tmp_path / "one", {"README.md": "v1", "notebooks/a.ipynb": "a",
                                      "assignments/02_b/02_b.ipynb": "b",
                                      "assignments/02_b/data/x.csv": "x",
                                      "assignments/03_c/03_c.ipynb": "c"})
    log = io.StringIO()
    assert pub._write_in_place(first, dest, log)["written"] == 5
    (dest / ".git").mkdir()
    (dest / ".git" / "HEAD").write_text("ref")
    (dest / "assignments" / "03_c" / "notes.txt").write_text("mine")
    (dest / "LICENSE").write_text("mine")
    unchanged = dest / "notebooks" / "a.ipynb"
    os.utime(unchanged, (1_000_000, 1_000_000))
    second = _staged(tmp_path / "two", {"README.md": "v2", "notebooks/a.ipynb": "a",
                                       "notebooks/new.ipynb": "n"})
    log = io.StringIO()
    outcome = pub._write_in_place(second, dest, log)
    assert outcome == {"files": ["README.md", "notebooks/a.ipynb", "notebooks/new.ipynb"],
                       "written": 2,
                       "removed": ["assignments/02_b/02_b.ipynb", "assignments/02_b/data/x.csv",
                                   "assignments/03_c/03_c.ipynb"]}
    assert log.getvalue() == f"edition in {dest}: 3 files, 2 written, 3 removed\n"
    assert (dest / "README.md").read_text() == "v2"
    assert unchanged.stat().st_mtime == 1_000_000  # not rewritten
    assert not (dest / "assignments" / "02_b").exists()
    assert (dest / "assignments" / "03_c" / "notes.txt").read_text() == "mine"
    assert (dest / ".git" / "HEAD").read_text() == "ref"
    assert (dest / "LICENSE").read_text() == "mine"
    assert json.loads((dest / pub.MANIFEST).read_text())["files"] == [
        pub.MANIFEST, "README.md", "notebooks/a.ipynb", "notebooks/new.ipynb"]
    # A third run with nothing new writes nothing.
    outcome = pub._write_in_place(second, dest, io.StringIO())
    assert outcome["written"] == 0 and outcome["removed"] == []


def test_the_last_dropped_file_removes_its_folders_but_never_the_destination(tmp_path):
    """Emptied folders go up to, and not including, the edition's folder; a dropped
    file someone already deleted is no error."""
    dest = tmp_path / "dest"
    pub._write_in_place(_staged(tmp_path / "one", {"a/b/c.txt": "c", "gone.txt": "g"}),
                        dest, io.StringIO())
    (dest / "gone.txt").unlink()
    empty = tmp_path / "empty"
    empty.mkdir()
    outcome = pub._write_in_place(empty, dest, io.StringIO())
    assert outcome["removed"] == ["a/b/c.txt", "gone.txt"]
    assert sorted(p.name for p in dest.iterdir()) == [pub.MANIFEST]


def test_writing_never_follows_a_link_in_the_destination(tmp_path):
    """A link (dangling, or to a file with the same bytes) where the edition writes a
    file is replaced by the file: nothing outside the edition is written."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "same.md").write_text("same")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "same.md").symlink_to(outside / "same.md")
    (dest / "dangling.md").symlink_to(outside / "nowhere.md")
    (dest / "folder.md").mkdir()  # a folder where a file goes
    (dest / "folder.md" / "inner").write_text("x")
    staged = _staged(tmp_path / "one", {"same.md": "same", "dangling.md": "new",
                                       "folder.md": "file"})
    outcome = pub._write_in_place(staged, dest, io.StringIO())
    assert outcome["written"] == 3
    for name, text in (("same.md", "same"), ("dangling.md", "new"), ("folder.md", "file")):
        assert not (dest / name).is_symlink() and (dest / name).read_text() == text
    assert not (outside / "nowhere.md").exists()


def test_a_dropped_link_is_removed(tmp_path):
    """A file of the last edition that is now a link is removed, not followed."""
    dest = tmp_path / "dest"
    pub._write_in_place(_staged(tmp_path / "one", {"old.md": "o"}), dest, io.StringIO())
    (tmp_path / "target.md").write_text("keep")
    (dest / "old.md").unlink()
    (dest / "old.md").symlink_to(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    pub._write_in_place(empty, dest, io.StringIO())
    assert not (dest / "old.md").is_symlink() and (tmp_path / "target.md").exists()


# -- the subcommand --------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _publish_logs_here(monkeypatch):
    """publish()'s default log is the sys.stderr of when it was imported, which a test
    runner may have closed since: the subcommand's publish logs into a buffer."""
    real = pub.publish
    monkeypatch.setattr(pub, "publish", lambda **kw: real(**{"log": io.StringIO(), **kw}))


def _args(course, dest, **extra):
    base = dict(course=str(course.root), dir=str(dest), repo_url=URL, branch="main",
                site_url=None, no_site=False, site=None)
    return SimpleNamespace(**{**base, **extra})


def test_publish_command_without_a_site(course, tmp_path, capsys):
    """--no-site publishes the edition alone and reports its size; exit 0."""
    dest = tmp_path / "edition"
    assert pub.publish_command(_args(course, dest, no_site=True)) == 0
    assert not (dest / "docs").exists() and (dest / "README.md").is_file()
    assert capsys.readouterr().out == \
        "10 files; push the folder to the public repository\n"


def test_publish_command_with_a_built_site(course, tmp_path, capsys):
    """--site PATH publishes that site in docs/."""
    site = fake_site(course, tmp_path / "site")
    dest = tmp_path / "edition"
    assert pub.publish_command(_args(course, dest, site=str(site))) == 0
    assert (dest / "docs" / "index.html").is_file()
    assert capsys.readouterr().out.startswith("13 files;")


def test_publish_command_builds_the_site_by_default(course, tmp_path, monkeypatch):
    """Without --site or --no-site, a site is built for the repository (its npm files
    cached in the course's build/npm) and published."""
    import autograder.publishing.site

    calls = []

    def build_site(*, course, repo, out, asset_cache):
        calls.append((repo, asset_cache))
        fake_site(course, out, repo=repo)

    monkeypatch.setattr(autograder.publishing.site, "build_site", build_site)
    dest = tmp_path / "edition"
    assert pub.publish_command(_args(course, dest, branch="term2",
                                     site_url="https://course.example.org/ln")) == 0
    repo = Repository.parse(URL, branch="term2", site_url="https://course.example.org/ln")
    assert calls == [(repo, course.root / "build" / "npm")]
    assert (dest / "docs" / "index.html").is_file()
    assert "https://course.example.org/ln/notebooks/01_alpha.html" in \
        (dest / "README.md").read_text()


def test_publish_command_exit_codes(course, tmp_path, capsys, monkeypatch):
    """A bad address, a bad destination or a site error exit 1 with "error:"; a leak
    exits 2 with REFUSED."""
    assert pub.publish_command(_args(course, tmp_path / "e", repo_url="https://gitlab.com/a/b",
                                     no_site=True)) == 1
    assert capsys.readouterr().err.startswith("error: --repo-url must be")
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert pub.publish_command(_args(course, afile, no_site=True)) == 1
    assert capsys.readouterr().err == f"error: {afile} is not a folder\n"
    stale = fake_site(course, tmp_path / "stale", repo=Repository.parse(URL, branch="old"))
    assert pub.publish_command(_args(course, tmp_path / "e", site=str(stale))) == 1
    assert "error: the site does not fit" in capsys.readouterr().err

    import autograder.publishing.site

    def failing_build(**_):
        raise autograder.publishing.site.SiteError("npm is missing")

    monkeypatch.setattr(autograder.publishing.site, "build_site", failing_build)
    assert pub.publish_command(_args(course, tmp_path / "e")) == 1
    assert capsys.readouterr().err == "error: npm is missing\n"
    (course.root / "notebooks" / "02_beta.ipynb").write_text(
        json.dumps({"cells": [{"cell_type": "markdown", "source": "normref"}],
                    "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert pub.publish_command(_args(course, tmp_path / "e", no_site=True)) == 2
    assert capsys.readouterr().err.startswith("REFUSED: the edition would show")
    assert not (tmp_path / "e").exists()
