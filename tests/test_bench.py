"""The benchmark runs end to end on a few hand-ins.

Timing targets live in the benchmark (python -m autograder.bench), not here:
this only checks that both graders ran and agree on honest students.
"""

import pytest

from autograder.bench import DISHONEST_SAMPLES, format_report, run_bench
from autograder.course import Course
from conftest import REPO


def test_bench_times_both_graders_and_they_agree_on_honest_students(venv_env, monkeypatch):
    monkeypatch.setenv("PATH", venv_env["PATH"])  # nbgrader's alembic and kernels
    bench = run_bench(course=Course.at(REPO), handins=4, workers=2)
    assert bench["stock_seconds"] > 0 and bench["ours_seconds"] > 0
    assert bench["ratio"] == pytest.approx(bench["ours_seconds"] / bench["stock_seconds"])
    assert len(bench["scores"]) == 4
    honest = {s: v for s, v in bench["scores"].items() if v["sample"] not in DISHONEST_SAMPLES}
    assert honest and all(v["stock"] is not None for v in honest.values())
    assert {s: v["stock"] for s, v in honest.items()} == {s: v["ours"] for s, v in honest.items()}
    assert any("ratio ours/stock" in line for line in format_report(bench))
