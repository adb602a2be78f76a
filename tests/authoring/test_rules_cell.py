"""Validate tells the truth: a hand-in that breaks an assignment's rules on library calls
fails nbgrader's Validate with the rule, in the grader's words, before it is handed in."""

import json
import statistics
import subprocess
import sys

import nbformat
import numpy as np
import pytest
import torch

from autograder.authoring import rules_cell
from autograder.grading import forbidden
from conftest import REPO
from normref.checks import recipe_probes

WITH_RULES = ["01_the_recipe", "02_rows_versus_columns", "03_pytorch_layernorm",
              "04_backward_pass"]

# One answer per assignment that is correct but breaks its rule, as a student might
# write it; the cell it replaces in the perfect sample hand-in, the rule's cell, and
# what Validate says the answer used: the names the student wrote.
RULE_BREAKERS = {
    "01_the_recipe": ("token_var_answer", "token_var_correct", "numpy.var", '''\
def token_var(x):
    return np.var(np.asarray(x, dtype=np.float64), axis=-1)
'''),
    "02_rows_versus_columns": ("group_norm_answer", "group_norm_correct",
                               "torch.nn.functional.group_norm", '''\
def group_norm(x, num_groups, gamma, beta, eps=1e-5):
    if np.shape(x)[1] % num_groups:
        raise ValueError("channels must split into groups")
    return torch.nn.functional.group_norm(
        torch.as_tensor(x), num_groups, torch.as_tensor(gamma),
        torch.as_tensor(beta), eps).numpy()
'''),
    "03_pytorch_layernorm": ("my_layer_norm_answer", "mln_parameters",
                             "torch.nn.LayerNorm", '''\
class MyLayerNorm(nn.LayerNorm):
    """Borrowed, not built."""
'''),
    "04_backward_pass": ("rms_answer", "rms_backward_dx",
                         "autograd, torch.Tensor.backward", '''\
def rms_norm_backward(dy, x, gamma, eps=1e-5):
    x = torch.tensor(x, requires_grad=True)
    g = torch.tensor(gamma, requires_grad=True)
    y = g * x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps)
    y.backward(torch.as_tensor(dy))
    return x.grad.numpy(), g.grad.numpy()
'''),
}


def _grade_id(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _released_rules_cell(assignment):
    released = nbformat.read(REPO / "release" / assignment / f"{assignment}.ipynb",
                             as_version=4)
    cells = [c for c in released.cells if _grade_id(c) == rules_cell.CELL_ID]
    assert len(cells) == 1, "one rules cell in the release"
    assert cells[0].metadata["nbgrader"]["locked"] and not cells[0].metadata["editable"]
    return cells[0].source


def _rules_namespace(assignment):
    namespace = {}
    exec(_released_rules_cell(assignment), namespace)
    return namespace


@pytest.mark.parametrize("assignment", WITH_RULES)
def test_the_released_rules_are_the_graders_policy(assignment):
    rules = _rules_namespace(assignment)["RULES"]
    assert {gid: rule["forbidden"] for gid, rule in rules.items()} == \
        forbidden.load_policy(assignment)
    assert {gid: rule["rule"] for gid, rule in rules.items()} == \
        forbidden.load_rules(assignment)


def test_the_variance_functions_validate_refuses_are_the_ones_the_check_refuses():
    rule = _rules_namespace("01_the_recipe")["RULES"]["token_var_correct"]
    refused_by_the_check = {**recipe_probes._LIBRARY_VARIANCE, **recipe_probes._MASKED_VARIANCE}
    assert {where: tuple(names) for where, names in rule["library_functions"].items()} == \
        refused_by_the_check


def test_a_pattern_covers_a_name_in_validate_exactly_when_it_does_in_the_grader():
    covered = _rules_namespace("04_backward_pass")["_covered"]
    patterns = sorted({p for a in WITH_RULES for ps in forbidden.load_policy(a).values()
                       for p in ps})
    names = ["autograd", "torch.autograd.grad", "torch.autograd_extra", "torch.Tensor.backward",
             "aten::native_layer_norm", "aten::native_layer_norm.default",
             "aten::native_layer_norm_backward", "torch.nn.functional.layer_norm",
             "torch.nn.modules.normalization.LayerNorm", "torch.nn.modules.batchnorm.BatchNorm1d",
             "torch.var", "torch.var_mean", "torch.Tensor.var", "torch.Tensor.variance",
             "aten::var", "aten::var_mean.correction", "torch.func.grad", "torch.functional",
             "aten::_native_batch_norm_legit", "torch.nn.functional.local_response_norm",
             "torch.mean", "aten::mean.dim", "torch.cov", "aten::corrcoef"]
    for pattern in patterns:
        for name in names:
            assert covered(pattern, name) == forbidden.pattern_matches(pattern, name), \
                (pattern, name)


def test_follows_rules_returns_nothing_so_a_test_cell_ending_with_it_prints_nothing():
    follows_rules = _rules_namespace("03_pytorch_layernorm")["follows_rules"]
    assert follows_rules("mln_forward", lambda: torch.ones(3)) is None


# What a student may write, and the name Validate must give it: the public one,
# whatever numpy or torch runs inside (np.std runs numpy's _methods._std and _var).
CALLS_AS_WRITTEN = [
    ("numpy.var(far, axis=-1)", "numpy.var"),
    ("far.var(axis=-1)", "numpy.var"),
    ("numpy.std(far, axis=-1)", "numpy.std"),
    ("numpy.nanvar(far, axis=-1)", "numpy.nanvar"),
    ("numpy.nanstd(far, axis=-1)", "numpy.nanstd"),
    ("numpy.cov(far)", "numpy.cov"),
    ("numpy.corrcoef(far)", "numpy.corrcoef"),
    ("numpy.ma.var(numpy.ma.masked_invalid(far), axis=-1)", "numpy.ma.var"),
    ("numpy.ma.std(numpy.ma.masked_invalid(far), axis=-1)", "numpy.ma.std"),
    ("statistics.pvariance(list(far[0]))", "statistics.pvariance"),
    ("statistics.stdev(list(far[0]))", "statistics.stdev"),
    ("torch.masked.var(torch.tensor(far), -1, mask=torch.ones(far.shape, dtype=bool))",
     "torch.masked.var"),
    ("torch.masked.std(torch.tensor(far), -1, mask=torch.ones(far.shape, dtype=bool))",
     "torch.masked.std"),
    ("torch.var(torch.tensor(far), -1)", "torch.var"),
    ("torch.tensor(far).std(-1)", "torch.Tensor.std"),
    ("torch.nn.functional.layer_norm(torch.tensor(far), (64,))",
     "torch.nn.functional.layer_norm"),
    ("torch.nn.LayerNorm(64, dtype=torch.float64)(torch.tensor(far))",
     "torch.nn.LayerNorm, torch.nn.functional.layer_norm"),
]


@pytest.mark.parametrize("call, as_written", CALLS_AS_WRITTEN, ids=[c for c, _ in CALLS_AS_WRITTEN])
def test_validate_names_what_the_student_called_not_the_librarys_internals(call, as_written):
    namespace = _rules_namespace("01_the_recipe")
    far = np.random.default_rng(1).normal(size=(3, 64))
    scope = {"numpy": np, "torch": torch, "statistics": statistics, "far": far}
    for name in as_written.split(", "):  # each a name the student can call
        assert callable(eval(name, scope)), name
    with pytest.raises(AssertionError) as refused:
        namespace["follows_rules"]("token_var_correct", lambda: eval(call, scope))
    said = " ".join(str(refused.value).split())
    assert said.startswith(f"while this test called your code, it used {as_written}, "
                           f"which this exercise forbids."), said


def test_a_policy_listing_a_library_function_validate_cannot_name_is_refused(tmp_path):
    policy = {"cells": {"token_var_correct": {
        "rule": "While the grader calls your token_var, it must not run numpy's var.",
        "forbidden": ["torch.var"], "library_functions": {"_methods": ["_var", "_mean"]}}}}
    (tmp_path / "01_the_recipe.json").write_text(json.dumps(policy))
    with pytest.raises(ValueError, match="_mean of _methods.*NAMES_AS_WRITTEN"):
        rules_cell.rules_source("01_the_recipe", policies_dir=tmp_path)


def test_a_release_whose_rules_cell_is_missing_is_refused(tmp_path):
    notebook = nbformat.read(REPO / "source" / "01_the_recipe" / "01_the_recipe.ipynb",
                             as_version=4)
    notebook.cells = [c for c in notebook.cells if _grade_id(c) != rules_cell.CELL_ID]
    path = tmp_path / "01_the_recipe.ipynb"
    nbformat.write(notebook, path)
    with pytest.raises(ValueError, match="course_rules"):
        rules_cell.refresh(path, "01_the_recipe")


def _validate(path, env):
    return subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(path)],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("assignment", WITH_RULES)
def test_validate_fails_with_the_rule_on_a_hand_in_that_breaks_it(assignment, tmp_path,
                                                                   venv_env):
    answer_id, graded_id, as_written, breaking = RULE_BREAKERS[assignment]
    handin = nbformat.read(REPO / "autograder" / "examples" / assignment / "ada_perfect.ipynb",
                           as_version=4)
    for cell in handin.cells:
        if _grade_id(cell) == answer_id:
            cell.source = breaking
    path = tmp_path / f"{assignment}.ipynb"
    nbformat.write(handin, path)
    done = _validate(path, venv_env)
    assert "Success!" not in done.stdout
    said = " ".join(done.stdout.split())
    assert f"it used {as_written}, which this exercise forbids. " \
        + forbidden.load_rules(assignment)[graded_id] in said, done.stdout[-3000:]


@pytest.mark.parametrize("assignment", WITH_RULES)
def test_the_rules_cell_opens_folded_under_its_title_in_jupyterlab_and_colab(assignment):
    released = nbformat.read(REPO / "release" / assignment / f"{assignment}.ipynb",
                             as_version=4)
    cell, = [c for c in released.cells if _grade_id(c) == rules_cell.CELL_ID]
    # JupyterLab folds a cell whose metadata says source_hidden; Colab shows a "form"
    # cell as its #@title line (https://colab.research.google.com/notebooks/forms.ipynb)
    assert cell.metadata["jupyter"]["source_hidden"] is True
    assert cell.metadata["cellView"] == "form"
    title, *summary = cell.source.splitlines()[:4]
    assert title.startswith("#@title ") and "rules on library calls" in title
    assert all(line.startswith("# ") for line in summary)


def _in_a_fresh_interpreter(assignment, body):
    """Run the released rules cell of `assignment`, then `body`, in a new Python
    (this test process has torch imported already); returns what it printed."""
    done = subprocess.run([sys.executable, "-c", _released_rules_cell(assignment) + "\n" + body],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_validating_numpy_code_does_not_import_torch():
    """A numpy-only notebook's test cells must not pay torch's import (seconds, and on
    a busy machine a cell's whole time limit) just to watch for torch calls."""
    said = _in_a_fresh_interpreter("01_the_recipe", """
import numpy as np
follows_rules("token_var_correct", lambda: np.ones((3, 4)).sum(-1))
print("torch imported:", "torch" in sys.modules)
""")
    assert "torch imported: False" in said


def test_a_call_that_imports_torch_itself_is_still_held_to_the_rules():
    said = _in_a_fresh_interpreter("01_the_recipe", """
import numpy as np

def token_var(x):
    import torch
    return torch.var(torch.as_tensor(x), -1, correction=0).numpy()

try:
    follows_rules("token_var_correct", lambda: token_var(np.ones((3, 4))))
except AssertionError as refused:
    print(" ".join(str(refused).split()))
""")
    assert "it used torch.var, which this exercise forbids" in said
