"""`python -m autograder new-check` writes a trusted check that works as written: it
passes a correct function, fails a wrong one with the reference's numbers, and refuses
names that are taken or references that do not import."""

import shutil
import subprocess
import sys

import pytest

from autograder.authoring.scaffold import ScaffoldError, scaffold_check
from conftest import REPO


@pytest.fixture
def package(tmp_path):
    shutil.copytree(REPO / "normref", tmp_path / "normref",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "normref"


def _run_check(package, student):
    code = ("import numpy as np\nfrom normref.checks import CheckFailed, check_negated\n"
            f"try:\n    check_negated({student})\nexcept CheckFailed as e:\n"
            "    print('FAILED', e)\nelse:\n    print('PASSED')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=package.parent, env={"PYTHONPATH": str(package.parent),
                                                   "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_scaffolded_check_passes_right_and_fails_wrong_work(package):
    probes, judges = scaffold_check(name="negated", function="negate",
                                    reference="numpy:negative", shapes="3 2,5",
                                    package_dir=package)
    assert probes.name == "negated_probes.py" and judges.name == "negated_judges.py"
    assert "PASSED" in _run_check(package, "lambda x: -x")
    wrong = _run_check(package, "lambda x: x")
    assert "FAILED" in wrong and "negate(x)" in wrong and "expected" in wrong
    lint = subprocess.run([str(REPO / ".venv" / "bin" / "ruff"), "check", "--no-cache",
                           str(probes), str(judges)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


def test_the_scaffold_refuses_what_it_cannot_write(package):
    with pytest.raises(ScaffoldError, match="already exists"):
        scaffold_check(name="token_mean", function="f", reference="numpy:negative",
                       package_dir=package)
    with pytest.raises(ScaffoldError, match="cannot be imported"):
        scaffold_check(name="fresh", function="f", reference="numpy:no_such_thing",
                       package_dir=package)
    with pytest.raises(ScaffoldError, match="lower-case Python name"):
        scaffold_check(name="Bad-Name", function="f", reference="numpy:negative",
                       package_dir=package)
    with pytest.raises(ScaffoldError, match="shapes"):
        scaffold_check(name="fresh", function="f", reference="numpy:negative",
                       shapes="4,x", package_dir=package)
    assert not list((package / "checks").glob("fresh_*"))
