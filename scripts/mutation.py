"""Mutation testing of the checks and the grader (`make mutation`), with mutmut.

For each module, in turn, mutmut puts small bugs into it one at a time and runs
the fast tests that cover it (the mapping [tool.mutation.tests] in
pyproject.toml, next to mutmut's own settings in [tool.mutmut]); a mutant no
test fails on survives. The run happens in a scratch copy of the project,
build/mutation/<module>/, so the checkout is never mutated.

Usage: .venv/bin/python scripts/mutation.py [MODULE ...] [--max-children N] [--resume]
  MODULE: a path of the mapping (autograder/grading/forbidden.py); default: all of them.
  --resume: go on with an interrupted run of MODULE (its tests are copied again;
            mutants already decided keep their result).
Prints per module the mutants killed out of the total, the time taken, and
every survivor with its diff, marked "equivalent" when docs/mutation_equivalents/
lists it (a change that cannot alter behaviour); the score counts the rest. A
listed change is matched by its function and the text of the lines it changes
(mutmut's mutant numbers shift with every edit of a function); listed changes
that no longer survive are printed, to be dropped from the listing.

A mutant that timed out under mutmut (which forks each mutant's tests from one
process) is run again on its own, in a fresh process: it counts as killed only if
its tests fail or time out there too. A lock left held in the forking process, not
the mutation, can hang a forked run, and that is not a kill. A survivor that no
listing explains is run again on its own the same way: the forking process imported
the module unmutated, so what it computed at import (a table built by a mutated
function, a value cached before the fork) hides the mutant from the forked tests;
one whose tests fail on their own is counted killed, and the count is printed.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRATCH = REPO / "build" / "mutation"
EQUIVALENTS = REPO / "docs" / "mutation_equivalents"  # one Markdown file per module
MUTMUT = Path(sys.executable).parent / "mutmut"
CAUGHT = {"killed", "timeout", "segfault", "caught by type check"}
ALONE_TIMEOUT = 180  # seconds for a timed-out mutant's tests run again on their own
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")


def _settings():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    return data.get("mutmut", {}), data["mutation"]["tests"]


def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


def _tracked_files():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode()
    return [Path(name) for name in listed.split("\0") if name]


def _work_dir(module):
    return SCRATCH / module.replace("/", "_").removesuffix(".py")


def _resume(module, tests, base):
    """The scratch copy of an interrupted run, with the tests as they are now; a new
    one if there is none. Refused if the module changed since: its results would be
    about other code."""
    work = _work_dir(module)
    if not (work / "mutants").is_dir():
        return _prepare(module, tests, base)
    if (work / module).read_bytes() != (REPO / module).read_bytes():
        raise SystemExit(f"{module} changed since its run began: run it again without --resume")
    for name in _tracked_files():
        if name.parts[0] == "tests" and (REPO / name).is_file():
            for copy in (work / name, work / "mutants" / name):
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, copy)
    return work


def _prepare(module, tests, base):
    """A scratch copy of the project's files (the tests read the course's notebooks)
    with a mutmut config that mutates `module` and runs `tests`."""
    work = _work_dir(module)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name in _tracked_files():
        if name == Path("pyproject.toml") or not (REPO / name).is_file():
            continue
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, work / name)
    # mutmut runs the tests in work/mutants/, which gets the packages and tests/ by
    # itself; everything else the tests read is copied there too.
    also_copy = sorted({name.parts[0] for name in _tracked_files()}
                       - {"autograder", "normref", "tests", "pyproject.toml"})
    config = {**base, "source_paths": ["autograder", "normref"], "only_mutate": [module],
              "pytest_add_cli_args_test_selection": list(tests), "also_copy": also_copy}
    lines = ["[tool.pytest.ini_options]", 'testpaths = ["tests"]', "", "[tool.mutmut]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in config.items()]
    (work / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return work


def _listing(module):
    """docs/mutation_equivalents/ file of `module` (autograder/grading/grade.py ->
    autograder_grading_grade.md)."""
    return EQUIVALENTS / (module.removesuffix(".py").replace("/", "_") + ".md")


def _changed_lines(diff_text):
    """(lines taken out, lines put in) of a unified diff, each stripped of its
    indentation: a change's identity that survives edits elsewhere in the file."""
    lines = diff_text.splitlines()
    out = tuple(line[1:].strip() for line in lines
                if line.startswith("-") and not line.startswith("---"))
    put = tuple(line[1:].strip() for line in lines
                if line.startswith("+") and not line.startswith("+++"))
    return out, put


def _function(mutant_name):
    """The function a mutant changes, as the listing names it: `_Scanner.used` for
    mutmut's `pkg.mod.xǁ_Scannerǁused__mutmut_35`, `_dotted` for `pkg.mod.x__dotted__mutmut_4`."""
    mangled = mutant_name.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[1]
    if mangled.startswith("xǁ"):
        return mangled.removeprefix("xǁ").replace("ǁ", ".")
    return mangled.removeprefix("x_")


def equivalents(listing_text):
    """{(function, lines taken out, lines put in)} of a listing: each change is a
    fenced block whose info string is `diff FUNCTION`."""
    return {(function, *_changed_lines(body)) for function, body in
            re.findall(r"^```diff (\S+)\n(.*?)^```", listing_text, re.MULTILINE | re.DOTALL)}


def _fails_alone(work, name):
    """Whether the tests mutmut ran for mutant `name` fail (or hang) when run in a
    fresh process of their own, with the mutant switched on."""
    stats = json.loads((work / "mutants" / "mutmut-stats.json").read_text())
    tests = sorted(stats["tests_by_mangled_function_name"].get(
        name.rsplit("__mutmut_", 1)[0], []))
    if not tests:
        return False
    env = {**os.environ, **ONE_THREAD, "MUTANT_UNDER_TEST": name}
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p",
                               "no:cacheprovider", *tests], cwd=work / "mutants", env=env,
                              capture_output=True, timeout=ALONE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return True
    return done.returncode != 0


def run_module(module, tests, base, max_children, *, resume=False):
    work = (_resume if resume else _prepare)(module, tests, base)
    started = time.monotonic()
    # mutmut forks each mutant from a process that has run torch: a thread pool
    # of OpenMP does not survive a fork (the child hangs), so run single-threaded.
    env = {**os.environ, **ONE_THREAD}
    done = subprocess.run([str(MUTMUT), "run", "--max-children", str(max_children)],
                          cwd=work, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise SystemExit(f"mutmut failed on {module} (exit {done.returncode})")
    listed = subprocess.run([str(MUTMUT), "results", "--all", "true"], cwd=work,
                            capture_output=True, text=True, check=True).stdout
    statuses = dict(re.findall(r"^\s+(\S+): (.+)$", listed, re.MULTILINE))
    timed_out = [name for name, status in statuses.items() if status == "timeout"]
    for name in timed_out:
        if not _fails_alone(work, name):
            statuses[name] = "timed out only when forked: survived on its own"
    listing = _listing(module)
    listed = equivalents(listing.read_text()) if listing.exists() else set()
    survivors = sorted(name for name, status in statuses.items() if status not in CAUGHT)
    diffs = {name: subprocess.run([str(MUTMUT), "show", name], cwd=work, capture_output=True,
                                  text=True).stdout for name in survivors}
    change = {name: (_function(name), *_changed_lines(diffs[name])) for name in survivors}
    killed_alone = [name for name in survivors
                    if change[name] not in listed and _fails_alone(work, name)]
    for name in killed_alone:
        statuses[name] = "killed"
    survivors = [name for name in survivors if name not in killed_alone]
    seconds = time.monotonic() - started
    kept = [name for name in survivors if change[name] in listed]
    caught = len(statuses) - len(survivors)
    counted = len(statuses) - len(kept)
    score = 100.0 * caught / counted if counted else 100.0
    print(f"{module}: {caught}/{counted} killed ({score:.1f}%), {len(kept)} equivalent, "
          f"{len(statuses)} mutants, {seconds:.0f} s ({len(timed_out)} timeouts run again "
          f"on their own; {len(killed_alone)} survivors of the forked runs killed on "
          "their own)")
    for name in survivors:
        mark = "equivalent" if name in kept else statuses[name]
        print(f"--- {mark}: {name}\n{diffs[name].strip()}\n")
    for function, out, put in sorted(listed - set(change.values())):
        print(f"--- listed in {listing.relative_to(REPO)} but no longer survives (drop it): "
              f"{function}\n" + "\n".join([*(f"-{line}" for line in out),
                                            *(f"+{line}" for line in put)]) + "\n")
    return caught, counted, seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="modules to mutate (default: all mapped)")
    parser.add_argument("--max-children", type=int, default=1,
                        help="parallel mutant runs (default 1: the machine is shared)")
    parser.add_argument("--resume", action="store_true",
                        help="go on with an interrupted run (the module must be unchanged)")
    parser.add_argument("--tests", nargs="+", metavar="TEST",
                        help="run these tests instead of the mapped ones (while writing them)")
    args = parser.parse_args(argv)
    base, mapping = _settings()
    if args.tests:
        mapping = {module: args.tests for module in args.modules}
    modules = args.modules or list(mapping)
    unknown = [m for m in modules if m not in mapping]
    if unknown:
        raise SystemExit(f"no tests mapped for {unknown} in [tool.mutation.tests] "
                         f"(mapped: {', '.join(mapping)})")
    totals = [run_module(m, mapping[m], base, args.max_children, resume=args.resume)
              for m in modules]
    caught, counted = sum(t[0] for t in totals), sum(t[1] for t in totals)
    print(f"total: {caught}/{counted} killed "
          f"({100.0 * caught / max(counted, 1):.1f}%), {sum(t[2] for t in totals):.0f} s")


if __name__ == "__main__":
    main()
