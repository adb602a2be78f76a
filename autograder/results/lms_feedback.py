"""Feedback back through the LMS: one zip of the students' feedback pages, each page
named as the LMS named that student's downloaded submission, so that the LMS's bulk
upload gives every page to its student.

- Canvas, *Re-upload Submissions* (SpeedGrader's bulk upload): Canvas splits a file's
  name at "_", takes the first two all-digit fields as the user id and the attachment
  id, and attaches the file to that user's submission only if the attachment is one of
  it (canvas-lms, app/models/assignment.rb, infer_comment_context_from_filename); other
  files are ignored. The page keeps the download's prefix, `lastfirst[_LATE]_UID_ATTID`.
- Moodle, *Upload multiple feedback files in a zip*: Moodle splits the name at "_" into
  five fields, the second being the participant id and the third and fourth the plugin
  that exported it (mod/assign/feedback/file/importziplib.php,
  is_valid_filename_for_import). The page keeps `Full Name_PID_assignsubmission_file`.

Only hand-ins collected from that LMS's file names can be named so: collect records
the prefix in each hand-in's sidecar; everyone else is left out, with the reason.

- nbgrader's exchange: `release_through_nbgrader` runs nbgrader's own
  `generate_feedback`, then `release_feedback`, which puts each page in the exchange
  where the student's `nbgrader fetch_feedback` (or the Assignments tab) finds it. That
  works for hand-ins submitted through the exchange only: nbgrader names the released
  page by a hash of the submission's secret (submission_secret.txt, written by
  `nbgrader submit`), so students who handed in otherwise are left out, with the reason.

May import: autograder.course, autograder.term (the sidecar collect writes).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from autograder.course import path_with_tools
from autograder.term.deadlines import SIDECAR_FILE

LMS_NAMES = ("canvas", "moodle")
PAGE_SUFFIX = "_feedback.html"
# Every member dated alike: the same pages make the same zip.
_ZIP_DATE = (2000, 1, 1, 0, 0, 0)


def zip_path(*, course, assignment, lms):
    return course.reports / assignment / f"{lms}_feedback.zip"


def _sidecar(course, student, assignment):
    try:
        return json.loads((course.submitted / student / assignment / SIDECAR_FILE).read_text())
    except (OSError, ValueError):
        return None


def feedback_members(*, course, assignment, lms):
    """([(student, member name, page path)], [(student, reason left out)]) for every
    student with a feedback page of `assignment`."""
    if lms not in LMS_NAMES:
        raise ValueError(f"unknown LMS {lms!r}: {' or '.join(LMS_NAMES)}")
    pages = sorted((course.reports / assignment / "feedback").glob("*.html"))
    members, left_out = [], []
    for page in pages:
        student = page.stem
        record = _sidecar(course, student, assignment)
        if record is None:
            left_out.append((student, "no hand-in record in submitted/ (collect it again)"))
        elif record.get("lms") != lms:
            came = f"{record['lms']}'s" if record.get("lms") else "a plain"
            left_out.append((student, f"collected from {came} file name, not {lms}'s"))
        elif not record.get("lms_prefix"):
            left_out.append((student, "collected before the LMS name was recorded "
                                      "(collect the same download again)"))
        else:
            members.append((student, record["lms_prefix"] + PAGE_SUFFIX, page))
    return members, left_out


def write_feedback_zip(*, course, assignment, lms):
    """Write reports/<assignment>/<lms>_feedback.zip (replaced whole, never half
    written); returns (its path, [(student, member)], [(student, reason left out)])."""
    members, left_out = feedback_members(course=course, assignment=assignment, lms=lms)
    target = zip_path(course=course, assignment=assignment, lms=lms)
    fd, scratch = tempfile.mkstemp(dir=target.parent, suffix=".zip.tmp")
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for _, member, page in members:
                info = zipfile.ZipInfo(member, date_time=_ZIP_DATE)
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, page.read_bytes())
        os.replace(scratch, target)
    except BaseException:
        os.unlink(scratch)
        raise
    return target, [(student, member) for student, member, _ in members], left_out


NBGRADER_SECRET = "submission_secret.txt"
NBGRADER_TIMESTAMP = "timestamp.txt"


class NbgraderFailed(RuntimeError):
    """An nbgrader command failed; the message ends with what it printed."""


def _nbgrader(course, *words):
    done = subprocess.run([sys.executable, "-m", "nbgrader", *words], cwd=course.root,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PATH": path_with_tools()})
    if done.returncode != 0:
        raise NbgraderFailed(f"nbgrader {' '.join(words)} failed:\n"
                             f"{(done.stdout + done.stderr)[-2000:]}")


def release_through_nbgrader(*, course, assignment):
    """nbgrader's generate_feedback, then its release_feedback for every student who
    handed in through the exchange; returns ([released students], [(student, reason left
    out)]). The course's nbgrader_config.py must name the course (course_id) and its
    exchange (Exchange.root), as for the rest of nbgrader's exchange."""
    _nbgrader(course, "generate_feedback", assignment, "--force")
    released, left_out = [], []
    for student in course.students(assignment):
        submitted = course.submitted / student / assignment
        feedback = course.root / "feedback" / student / assignment
        if not (submitted / NBGRADER_SECRET).is_file():
            left_out.append((student, "not handed in through nbgrader's exchange (no "
                                      f"{NBGRADER_SECRET}): return its page through the LMS"))
        elif not any(feedback.glob("*.html")):
            left_out.append((student, "nbgrader generated no feedback page (graded?)"))
        else:
            for name in (NBGRADER_SECRET, NBGRADER_TIMESTAMP):
                if (submitted / name).is_file():
                    shutil.copyfile(submitted / name, feedback / name)
            released.append(student)
    if released:
        excluded = ",".join(student for student, _ in left_out)
        _nbgrader(course, "release_feedback", assignment,
                  *([f"--CourseDirectory.student_id_exclude={excluded}"] if excluded else []))
    return released, left_out
