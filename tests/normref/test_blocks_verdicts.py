"""Unit 05's checks (sandwich-LN, DeepNorm, DeepNet's init, the experiment),
pinned down to the verdict and the sentence a student reads.

Each test fails on a small bug in normref/checks/blocks_judges.py or
normref/checks/blocks_probes.py (a case changed, a branch dropped, a hint
given for the wrong mistake, a word of the feedback changed): see `make
mutation`. The judges are called directly, on outputs of tiny blocks written
here the way students get them wrong.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normref import blocks
from normref.checks import (
    CheckFailed,
    blocks_judges,
    blocks_probes,
    check_gradient_profile,
    check_make_model,
)
from normref.checks.blocks_judges import (
    _judge_deepnorm_scale,
    _judge_make_model,
)
from normref.checks.tolerances import mismatch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run faster on one thread than on two that share cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class KnownDraws:
    """A stand-in for numpy's Generator whose draws are known: normal() is one
    standard deviation above the mean everywhere, integers() its largest value."""

    def normal(self, loc=0.0, scale=1.0, size=None):
        return loc + scale * np.ones(size)

    def integers(self, high):
        return high - 1


def _as_arrays(result):
    return {key: np.asarray(value.detach() if hasattr(value, "detach") else value)
            for key, value in result.items()}


def _small_case(seed=0, alpha=None, sandwich=False, d=4, heads=2, d_ff=6, seq_len=3):
    rng = np.random.default_rng(seed)
    extra = {} if alpha is None else {"alpha": alpha}
    case = blocks_judges._block_case(rng, 2, seq_len, d, heads, d_ff, **extra)
    if sandwich:
        case.update(blocks_judges._layer_norm(rng, d, "ln1_out"))
        case.update(blocks_judges._layer_norm(rng, d, "ln2_out"))
    return case


def _run(block_class, case):
    return _as_arrays(blocks_probes._probe_block(block_class, case))


# ------------------------------------------------------------ probes: loading weights

def test_weights_are_the_cases_w_entries():
    case = {"w:ln1.weight": 1, "w:attn.qkv.bias": 2, "x": 3, "dy": 4, "d_model": 5}
    assert blocks_probes._weights(case) == {"ln1.weight": 1, "attn.qkv.bias": 2}


def test_load_by_contract_copies_the_weights_in_float64():
    layer = nn.Linear(2, 3)
    weights = {"weight": np.arange(6.0).reshape(3, 2), "bias": np.array([1.0, -1.0, 0.5])}
    params = blocks_probes._load_by_contract(layer, weights, "your layer")
    assert set(params) == {"weight", "bias"} and params["weight"] is layer.weight
    assert layer.weight.dtype == torch.float64
    assert layer.weight.tolist() == weights["weight"].tolist()
    assert layer.bias.tolist() == [1.0, -1.0, 0.5]


def test_load_by_contract_names_missing_and_unexpected_parameters():
    """The contract's names the module lacks, and the module's names the contract
    does not have, sorted, then the contract itself."""
    layer = nn.Linear(2, 3)
    weights = {"weight": np.zeros((3, 2)), "w2": np.zeros(1), "w1": np.zeros(1)}
    with pytest.raises(ValueError) as caught:
        blocks_probes._load_by_contract(layer, weights, "your block", "The contract is: C.")
    assert str(caught.value) == (
        "your block's parameters do not follow the naming contract: missing ['w1', 'w2']; "
        "unexpected ['bias']. The contract is: C.")
    with pytest.raises(ValueError) as caught:
        blocks_probes._load_by_contract(layer, {"weight": np.zeros((3, 2))}, "the test block")
    assert str(caught.value) == ("the test block's parameters do not follow the naming "
                                 "contract: unexpected ['bias'].")
    with pytest.raises(ValueError) as caught:
        blocks_probes._load_by_contract(layer, {**weights, "bias": np.zeros(3)}, "your block")
    assert str(caught.value) == ("your block's parameters do not follow the naming contract: "
                                 "missing ['w1', 'w2'].")


def test_load_by_contract_names_a_parameter_of_the_wrong_shape():
    layer = nn.Linear(2, 3)
    weights = {"weight": np.zeros((2, 3)), "bias": np.zeros(3)}
    with pytest.raises(ValueError) as caught:
        blocks_probes._load_by_contract(layer, weights, "your block", "The contract is: C.")
    assert str(caught.value) == ("your block's parameter weight has shape (3, 2); the contract "
                                 "gives it shape (2, 3). The contract is: C.")
    with pytest.raises(ValueError) as caught:
        blocks_probes._load_by_contract(layer, weights, "your block")
    assert str(caught.value).endswith("the contract gives it shape (2, 3).")
    assert layer.weight.dtype == torch.float64


# ------------------------------------------------------------ probes: forward and backward

class _TwoInputs(nn.Module):
    """y = a * x + b, with an integer input t (no gradient), c never used, x2 unused."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor([2.0, 3.0], dtype=torch.float64))
        self.b = nn.Parameter(torch.tensor([0.5, -1.0], dtype=torch.float64))
        self.c = nn.Parameter(torch.zeros(2, dtype=torch.float64))

    def forward(self, x, t, x2):
        return self.a * x + self.b + t


def test_forward_backward_reports_output_and_every_gradient():
    """dy weights the output; a parameter the forward never used gets NaN, an
    unused float input gets zeros, an integer input gets nothing."""
    module = _TwoInputs()
    params = dict(module.named_parameters())
    x, t, x2 = np.array([1.0, 4.0]), np.array([1, 2]), np.array([5.0, 6.0])
    dy = np.array([10.0, 100.0])
    result = _as_arrays(blocks_probes._forward_backward(module, params, [x, t, x2], dy))
    assert set(result) == {"y", "d0", "d2", "g:a", "g:b", "g:c"}
    np.testing.assert_array_equal(result["y"], [3.5, 13.0])
    np.testing.assert_array_equal(result["d0"], [20.0, 300.0])
    np.testing.assert_array_equal(result["d2"], [0.0, 0.0])
    np.testing.assert_array_equal(result["g:a"], [10.0, 400.0])
    np.testing.assert_array_equal(result["g:b"], [10.0, 100.0])
    assert np.isnan(result["g:c"]).all() and result["g:c"].shape == (2,)
    assert x.tolist() == [1.0, 4.0], "the case's arrays are not the tensors handed out"


def test_forward_backward_stops_at_a_wrong_shape_or_a_non_tensor():
    module = _TwoInputs()
    params = dict(module.named_parameters())
    inputs = [np.array([1.0, 4.0]), np.array([1, 2]), np.zeros(2)]
    result = blocks_probes._forward_backward(module, params, inputs, np.zeros(3))
    assert set(result) == {"y"} and not result["y"].requires_grad
    assert module.a.grad is None

    class Listy(nn.Module):
        def forward(self, x):
            return [x]

    with pytest.raises(TypeError, match="^forward returned a list, not a tensor$"):
        blocks_probes._forward_backward(Listy(), {}, [np.zeros(2)], np.zeros(2))


def test_block_args_with_and_without_alpha():
    case = {"d_model": np.array(8), "n_heads": np.array(2), "d_ff": np.array(32)}
    assert blocks_probes._block_args(case) == [8, 2, 32]
    assert blocks_probes._block_args({**case, "alpha": np.array(1.75)}) == [8, 2, 32, 1.75]
    assert all(type(a) is int for a in blocks_probes._block_args(case))
    assert type(blocks_probes._block_args({**case, "alpha": np.array(2)})[-1]) is float


def test_probe_block_names_the_contract_of_the_exercise():
    with pytest.raises(ValueError) as caught:
        blocks_probes._probe_block(blocks.PreLNBlock, _small_case(sandwich=True))
    assert str(caught.value) == (
        "your block's parameters do not follow the naming contract: missing ['ln1_out.bias', "
        "'ln1_out.weight', 'ln2_out.bias', 'ln2_out.weight']. The contract is: "
        f"{blocks_probes.SANDWICH_CONTRACT}.")
    class DeepSandwich(blocks.SandwichLNBlock):
        def __init__(self, d_model, n_heads, d_ff, alpha):
            super().__init__(d_model, n_heads, d_ff)

    with pytest.raises(ValueError) as caught:
        blocks_probes._probe_block(DeepSandwich, _small_case(alpha=1.5))
    assert str(caught.value).endswith(f"The contract is: {blocks_probes.BLOCK_CONTRACT}.")
    assert blocks_probes.SANDWICH_CONTRACT.startswith(blocks_probes.BLOCK_CONTRACT + ", ln1_out")


def test_probe_block_runs_in_eval_mode_in_float64():
    seen = {}

    class Watched(blocks.DeepNormBlock):
        def forward(self, x):
            seen["training"], seen["dtype"] = self.training, x.dtype
            return super().forward(x)

    case = _small_case(alpha=1.5)
    result = _run(Watched, case)
    assert seen == {"training": False, "dtype": torch.float64}
    reference = blocks.DeepNormBlock(4, 2, 6, 1.5).double()
    with torch.no_grad():
        for name, p in reference.named_parameters():
            p.copy_(torch.from_numpy(case[f"w:{name}"]))
        np.testing.assert_allclose(result["y"], reference(torch.from_numpy(case["x"])).numpy(),
                                   rtol=1e-12)


# ------------------------------------------------------------ cases

def test_weight_helpers_draw_each_parameter_at_its_scale():
    """Linear weights N(0, 1/fan_in), biases N(0, 0.1); LN gains 1 + N(0, 0.3),
    LN biases N(0, 0.2): one standard deviation up, from KnownDraws."""
    linear = blocks_judges._linear(KnownDraws(), 3, 4, "mlp.fc")
    assert set(linear) == {"w:mlp.fc.weight", "w:mlp.fc.bias"}
    np.testing.assert_array_equal(linear["w:mlp.fc.weight"], np.full((3, 4), 0.5))
    np.testing.assert_allclose(linear["w:mlp.fc.bias"], np.full(3, 0.1))
    norm = blocks_judges._layer_norm(KnownDraws(), 5, "ln2")
    assert set(norm) == {"w:ln2.weight", "w:ln2.bias"}
    np.testing.assert_allclose(norm["w:ln2.weight"], np.full(5, 1.3))
    np.testing.assert_allclose(norm["w:ln2.bias"], np.full(5, 0.2))


def test_block_weights_follow_the_contract():
    weights = blocks_judges._block_weights(KnownDraws(), 4, 6)
    shapes = {f"w:{name}": tuple({"d": 4, "3d": 12, "f": 6}[s] for s in shape)
              for name, shape in blocks.BLOCK_PARAMETER_SHAPES.items()}
    assert {k: v.shape for k, v in weights.items()} == shapes
    np.testing.assert_array_equal(weights["w:mlp.proj.weight"], np.full((4, 6), 6 ** -0.5))
    np.testing.assert_array_equal(weights["w:attn.qkv.weight"], np.full((12, 4), 0.5))


def test_block_case_holds_sizes_inputs_and_extras():
    case = blocks_judges._block_case(KnownDraws(), 2, 3, 4, 2, 6, offset=5.0, alpha=1.25)
    assert {k: case[k].tolist() for k in ("d_model", "n_heads", "d_ff", "alpha")} == {
        "d_model": 4, "n_heads": 2, "d_ff": 6, "alpha": 1.25}
    np.testing.assert_array_equal(case["x"], np.full((2, 3, 4), 6.0))
    np.testing.assert_array_equal(case["dy"], np.ones((2, 3, 4)))
    assert "w:ln1.weight" in case and "alpha" not in blocks_judges._block_case(
        KnownDraws(), 1, 1, 4, 1, 4)


def _case_summary(case):
    return (case["x"].shape, int(case["d_model"]), int(case["n_heads"]), int(case["d_ff"]),
            float(case["x"].mean()))


def test_sandwich_cases_are_what_their_labels_say():
    cases = blocks_judges._sandwich_cases(KnownDraws())
    assert [label for label, _ in cases] == [
        "one sequence of 5 tokens, d = 8, 2 heads, d_ff = 32",
        "3 sequences of 7 tokens, d = 16, 4 heads, d_ff = 24",
        "2 sequences of 6 tokens far from zero (x = 5 + N(0, 1)), d = 12, 3 heads, d_ff = 20",
        "a single token, d = 8, 1 head, d_ff = 16",
    ]
    assert [_case_summary(c) for _, c in cases] == [
        ((1, 5, 8), 8, 2, 32, 1.0), ((3, 7, 16), 16, 4, 24, 1.0), ((2, 6, 12), 12, 3, 20, 6.0),
        ((2, 1, 8), 8, 1, 16, 1.0)]
    for _, case in cases:
        np.testing.assert_allclose(case["w:ln1_out.weight"], 1.3)
        np.testing.assert_allclose(case["w:ln2_out.bias"], 0.2)
        assert case["w:ln2_out.weight"].shape == (int(case["d_model"]),)
        assert "alpha" not in case


def test_deepnorm_cases_are_what_their_labels_say():
    cases = blocks_judges._deepnorm_cases(KnownDraws())
    assert [label for label, _ in cases] == [
        "one sequence of 5 tokens, d = 8, 2 heads, d_ff = 32, alpha = 1.75",
        "3 sequences of 7 tokens, d = 16, 4 heads, d_ff = 24, alpha = 2.875",
        "2 sequences of 6 tokens far from zero (x = 5 + N(0, 1)), d = 12, 3 heads, "
        "d_ff = 20, alpha = 1.25",
        "a single token, d = 8, 1 head, d_ff = 16, alpha = 1 (plain Post-LN)",
    ]
    assert [_case_summary(c) for _, c in cases] == [
        ((1, 5, 8), 8, 2, 32, 1.0), ((3, 7, 16), 16, 4, 24, 1.0), ((2, 6, 12), 12, 3, 20, 6.0),
        ((2, 1, 8), 8, 1, 16, 1.0)]
    assert [float(c["alpha"]) for _, c in cases] == [1.75, 2.875, 1.25, 1.0]
    assert not any("w:ln1_out.weight" in c for _, c in cases)


def test_deepnorm_scale_cases_are_what_their_labels_say():
    cases = blocks_judges._deepnorm_scale_cases(KnownDraws())
    assert [label for label, _ in cases] == ["d = 8, d_ff = 32, beta = 0.35",
                                             "d = 6, d_ff = 10, beta = 0.5"]
    assert [(int(c["d_model"]), int(c["d_ff"]), float(c["beta"])) for _, c in cases] == [
        (8, 32, 0.35), (6, 10, 0.5)]
    assert cases[1][1]["w:mlp.fc.weight"].shape == (10, 6)


def test_make_model_cases_one_per_kind_with_its_batch():
    cases = blocks_judges._make_model_cases(KnownDraws())
    assert [label for label, _ in cases] == [f"{kind}, 3 blocks, seed 99999" for kind in
                                             ("pre", "post", "sandwich", "deepnorm")]
    inputs, targets = blocks.experiment_batch(99999)
    for kind, (_, case) in zip(("pre", "post", "sandwich", "deepnorm"), cases):
        assert (str(case["kind"]), int(case["n_layers"]), int(case["seed"])) == (kind, 3, 99999)
        np.testing.assert_array_equal(case["inputs"], inputs.numpy())
        np.testing.assert_array_equal(case["targets"], targets.numpy())


def test_the_sweep_case_gives_the_probe_the_sweep_it_asks_warmup_lr_about():
    [(label, case)] = blocks_judges._warmup_sweep_cases(None)
    assert label == "the rates at which the toy fails"
    assert case["rates"].tolist() == list(blocks.SWEEP["rates"])
    assert int(case["warmup_steps"]) == blocks.SWEEP["warmup_steps"]
    assert int(case["steps"]) == blocks.SWEEP["steps"]


# ------------------------------------------------------------ sandwich-LN verdicts

class SandwichAfterAdd(blocks.SandwichLNBlock):
    def forward(self, x):
        x = self.ln1_out(x + self.attn(self.ln1(x)))
        return self.ln2_out(x + self.mlp(self.ln2(x)))


class SandwichUnused(blocks.SandwichLNBlock):
    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class SandwichSwapped(blocks.SandwichLNBlock):
    def forward(self, x):
        x = x + self.ln2_out(self.attn(self.ln1(x)))
        return x + self.ln1_out(self.mlp(self.ln2(x)))


class SandwichNoInputNorms(blocks.SandwichLNBlock):
    def forward(self, x):
        x = x + self.ln1_out(self.attn(x))
        return x + self.ln2_out(self.mlp(x))


class SandwichDoubled(blocks.SandwichLNBlock):
    def forward(self, x):
        return 2 * super().forward(x)


class SandwichDetached(blocks.SandwichLNBlock):
    def forward(self, x):
        x = x + self.ln1_out(self.attn(self.ln1(x))).detach()
        return x + self.ln2_out(self.mlp(self.ln2(x)))


class SandwichBiasDetached(blocks.SandwichLNBlock):
    def forward(self, x):
        x = x + self.ln1_out(self.attn(self.ln1(x)))
        h = self.mlp(self.ln2(x))
        out = self.ln2_out
        return x + F.layer_norm(h, out.normalized_shape, out.weight, out.bias.detach())


class SandwichGradDoubled(blocks.SandwichLNBlock):
    """Right output, and a hook that doubles mlp.proj.bias's gradient."""

    def forward(self, x):
        bias = self.mlp.proj.bias
        if bias.requires_grad and not getattr(self, "_hooked", False):
            bias.register_hook(lambda g: 2 * g)
            self._hooked = True
        return super().forward(x)


SANDWICH_JUDGE = blocks_judges.CHECKS["blocks_sandwich_ln"].judge
DEEPNORM_JUDGE = blocks_judges.CHECKS["blocks_deepnorm"].judge


def _expected(block_class, case):
    return _run(block_class, case)


def test_sandwich_right_block_passes():
    case = _small_case(sandwich=True)
    assert SANDWICH_JUDGE(case, _run(blocks.SandwichLNBlock, case)) is None


@pytest.mark.parametrize("mistake, hint", [
    (SandwichUnused, "normalize each sublayer's output with its own LN before the add: "
                     "x + ln1_out(attn(ln1(x))); as written, ln1_out and ln2_out change "
                     "nothing"),
    (SandwichAfterAdd, "ln1_out normalizes the sublayer's output before the add, not the sum: "
                       "the residual path must stay unnormalized"),
    (SandwichSwapped, "ln1_out belongs to the attention sublayer and ln2_out to the MLP"),
    (SandwichNoInputNorms, "keep Pre-LN's input norms too: each sublayer reads ln1(x) (or "
                           "ln2(x))"),
    (SandwichDoubled, None),
])
def test_sandwich_mistakes_are_named(mistake, hint):
    case = _small_case(sandwich=True)
    got = _run(mistake, case)
    problem = mismatch(got["y"], _expected(blocks.SandwichLNBlock, case)["y"],
                       dtype=np.float64, what="your block's output")
    assert SANDWICH_JUDGE(case, got) == problem + (f". Hint: {hint}" if hint else "")


def test_an_output_of_another_shape_gets_no_hint():
    case = _small_case(sandwich=True)
    got = _run(SandwichUnused, case)
    got["y"] = got["y"][:, :2]
    assert SANDWICH_JUDGE(case, got) == (
        "your block's output has shape (2, 2, 4); expected shape (2, 3, 4)")


def test_sandwich_cut_graph_is_named_on_the_gradients():
    case = _small_case(sandwich=True)
    got, right = _run(SandwichDetached, case), _expected(blocks.SandwichLNBlock, case)
    assert SANDWICH_JUDGE(case, got) == (
        mismatch(got["d0"], right["d0"], dtype=np.float64,
                 what="the gradient with respect to x")
        + ". The output is right, so look for a .detach(), .data or in-place change that "
          "cuts the graph")


def test_a_parameter_the_gradient_never_reaches_is_named():
    case = _small_case(sandwich=True)
    assert SANDWICH_JUDGE(case, _run(SandwichBiasDetached, case)) == (
        "no gradient reached ln2_out.bias: is it used in your forward pass (and not under "
        "torch.no_grad or .detach)?")


def test_a_wrong_parameter_gradient_is_named():
    case = _small_case(sandwich=True)
    got, right = _run(SandwichGradDoubled, case), _expected(blocks.SandwichLNBlock, case)
    np.testing.assert_array_equal(got["d0"], right["d0"])
    assert SANDWICH_JUDGE(case, got) == (
        mismatch(got["g:mlp.proj.bias"], right["g:mlp.proj.bias"], dtype=np.float64,
                 what="the gradient of mlp.proj.bias")
        + ". The output is right, so look for a .detach(), .data or in-place change that "
          "cuts the graph")


def test_nan_input_gradient_is_shown_as_nan():
    """An x-gradient of NaN comes from NaN arithmetic, not from an unused
    parameter: it is shown as such (it used to read "no gradient reached :")."""
    case = _small_case(sandwich=True)
    got = _run(blocks.SandwichLNBlock, case)
    got["d0"] = np.full_like(got["d0"], np.nan)
    message = SANDWICH_JUDGE(case, got)
    assert message.startswith("the gradient with respect to x contains NaN where the answer "
                              "is a number")


# ------------------------------------------------------------ DeepNorm verdicts

class DeepNormOnSublayer(blocks.DeepNormBlock):
    def forward(self, x):
        x = self.ln1(x + self.alpha * self.attn(x))
        return self.ln2(x + self.alpha * self.mlp(x))


class DeepNormAfterNorm(blocks.DeepNormBlock):
    def forward(self, x):
        x = self.alpha * self.ln1(x + self.attn(x))
        return self.alpha * self.ln2(x + self.mlp(x))


class DeepNormPreOrder(blocks.DeepNormBlock):
    def forward(self, x):
        x = self.alpha * x + self.attn(self.ln1(x))
        return self.alpha * x + self.mlp(self.ln2(x))


class DeepNormFirstOnly(blocks.DeepNormBlock):
    def forward(self, x):
        x = self.ln1(self.alpha * x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class DeepNormIgnoresAlpha(blocks.DeepNormBlock):
    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class DeepNormDoubled(blocks.DeepNormBlock):
    def forward(self, x):
        return 2 * super().forward(x)


def test_deepnorm_right_block_passes():
    case = _small_case(alpha=1.75)
    assert DEEPNORM_JUDGE(case, _run(blocks.DeepNormBlock, case)) is None


@pytest.mark.parametrize("mistake, hint", [
    (DeepNormOnSublayer, "alpha multiplies the residual x before the add: "
                         "ln1(alpha * x + attn(x))"),
    (DeepNormAfterNorm, "alpha scales x inside the LN, before the add, not the LN's output"),
    (DeepNormPreOrder, "DeepNorm keeps Post-LN's order: add, then normalize, "
                       "ln1(alpha * x + attn(x))"),
    (DeepNormFirstOnly, "scale the residual in both sublayers: ln2(alpha * x + mlp(x)) too"),
    (DeepNormIgnoresAlpha, "scale the residual by alpha: ln1(alpha * x + attn(x)); this is "
                           "plain Post-LN"),
    (DeepNormDoubled, None),
])
def test_deepnorm_mistakes_are_named(mistake, hint):
    case = _small_case(alpha=1.75)
    got = _run(mistake, case)
    problem = mismatch(got["y"], _expected(blocks.DeepNormBlock, case)["y"],
                       dtype=np.float64, what="your block's output")
    assert DEEPNORM_JUDGE(case, got) == problem + (f". Hint: {hint}" if hint else "")


def test_deepnorm_at_alpha_one_names_no_alpha_mistake():
    """At alpha = 1 every alpha slip is the right answer: a wrong output there
    is something else, and no alpha hint may be given."""
    case = _small_case(alpha=1.0)
    got = _run(DeepNormPreOrder, case)
    assert DEEPNORM_JUDGE(case, got) == mismatch(
        got["y"], _expected(blocks.DeepNormBlock, case)["y"], dtype=np.float64,
        what="your block's output")


# ------------------------------------------------------------ DeepNet's initialization

def _scale_case():
    return blocks_judges._deepnorm_scale_cases(np.random.default_rng(3))[1][1]  # d 6, beta .5


def _after(case, change):
    """{"p:name": array} after `change` (name -> array) applied to the case's weights."""
    weights = {name: value.copy() for name, value in blocks_probes._weights(case).items()}
    change(weights)
    return {f"p:{name}": value for name, value in weights.items()}


def _right_scale(w, beta=0.5, rows=slice(12, 18)):
    w["attn.qkv.weight"][rows] *= beta
    for name in ("attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight"):
        w[name] *= beta


def test_scaled_weights_by_hand():
    case = _scale_case()
    original = blocks_probes._weights(case)
    scaled = blocks_judges._scaled_weights(case, 0.5)
    assert set(scaled) == set(original)
    np.testing.assert_array_equal(scaled["attn.qkv.weight"][:12], original["attn.qkv.weight"][:12])
    np.testing.assert_array_equal(scaled["attn.qkv.weight"][12:],
                                  0.5 * original["attn.qkv.weight"][12:])
    for name in original:
        if name in ("attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight"):
            np.testing.assert_array_equal(scaled[name], 0.5 * original[name])
        elif name != "attn.qkv.weight":
            np.testing.assert_array_equal(scaled[name], original[name])
    np.testing.assert_array_equal(original["attn.proj.weight"],
                                  case["w:attn.proj.weight"]), "the case is left alone"
    for rows, expected in (("queries", slice(0, 6)), ("all", slice(0, 18)), ("none", None)):
        got = blocks_judges._scaled_weights(case, 0.5, qkv_rows=rows, others=())
        want = original["attn.qkv.weight"].copy()
        if expected is not None:
            want[expected] *= 0.5
        np.testing.assert_array_equal(got["attn.qkv.weight"], want)
        np.testing.assert_array_equal(got["mlp.fc.weight"], original["mlp.fc.weight"])


def test_deepnorm_scale_right_answer_passes():
    case = _scale_case()
    assert _judge_deepnorm_scale(case, _after(case, _right_scale)) is None


@pytest.mark.parametrize("change, hint", [
    (lambda w: None,
     "change the block's own weights in place (for example `weight.mul_(beta)` under "
     "torch.no_grad()); a new tensor or a new block is not seen by the model"),
    (lambda w: _right_scale(w, rows=slice(0, 18)),
     "scale only the value rows of attn.qkv.weight (rows 2d to 3d): queries and keys keep "
     "their initialization"),
    (lambda w: _right_scale(w, rows=slice(0, 6)),
     "the values are the last d rows of attn.qkv.weight (queries, keys, values, in that "
     "order)"),
    (lambda w: _right_scale(w, beta=2.0), "multiply by beta, do not divide"),
])
def test_deepnorm_scale_mistakes_are_named(change, hint):
    case = _scale_case()
    assert _judge_deepnorm_scale(case, _after(case, change)) == (
        f"the weights after deepnorm_scale_(block, 0.5) are not right. Hint: {hint}")


def test_deepnorm_scale_biases_changed_too_are_named():
    case = _scale_case()

    def change(w):
        _right_scale(w)
        w["mlp.fc.bias"] *= 0.5
        w["attn.proj.bias"] *= 0.5

    assert _judge_deepnorm_scale(case, _after(case, change)) == (
        "the weights are right, but attn.proj.bias, mlp.fc.bias changed too. Hint: leave the "
        "biases as they are: only the weights are scaled")


def test_deepnorm_scale_one_weight_wrong_is_named_with_what_it_should_be():
    case = _scale_case()
    original = blocks_probes._weights(case)

    def forgets_fc(w):
        _right_scale(w)
        w["mlp.fc.weight"] = original["mlp.fc.weight"].copy()

    got = _after(case, forgets_fc)
    expected = blocks_judges._scaled_weights(case, 0.5)
    assert _judge_deepnorm_scale(case, got) == (
        mismatch(got["p:mlp.fc.weight"], expected["mlp.fc.weight"], dtype=np.float64,
                 what="mlp.fc.weight")
        + ": it should be multiplied by beta (for attn.qkv.weight: its value rows)")

    def scales_ln(w):
        _right_scale(w)
        w["ln1.weight"] *= 0.5
        w["mlp.proj.weight"] *= 3

    got = _after(case, scales_ln)
    assert _judge_deepnorm_scale(case, got) == (
        mismatch(got["p:ln1.weight"], original["ln1.weight"], dtype=np.float64,
                 what="ln1.weight") + ": it should be left as it is")


def test_probe_deepnorm_scale_reports_the_weights_after_the_call():
    case = _scale_case()
    result = _as_arrays(blocks_probes._probe_deepnorm_scale(blocks.deepnorm_scale_, case))
    assert _judge_deepnorm_scale(case, result) is None
    assert result.keys() == _after(case, _right_scale).keys()
    for key, value in _after(case, _right_scale).items():
        np.testing.assert_allclose(result[key], value, rtol=1e-15)
    seen = []
    blocks_probes._probe_deepnorm_scale(lambda block, beta: seen.append((block, beta)), case)
    assert seen[0][1] == 0.5 and type(seen[0][1]) is float


def test_harness_block_looks_like_a_one_head_block():
    """The harness has the contract's submodules and parameter shapes, like a
    real block with one head, so the student's deepnorm_scale_ cannot tell."""
    harness = blocks_probes._harness_block(4, 6)
    real = blocks.PreLNBlock(4, 1, 6)
    assert {n: tuple(p.shape) for n, p in harness.named_parameters()} == {
        n: tuple(p.shape) for n, p in real.named_parameters()}
    assert harness.attn.n_heads == real.attn.n_heads == 1
    assert isinstance(harness.ln1, nn.LayerNorm) and isinstance(harness.mlp.fc, nn.Linear)


# ------------------------------------------------------------ make_model

def _model_case(kind, n_layers=2, seed=5):
    inputs, targets = blocks.experiment_batch(seed)
    return {"kind": np.array(kind), "n_layers": np.array(n_layers), "seed": np.array(seed),
            "inputs": inputs.numpy(), "targets": targets.numpy()}


def _model_output(make_model, case):
    return _as_arrays(blocks_probes._probe_make_model(make_model, case))


def test_probe_make_model_reports_names_norms_alphas_and_gradients():
    case = _model_case("pre")
    model = blocks.experiment_model("pre", 2, 5)
    result = _model_output(blocks.experiment_model, case)
    names = sorted(name for name, _ in model.named_parameters())
    assert str(result["names"]).split("\n") == names
    np.testing.assert_allclose(result["param_norms"],
                               [p.detach().double().norm().item() for _, p in
                                sorted(model.named_parameters())], rtol=1e-12)
    assert result["alphas"].shape == (2,) and np.isnan(result["alphas"]).all()
    batch = (torch.from_numpy(case["inputs"]), torch.from_numpy(case["targets"]))
    np.testing.assert_allclose(result["norms"], blocks.grad_norms_by_layer(model, batch),
                               rtol=1e-12)
    deep = _model_output(blocks.experiment_model, _model_case("deepnorm"))
    np.testing.assert_allclose(deep["alphas"], [blocks.deepnorm_constants(2)[0]] * 2)
    assert "norms" not in deep
    assert "norms" in _model_output(blocks.experiment_model, _model_case("post"))
    assert "norms" not in _model_output(blocks.experiment_model, _model_case("sandwich"))


def _seen_seed(kind, n_layers, seed):
    _seen_seed.args = (kind, n_layers, seed)
    return blocks.experiment_model(kind, n_layers, seed)


def test_probe_make_model_passes_kind_layers_and_seed_as_python_values():
    _model_output(_seen_seed, _model_case("sandwich", 2, 7))
    assert _seen_seed.args == ("sandwich", 2, 7)
    assert [type(a) for a in _seen_seed.args] == [str, int, int]


def _with_final_ln(final_ln):
    def make_model(kind, n_layers, seed):
        model = blocks.experiment_model(kind, n_layers, seed)
        model.ln_f = nn.LayerNorm(64) if final_ln else nn.Identity()
        return model

    return make_model


def test_make_model_right_models_pass():
    for kind in ("pre", "post", "sandwich", "deepnorm"):
        case = _model_case(kind)
        assert _judge_make_model(case, _model_output(blocks.experiment_model, case)) is None


NOTEBOOK_MAKE_MODEL = """
def make_model(kind, n_layers, seed):
    model = blocks.TinyLM(16, 64, n_layers, 4, kind, d_ff=256, max_len=16)
    blocks.init_like_xiong(model, seed)
    if kind == "deepnorm":
        for block in model.blocks:
            deepnorm_scale_(block, blocks.deepnorm_constants(n_layers)[1])
    return model
"""


def _notebook_make_model(deepnorm_scale_):
    """make_model as a notebook defines it: it calls the notebook's
    deepnorm_scale_ by name."""
    namespace = {"blocks": blocks, "deepnorm_scale_": deepnorm_scale_}
    exec(NOTEBOOK_MAKE_MODEL, namespace)
    return namespace


def _scales_every_qkv_row(block, beta):
    with torch.no_grad():
        for linear in (block.attn.qkv, block.attn.proj, block.mlp.fc, block.mlp.proj):
            linear.weight *= beta


def test_make_model_is_judged_apart_from_a_wrong_deepnorm_scale():
    """A deepnorm_scale_ slip costs exercise 3 only: while the grader calls
    make_model, the deepnorm_scale_ it calls is a right one, and the
    notebook's own comes back afterwards."""
    namespace = _notebook_make_model(_scales_every_qkv_row)
    case = _model_case("deepnorm")
    assert _judge_make_model(case, _model_output(namespace["make_model"], case)) is None
    assert namespace["deepnorm_scale_"] is _scales_every_qkv_row


ASSIGNMENT = (Path(__file__).resolve().parents[2]
              / "source" / "05_pre_post_ln" / "05_pre_post_ln.ipynb")
UNFINISHED_BLOCKS = """
class SandwichLNBlock(Block):
    def forward(self, x):
        raise NotImplementedError()


class DeepNormBlock(Block):
    def __init__(self, d_model, n_heads, d_ff, alpha):
        super().__init__(d_model, n_heads, d_ff)
        raise NotImplementedError()
"""


def _assignment_namespace(*cells):
    """The assignment's provided cells, then the given sources, run as the
    notebook runs them (its imports cell aside: it sets the thread count)."""
    notebook = json.loads(ASSIGNMENT.read_text())
    by_id = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"])
             for c in notebook["cells"]}
    namespace = {"math": math, "np": np, "torch": torch, "F": F, "nn": nn}
    for source in (by_id["provided_blocks"], by_id["provided_toy"], *cells):
        exec(by_id.get(source, source), namespace)
    return namespace


def test_make_model_keeps_its_points_while_exercises_1_and_2_are_unfinished():
    """A make_model that is right earns its points even when the blocks it
    builds for sandwich-LN and DeepNorm still raise NotImplementedError: the
    grader builds those two from its harness, and the notebook's own classes
    come back afterwards."""
    namespace = _assignment_namespace(UNFINISHED_BLOCKS, "scale_answer", "model_answer")
    unfinished = namespace["SandwichLNBlock"], namespace["DeepNormBlock"]
    check_make_model(namespace["make_model"])
    assert (namespace["SandwichLNBlock"], namespace["DeepNormBlock"]) == unfinished


def test_scaffold_scale_is_deepnets():
    mine, reference = blocks.DeepNormBlock(8, 2, 16, 2.0), blocks.DeepNormBlock(8, 2, 16, 2.0)
    reference.load_state_dict(mine.state_dict())
    blocks_probes._scale_like_deepnet(mine, 0.3)
    blocks.deepnorm_scale_(reference, 0.3)
    for (name, got), want in zip(mine.named_parameters(), reference.parameters()):
        assert torch.equal(got, want), name


def test_make_model_float32_noise_passes():
    """Norms are compared at float32's tolerance (rtol 1e-4), not float64's."""
    case = _model_case("pre")
    output = _model_output(blocks.experiment_model, case)
    output["param_norms"] = output["param_norms"] * (1 + 2e-5)
    output["norms"] = output["norms"] * (1 + 2e-5)
    assert _judge_make_model(case, output) is None


@pytest.mark.parametrize("kind, final_ln, missing, unexpected, hint", [
    ("sandwich", False, ["ln_f.bias", "ln_f.weight"], [],
     "this kind needs the final LN (final_ln=True): its residual stream is never normalized"),
    ("deepnorm", True, [], ["ln_f.bias", "ln_f.weight"],
     "this kind ends every block with an LN already: no final LN (final_ln=False)"),
])
def test_make_model_final_ln_slips_are_named(kind, final_ln, missing, unexpected, hint):
    case = _model_case(kind)
    assert _judge_make_model(case, _model_output(_with_final_ln(final_ln), case)) == (
        f"your {kind} model's parameters differ from the expected ones (missing {missing}, "
        f"unexpected {unexpected}). Hint: {hint}")


def test_make_model_wrong_blocks_are_named():
    """One block short: the first four missing names are listed."""
    case = _model_case("post", n_layers=2)

    def one_block(kind, n_layers, seed):
        return blocks.experiment_model(kind, n_layers - 1, seed)

    assert _judge_make_model(case, _model_output(one_block, case)) == (
        "your post model's parameters differ from the expected ones (missing "
        "['blocks.1.attn.proj.bias', 'blocks.1.attn.proj.weight', 'blocks.1.attn.qkv.bias', "
        "'blocks.1.attn.qkv.weight'], unexpected []). Hint: build 2 blocks of this kind's "
        "class and pass them to the notebook's TinyLM")
    case = _model_case("pre", n_layers=1)

    def one_more(kind, n_layers, seed):
        return blocks.experiment_model(kind, n_layers + 1, seed)

    assert _judge_make_model(case, _model_output(one_more, case)) == (
        "your pre model's parameters differ from the expected ones (missing [], unexpected "
        "['blocks.1.attn.proj.bias', 'blocks.1.attn.proj.weight', 'blocks.1.attn.qkv.bias', "
        "'blocks.1.attn.qkv.weight']). Hint: build 1 blocks of this kind's class and pass them "
        "to the notebook's TinyLM")


def _variant_model(**changes):
    def make_model(kind, n_layers, seed):
        return blocks_judges._variant(kind, n_layers, seed, **changes)

    return make_model


def test_variant_changes_one_ingredient():
    ref = blocks.experiment_model("deepnorm", 2, 5)
    same = blocks_judges._variant("deepnorm", 2, 5, alpha=blocks.deepnorm_constants(2)[0],
                                  beta=blocks.deepnorm_constants(2)[1])
    assert [n for n, _ in same.named_parameters()] == [n for n, _ in ref.named_parameters()]
    for (_, a), (_, b) in zip(same.named_parameters(), ref.named_parameters()):
        assert torch.equal(a, b)
    assert [blk.alpha for blk in same.blocks] == [blk.alpha for blk in ref.blocks]
    with_ln = blocks_judges._variant("deepnorm", 2, 5, final_ln=True)
    assert isinstance(with_ln.ln_f, nn.LayerNorm)
    assert isinstance(blocks_judges._variant("pre", 2, 5, final_ln=False).ln_f, nn.Identity)
    unscaled = blocks_judges._variant("deepnorm", 2, 5)
    assert not torch.equal(unscaled.blocks[0].mlp.fc.weight, ref.blocks[0].mlp.fc.weight)


def _init_seed_plus_one(kind, n_layers, seed):
    return blocks.experiment_model(kind, n_layers, seed + 1)


def _unscaled_seed_plus_one(kind, n_layers, seed):
    return blocks_judges._variant(kind, n_layers, seed + 1)


def _model_norms_message(case, output, hint=None):
    kind = str(case["kind"])
    model = blocks.experiment_model(kind, int(case["n_layers"]), int(case["seed"]))
    problem = mismatch(output["param_norms"], blocks_judges._param_norms(model),
                       dtype="float32",
                       what=f"the norms of your {kind} model's parameters after initialization")
    return problem + (f". Hint: {hint}" if hint else "")


@pytest.mark.parametrize("kind, make_model, hint", [
    ("pre", _init_seed_plus_one,
     "initialize with init_like_xiong(model, seed), with the seed you are given"),
    ("deepnorm", _unscaled_seed_plus_one,
     "initialize with init_like_xiong(model, seed), with the seed you are given"),
    ("deepnorm", _variant_model(alpha=blocks.deepnorm_constants(2)[0]),
     "apply deepnorm_scale_(block, beta) to every block after init_like_xiong "
     "(initializing afterwards undoes it)"),
    ("deepnorm", _variant_model(alpha=blocks.deepnorm_constants(2)[0],
                                beta=blocks.deepnorm_constants(4)[1]),
     "n_layers counts blocks, not sublayers: take beta from deepnorm_constants(n_layers)"),
    ("sandwich", _variant_model(beta=0.5), None),
])
def test_make_model_initialization_slips_are_named(kind, make_model, hint):
    case = _model_case(kind)
    output = _model_output(make_model, case)
    assert _judge_make_model(case, output) == _model_norms_message(case, output, hint)


def test_param_norms_are_in_sorted_name_order():
    model = nn.Module()
    model.add_module("b", nn.Linear(2, 2, bias=False))
    model.add_module("a", nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        model.b.weight.fill_(1.0)
        model.a.weight.fill_(3.0)
    np.testing.assert_allclose(blocks_judges._param_norms(model), [3.0, 2.0])


def test_make_model_deepnorm_alphas_are_checked():
    case = _model_case("deepnorm")
    output = _model_output(blocks.experiment_model, case)
    alpha = blocks.deepnorm_constants(2)[0]
    for alphas in (np.array([1.0, 1.0]), np.array([alpha, alpha * (1 + 5e-6)]),
                   np.array([alpha])):
        output["alphas"] = alphas
        assert _judge_make_model(case, output) == (
            f"your DeepNorm blocks have alpha {blocks_judges._show(alphas)}; expected "
            f"{alpha:.6g} in each, from deepnorm_constants(2)")
    output["alphas"] = np.array([alpha, alpha * (1 + 1e-7)])
    assert _judge_make_model(case, output) is None


@pytest.mark.parametrize("kind, other", [("pre", "post"), ("post", "pre")])
def test_make_model_swapped_pre_and_post_are_named(kind, other):
    case = _model_case(kind)
    output = _model_output(blocks.experiment_model, case)
    output["norms"] = _model_output(blocks.experiment_model, _model_case(other))["norms"]
    model = blocks.experiment_model(kind, 2, 5)
    problem = mismatch(output["norms"], blocks_judges._norms(model, case), dtype="float32",
                       what=f"the gradient norms of your {kind} model's blocks")
    name = {"pre": "PreLNBlock", "post": "PostLNBlock"}[kind]
    assert _judge_make_model(case, output) == (
        f"{problem}. Hint: those are the norms of a {other} model: '{kind}' takes {name}")
    output["norms"] = output["norms"] * 3
    assert _judge_make_model(case, output) == mismatch(
        output["norms"], blocks_judges._norms(model, case), dtype="float32",
        what=f"the gradient norms of your {kind} model's blocks")


def test_judge_make_model_runs_on_one_thread_and_puts_it_back():
    seen = []

    def spy(case, output):
        seen.append(torch.get_num_threads())

    torch.set_num_threads(2)
    original = blocks_judges._judge_model_norms
    blocks_judges._judge_model_norms = spy
    try:
        blocks_judges._judge_make_model({}, {})
    finally:
        blocks_judges._judge_model_norms = original
    assert seen == [1] and torch.get_num_threads() == 2


# ------------------------------------------------------------ the checks end to end

def test_every_check_function_runs_its_check():
    """Each check_* function runs the check of its name with its probe: right
    answers pass, wrong ones raise CheckFailed with the judge's sentence."""
    blocks_probes.check_sandwich_ln_block(blocks.SandwichLNBlock)
    with pytest.raises(CheckFailed, match="blocks_sandwich_ln, .*change nothing"):
        blocks_probes.check_sandwich_ln_block(SandwichUnused)
    blocks_probes.check_deepnorm_block(blocks.DeepNormBlock)
    with pytest.raises(CheckFailed, match="blocks_deepnorm, .*plain Post-LN"):
        blocks_probes.check_deepnorm_block(DeepNormIgnoresAlpha)
    blocks_probes.check_deepnorm_scale(blocks.deepnorm_scale_)
    with pytest.raises(CheckFailed, match="blocks_deepnorm_scale, .*in place"):
        blocks_probes.check_deepnorm_scale(lambda block, beta: None)
    blocks_probes.check_make_model(blocks.experiment_model)
    with pytest.raises(CheckFailed, match="blocks_make_model, pre, .*needs the final LN"):
        blocks_probes.check_make_model(_with_final_ln(False))
    blocks_probes.check_first_step_update(blocks.first_step_update, _TestLM, blocks.PreLNBlock,
                                          blocks.PostLNBlock)
    with pytest.raises(CheckFailed, match="blocks_first_step_update, .*left the model changed"):
        blocks_probes.check_first_step_update(_update_left_stepped, _TestLM, blocks.PreLNBlock,
                                              blocks.PostLNBlock)
    blocks_probes.check_warmup_lr(blocks.warmup_lr)
    with pytest.raises(CheckFailed, match="blocks_warmup_lr, .*divides by zero"):
        blocks_probes.check_warmup_lr(lambda step, lr, warmup: lr * min(1, (step + 1) / warmup))
    blocks_probes.check_warmup_sweep(blocks.warmup_lr, fails_without=1e-2, fails_with=1e-2)
    with pytest.raises(CheckFailed, match="blocks_warmup_sweep, .*already fails at 0.01"):
        blocks_probes.check_warmup_sweep(blocks.warmup_lr, fails_without=3e-2, fails_with=3e-2)


# --- exercise 9: gradient_profile ---

class _TestLM(nn.Module):
    """The notebook's TinyLM(vocab, d, blocks, final_ln, max_len)."""

    def __init__(self, vocab, d, layers, final_ln, max_len=64):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(layers)
        self.ln_f = nn.LayerNorm(d) if final_ln else nn.Identity()
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))


def _profile_verdict(gradient_profile, kind="pre"):
    cases = blocks_judges._gradient_profile_cases(np.random.default_rng(0))
    case = next(case for _, case in cases if str(case["kind"]) == kind)
    output = _as_arrays(blocks_probes._probe_gradient_profile(
        (gradient_profile, _TestLM, blocks.PreLNBlock), case))
    return blocks_judges._judge_gradient_profile(case, output)


class _PreLNCut(blocks.PreLNBlock):
    """The lesson's DetachedPreLNBlock."""

    def forward(self, x):
        x = x + self.attn(self.ln1(x.detach()))
        return x + self.mlp(self.ln2(x.detach()))


def _class_swap(model, batch, detach_branches=False):
    """The lesson's trick: every block becomes a cut Pre-LN block for the
    measurement, and gets its own class back afterwards."""
    classes = [block.__class__ for block in model.blocks]
    if detach_branches:
        for block in model.blocks:
            block.__class__ = _PreLNCut
    try:
        return blocks.grad_norms_by_layer(model, batch)
    finally:
        for block, cls in zip(model.blocks, classes):
            block.__class__ = cls


def _right_profile(model, batch, detach_branches=False):
    return blocks.grad_norms_by_layer(model, batch, detach_branches)


def _stream_cut(model, batch, detach_branches=False):
    inputs, targets = batch
    h = model.tok_emb(inputs) + model.pos_emb(torch.arange(inputs.shape[1]))
    for block in model.blocks:
        h = (h.detach() if detach_branches else h)
        h = h + block.attn(block.ln1(h))
        h = (h.detach() if detach_branches else h)
        h = h + block.mlp(block.ln2(h))
    loss = F.cross_entropy(model.head(model.ln_f(h)).flatten(0, 1), targets.flatten())
    grads = torch.autograd.grad(loss, [b.mlp.proj.weight for b in model.blocks],
                                allow_unused=True)
    return np.array([0.0 if g is None else float(g.norm()) for g in grads])


def _hooks_left_on(model, batch, detach_branches=False):
    if detach_branches:
        for block in model.blocks:
            block.ln1.register_forward_pre_hook(lambda m, a: (a[0].detach(),))
            block.ln2.register_forward_pre_hook(lambda m, a: (a[0].detach(),))
    return blocks.grad_norms_by_layer(model, batch)


def _ignores_flag(model, batch, detach_branches=False):
    return blocks.grad_norms_by_layer(model, batch)


def _squared(model, batch, detach_branches=False):
    return blocks.grad_norms_by_layer(model, batch, detach_branches) ** 2


def _default_true(model, batch, detach_branches=True):
    return blocks.grad_norms_by_layer(model, batch, detach_branches)


@pytest.mark.parametrize("kind", ["pre", "sandwich"])
def test_gradient_profile_right_answer_passes(kind):
    assert _profile_verdict(_right_profile, kind) is None


def test_gradient_profile_cases_include_sandwich_ln_with_its_output_norms():
    cases = blocks_judges._gradient_profile_cases(np.random.default_rng(0))
    for label, case in cases:
        kind = str(case["kind"])
        assert label.split(" blocks")[0].endswith({"pre": "Pre-LN",
                                                   "sandwich": "sandwich-LN"}[kind])
        assert ("w:blocks.0.ln1_out.weight" in case) == (kind == "sandwich")
    assert {str(case["kind"]) for _, case in cases} == {"pre", "sandwich"}


def test_the_lessons_class_swap_passes_pre_ln_and_fails_sandwich_ln_naming_it():
    assert _profile_verdict(_class_swap, "pre") is None
    verdict = _profile_verdict(_class_swap, "sandwich")
    assert verdict is not None and "leaves out ln1_out and ln2_out" in verdict, verdict


def test_probe_sandwich_harness_matches_the_reference_sandwich_block():
    harness = blocks_probes._sandwich_harness(blocks.PreLNBlock)(8, 2, 16).double()
    reference = blocks.SandwichLNBlock(8, 2, 16).double()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.3 * torch.randn_like(p))
    harness.load_state_dict(reference.state_dict())
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(harness(x), reference(x))


@pytest.mark.parametrize("mistake, hint", [
    (_stream_cut, "you cut the residual stream itself"),
    (_hooks_left_on, "remove every hook"),
    (_ignores_flag, "detach_branches=True changed nothing"),
    (_squared, "not its square"),
    (_default_true, "detach_branches defaults to False"),
])
def test_gradient_profile_mistakes_are_named(mistake, hint):
    verdict = _profile_verdict(mistake)
    assert verdict is not None and hint in verdict, verdict


# --- exercise 6: first_step_update ---

def _update_verdicts(first_step_update):
    verdicts = []
    for _, case in blocks_judges._first_step_update_cases(np.random.default_rng(0)):
        output = _as_arrays(blocks_probes._probe_first_step_update(
            (first_step_update, _TestLM, {"pre": blocks.PreLNBlock, "post": blocks.PostLNBlock}),
            case))
        verdicts.append(blocks_judges._judge_first_step_update(case, output))
    return verdicts


def _update_with_torch_adam(model, batch, lr):
    """The unusual route: torch's own Adam takes the step (eps 1e-8 kept)."""
    saved = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    with torch.no_grad():
        before = model(batch[0])
    optimizer.zero_grad()
    blocks.lm_loss(model, batch).backward()
    optimizer.step()
    with torch.no_grad():
        after = model(batch[0])
        for name, p in model.named_parameters():
            p.copy_(saved[name])
    return (after - before).norm() / before.norm()


def _update_left_stepped(model, batch, lr):
    params = list(model.parameters())
    grads = torch.autograd.grad(blocks.lm_loss(model, batch), params)
    with torch.no_grad():
        before = model(batch[0])
        for p, g in zip(params, grads):
            p -= lr * g.sign()
        return float((model(batch[0]) - before).norm() / before.norm())


def _update_slip(**slip):
    return lambda model, batch, lr: blocks_judges._update_by_hand(model, batch, lr, **slip)


@pytest.mark.parametrize("first_step_update", [
    blocks.first_step_update, _update_with_torch_adam, _update_slip(step="adam")])
def test_first_step_update_right_answers_pass(first_step_update):
    assert _update_verdicts(first_step_update) == [None, None]


@pytest.mark.parametrize("mistake, hint", [
    (_update_slip(step="sgd"), "this is plain gradient descent"),
    (_update_slip(step="up"), "step down the gradient"),
    (_update_slip(relative=False), "the update is relative"),
    (_update_left_stepped, "it left the model changed"),
    (lambda model, batch, lr: [1.0, 2.0], "expected one number"),
])
def test_first_step_update_mistakes_are_named(mistake, hint):
    for verdict in _update_verdicts(mistake):
        assert verdict is not None and hint in verdict, verdict


def test_first_step_update_cases_are_what_their_labels_say():
    for label, case in blocks_judges._first_step_update_cases(np.random.default_rng(0)):
        kind = str(case["kind"])
        assert label.startswith(f"{int(case['n_layers'])} {kind.capitalize()}-LN blocks")
        assert f"lr {float(case['lr']):.0e}".replace("e-0", "e-") in label
        assert ("w:ln_f.weight" in case) == (kind == "pre")
        assert case["inputs"].shape == case["targets"].shape


# --- exercise 10: adaLN-Zero ---

def _adaln_verdict(block_class):
    case = blocks_judges._adaln_cases(np.random.default_rng(1))[0][1]
    output = _as_arrays(blocks_probes._probe_adaln_zero(block_class, case))
    return blocks_judges._judge_adaln_zero(case, output)


def _slip(**slip):
    class Slipped(blocks.AdaLNZeroBlock):
        def forward(self, x, cond):
            return blocks_judges._adaln_variant(self, x, cond, **slip)

    return Slipped


class AdaLNNotZero(blocks.AdaLNZeroBlock):
    def __init__(self, *args):
        super().__init__(*args)
        nn.init.normal_(self.ada.weight)


class AdaLNZeroedSublayers(blocks.AdaLNZeroBlock):
    """Identity by zeroing the sublayers' outputs: no gradient reaches ada."""

    def __init__(self, *args):
        super().__init__(*args)
        nn.init.normal_(self.ada.weight)
        for linear in (self.attn.proj, self.mlp.proj):
            nn.init.zeros_(linear.weight)
            nn.init.zeros_(linear.bias)


class AdaLNDetachedCond(blocks.AdaLNZeroBlock):
    def forward(self, x, cond):
        return super().forward(x, cond.detach())


def test_adaln_right_block_passes():
    assert _adaln_verdict(blocks.AdaLNZeroBlock) is None


@pytest.mark.parametrize("mistake, hint", [
    (_slip(order=(1, 0, 2)), "shift, scale, gate"),
    (_slip(one_plus=False), "(1 + scale)"),
    (_slip(silu=False), "silu(cond)"),
    (_slip(gates=False), "multiply each sublayer's output by its gate"),
    (_slip(shared=True), "the MLP has its own shift, scale and gate"),
    (AdaLNNotZero, "initialize ada's weight and bias to zero"),
    (AdaLNZeroedSublayers, "no gradient reaches ada"),
    (AdaLNDetachedCond, "is cond detached somewhere"),
])
def test_adaln_mistakes_are_named(mistake, hint):
    verdict = _adaln_verdict(mistake)
    assert verdict is not None and hint in verdict, verdict


# --- exercise 7: warm-up ---

def _warmup_verdicts(warmup_lr):
    verdicts = []
    for _, case in blocks_judges._warmup_lr_cases(np.random.default_rng(0)):
        output = _as_arrays(blocks_probes._probe_warmup_lr(warmup_lr, case))
        verdicts.append(blocks_judges._judge_warmup_lr(case, output))
    return verdicts


def _warmup_by_loop(step, lr, warmup_steps):
    """The unusual route: a torch scalar, from the ramp's list of rates."""
    ramp = [lr * (k + 1) / warmup_steps for k in range(warmup_steps)]
    return torch.tensor(ramp[step] if step < warmup_steps else lr, dtype=torch.float64)


def test_warmup_lr_is_the_linear_ramp_of_xiong_and_vaswani():
    """Independent of the reference's formula: the ramp's rates are lr/w, 2lr/w, ..., lr."""
    rates = [blocks.warmup_lr(step, 0.1, 4) for step in range(6)]
    np.testing.assert_allclose(rates, [0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    assert blocks.warmup_lr(0, 0.1, 0) == 0.1


@pytest.mark.parametrize("warmup_lr", [blocks.warmup_lr, _warmup_by_loop])
def test_warmup_lr_right_answers_pass(warmup_lr):
    assert _warmup_verdicts(warmup_lr) == [None, None, None]


@pytest.mark.parametrize("mistake, hint, failing", [
    (lambda s, lr, w: lr * min(1.0, s / w) if w else lr, "step counts from 0", [0, 1]),
    (lambda s, lr, w: lr * (s + 1) / w if w else lr, "stays at lr", [1]),
    (lambda s, lr, w: lr * min(1.0, (s + 1) / w), "divides by zero", [2]),
])
def test_warmup_lr_mistakes_are_named(mistake, hint, failing):
    verdicts = _warmup_verdicts(mistake)
    for i in failing:
        assert verdicts[i] is not None and hint in verdicts[i], verdicts[i]


def _sweep_verdict(**answers):
    output = _as_arrays(blocks_probes._rates_as_numbers(answers, {}))
    return blocks_judges._judge_warmup_sweep({}, output)


def test_reference_sweep_post_ln_fails_at_1e_2_without_warmup_and_3e_2_with_it():
    """The toy's finding, as the lesson measured it with its own loop: stuck
    near chance (ln 15 = 2.708) at 1e-2 without warm-up, learning with it."""
    loss = {(lr, w): blocks.sweep_final_loss(lr, w) for lr, w in
            ((3e-3, 0), (1e-2, 0), (1e-2, 20), (3e-2, 20))}
    assert loss[1e-2, 0] > 2.5 and loss[3e-2, 20] > 2.5
    assert loss[3e-3, 0] < 2.5 and loss[1e-2, 20] < 1.0


def test_the_judges_table_of_sweep_losses_is_what_the_reference_runs_give():
    """The judge reads its reference runs from SWEEP_SEED0_LOSSES: each entry,
    every rate of the sweep with and without its warm-up, trained again."""
    table = blocks.SWEEP_SEED0_LOSSES
    assert set(table) == {(lr, w) for lr in blocks.SWEEP["rates"]
                          for w in (0, blocks.SWEEP["warmup_steps"])}
    for (lr, warmup_steps), loss in table.items():
        assert blocks.sweep_final_loss(lr, warmup_steps) == pytest.approx(loss, abs=2e-4)


def test_reference_sweep_a_10_step_warmup_does_not_move_the_breaking_point():
    """The assignment's case: with half the lesson's warm-up, Post-LN still
    fails at 1e-2 and learns at 3e-3, far from the threshold either way
    (the table is checked against real runs above)."""
    assert blocks.SWEEP["warmup_steps"] == 10
    assert blocks.SWEEP_SEED0_LOSSES[1e-2, 10] > 2.6
    assert blocks.SWEEP_SEED0_LOSSES[3e-3, 10] < 1.0


@pytest.mark.parametrize("without, with_", [
    (1e-2, 1e-2), (np.float32(0.01), torch.tensor(0.01)), ("1E-2", " 0.01 "),
    (__import__("fractions").Fraction(1, 100), __import__("decimal").Decimal("0.01"))])
def test_warmup_sweep_right_answers_of_any_type_pass(without, with_):
    assert _sweep_verdict(fails_without=without, fails_with=with_) is None


@pytest.mark.parametrize("answers, hint", [
    ({"fails_without": 3e-3, "fails_with": 1e-2}, "at that rate Post-LN with no warm-up learns"),
    ({"fails_without": 1e-2, "fails_with": 3e-2},  # the lesson's 20-step answer
     "Post-LN with 10-step warm-up already fails at 0.01"),
    ({"fails_without": 3e-2, "fails_with": 3e-2}, "already fails at 0.01"),
    ({"fails_without": 1e-2, "fails_with": 1e-1}, "already fails at 0.03"),
    ({"fails_without": 1e-2, "fails_with": None}, "answer with one of the rates"),
    ({"fails_without": "fast", "fails_with": 1e-2}, "fails_without is fast"),
    ({"fails_without": 1e-2}, "no answer given for fails_with"),
])
def test_warmup_sweep_mistakes_are_named(answers, hint):
    verdict = _sweep_verdict(**answers)
    assert verdict is not None and hint in verdict, verdict


CUTS_WHOLE_BLOCKS = """
def gradient_profile(model, batch, detach_branches=False):
    def cut(module, args):
        return tuple(a.detach() for a in args)

    hooks = ([block.register_forward_pre_hook(cut) for block in model.blocks]
             if detach_branches else [])
    try:
        return grad_norms_by_layer(model, batch)
    finally:
        for hook in hooks:
            hook.remove()
"""


def test_gradient_profile_cutting_whole_blocks_is_told_to_keep_the_residual_path():
    namespace = _assignment_namespace(CUTS_WHOLE_BLOCKS)
    with pytest.raises(CheckFailed, match="cut only what each ln1 and ln2 reads"):
        check_gradient_profile(namespace["gradient_profile"], namespace["TinyLM"],
                               namespace["PreLNBlock"])


# --- exercise 7: lowest_failing_lr, judged on runs the grader makes up ---

def _searches(order, stop_at="failure"):
    """A lowest_failing_lr that walks the rates in the given order and
    returns the first failing rate, or the last one that learned."""
    def lowest_failing_lr(warmup_steps, rates, train):
        learned = None
        for lr in order(rates):
            if train(lr, warmup_steps) > blocks.SWEEP["stuck_above"]:
                return lr if stop_at == "failure" else learned
            learned = lr
        return None if stop_at == "failure" else learned

    return lowest_failing_lr


def test_lowest_failing_lr_right_search_passes():
    blocks_probes.check_lowest_failing_lr(_searches(sorted))


@pytest.mark.parametrize("search, hint", [
    (_searches(list), "you returned 0.05, expected 0.005. Hint: the rates may come in any "
                      "order: try them from the smallest up"),
    (_searches(sorted, stop_at="learned"),
     "you returned 0.002, expected 0.005. Hint: return the rate whose run fails, not one "
     "whose run learns"),
    (lambda warmup_steps, rates, train: 1e-2 if warmup_steps == 0 else 3e-2,
     "your lowest_failing_lr never trained: it must call train(lr, warmup_steps)"),
    (lambda warmup_steps, rates, train: min(r for r in rates if train(r, 20) > 2.5),
     "train was called with warmup_steps 20, not the 0 that lowest_failing_lr was given"),
])
def test_lowest_failing_lr_slips_and_the_lessons_numbers_are_named(search, hint):
    with pytest.raises(CheckFailed) as failure:
        blocks_probes.check_lowest_failing_lr(search)
    assert hint in str(failure.value), str(failure.value)


# --- exercise 8: DeepNet's two changes, one at a time ---

def _crossed_switches(use_alpha, use_beta, n_layers, seed):
    return blocks.ablation_model(use_beta, use_alpha, n_layers, seed)


def _scaled_before_init(use_alpha, use_beta, n_layers, seed):
    model = blocks.ablation_model(use_alpha, False, n_layers, seed)
    if use_beta:
        for block in model.blocks:
            blocks.deepnorm_scale_(block, blocks.deepnorm_constants(n_layers)[1])
        blocks.init_like_xiong(model, seed)
    return model


def _alpha_always(use_alpha, use_beta, n_layers, seed):
    return blocks.ablation_model(True, use_beta, n_layers, seed)


def _post_ln_blocks_without_alpha(use_alpha, use_beta, n_layers, seed):
    """Unusual but right: Post-LN blocks, which have no alpha, when use_alpha
    is off, and beta undone by dividing, not by skipping it."""
    model = blocks.ablation_model(use_alpha, True, n_layers, seed)
    if not use_alpha:
        post = blocks.experiment_model("post", n_layers, seed)
        post.load_state_dict(model.state_dict())
        model = post
    if not use_beta:
        for block in model.blocks:
            blocks.deepnorm_scale_(block, 1 / blocks.deepnorm_constants(n_layers)[1])
    return model


def test_ablation_model_right_and_unusual_answers_pass():
    blocks_probes.check_ablation_model(blocks.ablation_model)
    blocks_probes.check_ablation_model(_post_ln_blocks_without_alpha)


@pytest.mark.parametrize("ablation_model, hint", [
    (_crossed_switches, "the two switches are crossed"),
    (_scaled_before_init, "after init_like_xiong (initializing afterwards undoes it)"),
    (_alpha_always, "expected 1 in each, 1, a Post-LN block, since use_alpha is False"),
])
def test_ablation_model_slips_are_named(ablation_model, hint):
    with pytest.raises(CheckFailed) as failure:
        blocks_probes.check_ablation_model(ablation_model)
    assert hint in str(failure.value), str(failure.value)


def test_ablation_model_keeps_its_points_while_exercises_2_and_3_are_unfinished():
    namespace = _assignment_namespace(UNFINISHED_BLOCKS, "def deepnorm_scale_(block, beta):\n"
                                      "    raise NotImplementedError()\n",
                                      "ablation_model_answer")
    blocks_probes.check_ablation_model(namespace["ablation_model"])


class _Run:
    """A stand-in model that only says which changes it keeps."""

    def __init__(self, use_alpha, use_beta):
        self.switches = (use_alpha, use_beta)


MADE_UP_LOSSES = {(True, False): 2.7, (False, True): 0.1, (True, True): 0.05,
                  (False, False): 2.74}


def _made_up_train(model, lr, warmup_steps, seed=0):
    """Training runs whose losses are made up, so that only the reading is
    judged; they insist on the experiment's rate, warm-up and seed."""
    assert (lr, warmup_steps, seed) == (blocks.ABLATION["lr"], 0, blocks.ABLATION["seed"])
    return MADE_UP_LOSSES[model.switches]


def _made_up_check(losses, rescued_by):
    blocks_probes.check_ablation(lambda a, b, n_layers, seed: _Run(a, b), _made_up_train,
                                 losses=losses, rescued_by=rescued_by)


REPORTED = {name: MADE_UP_LOSSES[switches]
            for name, switches in blocks.ABLATION["variants"].items()}


def test_ablation_own_losses_and_their_conclusion_pass_in_any_form():
    _made_up_check(dict(REPORTED), "beta")
    as_typed = {name.upper(): torch.tensor(round(loss, 2))
                for name, loss in REPORTED.items()}
    _made_up_check(as_typed, " Beta")


@pytest.mark.parametrize("losses, rescued_by, hint", [
    (None, "beta", "ABLATION_LOSSES is a NoneType, not a dict"),
    ({k: v for k, v in REPORTED.items() if k != "both"}, "beta",
     "ABLATION_LOSSES has no number for 'both'"),
    ({**REPORTED, "beta": 0.3}, "beta",
     "ABLATION_LOSSES['beta'] is 0.3, but your ablation_model's 'beta' model, trained again "
     "by train_model(model, ABLATION_LR, 0), ends at 0.1. Hint: report what your own runs"),
    (REPORTED, "alpha", "RESCUED_BY is 'alpha', but your own table says otherwise: alpha "
                        "alone ends at 2.70 (fails), beta alone at 0.10 (learns)"),
    (REPORTED, "both", "RESCUED_BY is 'both'; answer with one of 'alpha', 'beta', 'either', "
                       "'neither'"),
])
def test_ablation_slips_are_named(losses, rescued_by, hint):
    with pytest.raises(CheckFailed) as failure:
        _made_up_check(losses, rescued_by)
    assert hint in str(failure.value), str(failure.value)


def test_ablation_conclusion_follows_the_students_numbers_not_the_reference():
    """A student whose runs came out otherwise is graded on their own table."""
    other = {**MADE_UP_LOSSES, (True, False): 0.2}
    reported = {name: other[s] for name, s in blocks.ABLATION["variants"].items()}

    def train(model, lr, warmup_steps, seed=0):
        return other[model.switches]

    blocks_probes.check_ablation(lambda a, b, n_layers, seed: _Run(a, b), train,
                                 losses=reported, rescued_by="either")


def test_ablation_of_the_assignments_solution_passes_on_real_runs():
    """The source's own cells: four real runs, repeated by the grader."""
    namespace = _assignment_namespace(
        "deepnorm_answer", "scale_answer", "warmup_lr_answer", "warmup_toy",
        "ablation_model_answer", "ablation_setup", "ablation_run_answer",
        "ablation_conclusion_answer")
    blocks_probes.check_ablation(namespace["ablation_model"], namespace["train_model"],
                                 losses=namespace["ABLATION_LOSSES"],
                                 rescued_by=namespace["RESCUED_BY"])


def _warmup_lr_from_zero(step, lr, warmup_steps):
    """The slip of a sample hand-in: step 0 gets no rate at all."""
    return lr * min(1.0, step / warmup_steps) if warmup_steps else lr


def test_a_slip_in_warmup_lr_costs_only_its_own_cell(monkeypatch):
    # the mechanism, shown with the lesson's 20-step warm-up (with the
    # assignment's 10 steps this slip gives the same answers): with that
    # schedule the toy already fails at 1e-2 with warm-up (the reference's
    # fails from 3e-2): the student's own correct sweep passes
    with pytest.raises(CheckFailed, match="blocks_warmup_lr, .*step counts from 0"):
        blocks_probes.check_warmup_lr(_warmup_lr_from_zero)
    monkeypatch.setitem(blocks.SWEEP, "warmup_steps", 20)
    blocks_probes.check_warmup_sweep(_warmup_lr_from_zero, fails_without=1e-2, fails_with=1e-2)
    with pytest.raises(CheckFailed, match="blocks_warmup_sweep, .*your warmup_lr's rates"):
        blocks_probes.check_warmup_sweep(_warmup_lr_from_zero, fails_without=1e-2,
                                         fails_with=1e-1)
    # the same answer from a correct warmup_lr is wrong: those runs learn at 1e-2
    with pytest.raises(CheckFailed, match="blocks_warmup_sweep, .*fails_with is 0.01, but"):
        blocks_probes.check_warmup_sweep(blocks.warmup_lr, fails_without=1e-2, fails_with=1e-2)


def test_the_sweep_is_judged_on_the_reference_schedule_when_warmup_lr_fails():
    def unwritten(step, lr, warmup_steps):
        raise NotImplementedError()

    blocks_probes.check_warmup_sweep(unwritten, fails_without=1e-2, fails_with=1e-2)
    with pytest.raises(CheckFailed, match="blocks_warmup_sweep, .*fails_with is 0.03, but"):
        blocks_probes.check_warmup_sweep(unwritten, fails_without=1e-2, fails_with=3e-2)
