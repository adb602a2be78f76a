"""Authoring assignments: building release/ from source/ with nbgrader and refusing
any leak (release), and scaffolding a trusted check for a new exercise (scaffold).

May import: autograder.course and autograder.grading (which cells are graded).
"""
