"""Validate tells the truth: a hand-in that breaks an assignment's rules on library calls
fails nbgrader's Validate with the rule, in the grader's words, before it is handed in."""

import subprocess
import sys

import nbformat
import pytest

from autograder.authoring import rules_cell
from autograder.grading import forbidden
from conftest import REPO
from normref.checks import recipe_probes

WITH_RULES = ["01_the_recipe", "02_rows_versus_columns", "03_pytorch_layernorm",
              "04_backward_pass"]

# One answer per assignment that is correct but breaks its rule, as a student might
# write it; the cell it replaces in the perfect sample hand-in, and the rule's cell.
RULE_BREAKERS = {
    "01_the_recipe": ("token_var_answer", "token_var_correct", '''\
def token_var(x):
    return np.var(np.asarray(x, dtype=np.float64), axis=-1)
'''),
    "02_rows_versus_columns": ("group_norm_answer", "group_norm_correct", '''\
def group_norm(x, num_groups, gamma, beta, eps=1e-5):
    if np.shape(x)[1] % num_groups:
        raise ValueError("channels must split into groups")
    return torch.nn.functional.group_norm(
        torch.as_tensor(x), num_groups, torch.as_tensor(gamma),
        torch.as_tensor(beta), eps).numpy()
'''),
    "03_pytorch_layernorm": ("my_layer_norm_answer", "mln_parameters", '''\
class MyLayerNorm(nn.LayerNorm):
    """Borrowed, not built."""
'''),
    "04_backward_pass": ("rms_answer", "rms_backward_dx", '''\
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


def _rules_namespace(assignment):
    released = nbformat.read(REPO / "release" / assignment / f"{assignment}.ipynb",
                             as_version=4)
    cells = [c for c in released.cells if _grade_id(c) == rules_cell.CELL_ID]
    assert len(cells) == 1, "one rules cell in the release"
    assert cells[0].metadata["nbgrader"]["locked"] and not cells[0].metadata["editable"]
    namespace = {}
    exec(cells[0].source, namespace)
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
    answer_id, graded_id, breaking = RULE_BREAKERS[assignment]
    handin = nbformat.read(REPO / "autograder" / "examples" / assignment / "ada_perfect.ipynb",
                           as_version=4)
    for cell in handin.cells:
        if _grade_id(cell) == answer_id:
            cell.source = breaking
    path = tmp_path / f"{assignment}.ipynb"
    nbformat.write(handin, path)
    done = _validate(path, venv_env)
    assert "Success!" not in done.stdout
    assert "which this exercise forbids. " + forbidden.load_rules(assignment)[graded_id] \
        in " ".join(done.stdout.split()), done.stdout[-3000:]
