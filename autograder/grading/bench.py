"""Stock `nbgrader autograde` against this pipeline, on one class of hand-ins.

    python -m autograder.grading.bench [--handins 40] [--workers N] [--course DIR] [--engines]
    python -m autograder.grading.bench --one-student [--handins 300]

Both graders get the same hand-ins of unit 01 (the sample students, renamed
and repeated) in scratch courses, and the same per-cell timeout. Stock
nbgrader runs them one after the other, hidden tests in the student's kernel;
this pipeline runs them in parallel, each in its sandbox, with the trusted
checks answered by the grader. Only grading is timed (not the release, nor
the reports); the cluster's start is part of ours. With --engines, the same
hand-ins are graded on Dask and on a plain process pool instead (half of them on
each in turn: pool, Dask, Dask, pool), and the report gives hand-ins per minute
for each. Both reports end with where one hand-in's time goes.

With --one-student, a class of --handins students (default 300 there) is graded and
reported once, then `python -m autograder grade --student X` is timed on it, as an
instructor regrades one student of a large class: its wall time, reports included.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder.course import EXAMPLES_DIR, Course, path_with_tools
from autograder.grading.grade import RESULT_FILE, grade_assignment, sign
from autograder.grading.runner import RunSettings

ASSIGNMENT = "01_the_recipe"
# Students whose score stock nbgrader can be trusted with: they do not cheat.
DISHONEST_SAMPLES = {"hal_cheats", "lou_hidden_cheat"}


def sample_students(assignment=ASSIGNMENT):
    """The sample class's notebooks, by name: {sample name: path}."""
    return {p.stem: p for p in sorted((EXAMPLES_DIR / assignment).glob("*.ipynb"))}


def make_handins(*, folder, handins=40, assignment=ASSIGNMENT):
    """Write `handins` notebooks to folder/<student>.ipynb, cycling through the
    sample students; returns {student: sample name}."""
    samples = sample_students(assignment)
    names = list(samples)
    folder.mkdir(parents=True, exist_ok=True)
    made = {}
    for index in range(handins):
        sample = names[index % len(names)]
        student = f"s{index:03d}_{sample}"
        shutil.copyfile(samples[sample], folder / f"{student}.ipynb")
        made[student] = sample
    return made


def _submit(*, course_root, handin_folder, assignment, notebook_name):
    for handin in sorted(handin_folder.glob("*.ipynb")):
        target = course_root / "submitted" / handin.stem / assignment / notebook_name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(handin, target)


def _venv_environment():
    """nbgrader runs alembic and its kernels from this interpreter's bin/."""
    return {**os.environ, "PATH": path_with_tools()}


def _nbgrader(args, *, cwd):
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd,
                          capture_output=True, text=True, env=_venv_environment())
    if done.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{done.stdout[-3000:]}"
                           f"{done.stderr[-3000:]}")


def _stock_course(*, course, root, assignment, cell_timeout):
    """A scratch nbgrader course: the course's config with our timeout, the
    source, and the release and gradebook that generate_assignment makes."""
    config = course.root / "nbgrader_config.py"
    text = config.read_text() if config.exists() else "c = get_config()  # noqa: F821\n"
    (root / "nbgrader_config.py").write_text(
        text + f"\nc.CourseDirectory.root = {str(root)!r}\n"
        f"c.CourseDirectory.db_url = {'sqlite:///' + str(root / 'gradebook.db')!r}\n"
        f"c.ExecutePreprocessor.timeout = {int(cell_timeout)}\n"
        f"c.Execute.timeout = {int(cell_timeout)}\n")
    shutil.copytree(course.source / assignment, root / "source" / assignment)
    _nbgrader(["generate_assignment", assignment, "--force"], cwd=root)


def _stock_scores(root, assignment):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gradebook:
        return {s.student.id: float(s.score)
                for s in gradebook.find_assignment(assignment).submissions}


def time_stock_nbgrader(*, course, handin_folder, assignment=ASSIGNMENT, cell_timeout=30.0):
    """(seconds, {student: score}) for `nbgrader autograde` on the hand-ins."""
    with tempfile.TemporaryDirectory(prefix="bench-stock-") as scratch:
        root = Path(scratch)
        _stock_course(course=course, root=root, assignment=assignment,
                      cell_timeout=cell_timeout)
        _submit(course_root=root, handin_folder=handin_folder, assignment=assignment,
                notebook_name=course.notebook_name(assignment))
        started = time.monotonic()
        _nbgrader(["autograde", assignment], cwd=root)
        seconds = time.monotonic() - started
        return seconds, _stock_scores(root, assignment)


def time_pipeline(*, course, handin_folder, assignment=ASSIGNMENT, workers=None,
                  cell_timeout=30.0, engine="dask", progress=sys.stderr):
    """(seconds, {student: score}, {student: phases}) for grade_assignment on the
    hand-ins, on `engine` ("dask" or "pool")."""
    with tempfile.TemporaryDirectory(prefix="bench-ours-") as scratch:
        scratch_course = Course(Path(scratch))
        for part in ("source", "release"):
            shutil.copytree(getattr(course, part) / assignment,
                            getattr(scratch_course, part) / assignment)
        _submit(course_root=scratch_course.root, handin_folder=handin_folder,
                assignment=assignment, notebook_name=course.notebook_name(assignment))
        started = time.monotonic()
        results = grade_assignment(course=scratch_course, assignment=assignment,
                                   settings=RunSettings(cell_timeout=cell_timeout),
                                   workers=workers, engine=engine, progress=progress)
        seconds = time.monotonic() - started
        return (seconds, {r["student_id"]: float(r["score"]) for r in results},
                {r["student_id"]: r.get("phases", {}) for r in results})


def _warm_up():
    # Both graders start kernels that import the same libraries: read them from
    # disk once, so that whichever runs first does not pay for a cold cache.
    subprocess.run([sys.executable, "-c", "import numpy, torch, matplotlib.pyplot, "
                    "ipywidgets, ipykernel, nbgrader, normref.checks._registry"],
                   check=False, capture_output=True)


def run_bench(*, course, handins=40, workers=None, cell_timeout=30.0, progress=sys.stderr):
    """Grade the same `handins` hand-ins of unit 01 with stock nbgrader and with
    this pipeline; returns both timings, their ratio and each student's scores.

    course: where source/ and release/ of unit 01 come from; workers: this
    pipeline's parallel hand-ins (default: the number of cores); cell_timeout:
    seconds a cell may run, the same for both graders (default 30, the CLI's).
    """
    workers = workers or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench-handins-") as folder:
        samples = make_handins(folder=Path(folder), handins=handins)
        _warm_up()
        print(f"grading {handins} hand-ins with stock nbgrader ...", file=progress, flush=True)
        stock_seconds, stock = time_stock_nbgrader(course=course, handin_folder=Path(folder),
                                                   cell_timeout=cell_timeout)
        print(f"grading {handins} hand-ins with this pipeline ...", file=progress, flush=True)
        ours_seconds, ours, phases = time_pipeline(
            course=course, handin_folder=Path(folder), workers=workers,
            cell_timeout=cell_timeout, progress=progress)
    return {
        "handins": handins, "workers": workers, "cores": os.cpu_count(),
        "stock_seconds": stock_seconds, "ours_seconds": ours_seconds,
        "ratio": ours_seconds / stock_seconds,
        "stock_seconds_per_handin": stock_seconds / handins,
        "ours_seconds_per_handin": ours_seconds / handins,
        "scores": {s: {"sample": samples[s], "stock": stock.get(s), "ours": ours.get(s)}
                   for s in samples},
        "phases": mean_phases(phases, samples, PHASE_SAMPLE),
    }


PHASE_SAMPLE = "ada_perfect"  # whose hand-ins the per-phase breakdown averages


def mean_phases(phases, samples, sample):
    """{phase: mean seconds} over the hand-ins copied from `sample`."""
    runs = [phases[s] for s, name in samples.items() if name == sample and phases.get(s)]
    keys = sorted({k for run in runs for k in run})
    return {k: sum(run.get(k, 0.0) for run in runs) / len(runs) for k in keys} if runs else {}


def _halves(folder):
    """Move the hand-ins of `folder` into folder/first and folder/second, half each."""
    handins = sorted(folder.glob("*.ipynb"))
    halves = (folder / "first", folder / "second")
    for index, handin in enumerate(handins):
        half = halves[index >= len(handins) // 2]
        half.mkdir(exist_ok=True)
        handin.rename(half / handin.name)
    return halves


# Each engine grades each half once, in the order pool, dask, dask, pool: a load
# on the machine that rises or falls during the bench weighs on both alike, and
# each engine pays for starting twice.
ENGINE_ORDER = (("pool", 0), ("dask", 0), ("dask", 1), ("pool", 1))


def run_engine_bench(*, course, handins=200, workers=None, cell_timeout=30.0,
                     progress=sys.stderr):
    """Grade the same hand-ins on a local process pool (the baseline) and on a Dask
    LocalCluster of as many workers, on the same cores, in ENGINE_ORDER."""
    workers = workers or os.cpu_count() or 1
    found = {"handins": handins, "workers": workers, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="bench-handins-") as folder:
        samples = make_handins(folder=Path(folder), handins=handins)
        halves = _halves(Path(folder))
        _warm_up()
        runs = {"pool": [], "dask": []}
        for engine, half in ENGINE_ORDER:
            print(f"grading half {half + 1} of {handins} hand-ins on {engine} ...",
                  file=progress, flush=True)
            runs[engine].append(time_pipeline(
                course=course, handin_folder=halves[half], workers=workers,
                cell_timeout=cell_timeout, engine=engine, progress=progress))
    for engine, parts in runs.items():
        seconds = sum(part[0] for part in parts)
        scores = {s: v for part in parts for s, v in part[1].items()}
        phases = {s: v for part in parts for s, v in part[2].items()}
        found[engine] = {"seconds": seconds, "per_minute": 60 * handins / seconds,
                         "scores": scores,
                         "phases": mean_phases(phases, samples, PHASE_SAMPLE)}
    found["ratio"] = found["dask"]["per_minute"] / found["pool"]["per_minute"]
    found["same_scores"] = found["dask"]["scores"] == found["pool"]["scores"]
    return found


def format_engine_report(found):
    lines = [f"{found['handins']} hand-ins of {ASSIGNMENT}, {found['workers']} workers on "
             f"{found['cores']} cores"]
    for engine, label in (("pool", "process pool (baseline)"), ("dask", "Dask LocalCluster")):
        run = found[engine]
        lines.append(f"  {label:<24} {run['seconds']:7.1f} s  {run['per_minute']:6.1f} "
                     "hand-ins per minute")
    lines.append(f"  Dask / pool throughput: {found['ratio']:.2f} (target at least 0.90)"
                 + ("" if found["ratio"] >= 0.9 else "  MISSED"))
    lines.append("  same scores on both: " + ("yes" if found["same_scores"] else "NO"))
    lines += format_phases(found["dask"]["phases"])
    return lines


def format_phases(phases):
    """One hand-in's time by phase (the mean over the perfect hand-ins)."""
    if not phases:
        return []
    shown = ", ".join(f"{k} {v:.2f} s" for k, v in phases.items())
    return [f"  where a perfect hand-in's time goes: {shown}"]


def format_report(bench, *, target_ratio=0.25):
    """The benchmark's figures as lines of text."""
    lines = [
        f"{bench['handins']} hand-ins of {ASSIGNMENT} on {bench['cores']} cores",
        f"  stock nbgrader autograde: {bench['stock_seconds']:7.1f} s  "
        f"({bench['stock_seconds_per_handin']:.2f} s per hand-in, one at a time)",
        f"  this pipeline:            {bench['ours_seconds']:7.1f} s  "
        f"({bench['ours_seconds_per_handin']:.2f} s per hand-in, {bench['workers']} workers, "
        "sandbox and trusted checks on)",
        f"  ratio ours/stock: {bench['ratio']:.2f} (target at most {target_ratio})"
        + ("" if bench["ratio"] <= target_ratio else "  MISSED"),
    ]
    differ = {s: v for s, v in bench["scores"].items() if v["stock"] != v["ours"]}
    by_sample = {}
    for student, v in differ.items():
        by_sample.setdefault((v["sample"], v["stock"], v["ours"]), []).append(student)
    def missing_last(item):  # a grader that left no score gives None: after the numbers
        return tuple((value is None, value or 0) for value in item[0])

    for (sample, stock, ours), students in sorted(by_sample.items(), key=missing_last):
        why = " (cheats: stock nbgrader believes the kernel)" if sample in DISHONEST_SAMPLES \
            else ""
        lines.append(f"  scores differ for {len(students)} x {sample}: stock {stock}, "
                     f"ours {ours}{why}")
    return lines + format_phases(bench.get("phases"))


def bench_command(*, course, handins=40, workers=None, engines=False, one_student=False):
    """Run the benchmark and print its report; returns a process exit status.
    engines: compare the Dask path with the process pool instead of stock nbgrader;
    one_student: time `grade --student X` on a graded class of `handins` instead."""
    if one_student:
        found = run_one_student_bench(course=course, class_size=handins, workers=workers)
        print("\n".join(format_one_student_report(found)))
        return 0
    if engines:
        found = run_engine_bench(course=course, handins=handins, workers=workers)
        print("\n".join(format_engine_report(found)))
        return 0 if found["same_scores"] else 1
    bench = run_bench(course=course, handins=handins, workers=workers)
    print("\n".join(format_report(bench)))
    honest_differ = [s for s, v in bench["scores"].items()
                     if v["sample"] not in DISHONEST_SAMPLES and v["stock"] != v["ours"]]
    return 1 if honest_differ else 0


def run_one_student_bench(*, course, class_size=300, workers=None, progress=sys.stderr):
    """Seconds for the reports of a whole class of `class_size`, then for `grade
    --student X` on it through the CLI (grading X and every report).

    Each sample student is graded once; the class's other copies of the same notebook
    get that result, signed for them, as grading them would give."""
    with tempfile.TemporaryDirectory(prefix="bench-one-student-") as scratch:
        scratch_course = Course(Path(scratch))
        for part in ("source", "release"):
            shutil.copytree(getattr(course, part) / ASSIGNMENT,
                            getattr(scratch_course, part) / ASSIGNMENT)
        handins = scratch_course.root / "handins"
        made = make_handins(folder=handins, handins=class_size)
        _submit(course_root=scratch_course.root, handin_folder=handins, assignment=ASSIGNMENT,
                notebook_name=course.notebook_name(ASSIGNMENT))
        first_of = {}
        for student, sample in made.items():
            first_of.setdefault(sample, student)
        print(f"grading the {len(first_of)} different hand-ins of a class of {class_size} ...",
              file=progress, flush=True)
        grade_assignment(course=scratch_course, assignment=ASSIGNMENT, workers=workers,
                         engine="pool", students=sorted(first_of.values()), progress=progress)
        for student, sample in made.items():
            graded = scratch_course.autograded / first_of[sample] / ASSIGNMENT
            if student != first_of[sample]:
                copy = scratch_course.autograded / student / ASSIGNMENT
                shutil.copytree(graded, copy)
                result = json.loads((copy / RESULT_FILE).read_text())
                (copy / RESULT_FILE).write_text(json.dumps(sign({**result, "student_id": student})))
        # The first grade after the copies grades no one (all current): its time is
        # the reports of the whole class, written for the first time.
        class_seconds, printed = _timed_grade(scratch_course)
        if f"{class_size} of {class_size} already graded" not in printed:
            raise RuntimeError("the copied results were not taken as current, so the class "
                               f"was graded again, not only reported:\n{printed[-3000:]}")
        one = sorted(made)[class_size // 2]
        print(f"grade {ASSIGNMENT} --student {one} ...", file=progress, flush=True)
        one_seconds, _ = _timed_grade(scratch_course, "--student", one)
    return {"class_size": class_size, "class_reports_seconds": class_seconds,
            "one_student_seconds": one_seconds, "student": one}


def _timed_grade(course, *options):
    """(wall seconds, what it printed to stderr) of `python -m autograder grade` on unit
    01 of `course`."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "grade", ASSIGNMENT, *options,
         "--course", str(course.root), "--engine", "pool"],
        capture_output=True, text=True, env=_venv_environment())
    if done.returncode != 0:
        raise RuntimeError(f"grade {' '.join(options)} failed:\n{done.stderr[-3000:]}")
    return time.monotonic() - started, done.stderr


def format_one_student_report(found, *, target_seconds=10.0):
    return [f"a class of {found['class_size']} hand-ins of {ASSIGNMENT}",
            f"  reports for the whole class, first time: {found['class_reports_seconds']:6.1f} s",
            f"  grade --student {found['student']} (grading, then every report): "
            f"{found['one_student_seconds']:6.1f} s (target under {target_seconds:g} s)"
            + ("" if found["one_student_seconds"] < target_seconds else "  MISSED")]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m autograder.grading.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--course", default=None,
                        help="course directory (default: the repository root)")
    parser.add_argument("--handins", type=int, default=None,
                        help="hand-ins to grade: 40, or with --one-student 300")
    parser.add_argument("--workers", type=int, default=None,
                        help="this pipeline's parallel hand-ins (default: the number of cores)")
    parser.add_argument("--engines", action="store_true",
                        help="compare the Dask path with a process pool instead")
    parser.add_argument("--one-student", action="store_true",
                        help="time grade --student X on a graded class instead")
    args = parser.parse_args(argv)
    return bench_command(course=Course.at(args.course),
                         handins=args.handins or (300 if args.one_student else 40),
                         workers=args.workers, engines=args.engines,
                         one_student=args.one_student)


if __name__ == "__main__":
    sys.exit(main())
