"""The student edition (python -m autograder publish): what it holds, what it must
never hold, how it refuses, how a second run updates it, and that it works on its
own.

The quick tests publish without the site (--no-site; tests/publishing/test_site.py builds and
checks the site, and publishes with it). The slow ones build a fresh virtual
environment from the edition's own environment.yml pins (pip, PyTorch's CPU build
from this machine's wheel, about 2 minutes and 2.4 GB), with nothing of this
repository importable, and in it run every lesson and every released assignment
(answered with source/'s solutions, as a student who got everything right) top to
bottom, moving every slider and menu of every lesson under ipywidgets 8 (the pin)
and again under ipywidgets 7.7 (what Colab ships). COURSE_SKIP_EDITION_VENV=1 skips
them.
"""

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml
from packaging.requirements import Requirement

from autograder.authoring.release import LEAK_MARKERS
from autograder.course import Course
from autograder.publishing.edition import (
    ASSIGNMENTS_DIR,
    LESSON_DATA,
    LESSONS_DIR,
    Repository,
    units,
)
from autograder.publishing.publish import MANIFEST, find_edition_leaks
from conftest import LESSONS, REPO

REPO_URL = "https://github.com/example-course/layernorm-student"
EDITION_REPO = Repository.parse(REPO_URL)
PYTHON_REGEX = re.compile(r"python\s*=+\s*([\d\.]*)")  # repo2docker's own pattern
COLAB_IPYWIDGETS = "7.7.1"  # what Colab's runtime ships
TOP_LEVEL = {"README.md", "environment.yml", "requirements.txt", "postBuild", "LICENSE",
             "LICENSE-TEXT.md",
             "nbgrader_config.py", ".gitignore", MANIFEST, LESSONS_DIR, ASSIGNMENTS_DIR}
# Words of the grading side that no file of the edition may hold.
# The edition's only Python files: nbgrader's settings, and the GPU benchmark that
# unit 07's lesson and assignment both import (it ships with the assignment)
PYTHON_FILES = {"nbgrader_config.py", f"{ASSIGNMENTS_DIR}/07_fused_kernel/fused_kernel_bench.py"}
GRADING_WORDS = (*LEAK_MARKERS, "autograder", "checkserver", "grader.key", "gradebook",
                 "from normref", "source/", "sample class")


def _publish(dest, *extra, course=REPO):
    return subprocess.run(
        [sys.executable, "-m", "autograder", "publish", str(dest), "--repo-url", REPO_URL,
         "--course", str(course), *extra],
        capture_output=True, text=True, timeout=600, cwd=REPO)


def built_once(name, tmp_path_factory, build):
    """The folder `name`, built by build(folder) once per test run: under xdist every
    worker shares it (the first builds it under a lock, the others wait and reuse it)."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    target = root / name
    with FileLock(str(target) + ".lock"):
        if not (target / ".built").exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            build(target)
            (target / ".built").touch()
    return target


def _tree(folder):
    """{relative path: sha256} of every file under `folder`."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _course_copy(target):
    """The parts of the course that publishing reads, in a scratch folder."""
    for part in ("source", "release", "notebooks"):
        shutil.copytree(REPO / part, target / part)
    for name in ("requirements.txt", "environment.yml", "nbgrader_config.py"):
        shutil.copy2(REPO / name, target / name)
    return target


@pytest.fixture(scope="session")
def edition(tmp_path_factory):
    def publish(folder):
        done = _publish(folder / "edition", "--no-site")
        assert done.returncode == 0, done.stdout + done.stderr

    return built_once("published", tmp_path_factory, publish) / "edition"


# -- what it holds ------------------------------------------------------------------------

def test_the_edition_holds_the_lessons_the_assignments_and_the_environment(edition):
    course = Course.at(REPO)
    assert {p.name for p in edition.iterdir()} == TOP_LEVEL
    expected = set(TOP_LEVEL - {LESSONS_DIR, ASSIGNMENTS_DIR})
    for unit in units(course):
        expected.add(unit.lesson_path)
        assert (edition / unit.lesson_path).read_bytes() == unit.lesson.read_bytes()
        for path in unit.assignment.parent.rglob("*"):
            if path.is_file():
                inside = path.relative_to(unit.assignment.parent)
                relative = f"{ASSIGNMENTS_DIR}/{unit.slug}/{inside}"
                expected.add(relative)
                assert (edition / relative).read_bytes() == path.read_bytes()
    data = REPO / LESSONS_DIR / LESSON_DATA  # what the lessons read (lesson 02's digits)
    for path in data.rglob("*"):
        relative = path.relative_to(REPO).as_posix()
        expected.add(relative)
        assert (edition / relative).read_bytes() == path.read_bytes()
    assert f"{LESSONS_DIR}/{LESSON_DATA}/digits.csv.gz" in expected
    assert set(_tree(edition)) == expected
    assert json.loads((edition / MANIFEST).read_text())["files"] == sorted(expected)
    assert len(units(course)) == len(LESSONS) == 7


def test_the_edition_holds_no_solution_hidden_test_normref_or_grading_code(edition):
    course = Course.at(REPO)
    assert find_edition_leaks(course=course, folder=edition) == []
    for relative in _tree(edition):
        text = (edition / relative).read_text(errors="replace")
        found = [word for word in GRADING_WORDS if word in text]
        assert not found, f"{relative} mentions {found}"
        assert not relative.endswith(".py") or relative in PYTHON_FILES
        assert not {"source", "normref", "autograder", "tests", "examples"} & \
            set(Path(relative).parts)


def test_nbgrader_metadata_shows_stubs_and_visible_tests_only(edition):
    course = Course.at(REPO)
    for unit in units(course):
        lesson = nbformat.read(edition / unit.lesson_path, as_version=4)
        assert all("nbgrader" not in cell.metadata for cell in lesson.cells)
        released = nbformat.read(edition / unit.assignment_path, as_version=4)
        source = nbformat.read(course.source_notebook(unit.slug), as_version=4)
        source_cells = {c.metadata["nbgrader"]["grade_id"]: c for c in source.cells
                        if "nbgrader" in c.metadata}
        solutions = solution_stubs = 0
        for cell in [*lesson.cells, *released.cells]:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None
        for cell in released.cells:
            if "nbgrader" not in cell.metadata:  # a scratch cell: the student's own
                assert cell.cell_type == "code" and "scratch" in cell.source.splitlines()[0]
                continue
            meta = cell.metadata["nbgrader"]
            original = source_cells[meta["grade_id"]]
            if meta.get("solution") and "### BEGIN SOLUTION" in original.source:
                solutions += 1
                solution_stubs += ("raise NotImplementedError()" in cell.source
                                   or "YOUR ANSWER HERE" in cell.source)
                assert "BEGIN SOLUTION" not in cell.source
            if meta.get("grade") and cell.cell_type == "code":
                assert "HIDDEN TESTS" not in cell.source and "normref" not in cell.source
                if "### BEGIN HIDDEN TESTS" in original.source:
                    # the hidden tests may open the cell, so that grading shows them first
                    visible = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?",
                                     "", original.source, flags=re.DOTALL).strip()
                    assert cell.source.strip() == visible
        assert solutions > 0 and solution_stubs == solutions, unit.slug


def test_the_readme_starts_students_on_binder_colab_or_a_laptop(edition):
    readme = (edition / "README.md").read_text()
    assert "https://mybinder.org/badge_logo.svg" in readme
    assert "https://colab.research.google.com/assets/colab-badge.svg" in readme
    for needed in ("Binder", "Colab", "pip install -r requirements.txt", "Validate",
                   "Hand in", "NotImplementedError"):
        assert needed in readme
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    files = set(_tree(edition)) | {LESSONS_DIR, ASSIGNMENTS_DIR}
    colab = f"https://colab.research.google.com/github/{EDITION_REPO.owner}/" \
            f"{EDITION_REPO.name}/blob/main/"
    binder = f"https://mybinder.org/v2/gh/{EDITION_REPO.owner}/{EDITION_REPO.name}/main"
    seen = {"colab": 0, "binder": 0}
    for link in links:
        if link.startswith(colab):
            assert link.removeprefix(colab) in files, link
            seen["colab"] += 1
        elif link.startswith(binder):
            if "?urlpath=lab/tree/" in link:
                assert link.split("?urlpath=lab/tree/")[1] in files, link
            seen["binder"] += 1
        elif not link.startswith("https://"):
            assert link in files, f"README links to {link}, which the edition lacks"
    course = Course.at(REPO)
    assert seen["colab"] >= 2 * len(units(course)) and seen["binder"] >= 2 * len(units(course))


def test_the_environment_is_what_binder_reads_and_pins_the_course_packages(edition):
    environment = yaml.safe_load((edition / "environment.yml").read_text())
    strings = [d for d in environment["dependencies"] if isinstance(d, str)]
    assert [m.group(1) for d in strings if (m := PYTHON_REGEX.match(d))] == ["3.11"]
    (pip,) = [d["pip"] for d in environment["dependencies"] if isinstance(d, dict)]
    pins = _pins([line for line in pip if not line.startswith("-")])
    assert pins == _pins((REPO / "requirements.txt").read_text().splitlines())
    assert pins == _pins((edition / "requirements.txt").read_text().splitlines())
    assert not (edition / "binder").exists() and not (edition / "Dockerfile").exists()
    post_build = edition / "postBuild"
    assert post_build.stat().st_mode & stat.S_IXUSR
    assert subprocess.run(["bash", "-n", str(post_build)]).returncode == 0


def _pins(lines):
    pins = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            requirement = Requirement(line)
            pins[requirement.name.lower()] = next(iter(requirement.specifier)).version
    return pins


# -- refusing -----------------------------------------------------------------------------

LEAKS = {
    "hidden-test line in a lesson": ("notebooks/01_the_recipe_lesson.ipynb", "hidden"),
    "hidden-test marker in a lesson": ("notebooks/02_rows_versus_columns_lesson.ipynb",
                                       "### BEGIN HIDDEN TESTS"),
    "solution line in an assignment": ("release/01_the_recipe/01_the_recipe.ipynb",
                                       "solution"),
    "normref in an assignment": ("release/03_pytorch_layernorm/03_pytorch_layernorm.ipynb",
                                 "from normref.checks import check_module"),
}


def _secret_line(course, region):
    """A line of unit 01's solutions or hidden tests, as the leak check sees them."""
    marker = {"solution": "SOLUTION", "hidden": "HIDDEN TESTS"}[region]
    for cell in json.loads(course.source_notebook("01_the_recipe").read_text())["cells"]:
        inside = False
        for line in "".join(cell["source"]).splitlines():
            if f"### BEGIN {marker}" in line:
                inside = True
            elif f"### END {marker}" in line:
                inside = False
            elif inside and len(line.strip()) >= 25:
                return line.strip()
    raise AssertionError(f"unit 01 has no {region} line")


@pytest.mark.parametrize("kind", sorted(LEAKS))
def test_a_leak_is_refused_and_nothing_is_written(kind, edition, tmp_path):
    course = _course_copy(tmp_path / "course")
    relative, text = LEAKS[kind]
    if text in ("hidden", "solution"):
        text = _secret_line(Course(course), text)
    notebook = nbformat.read(course / relative, as_version=4)
    notebook.cells.append(nbformat.v4.new_markdown_cell(f"```\n{text}\n```"))
    nbformat.write(notebook, course / relative)

    fresh = tmp_path / "fresh"
    done = _publish(fresh, "--no-site", course=course)
    assert done.returncode == 2 and "REFUSED" in done.stderr, done.stdout + done.stderr
    assert Path(relative).name.split(".")[0] in done.stderr
    assert not fresh.exists()

    existing = tmp_path / "existing"
    shutil.copytree(edition, existing)
    before = _tree(existing)
    done = _publish(existing, "--no-site", course=course)
    assert done.returncode == 2 and _tree(existing) == before


def test_a_leak_among_the_repositorys_own_files_is_refused(edition, tmp_path):
    existing = tmp_path / "existing"
    shutil.copytree(edition, existing)
    (existing / "extras").mkdir()
    (existing / "extras" / "notes.md").write_text("see normref for the answers\n")
    before = _tree(existing)
    done = _publish(existing, "--no-site")
    assert done.returncode == 2 and "extras/notes.md" in done.stderr
    assert _tree(existing) == before


@pytest.mark.parametrize("repo_url", ["https://gitlab.com/a/b", "github.com/a/b",
                                      "https://github.com/a"])
def test_a_repository_address_binder_and_colab_cannot_open_is_refused(repo_url, tmp_path):
    done = subprocess.run([sys.executable, "-m", "autograder", "publish",
                           str(tmp_path / "e"), "--repo-url", repo_url, "--no-site"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1 and "github.com/OWNER/NAME" in done.stderr
    assert not (tmp_path / "e").exists()


def test_publish_refuses_a_folder_that_is_not_an_edition_and_the_course_itself(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("mine\n")
    done = _publish(other, "--no-site")
    assert done.returncode == 1 and "neither empty nor a student edition" in done.stderr
    assert sorted(p.name for p in other.iterdir()) == ["thesis.tex"]
    for dest in (REPO, REPO / "release" / "edition"):
        done = _publish(dest, "--no-site")
        assert done.returncode == 1, dest
    # A new GitHub repository's own files do not stop it.
    fresh_clone = tmp_path / "clone"
    (fresh_clone / ".git").mkdir(parents=True)
    (fresh_clone / "LICENSE").write_text("a licence\n")
    (fresh_clone / "README.md").write_text("# placeholder\n")
    done = _publish(fresh_clone, "--no-site")
    assert done.returncode == 0, done.stderr
    # the course's licences are the edition's: the code's replaces GitHub's placeholder
    assert (fresh_clone / "LICENSE").read_bytes() == (REPO / "LICENSE").read_bytes()
    assert (fresh_clone / "LICENSE-TEXT.md").read_text().startswith("# Licence")
    assert (fresh_clone / "README.md").read_text().startswith("# Layer Normalization")


def test_publish_refuses_a_site_built_for_another_repository(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<html></html>\n")
    (site / "site.json").write_text(json.dumps(
        {"repo_url": "https://github.com/someone/else", "branch": "main",
         "site_url": "https://someone.github.io/else/", "lessons": {}}))
    done = _publish(tmp_path / "e", "--site", str(site))
    assert done.returncode == 1 and "make site" in done.stderr
    assert not (tmp_path / "e").exists()


# -- updating in place --------------------------------------------------------------------

def test_a_second_run_updates_the_edition_in_place(tmp_path):
    course = _course_copy(tmp_path / "course")
    dest = tmp_path / "edition"
    assert _publish(dest, "--no-site", course=course).returncode == 0
    (dest / ".git").mkdir()
    (dest / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (dest / "LICENSE").write_text("a licence\n")
    (dest / ".ipynb_checkpoints").mkdir()

    lesson = course / "notebooks" / "02_rows_versus_columns_lesson.ipynb"
    notebook = nbformat.read(lesson, as_version=4)
    notebook.cells.append(nbformat.v4.new_markdown_cell("One more note for the students."))
    nbformat.write(notebook, lesson)
    (course / "notebooks" / "07_fused_kernel_lesson.ipynb").unlink()

    done = _publish(dest, "--no-site", course=course)
    assert done.returncode == 0, done.stderr
    assert (dest / "notebooks" / lesson.name).read_bytes() == lesson.read_bytes()
    assert not (dest / "notebooks" / "07_fused_kernel_lesson.ipynb").exists()
    assert not (dest / ASSIGNMENTS_DIR / "07_fused_kernel").exists()
    assert "07" not in re.findall(r"^\| (\d\d) ", (dest / "README.md").read_text(), re.M)
    assert (dest / "LICENSE").read_text() == "a licence\n"
    assert (dest / ".git" / "HEAD").is_file() and (dest / ".ipynb_checkpoints").is_dir()
    manifest = json.loads((dest / MANIFEST).read_text())["files"]
    assert not [f for f in manifest if "07_fused_kernel" in f]
    assert set(manifest) == set(_tree(dest)) - {"LICENSE", ".git/HEAD"}

    before = _tree(dest)
    done = _publish(dest, "--no-site", course=course)
    assert done.returncode == 0 and "0 written, 0 removed" in done.stderr
    assert _tree(dest) == before


# -- the edition on its own: a fresh environment from its pins ----------------------------

SKIP_VENV = pytest.mark.skipif(os.environ.get("COURSE_SKIP_EDITION_VENV") == "1",
                               reason="COURSE_SKIP_EDITION_VENV=1")

# First cell of every run: this is the edition's environment, and nothing of the
# course's own code can be imported.
ISOLATION_CELL = """\
import importlib.util, sys
here = [n for n in ("normref", "autograder") if importlib.util.find_spec(n)]
assert not here, f"{here} importable in the edition's environment"
assert sys.prefix == PREFIX, sys.prefix
"""

# Last cell of every lesson: move every slider, menu and toggle button the lesson
# made, to another value and back, and report what each move drew and any error.
WIDGET_CELL = """\
import json as _json, sys as _sys, traceback as _traceback
import ipywidgets as _w
from IPython import get_ipython as _get_ipython

_shell = _get_ipython()
_events = {"images": 0, "other": 0, "errors": []}
_publish = _shell.display_pub.publish
def _recording_publish(data, *args, **kwargs):
    _events["images" if "image/png" in data else "other"] += 1
    return _publish(data, *args, **kwargs)
_shell.display_pub.publish = _recording_publish
_showtraceback = _shell.showtraceback
def _recording_showtraceback(*args, **kwargs):
    info = args[0] if args and args[0] else _sys.exc_info()
    _events["errors"].append("".join(_traceback.format_exception(*info))[-1500:])
    return _showtraceback(*args, **kwargs)
_shell.showtraceback = _recording_showtraceback
_write = _sys.stdout.write
def _recording_write(text):
    _events["other"] += bool(text.strip())
    return _write(text)
_sys.stdout.write = _recording_write

_registry = getattr(_w.widgets.widget, "_instances", None)
if _registry is None:
    _registry = _w.Widget.widgets
_controls = [w for w in list(_registry.values()) if isinstance(w, (
    _w.FloatSlider, _w.IntSlider, _w.FloatLogSlider, _w.SelectionSlider, _w.Dropdown,
    _w.ToggleButtons))]
_report = []
for _control in _controls:
    _before = dict(images=_events["images"], other=_events["other"],
                   errors=len(_events["errors"]))
    if isinstance(_control, (_w.SelectionSlider, _w.Dropdown, _w.ToggleButtons)):
        _start = _control.index
        _control.index = (_start + 1) % len(_control.options)
        _control.index = _start
    else:
        _start = _control.value
        _control.value = _control.max if _start != _control.max else _control.min
        _control.value = _start
    _report.append({
        "widget": type(_control).__name__, "description": _control.description,
        "images": _events["images"] - _before["images"],
        "other": _events["other"] - _before["other"],
        "errors": _events["errors"][_before["errors"]:]})
_sys.stdout.write = _write
_shell.display_pub.publish = _publish
_shell.showtraceback = _showtraceback
print("WIDGET_REPORT " + _json.dumps({"ipywidgets": _w.__version__, "controls": _report}))
"""

# Runs a notebook in the environment it is started with; exit status 3 when the kernel
# stopped answering (rare, and then for minutes), so that the run can be tried again.
# The kernel listens on Unix sockets, as the grader's do: TCP ports picked free by one
# process can be taken by another's kernel before they are bound, and test files run
# side by side start many kernels.
RUNNER = """\
import json, sys, tempfile
import nbformat
from jupyter_client import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

notebook = nbformat.read(sys.argv[1], as_version=4)
sockets = tempfile.mkdtemp(prefix="kernel-")
km = KernelManager(kernel_name="python3", transport="ipc", ip=sockets + "/kernel")
try:
    NotebookClient(notebook, km=km, timeout=120, allow_errors=True,
                   resources={"metadata": {"path": sys.argv[2]}}).execute()
except CellTimeoutError as error:
    print(error, file=sys.stderr)
    sys.exit(3)
errors = [f"cell {i}: {o.ename}: {o.evalue}" for i, cell in enumerate(notebook.cells)
          for o in cell.get("outputs", []) if o.output_type == "error"]
report = None
for cell in notebook.cells:
    for output in cell.get("outputs", []):
        for line in output.get("text", "").splitlines():
            if line.startswith("WIDGET_REPORT "):
                report = json.loads(line.removeprefix("WIDGET_REPORT "))
print(json.dumps({"errors": errors, "widgets": report}))
"""


def _environment_pins(edition):
    environment = yaml.safe_load((edition / "environment.yml").read_text())
    (pip,) = [d["pip"] for d in environment["dependencies"] if isinstance(d, dict)]
    return [line for line in pip if not line.startswith("-")]


def _bare_env(prefix, scratch):
    """The variables a student's machine would have: the environment's bin/ first,
    no PYTHONPATH, Jupyter's folders in a scratch place."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("JUPYTER", "JPY_", "PYTHON", "VIRTUAL_ENV", "TRITON"))}
    env["PATH"] = f"{prefix / 'bin'}{os.pathsep}{os.environ['PATH']}"
    for name in ("config", "data", "runtime", "ipython"):
        (scratch / name).mkdir(parents=True, exist_ok=True)
    env.update(JUPYTER_CONFIG_DIR=str(scratch / "config"), JUPYTER_DATA_DIR=str(scratch / "data"),
               JUPYTER_RUNTIME_DIR=str(scratch / "runtime"), IPYTHONDIR=str(scratch / "ipython"),
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    return env


def _make_venv(prefix, scratch):
    base = getattr(sys, "_base_executable", None) or shutil.which("python3.11")
    subprocess.run([base, "-m", "venv", str(prefix)], check=True, timeout=300,
                   env=_bare_env(prefix, scratch))
    return prefix / "bin" / "python"


@pytest.fixture(scope="session")
def edition_env(edition, tmp_path_factory):
    """A virtual environment built from nothing but the edition's environment.yml pins."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the edition pins Python 3.11")
    scratch = built_once("edition-env", tmp_path_factory,
                         lambda folder: _build_edition_env(edition, folder))
    if (scratch / "skipped").exists():
        pytest.skip((scratch / "skipped").read_text())
    return {"prefix": scratch / "env", "python": scratch / "env" / "bin" / "python",
            "scratch": scratch}


def _build_edition_env(edition, scratch):
    prefix = scratch / "env"
    python = _make_venv(prefix, scratch)
    pins = scratch / "pins.txt"
    pins.write_text("\n".join(_environment_pins(edition)) + "\n")
    env = _bare_env(prefix, scratch)
    # PyTorch's CPU build lies on this machine's disk; pip takes it for torch==2.13.0.
    # Anything else would be a multi-GB GPU build: refuse rather than download it.
    report = scratch / "plan.json"
    plan = subprocess.run([str(python), "-m", "pip", "install", "--dry-run", "--quiet",
                           "--report", str(report), "-r", str(pins)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert plan.returncode == 0, plan.stderr[-3000:]
    torch = [item["metadata"]["version"] for item in json.loads(report.read_text())["install"]
             if item["metadata"]["name"].lower() == "torch"]
    if not torch or not torch[0].endswith("+cpu"):
        (scratch / "skipped").write_text(
            f"pip would install torch {torch}, not PyTorch's CPU build: not downloading a "
            "GPU build of several GB")
        return
    # --no-compile: the lessons compile what they import; the rest (most of torch) never
    # needs bytecode here
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-compile",
                           "-r", str(pins)],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="session")
def colab_widgets_env(edition_env, tmp_path_factory):
    """The edition's environment with Colab's ipywidgets in front of it: a venv of its
    own holding ipywidgets 7.7 (and what it needs), the edition's packages after it."""
    scratch = built_once("colab-widgets", tmp_path_factory,
                         lambda folder: _build_colab_env(edition_env, folder))
    return {"prefix": scratch / "env", "python": scratch / "env" / "bin" / "python",
            "scratch": scratch}


def _build_colab_env(edition_env, scratch):
    prefix = scratch / "env"
    python = _make_venv(prefix, scratch)
    env = _bare_env(prefix, scratch)
    paths = subprocess.run([str(python), "-c", "import sysconfig, json; print(json.dumps("
                            "sysconfig.get_paths()['purelib']))"], capture_output=True,
                           text=True, env=env, check=True).stdout
    edition_paths = subprocess.run(
        [str(edition_env["python"]), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
        env=_bare_env(edition_env["prefix"], edition_env["scratch"])).stdout.strip()
    Path(json.loads(paths), "edition_packages.pth").write_text(edition_paths + "\n")
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                           f"ipywidgets=={COLAB_IPYWIDGETS}"], capture_output=True, text=True,
                          env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def _run(environment, notebook, workdir):
    """Run `notebook` (a NotebookNode) in `environment`; returns (errors, widget report)."""
    workdir.mkdir(parents=True, exist_ok=True)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(
        ISOLATION_CELL.replace("PREFIX", repr(str(environment["prefix"])))))
    path = workdir / "run.ipynb"
    nbformat.write(notebook, path)
    runner = workdir / "runner.py"
    runner.write_text(RUNNER)
    for _ in range(2):  # a second run only if the kernel stopped answering
        done = subprocess.run([str(environment["python"]), str(runner), str(path),
                               str(workdir)], capture_output=True, text=True, timeout=1800,
                              cwd=workdir,
                              env=_bare_env(environment["prefix"], environment["scratch"]))
        if done.returncode != 3:
            break
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.splitlines()[-1])
    return outcome["errors"], outcome["widgets"]


def _check_widgets(report, lesson, version):
    assert report is not None, f"{lesson}: the widget cell did not report"
    assert report["ipywidgets"] == version
    for control in report["controls"]:
        name = f"{lesson}: {control['widget']} {control['description']!r}"
        assert not control["errors"], f"{name}: " + "\n".join(control["errors"])
        assert control["images"] + control["other"] > 0, f"{name} redrew nothing"


def _lesson_run(environment, edition, lesson, tmp_path):
    notebook = nbformat.read(edition / LESSONS_DIR / lesson.name, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(WIDGET_CELL))
    workdir = tmp_path / lesson.stem  # beside the lesson, as in the edition: its data
    shutil.copytree(edition / LESSONS_DIR / LESSON_DATA, workdir / LESSON_DATA)
    return _run(environment, notebook, workdir)


def _pinned_ipywidgets(edition):
    return _pins(_environment_pins(edition))["ipywidgets"]
