"""A term as Canvas and Moodle really run it, through the commands an instructor types:
a class of 30 on each LMS, its class list imported, its hand-ins downloaded as the LMS
packages them, collected, graded, late penalties from the LMS's own submission times,
grades imported back into the right column, feedback zipped for the LMS's bulk upload.

The downloads are named by the LMSs' own rules (conftest: canvas_download_name, from
canvas-lms lib/content_zipper.rb; moodle_download_name, from Moodle's
mod/assign/locallib.php), and the feedback zips read back as the LMSs read them
(canvas_reads, moodle_reads). The class lists are Canvas's gradebook export (Student,
ID, SIS User ID, SIS Login ID, Section, then `Assignment (id)` columns and a Points
Possible row) and Moodle's grading worksheet (Identifier "Participant N", Full name,
Email address, ...). Canvas's zip is built three days after the deadline, and every
member carries that date (canvas-lms#2219), so it says nothing about lateness.
"""

import csv
import json
import unicodedata
import zipfile

import nbformat
import pytest

from autograder import cli
from autograder.authoring.release import release
from autograder.course import Course
from conftest import (
    GRADING_ENGINE,
    REPO,
    canvas_download_name,
    canvas_reads,
    moodle_download_name,
    moodle_reads,
)
from minicourse import ASSIGNMENT, handin, make_course

NB = f"{ASSIGNMENT}.ipynb"
RIGHT, WRONG = "return 2 * x", "return x"
CANVAS_COLUMN = f"{ASSIGNMENT} (5555)"
ZIP_BUILT = (2026, 10, 4, 21, 0, 0)  # 3 days after the deadline
ON_TIME = "2026-10-01T10:00:00Z"

# (sortable name, Canvas user id, answer, submitted_at, Canvas's late flag)
CANVAS_CLASS = [
    ("Müller, Jürgen", 4713, RIGHT, ON_TIME, False),
    ("Nguyễn, Thị Hoa", 4714, RIGHT, "2026-10-01T12:11:00Z", True),  # in the 15 min grace
    ("O'Brien, Seán", 4715, RIGHT, ON_TIME, False),
    ("Lee, Kim", 4716, RIGHT, ON_TIME, False),
    ("Lee, Kim", 4717, WRONG, ON_TIME, False),  # the same name, another student
    ("李, 小龙", 4718, RIGHT, ON_TIME, False),
    ("Smith-Jones, Ann", 4719, RIGHT, ON_TIME, False),
    (unicodedata.normalize("NFD", "Ångström, Zoë"), 4720, RIGHT, ON_TIME, False),
    ("Bo, Late", 4721, RIGHT, "2026-10-02T14:00:00Z", True),  # 1 d 2 h: two days
    ("Re, Submit", 4722, RIGHT, ON_TIME, False),  # handed in twice, the second counts
    ("Noshow, Nora", 4723, None, None, False),  # handed in nothing
    *[(f"Student{n:02d}, Plain", 4700 + n, RIGHT if n % 3 else WRONG, ON_TIME, False)
      for n in range(24, 43)],
]
DROPPED = ("Dropped, Dan", 4999)  # left the course: in the zip, not in the class list


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """The instructor's own course with its assignment released, and its hand-ins."""
    course = make_course(tmp_path_factory.mktemp("term"), REPO)
    with open(tmp_path_factory.mktemp("log") / "release.log", "w") as log:
        release(course=course, assignments=[ASSIGNMENT], log=log)
    return course


def _notebook(course, body):
    return nbformat.writes(handin(course, body)).encode()


def _term_of(released, here):
    """A course folder of its own for one term, sharing the released assignment."""
    course = Course(here / "course")
    course.root.mkdir()
    for part in ("source", "release"):
        (course.root / part).symlink_to(getattr(released, part))
    (course.root / "nbgrader_config.py").write_text(
        (released.root / "nbgrader_config.py").read_text())
    return course


def _csv_file(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return path


def _run(*argv, course):
    assert cli.main([*argv, "--course", str(course.root)]) == 0, argv


@pytest.fixture(scope="module")
def canvas_term(released, tmp_path_factory):
    here = tmp_path_factory.mktemp("canvas")
    course = _term_of(released, here)

    gradebook_export = _csv_file(here / "canvas_gradebook.csv", [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", CANVAS_COLUMN],
        ["    Points Possible", "", "", "", "", "3"],
        *([name, uid, f"S{uid}", f"u{uid}@uni.example", "Sec A" if uid % 2 else "Sec B", ""]
          for name, uid, *_ in CANVAS_CLASS)])
    _run("roster", "import", str(gradebook_export), course=course)
    (course.root / "deadlines.json").write_text(json.dumps({
        "policy": {"percent_per_day": 10, "grace_minutes": 15},
        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}}))

    downloads = {}  # member name -> (user id, attachment id)
    members = {}
    for name, uid, answer, _, late in CANVAS_CLASS:
        if answer is None:
            continue
        attempts = [(WRONG, NB), (answer, f"{ASSIGNMENT}-1.ipynb")] if uid == 4722 \
            else [(answer, NB)]
        for n, (body, display) in enumerate(attempts):
            member = canvas_download_name(name, uid, 100_000 * (n + 1) + uid, display,
                                          late=late)
            members[member] = _notebook(released, body)
            downloads[member] = (uid, 100_000 * (n + 1) + uid)
    dropped = canvas_download_name(*DROPPED, 104999, NB)
    members[dropped] = _notebook(released, RIGHT)
    archive = here / "submissions.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for member, data in members.items():
            z.writestr(zipfile.ZipInfo(member, date_time=ZIP_BUILT), data)
    _run("collect", ASSIGNMENT, str(archive), course=course)

    times = here / "submissions.json"  # Canvas's List assignment submissions answer
    times.write_text(json.dumps([
        {"user_id": uid, "submitted_at": when, "late": late,
         "workflow_state": "submitted" if when else "unsubmitted"}
        for _, uid, _, when, late in CANVAS_CLASS]))
    _run("deadlines", "times", ASSIGNMENT, str(times), course=course)
    _run("grade", ASSIGNMENT, "--engine", GRADING_ENGINE, "--workers", "2", course=course)
    _run("feedback", ASSIGNMENT, "--for", "canvas", course=course)
    roster = json.loads((course.root / "roster.json").read_text())["students"]
    return {"course": course, "downloads": downloads, "dropped": dropped,
            "ids": {int(s["lms_id"]): s["id"] for s in roster}}


def _grades(course):
    with open(course.reports / ASSIGNMENT / "grades.csv", newline="") as f:
        return {row["student_id"]: row for row in csv.DictReader(f)}


def test_every_canvas_student_is_collected_whatever_the_script_of_their_name(canvas_term):
    course, ids = canvas_term["course"], canvas_term["ids"]
    handed_in = {uid for _, uid, answer, *_ in CANVAS_CLASS if answer is not None}
    assert sorted(course.students(ASSIGNMENT)) == sorted(ids[uid] for uid in handed_in)
    assert len(handed_in) == 29 and len(set(ids.values())) == 30  # two Kim Lees, two ids
    assert ids[4723] not in course.students(ASSIGNMENT)  # Nora handed in nothing
    assert not any("4999" in student for student in course.students(ASSIGNMENT))


def test_lateness_comes_from_canvas_times_not_from_the_zip(canvas_term):
    course, ids = canvas_term["course"], canvas_term["ids"]
    grades = _grades(course)
    expected = {ids[uid]: (2.0 if answer == RIGHT else 0.0) for _, uid, answer, *_ in
                CANVAS_CLASS if answer is not None}
    expected[ids[4721]] = 2.0 * 0.8  # two days late at 10% a day
    assert {s: float(row["final_score"]) for s, row in grades.items()} == \
        pytest.approx(expected)
    penalised = {s: row["late"] for s, row in grades.items() if float(row["late_penalty"])}
    assert list(penalised) == [ids[4721]], penalised
    assert "1 d 2 h late" in penalised[ids[4721]]
    assert "within the grace period" in grades[ids[4714]]["late"]
    assert all(row["late"].endswith("on time") for s, row in grades.items()
               if s not in (ids[4714], ids[4721]))


def test_canvas_imports_the_grades_into_the_assignments_own_column(canvas_term):
    course, ids = canvas_term["course"], canvas_term["ids"]
    with open(course.reports / ASSIGNMENT / "canvas_import.csv", newline="",
              encoding="utf-8") as f:
        header, points, *rows = list(csv.reader(f))
    assert header == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                      CANVAS_COLUMN]
    assert points[-1] == "3"  # two points by tests, one by hand
    by_id = {int(row[1]): row for row in rows}
    assert sorted(by_id) == sorted(uid for _, uid, *_ in CANVAS_CLASS)  # Nora too, no Dan
    assert by_id[4723][-1] == ""  # Canvas leaves an empty cell as it is
    assert by_id[4721][-1] == "1.6" and by_id[4717][-1] == "0"
    assert by_id[4715][1:5] == ["4715", "S4715", "u4715@uni.example", "Sec A"]
    left_out = (course.reports / ASSIGNMENT / "lms_import_left_out.txt").read_text()
    assert left_out.startswith(f"Handed in nothing (an empty cell in canvas_import.csv, "
                               f"which Canvas leaves as it is):\n{ids[4723]}\n")
    assert "moodle" not in left_out


def test_canvas_pairs_every_feedback_page_with_the_submission_it_grades(canvas_term):
    course, ids = canvas_term["course"], canvas_term["ids"]
    with zipfile.ZipFile(course.reports / ASSIGNMENT / "canvas_feedback.zip") as z:
        pages = {canvas_reads(member): z.read(member).decode() for member in z.namelist()}
    assert len(pages) == 29
    downloaded = set(canvas_term["downloads"].values())
    for (uid, attachment), page in pages.items():
        assert (uid, attachment) in downloaded  # Canvas finds the submission it answers
        own = (course.reports / ASSIGNMENT / "feedback" / f"{ids[uid]}.html").read_text()
        assert page == own
    assert (4722, 204722) in pages and (4722, 104722) not in pages  # the latest attempt


MOODLE_CLASS = [  # (full name, participant id, answer, file name the student uploaded)
    ("Jürgen Müller", 8801, RIGHT, NB),
    ("Anne_Marie Roux", 8802, RIGHT, NB),  # Moodle writes her "_" as " "
    ("Seán O'Brien", 8803, WRONG, NB),
    ("Kim Lee", 8804, RIGHT, NB),
    ("Kim Lee", 8805, WRONG, NB),
    ("小龙 李", 8806, RIGHT, f"Copy of {NB}"),  # saved from Colab
    (unicodedata.normalize("NFD", "Zoë Ångström"), 8807, RIGHT, NB),
    ("Nora Noshow", 8808, None, None),
    *[(f"Plain Student{n:02d}", 8800 + n, RIGHT if n % 4 else WRONG, NB)
      for n in range(9, 31)],
]


@pytest.fixture(scope="module")
def moodle_term(released, tmp_path_factory):
    here = tmp_path_factory.mktemp("moodle")
    course = _term_of(released, here)
    worksheet = _csv_file(here / "grading_worksheet.csv", [
        ["Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade"],
        *([f"Participant {pid}", name, f"p{pid}@uni.example", "Submitted for grading", "", "3"]
          for name, pid, *_ in MOODLE_CLASS)])
    _run("roster", "import", str(worksheet), course=course)
    archive = here / "moodle.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name, pid, answer, upload in MOODLE_CLASS:
            if answer is not None:
                z.writestr(moodle_download_name(name, pid, upload),
                           _notebook(released, answer))
    _run("collect", ASSIGNMENT, str(archive), course=course)
    _run("grade", ASSIGNMENT, "--engine", GRADING_ENGINE, "--workers", "2", course=course)
    _run("feedback", ASSIGNMENT, "--for", "moodle", course=course)
    roster = json.loads((course.root / "roster.json").read_text())["students"]
    return {"course": course, "ids": {int(s["lms_id"]): s["id"] for s in roster}}


def test_moodle_grades_import_by_email_and_feedback_pairs_by_participant(moodle_term):
    course, ids = moodle_term["course"], moodle_term["ids"]
    handed_in = {pid: answer for _, pid, answer, _ in MOODLE_CLASS if answer is not None}
    assert sorted(course.students(ASSIGNMENT)) == sorted(ids[pid] for pid in handed_in)
    with open(course.reports / ASSIGNMENT / "moodle_import.csv", newline="",
              encoding="utf-8") as f:
        rows = {row["Email address"]: row for row in csv.DictReader(f)}
    assert {email: float(row[ASSIGNMENT]) for email, row in rows.items()} == {
        f"p{pid}@uni.example": 2.0 if answer == RIGHT else 0.0
        for pid, answer in handed_in.items()}
    assert not (course.reports / ASSIGNMENT / "canvas_import.csv").exists()
    with zipfile.ZipFile(course.reports / ASSIGNMENT / "moodle_feedback.zip") as z:
        pages = {moodle_reads(member): z.read(member).decode() for member in z.namelist()}
    assert sorted(pid for pid, _, _ in pages) == sorted(handed_in)
    for (pid, subtype, plugin), page in pages.items():
        assert (subtype, plugin) == ("assignsubmission", "file")
        assert page == (course.reports / ASSIGNMENT / "feedback" /
                        f"{ids[pid]}.html").read_text()
