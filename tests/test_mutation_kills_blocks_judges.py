"""More of unit 05's grader-facing checks (normref/checks/blocks_judges.py),
pinned down where tests/test_mutation_kills_blocks.py leaves a gap.

The block judges here are built inside each test with `_block_judge`, not
taken from CHECKS: CHECKS is filled once, when the module is imported, so a
bug put into `_block_judge` afterwards (as `make mutation` does) would not
reach a judge taken from it.
"""

import numpy as np
import pytest
import torch
from test_mutation_kills_blocks import SandwichDetached, SandwichDoubled
from torch import nn

from normref import blocks
from normref.checks import blocks_judges, blocks_probes
from normref.checks.blocks_judges import _judge_make_model
from normref.checks.tolerances import mismatch

CUT_GRAPH = (". The output is right, so look for a .detach(), .data or in-place change "
             "that cuts the graph")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run faster on one thread than on two that share cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _small_case(alpha=None, sandwich=False, d=4, heads=2, d_ff=6):
    rng = np.random.default_rng(0)
    extra = {} if alpha is None else {"alpha": alpha}
    case = blocks_judges._block_case(rng, 2, 3, d, heads, d_ff, **extra)
    if sandwich:
        case.update(blocks_judges._layer_norm(rng, d, "ln1_out"))
        case.update(blocks_judges._layer_norm(rng, d, "ln2_out"))
    return case


def _run(block_class, case):
    return {key: np.asarray(value.detach() if hasattr(value, "detach") else value)
            for key, value in blocks_probes._probe_block(block_class, case).items()}


def _sandwich_judge():
    return blocks_judges._block_judge("sandwich", blocks_judges._diagnose_sandwich)


def _deepnorm_judge():
    return blocks_judges._block_judge("deepnorm", blocks_judges._diagnose_deepnorm)


class SandwichAfterAdd(blocks.SandwichLNBlock):
    def forward(self, x):
        x = self.ln1_out(x + self.attn(self.ln1(x)))
        return self.ln2_out(x + self.mlp(self.ln2(x)))


class DeepNormFirstOnly(blocks.DeepNormBlock):
    def forward(self, x):
        x = self.ln1(self.alpha * x + self.attn(x))
        return self.ln2(x + self.mlp(x))


# ------------------------------------------------------------ the block judges

def test_block_judges_pass_the_right_blocks():
    assert _sandwich_judge()(_small_case(sandwich=True),
                             _run(blocks.SandwichLNBlock, _small_case(sandwich=True))) is None
    case = _small_case(alpha=1.75)
    assert _deepnorm_judge()(case, _run(blocks.DeepNormBlock, case)) is None


def test_block_judge_names_a_wrong_output_and_its_mistake():
    case = _small_case(sandwich=True)
    got = _run(SandwichAfterAdd, case)
    right = _run(blocks.SandwichLNBlock, case)
    problem = mismatch(got["y"], right["y"], dtype=np.float64, what="your block's output")
    assert problem.startswith("your block's output is [")
    assert _sandwich_judge()(case, got) == (
        problem + ". Hint: ln1_out normalizes the sublayer's output before the add, not the "
                  "sum: the residual path must stay unnormalized")
    case = _small_case(alpha=1.75)
    got = _run(DeepNormFirstOnly, case)
    problem = mismatch(got["y"], _run(blocks.DeepNormBlock, case)["y"], dtype=np.float64,
                       what="your block's output")
    assert _deepnorm_judge()(case, got) == (
        problem + ". Hint: scale the residual in both sublayers: ln2(alpha * x + mlp(x)) too")


def test_block_judge_gives_no_hint_for_an_unknown_mistake():
    case = _small_case(sandwich=True)
    got = _run(SandwichDoubled, case)
    assert _sandwich_judge()(case, got) == mismatch(
        got["y"], _run(blocks.SandwichLNBlock, case)["y"], dtype=np.float64,
        what="your block's output")


def test_block_judge_gives_no_hint_for_an_output_of_another_shape():
    case = _small_case(sandwich=True)
    got = _run(SandwichAfterAdd, case)
    got["y"] = got["y"][:, :2]
    assert _sandwich_judge()(case, got) == (
        "your block's output has shape (2, 2, 4); expected shape (2, 3, 4)")


def test_block_judge_checks_the_gradients_once_the_output_is_right():
    case = _small_case(sandwich=True)
    got, right = _run(SandwichDetached, case), _run(blocks.SandwichLNBlock, case)
    np.testing.assert_array_equal(got["y"], right["y"])
    assert _sandwich_judge()(case, got) == mismatch(
        got["d0"], right["d0"], dtype=np.float64,
        what="the gradient with respect to x") + CUT_GRAPH


# ------------------------------------------------------------ the grader's cases

class Twos:
    """A stand-in for numpy's Generator whose normal() draws are two
    standard deviations above the mean: a scale that multiplies is told
    apart from one that divides."""

    def normal(self, loc=0.0, scale=1.0, size=None):
        return loc + 2 * scale * np.ones(size)


def test_layer_norm_weights_are_one_plus_0_3_sigma_and_biases_0_2_sigma():
    norm = blocks_judges._layer_norm(Twos(), 3, "ln1")
    np.testing.assert_allclose(norm["w:ln1.weight"], np.full(3, 1.6))
    np.testing.assert_allclose(norm["w:ln1.bias"], np.full(3, 0.4))


# ------------------------------------------------------------ make_model

def _model_case(kind, n_layers=2, seed=5):
    inputs, targets = blocks.experiment_batch(seed)
    return {"kind": np.array(kind), "n_layers": np.array(n_layers), "seed": np.array(seed),
            "inputs": inputs.numpy(), "targets": targets.numpy()}


def _names(model):
    return sorted(name for name, _ in model.named_parameters())


def _names_output(names):
    return {"names": np.array("\n".join(names))}


def test_a_parameter_name_with_a_space_is_shown_whole():
    names = _names(blocks.experiment_model("pre", 2, 5))
    message = _judge_make_model(_model_case("pre"), _names_output(names + ["my gain"]))
    assert "unexpected ['my gain'])" in message


@pytest.mark.parametrize("kind, names_change, diff, hint", [
    ("pre", lambda names: [n for n in names if n != "ln_f.bias"],
     "missing ['ln_f.bias'], unexpected []",
     "this kind needs the final LN (final_ln=True): its residual stream is never normalized"),
    ("post", lambda names: sorted(names + ["ln_f.weight"]),
     "missing [], unexpected ['ln_f.weight']",
     "this kind ends every block with an LN already: no final LN (final_ln=False)"),
])
def test_a_final_norm_with_one_parameter_is_named_as_the_final_ln(kind, names_change, diff,
                                                                  hint):
    """A final LN without a bias (bias=False), or an RMSNorm with only a
    gain, shows up as one ln_f parameter: the hint is still the final LN's."""
    names = names_change(_names(blocks.experiment_model(kind, 2, 5)))
    assert _judge_make_model(_model_case(kind), _names_output(names)) == (
        f"your {kind} model's parameters differ from the expected ones ({diff}). "
        f"Hint: {hint}")


def _float32_close(values):
    """Values as a float32 computation would give them: off by 2e-5 relative,
    inside float32's tolerance, outside float64's."""
    return np.asarray(values) * (1 + 2e-5)


def test_an_initialization_slip_in_float32_is_still_named():
    case = _model_case("pre")
    model = blocks.experiment_model("pre", 2, 5)
    wrong = blocks.experiment_model("pre", 2, 6)
    output = {**_names_output(_names(model)),
              "param_norms": _float32_close(blocks_judges._param_norms(wrong))}
    problem = mismatch(output["param_norms"], blocks_judges._param_norms(model),
                       dtype="float32",
                       what="the norms of your pre model's parameters after initialization")
    assert _judge_make_model(case, output) == (
        f"{problem}. Hint: initialize with init_like_xiong(model, seed), with the seed you "
        "are given")


def test_swapped_pre_and_post_norms_in_float32_are_still_named():
    case = _model_case("pre")
    model = blocks.experiment_model("pre", 2, 5)
    other = blocks.experiment_model("post", 2, 5)
    output = {**_names_output(_names(model)),
              "param_norms": blocks_judges._param_norms(model),
              "norms": _float32_close(blocks_judges._norms(other, case))}
    problem = mismatch(output["norms"], blocks_judges._norms(model, case), dtype="float32",
                       what="the gradient norms of your pre model's blocks")
    assert _judge_make_model(case, output) == (
        f"{problem}. Hint: those are the norms of a post model: 'pre' takes PreLNBlock")


# ------------------------------------------------------------ the student's own table

def test_own_answers_work_out_float32_profiles_in_float64():
    profiles = {kind: np.linspace(1.0, 0.1 * (i + 1), 8).astype(np.float32)
                for i, kind in enumerate(blocks_judges.KINDS)}
    own = blocks_judges._own_answers({f"own:{kind}": p for kind, p in profiles.items()})
    as_f64 = {kind: p.astype(np.float64) for kind, p in profiles.items()}
    expected = float(as_f64["sandwich"][-1] / as_f64["pre"][-1])
    assert expected != float(profiles["sandwich"][-1] / profiles["pre"][-1])
    assert own["sandwich_over_pre"] == expected
    assert own == blocks_judges._answers_from(as_f64)


def test_model_layer_norm_has_both_parameters():
    """The names above come from the real model: its final LN has a gain and a bias."""
    assert {"ln_f.weight", "ln_f.bias"} <= set(_names(blocks.experiment_model("pre", 2, 5)))
    assert isinstance(blocks.experiment_model("post", 2, 5).ln_f, nn.Identity)
