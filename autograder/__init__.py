"""The course's grading pipeline: release, collect, grade, report.

Entry point: `python -m autograder --help`.
"""
