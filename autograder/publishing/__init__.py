"""The student edition: what its files and links are (edition), the site of every
lesson run and rendered (site), and writing the edition's repository with nothing
of the grading side in it (publish).

May import: autograder.course and autograder.authoring (the release it ships).
"""
