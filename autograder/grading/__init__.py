"""Grading a hand-in: merging it into the instructor's notebook (merge), running it
in a sandboxed kernel (runner, sandbox, lifeline) that asks the grader's check server
for its checks (checkserver), refusing forbidden library calls (forbidden), scoring
and signing the result (grade) and writing the graded notebook inert (inert), on a
Dask cluster or a process pool (engines), and the benchmark against stock nbgrader
(bench).

May import: autograder.course and normref. It knows nothing of the term, reports
or the student edition: they read what it writes.
"""
