"""Unit 03: normref.torch_ref.LayerNorm and AddLayerNorm against
torch.nn.LayerNorm, and the MyLayerNorm, AddLayerNorm and question checks
against correct answers and the usual slips."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch
from torch import nn

from normref import checks
from normref.checks import _registry, _runner, module_judges, module_probes
from normref.torch_ref import AddLayerNorm, LayerNorm, shape_error_message

TORCH_2_13_MESSAGE = (
    "Given normalized_shape=[3, 4], expected input with shape [*, 3, 4], "
    "but got input of size[2, 5, 4]"
)

# (normalized_shape as passed, input shape)
SHAPES = [
    (8, (8,)),
    (8, (4, 8)),
    (512, (8, 20, 512)),
    ((16,), (2, 5, 16)),
    ((3, 4), (3, 4)),
    ((3, 4), (2, 3, 4)),
    ([2, 3, 5], (2, 2, 3, 5)),
    (torch.Size([5, 6]), (3, 5, 6)),
    ((1,), (7, 1)),
    (4, (0, 4)),
]
FLAGS = [
    dict(zip(("elementwise_affine", "bias"), values))
    for values in itertools.product((True, False), repeat=2)
]
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def _pair(normalized_shape, dtype=torch.float32, seed=0, **flags):
    """(ours, torch's), both with the same random gamma and beta."""
    ours = LayerNorm(normalized_shape, **flags).to(dtype)
    theirs = nn.LayerNorm(normalized_shape, **flags).to(dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in theirs.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


# ----- the reference module ---------------------------------------------------


@pytest.mark.parametrize("flags", FLAGS, ids=str)
@pytest.mark.parametrize("normalized_shape, x_shape", SHAPES, ids=str)
def test_structure_matches_torch(normalized_shape, x_shape, flags):
    ours = LayerNorm(normalized_shape, **flags)
    theirs = nn.LayerNorm(normalized_shape, **flags)
    assert repr(ours) == repr(theirs)
    assert ours.normalized_shape == theirs.normalized_shape
    assert ours.eps == theirs.eps and ours.elementwise_affine == theirs.elementwise_affine
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [(n, p.shape, p.dtype) for n, p in ours.named_parameters()] == [
        (n, p.shape, p.dtype) for n, p in theirs.named_parameters()
    ]
    for name in ("weight", "bias"):
        assert (getattr(ours, name) is None) == (getattr(theirs, name) is None)
    for (_, mine), (_, torch_s) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert torch.equal(mine, torch_s)  # gamma 1, beta 0


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("flags", FLAGS, ids=str)
@pytest.mark.parametrize("normalized_shape, x_shape", SHAPES, ids=str)
def test_forward_matches_torch(normalized_shape, x_shape, flags, dtype):
    ours, theirs = _pair(normalized_shape, dtype, **flags)
    x = (3 + 2 * torch.randn(x_shape, generator=torch.Generator().manual_seed(1))).to(dtype)
    expected = theirs(x)
    got = ours(x)
    assert got.dtype == expected.dtype == dtype and got.shape == expected.shape
    torch.testing.assert_close(
        got.float(), expected.float(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_input_with_float32_parameters(dtype):
    ours, theirs = _pair((3, 4))
    x = torch.randn(2, 3, 4).to(dtype)
    assert ours(x).dtype == theirs(x).dtype == dtype
    torch.testing.assert_close(
        ours(x).float(), theirs(x).float(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype]
    )


@pytest.mark.parametrize("eps", [1e-5, 1e-3, 0.5, 0.0])
def test_eps_matches_torch(eps):
    ours, theirs = _pair(4, eps=eps)
    x = 0.001 * torch.tensor([[2.0, 4.0, 6.0, 8.0], [1.0, -1.0, 3.0, 0.0]])
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("flags", FLAGS, ids=str)
@pytest.mark.parametrize(
    "normalized_shape, x_shape", [(8, (3, 8)), ((3, 4), (2, 3, 4)), ((2, 3), (4, 5, 2, 3))], ids=str
)
def test_gradients_match_torch(normalized_shape, x_shape, flags):
    ours, theirs = _pair(normalized_shape, torch.float64, **flags)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(x_shape, dtype=torch.float64, generator=generator)
    upstream = torch.randn(x_shape, dtype=torch.float64, generator=generator)
    grads = []
    for module in (ours, theirs):
        xi = x.clone().requires_grad_(True)
        (module(xi) * upstream).sum().backward()
        grads.append([xi.grad] + [p.grad for p in module.parameters()])
    for mine, torch_s in zip(*grads):
        torch.testing.assert_close(mine, torch_s, rtol=1e-10, atol=1e-12)


def test_gradcheck():
    module = LayerNorm((2, 3)).double()
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(module, (x,))


def test_state_dict_moves_both_ways():
    ours, theirs = _pair((3, 4))
    fresh_torch = nn.LayerNorm((3, 4))
    fresh_torch.load_state_dict(ours.state_dict())
    fresh_ours = LayerNorm((3, 4))
    fresh_ours.load_state_dict(theirs.state_dict())
    x = torch.randn(5, 3, 4)
    torch.testing.assert_close(fresh_torch(x), fresh_ours(x))


def test_reset_parameters_and_factory_arguments():
    module = LayerNorm(6, dtype=torch.float64, device="cpu")
    assert module.weight.dtype == torch.float64
    with torch.no_grad():
        module.weight.fill_(3.0)
        module.bias.fill_(-1.0)
    module.reset_parameters()
    assert torch.equal(module.weight, torch.ones(6, dtype=torch.float64))
    assert torch.equal(module.bias, torch.zeros(6, dtype=torch.float64))


def test_the_lessons_error_message_is_torchs():
    x = torch.randn(2, 5, 4)
    with pytest.raises(RuntimeError) as from_torch:
        nn.LayerNorm([3, 4])(x)
    with pytest.raises(RuntimeError) as from_ours:
        LayerNorm([3, 4])(x)
    assert str(from_torch.value) == str(from_ours.value) == TORCH_2_13_MESSAGE
    assert shape_error_message((3, 4), (2, 5, 4)) == TORCH_2_13_MESSAGE


@pytest.mark.parametrize(
    "normalized_shape, x_shape",
    [
        (4, (2, 5)),
        ((3, 4), (12,)),
        ((3, 4), (2, 4, 3)),
        (4, ()),
        ((2, 3, 4), (3, 4)),
        ((), (2, 3)),
    ],
    ids=str,
)
def test_every_error_message_is_torchs(normalized_shape, x_shape):
    x = torch.randn(x_shape)
    with pytest.raises(RuntimeError) as from_torch:
        nn.LayerNorm(normalized_shape)(x)
    with pytest.raises(RuntimeError) as from_ours:
        LayerNorm(normalized_shape)(x)
    assert str(from_ours.value) == str(from_torch.value)


def test_the_lessons_hidden_states():
    x = torch.randn(8, 20, 512, generator=torch.Generator().manual_seed(0))
    module = LayerNorm(512)
    y = module(x)
    assert y.shape == (8, 20, 512)
    assert sum(p.numel() for p in module.parameters()) == 2 * 512
    torch.testing.assert_close(y.mean(-1), torch.zeros(8, 20), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(8, 20), atol=1e-3, rtol=0)


# ----- the checks ---------------------------------------------------------------


class CorrectLayerNorm(nn.Module):
    """What a student should write; subclasses below each make one slip."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight = self.bias = None
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape))
            if bias:
                self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    def check_shape(self, x):
        k = len(self.normalized_shape)
        if x.dim() < k or tuple(x.shape[-k:]) != self.normalized_shape:
            raise RuntimeError(
                f"Given normalized_shape={list(self.normalized_shape)}, "
                f"got input of size {list(x.shape)}"
            )

    def statistics(self, x, dims):
        return x.mean(dims, keepdim=True), x.var(dims, keepdim=True, unbiased=False)

    def forward(self, x):
        self.check_shape(x)
        dims = tuple(range(-len(self.normalized_shape), 0))
        given, x = x.dtype, x.to(torch.promote_types(x.dtype, torch.float32))
        mean, var = self.statistics(x, dims)
        y = (x - mean) / torch.sqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(given)


class FlattenVarMean(nn.Module):
    """Correct but unusual: flattens the trailing dims, torch.var_mean,
    eps in a non-persistent buffer, a ValueError worded its own way."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        shape = torch.Size(
            [normalized_shape] if isinstance(normalized_shape, int) else normalized_shape
        )
        self.shape = shape
        self.register_buffer("eps_tensor", torch.tensor(eps), persistent=False)
        if elementwise_affine:
            self.register_parameter("weight", nn.Parameter(torch.full(shape, 1.0)))
            self.register_parameter("bias", nn.Parameter(torch.full(shape, 0.0)) if bias else None)

    def forward(self, x):
        lead = x.shape[: x.dim() - len(self.shape)]
        if x.shape[len(lead) :] != self.shape or x.dim() < len(self.shape):
            raise ValueError(f"input {tuple(x.shape)} does not end in {tuple(self.shape)}")
        flat = x.reshape(*lead, -1).float() if x.dtype == torch.bfloat16 else x.reshape(
            *lead, -1)
        var, mean = torch.var_mean(flat, dim=-1, keepdim=True, correction=0)
        y = ((flat - mean) * torch.rsqrt(var + self.eps_tensor)).reshape(x.shape)
        if getattr(self, "weight", None) is not None:
            y = torch.addcmul(
                self.bias if self.bias is not None else torch.zeros_like(y), y, self.weight
            )
        return y.to(x.dtype)


class BiasFirst(CorrectLayerNorm):
    """Correct but unusual: beta is created before gamma, so parameters()
    and the state_dict list bias first; names, not order, must match."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__(normalized_shape, eps, elementwise_affine=False)
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            shape = self.normalized_shape
            self.bias = nn.Parameter(torch.zeros(shape)) if bias else None
            self.weight = nn.Parameter(torch.ones(shape))


class BiasFirstAdd(BiasFirst):
    def forward(self, x, residual=None):
        residual_sum = x if residual is None else x + residual
        return super().forward(residual_sum), residual_sum


class OnePassVariance(CorrectLayerNorm):
    def statistics(self, x, dims):
        mean = x.mean(dims, keepdim=True)
        return mean, (x * x).mean(dims, keepdim=True) - mean * mean


class UnbiasedVariance(CorrectLayerNorm):
    def statistics(self, x, dims):
        return x.mean(dims, keepdim=True), x.var(dims, keepdim=True)


class AlwaysBias(CorrectLayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__(normalized_shape, eps, elementwise_affine, True)


class NoShapeCheck(CorrectLayerNorm):
    def check_shape(self, x):
        pass


class VagueError(CorrectLayerNorm):
    def check_shape(self, x):
        if tuple(x.shape[-len(self.normalized_shape) :]) != self.normalized_shape:
            raise ValueError("input has the wrong shape")


class LastDimOnly(CorrectLayerNorm):
    def statistics(self, x, dims):
        return super().statistics(x, (-1,))


class EpsOutsideRoot(CorrectLayerNorm):
    def statistics(self, x, dims):
        mean, var = super().statistics(x, dims)
        root = torch.sqrt(var) + self.eps
        return mean, root * root - self.eps


class FixedEps(CorrectLayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, **flags):
        super().__init__(normalized_shape, 1e-5, **flags)


class WrongDefaultEps(CorrectLayerNorm):
    def __init__(self, normalized_shape, eps=1e-6, **flags):
        super().__init__(normalized_shape, eps, **flags)


class GammaBetaNames(CorrectLayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__(normalized_shape, eps, False)
        self.gamma = self.beta = None
        if elementwise_affine:
            self.gamma = nn.Parameter(torch.ones(self.normalized_shape))
            if bias:
                self.beta = nn.Parameter(torch.zeros(self.normalized_shape))

    def forward(self, x):
        y = super().forward(x)
        y = y if self.gamma is None else y * self.gamma
        return (y if self.beta is None else y + self.beta).to(x.dtype)


class PlainTensors(CorrectLayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__(normalized_shape, eps, False)
        self.weight = torch.ones(self.normalized_shape)
        self.bias = torch.zeros(self.normalized_shape)


class RandomInit(CorrectLayerNorm):
    def __init__(self, normalized_shape, **flags):
        super().__init__(normalized_shape, **flags)
        if self.weight is not None:
            nn.init.normal_(self.weight)


class EpsInStateDict(CorrectLayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, **flags):
        super().__init__(normalized_shape, eps, **flags)
        self.register_buffer("eps_buffer", torch.tensor(eps))


class DetachedInput(CorrectLayerNorm):
    def forward(self, x):
        return super().forward(x.detach())


class NumpyOutput(CorrectLayerNorm):
    def forward(self, x):
        return super().forward(x).detach().numpy()


class NotAModule:
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        self.inner = CorrectLayerNorm(normalized_shape, eps, elementwise_affine, bias)

    def __call__(self, x):
        return self.inner(x)


CHECK_NAMES = ["parameters", "forward", "float64", "flags", "state_dict", "autograd",
               "shape_error"]

# module -> the checks it should fail (all others must pass)
EXPECTED_FAILURES = {
    CorrectLayerNorm: set(),
    FlattenVarMean: set(),
    OnePassVariance: {"forward"},  # on the tokens around 1000 in float32
    UnbiasedVariance: {"forward"},  # flags, low precision and autograd leave it to forward
    AlwaysBias: {"flags"},
    NoShapeCheck: {"shape_error"},
    VagueError: {"shape_error"},
    LastDimOnly: {"forward", "flags", "autograd"},
    # one slip, one charge: flags, float64 and autograd follow that forward
    EpsOutsideRoot: {"forward"},
    FixedEps: {"flags"},
    WrongDefaultEps: {"flags"},
    GammaBetaNames: {"parameters", "state_dict"},
    PlainTensors: {"parameters", "forward", "float64", "flags", "state_dict", "autograd"},
    RandomInit: {"parameters"},
    EpsInStateDict: {"parameters", "state_dict"},
    DetachedInput: {"autograd"},
    NumpyOutput: {"forward", "float64", "flags", "autograd"},
    NotAModule: set(CHECK_NAMES),
}


def _outcome(check_name, module_class):
    try:
        getattr(checks, f"check_my_layer_norm_{check_name}")(module_class)
    except checks.CheckFailed as failure:
        return str(failure)
    return None


@pytest.mark.parametrize("module_class", list(EXPECTED_FAILURES), ids=lambda c: c.__name__)
def test_checks_fail_exactly_the_broken_parts(module_class, capsys):
    failed = {name for name in CHECK_NAMES if _outcome(name, module_class)}
    assert failed == EXPECTED_FAILURES[module_class]


@pytest.mark.parametrize(
    "module_class, check_name, words",
    [
        (UnbiasedVariance, "forward", "not n - 1"),
        (OnePassVariance, "forward", "E[x^2] - E[x]^2, which cancels catastrophically"),
        (AlwaysBias, "flags", "bias=False"),
        (NoShapeCheck, "shape_error", "inside the computation"),
        (VagueError, "shape_error", "names both"),
        (LastDimOnly, "forward", "not only the last one"),
        (EpsOutsideRoot, "forward", "inside the square root"),
        (FixedEps, "flags", "use the eps you were given"),
        (WrongDefaultEps, "flags", "default eps is 1e-5"),
        (GammaBetaNames, "parameters", "names them ['weight', 'bias']"),
        (PlainTensors, "parameters", "nn.Parameter"),
        (RandomInit, "parameters", "gamma starts at 1"),
        (EpsInStateDict, "parameters", "non-persistent"),
        (EpsInStateDict, "state_dict", "Missing key"),
        (DetachedInput, "autograd", "no gradient reached the input"),
        (NumpyOutput, "forward", "dtype"),
        (NotAModule, "parameters", "subclass torch.nn.Module"),
    ],
    ids=str,
)
def test_failures_explain_themselves(module_class, check_name, words, capsys):
    message = _outcome(check_name, module_class)
    assert message is not None and words in message, message


def test_the_one_pass_variance_is_charged_by_the_forward_check_only(capsys):
    """Its float32 statistics of a float16 input around 1000 are off for the same
    reason as its float32 forward: mln_forward charges it, mln_low_precision not."""
    assert _outcome("forward", OnePassVariance) is not None
    assert _outcome("low_precision", OnePassVariance) is None


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("check_name", CHECK_NAMES)
def test_correct_modules_pass_for_any_seed(check_name, seed):
    name = f"my_layer_norm_{check_name}"
    probe = {
        "state_dict": module_probes._probe_state_dict,
        "autograd": module_probes._probe_autograd,
        "shape_error": module_probes._probe_shape_error,
    }.get(check_name, module_probes._probe_module)
    for module_class in (CorrectLayerNorm, FlattenVarMean, BiasFirst, LayerNorm):
        cases = _registry.make_cases(name, seed)
        outputs, errors = _runner._probe_all(module_class, cases, probe)
        verdict = _registry.judge(name, cases, outputs, errors)
        assert verdict["passed"], (module_class.__name__, verdict["message"])


def test_cases_cross_the_wire_as_plain_arrays():
    for name in (f"my_layer_norm_{c}" for c in CHECK_NAMES):
        for _, case in _registry.make_cases(name):
            for value in case.values():
                assert isinstance(value, np.ndarray) and value.dtype != object


class NotWrittenYet(NotImplementedError):
    """A student's own placeholder error: still a NotImplementedError."""


class ForwardNotWritten(CorrectLayerNorm):
    def forward(self, x):
        raise NotWrittenYet("forward")


def test_shape_error_check_judges_the_exception_by_its_classes(capsys):
    """The probe reports the exception's MRO, so a subclass of NotImplementedError
    is read as one (before, only its own name was compared)."""
    message = _outcome("shape_error", ForwardNotWritten)
    assert "not written yet" in message, message
    report = module_probes._probe_shape_error(ForwardNotWritten, _registry.make_cases(
        "my_layer_norm_shape_error")[0][1])
    assert "builtins.NotImplementedError" in report["error_classes"].tolist()


# ----- the fused residual add + layer norm: reference against torch ---------------


@pytest.mark.parametrize("flags", FLAGS, ids=str)
@pytest.mark.parametrize("normalized_shape, x_shape", SHAPES, ids=str)
def test_add_layer_norm_matches_an_add_then_torchs_layer_norm(normalized_shape, x_shape, flags):
    ours = AddLayerNorm(normalized_shape, **flags)
    theirs = nn.LayerNorm(normalized_shape, **flags)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in theirs.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))
    ours.load_state_dict(theirs.state_dict())
    assert repr(ours).replace("AddLayerNorm", "LayerNorm") == repr(theirs)
    x = 3 + 2 * torch.randn(x_shape, generator=generator)
    residual = torch.randn(x_shape, generator=generator)
    normed, residual_sum = ours(x, residual)  # flash-attn's order: (out, residual)
    torch.testing.assert_close(residual_sum, x + residual)
    torch.testing.assert_close(normed, theirs(x + residual), rtol=1e-5, atol=1e-5)
    first_normed, first_sum = ours(x)  # residual=None: the first block
    assert first_sum is x
    torch.testing.assert_close(first_normed, theirs(x), rtol=1e-5, atol=1e-5)


def test_add_layer_norm_gradients_match_torch():
    ours, theirs = AddLayerNorm((2, 3)).double(), nn.LayerNorm((2, 3)).double()
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for param in theirs.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64))
    ours.load_state_dict(theirs.state_dict())
    x, residual, up_sum, up_normed = (
        torch.randn(4, 2, 3, dtype=torch.float64, generator=generator) for _ in range(4))
    grads = []
    for run_ours in (True, False):
        xi, ri = x.clone().requires_grad_(True), residual.clone().requires_grad_(True)
        if run_ours:
            normed, residual_sum = ours(xi, ri)
            params = list(ours.parameters())
        else:
            residual_sum = xi + ri
            normed = theirs(residual_sum)
            params = list(theirs.parameters())
        ((residual_sum * up_sum).sum() + (normed * up_normed).sum()).backward()
        grads.append([xi.grad, ri.grad] + [p.grad for p in params])
    for mine, torch_s in zip(*grads):
        torch.testing.assert_close(mine, torch_s, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[0][0], grads[0][1])  # d/dx == d/dresidual


# ----- the fused residual add + layer norm: the check --------------------------------


class CorrectAdd(CorrectLayerNorm):
    def forward(self, x, residual=None):
        residual_sum = x if residual is None else x + residual
        return super().forward(residual_sum), residual_sum


class ScratchAdd(nn.Module):
    """Correct but unusual: nn.Module from scratch, torch.add, a list back."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        self.shape = torch.Size(
            [normalized_shape] if isinstance(normalized_shape, int) else normalized_shape
        )
        self.register_buffer("eps_tensor", torch.tensor(eps), persistent=False)
        ones, zeros = torch.ones(self.shape), torch.zeros(self.shape)
        self.register_parameter("weight", nn.Parameter(ones) if elementwise_affine else None)
        affine_bias = elementwise_affine and bias
        self.register_parameter("bias", nn.Parameter(zeros) if affine_bias else None)

    def forward(self, x, residual=None):
        stream = x.clone() if residual is None else torch.add(x, residual)
        flat = stream.reshape(*stream.shape[: stream.dim() - len(self.shape)], -1)
        var, mean = torch.var_mean(flat, dim=-1, keepdim=True, correction=0)
        y = ((flat - mean) * torch.rsqrt(var + self.eps_tensor)).reshape(stream.shape)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return [y, stream]


class SwappedOutputs(CorrectAdd):
    def forward(self, x, residual=None):
        normed, residual_sum = super().forward(x, residual)
        return residual_sum, normed


class NormsX(CorrectAdd):
    def forward(self, x, residual=None):
        return CorrectLayerNorm.forward(self, x), (x if residual is None else x + residual)


class ResidualRequired(CorrectAdd):
    def forward(self, x, residual):
        return super().forward(x, residual)


class DetachedSum(CorrectAdd):
    def forward(self, x, residual=None):
        normed, residual_sum = super().forward(x, residual)
        return normed, residual_sum.detach()


class OnlyNormed(CorrectAdd):
    def forward(self, x, residual=None):
        return super().forward(x, residual)[0]


class Submodule(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        self.norm = CorrectLayerNorm(normalized_shape, eps, elementwise_affine, bias)

    def forward(self, x, residual=None):
        residual_sum = x if residual is None else x + residual
        return self.norm(residual_sum), residual_sum


class AddAlwaysBias(CorrectAdd, AlwaysBias):
    pass


class AddUnbiased(CorrectAdd, UnbiasedVariance):
    pass


def _add_outcome(module_class):
    try:
        checks.check_add_layer_norm_module(module_class)
    except checks.CheckFailed as failure:
        return str(failure)
    return None


@pytest.mark.parametrize(
    "module_class, words",
    [
        (AddLayerNorm, None),
        (CorrectAdd, None),
        (ScratchAdd, None),
        (SwappedOutputs, "in that order"),
        (NormsX, "not x alone"),
        (ResidualRequired, "missing 1 required positional argument"),
        (DetachedSum, "gradient with respect to x"),
        (OnlyNormed, "returns a pair"),
        (Submodule, "['norm.weight', 'norm.bias']"),
        (AddAlwaysBias, "['weight', 'bias']"),
        (AddUnbiased, "your normed output"),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_add_check_passes_correct_modules_and_explains_the_slips(module_class, words, capsys):
    message = _add_outcome(module_class)
    if words is None:
        assert message is None, message
    else:
        assert message is not None and words in message, message


@pytest.mark.parametrize("seed", range(3))
def test_correct_add_modules_pass_for_any_seed(seed):
    cases = _registry.make_cases("add_layer_norm_module", seed)
    for module_class in (CorrectAdd, ScratchAdd, BiasFirstAdd, AddLayerNorm):
        outputs, errors = _runner._probe_all(module_class, cases,
                                             module_probes._probe_add_layer_norm)
        verdict = _registry.judge("add_layer_norm_module", cases, outputs, errors)
        assert verdict["passed"], (module_class.__name__, verdict["message"])


# ----- the fused add on a float32 residual stream (residual_in_fp32) ---------------------


def test_add_layer_norm_keeps_a_float32_stream_under_bfloat16_inputs():
    """flash-attn's dtypes, checked against float64 sums and torch's own layer norm:
    the sum widened, never the residual narrowed; normed in x's dtype."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(4, 64, generator=generator).bfloat16()
    stream = 300 + torch.randn(4, 64, generator=generator)  # bits bfloat16 cannot hold
    normed, residual_sum = AddLayerNorm(64, residual_in_fp32=True)(x, stream)
    exact = x.double() + stream.double()
    assert residual_sum.dtype == torch.float32 and normed.dtype == torch.bfloat16
    torch.testing.assert_close(residual_sum.double(), exact, rtol=1e-7, atol=1e-4)
    torch.testing.assert_close(normed.double(), torch.nn.functional.layer_norm(exact, (64,)),
                               rtol=2e-2, atol=2e-2)
    narrowed = torch.nn.functional.layer_norm(exact.bfloat16().double(), (64,))
    assert (normed.double() - narrowed).abs().max() > 0.5  # the slip is far off


@pytest.mark.parametrize("flag, residual_dtype, stored", [
    (True, None, torch.float32),  # the first block starts the float32 stream
    (False, None, torch.bfloat16),
    (False, torch.float32, torch.float32),  # later blocks: the stream's own dtype
    (True, torch.bfloat16, torch.bfloat16),
])
def test_add_layer_norm_stores_the_sum_as_flash_attn_does(flag, residual_dtype, stored):
    x = torch.randn(2, 8).bfloat16()
    residual = None if residual_dtype is None else torch.randn(2, 8).to(residual_dtype)
    normed, residual_sum = AddLayerNorm(8, residual_in_fp32=flag)(x, residual)
    assert residual_sum.dtype == stored and normed.dtype == torch.bfloat16


def test_fp32_residual_cases_are_what_their_labels_say():
    cases = _registry.make_cases("add_layer_norm_fp32_residual")
    mixed = [case for label, case in cases if str(case["x_dtype"]) != "bfloat16"]
    assert [(str(c["x_dtype"]), str(c["residual_dtype"])) for c in mixed] == [
        ("float32", "float64"), ("float64", "float32")]  # the wider one both ways
    for case in mixed:  # the stream around 1000 has a spread float32 cannot hold
        stream = case["residual"] if case["residual"].dtype == np.float64 else case["x"]
        assert abs(stream.mean() - 1000) < 1 and stream.std() < 1e-2
        assert not np.array_equal(stream.astype(np.float32).astype(np.float64), stream)
    cases = [(label, case) for label, case in cases if str(case["x_dtype"]) == "bfloat16"]
    for label, case in cases:
        x = torch.from_numpy(case["x"])
        assert torch.equal(x.bfloat16().float(), x), label
        assert ("residual_in_fp32=True" in label) == bool(case.get("residual_in_fp32", False))
        assert ("residual" in case) == ("module(x)" not in label), label
    spread_8, around_300 = cases[0][1]["residual"], cases[1][1]["residual"]
    assert 7 < spread_8.std() < 9 and str(cases[0][1]["residual_dtype"]) == "float32"
    assert abs(around_300.mean() - 300) < 1 and str(cases[1][1]["residual_dtype"]) == "float32"
    above_300 = torch.tensor(300.0).bfloat16().float() + 1.5  # rounds up to the next one
    assert above_300.bfloat16().float().item() - 300 == 2  # "bfloat16's spacing is 2"
    assert not torch.equal(torch.from_numpy(spread_8).bfloat16().float(),
                           torch.from_numpy(spread_8))  # rounding it would show
    assert str(cases[4][1]["residual_dtype"]) == "bfloat16"
    both_bfloat16 = cases[5][1]  # a sum rounded to bfloat16 there loses a unit of 2
    assert str(both_bfloat16["residual_dtype"]) == "bfloat16"
    assert abs(both_bfloat16["residual"].mean() - 300) < 1
    assert 1.5 < both_bfloat16["residual"].std() < 2.5


class TorchFp32Add(nn.LayerNorm):
    """flash-attn's layer_norm_ref with upcast=True, on torch's own layer norm: right."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 residual_in_fp32=False):
        super().__init__(normalized_shape, eps, elementwise_affine, bias)
        self.residual_in_fp32 = residual_in_fp32

    def forward(self, x, residual=None):
        stored = residual.dtype if residual is not None else (
            torch.float32 if self.residual_in_fp32 else x.dtype)
        wide = torch.promote_types(x.dtype, torch.float32)
        if residual is not None:
            wide = torch.promote_types(wide, residual.dtype)
        total = x.to(wide) if residual is None else x.to(wide) + residual.to(wide)
        return nn.functional.layer_norm(
            total, self.normalized_shape, None if self.weight is None else self.weight.to(wide),
            None if self.bias is None else self.bias.to(wide), self.eps).to(x.dtype), \
            total.to(stored)


class NarrowsAFloat64Residual(TorchFp32Add):
    """Adds in float32 whatever the inputs: a float64 stream loses its low bits."""

    def forward(self, x, residual=None):
        if residual is None or residual.dtype != torch.float64:
            return super().forward(x, residual)
        normed, residual_sum = super().forward(x, residual.float())
        return normed, residual_sum.to(residual.dtype)


class RoundsResidual(TorchFp32Add):
    def forward(self, x, residual=None):
        if residual is None:
            return super().forward(x)
        normed, _ = super().forward(x, residual)
        return normed, (x + residual.to(x.dtype)).to(residual.dtype)


class NormsTheNarrowSum(TorchFp32Add):
    def forward(self, x, residual=None):
        _, residual_sum = super().forward(x, residual)
        return nn.LayerNorm.forward(self, residual_sum.to(x.dtype).float()).to(x.dtype), \
            residual_sum


class AddsInThePromotedDtype(TorchFp32Add):
    """Adds x + residual as torch promotes them: bfloat16 + bfloat16 stays
    bfloat16, so the norm reads a sum already rounded."""

    def forward(self, x, residual=None):
        if residual is None or residual.dtype != x.dtype:
            return super().forward(x, residual)
        total = x + residual
        return super().forward(total)[0], total


class NormedInFloat32(TorchFp32Add):
    def forward(self, x, residual=None):
        normed, residual_sum = super().forward(x, residual)
        return normed.float(), residual_sum


class SumInXDtype(TorchFp32Add):
    def forward(self, x, residual=None):
        normed, residual_sum = super().forward(x, residual)
        return normed, residual_sum.to(x.dtype)


class SumAlwaysFloat32(TorchFp32Add):
    def forward(self, x, residual=None):
        normed, residual_sum = super().forward(x, residual)
        return normed, residual_sum.float()


class SwappedFp32Outputs(TorchFp32Add):
    """Right dtypes and values, returned as (residual_sum, normed)."""

    def forward(self, x, residual=None):
        normed, residual_sum = super().forward(x, residual)
        return residual_sum, normed


class SwappedAndRoundsResidual(TorchFp32Add):
    """(residual_sum, normed), and the sum added in bfloat16."""

    def forward(self, x, residual=None):
        normed, residual_sum = super().forward(x, residual)
        if residual is not None and residual.dtype == torch.float32:
            residual_sum = (x + residual.to(x.dtype)).float()
        return residual_sum, normed


def _fp32_outcome(module_class):
    try:
        checks.check_add_layer_norm_fp32_residual(module_class)
    except checks.CheckFailed as failure:
        return str(failure)
    return None


@pytest.mark.parametrize(
    "module_class, words",
    [
        (AddLayerNorm, None),
        (TorchFp32Add, None),
        (RoundsResidual, "the residual rounded to bfloat16 first"),
        (NormsTheNarrowSum, "layer norm of the sum rounded to bfloat16"),
        (AddsInThePromotedDtype, "layer norm of the sum rounded to bfloat16"),
        (NormedInFloat32, "your normed output is float32; it comes back in x's dtype"),
        (SumInXDtype, "your residual_sum is bfloat16; with a residual given"),
        (SumAlwaysFloat32, "residual_sum is x, in x's dtype (bfloat16)"),
        (CorrectAdd, "unexpected keyword argument 'residual_in_fp32'"),
        (SwappedFp32Outputs, None),
        (SwappedAndRoundsResidual, "the residual rounded to bfloat16 first"),
        (NarrowsAFloat64Residual, "a float64 stream around 1000"),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_fp32_residual_check_passes_correct_modules_and_names_the_slips(module_class, words,
                                                                       capsys):
    """The dtypes are judged whichever order the pair comes in: the order is
    add_layer_norm_module's to charge, so one slip costs one cell."""
    message = _fp32_outcome(module_class)
    if words is None:
        assert message is None, message
    else:
        assert message is not None and words in message, message


# ----- the two questions ----------------------------------------------------------------


def _answer_outcome(check, **answers):
    try:
        check(**answers)
    except checks.CheckFailed as failure:
        return str(failure)
    return None


@pytest.mark.parametrize(
    "answers, right",
    [
        (dict(UNFUSED_BYTES=805306368, FUSED_BYTES=402653184), True),
        (dict(UNFUSED_BYTES="805306368", FUSED_BYTES=Fraction(805306368, 2)), True),
        (dict(UNFUSED_BYTES=torch.tensor(805306368), FUSED_BYTES=np.int64(402653184)),
         True),
        # floats that hold the count exactly: str() of the tensor would say 8.0531e+08
        (dict(UNFUSED_BYTES=torch.tensor(805306368.0, dtype=torch.float64),
              FUSED_BYTES=np.float32(402653184)), True),
        (dict(UNFUSED_BYTES=torch.tensor(805306368.0, requires_grad=True),
              FUSED_BYTES=torch.tensor(402653184.0)), True),
        (dict(UNFUSED_BYTES=805306368.0, FUSED_BYTES=402653184.5), False),
        (dict(UNFUSED_BYTES=5, FUSED_BYTES=4), False),
        # each count is its own test cell: one count alone is judged alone
        (dict(UNFUSED_BYTES=805306368), True),
        (dict(FUSED_BYTES=np.float32(402653184)), True),
        (dict(FUSED_BYTES=805306368), False),
        (dict(UNFUSED_BYTES=None), False),
    ],
)
def test_memory_bytes_question(answers, right, capsys):
    message = _answer_outcome(checks.check_add_norm_memory_bytes, **answers)
    assert (message is None) == right, message


RIGHT_INVARIANCES = dict(INSTANCENORM_CHANGED=(0, 200, 0), GROUPNORM2_CHANGED=(100, 200, 0))


@pytest.mark.parametrize(
    "answers, right",
    [
        (RIGHT_INVARIANCES, True),
        (dict(INSTANCENORM_CHANGED=[0, 200.0, np.int64(0)],
              GROUPNORM2_CHANGED=torch.tensor([100, 200, 0])), True),
        (dict(INSTANCENORM_CHANGED=np.array([0, 200, 0]),
              GROUPNORM2_CHANGED=[100, "200", 0.0]), True),
        # one-number tensors and numpy floats inside a list travel as their numbers
        (dict(INSTANCENORM_CHANGED=[torch.tensor(0), torch.tensor(200.0, dtype=torch.float64),
                                    np.float32(0)],
              GROUPNORM2_CHANGED=(np.float64(100), torch.tensor(200), 0)), True),
        # GroupNorm(1, 8)'s counts, the lesson's example layer
        ({**RIGHT_INVARIANCES, "GROUPNORM2_CHANGED": (200, 200, 200)}, False),
        # groups taken as every other channel, not runs of consecutive ones
        ({**RIGHT_INVARIANCES, "GROUPNORM2_CHANGED": (100, 200, 200)}, False),
        ({**RIGHT_INVARIANCES, "INSTANCENORM_CHANGED": (25, 200, 0)}, False),
        ({**RIGHT_INVARIANCES, "INSTANCENORM_CHANGED": (0, 200)}, False),
        ({**RIGHT_INVARIANCES, "INSTANCENORM_CHANGED": 200}, False),
        ({**RIGHT_INVARIANCES, "INSTANCENORM_CHANGED": None}, False),
        (dict(INSTANCENORM_CHANGED=(0, 200, 0)), False),
    ],
)
def test_invariance_question(answers, right, capsys):
    message = _answer_outcome(checks.check_channel_norm_invariances, **answers)
    assert (message is None) == right, message


def test_new_cases_cross_the_wire_as_plain_arrays():
    for name in ("add_layer_norm_module", "add_layer_norm_fp32_residual",
                 "add_norm_memory_bytes",
                 "channel_norm_invariances", "my_layer_norm_low_precision",
                 "layer_norm_2d_forward", "layer_norm_2d_dtypes_layouts",
                 "layer_norm_2d_gradients", "my_layer_norm_factory_kwargs",
                 "my_layer_norm_reset_repr", "adamw_param_groups"):
        for _, case in _registry.make_cases(name):
            for value in case.values():
                assert isinstance(value, np.ndarray) and value.dtype != object


# ----- the channels-first layer norm (ConvNeXt's LayerNorm2d) ------------------------


class CorrectLayerNorm2d(nn.Module):
    """The exercise's solution: statistics over dim 1, gamma/beta as (C, 1, 1)."""

    def __init__(self, num_channels, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def normalize(self, x):
        mean = x.mean(dim=1, keepdim=True)  # N, 1, H, W
        var = x.var(dim=1, keepdim=True, correction=0)  # N, 1, H, W
        return (x - mean) / torch.sqrt(var + self.eps)

    def forward(self, x):
        return (self.weight[:, None, None] * self.normalize(x)
                + self.bias[:, None, None])


class EinsumLayerNorm2d(CorrectLayerNorm2d):
    """Correct but unusual: var_mean, rsqrt and einsum for gamma."""

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=1, keepdim=True, correction=0)
        x_hat = (x - mean) * torch.rsqrt(var + self.eps)
        return torch.einsum("nchw,c->nchw", x_hat, self.weight) + self.bias.view(1, -1, 1, 1)


class PlanesLayerNorm2d(CorrectLayerNorm2d):
    def normalize(self, x):
        mean = x.mean(dim=(2, 3), keepdim=True)
        var = x.var(dim=(2, 3), keepdim=True, correction=0)
        return (x - mean) / torch.sqrt(var + self.eps)


class WholeMapLayerNorm2d(CorrectLayerNorm2d):
    def normalize(self, x):
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        var = x.var(dim=(1, 2, 3), keepdim=True, correction=0)
        return (x - mean) / torch.sqrt(var + self.eps)


class UnbiasedLayerNorm2d(CorrectLayerNorm2d):
    def normalize(self, x):
        mean = x.mean(dim=1, keepdim=True)
        return (x - mean) / torch.sqrt(x.var(dim=1, keepdim=True) + self.eps)


class LastAxisAffine2d(CorrectLayerNorm2d):
    def forward(self, x):
        return self.weight * self.normalize(x) + self.bias


class TorchDefaultEps2d(CorrectLayerNorm2d):
    def __init__(self, num_channels, eps=1e-5):
        super().__init__(num_channels, eps)


class DetachedStats2d(CorrectLayerNorm2d):
    def forward(self, x):
        return super().forward(x).detach()


def _ln2d_outcome(check, module_class):
    try:
        check(module_class)
    except checks.CheckFailed as failure:
        return str(failure)
    return None


def test_the_ln2d_reference_agrees_with_a_float64_recipe_over_channels():
    """The judge's reference (torch's layer norm on the channels-last view) equals
    the recipe written out over dim 1, gradients included."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=generator)
    gamma, beta, upstream = (torch.randn(s, dtype=torch.float64, generator=generator)
                             for s in (3, 3, (2, 3, 4, 5)))
    case = {"channels": np.array(3), "x": x.numpy(), "set_weight": gamma.numpy(),
            "set_bias": beta.numpy(), "upstream": upstream.numpy()}
    y, grads = module_judges._ln2d_reference(case)
    mine = CorrectLayerNorm2d(3).double()
    with torch.no_grad():
        mine.weight.copy_(gamma)
        mine.bias.copy_(beta)
    xg = x.clone().requires_grad_(True)
    out = mine(xg)
    (out * upstream).sum().backward()
    np.testing.assert_allclose(y, out.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["x_grad"], xg.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads["weight_grad"], mine.weight.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(grads["bias_grad"], mine.bias.grad.numpy(), rtol=1e-10)


@pytest.mark.parametrize(
    "module_class, words",
    [
        (CorrectLayerNorm2d, None),
        (EinsumLayerNorm2d, None),
        (PlanesLayerNorm2d, "instance norm"),
        (WholeMapLayerNorm2d, "GroupNorm with one group"),
        (UnbiasedLayerNorm2d, "not C - 1"),
        (LastAxisAffine2d, "broadcast along dim 1"),
        (TorchDefaultEps2d, "the default eps is 1e-6"),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_ln2d_forward_check_passes_correct_modules_and_names_the_slips(module_class, words,
                                                                        capsys):
    message = _ln2d_outcome(checks.check_layer_norm_2d_forward, module_class)
    if words is None:
        assert message is None, message
    else:
        assert message is not None and words in message, message


class WideLayerNorm2d(CorrectLayerNorm2d):
    """The exercise's solution for every dtype: a bfloat16 map's statistics in float32."""

    def forward(self, x):
        return super().forward(x.to(torch.promote_types(x.dtype, torch.float32))).to(x.dtype)


class FloatOnly2d(CorrectLayerNorm2d):
    """Computes every dtype in float32 and returns float32."""

    def forward(self, x):
        return super().forward(x.float())


class DetachedMean2d(WideLayerNorm2d):
    def normalize(self, x):
        mean = x.mean(dim=1, keepdim=True).detach()
        var = x.var(dim=1, keepdim=True, correction=0)
        return (x - mean) / torch.sqrt(var + self.eps)


class DetachedRstd2d(WideLayerNorm2d):
    def normalize(self, x):
        mean = x.mean(dim=1, keepdim=True)
        var = x.var(dim=1, keepdim=True, correction=0).detach()
        return (x - mean) / torch.sqrt(var + self.eps)


class UnbiasedWide2d(WideLayerNorm2d):
    def normalize(self, x):
        mean = x.mean(dim=1, keepdim=True)
        return (x - mean) / torch.sqrt(x.var(dim=1, keepdim=True) + self.eps)


class ViewedLayerNorm2d(WideLayerNorm2d):
    """Flattens the pixels with view(N, C, H * W): view() follows the dims, so this
    is right whatever the memory order (a channels-last map's H and W merge)."""

    def normalize(self, x):
        n, c, h, w = x.shape
        flat = x.view(n, c, h * w)
        mean = flat.mean(dim=1, keepdim=True)
        var = flat.var(dim=1, keepdim=True, correction=0)
        return ((flat - mean) / torch.sqrt(var + self.eps)).view(n, c, h, w)


class ReadsMemoryAsNCHW(WideLayerNorm2d):
    """Reads the input's memory as if it were stored (N, C, H, W): wrong values
    for a map stored channels last, right for one stored as usual."""

    def forward(self, x):
        return super().forward(x.as_strided(x.shape, torch.empty(x.shape).stride()))


@pytest.mark.parametrize(
    "module_class, words",
    [
        (WideLayerNorm2d, None),
        (ViewedLayerNorm2d, None),
        (ReadsMemoryAsNCHW, "reads the memory itself"),
        (UnbiasedWide2d, None),  # a slip ln2d_forward charges, not charged again here
        (CorrectLayerNorm2d, "take each pixel's mean and variance in float32"),
        (FloatOnly2d, "a float64 input is normalized in float64"),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_ln2d_dtypes_layouts_check(module_class, words, capsys):
    message = _ln2d_outcome(checks.check_layer_norm_2d_dtypes_layouts, module_class)
    if words is None:
        assert message is None, message
    else:
        assert message is not None and words in message, message


@pytest.mark.parametrize(
    "module_class, words",
    [
        (WideLayerNorm2d, None),
        (UnbiasedWide2d, None),  # right gradients of a slipped forward: charged once
        (DetachedMean2d, "misses the mean's path"),
        (DetachedRstd2d, "misses the variance's path"),
        (DetachedStats2d, "not connected to the autograd graph"),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_ln2d_gradients_check_follows_autograd_and_names_a_cut_graph(module_class, words,
                                                                     capsys):
    message = _ln2d_outcome(checks.check_layer_norm_2d_gradients, module_class)
    if words is None:
        assert message is None, message
    else:
        assert message is not None and words in message, message


# ----- a true drop-in: factory arguments, reset_parameters, extra_repr, AdamW -------


class DropInLayerNorm(nn.Module):
    """MyLayerNorm with torch's factory arguments, reset_parameters and extra_repr."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(
            normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(shape, **factory)) if elementwise_affine \
            else None
        self.bias = nn.Parameter(torch.empty(shape, **factory)) if (
            elementwise_affine and bias) else None
        self.reset_parameters()

    def reset_parameters(self):
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class MovedAfterwards(DropInLayerNorm):
    """Builds float32 parameters, then casts them: a new Parameter, dtype right,
    device 'meta' never reached."""

    def __init__(self, normalized_shape, device=None, dtype=None, **flags):
        super().__init__(normalized_shape, **flags)
        if dtype is not None:
            self.to(dtype)


class FreshParameters(DropInLayerNorm):
    def reset_parameters(self):
        if self.weight is not None:
            self.weight = nn.Parameter(torch.ones_like(self.weight))
        if self.bias is not None:
            self.bias = nn.Parameter(torch.zeros_like(self.bias))


class NoEpsRepr(DropInLayerNorm):
    def extra_repr(self):
        return f"{self.normalized_shape}"


class AlwaysBiasRepr(DropInLayerNorm):
    """Prints bias=True even where the module has no beta."""

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}, bias=True")


class TorchBiasRepr(DropInLayerNorm):
    """Prints bias= as nn.LayerNorm does in torch 2.13."""

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


@pytest.mark.parametrize(
    "check, module_class, words",
    [
        ("factory", DropInLayerNorm, None),
        ("factory", nn.LayerNorm, None),
        ("factory", MovedAfterwards, "lives on 'cpu'"),
        ("reset", DropInLayerNorm, None),
        ("reset", nn.LayerNorm, None),
        ("reset", FreshParameters, "made new parameters"),
        ("reset", NoEpsRepr, "give eps=0.001 too"),
        ("reset", TorchBiasRepr, None),
        ("reset", AlwaysBiasRepr, "bias= says whether the module has a beta"),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_drop_in_checks_agree_with_nn_layer_norm_and_name_the_slips(check, module_class,
                                                                    words, capsys):
    run = {"factory": checks.check_my_layer_norm_factory_kwargs,
           "reset": checks.check_my_layer_norm_reset_repr}[check]
    message = _ln2d_outcome(run, module_class)
    if words is None:
        assert message is None, message
    else:
        assert message is not None and words in message, message


DECAYED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _groups_by_owner(model, weight_decay):
    kept = {id(p) for module in model.modules()
            for name, p in module.named_parameters(recurse=False)
            if not (isinstance(module, DECAYED) and name == "weight")}
    params = list(model.parameters())
    return [{"params": [p for p in params if id(p) not in kept],
             "weight_decay": weight_decay},
            {"params": [p for p in params if id(p) in kept], "weight_decay": 0.0}]


def _groups_by_module_walk(model, weight_decay):
    """Right owner rule, but a tied weight is met twice, once per module."""
    groups = {True: [], False: []}
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            groups[isinstance(module, DECAYED) and name == "weight"].append(parameter)
    return [{"params": groups[True], "weight_decay": weight_decay},
            {"params": groups[False], "weight_decay": 0.0}]


def _groups_all_but_norms(model, weight_decay):
    """Every weight outside a *Norm class decays: embeddings too."""
    groups = {True: [], False: []}
    for name, parameter in model.named_parameters():
        owner = model.get_submodule(name.rpartition(".")[0])
        groups[name.endswith("weight") and "Norm" not in type(owner).__name__].append(
            parameter)
    return [{"params": groups[True], "weight_decay": weight_decay},
            {"params": groups[False], "weight_decay": 0.0}]


def _groups_tied_decays(model, weight_decay):
    """Embeddings kept, but the Linear weights decay even when tied to one."""
    decaying = {id(m.weight) for m in model.modules() if isinstance(m, DECAYED)}
    params = list(model.parameters())
    return [{"params": [p for p in params if id(p) in decaying],
             "weight_decay": weight_decay},
            {"params": [p for p in params if id(p) not in decaying], "weight_decay": 0.0}]


def _groups_by_first_holder(model, weight_decay):
    """The first module that holds a parameter decides its group: right while
    the embedding is registered before the head tied to it, wrong after."""
    placed = {}
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            placed.setdefault(id(parameter), (
                parameter, isinstance(module, DECAYED) and name == "weight"))
    return [{"params": [p for p, decays in placed.values() if decays],
             "weight_decay": weight_decay},
            {"params": [p for p, decays in placed.values() if not decays],
             "weight_decay": 0.0}]


def _groups_by_ndim(model, weight_decay):
    return [{"params": [p for p in model.parameters() if p.ndim >= 2],
             "weight_decay": weight_decay},
            {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]


def _groups_all_decay(model, weight_decay):
    return [{"params": list(model.parameters()), "weight_decay": weight_decay}]


def _groups_twice(model, weight_decay):
    return _groups_by_owner(model, weight_decay) + [{"params": list(model.parameters())}]


@pytest.mark.parametrize(
    "function, words",
    [
        (_groups_by_owner, None),
        (_groups_by_ndim, "a rule on p.ndim < 2 decays it"),
        (_groups_all_decay, "biases do not decay"),
        (_groups_twice, "in 2 groups"),
        (_groups_by_module_walk, "a walk over the modules meets it twice"),
        (_groups_all_but_norms, "embeddings do not decay"),
        (_groups_tied_decays, "a weight tied to an embedding counts as the embedding's"),
        (_groups_by_first_holder, "registers the head before the embedding"),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_adamw_param_groups_check(function, words, capsys):
    try:
        checks.check_adamw_param_groups(function, DropInLayerNorm)
        message = None
    except checks.CheckFailed as failure:
        message = str(failure)
    if words is None:
        assert message is None, message
    else:
        assert message is not None and words in message, message


def test_ln2d_forward_check_names_a_wrong_axis_that_broadcasts_silently():
    """With C == W, gamma as (C,) runs without an error and scales along W."""
    cases = _registry.make_cases("layer_norm_2d_forward")
    label, case = cases[1]
    assert "C = W" in label
    outputs, errors = _runner._probe_all(LastAxisAffine2d, [(label, case)],
                                         module_probes._probe_layer_norm_2d)
    verdict = _registry.judge("layer_norm_2d_forward", [(label, case)], outputs, errors)
    assert not verdict["passed"] and "along the last axis, W" in verdict["message"]


# ----- float64 computed in float32: charged once, by the forward check -------------------


class MyLayerNorm(nn.LayerNorm):
    """Named as the assignment's class, so that an AddLayerNorm built on it counts
    as inheriting its norm; computes every dtype in float32."""

    def forward(self, x):
        y = nn.functional.layer_norm(x.float(), self.normalized_shape,
                                     None if self.weight is None else self.weight.float(),
                                     None if self.bias is None else self.bias.float(),
                                     self.eps)
        return y.to(x.dtype)


class AddOnFloat32Norm(MyLayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 residual_in_fp32=False):
        super().__init__(normalized_shape, eps, elementwise_affine, bias=bias)
        self.residual_in_fp32 = residual_in_fp32

    def forward(self, x, residual=None):
        wide = torch.promote_types(x.dtype, torch.float32)
        total = x.to(wide) if residual is None else x.to(wide) + residual.to(wide)
        stored = residual.dtype if residual is not None else (
            torch.float32 if self.residual_in_fp32 else x.dtype)
        return super().forward(total).to(x.dtype), total.to(stored)


def test_float64_in_float32_is_charged_by_the_float64_check_only(capsys):
    """The inherited norm's float32 accuracy fails MyLayerNorm's float64 check
    (not its forward check), and not again the fused module's float64 gradients."""
    with pytest.raises(checks.CheckFailed, match="a float64 input is normalized in float64"):
        checks.check_my_layer_norm_float64(MyLayerNorm)
    checks.check_my_layer_norm_forward(MyLayerNorm)  # passes: float32 is enough there
    assert _add_outcome(AddOnFloat32Norm) is None
