"""Mutation testing of the checks and the grader (`make mutation`), with mutmut.

For each module, in turn, mutmut puts small bugs into it one at a time and runs
the fast tests that cover it (the mapping [tool.mutation.tests] in
pyproject.toml, next to mutmut's own settings in [tool.mutmut]); a mutant no
test fails on survives. The run happens in a scratch copy of the project,
build/mutation/<module>/, so the checkout is never mutated.

Usage: .venv/bin/python scripts/mutation.py [MODULE ...] [--max-children N]
  MODULE: a path of the mapping (autograder/forbidden.py); default: all of them.
Prints per module the mutants killed out of the total, the time taken, and
every survivor with its diff, marked "equivalent" when docs/mutation_equivalents/
lists it (a change that cannot alter behaviour); the score counts the rest.
"""

import argparse
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


def _prepare(module, tests, base):
    """A scratch copy of the project's files (the tests read the course's notebooks)
    with a mutmut config that mutates `module` and runs `tests`."""
    work = SCRATCH / module.replace("/", "_").removesuffix(".py")
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


def _equivalents():
    """Mutant names listed in docs/mutation_equivalents/*.md (in backquotes)."""
    return {name for listing in sorted(EQUIVALENTS.glob("*.md"))
            for name in re.findall(r"`([\w.ǁ]+__mutmut_\d+)`", listing.read_text())}


def run_module(module, tests, base, max_children):
    work = _prepare(module, tests, base)
    started = time.monotonic()
    # mutmut forks each mutant from a process that has run torch: a thread pool
    # of OpenMP does not survive a fork (the child hangs), so run single-threaded.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([str(MUTMUT), "run", "--max-children", str(max_children)],
                          cwd=work, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise SystemExit(f"mutmut failed on {module} (exit {done.returncode})")
    listed = subprocess.run([str(MUTMUT), "results", "--all", "true"], cwd=work,
                            capture_output=True, text=True, check=True).stdout
    statuses = dict(re.findall(r"^\s+(\S+): (.+)$", listed, re.MULTILINE))
    equivalent = _equivalents()
    survivors = sorted(name for name, status in statuses.items() if status not in CAUGHT)
    kept = [name for name in survivors if name in equivalent]
    caught = len(statuses) - len(survivors)
    counted = len(statuses) - len(kept)
    score = 100.0 * caught / counted if counted else 100.0
    print(f"{module}: {caught}/{counted} killed ({score:.1f}%), {len(kept)} equivalent, "
          f"{len(statuses)} mutants, {seconds:.0f} s")
    for name in survivors:
        diff = subprocess.run([str(MUTMUT), "show", name], cwd=work, capture_output=True,
                              text=True).stdout
        mark = "equivalent" if name in equivalent else statuses[name]
        print(f"--- {mark}: {name}\n{diff.strip()}\n")
    return caught, counted, seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="modules to mutate (default: all mapped)")
    parser.add_argument("--max-children", type=int, default=1,
                        help="parallel mutant runs (default 1: the machine is shared)")
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
    totals = [run_module(m, mapping[m], base, args.max_children) for m in modules]
    caught, counted = sum(t[0] for t in totals), sum(t[1] for t in totals)
    print(f"total: {caught}/{counted} killed "
          f"({100.0 * caught / max(counted, 1):.1f}%), {sum(t[2] for t in totals):.0f} s")


if __name__ == "__main__":
    main()
