"""The class and its term: who is in it (roster), when work is due (deadlines), and
bringing hand-ins in from a folder or an LMS zip (collect), with their commands.

May import: autograder.course. Nothing of grading or its results: a term is set up
and hand-ins collected before anything is graded.
"""
