"""Feedback back to students (`python -m autograder feedback A --for canvas|moodle|nbgrader`):
for an LMS, the zip's members are named so that the LMS's own bulk upload pairs each
page with its student; through nbgrader, its own commands release and fetch the pages.
The downloads are named by the LMSs' own rules, and the members are read back by them:
- Canvas names a download in lib/content_zipper.rb (conftest.canvas_download_name) and
  reads a re-uploaded file in app/models/assignment.rb, infer_comment_context_from_filename:
  split at "_", the first two all-digit fields are the user id and the attachment id.
- Moodle names a download in mod/assign/locallib.php, download_submissions
  (clean_filename(fullname with "_" as " " + "_" + participant id + "_") + plugin
  subtype + "_" + type + "_" + file name) and reads an upload in
  mod/assign/feedback/file/importziplib.php, is_valid_filename_for_import: explode("_",
  name, 5), the second field the participant id, the third and fourth the plugin.
"""

import io
import zipfile

from autograder import cli
from autograder.term.collect import collect
from conftest import (
    canvas_download_name,
    canvas_reads,
    moodle_download_name,
    moodle_reads,
    tiny_course,
    tiny_notebook,
    zip_of,
)

A = "01_hw"
NB = f"{A}.ipynb"
CANVAS_CLASS = [("Müller, Jürgen", 4713, 103713, False), ("Nguyễn, Thị Hoa", 4714, 103714, True),
                ("Lovelace, Ada", 12345, 67890, False)]
MOODLE_CLASS = [("Dee Blank", 4242), ("Anne_Marie Roux", 4243)]


def _pages(course, students):
    folder = course.reports / A / "feedback"
    folder.mkdir(parents=True, exist_ok=True)
    for student in students:
        (folder / f"{student}.html").write_text(f"<p>feedback of {student}</p>")


def _members(path):
    with zipfile.ZipFile(path) as z:
        return {name: z.read(name).decode() for name in z.namelist()}


def test_canvas_re_upload_zip_pairs_every_page_with_its_submission(tmp_path, capsys):
    course = tiny_course(tmp_path / "course", A)
    downloads = {canvas_download_name(name, uid, att, NB, late=late): (uid, att)
                 for name, uid, att, late in CANVAS_CLASS}
    report = collect(course=course, assignment=A, source_path=zip_of(
        tmp_path / "canvas.zip", {name: tiny_notebook(name) for name in downloads}))
    students = sorted(report.collected)
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "zoe.ipynb").write_bytes(tiny_notebook("zoe"))
    collect(course=course, assignment=A, source_path=folder)
    _pages(course, [*students, "zoe"])

    assert cli.main(["feedback", A, "--for", "canvas", "--course", str(course.root)]) == 0
    members = _members(course.reports / A / "canvas_feedback.zip")
    assert len(members) == len(CANVAS_CLASS)
    by_ids = {canvas_reads(member): text for member, text in members.items()}
    for download, ids in downloads.items():
        [student] = [s for s in students if s.endswith(f"_{ids[0]}")]
        assert by_ids[ids] == f"<p>feedback of {student}</p>", download
    assert all(member.endswith("_feedback.html") for member in members)
    out = capsys.readouterr().out
    assert "3 feedback page(s)" in out
    assert "left out: zoe (collected from a plain file name, not canvas's)" in out
    assert "Re-upload Submissions" in out


def test_moodle_feedback_zip_names_each_page_by_its_participant(tmp_path, capsys):
    course = tiny_course(tmp_path / "course", A)
    downloads = {moodle_download_name(name, pid, NB): pid for name, pid in MOODLE_CLASS}
    report = collect(course=course, assignment=A, source_path=zip_of(
        tmp_path / "moodle.zip", {name: tiny_notebook(name) for name in downloads}))
    _pages(course, report.collected)

    assert cli.main(["feedback", A, "--for", "moodle", "--course", str(course.root)]) == 0
    members = _members(course.reports / A / "moodle_feedback.zip")
    read = {moodle_reads(member): text for member, text in members.items()}
    assert set(read) == {(pid, "assignsubmission", "file") for pid in downloads.values()}
    for student in report.collected:
        pid = int(student.rsplit("_", 1)[1])
        assert read[(pid, "assignsubmission", "file")] == f"<p>feedback of {student}</p>"
    # the Canvas zip of a Moodle class holds nobody, and says why
    assert cli.main(["feedback", A, "--for", "canvas", "--course", str(course.root)]) == 0
    assert _members(course.reports / A / "canvas_feedback.zip") == {}
    assert "collected from moodle's file name, not canvas's" in capsys.readouterr().out


def test_feedback_before_grading_is_refused_and_writes_nothing(tmp_path, capsys):
    course = tiny_course(tmp_path / "course", A)
    assert cli.main(["feedback", A, "--for", "canvas", "--course", str(course.root)]) == 2
    assert "grade it first" in capsys.readouterr().err
    assert not (course.reports / A).exists()


def test_the_same_pages_make_the_samezip_of(tmp_path):
    course = tiny_course(tmp_path / "course", A)
    name = canvas_download_name("Lovelace, Ada", 12345, 67890, NB)
    report = collect(course=course, assignment=A,
                     source_path=zip_of(tmp_path / "c.zip", {name: tiny_notebook("ada")}))
    _pages(course, report.collected)
    zips = []
    for _ in range(2):
        assert cli.main(["feedback", A, "--for", "canvas", "--course", str(course.root)]) == 0
        zips.append((course.reports / A / "canvas_feedback.zip").read_bytes())
    assert zips[0] == zips[1]
    assert zipfile.ZipFile(io.BytesIO(zips[0])).namelist() == [
        "lovelaceada_12345_67890_feedback.html"]


def test_nbgrader_exchange_gives_each_student_the_page_nbgrader_fetch_feedback_finds(
        tmp_path, capsys):
    """Through nbgrader's own exchange, end to end with nbgrader's own commands: the
    instructor releases, the student fetches, answers and submits, the instructor
    collects (nbgrader), grades (this grader) and runs `feedback --for nbgrader`; the
    student's `nbgrader fetch_feedback` then finds the page with the grade. A hand-in
    that did not come through the exchange is left out, said so."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    from autograder.course import EXAMPLES_DIR, REPO_ROOT, Course, path_with_tools
    from conftest import GRADING_ENGINE

    assignment = "01_the_recipe"
    course = Course(tmp_path / "course")
    exchange, cache, student_home = (tmp_path / "exchange", tmp_path / "cache",
                                     tmp_path / "student")
    for folder in (exchange, cache, student_home):
        folder.mkdir(parents=True)
    for part in ("source", "release"):
        shutil.copytree(REPO_ROOT / part / assignment, course.root / part / assignment)
    nbgrader_lines = (f"c.CourseDirectory.course_id = 'layernorm'\n"
                      f"c.Exchange.root = {str(exchange)!r}\n"
                      f"c.Exchange.cache = {str(cache)!r}\n")
    (course.root / "nbgrader_config.py").write_text(
        (REPO_ROOT / "nbgrader_config.py").read_text() + nbgrader_lines)
    (student_home / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n" + nbgrader_lines)
    environment = {**os.environ, "PATH": path_with_tools()}

    def nbgrader(where, *words):
        done = subprocess.run([sys.executable, "-m", "nbgrader", *words], cwd=where,
                              capture_output=True, text=True, env=environment, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    nbgrader(course.root, "release_assignment", assignment)
    nbgrader(student_home, "fetch_assignment", assignment)
    shutil.copyfile(EXAMPLES_DIR / assignment / "ada_perfect.ipynb",
                    student_home / assignment / f"{assignment}.ipynb")
    nbgrader(student_home, "submit", assignment)
    nbgrader(course.root, "collect", assignment)
    (student,) = course.students(assignment)  # the student is this machine's user
    outsider = course.submitted / "dee" / assignment
    outsider.mkdir(parents=True)
    shutil.copyfile(EXAMPLES_DIR / assignment / "dee_blank.ipynb",
                    outsider / f"{assignment}.ipynb")
    assert cli.main(["grade", assignment, "--course", str(course.root),
                     "--engine", GRADING_ENGINE]) == 0
    capsys.readouterr()
    assert cli.main(["feedback", assignment, "--for", "nbgrader",
                     "--course", str(course.root)]) == 0
    printed = capsys.readouterr().out
    assert "released 1 feedback page(s) into nbgrader's exchange" in printed
    assert "left out: dee (not handed in through nbgrader's exchange" in printed

    nbgrader(student_home, "fetch_feedback", assignment)
    (page,) = (student_home / assignment / "feedback").glob(f"*/{assignment}.html")
    result = json.loads((course.autograded / student / assignment / "result.json").read_text())
    assert result["score"] == result["max_score"] == 10
    assert f"{assignment} (Score: 10.0 / 10.0)" in page.read_text()  # nbgrader's own header
