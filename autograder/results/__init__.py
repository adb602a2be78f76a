"""What comes out of grading: feedback pages and exports per assignment (report),
the class summary and the LMS grade files (summary), and nbgrader's gradebook, so
that the formgrader shows the results (gradebook), the feedback zips for the LMSs
(lms_feedback) and a Gradescope autograder that grades one upload (gradescope).

May import: autograder.course, autograder.grading (the results it writes) and
autograder.term (deadlines, for lateness).
"""
