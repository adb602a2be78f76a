"""Unit 03's checks (MyLayerNorm, AddLayerNorm, the two questions): probes and judges.

Each test fails on a small bug in normref/checks/module_probes.py or
normref/checks/module_judges.py (`make mutation`). The judges are fed answers
made here, independently of the reference: torch's own nn.LayerNorm (the
module a student's must agree with), torch autograd, and the usual slips
written out in torch (wrong axes, n - 1, eps misplaced, float64 parameters,
missing bias, wrong names and shapes); each verdict and its message are
checked in full, as the student would read them.
"""

import functools
import math

import numpy as np
import pytest
import torch
from torch import nn

from normref.checks import _registry, _runner
from normref.checks import module_judges as J
from normref.checks import module_probes as P
from normref.checks.tolerances import mismatch

HINT = ". Hint: "


def _cases(name, seed=0):
    return _registry.make_cases(name, seed)


def _case(name, index, seed=0):
    return _cases(name, seed)[index][1]


def _probed(subject, case, probe=P._probe_module):
    """What the grader receives from the probe: plain arrays."""
    return {key: _runner.to_array(value) for key, value in probe(subject, case).items()}


def _verdict(name, subject, probe, seed=0):
    cases = _cases(name, seed)
    outputs, errors = _runner._probe_all(subject, cases, probe)
    return _registry.judge(name, cases, outputs, errors)


def _judge(name, case, output):
    return _registry._get(name).judge(case, output)


# ----- modules a student might write --------------------------------------------------


class TorchLayerNorm(nn.LayerNorm):
    """torch's own module under the student's class name: always right."""


class BiasFirst(nn.Module):
    """Right, but beta is registered before gamma: order must not matter."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(
            normalized_shape)
        self.shape, self.eps = shape, eps
        self.bias = nn.Parameter(torch.zeros(shape)) if elementwise_affine and bias else None
        self.weight = nn.Parameter(torch.ones(shape)) if elementwise_affine else None

    def forward(self, x):
        return nn.functional.layer_norm(x, self.shape, self.weight, self.bias, self.eps)


class Float64Parameters(nn.LayerNorm):
    """gamma and beta made in float64 (torch.ones(..., dtype=torch.float64))."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, dtype=torch.float64)


class GammaBeta(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        self.inner_shape = normalized_shape
        self.gamma = nn.Parameter(torch.ones(normalized_shape))
        self.beta = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        shape = self.gamma.shape
        return nn.functional.layer_norm(x, shape, self.gamma, self.beta)


class Buffers(nn.Module):
    """weight and bias as buffers: in the state_dict, but not parameters."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        self.register_buffer("weight", torch.ones(normalized_shape))
        self.register_buffer("bias", torch.zeros(normalized_shape))


class PlainTensors(nn.LayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__(normalized_shape, eps, elementwise_affine=False)
        self.gain = torch.ones(self.normalized_shape)


class WeightOnly(nn.LayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__(normalized_shape, eps, elementwise_affine, bias=False)


class AlwaysBias(nn.LayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__(normalized_shape, eps, elementwise_affine, bias=True)


class AlwaysAffine(nn.LayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__(normalized_shape, eps, True, True)


class ExtraScale(nn.LayerNorm):
    def __init__(self, normalized_shape, **flags):
        super().__init__(normalized_shape, **flags)
        self.scale = nn.Parameter(torch.ones(()))


class FlatParameters(nn.LayerNorm):
    """gamma and beta of shape (prod(normalized_shape),)."""

    def __init__(self, normalized_shape, **flags):
        super().__init__(normalized_shape, **flags)
        size = math.prod(self.normalized_shape)
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))


class FrozenBias(nn.LayerNorm):
    def __init__(self, normalized_shape, **flags):
        super().__init__(normalized_shape, **flags)
        self.bias.requires_grad_(False)


class AllFrozen(nn.LayerNorm):
    def __init__(self, normalized_shape, **flags):
        super().__init__(normalized_shape, **flags)
        self.requires_grad_(False)


class GammaStartsAtTwo(nn.LayerNorm):
    def reset_parameters(self):
        super().reset_parameters()
        if self.weight is not None:
            nn.init.constant_(self.weight, 2.0)


class BetaStartsAtOne(nn.LayerNorm):
    def reset_parameters(self):
        super().reset_parameters()
        if self.bias is not None:
            nn.init.ones_(self.bias)


class Float32RoundOff(nn.LayerNorm):
    """gamma = 1 + 2e-6 and beta = 2e-6: off by float32-sized round-off only."""

    def reset_parameters(self):
        with torch.no_grad():
            self.weight.fill_(1.0 + 2e-6)
            self.bias.fill_(2e-6)


class EpsInStateDict(nn.LayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, **flags):
        super().__init__(normalized_shape, eps, **flags)
        self.register_buffer("eps_value", torch.tensor(eps))


class NotAModule:
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        self.inner = nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias)

    def __call__(self, x):
        return self.inner(x)


# ----- the parameters check -------------------------------------------------------------

PARAMETER_LABELS = [
    "MyLayerNorm(8)",
    "MyLayerNorm(512), the width of the lesson's hidden states",
    "MyLayerNorm((3, 4))",
    "MyLayerNorm([2, 3, 5]), a list",
    "MyLayerNorm(torch.Size([6]))",
]


def test_parameter_cases_are_the_constructor_calls_their_labels_name():
    """A case generator that passes the wrong shape or kind (or leaks data into
    the constructor) tests another call than the student reads."""
    cases = _cases("my_layer_norm_parameters")
    assert [label for label, _ in cases] == PARAMETER_LABELS
    expected = [((8,), "int"), ((512,), "int"), ((3, 4), "tuple"), ((2, 3, 5), "list"),
                ((6,), "size")]
    for (_, case), (shape, kind) in zip(cases, expected):
        assert set(case) == {"normalized_shape", "shape_kind"}
        assert case["normalized_shape"].dtype == np.int64
        assert tuple(case["normalized_shape"]) == shape and str(case["shape_kind"]) == kind


def test_torchs_module_and_a_bias_first_module_pass_the_parameters_check():
    """Names, shapes and dtypes are compared as sets: nn.LayerNorm passes, and so
    does a module that creates beta before gamma (a judge comparing in order fails it)."""
    for module in (TorchLayerNorm, BiasFirst):
        verdict = _verdict("my_layer_norm_parameters", module, P._probe_module)
        assert verdict == {"passed": True, "case": None, "message": (
            "my_layer_norm_parameters: all 5 cases passed (" + ", ".join(PARAMETER_LABELS)
            + ")")}, module


def test_float64_parameters_fail_the_parameters_check():
    """The bug the issue names: a judge without its dtype check accepts float64 gamma/beta."""
    case = _case("my_layer_norm_parameters", 2)
    problem = J._judge_parameters(case, _probed(Float64Parameters, case))
    assert problem == (
        "your parameters have dtypes weight=float64;bias=float64; nn.LayerNorm's are "
        "float32, torch's default (torch.ones(shape) gives it)")
    verdict = _verdict("my_layer_norm_parameters", Float64Parameters, P._probe_module)
    assert not verdict["passed"] and verdict["case"] == "MyLayerNorm(8)"


def test_one_float64_parameter_fails_too():
    """Every parameter's dtype counts, not only the first one's."""
    case = _case("my_layer_norm_parameters", 0)
    output = _probed(TorchLayerNorm, case)
    output["dtypes"] = np.array("weight=float32;bias=float64")
    assert "dtypes weight=float32;bias=float64" in J._judge_parameters(case, output)


@pytest.mark.parametrize("module, index, message", [
    (GammaBeta, 0,
     "your parameters are named ['gamma', 'beta']; nn.LayerNorm names them ['weight', "
     "'bias']. The names are the state_dict keys, so they must match"),
    (Buffers, 2,
     "weight and bias are in your state_dict but are not parameters (buffers?): wrap them "
     "in nn.Parameter so that optimizers train them"),
    (PlainTensors, 0,
     "your module has no parameters; nn.LayerNorm has ['weight', 'bias']. Wrap gamma and "
     "beta in nn.Parameter and assign them to self.weight and self.bias"),
    (WeightOnly, 0,
     "your module's parameters are ['weight']; nn.LayerNorm's are ['weight', 'bias']"),
    (ExtraScale, 0,
     "your module's parameters are ['weight', 'bias', 'scale']; nn.LayerNorm's are "
     "['weight', 'bias']"),
    (FlatParameters, 2,
     "your parameter shapes are weight=[12];bias=[12]; expected weight=[3, 4];bias=[3, 4]: "
     "gamma and beta have exactly the shape normalized_shape (an int d means (d,))"),
    (FrozenBias, 0,
     "['bias'] do not require gradients: nn.Parameter(...) should leave requires_grad on"),
    (AllFrozen, 0,
     "['bias', 'weight'] do not require gradients: nn.Parameter(...) should leave "
     "requires_grad on"),
    (EpsInStateDict, 0,
     "your state_dict holds ['weight', 'bias', 'eps_value']; nn.LayerNorm's holds "
     "['weight', 'bias']. Keep other values (eps, the shape) as plain attributes or "
     "non-persistent buffers"),
], ids=lambda v: getattr(v, "__name__", None) or str(v)[:20])
def test_parameter_slips_are_named(module, index, message):
    """Each wrong module gets the sentence that names its slip, word for word."""
    case = _case("my_layer_norm_parameters", index)
    assert J._judge_parameters(case, _probed(module, case)) == message


@pytest.mark.parametrize("module, rule, start", [
    (GammaStartsAtTwo, "gamma starts at 1", "the initial weight is"),
    (BetaStartsAtOne, "beta starts at 0", "the initial bias is"),
])
def test_wrong_initial_values_are_named(module, rule, start):
    """gamma must start at 1 and beta at 0, compared entry by entry."""
    case = _case("my_layer_norm_parameters", 2)
    output = _probed(module, case)
    name = "weight" if module is GammaStartsAtTwo else "bias"
    truth = torch.ones((3, 4)) if name == "weight" else torch.zeros((3, 4))
    expected = mismatch(output[f"initial_{name}"], truth.numpy(), dtype="float32",
                        what=f"the initial {name}")
    assert expected.startswith(start)
    assert J._judge_parameters(case, output) == f"{expected}; {rule}, as in nn.LayerNorm"


def test_initial_values_are_held_to_float32_precision():
    """gamma = 1 + 2e-6 is 1 to float32's accuracy; a float64 tolerance would fail it."""
    case = _case("my_layer_norm_parameters", 0)
    assert J._judge_parameters(case, _probed(Float32RoundOff, case)) is None


def test_missing_initial_values_fail():
    """A probe that reports no initial weight is not taken as a pass."""
    case = _case("my_layer_norm_parameters", 0)
    output = _probed(TorchLayerNorm, case)
    del output["initial_weight"]
    assert "the initial weight has shape ()" in J._judge_parameters(case, output)


def _flags_case(**flags):
    return J._case(8, "int", **flags)


@pytest.mark.parametrize("flags, have, state, message", [
    ({"elementwise_affine": False}, "weight,bias", "weight,bias",
     "with elementwise_affine=False nn.LayerNorm has no parameters, but your module has "
     "['weight', 'bias']: create none (set self.weight = self.bias = None)"),
    ({"bias": False}, "weight,bias", "weight,bias",
     "with bias=False nn.LayerNorm has only a weight (gamma); your module also creates a "
     "bias. Leave it out (set self.bias = None, or self.register_parameter('bias', None))"),
    ({"bias": False}, "", "weight",
     "weight and bias are in your state_dict but are not parameters (buffers?): wrap them "
     "in nn.Parameter so that optimizers train them"),
    ({}, "", "weight",
     "your module has no parameters; nn.LayerNorm has ['weight', 'bias']. Wrap gamma and "
     "beta in nn.Parameter and assign them to self.weight and self.bias"),
    ({"bias": False}, "gamma", "gamma",
     "your parameters are named ['gamma']; nn.LayerNorm names them ['weight']. The names "
     "are the state_dict keys, so they must match"),
    ({"bias": False}, "bias,gamma", "bias,gamma",
     "with bias=False nn.LayerNorm has only a weight (gamma); your module also creates a "
     "bias. Leave it out (set self.bias = None, or self.register_parameter('bias', None))"),
    ({}, "weight,bias", "weight,bias", None),
    ({}, "bias,weight", "bias,weight", None),
    ({"elementwise_affine": False, "bias": False}, "", "", None),
])
def test_naming_problem_covers_each_flag(flags, have, state, message):
    """The naming sentence depends on which flags the case sets and what the module has."""
    output = {"names": np.array(have), "state_keys": np.array(state)}
    assert J._naming_problem(_flags_case(**flags), output) == message


def test_bias_false_with_two_misnamed_parameters():
    """With bias=False, two parameters neither called bias: the counts differ."""
    output = {"names": np.array("gamma,beta"), "state_keys": np.array("gamma,beta")}
    assert J._naming_problem(_flags_case(bias=False), output) == (
        "your module's parameters are ['gamma', 'beta']; nn.LayerNorm's are ['weight']")


def test_expected_parameters_follow_the_flags():
    """The reference's names and shapes for each combination of flags, as torch has them."""
    for flags in ({}, {"bias": False}, {"elementwise_affine": False},
                  {"eps": 0.5, "bias": True}):
        case = J._case((3, 4), "tuple", **flags)
        theirs = nn.LayerNorm((3, 4), **flags)
        params = dict(theirs.named_parameters())
        assert J._expected_parameters(case) == {
            "names": ",".join(params),
            "shapes": ";".join(f"{n}={list(p.shape)}" for n, p in params.items())}


def test_text_and_split_read_the_probes_strings():
    assert J._text({"names": np.array("weight,bias")}, "names") == "weight,bias"
    assert J._text({}, "names") == ""
    assert J._split("weight,,bias,") == ["weight", "bias"]
    assert J._split("a=[1];b=[2]", ";") == ["a=[1]", "b=[2]"]
    assert J._split("") == []


def test_case_keeps_constructor_arguments_and_data_apart():
    case = J._case((2, 3), x=[[1.0, 2.0]], eps=0.5)
    assert str(case["shape_kind"]) == "tuple"
    np.testing.assert_array_equal(case["normalized_shape"], [2, 3])
    assert case["normalized_shape"].dtype == np.int64
    assert isinstance(case["x"], np.ndarray) and isinstance(case["eps"], np.ndarray)
    shape, flags = J._constructor_arguments(J._case(5, "int", eps=0.5, bias=np.array(False)))
    assert shape == 5 and flags == {"eps": 0.5, "bias": False}
    assert type(flags["bias"]) is bool and type(flags["eps"]) is float
    assert J._constructor_arguments(J._case((5,), "list", elementwise_affine=0)) == (
        (5,), {"elementwise_affine": False})


# ----- the forward and flags checks --------------------------------------------------------

FORWARD_LABELS = [
    "MyLayerNorm(8) on a batch of 4 tokens, gamma = 1, beta = 0",
    "MyLayerNorm(6) on a single token of shape (6,)",
    "MyLayerNorm(16) on (batch 2, sequence 5, features 16) with random gamma, beta",
    "MyLayerNorm(8) on a batch whose second token is constant, beta random",
    "MyLayerNorm((3, 4)) on (2, 3, 4) with random gamma, beta",
    "MyLayerNorm([2, 3, 4]) on (2, 2, 3, 4), a list",
    "MyLayerNorm(torch.Size([5, 6])) on (2, 3, 5, 6) with an offset of 10",
    "MyLayerNorm(8, eps=1e-5) on tokens of small spread (about 0.003), where eps is not "
    "negligible",
    "MyLayerNorm(64) in float32 on 8 tokens around 1000 with spread 1, gamma = 1, beta = 0 "
    "(judged to 0.001: float32 holds these values to about 6e-5)",
]
FLOAT64_LABELS = [
    "MyLayerNorm(16, eps=1e-5) in float64 on tokens around 1000, whose spread float32 "
    "keeps to about 4 decimals only",
    "MyLayerNorm((4, 5), eps=1e-5) in float64 on (3, 4, 5)",
]
LOW_PRECISION_LABELS = [
    "MyLayerNorm(1024) on a bfloat16 (4, 1024) stream around 300, where bfloat16's "
    "spacing is 2",
    "MyLayerNorm(64) on a float16 (3, 64) batch around 1000, where float16's spacing "
    "is 0.5, random gamma and beta",
    "MyLayerNorm(256).to(torch.bfloat16) on a bfloat16 (4, 256) batch, gamma between 64 "
    "and 128 and a beta that cancels gamma * x_hat on token 0, leaving outputs of about 1 "
    "there",
]
FLAG_LABELS = [
    "MyLayerNorm(4) with the default eps on tokens of tiny spread (0.001 * [2, 4, 6, 8])",
    "MyLayerNorm(8, eps=0.5)",
    "MyLayerNorm((2, 4), eps=1e-3) on tokens of small spread",
    "MyLayerNorm(8, elementwise_affine=False)",
    "MyLayerNorm((3, 4), eps=0.1, elementwise_affine=False)",
    "MyLayerNorm(8, bias=False) with random gamma",
    "MyLayerNorm((2, 3), bias=False) with random gamma",
    "MyLayerNorm(8, elementwise_affine=False, bias=False)",
]


def _describe(case):
    """(normalized_shape, kind, flags, x shape, x dtype, affine keys) of a case."""
    flags = {k: case[k].item() for k in ("eps", "elementwise_affine", "bias") if k in case}
    affine = tuple(k for k in ("set_weight", "set_bias") if k in case)
    return (tuple(int(n) for n in case["normalized_shape"]), str(case["shape_kind"]), flags,
            case["x"].shape, case["x"].dtype.name, affine)


def test_forward_cases_are_what_their_labels_say():
    """Shapes, kinds, flags and dtypes of the forward cases match the labels the
    student reads; the affine values have the parameters' shape and the input's dtype."""
    cases = _cases("my_layer_norm_forward")
    assert [label for label, _ in cases] == FORWARD_LABELS
    both = ("set_weight", "set_bias")
    assert [_describe(case) for _, case in cases] == [
        ((8,), "int", {}, (4, 8), "float32", both),
        ((6,), "int", {}, (6,), "float32", both),
        ((16,), "int", {}, (2, 5, 16), "float32", both),
        ((8,), "int", {}, (3, 8), "float32", both),
        ((3, 4), "tuple", {}, (2, 3, 4), "float32", both),
        ((2, 3, 4), "list", {}, (2, 2, 3, 4), "float32", both),
        ((5, 6), "size", {}, (2, 3, 5, 6), "float32", both),
        ((8,), "int", {"eps": 1e-5}, (3, 8), "float32", both),
        ((64,), "int", {}, (8, 64), "float32", both),
    ]
    assert 0.001 < cases[7][1]["x"].std() < 0.01  # "small spread", eps not negligible
    far = cases[8][1]
    assert bool(far["far_from_zero"]) and abs(far["x"].mean() - 1000) < 1
    assert 0.8 < far["x"].std(axis=-1).mean() < 1.2  # "spread 1"
    # "float32 holds these values to about 6e-5": its spacing at 1000
    assert np.spacing(np.float32(1000)) == 2.0 ** -14 and round(2.0 ** -14, 5) == 6e-5
    float64_cases = _cases("my_layer_norm_float64")
    assert [label for label, _ in float64_cases] == FLOAT64_LABELS
    assert [_describe(case) for _, case in float64_cases] == [
        ((16,), "int", {"eps": 1e-5}, (3, 16), "float64", both),
        ((4, 5), "tuple", {"eps": 1e-5}, (3, 4, 5), "float64", both),
    ]
    around_1000 = float64_cases[0][1]["x"]
    assert abs(around_1000.mean() - 1000) < 1
    # float32 keeps about 4 decimals of a unit spread around 1000: its spacing there
    assert np.spacing(np.float32(1000)) == 2.0 ** -14 and 1e-5 < 2.0 ** -14 < 1e-4
    for label, case in cases + float64_cases:
        for key in both:
            assert case[key].shape == tuple(case["normalized_shape"]), label
            assert case[key].dtype == case["x"].dtype, label
    identity = [cases[i][1] for i in (0, 6, 8)]
    for case in identity:  # "gamma = 1, beta = 0" and the offset cases
        assert np.all(case["set_weight"] == 1) and np.all(case["set_bias"] == 0)
    constant = cases[3][1]["x"]
    assert np.ptp(constant[1]) == 0 and np.ptp(constant[0]) > 0 and np.ptp(constant[2]) > 0
    assert abs(cases[6][1]["x"].mean() - 10) < 0.5  # "with an offset of 10"


def test_random_gamma_and_beta_are_spread_around_one_and_zero():
    """Random gamma ~ N(1, 0.5), beta ~ N(0, 0.5): distinct enough to tell gamma
    from beta, a missing affine and a swap apart."""
    weights, biases = [], []
    for name in ("my_layer_norm_forward", "my_layer_norm_autograd", "add_layer_norm_module"):
        for _, case in _cases(name):
            if "set_bias" in case and np.any(case["set_bias"] != 0):
                weights.append(case["set_weight"].ravel())
                biases.append(case["set_bias"].ravel())
    weights, biases = np.concatenate(weights), np.concatenate(biases)
    assert abs(weights.mean() - 1) < 0.1 and 0.4 < weights.std() < 0.6
    assert abs(biases.mean()) < 0.1 and 0.4 < biases.std() < 0.6


def test_flag_cases_are_what_their_labels_say():
    cases = _cases("my_layer_norm_flags")
    assert [label for label, _ in cases] == FLAG_LABELS
    both, weight = ("set_weight", "set_bias"), ("set_weight",)
    assert [_describe(case) for _, case in cases] == [
        ((4,), "int", {}, (2, 4), "float32", both),
        ((8,), "int", {"eps": 0.5}, (3, 8), "float32", both),
        ((2, 4), "tuple", {"eps": 1e-3}, (3, 2, 4), "float32", both),
        ((8,), "int", {"elementwise_affine": False}, (2, 3, 8), "float32", ()),
        ((3, 4), "tuple", {"eps": 0.1, "elementwise_affine": False}, (2, 3, 4), "float32", ()),
        ((8,), "int", {"bias": False}, (4, 8), "float32", weight),
        ((2, 3), "tuple", {"bias": False}, (4, 2, 3), "float32", weight),
        ((8,), "int", {"elementwise_affine": False, "bias": False}, (2, 8), "float32", ()),
    ]
    tiny = cases[0][1]
    np.testing.assert_allclose(tiny["x"], [[0.002, 0.004, 0.006, 0.008],
                                           [0.001, -0.001, 0.003, 0.0]], rtol=1e-6)
    assert np.all(tiny["set_weight"] == 1) and np.all(tiny["set_bias"] == 0)
    assert cases[2][1]["x"].std() < 0.05  # "small spread"
    for _, case in cases[5:7]:
        assert case["set_weight"].shape == tuple(case["normalized_shape"])
        assert case["set_weight"].dtype == np.float32 and np.ptp(case["set_weight"]) > 0


def test_low_precision_cases_are_what_their_labels_say():
    """Each input holds values its half-precision dtype stores exactly, around the
    magnitude and at the spacing its label names."""
    cases = _cases("my_layer_norm_low_precision")
    assert [label for label, _ in cases] == LOW_PRECISION_LABELS
    for (_, case), dtype, centre, spacing in zip(
            cases, (torch.bfloat16, torch.float16), (300, 1000), (2.0, 0.5)):
        x = torch.from_numpy(case["x"])
        assert str(case["x_dtype"]) == str(dtype).removeprefix("torch.")
        assert torch.equal(x.to(dtype).float(), x)  # exact in the half dtype
        assert abs(x.mean().item() - centre) < 1
        above = torch.tensor(float(centre)).to(dtype).float() + 0.75 * spacing
        assert above.to(dtype).float().item() - centre == spacing
    assert np.all(cases[0][1]["set_weight"] == 1) and np.ptp(cases[1][1]["set_weight"]) > 0


@pytest.mark.parametrize("seed", range(3))
def test_the_cancelling_affine_case_is_what_its_label_says(seed):
    """bfloat16 values and parameters; gamma in [64, 128]; on token 0 torch's outputs
    are about 1 while gamma * x_hat is about 100, so that rounding the product to
    bfloat16 (spacing 0.5 there) is out of the tolerance."""
    _, case = _cases("my_layer_norm_low_precision", seed)[2]
    x, gamma, beta = (torch.from_numpy(case[key]) for key in ("x", "set_weight", "set_bias"))
    for values in (x, gamma, beta):
        assert torch.equal(values.bfloat16().float(), values)  # exact in bfloat16
    assert str(case["x_dtype"]) == str(case["param_dtype"]) == "bfloat16"
    assert x.shape == (4, 256) and 64 <= gamma.min() and gamma.max() <= 128
    x_hat = nn.functional.layer_norm(x.double(), (256,))
    token_0 = (gamma * x_hat + beta)[0]
    assert token_0.abs().mean() < 1.5 and token_0.abs().max() < 5  # "about 1"
    assert (gamma * x_hat)[0].abs().median() > 30  # what beta cancels
    torch_bf16 = nn.LayerNorm(256).to(torch.bfloat16)
    with torch.no_grad():
        torch_bf16.weight.copy_(gamma)
        torch_bf16.bias.copy_(beta)
        assert mismatch(torch_bf16(x.bfloat16()).double().numpy(), J._reference_output(case),
                        dtype="bfloat16") is None


@pytest.mark.parametrize("name, labels", [
    ("my_layer_norm_forward", FORWARD_LABELS), ("my_layer_norm_float64", FLOAT64_LABELS),
    ("my_layer_norm_flags", FLAG_LABELS),
    ("my_layer_norm_low_precision", LOW_PRECISION_LABELS)])
def test_torchs_module_passes_forward_and_flags(name, labels):
    """nn.LayerNorm itself passes every case, and the message lists them all."""
    for seed in (0, 1):
        verdict = _verdict(name, TorchLayerNorm, P._probe_module, seed)
        assert verdict == {"passed": True, "case": None, "message": (
            f"{name}: all {len(labels)} cases passed (" + ", ".join(labels) + ")")}


def _torch_ln(x, dims, eps, correction=0):
    mean = x.mean(dims, keepdim=True)
    var = x.var(dims, keepdim=True, correction=correction)
    return (x - mean) / torch.sqrt(var + eps)


def _slipped_output(case, slip):
    """The output of a module with one slip, computed in torch (float64), as the probe
    reports it (float32 back for a float32 input)."""
    x = torch.from_numpy(np.asarray(case["x"], np.float64))
    k = len(case["normalized_shape"])
    dims = tuple(range(x.dim() - k, x.dim()))
    eps = float(case["eps"]) if "eps" in case else 1e-5
    gamma = torch.from_numpy(np.asarray(case.get("set_weight", 1.0), np.float64))
    beta = torch.from_numpy(np.asarray(case.get("set_bias", 0.0), np.float64))
    mean = x.mean(dims, keepdim=True)
    var = x.var(dims, keepdim=True, correction=0)
    x_hat = {
        "n - 1": lambda: _torch_ln(x, dims, eps, correction=1),
        "eps outside": lambda: (x - mean) / (var.sqrt() + eps),
        "no eps": lambda: (x - mean) / var.sqrt(),
        "fixed eps": lambda: _torch_ln(x, dims, 1e-5),
        "eps 1e-6": lambda: _torch_ln(x, dims, 1e-6),
        "eps 1e-8": lambda: _torch_ln(x, dims, 1e-8),
        "eps 1e-3": lambda: _torch_ln(x, dims, 1e-3),
        "last dim": lambda: _torch_ln(x, (-1,), eps),
        "whole batch": lambda: _torch_ln(x, tuple(range(x.dim())), eps),
        "all but first": lambda: _torch_ln(x, tuple(range(1, x.dim())), eps),
    }.get(slip, lambda: _torch_ln(x, dims, eps))()
    if slip == "swap":
        y = beta * x_hat + gamma
    elif slip == "no affine":
        y = x_hat
    else:
        y = gamma * x_hat + beta
    dtype = case["x"].dtype
    names = ",".join(dict(nn.LayerNorm(
        1, **{k: bool(case[k]) for k in ("elementwise_affine", "bias") if k in case}
    ).named_parameters()))
    y = y.numpy().astype(dtype)
    if "x_dtype" in case:  # a bfloat16 input: the output comes back in bfloat16
        return {"y": J._bfloat16_values(y), "y_dtype": np.array(f"torch.{case['x_dtype']}"),
                "names": np.array(names)}
    return {"y": y, "y_dtype": np.array(f"torch.{dtype.name}"), "names": np.array(names)}


def _torch_reference(case):
    """nn.functional.layer_norm in float64 with the case's gamma and beta."""
    x = torch.from_numpy(np.asarray(case["x"], np.float64))
    shape = tuple(int(n) for n in case["normalized_shape"])
    weight = torch.from_numpy(np.asarray(case["set_weight"], np.float64)) if (
        "set_weight" in case and case.get("elementwise_affine", True)) else None
    bias = torch.from_numpy(np.asarray(case["set_bias"], np.float64)) if (
        "set_bias" in case and case.get("elementwise_affine", True)
        and case.get("bias", True)) else None
    eps = float(case["eps"]) if "eps" in case else 1e-5
    return nn.functional.layer_norm(x, shape, weight, bias, eps).numpy()


H_UNBIASED = ("the variance divides by the number of elements n, not n - 1 (torch.var's "
              "default is unbiased: pass correction=0 or unbiased=False)")
H_EPS_INSIDE = "eps goes inside the square root: (x - mean) / sqrt(var + eps)"
H_NO_EPS = "eps is missing: add it to the variance before the square root"
H_SWAP = "gamma scales and beta shifts: weight * x_hat + bias"
H_NO_AFFINE = "gamma and beta are not applied: multiply by self.weight, then add self.bias"
H_LAST = ("normalize over all the trailing dims in normalized_shape (the last 2), not only "
          "the last one")
H_BATCH = "take the statistics over the trailing normalized_shape dims only, never over the batch"
H_FIRST = ("take the statistics over the trailing normalized_shape dims only, not over "
           "everything but the first dim")


@pytest.mark.parametrize("name, index, slip, hint", [
    ("my_layer_norm_forward", 2, "n - 1", H_UNBIASED),
    ("my_layer_norm_forward", 4, "n - 1", H_UNBIASED),
    ("my_layer_norm_forward", 7, "eps outside", H_EPS_INSIDE),
    ("my_layer_norm_flags", 0, "no eps", H_NO_EPS),
    ("my_layer_norm_forward", 2, "swap", H_SWAP),
    ("my_layer_norm_forward", 7, "swap", H_SWAP),
    ("my_layer_norm_forward", 3, "no affine", H_NO_AFFINE),
    ("my_layer_norm_forward", 4, "last dim", H_LAST),
    ("my_layer_norm_forward", 4, "whole batch", H_BATCH),
    ("my_layer_norm_forward", 0, "whole batch", H_BATCH),
    ("my_layer_norm_forward", 2, "all but first", H_FIRST),
    ("my_layer_norm_forward", 6, "all but first", H_FIRST),
    ("my_layer_norm_flags", 1, "fixed eps", "use the eps you were given (0.5), not a fixed 1e-5"),
    ("my_layer_norm_flags", 4, "fixed eps", "use the eps you were given (0.1), not a fixed 1e-5"),
    ("my_layer_norm_flags", 0, "eps 1e-6", "the default eps is 1e-5, not 1e-06"),
    ("my_layer_norm_flags", 0, "eps 1e-8", "the default eps is 1e-5, not 1e-08"),
    ("my_layer_norm_flags", 0, "eps 1e-3", "the default eps is 1e-5, not 0.001"),
    ("my_layer_norm_flags", 5, "swap", H_SWAP),
])
def test_forward_slips_get_the_hint_that_names_them(name, index, slip, hint):
    """The judge reproduces each slip and names it after the numbers that differ."""
    case = _case(name, index)
    output = _slipped_output(case, slip)
    expected = mismatch(output["y"], _torch_reference(case), dtype=case["x"].dtype,
                        what="your output")
    assert expected is not None
    assert _judge(name, case, output) == expected + HINT + hint


@pytest.mark.parametrize("index", [0, 3, 6])
@pytest.mark.parametrize("slip", ["n - 1", "eps outside"])
def test_the_flags_check_leaves_the_variance_and_eps_place_to_the_forward_check(index, slip):
    """The flags handled right around n - 1, or around eps outside the square
    root: the forward check charges those."""
    case = _case("my_layer_norm_flags", index)
    assert _judge("my_layer_norm_flags", case, _slipped_output(case, slip)) is None


@pytest.mark.parametrize("index", [0, 1])
@pytest.mark.parametrize("slip", ["n - 1", "eps outside", "swap"])
def test_the_float64_check_leaves_forward_slips_to_the_forward_check(index, slip):
    """A float64 output carrying a slip the forward check names is not charged
    again: the float64 check grades the precision alone."""
    case = _case("my_layer_norm_float64", index)
    assert _judge("my_layer_norm_float64", case, _slipped_output(case, slip)) is None


@pytest.mark.parametrize("name", ["my_layer_norm_forward", "my_layer_norm_float64",
                                  "my_layer_norm_flags", "my_layer_norm_low_precision"])
def test_a_right_output_in_any_form_passes_every_case(name):
    """The slip-free output, computed in torch, passes each case (float64 included)."""
    for _, case in _cases(name):
        assert _judge(name, case, _slipped_output(case, None)) is None


def test_a_wrong_output_with_no_known_slip_gets_no_hint():
    case = _case("my_layer_norm_forward", 2)
    output = _slipped_output(case, None)
    output["y"] = output["y"] * 1.5 + 0.25
    expected = mismatch(output["y"], _torch_reference(case), dtype=np.float32,
                        what="your output")
    assert _judge("my_layer_norm_forward", case, output) == expected


def _float32_output(case, one_pass):
    """The case's layer norm computed in float32, as the probe reports it: the
    variance in two passes, or in one, mean(x**2) - mean(x)**2."""
    x = torch.from_numpy(np.asarray(case["x"]))  # float32
    mean = x.mean(-1, keepdim=True)
    var = ((x * x).mean(-1, keepdim=True) - mean * mean if one_pass
           else ((x - mean) ** 2).mean(-1, keepdim=True))
    y = (x - mean) / torch.sqrt(var + 1e-5)
    return {"y": y.numpy(), "y_dtype": np.array("torch.float32")}


@pytest.mark.parametrize("seed", range(5))
def test_tokens_around_1000_fail_the_one_pass_variance_and_name_it(seed):
    """In float32, mean(x**2) - mean(x)**2 cancels on tokens around 1000 and the
    forward check names it; the two-pass variance passes, and an output that is
    wrong in another way gets no one-pass hint."""
    case = _case("my_layer_norm_forward", 8, seed)
    assert _judge("my_layer_norm_forward", case, _float32_output(case, False)) is None
    message = _judge("my_layer_norm_forward", case, _float32_output(case, True))
    assert message is not None and "E[x^2] - E[x]^2" in message, message
    shifted = _float32_output(case, False)
    shifted["y"] = shifted["y"] + 0.01
    message = _judge("my_layer_norm_forward", case, shifted)
    assert message is not None and "E[x^2]" not in message, message


def test_the_fixed_eps_hint_needs_an_eps_in_the_case():
    """On a default-eps case the eps-you-were-given hint cannot apply."""
    case = _case("my_layer_norm_flags", 0)
    output = _slipped_output(case, "eps 1e-6")
    assert "eps you were given" not in _judge("my_layer_norm_flags", case, output)
    right = _case("my_layer_norm_flags", 1)
    assert J._likely_forward_mistake(right, _torch_reference(right)) is None


def test_likely_mistake_is_none_for_a_wrongly_shaped_output():
    case = _case("my_layer_norm_forward", 4)
    wrong = _slipped_output(case, "last dim")["y"]
    assert J._likely_forward_mistake(case, wrong[0]) is None


def test_bias_false_cases_have_no_beta_in_the_slips():
    """With bias=False beta is 0 in every slip, however the case's arrays look."""
    case = dict(_case("my_layer_norm_flags", 5))
    case["set_bias"] = np.full(8, 3.0, np.float32)  # ignored: bias=False
    clean = {k: v for k, v in case.items() if k != "set_bias"}
    output = _slipped_output(clean, "n - 1")
    assert J._likely_forward_mistake(case, output["y"]) == H_UNBIASED


def test_elementwise_affine_false_ignores_gamma_and_beta_in_the_slips():
    case = dict(_case("my_layer_norm_flags", 3))
    case["set_weight"] = np.full(8, 2.0, np.float32)
    case["set_bias"] = np.full(8, 3.0, np.float32)
    clean = {k: v for k, v in case.items() if k not in ("set_weight", "set_bias")}
    assert J._likely_forward_mistake(case, _slipped_output(clean, "n - 1")["y"]) == H_UNBIASED


@pytest.mark.parametrize("name, index, y_dtype, shown", [
    ("my_layer_norm_forward", 0, "torch.float64", "torch.float64"),
    ("my_layer_norm_forward", 0, "float32", "float32"),
    ("my_layer_norm_float64", 0, "torch.float32", "torch.float32"),
])
def test_the_output_dtype_must_be_the_inputs(name, index, y_dtype, shown):
    """Right numbers in another dtype (or a numpy array) still fail, with the dtype named."""
    case = _case(name, index)
    output = _slipped_output(case, None)
    output["y_dtype"] = np.array(y_dtype)
    want = f"torch.{case['x'].dtype.name}"
    assert J._judge_forward(case, output) == (
        f"your output's dtype is {shown}; for a {want} input nn.LayerNorm returns {want} "
        "(return a tensor of the input's dtype)")


def test_float64_parameters_also_fail_forward_on_a_float32_input():
    """The forward probe of a float64-parameter module on a float32 input: torch's
    promotion gives a float64 output, which the judge refuses."""
    case = _case("my_layer_norm_forward", 0)
    verdict = _verdict("my_layer_norm_forward", Float64Parameters, P._probe_module)
    assert not verdict["passed"]
    assert verdict["case"] == FORWARD_LABELS[0]
    assert "your code raised" in verdict["message"] or "dtype is torch.float64" in (
        verdict["message"])
    assert case["x"].dtype == np.float32


@pytest.mark.parametrize("module, index, message", [
    (AlwaysBias, 5,
     "with bias=False nn.LayerNorm has only a weight (gamma); your module also creates a "
     "bias. Leave it out (set self.bias = None, or self.register_parameter('bias', None))"),
    (AlwaysAffine, 3,
     "with elementwise_affine=False nn.LayerNorm has no parameters, but your module has "
     "['weight', 'bias']: create none (set self.weight = self.bias = None)"),
])
def test_flags_check_counts_the_parameters(module, index, message):
    case = _case("my_layer_norm_flags", index)
    assert J._judge_flags(case, _probed(module, case)) == message


def test_flags_check_leaves_names_to_the_parameters_check():
    """A misnamed but right module costs the parameters check only, not flags."""
    for _, case in _cases("my_layer_norm_flags")[:3]:
        output = _probed(TorchLayerNorm, case)
        output["names"] = np.array("gamma,beta")
        assert J._judge_flags(case, output) is None


def test_flags_output_is_judged_when_the_count_is_right():
    case = _case("my_layer_norm_flags", 1)
    output = _slipped_output(case, "fixed eps")
    output["names"] = np.array("weight,bias")
    assert J._judge_flags(case, output).endswith(
        HINT + "use the eps you were given (0.5), not a fixed 1e-5")


def test_normalized_helper_divides_by_n_minus_correction():
    x = np.array([[1.0, 2.0, 3.0, 6.0]])
    for correction in (0, 1):
        expected = _torch_ln(torch.from_numpy(x), (-1,), 0.1, correction).numpy()
        np.testing.assert_allclose(J._normalized(x, (1,), 0.1, correction), expected,
                                   rtol=1e-12)
    one = np.array([[5.0]])  # n - correction = 0: no division by zero
    np.testing.assert_array_equal(J._normalized(one, (1,), 1.0, correction=1), [[0.0]])


# ----- state_dict --------------------------------------------------------------------------

STATE_LABELS = ["MyLayerNorm(8) <-> nn.LayerNorm(8)",
                "MyLayerNorm((3, 4)) <-> nn.LayerNorm((3, 4))"]


def test_state_dict_cases_and_a_pass():
    cases = _cases("my_layer_norm_state_dict")
    assert [label for label, _ in cases] == STATE_LABELS
    assert [(tuple(c["normalized_shape"]), str(c["shape_kind"])) for _, c in cases] == [
        ((8,), "int"), ((3, 4), "tuple")]
    for _, case in cases:
        values = [case[k] for k in ("torch_weight", "torch_bias", "my_weight", "my_bias")]
        assert all(v.shape == tuple(case["normalized_shape"]) and v.dtype == np.float32
                   for v in values)
        assert len({v.tobytes() for v in values}) == 4  # four different arrays
    verdict = _verdict("my_layer_norm_state_dict", BiasFirst, P._probe_state_dict)
    assert verdict == {"passed": True, "case": None, "message": (
        "my_layer_norm_state_dict: all 2 cases passed (" + ", ".join(STATE_LABELS) + ")")}


def test_state_dict_loading_errors_are_reported_both_ways():
    case = _case("my_layer_norm_state_dict", 1)
    output = _probed(GammaBeta, case, P._probe_state_dict)
    message = J._judge_state_dict(case, output)
    error = str(output["into_mine_error"]).rstrip(" .")
    assert message == (
        f"loading nn.LayerNorm's state_dict into your module failed: {error}. Your "
        "state_dict holds ['gamma', 'beta']; nn.LayerNorm's holds ['weight', 'bias'] with "
        "the shape normalized_shape")
    assert "Missing key(s)" in error
    output = {"state_keys": np.array("W_X"), "into_mine_error": np.array(
        "RuntimeError: unexpected key in state_dict: W_X. ")}
    assert J._judge_state_dict(case, output).startswith(  # only the " ." at the end goes
        "loading nn.LayerNorm's state_dict into your module failed: RuntimeError: unexpected "
        "key in state_dict: W_X. Your state_dict holds ['W_X']")
    output = {"state_keys": np.array("weight,bias"), "mine_weight": case["torch_weight"],
              "mine_bias": case["torch_bias"],
              "into_torch_error": np.array("RuntimeError: size mismatch . ")}
    assert J._judge_state_dict(case, output) == (
        "loading your state_dict into nn.LayerNorm failed: RuntimeError: size mismatch. Your "
        "state_dict holds ['weight', 'bias']; nn.LayerNorm's holds ['weight', 'bias'] with "
        "the shape normalized_shape")


@pytest.mark.parametrize("key, what", [
    ("mine_weight", "your weight after loading nn.LayerNorm's state_dict"),
    ("mine_bias", "your bias after loading nn.LayerNorm's state_dict"),
    ("torch_weight", "nn.LayerNorm's weight after loading your state_dict"),
    ("torch_bias", "nn.LayerNorm's bias after loading your state_dict"),
])
def test_state_dict_values_that_do_not_survive_are_named(key, what):
    """Each of the four values must come through the state_dict unchanged."""
    case = _case("my_layer_norm_state_dict", 0)
    output = _probed(TorchLayerNorm, case, P._probe_state_dict)
    assert J._judge_state_dict(case, output) is None
    output[key] = output[key] + np.float32(0.5)
    source = case[key.replace("mine_", "torch_") if key.startswith("mine") else
                  key.replace("torch_", "my_")]
    assert J._judge_state_dict(case, output) == mismatch(
        output[key], source, dtype="float32", what=what)


def test_state_dict_values_are_held_to_float32_precision():
    case = _case("my_layer_norm_state_dict", 0)
    output = _probed(TorchLayerNorm, case, P._probe_state_dict)
    for key in ("mine_weight", "torch_bias"):
        output[key] = output[key] * np.float32(1 + 2e-6)
    assert J._judge_state_dict(case, output) is None


# ----- autograd ------------------------------------------------------------------------------

AUTOGRAD_LABELS = [
    "MyLayerNorm(8, eps=1e-5) on a batch of 3 tokens, float64",
    "MyLayerNorm(16) on (batch 2, sequence 4, features 16), float32",
    "MyLayerNorm((2, 3), eps=1e-5) on (4, 2, 3), float64",
]


def test_autograd_cases_are_what_their_labels_say():
    cases = _cases("my_layer_norm_autograd")
    assert [label for label, _ in cases] == AUTOGRAD_LABELS
    both = ("set_weight", "set_bias")
    assert [_describe(case) for _, case in cases] == [
        ((8,), "int", {"eps": 1e-5}, (3, 8), "float64", both),
        ((16,), "int", {}, (2, 4, 16), "float32", both),
        ((2, 3), "tuple", {"eps": 1e-5}, (4, 2, 3), "float64", both),
    ]
    for _, case in cases:
        assert case["upstream"].shape == case["x"].shape
        assert case["upstream"].dtype == case["x"].dtype
        assert case["set_weight"].dtype == case["x"].dtype


def _torch_gradients(case, detach_stats=False):
    """Gradients of sum(upstream * layer_norm(x)) from torch autograd in float64;
    with detach_stats, the mean and variance are treated as constants (the classic
    slip that drops both correction terms)."""
    x = torch.from_numpy(np.asarray(case["x"], np.float64)).requires_grad_(True)
    weight = torch.from_numpy(np.asarray(case["set_weight"], np.float64)).requires_grad_(True)
    bias = torch.from_numpy(np.asarray(case["set_bias"], np.float64)).requires_grad_(True)
    k = len(case["normalized_shape"])
    dims = tuple(range(x.dim() - k, x.dim()))
    eps = float(case["eps"]) if "eps" in case else 1e-5
    mean, var = x.mean(dims, keepdim=True), x.var(dims, keepdim=True, correction=0)
    if detach_stats:
        mean, var = mean.detach(), var.detach()
    y = (x - mean) / torch.sqrt(var + eps) * weight + bias
    (y * torch.from_numpy(np.asarray(case["upstream"], np.float64))).sum().backward()
    dtype = case["x"].dtype
    return {"x_grad": x.grad.numpy().astype(dtype),
            "weight_grad": weight.grad.numpy().astype(dtype),
            "bias_grad": bias.grad.numpy().astype(dtype), "missing": np.array("")}


def test_torch_gradients_pass_and_the_probe_reports_them():
    for _, case in _cases("my_layer_norm_autograd"):
        assert J._judge_autograd(case, _torch_gradients(case)) is None
    verdict = _verdict("my_layer_norm_autograd", TorchLayerNorm, P._probe_autograd)
    assert verdict == {"passed": True, "case": None, "message": (
        "my_layer_norm_autograd: all 3 cases passed (" + ", ".join(AUTOGRAD_LABELS) + ")")}


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_gradient_missing_the_statistics_terms_fails_on_x(index):
    """Detached mean and variance: dx lacks both correction terms; the message
    says so and points at the forward check; dgamma and dbeta would be right."""
    case = _case("my_layer_norm_autograd", index)
    wrong = _torch_gradients(case, detach_stats=True)
    right = _torch_gradients(case)
    expected = mismatch(wrong["x_grad"], right["x_grad"], dtype=case["x"].dtype,
                        what="the gradient with respect to x")
    assert J._judge_autograd(case, wrong) == (
        expected + ". The forward pass itself may be off: run the forward check")


@pytest.mark.parametrize("key, what, tail", [
    ("weight_grad", "the gradient with respect to weight",
     ". The forward pass itself may be off: run the forward check"),
    ("bias_grad", "the gradient with respect to bias", ""),
])
def test_wrong_parameter_gradients_are_named(key, what, tail):
    case = _case("my_layer_norm_autograd", 2)
    output = _torch_gradients(case)
    right = output[key]
    output[key] = right * 2
    assert J._judge_autograd(case, output) == mismatch(
        output[key], right, dtype=np.float64, what=what) + tail


def test_gradients_are_held_to_the_inputs_precision():
    """float32 gradients within float32 tolerance pass; float64 ones must be tighter."""
    case32 = _case("my_layer_norm_autograd", 1)
    output = _torch_gradients(case32)
    output["x_grad"] = output["x_grad"] * np.float32(1 + 2e-5)
    assert J._judge_autograd(case32, output) is None
    case64 = _case("my_layer_norm_autograd", 0)
    output = _torch_gradients(case64)
    output["x_grad"] = output["x_grad"] * (1 + 2e-5)
    assert J._judge_autograd(case64, output).startswith("the gradient with respect to x is")


class HandWrittenNorm(nn.Module):
    """nn.LayerNorm's parameters on the module, and the axes it normalizes: a base for
    hand-written forwards."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        self.inner = nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias=bias)
        self.weight, self.bias = self.inner.weight, self.inner.bias
        self.dims = tuple(range(-len(self.inner.normalized_shape), 0))


class DetachedStatistics(HandWrittenNorm):
    """A right forward whose mean and variance are detached: dx is wrong."""

    def forward(self, x):
        mean = x.mean(self.dims, keepdim=True).detach()
        var = x.var(self.dims, keepdim=True, correction=0).detach()
        return (x - mean) / torch.sqrt(var + self.inner.eps) * self.weight + self.bias


def test_a_right_forward_with_wrong_gradients_is_not_sent_to_the_forward_check():
    """The probe reports the forward too: when it is right, the message says so and
    points at what autograd cannot follow, never at the forward check."""
    verdict = _verdict("my_layer_norm_autograd", DetachedStatistics, P._probe_autograd)
    assert verdict["case"] == AUTOGRAD_LABELS[0]
    assert verdict["message"].startswith(
        "my_layer_norm_autograd, " + AUTOGRAD_LABELS[0] + ": the gradient with respect to x is")
    assert verdict["message"].endswith(J._FORWARD_RIGHT)
    assert "run the forward check" not in verdict["message"]


def test_a_float64_input_computed_in_float32_is_charged_by_the_float64_check_only():
    """x.float() and back: the forward and the gradients are right to float32's
    accuracy only; the float64 check charges that, autograd does not again."""
    assert _verdict("my_layer_norm_autograd", Float32Everywhere, P._probe_autograd)["passed"]
    assert not _verdict("my_layer_norm_float64", Float32Everywhere, P._probe_module)["passed"]
    case = _case("my_layer_norm_autograd", 0)
    output = _probed(Float32Everywhere, case, P._probe_autograd)
    assert mismatch(output["x_grad"], _torch_gradients(case)["x_grad"], dtype=np.float64)
    # gradients off by more than float32 round-off are still charged, forward or not
    output["x_grad"] = output["x_grad"] * (1 + 2e-3)
    assert J._judge_autograd(case, output).endswith("run the forward check")


def test_float64_gradients_off_by_more_than_round_off_fail_beside_a_right_forward():
    case = _case("my_layer_norm_autograd", 0)
    output = _probed(TorchLayerNorm, case, P._probe_autograd)
    output["x_grad"] = output["x_grad"] * (1 + 2e-5)
    assert J._judge_autograd(case, output).endswith(J._FORWARD_RIGHT)


def test_the_reason_after_all_is_quoted_whole():
    """Everything after "all: " is the probe's reason, colons included."""
    case = _case("my_layer_norm_autograd", 0)
    output = {"missing": np.array("all: the output is a float: not a tensor")}
    assert J._judge_autograd(case, output) == (
        "the output is a float: not a tensor: compute the output with torch operations on "
        "the input and the parameters, without detaching")


@pytest.mark.parametrize("missing, message", [
    ("all: the output is not connected to the autograd graph",
     "the output is not connected to the autograd graph: compute the output with torch "
     "operations on the input and the parameters, without detaching"),
    ("x_grad", "no gradient reached the input x: keep the forward pass in torch (no "
     ".numpy(), .item(), .detach() or torch.no_grad())"),
    ("weight_grad,bias_grad",
     "weight (gamma) got no gradient: make it an nn.Parameter and use it in forward"),
    ("bias_grad",
     "bias (beta) got no gradient: make it an nn.Parameter and use it in forward"),
])
def test_missing_gradients_are_explained(missing, message):
    case = _case("my_layer_norm_autograd", 0)
    assert J._judge_autograd(case, {"missing": np.array(missing)}) == message


# ----- the shape error -----------------------------------------------------------------------

SHAPE_ERROR_LABELS = [
    "MyLayerNorm((3, 4)) on an input of shape (2, 5, 4)",
    "MyLayerNorm(6) on an input of shape (2, 3, 5)",
    "MyLayerNorm((3, 4)) on an input of shape (2, 4, 3), same size, dims swapped",
    "MyLayerNorm((3, 4)) on an input of shape (12,), too few dims",
    "MyLayerNorm(8, elementwise_affine=False) on an input of shape (4, 6)",
    "MyLayerNorm((3, 4)) on a valid input of shape (2, 2, 3, 4)",
]


def test_shape_error_cases_are_what_their_labels_say():
    cases = _cases("my_layer_norm_shape_error")
    assert [label for label, _ in cases] == SHAPE_ERROR_LABELS
    described = [(tuple(int(n) for n in c["normalized_shape"]), str(c["shape_kind"]),
                  tuple(int(n) for n in c["x_shape"]),
                  {k: c[k].item() for k in ("elementwise_affine",) if k in c})
                 for _, c in cases]
    assert described == [((3, 4), "tuple", (2, 5, 4), {}), ((6,), "int", (2, 3, 5), {}),
                         ((3, 4), "tuple", (2, 4, 3), {}), ((3, 4), "tuple", (12,), {}),
                         ((8,), "int", (4, 6), {"elementwise_affine": False}),
                         ((3, 4), "tuple", (2, 2, 3, 4), {})]
    assert all(c["x_shape"].dtype == np.int64 for _, c in cases)
    verdict = _verdict("my_layer_norm_shape_error", TorchLayerNorm, P._probe_shape_error)
    assert verdict == {"passed": True, "case": None, "message": (
        "my_layer_norm_shape_error: all 6 cases passed (" + ", ".join(SHAPE_ERROR_LABELS)
        + ")")}


def _raised(exc, classes=None):
    return {"raised": np.array(True), "error_type": np.array(type(exc).__name__),
            "error_classes": np.array(classes if classes is not None else [
                f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__]),
            "message": np.array(str(exc))}


NOT_RAISED = {"raised": np.array(False)}


def test_a_valid_input_must_not_raise():
    case = _case("my_layer_norm_shape_error", 5)
    assert J._judge_shape_error(case, NOT_RAISED) is None
    assert J._judge_shape_error(case, _raised(ValueError("no 4-D input"))) == (
        "your module raised ValueError: no 4-D input on an input of shape [2, 2, 3, 4], "
        "whose trailing dims are [3, 4]: any number of leading dims is fine")


@pytest.mark.parametrize("index, message", [
    (0, "your module returned an output for an input of shape [2, 5, 4] although "
        "normalized_shape is [3, 4]: raise an error when the last 2 dims of the input are "
        "not exactly normalized_shape"),
    (2, "your module returned an output for an input of shape [2, 4, 3] (its trailing dims "
        "hold the same number of elements, but not the same shape) although "
        "normalized_shape is [3, 4]: raise an error when the last 2 dims of the input are "
        "not exactly normalized_shape"),
    (3, "your module returned an output for an input of shape [12] although "
        "normalized_shape is [3, 4]: raise an error when the last 2 dims of the input are "
        "not exactly normalized_shape"),
    (1, "your module returned an output for an input of shape [2, 3, 5] although "
        "normalized_shape is [6]: raise an error when the last 1 dims of the input are "
        "not exactly normalized_shape"),
])
def test_a_mismatched_input_must_raise(index, message):
    """No error on a mismatched input fails; same-size trailing dims get the extra note."""
    assert J._judge_shape_error(_case("my_layer_norm_shape_error", index), NOT_RAISED) == (
        message)


def test_torchs_own_message_passes_and_vague_ones_fail():
    case = _case("my_layer_norm_shape_error", 0)
    theirs = _probed(TorchLayerNorm, case, P._probe_shape_error)
    assert J._judge_shape_error(case, theirs) is None
    assert J._judge_shape_error(case, _raised(ValueError(
        "expected trailing dims (3, 4), got input (2, 5, 4)"))) is None
    for vague in ("input has the wrong shape", "expected [3, 4]", "got size [2, 5, 4]",
                  "expected [3, 5] got [2, 4, 4]"):
        assert J._judge_shape_error(case, _raised(ValueError(vague))) == (
            f"your module raised ValueError: {vague}; a clear message names both the "
            "expected trailing shape [3, 4] and the input's shape [2, 5, 4], as torch's does "
            '("Given normalized_shape=[...], expected input with shape [*, ...], but got '
            'input of size[...]")')


def test_errors_from_inside_the_computation_and_placeholders_are_named():
    case = _case("my_layer_norm_shape_error", 1)
    broadcast = RuntimeError("The size of tensor a (5) must match the size of tensor b (6) "
                             "at non-singleton dimension 2")
    assert J._judge_shape_error(case, _raised(broadcast)) == (
        f"your module raised RuntimeError: {broadcast}. That error comes from inside the "
        "computation (gamma does not broadcast); check the input's shape first and raise an "
        "error that names both shapes")

    class Placeholder(NotImplementedError):
        pass

    assert J._judge_shape_error(case, _raised(Placeholder("write me"))) == (
        "your module raised Placeholder: write me: the forward pass is not written yet")
    by_name = _raised(NotImplementedError("todo"), classes=[])
    assert J._judge_shape_error(case, by_name) == (
        "your module raised NotImplementedError: todo: the forward pass is not written yet")
    no_classes = {k: v for k, v in _raised(NotImplementedError("todo")).items()
                  if k != "error_classes"}
    no_classes["error_type"] = np.array("NotImplementedError")
    assert "not written yet" in J._judge_shape_error(case, no_classes)


def test_mentions_finds_a_contiguous_run_of_numbers():
    assert J._mentions("Given [3, 4], got [2, 5, 4]", [2, 5, 4])
    assert J._mentions("shape 3x4", [3, 4])
    assert J._mentions("12", [12])
    assert not J._mentions("got 2 then 4 then 5", [2, 5])
    assert not J._mentions("got [2, 5]", [2, 5, 4])
    assert not J._mentions("", [3])
    assert J._mentions("at the end 7 8", [7, 8])


def test_shape_error_probe_and_judge_together():
    """A module without a shape check fails the shape_error check on the first case
    (torch's own broadcasting error), a right one passes."""

    class NoCheck(nn.Module):
        def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
            super().__init__()
            shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(
                normalized_shape)
            self.weight = nn.Parameter(torch.ones(shape))

        def forward(self, x):
            return (x - x.mean(-1, keepdim=True)) * self.weight

    verdict = _verdict("my_layer_norm_shape_error", NoCheck, P._probe_shape_error)
    assert not verdict["passed"] and verdict["case"] == SHAPE_ERROR_LABELS[0]
    assert "comes from inside the computation" in verdict["message"]


# ----- AddLayerNorm ----------------------------------------------------------------------------

ADD_LABELS = [
    "AddLayerNorm(8) on x and residual of shape (4, 8), random gamma, beta",
    "AddLayerNorm((3, 4)) on (2, 5, 3, 4) in float64, random gamma, beta",
    "AddLayerNorm(6) called as module(x), residual=None (the first block)",
    "AddLayerNorm(8, bias=False) with random gamma",
    "AddLayerNorm((2, 4), eps=0.01, elementwise_affine=False)",
    "AddLayerNorm(16) after loading nn.LayerNorm(16)'s state_dict",
    "AddLayerNorm((2, 3)) in float64: gradients of both outputs reach x, residual, weight "
    "and bias",
]


class TorchAdd(nn.LayerNorm):
    """x + residual, then torch's own layer norm: right."""

    def forward(self, x, residual=None):
        residual_sum = x if residual is None else x + residual
        return super().forward(residual_sum), residual_sum


def test_add_cases_are_what_their_labels_say():
    cases = _cases("add_layer_norm_module")
    assert [label for label, _ in cases] == ADD_LABELS

    def described(case):
        keys = sorted(set(case) - {"normalized_shape", "shape_kind", "eps", "bias",
                                   "elementwise_affine"})
        return _describe(case)[:5] + (keys,)

    pair = ["residual", "set_bias", "set_weight", "x"]
    assert [described(c) for _, c in cases] == [
        ((8,), "int", {}, (4, 8), "float32", pair),
        ((3, 4), "tuple", {}, (2, 5, 3, 4), "float64", pair),
        ((6,), "int", {}, (3, 6), "float32", ["set_bias", "set_weight", "x"]),
        ((8,), "int", {"bias": False}, (2, 3, 8), "float32", ["residual", "set_weight", "x"]),
        ((2, 4), "tuple", {"eps": 0.01, "elementwise_affine": False}, (3, 2, 4), "float32",
         ["residual", "x"]),
        ((16,), "int", {}, (5, 16), "float32", ["residual", "torch_bias", "torch_weight", "x"]),
        ((2, 3), "tuple", {}, (4, 2, 3), "float64",
         ["residual", "set_bias", "set_weight", "upstream_normed", "upstream_sum", "x"]),
    ]
    for label, case in cases:
        for key, value in case.items():
            if key not in ("normalized_shape", "shape_kind", "eps", "bias",
                           "elementwise_affine"):
                assert value.dtype == case["x"].dtype, (label, key)
                if key.startswith(("set_", "torch_")):
                    assert value.shape == tuple(case["normalized_shape"]), (label, key)
                else:
                    assert value.shape == case["x"].shape, (label, key)
        if "residual" in case:  # x and residual differ, so a swap or x alone shows
            assert not np.allclose(case["x"], case["residual"])
    assert abs(cases[1][1]["x"].mean() - 3) < 1 and abs(cases[4][1]["x"].mean() + 2) < 1
    xs = np.concatenate([cases[i][1]["x"].ravel() for i in (0, 3, 5)])
    residuals = np.concatenate([c["residual"].ravel() for _, c in cases if "residual" in c])
    assert abs(xs.mean()) < 0.5 and 1.7 < xs.std() < 2.3  # x ~ N(0, 2)
    assert abs(residuals.mean()) < 0.2 and 0.8 < residuals.std() < 1.2  # residual ~ N(0, 1)
    upstream = np.concatenate([cases[6][1][k].ravel() for k in ("upstream_sum",
                                                                 "upstream_normed")])
    assert abs(upstream.mean()) < 0.5 and 0.6 < upstream.std() < 1.4


def test_torchs_layer_norm_after_an_add_passes_the_add_check():
    for seed in (0, 1):
        verdict = _verdict("add_layer_norm_module", TorchAdd, P._probe_add_layer_norm, seed)
        assert verdict == {"passed": True, "case": None, "message": (
            "add_layer_norm_module: all 7 cases passed (" + ", ".join(ADD_LABELS) + ")")}


def _add_output(case, slip=None):
    """What the probe reports for a module with `slip`, computed with torch."""
    x = torch.from_numpy(np.asarray(case["x"], np.float64))
    residual = torch.from_numpy(np.asarray(case["residual"], np.float64)) if (
        "residual" in case) else None
    shape = tuple(int(n) for n in case["normalized_shape"])
    sum_ = x if residual is None else x + residual
    ref_case = {**case}
    normed_of = sum_ if slip != "norm x" else x
    y = torch.from_numpy(_torch_reference({**ref_case, "x": normed_of.numpy()}))
    if slip == "no add":
        sum_ = x
    if slip == "swap":
        sum_, y = y, sum_
    dtype = case["x"].dtype
    del shape
    return {"names": np.array("weight,bias"), "sum": sum_.numpy().astype(dtype),
            "y": y.numpy().astype(dtype), "missing": np.array("")}


@pytest.mark.parametrize("slip, hint", [
    ("swap", "return (normed, residual_sum) in that order, as flash-attn's "
     "layer_norm_fn(..., prenorm=True) does"),
    ("norm x", "normalize the sum x + residual, not x alone"),
    ("no add", "the first output is the sum x + residual, which the next block adds to"),
])
def test_add_slips_are_named(slip, hint):
    case = _case("add_layer_norm_module", 0)
    output = _add_output(case, slip)
    right = _add_output(case)
    first = "sum" if slip in ("swap", "no add") else "y"
    what = "your residual_sum" if first == "sum" else "your normed output"
    expected = mismatch(output[first], right[first], dtype=np.float32, what=what)
    assert J._judge_add_layer_norm(case, output) == expected + HINT + hint


@pytest.mark.parametrize("slip, hint", [
    ("swap", "return (normed, residual_sum) in that order, as flash-attn's "
     "layer_norm_fn(..., prenorm=True) does"),
    ("norm x", "normalize the sum x + residual, not x alone"),
    ("no add", "the first output is the sum x + residual, which the next block adds to"),
])
def test_add_slips_are_recognised_at_float32_precision(slip, hint):
    """A float32 module's slips carry round-off (here 1e-5 relative, inside float32's
    tolerance): the hint is still found, at the input's precision."""
    case = _case("add_layer_norm_module", 0)
    output = _add_output(case, slip)
    for key in ("sum", "y"):
        output[key] = output[key] * np.float32(1 + 1e-5)
    assert J._judge_add_layer_norm(case, output).endswith(HINT + hint)


def test_add_hints_only_for_the_slip_they_name():
    """Outputs that merely share one piece with a slip get no hint: the sum twice,
    a right sum with a wrong norm, a wrong sum with a right norm."""
    case = _case("add_layer_norm_module", 0)
    right = _add_output(case)
    twice = {**right, "y": right["sum"]}  # (residual_sum, residual_sum)
    assert HINT not in J._judge_add_layer_norm(case, twice)
    scaled = {**right, "y": right["y"] * 2}
    assert J._judge_add_layer_norm(case, scaled) == mismatch(
        scaled["y"], right["y"], dtype=np.float32, what="your normed output")
    first = _case("add_layer_norm_module", 2)  # module(x): no residual
    right = _add_output(first)
    wrong_sum = {**right, "sum": right["sum"] * 2}
    assert J._judge_add_layer_norm(first, wrong_sum) == mismatch(
        wrong_sum["sum"], right["sum"], dtype=np.float32, what="your residual_sum")


def test_add_slips_need_a_residual_for_their_hints():
    """Called as module(x), x is the sum: a wrong normed output gets no add hint."""
    case = _case("add_layer_norm_module", 2)
    output = _add_output(case)
    output["y"] = output["y"] * 2
    expected = mismatch(output["y"], _add_output(case)["y"], dtype=np.float32,
                        what="your normed output")
    assert J._judge_add_layer_norm(case, output) == expected
    assert J._likely_add_mistake(case, *J._reference_add(case)[:2], output) is None


def test_add_float64_cases_are_judged_at_float64_precision():
    case = _case("add_layer_norm_module", 1)
    output = _add_output(case)
    assert J._judge_add_layer_norm(case, output) is None
    output["y"] = output["y"] * (1 + 2e-5)
    assert J._judge_add_layer_norm(case, output).startswith("your normed output is")
    swapped = _add_output(case, "swap")
    assert J._judge_add_layer_norm(case, swapped).endswith(
        HINT + "return (normed, residual_sum) in that order, as flash-attn's "
        "layer_norm_fn(..., prenorm=True) does")


def test_add_structure_problems_are_named():
    case = _case("add_layer_norm_module", 0)
    assert J._judge_add_layer_norm(case, {"load_error": np.array(
        "RuntimeError: Missing key(s) in state_dict: \"norm.weight\". ")}) == (
        "loading nn.LayerNorm's state_dict failed: RuntimeError: Missing key(s) in "
        "state_dict: \"norm.weight\". Name the parameters weight and bias, of shape "
        "normalized_shape, directly on the module (not inside a submodule)")
    assert J._judge_add_layer_norm(case, {"load_error": np.array(
        "RuntimeError: unexpected key W_X .")}).startswith(
        "loading nn.LayerNorm's state_dict failed: RuntimeError: unexpected key W_X. Name")
    assert J._judge_add_layer_norm(case, {"returned": np.array("a Tensor")}) == (
        "your module returned a Tensor; it returns a pair (normed, residual_sum)")
    output = _add_output(case)
    output["names"] = np.array("norm.weight,norm.bias")
    assert J._judge_add_layer_norm(case, output) == (
        "your module's parameters are ['norm.weight', 'norm.bias']; with these arguments "
        "nn.LayerNorm's are ['weight', 'bias'], and yours must be the same, by name")
    bias_first = _add_output(case)
    bias_first["names"] = np.array("bias,weight")
    assert J._judge_add_layer_norm(case, bias_first) is None
    no_bias = _case("add_layer_norm_module", 3)
    assert J._judge_add_layer_norm(no_bias, _add_output(no_bias)).startswith(
        "your module's parameters are ['weight', 'bias']; with these arguments nn.LayerNorm's "
        "are ['weight']")


def _add_gradients(case, slip=None):
    """Gradients from torch autograd of the add-norm loss; slip "detached sum" drops
    the residual_sum path (x's gradient then lacks upstream_sum)."""
    leaves = {k: torch.from_numpy(np.asarray(case[k], np.float64)).requires_grad_(True)
              for k in ("x", "residual", "set_weight", "set_bias")}
    shape = tuple(int(n) for n in case["normalized_shape"])
    residual_sum = leaves["x"] + leaves["residual"]
    normed = nn.functional.layer_norm(residual_sum, shape, leaves["set_weight"],
                                      leaves["set_bias"], 1e-5)
    loss = (normed * torch.from_numpy(case["upstream_normed"])).sum()
    if slip != "detached sum":
        loss = loss + (residual_sum * torch.from_numpy(case["upstream_sum"])).sum()
    loss.backward()
    output = _add_output(case)
    for key, leaf in (("x_grad", "x"), ("residual_grad", "residual"),
                      ("weight_grad", "set_weight"), ("bias_grad", "set_bias")):
        output[key] = leaves[leaf].grad.numpy()
    return output


def test_add_gradients_from_torch_pass_and_slips_fail():
    case = _case("add_layer_norm_module", 6)
    assert J._judge_add_layer_norm(case, _add_gradients(case)) is None
    right = _add_gradients(case)
    wrong = _add_gradients(case, "detached sum")
    tail = (". The loss uses both outputs: the gradient of x gets residual_sum's upstream as "
            "well as the part through the norm")
    assert J._judge_add_layer_norm(case, wrong) == mismatch(
        wrong["x_grad"], right["x_grad"], dtype=np.float64,
        what="the gradient with respect to x") + tail
    for key, what in (("residual_grad", "residual"), ("weight_grad", "weight"),
                      ("bias_grad", "bias")):
        output = _add_gradients(case)
        output[key] = output[key] * 1.5
        assert J._judge_add_layer_norm(case, output) == mismatch(
            output[key], right[key], dtype=np.float64,
            what=f"the gradient with respect to {what}") + tail


@pytest.mark.parametrize("missing, name", [("x_grad,residual_grad", "x"),
                                           ("residual_grad", "residual"),
                                           ("weight_grad,bias_grad", "weight")])
def test_add_missing_gradients_are_named(missing, name):
    case = _case("add_layer_norm_module", 6)
    output = _add_gradients(case)
    output["missing"] = np.array(missing)
    assert J._judge_add_layer_norm(case, output) == (
        f"no gradient reached {name}: both outputs must stay in the autograd graph (torch "
        "operations only, nothing detached), and the gradient of residual_sum flows to x "
        "and residual")


def test_reference_add_against_torch():
    """normref's AddLayerNorm reference, with the case's gamma/beta or torch_weight/bias."""
    case = _case("add_layer_norm_module", 5)
    residual_sum, normed, gradients = J._reference_add(case)
    x = torch.from_numpy(case["x"].astype(np.float64)) + torch.from_numpy(
        case["residual"].astype(np.float64))
    expected = nn.functional.layer_norm(
        x, (16,), torch.from_numpy(case["torch_weight"].astype(np.float64)),
        torch.from_numpy(case["torch_bias"].astype(np.float64)))
    np.testing.assert_allclose(residual_sum, x.numpy(), rtol=1e-12)
    np.testing.assert_allclose(normed, expected.numpy(), rtol=1e-10, atol=1e-12)
    assert gradients is None
    case = _case("add_layer_norm_module", 6)
    _, _, gradients = J._reference_add(case)
    right = _add_gradients(case)
    for key in ("x_grad", "residual_grad", "weight_grad", "bias_grad"):
        np.testing.assert_allclose(gradients[key], right[key], rtol=1e-10, atol=1e-12)


# ----- the graded questions ----------------------------------------------------------------


def test_the_invariance_truths_follow_from_what_each_layer_normalizes_over():
    """Instance norm ignores a shift or scale shared by a channel's plane (edits 1
    and 3), GroupNorm(2, 8) only one shared by a group of four consecutive channels
    (edit 3); edit 1 moves the first group only (4 * 5 * 5 outputs), edit 2 all
    8 * 5 * 5 of image 0; none moves image 1."""
    image = J.EDITED_BATCH[1] * J.EDITED_BATCH[2] * J.EDITED_BATCH[3]
    assert image == 200
    assert J._invariance_truths() == {"INSTANCENORM_CHANGED": [0, image, 0],
                                      "GROUPNORM2_CHANGED": [image // 2, image, 0]}
    x = torch.randn(J.EDITED_BATCH, dtype=torch.float64)
    one_channel, per_pixel, second_group = J._edited_copies(x)
    for edited in (one_channel, per_pixel, second_group):
        assert torch.equal(edited[1], x[1])
    assert torch.equal(one_channel[0, 1:], x[0, 1:])
    assert torch.allclose(one_channel[0, 0], 3 * x[0, 0])
    offsets = per_pixel[0] - x[0]  # C, H, W: one offset per pixel, shared by channels
    assert torch.allclose(offsets, offsets[:1].expand_as(offsets))
    assert offsets[0].unique().numel() == 25
    assert torch.equal(second_group[0, :4], x[0, :4])
    assert torch.allclose(second_group[0, 4:], 3 * x[0, 4:] + 5)


def test_invariance_answers_name_the_layer_and_the_edit():
    judge = _registry._get("channel_norm_invariances").judge
    right = {"INSTANCENORM_CHANGED": np.array(["0", "200", "0"]),
             "GROUPNORM2_CHANGED": np.array(["tensor(100)", "200.0", "0"])}
    assert judge({}, right) is None
    one_group = {**right, "GROUPNORM2_CHANGED": np.array(["200", "200", "200"])}
    message = judge({}, one_group)
    assert message.startswith(
        "not yet right: GroupNorm(2, 8): channel 0 of image 0 multiplied by 3 (you "
        "answered 200); channels 4 to 7 of image 0 multiplied by 3, then 5 added (you "
        "answered 200). GroupNorm(2, 8) normalizes")
    assert judge({}, {**right, "INSTANCENORM_CHANGED": np.array("200")}) == (
        "not yet right: INSTANCENORM_CHANGED holds one count per edit, 3 in all (you "
        "answered 200)")
    assert judge({}, {"INSTANCENORM_CHANGED": right["INSTANCENORM_CHANGED"]}) == (
        "no answer given for GROUPNORM2_CHANGED")


def test_memory_byte_answers_are_judged_from_torchs_element_sizes():
    """Unfused: the add reads bf16 x and the f32 stream and writes the f32 sum
    (10 bytes an element), F.layer_norm reads and writes f32 (8), the cast
    reads f32 and writes bf16 (6); fused: 2 + 4 in, 4 + 2 out."""
    elements = math.prod(J.ADD_NORM_SHAPE)
    sizes = {"bfloat16": torch.finfo(torch.bfloat16).bits // 8,
             "float32": torch.finfo(torch.float32).bits // 8}
    bf16, f32 = sizes["bfloat16"], sizes["float32"]
    unfused = elements * ((bf16 + f32 + f32) + (f32 + f32) + (f32 + bf16))
    fused = elements * (bf16 + f32 + f32 + bf16)
    judge = _registry._get("add_norm_memory_bytes").judge
    assert judge({}, {"UNFUSED_BYTES": np.array(str(unfused)),
                      "FUSED_BYTES": np.array(f"np.int64({fused})")}) is None
    assert fused * 2 == unfused  # the fusion halves the traffic
    # each count has its own test cell, which passes that count alone
    assert judge({}, {"FUSED_BYTES": np.array(str(fused))}) is None
    assert judge({}, {"UNFUSED_BYTES": np.array(str(fused))}).startswith(
        "not yet right: bytes read and written by the three unfused kernels")
    assert judge({}, {}) == "no answer given for UNFUSED_BYTES or FUSED_BYTES"
    assert _registry.make_cases("add_norm_memory_bytes") == [("your byte count", {})]


@pytest.mark.parametrize("unfused_per_element, fused_per_element, slip", [
    (28, 16, "every tensor counted at 4 bytes"),
    (14, 8, "every tensor counted at 2 bytes"),
    (18, 12, "a third kernel reads it and writes normed in bfloat16"),
])
def test_wrong_byte_counts_name_their_slip(unfused_per_element, fused_per_element, slip):
    elements = math.prod(J.ADD_NORM_SHAPE)
    judge = _registry._get("add_norm_memory_bytes").judge
    message = judge({}, {"UNFUSED_BYTES": np.array(str(unfused_per_element * elements)),
                         "FUSED_BYTES": np.array(str(fused_per_element * elements))})
    assert message.startswith("not yet right: bytes read and written by the three "
                              "unfused kernels") and slip in message


def test_a_count_two_slips_give_names_both():
    """2 * 2 + 6 * 4 = 7 * 4: the unfused kernels with the norm reading the float32
    sum twice move as many bytes as all seven tensors counted at 4 bytes; the fused
    kernel reading the sum back moves as many as its four tensors at 4 bytes."""
    elements = math.prod(J.ADD_NORM_SHAPE)
    judge = _registry._get("add_norm_memory_bytes").judge
    message = judge({}, {"UNFUSED_BYTES": np.array(str((2 * 2 + 6 * 4) * elements)),
                         "FUSED_BYTES": np.array(str((2 * 2 + 3 * 4) * elements))})
    unfused, fused = message.split("; bytes read and written by the fused kernel")
    assert "every tensor counted at 4 bytes" in unfused and "sum twice" in unfused
    assert "every tensor counted at 4 bytes" in fused and "reading residual_sum back" in fused
    assert "fits more than one slip" in unfused and "fits more than one slip" in fused


@pytest.mark.parametrize("name", ["UNFUSED_BYTES", "FUSED_BYTES"])
def test_every_modelled_byte_slip_is_named_whatever_shares_its_count(name):
    """Each slip's count draws a message naming that slip, and every other slip
    with the same count: no hint names one slip for a count another gives."""
    judge = _registry._get("add_norm_memory_bytes").judge
    slips = J._memory_byte_slips(name)
    for count in {count for count, _ in slips}:
        message = judge({}, {name: np.array(repr(count))})
        sharing = [other for other_count, other in slips if other_count == count]
        assert all(other in message for other in sharing), (count, message)
        assert ("fits more than one slip" in message) == (len(sharing) > 1)
    truth = J._memory_bytes_truths()[name]
    assert truth not in {count for count, _ in slips}


def test_byte_counts_per_element_or_in_mib_are_told_so():
    judge = _registry._get("add_norm_memory_bytes").judge
    message = judge({}, {"UNFUSED_BYTES": np.array("24"), "FUSED_BYTES": np.array("384.0")})
    assert "that is the count per element" in message
    assert "that is in MiB: give bytes" in message


# ----- the probes: how the student's class is called ---------------------------------------


class Recorded(nn.LayerNorm):
    """nn.LayerNorm that notes the arguments it was built with."""

    calls = []

    def __init__(self, normalized_shape, *args, **kwargs):
        Recorded.calls.append((normalized_shape, args, kwargs))
        super().__init__(normalized_shape, *args, **kwargs)


def test_constructor_gets_the_shape_in_the_kind_the_case_names():
    """int, tuple, list and torch.Size reach the student's constructor as such."""
    Recorded.calls.clear()
    for _, case in _cases("my_layer_norm_parameters"):
        assert isinstance(P._construct(Recorded, case), Recorded)
    shapes = [call[0] for call in Recorded.calls]
    assert shapes == [8, 512, (3, 4), [2, 3, 5], torch.Size([6])]
    assert [type(s) for s in shapes] == [int, int, tuple, list, torch.Size]
    assert all(type(n) is int for s in shapes[2:] for n in s)
    assert all(call[1:] == ((), {}) for call in Recorded.calls)


def test_constructor_gets_only_the_flags_the_case_names():
    """Defaults are tested by leaving flags out; the ones given are Python floats and bools."""
    Recorded.calls.clear()
    for _, case in _cases("my_layer_norm_flags"):
        P._construct(Recorded, case)
    kwargs = [call[2] for call in Recorded.calls]
    assert kwargs == [{}, {"eps": 0.5}, {"eps": 1e-3}, {"elementwise_affine": False},
                      {"eps": 0.1, "elementwise_affine": False}, {"bias": False},
                      {"bias": False}, {"elementwise_affine": False, "bias": False}]
    assert all(type(v) is (float if k == "eps" else bool) for kw in kwargs
               for k, v in kw.items())
    assert P._keyword_arguments({"bias": np.array(1), "eps": np.array(1)}) == {
        "eps": 1.0, "bias": True}


def test_a_class_that_is_not_a_module_is_told_so():
    case = _case("my_layer_norm_parameters", 0)
    with pytest.raises(TypeError) as raised:
        P._construct(NotAModule, case)
    assert str(raised.value) == (
        "NotAModule must subclass torch.nn.Module (class NotAModule(nn.Module): ...)")
    with pytest.raises(TypeError) as raised:
        P._construct(functools.partial(NotAModule), case)  # no __name__
    assert str(raised.value) == (
        "MyLayerNorm must subclass torch.nn.Module (class MyLayerNorm(nn.Module): ...)")
    verdict = _verdict("my_layer_norm_parameters", NotAModule, P._probe_module)
    assert verdict["message"] == (
        "my_layer_norm_parameters, MyLayerNorm(8): your code raised TypeError: NotAModule "
        "must subclass torch.nn.Module (class NotAModule(nn.Module): ...)")


class OneUnnamed(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))


def test_affine_parameters_by_name_then_by_order():
    """torch's names win whatever the order; otherwise the first two parameters."""
    bias_first = BiasFirst(4)
    assert P._affine_parameters(bias_first) == (bias_first.weight, bias_first.bias)
    no_bias = nn.LayerNorm(4, bias=False)
    gamma, beta = P._affine_parameters(no_bias)
    assert gamma is no_bias.weight and beta is None
    named = GammaBeta(4)
    gamma, beta = P._affine_parameters(named)
    assert gamma is named.gamma and beta is named.beta
    one = OneUnnamed()
    gamma, beta = P._affine_parameters(one)
    assert gamma is one.scale and beta is None
    assert P._affine_parameters(nn.LayerNorm(4, elementwise_affine=False)) == [None, None]


def test_set_affine_copies_gamma_and_beta_or_says_where_they_cannot_go():
    module = GammaBeta(3)
    P._set_affine(module, np.array([1.0, 2.0, 3.0], np.float32), np.array([4.0, 5.0, 6.0]))
    assert module.gamma.tolist() == [1.0, 2.0, 3.0] and module.beta.tolist() == [4.0, 5.0, 6.0]
    assert module.gamma.requires_grad  # copied under no_grad, still a leaf parameter
    P._set_affine(module, None, None)
    assert module.gamma.tolist() == [1.0, 2.0, 3.0]
    P._set_affine(module, None, np.zeros(3))
    assert module.gamma.tolist() == [1.0, 2.0, 3.0] and module.beta.tolist() == [0, 0, 0]
    with pytest.raises(AttributeError) as raised:
        P._set_affine(nn.LayerNorm(3, elementwise_affine=False), np.ones(3), None)
    assert str(raised.value) == "the module has no parameters to hold weight (gamma)"
    with pytest.raises(AttributeError) as raised:
        P._set_affine(nn.LayerNorm(3, bias=False), np.ones(3), np.ones(3))
    assert str(raised.value) == "the module has no second parameter to hold bias (beta)"


def test_describe_parameters_reports_what_the_judge_reads():
    report = {k: _runner.to_array(v) for k, v in
              P._describe_parameters(FrozenBias((3, 4))).items()}
    assert {k: str(v) for k, v in report.items() if v.dtype.kind == "U"} == {
        "names": "weight,bias", "shapes": "weight=[3, 4];bias=[3, 4]",
        "dtypes": "weight=float32;bias=float32", "trainable": "weight",
        "state_keys": "weight,bias"}
    np.testing.assert_array_equal(report["initial_weight"], np.ones((3, 4)))
    np.testing.assert_array_equal(report["initial_bias"], np.zeros((3, 4)))
    bare = P._describe_parameters(EpsInStateDict(2, elementwise_affine=False))
    assert set(bare) == {"names", "shapes", "dtypes", "trainable", "state_keys"}
    assert str(bare["names"]) == "" and str(bare["state_keys"]) == "eps_value"
    weight_only = P._describe_parameters(Float64Parameters(2, bias=False))
    assert "initial_bias" not in weight_only and str(weight_only["dtypes"]) == "weight=float64"


class ReturnsNumpy(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x).detach().numpy()


class ReturnsList(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x).tolist()


def test_forward_probe_runs_float64_in_float64_with_the_cases_gamma_and_beta():
    """A float64 case runs the module in float64 (its float32 parameters would not
    mix); gamma and beta come from the case; no graph is kept."""
    case = _case("my_layer_norm_float64", 0)
    report = P._probe_module(TorchLayerNorm, case)
    assert report["y"].dtype == torch.float64 and not report["y"].requires_grad
    assert str(report["y_dtype"]) == "torch.float64"
    np.testing.assert_allclose(report["y"].numpy(), _torch_reference(case), rtol=1e-12)
    assert str(report["names"]) == "weight,bias"
    case = _case("my_layer_norm_forward", 2)
    report = P._probe_module(TorchLayerNorm, case)
    assert str(report["y_dtype"]) == "torch.float32"
    np.testing.assert_allclose(report["y"].numpy(), _torch_reference(case), rtol=1e-4,
                               atol=1e-5)
    assert str(P._probe_module(ReturnsNumpy, case)["y_dtype"]) == "float32"
    assert str(P._probe_module(ReturnsList, case)["y_dtype"]) == "list"
    assert "y" not in P._probe_module(TorchLayerNorm, _case("my_layer_norm_parameters", 0))


def test_forward_probe_without_gamma_and_beta_keeps_the_modules_own():
    case = _case("my_layer_norm_flags", 3)  # elementwise_affine=False
    report = P._probe_module(TorchLayerNorm, case)
    np.testing.assert_allclose(report["y"].numpy(), _torch_reference(case), rtol=1e-4,
                               atol=1e-5)


def test_error_text_names_the_class_and_is_cut_at_the_limit():
    assert str(P._error_text(KeyError("weight"))) == "KeyError: 'weight'"
    long = str(P._error_text(RuntimeError("x" * 5000)))
    assert len(long) == P.MAX_MESSAGE == 2000 and long.startswith("RuntimeError: xxx")


class RefusesTorchKeys(nn.LayerNorm):
    """Saves fine, but refuses any state_dict it is given."""

    def load_state_dict(self, state_dict, strict=True, assign=False):
        raise RuntimeError("no thanks.")


class SavesGammaBeta(nn.LayerNorm):
    """Loads torch's keys, but saves them as gamma and beta."""

    def state_dict(self, *args, **kwargs):
        return {"gamma": self.weight.detach(), "beta": self.bias.detach()}


def test_state_dict_probe_moves_values_both_ways():
    case = _case("my_layer_norm_state_dict", 1)
    report = P._probe_state_dict(TorchLayerNorm, case)
    assert set(report) == {"state_keys", "mine_weight", "mine_bias", "torch_weight",
                           "torch_bias"}
    assert str(report["state_keys"]) == "weight,bias"
    for key, source in (("mine_weight", "torch_weight"), ("mine_bias", "torch_bias"),
                        ("torch_weight", "my_weight"), ("torch_bias", "my_bias")):
        np.testing.assert_array_equal(report[key].numpy(), case[source])
    refused = P._probe_state_dict(RefusesTorchKeys, case)
    assert str(refused["into_mine_error"]) == "RuntimeError: no thanks."
    np.testing.assert_array_equal(refused["torch_bias"].numpy(), case["my_bias"])
    saved = P._probe_state_dict(SavesGammaBeta, case)
    assert str(saved["state_keys"]) == "gamma,beta" and "into_torch_error" in saved
    assert str(saved["into_torch_error"]).startswith("RuntimeError: Error(s) in loading")
    assert str(saved["into_mine_error"]) == "KeyError: 'weight'"  # read back by torch's key


def test_autograd_probe_reports_torchs_gradients():
    for index in (0, 1):
        case = _case("my_layer_norm_autograd", index)
        report = {k: _runner.to_array(v) for k, v in
                  P._probe_autograd(TorchLayerNorm, case).items()}
        right = _torch_gradients(case)
        assert str(report["missing"]) == ""
        for key in ("x_grad", "weight_grad", "bias_grad"):
            assert report[key].dtype == case["x"].dtype
            np.testing.assert_allclose(report[key], right[key], rtol=1e-4, atol=1e-5)


class Detached(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x).detach()


class IgnoresBias(nn.LayerNorm):
    def forward(self, x):
        return nn.functional.layer_norm(x, self.normalized_shape, self.weight, None, self.eps)


class UnusedParameters(nn.LayerNorm):
    def forward(self, x):
        return nn.functional.layer_norm(x, self.normalized_shape, eps=self.eps)


def test_autograd_probe_says_what_got_no_gradient():
    case = _case("my_layer_norm_autograd", 0)
    message = "all: the output is not connected to the autograd graph"
    assert str(P._probe_autograd(Detached, case)["missing"]) == message
    assert str(P._probe_autograd(ReturnsNumpy, case)["missing"]) == message
    report = P._probe_autograd(IgnoresBias, case)
    assert str(report["missing"]) == "bias_grad" and "bias_grad" not in report
    assert "x_grad" in report and "weight_grad" in report
    report = P._probe_autograd(UnusedParameters, case)
    assert str(report["missing"]) == "weight_grad,bias_grad" and "x_grad" in report


def test_gradients_helper_lists_the_missing_in_order():
    with_grad = torch.ones(2, requires_grad=True)
    (with_grad * 3).sum().backward()
    report = P._gradients({"kept": 1}, (("a", None), ("b", with_grad),
                                        ("c", torch.ones(2, requires_grad=True))))
    assert str(report["missing"]) == "a,c" and report["kept"] == 1
    assert report["b"].tolist() == [3.0, 3.0] and "a" not in report and "c" not in report


class ShowsInput(nn.LayerNorm):
    seen = []

    def forward(self, x):
        ShowsInput.seen.append(x.clone())
        raise IndexError("y" * 3000)


def test_shape_error_probe_reports_the_exception():
    case = _case("my_layer_norm_shape_error", 0)
    report = P._probe_shape_error(TorchLayerNorm, case)
    assert bool(report["raised"]) and str(report["error_type"]) == "RuntimeError"
    assert str(report["message"]) == (
        "Given normalized_shape=[3, 4], expected input with shape [*, 3, 4], but got "
        "input of size[2, 5, 4]")
    assert report["error_classes"].tolist() == ["builtins.RuntimeError", "builtins.Exception",
                                                "builtins.BaseException", "builtins.object"]
    ShowsInput.seen.clear()
    report = P._probe_shape_error(ShowsInput, case)
    assert len(str(report["message"])) == 2000 and str(report["error_type"]) == "IndexError"
    x = ShowsInput.seen[0]
    assert x.shape == (2, 5, 4) and x.dtype == torch.float32
    torch.testing.assert_close(x, torch.randn((2, 5, 4),
                                              generator=torch.Generator().manual_seed(0)))
    valid = P._probe_shape_error(TorchLayerNorm, _case("my_layer_norm_shape_error", 5))
    assert set(valid) == {"raised"} and not bool(valid["raised"])


class AddRecorder(TorchAdd):
    calls = []

    def forward(self, *args):
        AddRecorder.calls.append(len(args))
        return super().forward(*args)


class ReturnsTriple(TorchAdd):
    def forward(self, x, residual=None):
        return [*super().forward(x, residual), x]


class ReturnsNormed(TorchAdd):
    def forward(self, x, residual=None):
        return super().forward(x, residual)[0]


class SumDetached(TorchAdd):
    def forward(self, x, residual=None):
        normed, residual_sum = super().forward(x, residual)
        return normed, residual_sum.detach()


class BothDetached(TorchAdd):
    def forward(self, x, residual=None):
        return tuple(t.detach() for t in super().forward(x, residual))


class NestedNorm(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias)

    def forward(self, x, residual=None):
        residual_sum = x if residual is None else x + residual
        return self.norm(residual_sum), residual_sum


def test_add_probe_calls_with_and_without_residual():
    AddRecorder.calls.clear()
    for index in (0, 2):
        P._probe_add_layer_norm(AddRecorder, _case("add_layer_norm_module", index))
    assert AddRecorder.calls == [2, 1]


def test_add_probe_reports_outputs_in_the_inputs_dtype():
    case = _case("add_layer_norm_module", 1)  # float64
    report = P._probe_add_layer_norm(TorchAdd, case)
    assert str(report["names"]) == "weight,bias" and "missing" not in report
    assert report["y"].dtype == torch.float64 and not report["sum"].requires_grad
    np.testing.assert_allclose(report["sum"].numpy(), case["x"] + case["residual"])
    np.testing.assert_allclose(report["y"].detach().numpy(), _torch_reference(
        {**case, "x": case["x"] + case["residual"]}), rtol=1e-12)


def test_add_probe_loads_torchs_state_dict_or_reports_why_not():
    case = _case("add_layer_norm_module", 5)
    report = P._probe_add_layer_norm(TorchAdd, case)
    expected = _torch_reference({**case, "x": case["x"] + case["residual"],
                                 "set_weight": case["torch_weight"],
                                 "set_bias": case["torch_bias"]})
    np.testing.assert_allclose(report["y"].detach().numpy(), expected, rtol=1e-4, atol=1e-5)
    nested = P._probe_add_layer_norm(NestedNorm, case)
    assert set(nested) == {"names", "load_error"}
    assert str(nested["names"]) == "norm.weight,norm.bias"
    assert str(nested["load_error"]).startswith(
        "RuntimeError: Error(s) in loading state_dict for NestedNorm")


def test_add_probe_says_what_came_back_when_it_is_not_a_pair():
    case = _case("add_layer_norm_module", 0)
    assert str(P._probe_add_layer_norm(ReturnsNormed, case)["returned"]) == "a Tensor"
    assert str(P._probe_add_layer_norm(ReturnsTriple, case)["returned"]) == (
        "a list of length 3")
    report = P._probe_add_layer_norm(ReturnsTriple, case)
    assert set(report) == {"names", "returned"}


def test_add_probe_gradients_come_from_both_outputs():
    case = _case("add_layer_norm_module", 6)
    report = {k: _runner.to_array(v) for k, v in
              P._probe_add_layer_norm(TorchAdd, case).items()}
    right = _add_gradients(case)
    assert str(report["missing"]) == ""
    for key in ("x_grad", "residual_grad", "weight_grad", "bias_grad"):
        np.testing.assert_allclose(report[key], right[key], rtol=1e-10, atol=1e-12)
    detached = {k: _runner.to_array(v) for k, v in
                P._probe_add_layer_norm(SumDetached, case).items()}
    only_norm = _add_gradients(case, "detached sum")
    np.testing.assert_allclose(detached["x_grad"], only_norm["x_grad"], rtol=1e-10,
                               atol=1e-12)
    both = P._probe_add_layer_norm(BothDetached, case)
    assert str(both["missing"]) == "x_grad,residual_grad,weight_grad,bias_grad"
    assert verdict_of_add(SumDetached)["message"].startswith(
        "add_layer_norm_module, " + ADD_LABELS[6] + ": the gradient with respect to x is")


def verdict_of_add(module):
    return _verdict("add_layer_norm_module", module, P._probe_add_layer_norm)


def test_add_probe_sets_the_cases_gamma_and_beta():
    case = _case("add_layer_norm_module", 3)  # bias=False, random gamma
    report = P._probe_add_layer_norm(TorchAdd, case)
    expected = _torch_reference({**case, "x": case["x"] + case["residual"]})
    np.testing.assert_allclose(report["y"].detach().numpy(), expected, rtol=1e-4, atol=1e-5)
    assert str(report["names"]) == "weight"


def test_answers_travel_as_text():
    """A one-number tensor travels as its number in full, not as its str()."""
    report = P._answers_as_text({"A": 16, "B": torch.tensor(4), "C": "x" * 3000,
                                 "D": torch.tensor(805306368.0, dtype=torch.float64)}, {})
    assert {k: str(v) for k, v in report.items() if k != "C"} == {
        "A": "16", "B": "4", "D": "805306368.0"}
    assert len(str(report["C"])) == 2000


@pytest.mark.parametrize("check, name", [
    (P.check_my_layer_norm_parameters, "my_layer_norm_parameters"),
    (P.check_my_layer_norm_forward, "my_layer_norm_forward"),
    (P.check_my_layer_norm_flags, "my_layer_norm_flags"),
    (P.check_my_layer_norm_state_dict, "my_layer_norm_state_dict"),
    (P.check_my_layer_norm_autograd, "my_layer_norm_autograd"),
    (P.check_my_layer_norm_shape_error, "my_layer_norm_shape_error"),
    (P.check_add_layer_norm_module, "add_layer_norm_module"),
])
def test_each_check_runs_its_own_cases(check, name, capsys):
    """The student's entry points run the check they are named after, and pass torch."""
    module = TorchAdd if name.startswith("add") else TorchLayerNorm
    check(module)
    assert capsys.readouterr().out.startswith(f"{name}: all ")


def test_question_checks_pass_the_right_answers(capsys):
    P.check_add_norm_memory_bytes(UNFUSED_BYTES=24 * 2 ** 25, FUSED_BYTES=12 * 2 ** 25)
    assert capsys.readouterr().out.splitlines() == [
        "add_norm_memory_bytes: all 1 cases passed (your byte count)"]



def test_an_input_of_exactly_normalized_shape_is_valid():
    """No leading dims at all is still a valid input (torch accepts it); a same-size
    input with as many dims as normalized_shape but swapped gets the same-size note."""
    exact = J._case((3, 4), x_shape=np.array([3, 4]))
    assert J._judge_shape_error(exact, NOT_RAISED) is None
    swapped = J._case((3, 4), x_shape=np.array([4, 3]))
    assert J._judge_shape_error(swapped, NOT_RAISED) == (
        "your module returned an output for an input of shape [4, 3] (its trailing dims hold "
        "the same number of elements, but not the same shape) although normalized_shape is "
        "[3, 4]: raise an error when the last 2 dims of the input are not exactly "
        "normalized_shape")


# ----- what each case is drawn from -----------------------------------------------------------


def _standard_pattern(size):
    """A fixed, skewed pattern of mean 0 and standard deviation 1 (a sign flip shows)."""
    z = np.arange(1.0, np.prod(size) + 1) ** 2
    return ((z - z.mean()) / z.std()).reshape(size)


class StandardDraws:
    """Stands in for numpy's Generator: normal(loc, scale, size) returns
    loc + scale * the standard pattern, so a case's arrays show exactly the mean
    and spread they were drawn with."""

    def normal(self, loc=0.0, scale=1.0, size=None):
        return loc + scale * _standard_pattern(size)


def _assert_drawn(cases, draws):
    """Each (case index, key, loc, scale) is loc + scale * pattern, in the case's dtype."""
    for index, key, loc, scale in draws:
        label, case = cases[index]
        value = case[key]
        expected = (loc + scale * _standard_pattern(value.shape)).astype(value.dtype)
        np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-6,
                                   err_msg=f"{label}: {key}")


def _affine(index, weight=(1.0, 0.5), bias=(0.0, 0.5)):
    """Random gamma ~ N(1, 0.5), beta ~ N(0, 0.5); (1, 0) and (0, 0) are 1 and 0."""
    return [(index, "set_weight", *weight), (index, "set_bias", *bias)]


def test_forward_cases_draw_inputs_of_the_documented_offset_and_spread():
    """The single token ~ N(2, 3), the (2, 5, 16) batch ~ N(1, 2), the list case
    ~ N(-1, 2), the offset cases 10 + N(0, 1) and 1000 + N(0, 1), in float32 and in
    float64: offsets test the centring (and, at 1000, float32's two-pass variance
    and float64 arithmetic), spreads the
    scaling, and gamma/beta follow the labels (1 and 0 where they say so)."""
    cases = J._forward_cases(StandardDraws())
    _assert_drawn(cases, [
        (0, "x", 0.0, 1.0), *_affine(0, (1.0, 0.0), (0.0, 0.0)),
        (1, "x", 2.0, 3.0), *_affine(1),
        (2, "x", 1.0, 2.0), *_affine(2),
        *_affine(3),
        (4, "x", 0.0, 1.0), *_affine(4),
        (5, "x", -1.0, 2.0), *_affine(5),
        (6, "x", 10.0, 1.0), *_affine(6, (1.0, 0.0), (0.0, 0.0)),
        (7, "x", 0.0, 0.003), *_affine(7),
        (8, "x", 1000.0, 1.0), *_affine(8, (1.0, 0.0), (0.0, 0.0)),
    ])
    _assert_drawn(J._float64_cases(StandardDraws()), [
        (0, "x", 1000.0, 1.0), *_affine(0),
        (1, "x", 0.0, 1.0), *_affine(1),
    ])
    constant = cases[3][1]["x"]  # the other two tokens ~ N(0, 1)
    np.testing.assert_allclose(constant[[0, 2]], _standard_pattern((3, 8))[[0, 2]], rtol=1e-6)


def test_flag_cases_draw_inputs_and_gamma_of_the_documented_offset_and_spread():
    """x ~ N(3, 2) for elementwise_affine=False (an offset the module must remove by
    itself), x ~ 0.02 * N(0, 1) for "small spread", gamma ~ N(1, 0.5) for bias=False."""
    cases = J._flag_cases(StandardDraws())
    _assert_drawn(cases, [
        (1, "x", 0.0, 1.0), *_affine(1),
        (2, "x", 0.0, 0.02), *_affine(2),
        (3, "x", 3.0, 2.0),
        (4, "x", 0.0, 1.0),
        (5, "x", 0.0, 1.0), (5, "set_weight", 1.0, 0.5),
        (6, "x", 0.0, 1.0), (6, "set_weight", 1.0, 0.5),
        (7, "x", 0.0, 1.0),
    ])


def test_add_cases_draw_x_residual_and_gamma_of_the_documented_offset_and_spread():
    """x ~ N(offset, 2) (offset 3 in the float64 case, -2 in the eps=0.01 one, 1 with
    spread 3 for the residual=None case), residual ~ N(0, 1), gamma ~ N(1, 0.5)."""
    cases = J._add_cases(StandardDraws())
    pair = [("x", 0.0, 2.0), ("residual", 0.0, 1.0)]
    _assert_drawn(cases, [
        *[(0, *draw) for draw in pair], *_affine(0),
        (1, "x", 3.0, 2.0), (1, "residual", 0.0, 1.0), *_affine(1),
        (2, "x", 1.0, 3.0), *_affine(2),
        *[(3, *draw) for draw in pair], (3, "set_weight", 1.0, 0.5),
        (4, "x", -2.0, 2.0), (4, "residual", 0.0, 1.0),
        *[(5, *draw) for draw in pair], (5, "torch_weight", 0.0, 1.0),
        (5, "torch_bias", 0.0, 1.0),
        *[(6, *draw) for draw in pair], (6, "upstream_sum", 0.0, 1.0),
        (6, "upstream_normed", 0.0, 1.0), *_affine(6),
    ])


# ----- the reference is float64 whatever the input -------------------------------------------


def test_reference_output_of_a_float32_case_is_float64():
    """A float32 input is normalized in float64 (the reference a student's float32
    output is held to), not rounded to float32."""
    case = _case("my_layer_norm_forward", 2)
    expected = _torch_reference(case)
    reference = J._reference_output(case)
    assert reference.dtype == np.float64
    np.testing.assert_allclose(reference, expected, rtol=1e-12, atol=1e-12)


def test_reference_gradients_of_a_float32_case_are_float64():
    case = _case("my_layer_norm_autograd", 1)  # float32
    wide = {key: np.asarray(value, np.float64) if value.dtype == np.float32 else value
            for key, value in case.items()}
    right = _torch_gradients(wide)
    gradients = J._reference_gradients(case)
    for key in ("x_grad", "weight_grad", "bias_grad"):
        assert gradients[key].dtype == np.float64, key
        np.testing.assert_allclose(gradients[key], right[key], rtol=1e-10, atol=1e-12)


def test_reference_add_without_residual_is_float64_for_a_float32_input():
    """module(x) with residual=None: residual_sum is x itself and normed its layer norm,
    both in float64."""
    case = _case("add_layer_norm_module", 2)
    assert "residual" not in case and case["x"].dtype == np.float32
    residual_sum, normed, gradients = J._reference_add(case)
    assert residual_sum.dtype == normed.dtype == np.float64 and gradients is None
    np.testing.assert_array_equal(residual_sum, case["x"].astype(np.float64))
    np.testing.assert_allclose(normed, _torch_reference(case), rtol=1e-12, atol=1e-12)


# ----- hints that must not appear --------------------------------------------------------------


def test_an_eps_of_one_gets_no_default_eps_hint():
    """The wrong defaults hinted at are small (1e-6, 1e-8, 1e-12, 0, 1e-3): an output
    made with eps = 1 matches none of the known slips, so no hint is given."""
    case = _case("my_layer_norm_forward", 2)
    x = torch.from_numpy(case["x"].astype(np.float64))
    y = (_torch_ln(x, (-1,), 1.0) * torch.from_numpy(case["set_weight"].astype(np.float64))
         + torch.from_numpy(case["set_bias"].astype(np.float64))).numpy().astype(np.float32)
    assert not np.allclose(y, _torch_reference(case), atol=1e-3)
    assert J._likely_forward_mistake(case, y) is None


def test_normalized_helper_with_n_minus_correction_equal_to_one():
    """Two values with correction=1 divide the squared deviations by 1, as torch.var."""
    x = np.array([[1.0, 4.0], [2.0, -2.0]])
    expected = _torch_ln(torch.from_numpy(x), (-1,), 0.1, correction=1).numpy()
    np.testing.assert_allclose(J._normalized(x, (1,), 0.1, correction=1), expected,
                               rtol=1e-12)


def _divided_by_n_minus_1(case, dtype):
    """A module's output for `case` that divides the variance by n - 1, computed in
    `dtype` throughout."""
    x = torch.from_numpy(case["x"].astype(dtype))
    dims = tuple(range(x.dim() - len(case["normalized_shape"]), x.dim()))
    eps = float(case["eps"]) if "eps" in case else 1e-5
    gamma = torch.from_numpy(np.asarray(case.get("set_weight", 1.0), dtype))
    beta = torch.from_numpy(np.asarray(case.get("set_bias", 0.0), dtype))
    x_hat = (x - x.mean(dims, keepdim=True)) / torch.sqrt(
        x.var(dims, keepdim=True, correction=1) + eps)
    return (gamma * x_hat + beta).numpy()


def test_a_float32_slip_computed_in_float32_is_still_named():
    """A float32 module that divides by n - 1, computed in float32 as a student's
    module would, carries float32 round-off: its slip is named on every float32
    forward case all the same (compared at float32's tolerance, closest slip first)."""
    named = 0
    for _, case in _cases("my_layer_norm_forward", 0):
        # tokens around 1000 come last and are judged to 1e-3: a slip the cases
        # before them name never reaches them
        if case["x"].dtype != np.float32 or "far_from_zero" in case:
            continue
        y = _divided_by_n_minus_1(case, np.float32)
        assert y.dtype == np.float32
        assert J._likely_forward_mistake(case, y) == H_UNBIASED
        named += 1
    assert named >= 3


def test_an_all_nan_output_of_constant_rows_is_named_without_a_crash():
    """Rows that are all one value, normalized without eps, give 0 / 0 = NaN everywhere: a
    module that forgot eps returns all NaN there, the slip with nothing finite to measure
    its distance by. It is named, not a crash of the judge."""
    case = dict(_case("my_layer_norm_forward", 0))
    case["x"] = np.full_like(case["x"], 3.0)
    y = np.full(case["x"].shape, np.nan, dtype=case["x"].dtype)
    assert J._likely_forward_mistake(case, y) == H_NO_EPS


def test_the_slips_are_computed_in_float64_for_a_float32_input_far_from_zero():
    """The judge computes each slip from the input in float64 whatever its dtype: a float32
    input far from zero, computed in float32, would carry round-off from the mean well
    above float32's tolerance, and a module that divides by n - 1 (in float64, returning
    float32) would go unnamed."""
    case = dict(_case("my_layer_norm_forward", 0))
    assert case["x"].dtype == np.float32
    case["x"] = (case["x"].astype(np.float64) * 0.01 + 1e4).astype(np.float32)
    y = _divided_by_n_minus_1(case, np.float64).astype(np.float32)
    assert J._likely_forward_mistake(case, y) == H_UNBIASED


# ----- the channels-first layer norm: verdicts -------------------------------------------


def _ln2d_report(case, **changes):
    """What the probe reports for a right LayerNorm2d on `case`, with `changes`."""
    channels = int(case["channels"])
    y, _ = J._ln2d_reference(case)
    report = {"names": np.array("weight,bias"),
              "shapes": np.array(f"weight=[{channels}];bias=[{channels}]"),
              "initial_weight": np.ones(channels, np.float32),
              "initial_bias": np.zeros(channels, np.float32),
              "y": y.astype(case["x"].dtype),
              "y_dtype": np.array(f"torch.{case['x'].dtype}")}
    report.update(changes)
    return report


def test_ln2d_parameter_and_layout_problems_are_named():
    case = _case("layer_norm_2d_forward", 0)  # C = 4
    assert J._judge_ln2d_forward(case, _ln2d_report(case)) is None
    assert J._judge_ln2d_forward(case, _ln2d_report(case, names=np.array("gamma,beta"))) == (
        "your module's parameters are ['beta', 'gamma']; LayerNorm2d(C) holds two, named "
        "weight and bias, as ConvNeXt's does")
    assert J._judge_ln2d_forward(case, _ln2d_report(
        case, shapes=np.array("weight=[4, 1, 1];bias=[4]"))) == (
        "your weight has shape [4, 1, 1]; it holds one number per channel, shape (4,)")
    assert J._judge_ln2d_forward(case, _ln2d_report(
        case, initial_bias=np.full(4, 0.5, np.float32))) == "bias starts at 0 for every channel"
    broadcast = "RuntimeError: The size of tensor a (4) must match the size of tensor b (5)"
    assert "they broadcast along dim 1; as (C,) they broadcast along the last axis, W" in (
        J._judge_ln2d_forward(case, _ln2d_report(case, forward_error=np.array(broadcast))))
    assert J._judge_ln2d_forward(case, _ln2d_report(
        case, forward_error=np.array("NotImplementedError: "))) == (
        "your module raised NotImplementedError: : the forward pass is not written yet")
    assert "use reshape" in J._judge_ln2d_forward(case, _ln2d_report(
        case, forward_error=np.array("RuntimeError: view size is not compatible with input")))
    assert J._judge_ln2d_forward(case, _ln2d_report(
        case, y_dtype=np.array("torch.float64"))) == (
        "your output's dtype is torch.float64; for a torch.float32 input return torch.float32")


def test_ln2d_wrong_default_eps_and_unused_eps_are_named():
    default = _case("layer_norm_2d_forward", 3)  # default eps, spread 1e-3
    assert "eps" not in default
    x = default["x"]
    with_torch_eps = J._normalized(x, (1,), 1e-5)
    assert J._likely_ln2d_mistake(default, with_torch_eps) == (
        "the default eps is 1e-6, as in ConvNeXt, not 1e-05")
    given = _case("layer_norm_2d_forward", 2)  # eps=0.01
    gamma, beta = J._ln2d_affine(given)
    ignored = (gamma.reshape(1, -1, 1, 1) * J._normalized(given["x"].astype(np.float64),
                                                          (1,), 1e-6)
               + beta.reshape(1, -1, 1, 1))
    assert J._likely_ln2d_mistake(given, ignored.astype(np.float32)) == (
        "use the eps you were given (0.01), not a fixed default")
    right, _ = J._ln2d_reference(given)
    assert J._likely_ln2d_mistake(given, right) is None


def test_ln2d_gradients_name_a_missing_or_wrong_gradient():
    case = _case("layer_norm_2d_gradients", 0)
    assert J._judge_ln2d_gradients(case, {"missing": np.array("weight_grad")}) == (
        J._NO_GRADIENT["weight_grad"])
    _, grads = J._ln2d_reference(case)
    right = {"missing": np.array(""), **grads}
    assert J._judge_ln2d_gradients(case, right) is None
    off = {**right, "bias_grad": grads["bias_grad"] * 1.01}
    assert J._judge_ln2d_gradients(case, off).startswith("the gradient with respect to bias")


# ----- a bfloat16 input, and one slip charged once -------------------------------------


class StatisticsInInputDtype(HandWrittenNorm):
    """Right in float32 and float64; a bfloat16 input keeps bfloat16 statistics."""

    def forward(self, x):
        mean = x.mean(self.dims, keepdim=True)
        var = ((x - mean) ** 2).mean(self.dims, keepdim=True)
        y = (x - mean) / torch.sqrt(var + self.inner.eps)
        if self.weight is not None:
            y = y * self.weight.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y


class WidenedButFloat32Out(StatisticsInInputDtype):
    """Takes the statistics in float32 but returns float32 for a bfloat16 input."""

    def forward(self, x):
        return super().forward(x.to(torch.promote_types(x.dtype, torch.float32)))


class Float32Everywhere(StatisticsInInputDtype):
    """Computes every input in float32, float64 included, as some libraries do."""

    def forward(self, x):
        return super().forward(x.float()).to(x.dtype)


def test_float64_computed_in_float32_fails_float64_alone_with_the_float64_hint():
    assert _verdict("my_layer_norm_forward", Float32Everywhere, P._probe_module)["passed"]
    verdict = _verdict("my_layer_norm_float64", Float32Everywhere, P._probe_module)
    assert verdict["case"] == FLOAT64_LABELS[0]
    assert verdict["message"].endswith(HINT + J.FLOAT64_HINT)


def test_half_precision_statistics_cost_the_low_precision_check_only():
    """Right in float32 and float64, so the forward check passes; the
    low-precision check fails on bfloat16 and names the cure."""
    assert _verdict("my_layer_norm_forward", StatisticsInInputDtype,
                    P._probe_module)["passed"]
    verdict = _verdict("my_layer_norm_low_precision", StatisticsInInputDtype, P._probe_module)
    assert not verdict["passed"]
    assert verdict["case"] == LOW_PRECISION_LABELS[0]
    assert "take the mean and the variance in float32 (x.float())" in verdict["message"]


def test_float16_statistics_fail_the_float16_case_too():
    """A module that widens bfloat16 only still rounds a float16 batch around 1000."""

    class WidensOnlyBfloat16(StatisticsInInputDtype):
        def forward(self, x):
            if x.dtype == torch.bfloat16:
                return super().forward(x.float()).to(x.dtype)
            return super().forward(x)

    verdict = _verdict("my_layer_norm_low_precision", WidensOnlyBfloat16, P._probe_module)
    assert verdict["case"] == LOW_PRECISION_LABELS[1]
    assert "float16's 0.5 around 1000" in verdict["message"]


def test_a_float32_output_for_a_bfloat16_input_is_named():
    verdict = _verdict("my_layer_norm_low_precision", WidenedButFloat32Out, P._probe_module)
    assert verdict["case"] == LOW_PRECISION_LABELS[0]
    assert "your output's dtype is torch.float32; for a torch.bfloat16 input" in (
        verdict["message"])
    assert "then y.to(x.dtype)" in verdict["message"]


class AffineInHalfPrecision(HandWrittenNorm):
    """float32 statistics, but x_hat is rounded to the input's dtype before gamma and
    beta, which are then applied in that dtype."""

    def float32_x_hat(self, x):
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        mean = wide.mean(self.dims, keepdim=True)
        var = ((wide - mean) ** 2).mean(self.dims, keepdim=True)
        return (wide - mean) / torch.sqrt(var + self.inner.eps)

    def forward(self, x):
        x_hat = self.float32_x_hat(x).to(x.dtype)
        return x_hat * self.weight.to(x.dtype) + self.bias.to(x.dtype)


class XHatRoundedFirst(AffineInHalfPrecision):
    """x_hat rounded to the input's dtype, then a float32 affine step, rounded again."""

    def forward(self, x):
        x_hat = self.float32_x_hat(x).to(x.dtype)
        return (x_hat.float() * self.weight.float() + self.bias.float()).to(x.dtype)


@pytest.mark.parametrize("module_class", [AffineInHalfPrecision, XHatRoundedFirst],
                         ids=lambda c: c.__name__)
def test_an_affine_step_rounded_to_bfloat16_is_named_on_the_cancelling_case(module_class):
    """Right statistics, so the first two cases pass (their products are rounded at
    a spacing within the tolerance); the cancelling case fails with the affine hint,
    not the statistics one, which the float32-widened run would otherwise suggest."""
    for seed in (0, 1):
        verdict = _verdict("my_layer_norm_low_precision", module_class, P._probe_module,
                           seed)
        assert verdict["case"] == LOW_PRECISION_LABELS[2]
        assert verdict["message"].endswith(HINT + J.AFFINE_ROUNDED_HINT.format(
            dtype="bfloat16"))
        assert "(x.float())" not in verdict["message"]
    assert _verdict("my_layer_norm_forward", AffineInHalfPrecision, P._probe_module)["passed"]


class UnbiasedLayerNorm(nn.Module):
    """Every flag right, but torch.var's default (unbiased) variance."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(
            normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        self.weight = nn.Parameter(torch.ones(shape)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(shape)) if elementwise_affine and bias else None

    def forward(self, x):
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        dims = tuple(range(-len(self.normalized_shape), 0))
        y = (wide - wide.mean(dims, keepdim=True)) / torch.sqrt(
            wide.var(dims, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


def test_an_unbiased_variance_costs_the_forward_check_only():
    """The forward check names the slip; the flags check, which tests eps and
    the parameters, does not charge it again."""
    forward = _verdict("my_layer_norm_forward", UnbiasedLayerNorm, P._probe_module)
    assert not forward["passed"] and J.UNBIASED_VARIANCE_HINT in forward["message"]
    assert _verdict("my_layer_norm_flags", UnbiasedLayerNorm, P._probe_module)["passed"]
    assert _verdict("my_layer_norm_low_precision", UnbiasedLayerNorm,
                    P._probe_module)["passed"]
    assert _verdict("my_layer_norm_autograd", UnbiasedLayerNorm, P._probe_autograd)["passed"]


def test_a_forward_slip_is_not_blamed_on_half_precision():
    """Off on the float32-widened values too: the low-precision check says the
    slip is the forward's, not that the statistics need float32."""

    class EpsOutside(UnbiasedLayerNorm):
        def forward(self, x):
            wide = x.float()
            centred = wide - wide.mean(-1, keepdim=True)
            y = centred / (wide.std(-1, keepdim=True, correction=0) + 0.5)
            return (y * self.weight + self.bias).to(x.dtype)

    verdict = _verdict("my_layer_norm_low_precision", EpsOutside, P._probe_module)
    assert not verdict["passed"]
    assert "the slip is in the forward pass itself" in verdict["message"]
    assert "(x.float())" not in verdict["message"]


def test_a_wrong_eps_still_fails_the_flags_check_beside_an_unbiased_variance():
    class FixedEps(UnbiasedLayerNorm):
        def __init__(self, normalized_shape, eps=1e-5, **flags):
            super().__init__(normalized_shape, 1e-5, **flags)

    assert not _verdict("my_layer_norm_flags", FixedEps, P._probe_module)["passed"]


class LayerNormInItsInputsDtype(nn.LayerNorm):
    """torch's layer norm with gamma and beta cast to the input's dtype, as a
    MyLayerNorm that multiplies by them does: a float64 sum stays float64."""

    def forward(self, x):
        weight, bias = (None if p is None else p.to(x.dtype) for p in (self.weight, self.bias))
        return nn.functional.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


def _add_layer_norm_on(parent):
    """The scaffold's AddLayerNorm, subclassing `parent` under the name MyLayerNorm."""
    base = type("MyLayerNorm", (parent,), {})

    class AddLayerNorm(base):
        def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                     residual_in_fp32=False):
            super().__init__(normalized_shape, eps, elementwise_affine, bias)
            self.residual_in_fp32 = residual_in_fp32

        def forward(self, x, residual=None):
            wide = torch.promote_types(x.dtype, torch.float32)
            if residual is None:
                total = x.to(wide)
                stored = torch.float32 if self.residual_in_fp32 else x.dtype
            else:
                wide = torch.promote_types(wide, residual.dtype)  # narrow neither
                total, stored = x.to(wide) + residual.to(wide), residual.dtype
            return base.forward(self, total).to(x.dtype), total.to(stored)

    return AddLayerNorm


@pytest.mark.parametrize("name, probe", [
    ("add_layer_norm_module", P._probe_add_layer_norm),
    ("add_layer_norm_fp32_residual", P._probe_add_fp32_residual),
])
def test_an_add_on_an_unbiased_my_layer_norm_is_judged_on_the_add(name, probe):
    """Subclassing the scaffold's MyLayerNorm, the add checks judge the add and the
    dtypes against the inherited norm: the variance slip is Exercise 1's."""
    assert _verdict(name, _add_layer_norm_on(UnbiasedLayerNorm), probe)["passed"]
    assert _verdict(name, _add_layer_norm_on(LayerNormInItsInputsDtype), probe)["passed"]


def _adds_in_float32(parent):
    """The scaffold's AddLayerNorm on `parent`, forming the sum as
    x.float() + residual.float(): a float64 pair is rounded before the add."""
    base = _add_layer_norm_on(parent)

    class AddsInFloat32(base):
        def forward(self, x, residual=None):
            if residual is None:
                return super().forward(x)
            total = x.float() + residual.float()
            return parent.forward(self, total).to(x.dtype), total.to(residual.dtype)

    return AddsInFloat32


@pytest.mark.parametrize("parent", [LayerNormInItsInputsDtype, Float32Everywhere])
def test_a_float64_sum_formed_in_float32_is_named(parent):
    """x.float() + residual.float() on the float64 case: the add check says where
    the digits went, whether the inherited norm is right or itself float32."""
    verdict = _verdict("add_layer_norm_module", _adds_in_float32(parent),
                       P._probe_add_layer_norm)
    assert verdict["case"] == ADD_LABELS[1]
    assert verdict["message"].endswith(HINT + J.NARROWED_SUM_HINT)
    case = _case("add_layer_norm_module", 1)
    right = _probed(_add_layer_norm_on(parent), case, P._probe_add_layer_norm)
    assert not J._narrowed_sum(case, right["sum"])  # an exact float64 sum is not named


def test_an_unbiased_add_written_from_scratch_still_fails():
    class ScratchAdd(UnbiasedLayerNorm):
        def forward(self, x, residual=None):
            total = x if residual is None else x + residual
            return super().forward(total), total

    verdict = _verdict("add_layer_norm_module", ScratchAdd, P._probe_add_layer_norm)
    assert not verdict["passed"] and "your normed output" in verdict["message"]


def test_an_inherited_norm_does_not_excuse_a_wrong_add():
    """Normalizing x alone matches no inherited norm of the sum: it fails."""
    base = _add_layer_norm_on(UnbiasedLayerNorm)

    class NormOfX(base):
        def forward(self, x, residual=None):
            normed, total = super().forward(x)
            return normed, (total if residual is None else x + residual)

    verdict = _verdict("add_layer_norm_module", NormOfX, P._probe_add_layer_norm)
    assert not verdict["passed"]
