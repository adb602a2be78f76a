"""The course's grading pipeline, one subpackage per step an instructor takes:

  authoring/   release/ built from source/ and leak-checked; new checks scaffolded
  term/        the roster, the deadlines, and hand-ins collected into submitted/
  grading/     each hand-in run in a sandbox, checked, scored and signed
  results/     feedback pages, the class summary, LMS grade files, nbgrader's gradebook
  publishing/  the student edition and its site

course.py holds what every step shares (the course's folders, the tools' PATH);
cli.py is the one command line (`python -m autograder --help`). Each subpackage's
docstring says what it may import; tests/test_layout.py holds them to it.
"""
