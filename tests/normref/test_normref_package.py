"""normref's package surface, and the client half that enters the sandbox."""

import subprocess
import sys

import pytest

import normref
from autograder.grading.sandbox import write_client_package
from normref.checks import _registry


@pytest.mark.parametrize("name", normref.__all__)
def test_every_top_level_name_resolves(name):
    assert callable(getattr(normref, name))


def test_every_check_has_a_judge_and_the_reference_passes_its_own_inputs():
    names = _registry.check_names()
    assert len(names) == len(set(names)) and len(names) >= 5
    for name in names:
        cases = _registry.make_cases(name, seed=3)
        assert cases, f"{name} makes no cases"


def test_client_package_holds_no_reference_code(tmp_path):
    write_client_package(tmp_path)
    shipped = sorted(p.name for p in (tmp_path / "normref").rglob("*.py"))
    assert not [n for n in shipped if n.endswith("_judges.py")]
    assert "recipe.py" not in shipped and "tolerances.py" not in shipped
    probe = ("import normref, normref.checks as c; print(hasattr(c, 'check_layer_norm_batches'));"
             "\ntry:\n    normref.layer_norm\nexcept Exception as e:\n    print(type(e).__name__)")
    done = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, "
                           f"{str(tmp_path)!r}); exec({probe!r})"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.split() == ["True", "AttributeError"], done.stderr
