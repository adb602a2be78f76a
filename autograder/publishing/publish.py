"""The student edition: what students get, as a repository of its own.

    python -m autograder publish DIR --repo-url https://github.com/OWNER/NAME

writes into DIR the lessons, the released assignments, the student environment (for
Binder, Colab and laptops), a student README with Binder and Colab links, and the site
(make site), and nothing of the grading side: no source/, normref/, autograder/,
tests or sample classes. Before anything is written, the release leak check runs on
the whole edition (each assignment exactly as on release/; in every file the solution
and hidden-test markers, `normref`, and every line of every hidden test of source/),
and every file must be one the edition is made of. On a leak nothing is written.

DIR is meant to be a clone of the public repository: a second run updates it in place
(changed files rewritten, files the edition no longer has removed, its .git and any
file it never wrote left alone), so `git -C DIR add -A && git -C DIR commit` publishes
the change.
"""

import hashlib
import html
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import yaml

from autograder.authoring.release import LEAK_MARKERS, LeakError, find_leaks
from autograder.publishing.edition import (
    ASSIGNMENTS_DIR,
    LESSON_DATA,
    LESSONS_DIR,
    SITE_DIR,
    Repository,
    units,
)

MANIFEST = ".edition-files.json"  # the files the last run wrote, to update in place
# Top-level entries the edition is made of; publishing refuses anything else.
LICENCES = ("LICENSE", "LICENSE-TEXT.md")  # the code's (MIT) and the text's (CC BY 4.0)
EDITION_ENTRIES = {"README.md", "environment.yml", "requirements.txt", "postBuild",
                   "nbgrader_config.py", ".gitignore", MANIFEST, LESSONS_DIR,
                   ASSIGNMENTS_DIR, SITE_DIR, *LICENCES}
# What a new GitHub repository may already hold: replaced or left alone, not refused.
FRESH_REPOSITORY = {".git", ".github", "README.md", ".gitignore", "LICENSE", "LICENSE.md",
                    "LICENSE.txt"}
TEXT_SUFFIXES = {".ipynb", ".md", ".txt", ".yml", ".yaml", ".py", ".html", ".js", ".json",
                 ".css", ".svg", ""}


class PublishError(RuntimeError):
    """The edition cannot be written where it was asked for."""


# -- the files of the edition ------------------------------------------------------------

def _pins(course):
    """[pin] of the course's requirements.txt, `name==version` with its platform marker
    where it has one: the student packages."""
    pins = []
    for line in (course.root / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version, marker = re.fullmatch(
                r"([A-Za-z0-9_.-]+)\s*==\s*([^\s;]+)\s*(?:;\s*(.+))?", line).groups()
            pins.append(f"{name}=={version}" + (f"; {marker}" if marker else ""))
    return pins


def environment_yml(course):
    """The course's environment.yml, with a student's header."""
    environment = yaml.safe_load((course.root / "environment.yml").read_text())
    body = yaml.safe_dump(environment, sort_keys=False, default_flow_style=False)
    return ("# The course's Python environment. Binder builds it when you open the\n"
            "# repository there; on your own machine: conda env create -f environment.yml\n"
            "# (or pip install -r requirements.txt, which pins the same packages).\n"
            "# The extra index gives PyTorch's CPU build, much smaller than the GPU one.\n"
            + body)


def requirements_txt(course):
    lines = "".join(f"{pin}\n" for pin in _pins(course))
    return ("# The course's Python packages, pinned (environment.yml names the same).\n"
            "# pip install -r requirements.txt, in a Python 3.11 virtual environment.\n"
            "# Triton only on Linux: it has no wheels for macOS or Windows.\n"
            + lines)


# nbgrader's parts for running a course; a student keeps Validate and nothing else.
INSTRUCTOR_LAB_EXTENSIONS = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                             "@jupyter/nbgrader:course-list", "@jupyter/nbgrader:assignment-list",
                             "@jupyter/nbgrader:menu")
INSTRUCTOR_SERVER_EXTENSIONS = ("nbgrader.server_extensions.formgrader",
                                "nbgrader.server_extensions.assignment_list",
                                "nbgrader.server_extensions.course_list")
STUDENT_TOOLS_ONLY = (
    "jupyter labextension disable --level=sys_prefix " + " ".join(INSTRUCTOR_LAB_EXTENSIONS),
    "jupyter server extension disable --sys-prefix " + " ".join(INSTRUCTOR_SERVER_EXTENSIONS))

POST_BUILD = ("#!/bin/bash\n"
              "# Binder runs this once, after it has installed environment.yml. nbgrader's\n"
              "# Validate button stays; its menus for running a course are switched off.\n"
              "set -euo pipefail\n" + "\n".join(STUDENT_TOOLS_ONLY) + "\n")

NBGRADER_CONFIG = '''"""nbgrader's settings for the Validate button in JupyterLab."""

c = get_config()  # noqa: F821 (nbgrader provides get_config)

# Validate runs the whole notebook; importing PyTorch can take a while.
c.ExecutePreprocessor.timeout = 120
c.Execute.timeout = 120
'''

GITIGNORE = """.ipynb_checkpoints/
__pycache__/
.venv/
"""


def readme(course, repo, *, with_site=True):
    """The edition's README: what the course is, how to start, how to hand in."""
    rows = []
    for unit in units(course):
        lesson = (f"[read]({repo.site(unit.page)}) · " if with_site else "")
        lesson += (f"[Colab]({repo.colab(unit.lesson_path)}) · "
                   f"[Binder]({repo.binder(unit.lesson_path)})")
        if unit.assignment_path:
            task = (f"[Colab]({repo.colab(unit.assignment_path)}) · "
                    f"[Binder]({repo.binder(unit.assignment_path)}) · "
                    f"[file]({unit.assignment_path})")
        else:
            task = "none"
        rows.append(f"| {unit.number} {unit.title} | {lesson} | {task} |")
    table = "\n".join(rows)
    binder_badge = (f"[![Launch on Binder](https://mybinder.org/badge_logo.svg)]"
                    f"({repo.binder(LESSONS_DIR)})")
    first = units(course)[0]
    colab_badge = (f"[![Open in Colab](https://colab.research.google.com/assets/"
                   f"colab-badge.svg)]({repo.colab(first.lesson_path)})")
    site_line = (f"**Read the lessons online:** <{repo.site()}> (every lesson with its "
                 f"figures, nothing to install).\n\n" if with_site else "")
    layout = [(f"{LESSONS_DIR}/", "the lessons, one notebook per unit"),
              (f"{ASSIGNMENTS_DIR}/", "the assignments, one folder per unit")]
    if with_site:
        layout.append((f"{SITE_DIR}/", "the site: the lessons as web pages, run and rendered"))
    layout += [("environment.yml", "the course's Python packages, pinned (also in "
                "requirements.txt)"), ("postBuild", "Binder's finishing step"),
               ("LICENSE", "the code's licence (MIT)"),
               ("LICENSE-TEXT.md", "the text's licence (CC BY 4.0)")]
    layout_text = "\n".join(f"{name:<17}{what}" for name, what in layout)
    example = (first.assignment or first.lesson).name
    student_tools = "\n  ".join(STUDENT_TOOLS_ONLY)
    return f"""# Layer Normalization, from the recipe to the fused kernel

{binder_badge} {colab_badge}

A course in {len(rows)} units for students who know a little numpy and PyTorch and
want to understand layer norm all the way down: from the mean-and-variance recipe,
through its relatives and its gradient, to where it sits in a transformer, how it
behaves in fp8, and a fused Triton kernel timed on a GPU. Each unit is a **lesson**
(explanation, worked examples, sliders, predict-first prompts, check-yourself
questions) and an **assignment** that is graded when you hand it in.

{site_line}| unit | lesson | assignment |
| --- | --- | --- |
{table}

## Start

- **Binder** (nothing to install, runs in your browser): press the Binder badge
  above, or a Binder link in the table. The first start takes a few minutes while
  Binder builds the environment. Sessions are temporary: download your work before
  you close the tab.
- **Colab** (a Google account): press a Colab link in the table. Run the notebook's
  first code cell (under the title) before the others: it prepares Colab (its widget
  manager, and for unit 07 Triton if the runtime lacks it) and does nothing anywhere
  else. **Only unit 07 needs a GPU runtime**: for its lesson and its assignment,
  choose *Runtime > Change runtime type > GPU* before you run anything. Units 01 to
  06 run on Colab's default CPU runtime. (On a CPU runtime unit 07 still runs, its
  kernels in Triton's interpreter, but nothing is timed on a GPU.)
- **Your own machine** (Python 3.11; Linux on x86-64 or ARM, macOS 14 or later on
  Apple silicon, or Windows on x86-64: PyTorch has no build for Intel Macs, use Colab
  or Binder there).

  First check that you have Python 3.11: in a terminal, `python3.11 --version` on
  Linux or macOS, `py -3.11 --version` on Windows, must print `Python 3.11.` and a
  number. If it prints an error instead, install Python 3.11 (from
  <https://www.python.org/downloads/> on macOS and Windows, from your distribution's
  packages on Linux), or use conda (below), which installs Python 3.11 itself.

  On Linux, `pip install -r requirements.txt` takes PyTorch's GPU build (several GB).
  If you have no NVIDIA GPU, type this line instead of the `pip install` line of the
  steps below, for the much smaller CPU build (environment.yml does the same):
  `pip install --extra-index-url https://download.pytorch.org/whl/cpu -r requirements.txt`

  Then, on Linux or macOS, type these lines in this order. The two `jupyter ...
  disable` lines switch off nbgrader's menus for running a course (Binder does the
  same; the Validate button stays); they come before `jupyter lab`, which keeps the
  terminal busy until you stop it (Ctrl+C):

  ```bash
  git clone {repo.url}.git
  cd {repo.name}
  python3.11 -m venv .venv
  . .venv/bin/activate
  pip install -r requirements.txt
  {student_tools}
  jupyter lab
  ```

  On Windows, in PowerShell, in this order. PowerShell refuses to run
  `Activate.ps1` under its default execution policy; the `Set-ExecutionPolicy` line
  allows it for your account, once (answer `Y` if it asks). In cmd.exe instead of
  PowerShell, skip that line and activate with `.venv\\Scripts\\activate.bat`.

  ```powershell
  git clone {repo.url}.git
  cd {repo.name}
  py -3.11 -m venv .venv
  Set-ExecutionPolicy -Scope CurrentUser RemoteSigned
  .venv\\Scripts\\Activate.ps1
  pip install -r requirements.txt
  {student_tools}
  jupyter lab
  ```

  Or, anywhere, with conda:

  ```bash
  conda env create -f environment.yml
  conda activate layernorm-course
  {student_tools}
  jupyter lab
  ```

  Next time, only activate the environment (`. .venv/bin/activate`,
  `.venv\\Scripts\\Activate.ps1` or `conda activate layernorm-course`) and run
  `jupyter lab`.

  Units 01 to 06 need no GPU. Unit 07 writes GPU kernels in Triton, which installs
  on Linux only: there it runs them on an NVIDIA GPU, or in Triton's interpreter on
  the CPU; on macOS and Windows, open unit 07 on Colab or Binder.

## Work and hand in

Work through a lesson, then its assignment. In the assignment, replace each
`raise NotImplementedError()` with your code and run the tests under each
exercise. In JupyterLab (Binder or your machine), the **Validate** button in the
notebook's toolbar runs the whole notebook in a fresh kernel, as the grader will;
on Colab, use *Runtime > Restart session and run all*.

Hand in the assignment's one `.ipynb` file, with its name unchanged (for example
`{example}`), where your course collects work. On Colab: *File > Download >
Download .ipynb*; on Binder: right-click the file in the file browser, then
*Download*. More tests run when it is graded, and your feedback shows each
check's message.

## What is here

```
{layout_text}
```

## Licence

The text (lessons, assignments, site) is CC BY 4.0 and the code MIT: see
`LICENSE-TEXT.md` and `LICENSE`.
"""


def _stage(*, course, repo, folder, site):
    """Write every file of the edition into `folder`."""
    text = {
        "README.md": readme(course, repo, with_site=site is not None),
        "environment.yml": environment_yml(course),
        "requirements.txt": requirements_txt(course),
        "postBuild": POST_BUILD,
        "nbgrader_config.py": NBGRADER_CONFIG,
        ".gitignore": GITIGNORE,
    }
    for name, content in text.items():
        (folder / name).write_text(content)
    for name in LICENCES:
        if (course.root / name).is_file():
            shutil.copyfile(course.root / name, folder / name)
    (folder / "postBuild").chmod(0o755)
    (folder / LESSONS_DIR).mkdir()
    if (course.root / LESSONS_DIR / LESSON_DATA).is_dir():
        shutil.copytree(course.root / LESSONS_DIR / LESSON_DATA,
                        folder / LESSONS_DIR / LESSON_DATA)
    for unit in units(course):
        shutil.copy2(unit.lesson, folder / unit.lesson_path)
        if unit.assignment is not None:
            shutil.copytree(unit.assignment.parent, folder / ASSIGNMENTS_DIR / unit.slug,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints",
                                                          "__pycache__"))
    if site is not None:
        shutil.copytree(site, folder / SITE_DIR)


# -- the leak check ----------------------------------------------------------------------

def _visible_lines(path, text):
    """The lines a reader of this file sees (a notebook's cells and outputs, an HTML
    page's text), stripped."""
    if path.suffix == ".ipynb":
        notebook = json.loads(text)
        parts = []
        for cell in notebook["cells"]:
            parts.append("".join(cell.get("source", "")))
            for output in cell.get("outputs", []):
                parts.append("".join(output.get("text", "")))
                parts.append("".join(output.get("data", {}).get("text/plain", "")))
        text = "\n".join(parts)
    elif path.suffix in {".html", ".js"}:
        text = html.unescape(re.sub(r"<[^>]+>", "", text))
    return {line.strip() for line in text.splitlines()}


def _hidden_test_lines(course):
    """Every distinctive line of every hidden test in source/ (the same rule as the
    release check's: a stripped line of 25 characters or more)."""
    lines = set()
    for source in sorted(course.source.glob("*/*.ipynb")):
        for cell in json.loads(source.read_text())["cells"]:
            inside = False
            for line in "".join(cell.get("source", "")).splitlines():
                if "### BEGIN HIDDEN TESTS" in line:
                    inside = True
                elif "### END HIDDEN TESTS" in line:
                    inside = False
                elif inside and len(line.strip()) >= 25:
                    lines.add(line.strip())
    return lines


def _scan(paths, root, secret_lines):
    """The release check's markers, and any of `secret_lines`, in each file of `paths`."""
    leaks = []
    for path in paths:
        relative = path.relative_to(root)
        text = path.read_text(errors="replace")
        for marker in LEAK_MARKERS:
            if marker in text:
                leaks.append(f"{relative}: contains '{marker}'")
        if path.suffix in TEXT_SUFFIXES:
            for line in sorted(secret_lines & _visible_lines(path, text)):
                leaks.append(f"{relative}: shows hidden-test text {line!r}")
    return leaks


def _files_under(entries):
    """The regular files among `entries` and under its folders (links left out)."""
    return sorted(p for entry in entries
                  for p in ([entry] if entry.is_file() else entry.rglob("*"))
                  if p.is_file() and not p.is_symlink())


def find_edition_leaks(*, course, folder):
    """Every place in the edition at `folder` that shows grading material: the release
    check on each assignment, as on release/ (its markers, and every line of the
    assignment's own solutions and hidden tests), then in every file of the edition
    the same markers and every line of every hidden test of source/. (The lessons
    teach code that solutions also use, so solution lines are looked for in the
    assignments only.)"""
    folder = Path(folder)
    leaks = []
    shim = SimpleNamespace(root=folder, release=folder / ASSIGNMENTS_DIR, source=course.source)
    if shim.release.is_dir():
        for assignment in sorted(p.name for p in shim.release.iterdir() if p.is_dir()):
            leaks += find_leaks(course=shim, assignment=assignment)
    entries = [p for p in folder.iterdir() if p.name != ".git"]
    leaks += _scan(_files_under(entries), folder, _hidden_test_lines(course))
    return list(dict.fromkeys(leaks))


def _strangers(folder):
    """Top-level entries that the edition is not made of."""
    return sorted(p.name for p in folder.iterdir() if p.name not in EDITION_ENTRIES)


# -- writing in place --------------------------------------------------------------------

def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_destination(course, dest):
    course_root = course.root.resolve()
    if dest == course_root or course_root.is_relative_to(dest):
        raise PublishError(f"{dest} holds the course itself: publish into another folder")
    for part in ("source", "release", "normref", "autograder", LESSONS_DIR, "tests"):
        if dest.is_relative_to(course_root / part):
            raise PublishError(f"{dest} lies inside the course's {part}/")
    if dest.exists() and not dest.is_dir():
        raise PublishError(f"{dest} is not a folder")
    if dest.is_dir() and not (dest / MANIFEST).is_file():
        others = sorted(p.name for p in dest.iterdir() if p.name not in FRESH_REPOSITORY)
        if others:
            raise PublishError(f"{dest} is neither empty nor a student edition (it holds "
                               f"{', '.join(others[:8])}); publish into an empty folder or "
                               "a clone of the edition's repository")


def _last_edition(dest):
    """The files the last run wrote into `dest` (from its manifest), less the manifest."""
    if not (dest / MANIFEST).is_file():
        return set()
    return set(json.loads((dest / MANIFEST).read_text())["files"]) - {MANIFEST}


def _write_in_place(staged, dest, log):
    """Make `dest` hold the staged edition: changed files rewritten, files of the last
    edition that this one lacks removed, anything else in `dest` left alone."""
    dest.mkdir(parents=True, exist_ok=True)
    new = set(_files(staged))
    old = _last_edition(dest)
    removed = sorted(old - new)
    for relative in removed:
        target = dest / relative
        if target.is_file() or target.is_symlink():
            target.unlink()
        parent = target.parent
        while parent != dest and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    changed = 0
    for relative in sorted(new):
        source, target = staged / relative, dest / relative
        if target.is_file() and not target.is_symlink() and _digest(target) == _digest(source):
            continue
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        changed += 1
    (dest / MANIFEST).write_text(json.dumps({"files": sorted(new | {MANIFEST})}, indent=1)
                                 + "\n")
    print(f"edition in {dest}: {len(new)} files, {changed} written, {len(removed)} removed",
          file=log)
    return {"files": sorted(new), "written": changed, "removed": removed}


def publish(*, course, dest, repo, site=None, log=sys.stderr):
    """Write the student edition into `dest`. `site` is a built site folder (make
    site) or None for an edition without one. Raises LeakError, writing nothing, if
    the edition would show grading material."""
    from autograder.publishing.site import check_site

    dest = Path(dest).resolve()
    _check_destination(course, dest)
    if site is not None:
        problems = check_site(course=course, repo=repo, site=site)
        if problems:
            raise PublishError("the site does not fit this edition:\n  "
                               + "\n  ".join(problems))
    with tempfile.TemporaryDirectory(prefix="edition-") as scratch:
        staged = Path(scratch) / "edition"
        staged.mkdir()
        _stage(course=course, repo=repo, folder=staged, site=site)
        problems = [f"{name}: not part of a student edition" for name in _strangers(staged)]
        leaks = find_edition_leaks(course=course, folder=staged)
        if dest.is_dir():  # what the edition's repository keeps besides our files,
            # wherever they lie (a file put into its assignments/ is published too)
            ours = set(_files(staged)) | _last_edition(dest) | {MANIFEST}
            kept = [p for p in _files_under([p for p in dest.iterdir() if p.name != ".git"])
                    if str(p.relative_to(dest)) not in ours]
            leaks += _scan(kept, dest, _hidden_test_lines(course))
        if leaks or problems:
            raise LeakError("the edition would show grading material; nothing was "
                            "written:\n  " + "\n  ".join(problems + leaks))
        return _write_in_place(staged, dest, log)


def publish_command(args):
    """The `publish` subcommand (see cli.py)."""
    from autograder.course import Course
    from autograder.publishing.site import DEFAULT_OUT, SiteError, build_site

    course = Course.at(args.course)
    try:
        repo = Repository.parse(args.repo_url, branch=args.branch, site_url=args.site_url)
        if args.no_site:
            return _report(publish(course=course, dest=args.dir, repo=repo, site=None))
        if args.site:
            return _report(publish(course=course, dest=args.dir, repo=repo,
                                   site=Path(args.site)))
        with tempfile.TemporaryDirectory(prefix="site-") as scratch:
            site = Path(scratch) / "site"
            build_site(course=course, repo=repo, out=site,
                       asset_cache=course.root / DEFAULT_OUT.parent / "npm")
            return _report(publish(course=course, dest=args.dir, repo=repo, site=site))
    except (PublishError, SiteError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except LeakError as error:
        print(f"REFUSED: {error}", file=sys.stderr)
        return 2


def _report(outcome):
    print(f"{len(outcome['files'])} files; push the folder to the public repository")
    return 0
