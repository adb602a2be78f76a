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


def test_engine_bench_grades_each_half_on_each_engine_in_a_balanced_order(monkeypatch):
    """A bench that graded all hand-ins on one engine, then all on the other, would
    blame whichever ran second for a load that came up meanwhile."""
    from autograder import bench as bench_module

    calls = []

    def fake_pipeline(*, handin_folder, engine, **_):
        students = sorted(p.stem for p in handin_folder.glob("*.ipynb"))
        calls.append((engine, handin_folder.name, students))
        seconds = {"pool": 3.0, "dask": 4.0}[engine]
        return seconds, {s: 1.0 for s in students}, {s: {"kernel_start": 0.5} for s in students}

    monkeypatch.setattr(bench_module, "time_pipeline", fake_pipeline)
    monkeypatch.setattr(bench_module, "_warm_up", lambda: None)
    found = bench_module.run_engine_bench(course=Course.at(REPO), handins=10, workers=2)
    assert [(engine, half) for engine, half, _ in calls] == [
        ("pool", "first"), ("dask", "first"), ("dask", "second"), ("pool", "second")]
    first, second = calls[0][2], calls[2][2]
    assert len(first) == len(second) == 5 and not set(first) & set(second)
    assert calls[1][2] == first and calls[3][2] == second
    assert found["pool"]["seconds"] == 6.0 and found["dask"]["seconds"] == 8.0
    assert found["pool"]["per_minute"] == pytest.approx(60 * 10 / 6.0)
    assert found["ratio"] == pytest.approx(6.0 / 8.0)
    assert found["same_scores"] and len(found["dask"]["scores"]) == 10
