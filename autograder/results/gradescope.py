"""A Gradescope autograder for one assignment, and what it runs per submission.

`write_autograder` builds the zip that Gradescope's "Upload Autograder" takes
(https://gradescope-autograders.readthedocs.io/en/latest/specs/): `setup.sh` and
`run_autograder` at its root, and `course/`, a course directory holding only this
assignment's source and release notebooks, the grader and the checks. Gradescope
unpacks it into /autograder/source, runs setup.sh once as root to build the
image, then, for each submission in a fresh container, runs run_autograder, which
calls `grade_submission`: the uploaded notebook is graded by this grader exactly
as `grade` grades it, and /autograder/results/results.json written from the
result (`report.gradescope_results`).

Containment in the container. The container is Gradescope's; inside it:
- the course folder (hidden tests, references, the gradebook), the submission
  and the results folder are made root-only before any student code runs, and
  the kernel never runs as root (the sandbox drops it to an unprivileged uid
  whenever the grader is root), so the hand-in can neither read the hidden tests
  nor write results.json: the grader writes that file after the kernel is gone;
- bubblewrap is used where the container allows it; Gradescope's containers
  usually do not (no user namespaces), and then the hand-in runs under the
  resource limits and the dropped uid only, with the network Gradescope gives
  (the run's log, which only the instructor sees, says which).
"""

import dataclasses
import json
import os
import re
import shutil
import stat
import sys
import zipfile
from pathlib import Path

from autograder.course import PACKAGE_DIR, REPO_ROOT, Course

GRADESCOPE_ROOT = Path("/autograder")  # where Gradescope puts everything
STUDENT_FALLBACK_ID = "student"
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

# The grader's packages in the image: the course's pins (requirements.txt) and what
# the grader adds to them (requirements-dev.txt). Torch from PyTorch's CPU index: the
# containers have no GPU, and the CPU wheel is a tenth of the size.
_GRADER_EXTRAS = ("nbclient", "nbformat", "nh3", "latex2mathml", "jsonschema", "tqdm")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv util-linux bubblewrap
PYTHON=python3
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    # Gradescope's Ubuntu 22.04 image has Python 3.10; the grader needs 3.11 or later
    apt-get install -y --no-install-recommends python3.11 python3.11-venv
    PYTHON=python3.11
fi
"$PYTHON" -m venv /autograder/venv
/autograder/venv/bin/pip install --no-cache-dir --upgrade pip
/autograder/venv/bin/pip install --no-cache-dir --extra-index-url {torch_index} \\
    -r /autograder/source/requirements.txt
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission, as root, in a fresh container, from
# /autograder. AUTOGRADER_ROOT and AUTOGRADER_PYTHON exist for trying it elsewhere.
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PYTHON="${{AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}}"
cd "$ROOT/source/course" || exit 1
exec "$PYTHON" -m autograder gradescope {assignment} --course "$ROOT/source/course" \\
    --submission "$ROOT/submission" --results "$ROOT/results/results.json" \\
    --metadata "$ROOT/submission_metadata.json"
"""


def _pinned(name, lines):
    for line in lines:
        if re.match(rf"^{re.escape(name)}==", line.strip(), re.IGNORECASE):
            return line.strip()
    raise ValueError(f"requirements-dev.txt pins no {name}")


def grader_requirements(repo=REPO_ROOT):
    """The image's requirements.txt: the course's pins and the grader's extras."""
    course_pins = [line.strip() for line in (repo / "requirements.txt").read_text().splitlines()
                   if line.strip() and not line.lstrip().startswith("#")]
    dev = (repo / "requirements-dev.txt").read_text().splitlines()
    return "\n".join(["# The grader's environment in Gradescope's image (written by "
                      "`python -m autograder gradescope`).", *course_pins,
                      *(_pinned(name, dev) for name in _GRADER_EXTRAS)]) + "\n"


def _package_files(package_dir, *, skip=()):
    """(path, relative name) of a package's .py and .json files, examples left out."""
    for path in sorted(package_dir.rglob("*")):
        relative = path.relative_to(package_dir.parent)
        if (path.is_file() and path.suffix in (".py", ".json")
                and "__pycache__" not in relative.parts
                and not any(part in skip for part in relative.parts)):
            yield path, relative.as_posix()


def write_autograder(*, course, assignment, output=None):
    """Write the autograder zip of `assignment`; returns its path.

    output: the zip's path (default reports/ASSIGNMENT/gradescope_autograder.zip).
    Raises FileNotFoundError when the assignment has no source or no release.
    """
    for part in (course.source, course.release):
        if not any((part / assignment).glob("*.ipynb")):
            raise FileNotFoundError(f"{part.name}/{assignment} holds no notebook "
                                    "(run `python -m autograder release` first)")
    output = Path(output or course.reports / assignment / "gradescope_autograder.zip")
    output.parent.mkdir(parents=True, exist_ok=True)
    files = [*_package_files(PACKAGE_DIR, skip={"examples"}),
             *_package_files(REPO_ROOT / "normref")]
    for part in ("source", "release"):
        folder = getattr(course, part) / assignment
        files += [(path, f"{part}/{assignment}/{path.relative_to(folder).as_posix()}")
                  for path in sorted(folder.rglob("*")) if path.is_file()
                  and ".ipynb_checkpoints" not in path.parts]
    config = course.root / "nbgrader_config.py"
    if config.is_file():
        files.append((config, "nbgrader_config.py"))
    executable = stat.S_IFREG | 0o755
    with zipfile.ZipFile(output, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in (("setup.sh", SETUP_SH.format(torch_index=TORCH_CPU_INDEX)),
                           ("run_autograder", RUN_AUTOGRADER.format(assignment=assignment))):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = executable << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, text)
        archive.writestr("requirements.txt", grader_requirements())
        for path, name in files:
            archive.write(path, f"course/{name}")
    return output


def _student_id(metadata_path):
    """The submitter's Gradescope user id, from submission_metadata.json."""
    try:
        users = json.loads(Path(metadata_path).read_text()).get("users") or []
        candidate = str(users[0]["id"])
    except (OSError, ValueError, AttributeError, LookupError, TypeError):
        return STUDENT_FALLBACK_ID
    return candidate if _SAFE_ID.match(candidate) else STUDENT_FALLBACK_ID


def _uploaded_notebooks(submission):
    return sorted(p for p in Path(submission).rglob("*.ipynb")
                  if p.is_file() and not p.is_symlink()
                  and not any(part in (".ipynb_checkpoints", "__MACOSX")
                              for part in p.relative_to(submission).parts))


def match_notebooks(uploaded, expected):
    """{expected name: uploaded path}, or raise ValueError saying what is wrong.

    One expected notebook takes the only one uploaded, whatever its name (students
    rename files); otherwise each expected name must be uploaded under that name.
    """
    by_name = {}
    for path in uploaded:
        by_name.setdefault(path.name, path)
    if len(expected) == 1:
        (name,) = expected
        if name in by_name:
            return {name: by_name[name]}
        if len(uploaded) == 1:
            return {name: uploaded[0]}
        if not uploaded:
            raise ValueError(f"no notebook was uploaded: upload {name}")
        raise ValueError(f"{len(uploaded)} notebooks were uploaded and none is named {name}: "
                         f"upload {name} alone")
    missing = [name for name in expected if name not in by_name]
    if missing:
        raise ValueError(f"upload every notebook of the assignment under its own name; "
                         f"missing: {', '.join(missing)}")
    return {name: by_name[name] for name in expected}


def _not_graded(message):
    return {"score": 0.0, "output": f"Not graded: {message}", "visibility": "visible",
            "tests": []}


def _root_only(*paths):
    """No one but root reads or writes these (the kernel runs as another uid)."""
    for path in paths:
        if path.exists():
            os.chmod(path, 0o700)


def grade_submission(*, course, assignment, submission, results, metadata=None,
                     settings=None, log=sys.stdout):
    """Grade the notebook(s) in `submission` and write Gradescope's results.json.

    Returns the results dict written. A submission that cannot be graded (no
    notebook, several and none named as expected) gets score 0 and a message
    saying what to upload; it is never a crash.
    """
    from autograder.grading.grade import SandboxUnavailable, grade_assignment
    from autograder.grading.runner import RunSettings
    from autograder.results.report import gradescope_results

    results = Path(results)
    results.parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        _root_only(course.root, Path(submission), results.parent)
    student = _student_id(metadata) if metadata else STUDENT_FALLBACK_ID
    try:
        chosen = match_notebooks(_uploaded_notebooks(submission),
                                 course.notebook_names(assignment))
    except ValueError as problem:
        outcome = _not_graded(str(problem))
    else:
        handin = course.submitted / student / assignment
        shutil.rmtree(handin, ignore_errors=True)
        handin.mkdir(parents=True)
        for name, path in chosen.items():
            shutil.copyfile(path, handin / name)
        settings = settings or RunSettings()

        def graded(run_settings):
            (result,) = [r for r in grade_assignment(
                course=course, assignment=assignment, settings=run_settings,
                students=[student], workers=1, engine="pool", scale_timeouts=False,
                progress=log) if r["student_id"] == student]
            return result

        try:
            result = graded(settings)
        except SandboxUnavailable as problem:
            print(f"bubblewrap cannot run in this container ({problem}); grading under "
                  "the resource limits, as an unprivileged user, in Gradescope's "
                  "container", file=log)
            result = graded(dataclasses.replace(settings, use_bwrap=False))
        outcome = gradescope_results(result)
    results.write_text(json.dumps(outcome, indent=1))
    print(f"{assignment}: {outcome['score']:g} points; results in {results}", file=log)
    return outcome


def cmd_gradescope(args):
    course = Course.at(args.course)
    if args.submission:
        grade_submission(course=course, assignment=args.assignment,
                         submission=args.submission, results=args.results,
                         metadata=args.metadata)
        return 0
    try:
        path = write_autograder(course=course, assignment=args.assignment, output=args.output)
    except FileNotFoundError as problem:
        print(f"gradescope: {problem}", file=sys.stderr)
        return 2
    print(f"wrote {path}: upload it in Gradescope (the assignment's Configure Autograder, "
          "Zip file upload, Update Autograder)")
    return 0


def register(add):
    p = add("gradescope", cmd_gradescope,
            "write the zip of a Gradescope autograder for an assignment")
    p.add_argument("assignment")
    p.add_argument("--output", default=None,
                   help="the zip (default reports/ASSIGNMENT/gradescope_autograder.zip)")
    inside = p.add_argument_group("inside Gradescope's container (run_autograder uses these)")
    inside.add_argument("--submission", default=None,
                        help="grade the notebook uploaded into this folder")
    inside.add_argument("--results", default=str(GRADESCOPE_ROOT / "results" / "results.json"))
    inside.add_argument("--metadata", default=None, help="submission_metadata.json")
