"""Unit 03 checks, the grader-facing half: cases for MyLayerNorm and verdicts.

A case names the constructor call (normalized_shape and how it is passed:
int, tuple, list or torch.Size; only the flags the case sets), the values to
put into gamma and beta, and the inputs. The reference is
normref.torch_ref.LayerNorm, run in float64. torch is imported on first use,
so that loading the judges of other units stays fast.
"""

import re

import numpy as np

from normref.checks._registry import Check
from normref.checks.kernels_judges import _bfloat16_values
from normref.checks.tolerances import matches, mismatch, number_from_answer, tolerance_for

# ----- building cases -------------------------------------------------------


def _case(normalized_shape, kind="tuple", **entries):
    """A case dict: the constructor's arguments plus arrays to use.

    `kind` is how normalized_shape is passed (int, tuple, list, size);
    entries named eps, elementwise_affine or bias become constructor
    arguments, everything else is data for the probe.
    """
    case = {
        "normalized_shape": np.array(normalized_shape, dtype=np.int64).reshape(-1),
        "shape_kind": np.array(kind),
    }
    for key, value in entries.items():
        case[key] = np.asarray(value)
    return case


def _random_affine(rng, shape, dtype=np.float32):
    return {
        "set_weight": rng.normal(1.0, 0.5, size=shape).astype(dtype),
        "set_bias": rng.normal(0.0, 0.5, size=shape).astype(dtype),
    }


def _parameter_cases(rng):
    return [
        ("MyLayerNorm(8)", _case(8, "int")),
        ("MyLayerNorm(512), the width of the lesson's hidden states", _case(512, "int")),
        ("MyLayerNorm((3, 4))", _case((3, 4), "tuple")),
        ("MyLayerNorm([2, 3, 5]), a list", _case((2, 3, 5), "list")),
        ("MyLayerNorm(torch.Size([6]))", _case(6, "size")),
    ]


# A right float32 forward (two passes: the mean, then the squared deviations) is
# within 1e-4 of the float64 reference on tokens around 1000 with spread 1; the
# one-pass variance mean(x**2) - mean(x)**2 is off there by several percent.
FAR_FROM_ZERO_TOLERANCE = 1e-3


def _identity_affine(shape, dtype=np.float32):
    """gamma = 1 and beta = 0, set explicitly: the forward checks do not rely
    on the initial values, which the parameters check grades."""
    return {"set_weight": np.ones(shape, dtype), "set_bias": np.zeros(shape, dtype)}


def _forward_cases(rng):
    constant_token = rng.normal(size=(3, 8)).astype(np.float32)
    constant_token[1] = 4.0
    return [
        (
            "MyLayerNorm(8) on a batch of 4 tokens, gamma = 1, beta = 0",
            _case(8, "int", x=rng.normal(size=(4, 8)).astype(np.float32), **_identity_affine(8)),
        ),
        (
            "MyLayerNorm(6) on a single token of shape (6,)",
            _case(
                6,
                "int",
                x=rng.normal(2.0, 3.0, size=6).astype(np.float32),
                **_random_affine(rng, 6),
            ),
        ),
        (
            "MyLayerNorm(16) on (batch 2, sequence 5, features 16) with random gamma, beta",
            _case(
                16,
                "int",
                x=rng.normal(1.0, 2.0, size=(2, 5, 16)).astype(np.float32),
                **_random_affine(rng, 16),
            ),
        ),
        (
            "MyLayerNorm(8) on a batch whose second token is constant, beta random",
            _case(8, "int", x=constant_token, **_random_affine(rng, 8)),
        ),
        (
            "MyLayerNorm((3, 4)) on (2, 3, 4) with random gamma, beta",
            _case(
                (3, 4),
                "tuple",
                x=rng.normal(size=(2, 3, 4)).astype(np.float32),
                **_random_affine(rng, (3, 4)),
            ),
        ),
        (
            "MyLayerNorm([2, 3, 4]) on (2, 2, 3, 4), a list",
            _case(
                (2, 3, 4),
                "list",
                x=rng.normal(-1.0, 2.0, size=(2, 2, 3, 4)).astype(np.float32),
                **_random_affine(rng, (2, 3, 4)),
            ),
        ),
        (
            "MyLayerNorm(torch.Size([5, 6])) on (2, 3, 5, 6) with an offset of 10",
            _case(
                (5, 6),
                "size",
                x=(10 + rng.normal(size=(2, 3, 5, 6))).astype(np.float32),
                **_identity_affine((5, 6)),
            ),
        ),
        (
            "MyLayerNorm(8, eps=1e-5) on tokens of small spread (about 0.003), where "
            "eps is not negligible",
            _case(
                8,
                "int",
                eps=1e-5,
                x=(0.003 * rng.normal(size=(3, 8))).astype(np.float32),
                **_random_affine(rng, 8),
            ),
        ),
        # last, so that the slips the cases above name are named first
        (
            "MyLayerNorm(64) in float32 on 8 tokens around 1000 with spread 1, gamma = 1, "
            f"beta = 0 (judged to {FAR_FROM_ZERO_TOLERANCE:g}: float32 holds these values "
            "to about 6e-5)",
            _case(
                64,
                "int",
                x=rng.normal(1000.0, 1.0, size=(8, 64)).astype(np.float32),
                far_from_zero=True,
                **_identity_affine(64),
            ),
        ),
    ]


def _float64_cases(rng):
    """The precision policy's cases: a float64 input is normalized in float64."""
    return [
        (
            "MyLayerNorm(16, eps=1e-5) in float64 on tokens around 1000, whose spread "
            "float32 keeps to about 4 decimals only",
            _case(
                16,
                "int",
                eps=1e-5,
                x=rng.normal(1000.0, 1.0, size=(3, 16)),
                **_random_affine(rng, 16, np.float64),
            ),
        ),
        (
            "MyLayerNorm((4, 5), eps=1e-5) in float64 on (3, 4, 5)",
            _case(
                (4, 5),
                "tuple",
                eps=1e-5,
                x=rng.normal(size=(3, 4, 5)),
                **_random_affine(rng, (4, 5), np.float64),
            ),
        ),
    ]


def _low_precision_cases(rng):
    return [
        (
            "MyLayerNorm(1024) on a bfloat16 (4, 1024) stream around 300, where "
            "bfloat16's spacing is 2",
            _case(
                1024,
                "int",
                x=_bfloat16_values(rng.normal(300.0, 2.0, size=(4, 1024))),
                x_dtype="bfloat16",
                **_identity_affine(1024),
            ),
        ),
        (
            "MyLayerNorm(64) on a float16 (3, 64) batch around 1000, where "
            "float16's spacing is 0.5, random gamma and beta",
            _case(
                64,
                "int",
                x=rng.normal(1000.0, 1.0, size=(3, 64)).astype(np.float16).astype(np.float32),
                x_dtype="float16",
                **_random_affine(rng, 64),
            ),
        ),
        _cancelling_affine_case(rng),
    ]


def _cancelling_affine_case(rng):
    """A bfloat16 module (parameters too, as after module.to(torch.bfloat16)) on a
    bfloat16 batch, with gamma between 64 and 128 and a beta that cancels gamma *
    x_hat on token 0, leaving outputs of about 1 there. nn.LayerNorm forms
    gamma * x_hat + beta in float32 and rounds once, so token 0 comes out to
    bfloat16's spacing near 1; an affine step rounded to bfloat16 on the way
    (x_hat, or the product, near 100, where bfloat16's spacing is 0.5) leaves
    errors up to about 0.5 there, and more for larger products: several times
    the tolerance of about 0.04 on outputs near 1."""
    x = _bfloat16_values(rng.normal(0.0, 1.0, size=(4, 256)))
    x_hat_0 = _normalized(x[:1].astype(np.float64), (1,), 1e-5)[0]
    weight = _bfloat16_values(rng.uniform(64.0, 128.0, size=256))
    bias = _bfloat16_values(-weight * x_hat_0 + rng.normal(0.0, 1.0, size=256))
    return (
        "MyLayerNorm(256).to(torch.bfloat16) on a bfloat16 (4, 256) batch, gamma "
        "between 64 and 128 and a beta that cancels gamma * x_hat on token 0, "
        "leaving outputs of about 1 there",
        _case(256, "int", x=x, x_dtype="bfloat16", param_dtype="bfloat16",
              affine_cancels=True, set_weight=weight, set_bias=bias),
    )


def _flag_cases(rng):
    tiny_spread = (0.001 * np.array([[2.0, 4.0, 6.0, 8.0], [1.0, -1.0, 3.0, 0.0]])).astype(
        np.float32
    )
    return [
        (
            "MyLayerNorm(4) with the default eps on tokens of tiny spread (0.001 * [2, 4, 6, 8])",
            _case(4, "int", x=tiny_spread, **_identity_affine(4)),
        ),
        (
            "MyLayerNorm(8, eps=0.5)",
            _case(
                8,
                "int",
                eps=0.5,
                x=rng.normal(size=(3, 8)).astype(np.float32),
                **_random_affine(rng, 8),
            ),
        ),
        (
            "MyLayerNorm((2, 4), eps=1e-3) on tokens of small spread",
            _case(
                (2, 4),
                "tuple",
                eps=1e-3,
                x=(0.02 * rng.normal(size=(3, 2, 4))).astype(np.float32),
                **_random_affine(rng, (2, 4)),
            ),
        ),
        (
            "MyLayerNorm(8, elementwise_affine=False)",
            _case(
                8,
                "int",
                elementwise_affine=False,
                x=rng.normal(3.0, 2.0, size=(2, 3, 8)).astype(np.float32),
            ),
        ),
        (
            "MyLayerNorm((3, 4), eps=0.1, elementwise_affine=False)",
            _case(
                (3, 4),
                "tuple",
                eps=0.1,
                elementwise_affine=False,
                x=rng.normal(size=(2, 3, 4)).astype(np.float32),
            ),
        ),
        (
            "MyLayerNorm(8, bias=False) with random gamma",
            _case(
                8,
                "int",
                bias=False,
                x=rng.normal(size=(4, 8)).astype(np.float32),
                set_weight=rng.normal(1.0, 0.5, size=8).astype(np.float32),
            ),
        ),
        (
            "MyLayerNorm((2, 3), bias=False) with random gamma",
            _case(
                (2, 3),
                "tuple",
                bias=False,
                x=rng.normal(size=(4, 2, 3)).astype(np.float32),
                set_weight=rng.normal(1.0, 0.5, size=(2, 3)).astype(np.float32),
            ),
        ),
        (
            "MyLayerNorm(8, elementwise_affine=False, bias=False)",
            _case(
                8,
                "int",
                elementwise_affine=False,
                bias=False,
                x=rng.normal(size=(2, 8)).astype(np.float32),
            ),
        ),
    ]


def _state_dict_case(rng, normalized_shape, kind):
    shape = np.array(normalized_shape).reshape(-1)
    values = {
        name: rng.normal(size=shape).astype(np.float32)
        for name in ("torch_weight", "torch_bias", "my_weight", "my_bias")
    }
    return _case(normalized_shape, kind, **values)


def _state_dict_cases(rng):
    return [
        ("MyLayerNorm(8) <-> nn.LayerNorm(8)", _state_dict_case(rng, 8, "int")),
        ("MyLayerNorm((3, 4)) <-> nn.LayerNorm((3, 4))", _state_dict_case(rng, (3, 4), "tuple")),
    ]


def _autograd_cases(rng):
    return [
        (
            "MyLayerNorm(8, eps=1e-5) on a batch of 3 tokens, float64",
            _case(
                8,
                "int",
                eps=1e-5,
                x=rng.normal(size=(3, 8)),
                upstream=rng.normal(size=(3, 8)),
                **_random_affine(rng, 8, np.float64),
            ),
        ),
        (
            "MyLayerNorm(16) on (batch 2, sequence 4, features 16), float32",
            _case(
                16,
                "int",
                x=rng.normal(size=(2, 4, 16)).astype(np.float32),
                upstream=rng.normal(size=(2, 4, 16)).astype(np.float32),
                **_random_affine(rng, 16),
            ),
        ),
        (
            "MyLayerNorm((2, 3), eps=1e-5) on (4, 2, 3), float64",
            _case(
                (2, 3),
                "tuple",
                eps=1e-5,
                x=rng.normal(size=(4, 2, 3)),
                upstream=rng.normal(size=(4, 2, 3)),
                **_random_affine(rng, (2, 3), np.float64),
            ),
        ),
    ]


def _shape_error_cases(rng):
    def call(normalized_shape, kind, x_shape, **flags):
        return _case(normalized_shape, kind, x_shape=np.array(x_shape, dtype=np.int64), **flags)

    return [
        ("MyLayerNorm((3, 4)) on an input of shape (2, 5, 4)", call((3, 4), "tuple", (2, 5, 4))),
        ("MyLayerNorm(6) on an input of shape (2, 3, 5)", call(6, "int", (2, 3, 5))),
        (
            "MyLayerNorm((3, 4)) on an input of shape (2, 4, 3), same size, dims swapped",
            call((3, 4), "tuple", (2, 4, 3)),
        ),
        (
            "MyLayerNorm((3, 4)) on an input of shape (12,), too few dims",
            call((3, 4), "tuple", (12,)),
        ),
        (
            "MyLayerNorm(8, elementwise_affine=False) on an input of shape (4, 6)",
            call(8, "int", (4, 6), elementwise_affine=False),
        ),
        (
            "MyLayerNorm((3, 4)) on a valid input of shape (2, 2, 3, 4)",
            call((3, 4), "tuple", (2, 2, 3, 4)),
        ),
    ]


# ----- the reference ---------------------------------------------------------


def _constructor_arguments(case):
    dims = tuple(int(n) for n in case["normalized_shape"])
    shape = dims[0] if str(case["shape_kind"]) == "int" else dims
    flags = {}
    if "eps" in case:
        flags["eps"] = float(case["eps"])
    for flag in ("elementwise_affine", "bias"):
        if flag in case:
            flags[flag] = bool(case[flag])
    return shape, flags


def _reference_module(case):
    """normref's LayerNorm for the case, in float64, with the case's gamma/beta."""
    import torch

    from normref.torch_ref import LayerNorm

    shape, flags = _constructor_arguments(case)
    module = LayerNorm(shape, **flags).double()
    with torch.no_grad():
        if "set_weight" in case:
            module.weight.copy_(torch.from_numpy(np.asarray(case["set_weight"], np.float64)))
        if "set_bias" in case:
            module.bias.copy_(torch.from_numpy(np.asarray(case["set_bias"], np.float64)))
    return module


def _reference_output(case):
    import torch

    with torch.no_grad():
        x = torch.from_numpy(np.asarray(case["x"], np.float64))
        return _reference_module(case)(x).numpy()


def _expected_parameters(case):
    module = _reference_module(case)
    params = dict(module.named_parameters())
    return {
        "names": ",".join(params),
        "shapes": ";".join(f"{n}={list(p.shape)}" for n, p in params.items()),
    }


def _text(output, key):
    return str(output[key]) if key in output else ""


def _split(text, sep=","):
    return [item for item in text.split(sep) if item]


# ----- judging parameters ----------------------------------------------------


def _naming_problem(case, output):
    """None when the parameter names match nn.LayerNorm's, else why not."""
    want = _split(_expected_parameters(case)["names"])
    have = _split(_text(output, "names"))
    if sorted(have) == sorted(want):  # the order of creation is free
        return None
    state_keys = _split(_text(output, "state_keys"))
    if not want:
        return (
            f"with elementwise_affine=False nn.LayerNorm has no parameters, but your "
            f"module has {have}: create none (set self.weight = self.bias = None)"
        )
    if want == ["weight"] and "bias" in have:
        return (
            "with bias=False nn.LayerNorm has only a weight (gamma); your module also "
            "creates a bias. Leave it out (set self.bias = None, or "
            "self.register_parameter('bias', None))"
        )
    if not have and set(want) <= set(state_keys):
        return (
            "weight and bias are in your state_dict but are not parameters (buffers?): "
            "wrap them in nn.Parameter so that optimizers train them"
        )
    if not have:
        return (
            f"your module has no parameters; nn.LayerNorm has {want}. Wrap gamma "
            "and beta in nn.Parameter and assign them to self.weight and self.bias"
        )
    if len(have) == len(want):
        return (
            f"your parameters are named {have}; nn.LayerNorm names them {want}. "
            "The names are the state_dict keys, so they must match"
        )
    return f"your module's parameters are {have}; nn.LayerNorm's are {want}"


def _judge_parameters(case, output):
    problem = _naming_problem(case, output)
    if problem:
        return problem
    expected = _expected_parameters(case)
    if sorted(_split(_text(output, "shapes"), ";")) != sorted(
            _split(expected["shapes"], ";")):
        return (
            f"your parameter shapes are {_text(output, 'shapes')}; expected "
            f"{expected['shapes']}: gamma and beta have exactly the shape "
            "normalized_shape (an int d means (d,))"
        )
    names = _split(expected["names"])
    dtypes = _text(output, "dtypes")
    if sorted(_split(dtypes, ";")) != sorted(f"{n}=float32" for n in names):
        return (
            f"your parameters have dtypes {dtypes}; nn.LayerNorm's are float32, "
            "torch's default (torch.ones(shape) gives it)"
        )
    frozen = sorted(set(names) - set(_split(_text(output, "trainable"))))
    if frozen:
        return f"{frozen} do not require gradients: nn.Parameter(...) should leave requires_grad on"
    shape = tuple(int(n) for n in case["normalized_shape"])
    starts = {
        "weight": (np.ones(shape), "gamma starts at 1"),
        "bias": (np.zeros(shape), "beta starts at 0"),
    }
    for name in names:
        value, rule = starts[name]
        problem = mismatch(
            output.get(f"initial_{name}"), value, dtype="float32", what=f"the initial {name}"
        )
        if problem:
            return f"{problem}; {rule}, as in nn.LayerNorm"
    if sorted(_split(_text(output, "state_keys"))) != sorted(names):
        return (
            f"your state_dict holds {_split(_text(output, 'state_keys'))}; nn.LayerNorm's "
            f"holds {names}. Keep other values (eps, the shape) as plain attributes "
            "or non-persistent buffers"
        )
    return None


# ----- judging outputs -------------------------------------------------------


def _normalized(x, axes, eps, correction=0):
    n = int(np.prod([x.shape[a] for a in axes]))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).sum(axis=axes, keepdims=True) / max(n - correction, 1)
    return (x - mu) / np.sqrt(var + eps)


UNBIASED_VARIANCE_HINT = (
    "the variance divides by the number of elements n, not n - 1 "
    "(torch.var's default is unbiased: pass correction=0 or unbiased=False)"
)

EPS_OUTSIDE_HINT = "eps goes inside the square root: (x - mean) / sqrt(var + eps)"


def _likely_forward_mistake(case, y):
    """Name the slip whose output `y` reproduces, if any."""
    x = np.asarray(case["x"], np.float64)
    shape, flags = _constructor_arguments(case)
    eps = flags.get("eps", 1e-5)
    k = len(case["normalized_shape"])
    trailing = tuple(range(x.ndim - k, x.ndim))
    gamma = np.asarray(case.get("set_weight", 1.0), np.float64)
    beta = np.asarray(case.get("set_bias", 0.0), np.float64)
    if flags.get("elementwise_affine") is False:
        gamma, beta = 1.0, 0.0
    elif flags.get("bias") is False:
        beta = 0.0

    def affine(x_hat):
        return gamma * x_hat + beta

    dtype = _input_dtype(case)
    mu = x.mean(axis=trailing, keepdims=True)
    var = x.var(axis=trailing, keepdims=True)
    candidates = {
        UNBIASED_VARIANCE_HINT: affine(_normalized(x, trailing, eps, correction=1)),
        EPS_OUTSIDE_HINT: affine((x - mu) / (np.sqrt(var) + eps)),
        "eps is missing: add it to the variance before the square root": affine(
            (x - mu) / np.sqrt(var)
        ),
        "gamma scales and beta shifts: weight * x_hat + bias": beta * (x - mu) / np.sqrt(var + eps)
        + gamma,
        "gamma and beta are not applied: multiply by self.weight, then add self.bias": _normalized(
            x, trailing, eps
        ),
    }
    if "eps" in flags:
        candidates[f"use the eps you were given ({flags['eps']:g}), not a fixed 1e-5"] = affine(
            _normalized(x, trailing, 1e-5)
        )
    else:
        for wrong_default in (1e-6, 1e-8, 1e-12, 0.0, 1e-3):
            candidates[f"the default eps is 1e-5, not {wrong_default:g}"] = affine(
                _normalized(x, trailing, wrong_default)
            )
    if k > 1:
        candidates[
            "normalize over all the trailing dims in normalized_shape "
            f"(the last {k}), not only the last one"
        ] = affine(_normalized(x, (-1,), eps))
    if x.ndim > k:
        candidates[
            "take the statistics over the trailing normalized_shape dims only, never over the batch"
        ] = affine(_normalized(x, tuple(range(x.ndim)), eps))
    if x.ndim > k + 1:
        candidates[
            "take the statistics over the trailing normalized_shape dims only, "
            "not over everything but the first dim"
        ] = affine(_normalized(x, tuple(range(1, x.ndim)), eps))
    # At float32's tolerance several eps slips can match one output: name the
    # candidate the output is closest to (the first of equals, in the order above).
    closest, hint_found = np.inf, None
    with np.errstate(all="ignore"):
        for hint, wrong in candidates.items():
            if np.shape(y) == wrong.shape and matches(y, wrong, dtype=dtype):
                gap = np.abs(np.asarray(y, np.float64) - wrong)  # y's shape
                distance = float(np.max(gap[np.isfinite(gap)], initial=0.0))
                if distance < closest:
                    closest, hint_found = distance, hint
    return hint_found


FLOAT64_HINT = (
    "close, but not to float64's accuracy: a float64 input is normalized in float64. "
    "Widen only a narrower input (torch.promote_types(x.dtype, torch.float32)), "
    "never round float64 to float32"
)

_LOW_PRECISION_HINT = (
    "with a {dtype} input, take the mean and the variance in float32 "
    "(x.float()), as nn.LayerNorm does, and return the result in x's dtype: "
    "{dtype} keeps few significant bits, so for a token far from 0 (bfloat16's "
    "spacing is 2 around 300, float16's 0.5 around 1000) a mean rounded to "
    "{dtype}'s grid can be off by half a spacing, as much as the token's "
    "spread; x - mean is then exact, but every output is shifted by the same "
    "amount"
)


def _input_dtype(case):
    """The dtype the module sees: case["x_dtype"] for a half-precision input
    (its values held as float32), else the array's own."""
    if "x_dtype" in case:
        return str(case["x_dtype"])
    return np.dtype(np.asarray(case["x"]).dtype).name


def _output_problem(case, output):
    dtype = _input_dtype(case)
    expected = _reference_output(case)
    problem = mismatch(output["y"], expected, dtype=dtype, what="your output")
    if problem:
        # At a half-precision tolerance several slips look alike; the float32
        # cases name those, so a half-precision case names its own.
        hint = (_LOW_PRECISION_HINT.format(dtype=dtype) if "x_dtype" in case
                else _likely_forward_mistake(case, output["y"]))
        if hint is None and dtype == "float64" and matches(output["y"], expected,
                                                           dtype="float16"):
            hint = FLOAT64_HINT
        return problem + (f". Hint: {hint}" if hint else "")
    want = f"torch.{dtype}"
    if _text(output, "y_dtype") != want:
        return (
            f"your output's dtype is {_text(output, 'y_dtype')}; for a {want} input "
            f"nn.LayerNorm returns {want} (return a tensor of the input's dtype"
            + ("; normalize in float32, then y.to(x.dtype)" if "x_dtype" in case else "")
            + ")"
        )
    return None


ONE_PASS_VARIANCE_HINT = (
    "your variance looks like E[x^2] - E[x]^2, which cancels catastrophically in float32 "
    "when the mean is large (here E[x^2] is about 1e6, where float32's spacing is 0.06, "
    "while the variance is about 1); subtract the mean first, then average the squared "
    "deviations (unit 01's shortcut, two passes instead of one)"
)


def _one_pass_signature(case, y):
    """True when `y` is, token by token, gamma * (x - mean) * s + beta with a
    scale s a little off rstd = 1 / sqrt(var + eps): centred and shaped right,
    divided by a variance that cancellation made a few percent wrong (the one-pass
    variance, measured up to 11 % off on these cases), not by one a slip such as a
    fixed eps outside the square root changes by a third or more."""
    x = np.asarray(case["x"], np.float64)
    y = np.asarray(y, np.float64)
    if y.shape != x.shape or not np.all(np.isfinite(y)):
        return False
    _, flags = _constructor_arguments(case)
    trailing = tuple(range(x.ndim - len(case["normalized_shape"]), x.ndim))
    gamma = np.broadcast_to(np.asarray(case.get("set_weight", 1.0), np.float64), x.shape)
    beta = np.asarray(case.get("set_bias", 0.0), np.float64)
    usable = np.abs(gamma) > 0.1  # dividing by a gamma near 0 amplifies noise
    z = np.where(usable, (y - beta) / np.where(usable, gamma, 1.0), 0.0)  # x_hat
    centred = np.where(usable, x - x.mean(axis=trailing, keepdims=True), 0.0)
    scale = ((z * centred).sum(axis=trailing, keepdims=True)
             / (centred * centred).sum(axis=trailing, keepdims=True))  # per token
    rstd = 1 / np.sqrt(x.var(axis=trailing, keepdims=True) + flags.get("eps", 1e-5))
    off = np.abs(scale / rstd - 1).max()
    return bool(np.abs(z - scale * centred).max() < 1e-2
                and FAR_FROM_ZERO_TOLERANCE < off < 0.25)


def _far_from_zero_problem(case, output):
    """Tokens around 1000 in float32, judged to FAR_FROM_ZERO_TOLERANCE (float32
    holds them to about 6e-5, so the table's 1e-4 would fail a right forward)."""
    expected = _reference_output(case)
    y = np.asarray(output["y"], np.float64)
    if y.shape != expected.shape:
        return f"your output has shape {y.shape}; expected shape {expected.shape}"
    gap = np.abs(y - expected)
    if not np.allclose(y, expected, rtol=FAR_FROM_ZERO_TOLERANCE,
                       atol=FAR_FROM_ZERO_TOLERANCE):
        worst = float(np.nanmax(gap)) if np.any(np.isfinite(gap)) else float("nan")
        problem = (f"your output differs from the answer by up to {worst:.3g} "
                   f"(tolerance {FAR_FROM_ZERO_TOLERANCE:g})")
        if _one_pass_signature(case, y):
            return f"{problem}. Hint: {ONE_PASS_VARIANCE_HINT}"
        return (f"{problem}. Hint: on tokens far from 0, compute x - mean before "
                "squaring, in float32 or wider")
    if _text(output, "y_dtype") != "torch.float32":
        return (f"your output's dtype is {_text(output, 'y_dtype')}; for a torch.float32 "
                "input nn.LayerNorm returns torch.float32")
    return None


def _judge_forward(case, output):
    if "far_from_zero" in case:
        return _far_from_zero_problem(case, output)
    return _output_problem(case, output)


def _judge_float64(case, output):
    """A float64 input, judged like the forward; a slip the forward check names
    (the unbiased variance, eps outside the square root) is charged there only,
    so this check charges the precision alone."""
    problem = _output_problem(case, output)
    if problem is None or "Hint:" not in problem:
        return problem
    return None if _likely_forward_mistake(case, output["y"]) else problem


def _unbiased_output(case):
    """The case's layer norm with the unbiased variance (n - 1), float64."""
    x = np.asarray(case["x"], np.float64)
    shape, flags = _constructor_arguments(case)
    k = len(case["normalized_shape"])
    x_hat = _normalized(x, tuple(range(x.ndim - k, x.ndim)), flags.get("eps", 1e-5),
                        correction=1)
    gamma = np.asarray(case.get("set_weight", 1.0), np.float64)
    beta = np.asarray(case.get("set_bias", 0.0), np.float64)
    return gamma * x_hat + beta


AFFINE_ROUNDED_HINT = (
    "gamma and beta are applied in {dtype}: nn.LayerNorm forms weight * x_hat + bias "
    "in float32, from its float32 statistics, and rounds to {dtype} once, at the end. "
    "Rounding x_hat, or the product weight * x_hat, to {dtype} first (x_hat.to(x.dtype), "
    "or the parameters' {dtype} arithmetic) costs an error of up to about {dtype}'s "
    "spacing at the product's size, 0.5 near 100, which a beta that cancels the product "
    "leaves in full. Keep x_hat in float32 and multiply the parameters in float32 "
    "(weight.float()), then y.to(x.dtype)"
)


def _rounded_affine_outputs(case):
    """What a module outputs when it takes float32 statistics but rounds the
    affine step to the input's half dtype on the way: x_hat rounded, then the
    product, then the sum; x_hat rounded, the rest in float32; the product
    rounded; the sum alone in float32 after a rounded product."""
    import torch

    half = getattr(torch, _input_dtype(case))
    x_hat = torch.from_numpy(
        _normalized(np.asarray(case["x"], np.float64), (-1,), 1e-5).astype(np.float32))
    weight = torch.from_numpy(np.asarray(case["set_weight"], np.float32))
    bias = torch.from_numpy(np.asarray(case["set_bias"], np.float32))
    x_hat_half = x_hat.to(half)
    return [
        (x_hat_half * weight.to(half) + bias.to(half)).double().numpy(),
        (x_hat_half.float() * weight + bias).to(half).double().numpy(),
        ((x_hat * weight).to(half) + bias.to(half)).double().numpy(),
        ((x_hat_half * weight.to(half)).float() + bias).to(half).double().numpy(),
    ]


def _affine_rounded(case, y):
    """True when `y` is one of the rounded affine steps, to the half dtype's
    tolerance on at least 95 % of its numbers (the student's float32 x_hat may
    round the other way from this one on a few), and closer to it than to the
    reference."""
    y = np.asarray(y, np.float64)
    expected = _reference_output(case)
    if y.shape != expected.shape:
        return False
    rtol, atol = tolerance_for(_input_dtype(case))
    for rounded in _rounded_affine_outputs(case):
        close = np.abs(y - rounded) <= atol + rtol * np.abs(rounded)
        if close.mean() >= 0.95 and (np.abs(y - rounded).mean()
                                     < np.abs(y - expected).mean()):
            return True
    return False


def _judge_low_precision(case, output):
    """A half-precision input: judged like the forward, except that the unbiased
    variance, which the forward check charges and names, is not charged again;
    the float32-statistics hint is given only when the module is right on the
    same values widened to float32, so that the slip is the half precision's."""
    problem = _output_problem(case, output)
    if problem is None:
        return None
    dtype = _input_dtype(case)
    if np.shape(output["y"]) != np.shape(case["x"]) or matches(
            output["y"], _reference_output(case), dtype=dtype):
        return problem  # the values are right: the dtype is what is off
    if matches(output["y"], _unbiased_output(case), dtype=dtype):
        return None
    if "affine_cancels" in case and _affine_rounded(case, output["y"]):
        return (problem.split(". Hint:")[0]
                + ". Hint: " + AFFINE_ROUNDED_HINT.format(dtype=dtype))
    widened = output.get("y_from_float32")
    if widened is None or "Hint:" not in problem:
        return problem
    if not mismatch(widened, _reference_output(case), dtype="float32"):
        return problem
    if _one_pass_signature(case, widened):
        return None  # the one-pass variance: mln_forward charges it, once
    cause = _likely_forward_mistake(case, widened)
    return problem.split(". Hint:")[0] + (
        ". Your module is off on the same values given as float32 too, so the slip is "
        "in the forward pass itself, which mln_forward grades"
        + (f" (it looks like: {cause})" if cause else ""))


def _judge_flags(case, output):
    # the number of parameters is this check's business; their names are
    # the parameters check's, so a misnamed gamma costs its points only
    wanted = _split(_expected_parameters(case)["names"])
    if len(_split(_text(output, "names"))) != len(wanted):
        return _naming_problem(case, output)
    problem = _output_problem(case, output)
    # flags handled right around an unbiased variance or eps outside the square
    # root: the forward check charges and names those slips, once
    if problem and _likely_forward_mistake(case, output["y"]) in (
            UNBIASED_VARIANCE_HINT, EPS_OUTSIDE_HINT):
        return None
    return problem


# ----- judging state_dict and gradients ----------------------------------------


def _judge_state_dict(case, output):
    expected_keys = _split(_expected_parameters(case)["names"])
    keys = _split(_text(output, "state_keys"))
    for direction, key in (
        ("nn.LayerNorm's state_dict into your module", "into_mine_error"),
        ("your state_dict into nn.LayerNorm", "into_torch_error"),
    ):
        if key in output:
            return (
                f"loading {direction} failed: {_text(output, key).rstrip(' .')}. "
                f"Your state_dict "
                f"holds {keys}; nn.LayerNorm's holds {expected_keys} with the shape "
                "normalized_shape"
            )
    for name in ("weight", "bias"):
        loaded = mismatch(
            output.get(f"mine_{name}"),
            case[f"torch_{name}"],
            dtype="float32",
            what=f"your {name} after loading nn.LayerNorm's state_dict",
        )
        saved = mismatch(
            output.get(f"torch_{name}"),
            case[f"my_{name}"],
            dtype="float32",
            what=f"nn.LayerNorm's {name} after loading your state_dict",
        )
        if loaded or saved:
            return loaded or saved
    return None


def _reference_gradients(case):
    import torch

    module = _reference_module(case)
    x = torch.from_numpy(np.asarray(case["x"], np.float64)).requires_grad_(True)
    upstream = torch.from_numpy(np.asarray(case["upstream"], np.float64))
    (module(x) * upstream).sum().backward()
    return {
        "x_grad": x.grad.numpy(),
        "weight_grad": module.weight.grad.numpy(),
        "bias_grad": module.bias.grad.numpy(),
    }


def _variant_gradients(x, gamma, beta, upstream, dims, eps, correction=0,
                       eps_outside=False, affine_shape=None):
    """The output and the gradients of sum(upstream * y) for a layer norm over
    `dims` that may carry a forward slip (the variance's correction, eps outside
    the square root), by torch's autograd in float64. gamma and beta are
    reshaped to `affine_shape` (when given) to broadcast against x."""
    import torch

    def leaf(values):
        return torch.from_numpy(np.asarray(values, np.float64)).requires_grad_(True)

    x, gamma, beta = leaf(x), leaf(gamma), leaf(beta)
    centred = x - x.mean(dims, keepdim=True)
    var = x.var(dims, keepdim=True, correction=correction)
    x_hat = (centred / (torch.sqrt(var) + eps) if eps_outside
             else centred / torch.sqrt(var + eps))
    g = gamma if affine_shape is None else gamma.reshape(affine_shape)
    b = beta if affine_shape is None else beta.reshape(affine_shape)
    y = g * x_hat + b
    (y * torch.from_numpy(np.asarray(upstream, np.float64))).sum().backward()
    return {"x_grad": x.grad.numpy(), "weight_grad": gamma.grad.numpy(),
            "bias_grad": beta.grad.numpy()}


def _matches_all(output, expected, dtype):
    return all(not mismatch(output[key], expected[key], dtype=dtype) for key in expected)


def _forward_slip_gradients(case):
    """The gradients of each forward slip that mln_forward or mln_flags charges
    and names (the unbiased variance, eps outside the square root, a default eps
    other than 1e-5): right gradients of such a forward are not charged again."""
    _, flags = _constructor_arguments(case)
    eps = flags.get("eps", 1e-5)
    dims = tuple(range(-len(case["normalized_shape"]), 0))
    data = (case["x"], case["set_weight"], case["set_bias"], case["upstream"], dims)
    variants = [dict(eps=eps, correction=1), dict(eps=eps, eps_outside=True),
                dict(eps=eps, correction=1, eps_outside=True)]
    if "eps" not in flags:
        variants += [dict(eps=wrong) for wrong in (0.0, 1e-6, 1e-8, 1e-12, 1e-3)]
    return [_variant_gradients(*data, **variant) for variant in variants]


_NO_GRADIENT = {
    "x_grad": "no gradient reached the input x: keep the forward pass in torch "
    "(no .numpy(), .item(), .detach() or torch.no_grad())",
    "weight_grad": "weight (gamma) got no gradient: make it an nn.Parameter and use it in forward",
    "bias_grad": "bias (beta) got no gradient: make it an nn.Parameter and use it in forward",
}


def _judge_autograd(case, output):
    missing = _text(output, "missing")
    if missing.startswith("all"):
        return (
            missing.split(": ", 1)[1] + ": compute the output with torch operations on "
            "the input and the parameters, without detaching"
        )
    if missing:
        return _NO_GRADIENT[_split(missing)[0]]
    expected = _reference_gradients(case)
    dtype = np.asarray(case["x"]).dtype
    if _matches_all(output, expected, dtype):
        return None
    if any(_matches_all(output, slipped, dtype) for slipped in _forward_slip_gradients(case)):
        # right gradients of a forward that carries a slip the forward checks
        # charge and name: charged once, there
        return None
    forward_off = _forward_off(case, output)
    if (forward_off == "narrowed" and _matches_all(output, expected, np.float32)):
        # a float64 input computed in float32 (x.float() and back): the forward and
        # these gradients are right to float32's accuracy; mln_float64 charges it
        return None
    for key, what in (
        ("x_grad", "the gradient with respect to x"),
        ("weight_grad", "the gradient with respect to weight"),
        ("bias_grad", "the gradient with respect to bias"),
    ):
        problem = mismatch(output[key], expected[key], dtype=dtype, what=what)
        if problem:
            if key == "bias_grad":
                return problem
            return problem + (_FORWARD_RIGHT if forward_off is None else
                              ". The forward pass itself may be off: run the forward check")
    return None


_FORWARD_RIGHT = (". Your forward output is right on this case, so the gradient is lost "
                  "between the output and the input: look for a mean or variance taken out "
                  "of the graph (.detach(), .item(), numpy) or a backward of your own")


def _forward_off(case, output):
    """How the probe's forward output on an autograd case misses the reference:
    None (right), "narrowed" (a float64 input answered at float32's accuracy
    only), "off", or "unknown" when the probe sent no output."""
    if "y" not in output:
        return "unknown"
    expected = _reference_output(case)
    dtype = np.asarray(case["x"]).dtype
    if not mismatch(output["y"], expected, dtype=dtype):
        return None
    if dtype == np.float64 and matches(output["y"], expected, dtype="float32"):
        return "narrowed"
    return "off"


# ----- judging the error on a mismatched input ----------------------------------


def _mentions(message, dims):
    """Does the message's list of integers hold `dims` as a contiguous run?"""
    numbers = [int(n) for n in re.findall(r"\d+", message)]
    dims = list(dims)
    return any(numbers[i : i + len(dims)] == dims for i in range(len(numbers) - len(dims) + 1))


def _judge_shape_error(case, output):
    normalized = [int(n) for n in case["normalized_shape"]]
    x_shape = [int(n) for n in case["x_shape"]]
    k = len(normalized)
    valid = len(x_shape) >= k and x_shape[len(x_shape) - k :] == normalized
    raised = bool(output["raised"])
    error = f"{_text(output, 'error_type')}: {_text(output, 'message')}"
    if valid:
        if raised:
            return (
                f"your module raised {error} on an input of shape {x_shape}, whose "
                f"trailing dims are {normalized}: any number of leading dims is fine"
            )
        return None
    if not raised:
        hint = ""
        if int(np.prod(x_shape[-k:])) == int(np.prod(normalized)) and len(x_shape) >= k:
            hint = " (its trailing dims hold the same number of elements, but not the same shape)"
        return (
            f"your module returned an output for an input of shape {x_shape}{hint} "
            f"although normalized_shape is {normalized}: raise an error when the last "
            f"{k} dims of the input are not exactly normalized_shape"
        )
    classes = {str(c) for c in np.atleast_1d(output.get("error_classes", np.array([])))}
    if "builtins.NotImplementedError" in classes or _text(output, "error_type") == (
            "NotImplementedError"):
        return f"your module raised {error}: the forward pass is not written yet"
    if "must match the size of tensor" in _text(output, "message"):
        return (
            f"your module raised {error}. That error comes from inside the "
            "computation (gamma does not broadcast); check the input's shape first "
            "and raise an error that names both shapes"
        )
    if not (
        _mentions(_text(output, "message"), normalized)
        and _mentions(_text(output, "message"), x_shape)
    ):
        return (
            f"your module raised {error}; a clear message names both the expected "
            f"trailing shape {normalized} and the input's shape {x_shape}, as torch's "
            'does ("Given normalized_shape=[...], expected input with shape [*, ...], '
            'but got input of size[...]")'
        )
    return None


# ----- the fused residual add + layer norm ----------------------------------------


def _add_cases(rng):
    def pair(shape, dtype=np.float32, offset=0.0):
        return {
            "x": rng.normal(offset, 2.0, size=shape).astype(dtype),
            "residual": rng.normal(size=shape).astype(dtype),
        }

    gradients = pair((4, 2, 3), np.float64)
    gradients["upstream_sum"] = rng.normal(size=(4, 2, 3))
    gradients["upstream_normed"] = rng.normal(size=(4, 2, 3))
    return [
        (
            "AddLayerNorm(8) on x and residual of shape (4, 8), random gamma, beta",
            _case(8, "int", **pair((4, 8)), **_random_affine(rng, 8)),
        ),
        (
            "AddLayerNorm((3, 4)) on (2, 5, 3, 4) in float64, random gamma, beta",
            _case((3, 4), "tuple", **pair((2, 5, 3, 4), np.float64, 3.0),
                  **_random_affine(rng, (3, 4), np.float64)),
        ),
        (
            "AddLayerNorm(6) called as module(x), residual=None (the first block)",
            _case(6, "int", x=rng.normal(1.0, 3.0, size=(3, 6)).astype(np.float32),
                  **_random_affine(rng, 6)),
        ),
        (
            "AddLayerNorm(8, bias=False) with random gamma",
            _case(8, "int", bias=False, **pair((2, 3, 8)),
                  set_weight=rng.normal(1.0, 0.5, size=8).astype(np.float32)),
        ),
        (
            "AddLayerNorm((2, 4), eps=0.01, elementwise_affine=False)",
            _case((2, 4), "tuple", eps=0.01, elementwise_affine=False,
                  **pair((3, 2, 4), offset=-2.0)),
        ),
        (
            "AddLayerNorm(16) after loading nn.LayerNorm(16)'s state_dict",
            _case(16, "int", **pair((5, 16)),
                  torch_weight=rng.normal(size=16).astype(np.float32),
                  torch_bias=rng.normal(size=16).astype(np.float32)),
        ),
        (
            "AddLayerNorm((2, 3)) in float64: gradients of both outputs reach x, "
            "residual, weight and bias",
            _case((2, 3), "tuple", **gradients, **_random_affine(rng, (2, 3), np.float64)),
        ),
    ]


def _reference_add(case):
    """(residual_sum, normed, gradients or None) from normref's AddLayerNorm, float64
    (the module itself returns them as (normed, residual_sum))."""
    import torch

    from normref.torch_ref import AddLayerNorm

    shape, flags = _constructor_arguments(case)
    module = AddLayerNorm(shape, **flags).double()
    with torch.no_grad():
        for name, key in (("weight", "set_weight"), ("bias", "set_bias"),
                          ("weight", "torch_weight"), ("bias", "torch_bias")):
            if key in case:
                getattr(module, name).copy_(torch.from_numpy(np.asarray(case[key], np.float64)))
    graded = "upstream_sum" in case
    x = torch.from_numpy(np.asarray(case["x"], np.float64)).requires_grad_(graded)
    residual = None
    if "residual" in case:
        residual = torch.from_numpy(np.asarray(case["residual"], np.float64))
        residual.requires_grad_(graded)
    normed, residual_sum = module(x, residual)
    gradients = None
    if graded:
        upstream_sum = torch.from_numpy(np.asarray(case["upstream_sum"], np.float64))
        upstream_normed = torch.from_numpy(np.asarray(case["upstream_normed"], np.float64))
        ((residual_sum * upstream_sum).sum() + (normed * upstream_normed).sum()).backward()
        gradients = {"x_grad": x.grad.numpy(), "residual_grad": residual.grad.numpy(),
                     "weight_grad": module.weight.grad.numpy(),
                     "bias_grad": module.bias.grad.numpy()}
    return residual_sum.detach().numpy(), normed.detach().numpy(), gradients


def _likely_add_mistake(case, residual_sum, normed, output):
    """Name the slip the student's two outputs reproduce, if any."""
    dtype = np.asarray(case["x"]).dtype
    x = np.asarray(case["x"], np.float64)
    y = output.get("y")
    if y is not None and matches(output.get("sum"), normed, dtype=dtype) and matches(
            y, residual_sum, dtype=dtype):
        return ("return (normed, residual_sum) in that order, as flash-attn's "
                "layer_norm_fn(..., prenorm=True) does")
    if "residual" in case and matches(output.get("sum"), residual_sum, dtype=dtype):
        ln_of_x = _reference_output({**case, "x": x})
        if y is not None and np.shape(y) == ln_of_x.shape and matches(y, ln_of_x, dtype=dtype):
            return "normalize the sum x + residual, not x alone"
    if "residual" in case and matches(output.get("sum"), x, dtype=dtype):
        return "the first output is the sum x + residual, which the next block adds to"
    if dtype == np.float64 and "residual" in case and _narrowed_sum(case, output.get("sum")):
        return NARROWED_SUM_HINT
    return None


NARROWED_SUM_HINT = (
    "your residual_sum is x + residual added in float32: x.float() + residual.float() "
    "rounds a float64 input, and the norm reads that rounded sum. Add in the widest "
    "dtype of the two (torch.promote_types(x.dtype, residual.dtype), float32 at least)"
)


def _narrowed_sum(case, residual_sum):
    """True when `residual_sum` is the float64 inputs' sum formed in float32
    (each input rounded to float32, then added there), not their exact sum."""
    x = np.asarray(case["x"], np.float64)
    residual = np.asarray(case["residual"], np.float64)
    narrowed = (x.astype(np.float32) + residual.astype(np.float32)).astype(np.float64)
    if np.shape(residual_sum) != narrowed.shape:
        return False
    residual_sum = np.asarray(residual_sum, np.float64)
    return bool(np.allclose(residual_sum, narrowed, rtol=1e-12, atol=0)
                and not np.allclose(residual_sum, x + residual, rtol=1e-12, atol=0))


def _inherited_slip(output, normed, dtype):
    """True when the normed output is off only because the MyLayerNorm it
    inherits is: it equals that norm of the sum, and that norm is not the
    reference's. Exercise 1's checks charge the slip and name it."""
    if "inherited_y" not in output or "y" not in output:
        return False
    inherited = output["inherited_y"]
    return (np.shape(inherited) == np.shape(normed)
            and not matches(inherited, normed, dtype=dtype)
            and matches(output["y"], inherited, dtype=dtype))


def _judge_add_layer_norm(case, output):
    if "load_error" in output:
        return (
            f"loading nn.LayerNorm's state_dict failed: {_text(output, 'load_error').rstrip(' .')}."
            " Name the parameters weight and bias, of shape normalized_shape, directly on the"
            " module (not inside a submodule)"
        )
    if "returned" in output:
        return (
            f"your module returned {_text(output, 'returned')}; it returns a pair "
            "(normed, residual_sum)"
        )
    wanted = _split(_expected_parameters(case)["names"])
    if sorted(_split(_text(output, "names"))) != sorted(wanted):
        return (
            f"your module's parameters are {_split(_text(output, 'names'))}; with these "
            f"arguments nn.LayerNorm's are {wanted}, and yours must be the same, by name"
        )
    residual_sum, normed, gradients = _reference_add(case)
    dtype = np.asarray(case["x"]).dtype
    inherited = _inherited_slip(output, normed, dtype)
    for key, expected, what in (("sum", residual_sum, "your residual_sum"),
                                ("y", normed, "your normed output")):
        problem = mismatch(output.get(key), expected, dtype=dtype, what=what)
        if problem and not (key == "y" and inherited):
            hint = _likely_add_mistake(case, residual_sum, normed, output)
            return problem + (f". Hint: {hint}" if hint else "")
    if gradients is None:
        return None
    missing = _split(_text(output, "missing"))
    if missing:
        return (
            f"no gradient reached {missing[0].removesuffix('_grad')}: both outputs must stay "
            "in the autograd graph (torch operations only, nothing detached), and the "
            "gradient of residual_sum flows to x and residual"
        )
    if inherited:  # gradients through a norm Exercise 1 already marks wrong
        return None
    for key, what in (("x_grad", "the gradient with respect to x"),
                      ("residual_grad", "the gradient with respect to residual"),
                      ("weight_grad", "the gradient with respect to weight"),
                      ("bias_grad", "the gradient with respect to bias")):
        problem = mismatch(output[key], gradients[key], dtype=dtype, what=what)
        if problem and "inherited_y" in output and matches(
                output[key], gradients[key], dtype="float32"):
            # float32 accuracy on a float64 input, from the MyLayerNorm it
            # inherits: Exercise 1's float64 case charges that, once
            continue
        if problem:
            return problem + (
                ". The loss uses both outputs: the gradient of x gets residual_sum's "
                "upstream as well as the part through the norm"
            )
    return None


# ----- the fused add with a float32 residual stream (flash-attn's residual_in_fp32) ------


def _fp32_residual_cases(rng):
    def bfloat16(values):
        return _bfloat16_values(np.asarray(values, np.float32))

    def case(shape, x, flag=None, residual=None, residual_dtype="float32"):
        entries = {"x": bfloat16(x), "x_dtype": "bfloat16", **_random_affine(rng, shape)}
        if flag is not None:
            entries["residual_in_fp32"] = flag
        if residual is not None:
            entries["residual"] = np.asarray(residual, np.float32)
            entries["residual_dtype"] = residual_dtype
        kind = "int" if isinstance(shape, int) else "tuple"
        return _case(shape, kind, **entries)

    return [
        (
            "AddLayerNorm(64, residual_in_fp32=True): x bfloat16 (4, 64), residual "
            "float32 of spread 8",
            case(64, rng.normal(size=(4, 64)), True, 8 * rng.normal(size=(4, 64))),
        ),
        (
            "AddLayerNorm(64, residual_in_fp32=True): x bfloat16, a float32 stream "
            "around 300, where bfloat16's spacing is 2",
            case(64, rng.normal(size=(3, 64)), True, rng.normal(300.0, 1.0, size=(3, 64))),
        ),
        (
            "AddLayerNorm(32, residual_in_fp32=True) called as module(x) on bfloat16 x "
            "(the first block)",
            case(32, rng.normal(1.0, 2.0, size=(2, 5, 32)), True),
        ),
        (
            "AddLayerNorm(32) called as module(x) on bfloat16 x, residual_in_fp32 left "
            "False",
            case(32, rng.normal(1.0, 2.0, size=(2, 5, 32))),
        ),
        (
            "AddLayerNorm(16): x float32 of spread 1e-3, a float64 stream around 1000 "
            "with a spread of 1e-3, which float32 (spacing 6e-5 there) cannot hold",
            _case(16, "int", x=(1e-3 * rng.normal(size=(3, 16))).astype(np.float32),
                  x_dtype="float32", residual=rng.normal(1000.0, 1e-3, size=(3, 16)),
                  residual_dtype="float64", **_random_affine(rng, 16)),
        ),
        (
            "AddLayerNorm(16): x float64 around 1000 with a spread of 1e-3, a float32 "
            "residual of spread 1e-3",
            _case(16, "int", x=rng.normal(1000.0, 1e-3, size=(3, 16)), x_dtype="float64",
                  residual=(1e-3 * rng.normal(size=(3, 16))).astype(np.float32),
                  residual_dtype="float32", **_random_affine(rng, 16, np.float64)),
        ),
        (
            "AddLayerNorm((2, 16)) on bfloat16 x and a bfloat16 residual",
            case((2, 16), rng.normal(size=(3, 2, 16)), False,
                 bfloat16(rng.normal(size=(3, 2, 16))), "bfloat16"),
        ),
        (
            "AddLayerNorm(64) on bfloat16 x and a bfloat16 stream around 300 of spread "
            "2, where the sum rounded to bfloat16 (spacing 2) loses what the norm reads",
            case(64, rng.normal(size=(3, 64)), False,
                 bfloat16(rng.normal(300.0, 2.0, size=(3, 64))), "bfloat16"),
        ),
    ]


def _fp32_residual_expected(case):
    """(residual_sum, its dtype, normed, its dtype, the exact sum), from float64."""
    x = np.asarray(case["x"], np.float64)
    exact = x + np.asarray(case["residual"], np.float64) if "residual" in case else x
    if "residual" in case:
        sum_dtype = str(case["residual_dtype"])
    else:
        sum_dtype = "float32" if bool(case.get("residual_in_fp32", False)) else str(
            case["x_dtype"])
    stored = _bfloat16_values(exact) if sum_dtype == "bfloat16" else exact
    normed = _reference_output({**case, "x": exact})
    return stored, sum_dtype, normed, str(case["x_dtype"]), exact


def _sum_dtype_reason(case, sum_dtype):
    if "residual" in case:
        return (f"with a residual given, residual_sum keeps the residual's dtype "
                f"({sum_dtype}): add in the wider of the two dtypes (float32 at least) "
                "and store the sum as the residual was")
    if sum_dtype == "float32":
        return ("with residual_in_fp32=True and no residual, the first block starts "
                "the float32 stream: residual_sum is x in float32")
    return ("with no residual and residual_in_fp32=False, residual_sum is x, in x's "
            f"dtype ({sum_dtype})")


def _in_swapped_order(output, exact_sum, normed):
    """True when the module returned (residual_sum, normed) instead of
    (normed, residual_sum): each output holds the other's values, at
    bfloat16's tolerance so that a dtype slip besides does not hide it."""
    if np.shape(output.get("y")) != np.shape(exact_sum) or np.shape(
            output.get("sum")) != np.shape(normed):
        return False
    return (matches(output["y"], exact_sum, dtype="bfloat16")
            and matches(output["sum"], normed, dtype="bfloat16")
            and not matches(output["sum"], exact_sum, dtype="bfloat16"))


def _judge_add_fp32_residual(case, output):
    if "returned" in output:
        return (f"your module returned {_text(output, 'returned')}; it returns a pair "
                "(normed, residual_sum)")
    stored, sum_dtype, normed, normed_dtype, exact = _fp32_residual_expected(case)
    if _in_swapped_order(output, exact, normed):
        # add_layer_norm_module charges and names the order; this check judges
        # the dtypes and values of each output wherever it was returned
        output = {**output, "sum": output["y"], "y": output["sum"],
                  "sum_dtype": output["y_dtype"], "y_dtype": output["sum_dtype"]}
    if _text(output, "sum_dtype") != sum_dtype:
        return (f"your residual_sum is {_text(output, 'sum_dtype')}; "
                + _sum_dtype_reason(case, sum_dtype))
    problem = mismatch(output["sum"], stored, dtype=sum_dtype, what="your residual_sum")
    if problem:
        if (sum_dtype == "float32" and "residual" in case
                and matches(output["sum"], exact, dtype="bfloat16")):
            return problem + (
                ". Hint: that is the sum of x and the residual rounded to bfloat16 "
                "first (or added in bfloat16): the float32 stream loses its low bits at "
                "every block. Widen x instead: x.float() + residual")
        return problem
    if _text(output, "y_dtype") != normed_dtype:
        return (f"your normed output is {_text(output, 'y_dtype')}; it comes back in x's "
                f"dtype ({normed_dtype}), as flash-attn's out does: the next sublayer "
                "reads it in that dtype")
    problem = mismatch(output["y"], normed, dtype=normed_dtype, what="your normed output")
    if problem and _inherited_slip(output, normed, normed_dtype):
        return None
    if problem and ("residual" in case or sum_dtype == "float32"):
        narrowed = _reference_output({**case, "x": _bfloat16_values(exact)})
        if matches(output["y"], narrowed, dtype=normed_dtype):
            return problem + (
                ". Hint: that is the layer norm of the sum rounded to bfloat16: add "
                "in float32 and normalize that float32 sum, then cast the result to "
                "x's dtype (residual_sum alone is stored in the residual's dtype)")
    return problem


# ----- a true drop-in: factory arguments, reset_parameters, extra_repr, AdamW ------


def _factory_cases(rng):
    return [
        ("MyLayerNorm(8, dtype=torch.bfloat16)",
         {**_case(8, "int"), "dtype": np.array("bfloat16")}),
        ("MyLayerNorm((3, 4), bias=False, dtype=torch.float64, device='cpu')",
         {**_case((3, 4), bias=False), "dtype": np.array("float64"),
          "device": np.array("cpu")}),
        ("MyLayerNorm(16, device='meta') (parameters with a shape and no storage, as "
         "large models are first built)", {**_case(16, "int"), "device": np.array("meta")}),
        ("MyLayerNorm(8) with neither argument", _case(8, "int")),
    ]


def _judge_factory_kwargs(case, output):
    want_dtype = str(case.get("dtype", "float32"))
    want_device = str(case.get("device", "cpu"))
    names = _split(_text(output, "names"))
    want_names = ["weight"] + (["bias"] if bool(case.get("bias", True)) else [])
    if sorted(names) != sorted(want_names):
        return (f"your module's parameters are {names}; with these arguments "
                f"nn.LayerNorm has {want_names}")
    dtypes = dict(item.split("=") for item in _text(output, "dtypes").split(";"))
    devices = dict(item.split("=") for item in _text(output, "devices").split(";"))
    for name in want_names:
        if dtypes[name] != want_dtype:
            return (f"your {name} is {dtypes[name]}; create it with dtype={want_dtype}, "
                    "the dtype the constructor was given (torch.ones(shape, device=device, "
                    "dtype=dtype)), float32 when it is None")
        if devices[name] != want_device:
            return (f"your {name} lives on '{devices[name]}'; create it on the device the "
                    f"constructor was given, '{want_device}' (pass device= to torch.ones "
                    "and torch.zeros), not moved there afterwards")
    for name, start in (("weight", 1.0), ("bias", 0.0)):
        key = f"initial_{name}"
        if key in output and not np.allclose(np.asarray(output[key], np.float64), start):
            return f"{name} starts at {start:g}, whatever dtype it is created in"
    return None


def _reset_repr_cases(rng):
    return [
        ("MyLayerNorm((3, 4), eps=0.001): scrambled, then reset_parameters()",
         _case((3, 4), eps=1e-3)),
        ("MyLayerNorm(6, bias=False): scrambled, then reset_parameters()",
         _case(6, "int", bias=False)),
        ("MyLayerNorm(5, elementwise_affine=False): reset_parameters() has nothing to reset",
         _case(5, "int", elementwise_affine=False)),
    ]


def _judge_reset_repr(case, output):
    if "reset_error" in output:
        return (f"reset_parameters() raised {_text(output, 'reset_error')}: it sets weight "
                "to 1 and bias to 0 where they exist, and does nothing where they do not")
    if not bool(output["same_objects"]):
        return ("reset_parameters() made new parameters: fill the ones the module has, in "
                "place (nn.init.ones_, nn.init.zeros_), so that an optimizer that already "
                "holds them sees the reset")
    for name, start in (("weight", 1.0), ("bias", 0.0)):
        key = f"reset_{name}"
        if key in output and not np.allclose(np.asarray(output[key], np.float64), start):
            return f"after reset_parameters(), {name} is not all {start:g}"
    text = _text(output, "extra_repr")
    shape = [int(n) for n in case["normalized_shape"]]
    _, flags = _constructor_arguments(case)
    eps = flags.get("eps", 1e-5)
    affine = flags.get("elementwise_affine", True)
    bias = flags.get("bias", True)
    said = [float(n) for n in re.findall(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?", text)]
    if not any(said[i:i + len(shape)] == shape for i in range(len(said))):
        return (f"extra_repr() returns {text!r}: name normalized_shape {tuple(shape)}, as "
                f"nn.LayerNorm's does ({nn_layer_norm_repr(shape, eps, affine, bias)!r})")
    if not any(np.isclose(n, eps, rtol=1e-6, atol=0) for n in said):
        return (f"extra_repr() returns {text!r}: give eps={eps:g} too, as nn.LayerNorm's "
                f"does ({nn_layer_norm_repr(shape, eps, affine, bias)!r})")
    if f"elementwise_affine={affine}" not in text.replace(" ", ""):
        return (f"extra_repr() returns {text!r}: give elementwise_affine={affine} too, as "
                f"nn.LayerNorm's does ({nn_layer_norm_repr(shape, eps, affine, bias)!r})")
    # bias= is optional (the text says so); shown, it must say whether there is a beta
    has_bias = affine and bias
    shown = re.findall(r"(?<![A-Za-z_])bias=(\w+)", text.replace(" ", ""))
    if shown and shown != [str(has_bias)]:
        return (f"extra_repr() returns {text!r}: bias= says whether the module has a beta "
                f"(self.bias is not None), here {has_bias}, as nn.LayerNorm's does "
                f"({nn_layer_norm_repr(shape, eps, affine, bias)!r})")
    return None


def nn_layer_norm_repr(shape, eps, affine, bias=True):
    """What nn.LayerNorm's extra_repr() returns for these arguments (torch 2.13):
    bias= is True exactly when the module has a beta."""
    return (f"{tuple(shape)}, eps={eps}, elementwise_affine={affine}, "
            f"bias={affine and bias}")


PARAM_GROUP_DECAY = 0.05
# model -> the names of its parameters that decay: the weights of nn.Linear and of
# the convolutions, and nothing else (biases, every norm's gamma and beta, embeddings;
# a weight tied to an embedding counts as the embedding's)
PARAM_GROUP_MODELS = {
    "mlp": ("nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), "
            "nn.Linear(32, 16, bias=False), MyLayerNorm(16))", {"0.weight", "3.weight"}),
    "multi_axis": ("nn.Sequential(nn.Linear(12, 12), nn.Unflatten(-1, (3, 4)), "
                   "MyLayerNorm((3, 4)), nn.Flatten(), nn.Linear(12, 2))",
                   {"0.weight", "4.weight"}),
    "conv": ("nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), "
             "nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8))", {"0.weight", "2.weight"}),
    "embedding": ("nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 16), MyLayerNorm(16), "
                  "nn.Linear(16, 50))", {"1.weight", "3.weight"}),
    # the output Linear's weight is the embedding's Parameter (tied): model's
    # named_parameters() names it once, 0.weight, and it does not decay
    "tied": ("nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 16), MyLayerNorm(16), "
             "nn.Linear(16, 50, bias=False)), the last Linear's weight set to the "
             "Embedding's (tied)", {"1.weight"}),
    # the tied head comes first, so named_parameters() names the shared Parameter
    # head.weight, and a walk over model.modules() meets it as an nn.Linear's first
    "tied_head_first": ("a module that registers head = nn.Linear(16, 50, bias=False), "
                        "then emb = nn.Embedding(50, 16), mix = nn.Linear(16, 16) and "
                        "norm = MyLayerNorm(16), with head.weight = emb.weight (tied, "
                        "the head registered before the embedding)", {"mix.weight"}),
}
# model -> the name named_parameters() gives its embedding's weight
EMBEDDING_WEIGHTS = {"embedding": "0.weight", "tied": "0.weight",
                     "tied_head_first": "head.weight"}
TIED_MODELS = {"tied", "tied_head_first"}


def _param_group_cases(rng):
    return [(f"adamw_param_groups({built}, weight_decay={PARAM_GROUP_DECAY})",
             {"model": np.array(model), "weight_decay": np.array(PARAM_GROUP_DECAY)})
            for model, (built, _) in PARAM_GROUP_MODELS.items()]


def _judge_param_groups(case, output):
    _, decaying = PARAM_GROUP_MODELS[str(case["model"])]
    if int(output["strangers"]):
        return "your groups hold tensors that are not the model's parameters"
    for key in sorted(k for k in output if k.startswith("decay:")):
        name = key.split(":", 1)[1]
        decays = [float(d) for d in np.atleast_1d(output[key])]
        model = str(case["model"])
        embedding_weight = name == EMBEDDING_WEIGHTS.get(model)
        tied = embedding_weight and model in TIED_MODELS
        if not decays:
            return (f"{name} is in no group: every parameter goes into exactly one group, "
                    "or AdamW never updates it")
        if len(decays) > 1:
            if tied:
                return (f"{name}, the embedding's weight, is in {len(decays)} groups: the "
                        "output nn.Linear holds the same Parameter (tied weights), so a "
                        "walk over the modules meets it twice. Put it once, in the "
                        "no-decay group: a weight tied to an embedding counts as the "
                        "embedding's")
            return f"{name} is in {len(decays)} groups: put every parameter in exactly one"
        want = PARAM_GROUP_DECAY if name in decaying else 0.0
        if np.isclose(decays[0], want):
            continue
        if name in decaying:
            return (f"{name}, a weight of a linear map or a convolution, gets weight_decay "
                    f"{decays[0]:g}; it decays, with the weight_decay given "
                    f"({PARAM_GROUP_DECAY:g})")
        if tied and model == "tied_head_first":
            return (f"{name}, the nn.Embedding's weight that the output nn.Linear head "
                    f"shares (tied), gets weight_decay {decays[0]:g}. This model "
                    "registers the head before the embedding, so a walk over its "
                    "modules meets the shared Parameter first as an nn.Linear's weight: "
                    "a rule that places each parameter by the first module holding it "
                    "decays it. A weight tied to an embedding counts as the "
                    "embedding's whichever module comes first; give it "
                    "weight_decay=0.0, once")
        if tied:
            return (f"{name}, an nn.Embedding's weight that the output nn.Linear shares "
                    f"(tied), gets weight_decay {decays[0]:g}: a weight tied to an "
                    "embedding counts as the embedding's, and embeddings do not decay; "
                    "give it weight_decay=0.0, once")
        if embedding_weight:
            return (f"{name}, an nn.Embedding's weight, gets weight_decay {decays[0]:g}: "
                    "embeddings do not decay (a row is a token's learned vector, trained "
                    "only when that token appears; decay would shrink every row at every "
                    "step). Name the modules whose weights decay (nn.Linear, the "
                    "convolutions) rather than the ones whose weights do not")
        if name.endswith("bias") and not name.startswith("2."):
            return (f"{name} gets weight_decay {decays[0]:g}: biases do not decay (a shift "
                    "has no scale for the decay to keep small); give their group "
                    "weight_decay=0.0")
        if str(case["model"]) == "multi_axis":
            return (f"{name}, a parameter of MyLayerNorm((3, 4)), gets weight_decay "
                    f"{decays[0]:g}. It is 2-D, so a rule on p.ndim < 2 decays it: decide "
                    "by the module that owns the parameter (the weights of nn.Linear and of "
                    "convolutions decay, nothing else)")
        return (f"{name}, a norm layer's gamma, gets weight_decay {decays[0]:g}: weight "
                "decay pulls gamma toward 0, while the norm's scale should stay free (it "
                "starts at 1); give norm parameters weight_decay=0.0")
    error = _text(output, "adamw_error")
    if error:
        return f"torch.optim.AdamW refused your groups: {error}"
    return None


# ----- the channels-first layer norm (ConvNeXt's LayerNorm2d) ----------------------

LN2D_DEFAULT_EPS = 1e-6  # ConvNeXt's LayerNorm (models/convnext.py) defaults to 1e-6


def _ln2d_case(rng, shape, dtype=np.float32, offset=0.0, spread=1.0, affine=True,
               **entries):
    """A LayerNorm2d case: C from `shape` (N, C, H, W), the input, random
    gamma/beta of shape (C,) unless `affine` is False (then they stay at 1, 0)."""
    channels = shape[1]
    case = {"channels": np.array(channels), "x": rng.normal(
        offset, spread, size=shape).astype(dtype)}
    if affine:
        case["set_weight"] = rng.normal(1.0, 0.5, size=channels).astype(dtype)
        case["set_bias"] = rng.normal(0.0, 0.5, size=channels).astype(dtype)
    for key, value in entries.items():
        case[key] = np.asarray(value)
    return case


def _ln2d_forward_cases(rng):
    """float32 inputs stored as usual: the statistics, eps and gamma/beta."""
    return [
        ("LayerNorm2d(4) on (2, 4, 3, 5), float32, random gamma and beta",
         _ln2d_case(rng, (2, 4, 3, 5), offset=2.0)),
        ("LayerNorm2d(5) on (2, 5, 3, 5), float32 (C = W), random gamma and beta",
         _ln2d_case(rng, (2, 5, 3, 5), offset=-1.0)),
        ("LayerNorm2d(8, eps=0.01) on (2, 8, 4, 4), float32",
         _ln2d_case(rng, (2, 8, 4, 4), offset=5.0, eps=0.01)),
        ("LayerNorm2d(6) with its default eps, on (2, 6, 3, 3) float32 with spread 1e-3",
         _ln2d_case(rng, (2, 6, 3, 3), spread=1e-3, affine=False)),
        ("LayerNorm2d(7) on a single pixel per image, (4, 7, 1, 1), float32",
         _ln2d_case(rng, (4, 7, 1, 1), offset=1.0)),
    ]


def _ln2d_dtype_layout_cases(rng):
    """The same norm on other dtypes and on inputs stored channels last."""
    return [
        ("LayerNorm2d(6) on (3, 6, 6, 6) in float64 (C = H = W), random gamma and beta",
         _ln2d_case(rng, (3, 6, 6, 6), np.float64, offset=-1.0, spread=3.0)),
        ("LayerNorm2d(5) after .double(), on (2, 5, 3, 3) float64 around 1000",
         _ln2d_case(rng, (2, 5, 3, 3), np.float64, offset=1000.0)),
        ("LayerNorm2d(3) on a (2, 3, 4, 5) float32 input stored channels_last in memory",
         _ln2d_case(rng, (2, 3, 4, 5), channels_last=True)),
        ("LayerNorm2d(4) on a (2, 4, 3, 4) float64 input stored channels_last in memory",
         _ln2d_case(rng, (2, 4, 3, 4), np.float64, channels_last=True)),
        ("LayerNorm2d(16) (float32 parameters) on a bfloat16 (2, 16, 3, 3) map around "
         "300, where bfloat16's spacing is 2",
         {**_ln2d_case(rng, (2, 16, 3, 3), affine=False),
          "x": _bfloat16_values(rng.normal(300.0, 2.0, size=(2, 16, 3, 3))),
          "x_dtype": np.array("bfloat16")}),
    ]


def _ln2d_gradient_cases(rng):
    def graded(shape, dtype, **entries):
        case = _ln2d_case(rng, shape, dtype, offset=0.5, **entries)
        case["upstream"] = rng.normal(size=shape).astype(dtype)
        return case

    return [
        ("LayerNorm2d(3) on (2, 3, 4, 5) in float64, loss sum(upstream * y)",
         graded((2, 3, 4, 5), np.float64)),
        ("LayerNorm2d(5) on (3, 5, 7, 2) in float64 (N, C, H, W all odd or unequal)",
         graded((3, 5, 7, 2), np.float64)),
        ("LayerNorm2d(4, eps=0.1) on (3, 4, 2, 2) in float64", graded(
            (3, 4, 2, 2), np.float64, eps=0.1)),
        ("LayerNorm2d(6) with its default eps on (2, 6, 3, 3) in float64 with spread 1e-3",
         _with_upstream(rng, _ln2d_case(rng, (2, 6, 3, 3), np.float64, spread=1e-3))),
        ("LayerNorm2d(8) on (2, 8, 3, 3), float32", graded((2, 8, 3, 3), np.float32)),
        ("LayerNorm2d(3) on a (2, 3, 4, 5) float64 input stored channels_last",
         graded((2, 3, 4, 5), np.float64, channels_last=True)),
        ("LayerNorm2d(7) on a single pixel per image, (4, 7, 1, 1), float64",
         graded((4, 7, 1, 1), np.float64)),
    ]


def _with_upstream(rng, case):
    case["upstream"] = rng.normal(size=np.shape(case["x"])).astype(np.asarray(case["x"]).dtype)
    return case


def _ln2d_eps(case):
    return float(case["eps"]) if "eps" in case else LN2D_DEFAULT_EPS


def _ln2d_affine(case):
    """gamma and beta of the case, float64, shape (C,)."""
    channels = int(case["channels"])
    gamma = np.asarray(case.get("set_weight", np.ones(channels)), np.float64)
    beta = np.asarray(case.get("set_bias", np.zeros(channels)), np.float64)
    return gamma, beta


def _ln2d_reference(case):
    """y (and, for a case with "upstream", the gradients of sum(upstream * y) as
    {"x_grad", "weight_grad", "bias_grad"}) in float64, from torch's own layer
    norm on the channels-last view: F.layer_norm(x.permute(0, 2, 3, 1), (C,))."""
    import torch
    import torch.nn.functional as F

    graded = "upstream" in case
    gamma, beta = _ln2d_affine(case)
    x = torch.from_numpy(np.asarray(case["x"], np.float64)).requires_grad_(graded)
    weight = torch.from_numpy(gamma).requires_grad_(graded)
    bias = torch.from_numpy(beta).requires_grad_(graded)
    y = F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), weight, bias,
                     _ln2d_eps(case)).permute(0, 3, 1, 2)  # N, C, H, W
    if not graded:
        return y.detach().numpy(), None
    upstream = torch.from_numpy(np.asarray(case["upstream"], np.float64))
    (y * upstream).sum().backward()
    return y.detach().numpy(), {"x_grad": x.grad.numpy(), "weight_grad": weight.grad.numpy(),
                                "bias_grad": bias.grad.numpy()}


def _closest_hint(y, candidates, dtype):
    """The hint whose wrong output `y` matches most closely, or None."""
    closest, found = np.inf, None
    with np.errstate(all="ignore"):
        for hint, wrong in candidates.items():
            if np.shape(y) == np.shape(wrong) and matches(y, wrong, dtype=dtype):
                gap = np.abs(np.asarray(y, np.float64) - wrong)
                distance = float(np.max(gap[np.isfinite(gap)], initial=0.0))
                if distance < closest:
                    closest, found = distance, hint
    return found


def _likely_ln2d_mistake(case, y):
    """Name the slip whose output `y` reproduces, if any."""
    x = np.asarray(case["x"], np.float64)
    eps = _ln2d_eps(case)
    gamma, beta = _ln2d_affine(case)
    g, b = gamma.reshape(1, -1, 1, 1), beta.reshape(1, -1, 1, 1)  # 1, C, 1, 1

    def affine(x_hat):
        return g * x_hat + b

    mu = x.mean(axis=1, keepdims=True)  # N, 1, H, W
    var = x.var(axis=1, keepdims=True)  # N, 1, H, W
    candidates = {
        "normalize over the channels C at each pixel (dim=1); you normalized each "
        "channel's H x W plane, which is instance norm": affine(_normalized(x, (2, 3), eps)),
        "normalize over the channels C at each pixel (dim=1) only; you normalized over "
        "C, H and W together, which is GroupNorm with one group (or nn.LayerNorm([C, H, W]))":
            affine(_normalized(x, (1, 2, 3), eps)),
        "take the statistics over each pixel's channels, not across the batch (that is "
        "batch norm)": affine(_normalized(x, (0, 2, 3), eps)),
        "the variance divides by C, not C - 1 (torch.var's default is unbiased: pass "
        "correction=0 or unbiased=False)": affine(_normalized(x, (1,), eps, correction=1)),
        "eps goes inside the square root: (x - mean) / sqrt(var + eps)":
            affine((x - mu) / (np.sqrt(var) + eps)),
        "gamma and beta are not applied: multiply by self.weight and add self.bias, "
        "shaped (C, 1, 1)": _normalized(x, (1,), eps),
    }
    if x.shape[1] == x.shape[3]:
        candidates[
            "weight and bias hold one number per channel: shape them (C, 1, 1) so that "
            "they broadcast along dim 1; as (C,) they broadcast along the last axis, W"
        ] = gamma * _normalized(x, (1,), eps) + beta
    if x.shape[1] == x.shape[2]:
        candidates[
            "weight and bias hold one number per channel: shape them (C, 1, 1), not "
            "(C, 1), which broadcasts along H"
        ] = gamma[:, None] * _normalized(x, (1,), eps) + beta[:, None]
    if "eps" in case:
        candidates[f"use the eps you were given ({eps:g}), not a fixed default"] = affine(
            _normalized(x, (1,), LN2D_DEFAULT_EPS))
    else:
        for wrong_default in (1e-5, 0.0, 1e-8, 1e-12, 1e-3):
            candidates[f"the default eps is 1e-6, as in ConvNeXt, not {wrong_default:g}"] = (
                affine(_normalized(x, (1,), wrong_default)))
    return _closest_hint(y, candidates, np.asarray(case["x"]).dtype)


def _ln2d_error_hint(error):
    if error.startswith("NotImplementedError"):
        return f"your module raised {error}: the forward pass is not written yet"
    if "must match the size of tensor" in error:
        return (
            f"your module raised {error}. weight and bias hold one number per channel: "
            "shape them (C, 1, 1) (or view them as (1, C, 1, 1)) so that they broadcast "
            "along dim 1; as (C,) they broadcast along the last axis, W"
        )
    if "view size is not compatible" in error:
        return (
            f"your module raised {error}. The input may be stored channels_last (as "
            "ConvNeXt runs): use reshape, or reduce over dim=1 directly, not view"
        )
    return f"your module raised {error}"


def _ln2d_parameter_problem(case, output):
    channels = int(case["channels"])
    names = sorted(_split(_text(output, "names")))
    if names != ["bias", "weight"]:
        return (f"your module's parameters are {names}; LayerNorm2d(C) holds two, named "
                "weight and bias, as ConvNeXt's does")
    shapes = dict(item.split("=") for item in _text(output, "shapes").split(";"))
    for name in ("weight", "bias"):
        if shapes.get(name) != f"[{channels}]":
            return (f"your {name} has shape {shapes.get(name)}; it holds one number per "
                    f"channel, shape ({channels},)")
    for name, start in (("weight", 1.0), ("bias", 0.0)):
        if not np.allclose(np.asarray(output[f"initial_{name}"], np.float64), start):
            return f"{name} starts at {start:g} for every channel"
    return None


def _judge_ln2d_forward(case, output):
    problem = _ln2d_parameter_problem(case, output)
    if problem:
        return problem
    if "forward_error" in output:
        return _ln2d_error_hint(_text(output, "forward_error"))
    expected, _ = _ln2d_reference(case)
    dtype = _input_dtype(case)
    problem = mismatch(output["y"], expected, dtype=dtype, what="your output")
    if problem:
        hint = _likely_ln2d_mistake(case, output["y"])
        return problem + (f". Hint: {hint}" if hint else "")
    want = f"torch.{dtype}"
    if _text(output, "y_dtype") != want:
        return (f"your output's dtype is {_text(output, 'y_dtype')}; for a {want} input "
                f"return {want}")
    return None


_LN2D_LOW_PRECISION_HINT = (
    "with a bfloat16 input, take each pixel's mean and variance in float32 (x.float()), "
    "as nn.LayerNorm does, and return y.to(x.dtype): around 300 bfloat16's numbers are 2 "
    "apart, so a mean rounded to bfloat16 is off by up to 1, the pixel's whole spread")


def _judge_ln2d_dtypes_layouts(case, output):
    """Judged like the forward, except that a slip the forward check names (the
    statistics over other dims, the unbiased variance, eps, gamma's axis) is
    charged there, once; what is charged here is the dtype and the layout."""
    problem = _judge_ln2d_forward(case, output)
    if problem is None or "y" not in output or np.shape(output["y"]) != np.shape(case["x"]):
        return problem
    expected, _ = _ln2d_reference(case)
    if "x_dtype" in case:
        if matches(output["y"], expected, dtype=_input_dtype(case)):
            return problem  # the values are right: the dtype is what is off
        x = np.asarray(case["x"], np.float64)
        if matches(output["y"], _normalized(x, (1,), _ln2d_eps(case), correction=1),
                   dtype=_input_dtype(case)):
            return None  # the unbiased variance: ln2d_forward charges it, once
        return problem.split(". Hint:")[0] + f". Hint: {_LN2D_LOW_PRECISION_HINT}"
    if "Hint:" in problem:
        return None  # a slip ln2d_forward names and charges
    if _input_dtype(case) == "float64" and matches(output["y"], expected, dtype="float32"):
        return f"{problem}. Hint: {FLOAT64_HINT}"
    if bool(case.get("channels_last", False)):
        return problem + (". This input is stored channels_last, its memory in (N, H, W, "
                          "C) order. If the same map stored as usual gets the right "
                          "values (ln2d_forward), something in your forward reads the "
                          "memory itself (as_strided, the strides, the storage) as if "
                          "it were in (N, C, H, W) order; indexing, view(), reshape() "
                          "and reductions over dim=1 follow the dims, whatever the "
                          "memory order")
    return problem


def _ln2d_slip_gradients(case):
    """The gradients of sum(upstream * y) for each LayerNorm2d forward slip that
    _likely_ln2d_mistake names, computed by autograd through that same slip."""
    eps = _ln2d_eps(case)
    gamma, beta = _ln2d_affine(case)
    data = (case["x"], gamma, beta, case["upstream"])
    variants = [dict(dims=dims, eps=eps) for dims in ((2, 3), (1, 2, 3), (0, 2, 3))]
    variants += [dict(dims=(1,), eps=eps, correction=1),
                 dict(dims=(1,), eps=eps, eps_outside=True)]
    wrong_eps = ((LN2D_DEFAULT_EPS,) if "eps" in case
                 else (1e-5, 0.0, 1e-8, 1e-12, 1e-3))
    variants += [dict(dims=(1,), eps=wrong) for wrong in wrong_eps]
    return [_variant_gradients(*data, affine_shape=(1, -1, 1, 1), **variant)
            for variant in variants]


def _judge_ln2d_gradients(case, output):
    """autograd's gradients through the student's forward, against torch's own
    layer norm on the channels-last view. Right gradients of a forward that
    carries a slip ln2d_forward charges are not charged again."""
    if "forward_error" in output:
        return _ln2d_error_hint(_text(output, "forward_error"))
    missing = _text(output, "missing")
    if missing.startswith("all"):
        return (missing.split(": ", 1)[1] + ": compute the output with torch operations on "
                "the input and the parameters, without detaching")
    if missing:
        return _NO_GRADIENT[_split(missing)[0]]
    expected_y, expected = _ln2d_reference(case)
    dtype = np.asarray(case["x"]).dtype
    if not _matches_all(output, expected, dtype) and any(
            _matches_all(output, slipped, dtype) for slipped in _ln2d_slip_gradients(case)):
        return None
    cut = _ln2d_cut_graph(case)
    for key, what in (("x_grad", "the gradient with respect to x"),
                      ("weight_grad", "the gradient with respect to weight"),
                      ("bias_grad", "the gradient with respect to bias")):
        problem = mismatch(output[key], expected[key], dtype=dtype, what=what)
        if problem:
            hint = _closest_hint(output[key], cut.get(key, {}), dtype)
            if hint:
                return f"{problem}. Hint: {hint}"
            if "y" in output and not mismatch(output["y"], expected_y, dtype=dtype):
                return (f"{problem}. Your output is right on this case, so something "
                        "cuts autograd's graph between it and the inputs (a .detach(), "
                        ".data, torch.no_grad() or a value taken out with .item())")
            return problem + ". The forward pass itself is off on this case: see ln2d_forward"
    return None


def _ln2d_cut_graph(case):
    """Wrong input gradients that a forward with a statistic cut out of the graph
    (detached, or computed under torch.no_grad) gives: {key: {hint: gradient}}."""
    x = np.asarray(case["x"], np.float64)
    upstream = np.asarray(case["upstream"], np.float64)
    gamma, _ = _ln2d_affine(case)
    rstd = 1.0 / np.sqrt(x.var(axis=1, keepdims=True) + _ln2d_eps(case))
    x_hat = (x - x.mean(axis=1, keepdims=True)) * rstd
    g = upstream * gamma.reshape(1, -1, 1, 1)  # the gradient reaching x_hat

    def channel_mean(t):
        return t.mean(axis=1, keepdims=True)

    return {"x_grad": {
        "dx is upstream * gamma * rstd alone, as if the mean and the variance were "
        "constants: you detached both statistics (or took them under torch.no_grad). "
        "Each pixel's mean and variance depend on all C of its inputs, and autograd "
        "needs them in the graph": rstd * g,
        "dx misses the mean's path: the mean is detached (or taken under "
        "torch.no_grad); keep it in the graph": rstd * (g - x_hat * channel_mean(g * x_hat)),
        "dx misses the variance's path: the variance (or rstd) is detached (or taken "
        "under torch.no_grad); keep it in the graph": rstd * (g - channel_mean(g)),
    }}


# ----- the inline questions -------------------------------------------------------

# Question 2: three edits of image 0 of a (2, C, H, W) batch, each made on a
# fresh copy, and the number of the batch's outputs each edit changes under the
# two other members of the GroupNorm family (the lesson's one-pixel example
# shows LayerNorm2d and GroupNorm(1, C)).
EDITED_BATCH = (2, 8, 5, 5)
INVARIANCE_EDITS = (
    "channel 0 of image 0 multiplied by 3",
    "a different offset added at each pixel of image 0, the same for its C channels",
    "channels 4 to 7 of image 0 multiplied by 3, then 5 added",
)
CHANGED_BY_MORE_THAN = 1e-4
_INVARIANCE_LAYERS = {
    "INSTANCENORM_CHANGED": ("InstanceNorm2d(8)", "normalizes each channel's 5 x 5 "
                             "plane of each image on its own: it removes any shift and "
                             "scale that is the same over a channel's plane, and "
                             "nothing else"),
    "GROUPNORM2_CHANGED": ("GroupNorm(2, 8)", "normalizes each image's channels 0-3 "
                           "together and its channels 4-7 together (groups are runs of "
                           "consecutive channels): it removes a shift or a scale only "
                           "when it is the same for a whole group"),
}


def _edited_copies(x):
    """The batch after each of INVARIANCE_EDITS, in that order."""
    import torch

    n, c, h, w = x.shape
    one_channel = x.clone()
    one_channel[0, 0] = 3 * one_channel[0, 0]
    per_pixel = x.clone()
    per_pixel[0] += torch.arange(h * w, dtype=x.dtype).reshape(1, h, w)
    second_group = x.clone()
    second_group[0, c // 2:] = 3 * second_group[0, c // 2:] + 5
    return one_channel, per_pixel, second_group


def _invariance_truths():
    """Counted by running torch's instance norm and group norm on a random batch,
    in float64, not typed in."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(EDITED_BATCH, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(0))
    layers = {
        "INSTANCENORM_CHANGED": F.instance_norm,
        "GROUPNORM2_CHANGED": lambda t: F.group_norm(t, 2),
    }
    return {name: [int(((layer(edited) - layer(x)).abs() > CHANGED_BY_MORE_THAN).sum())
                   for edited in _edited_copies(x)]
            for name, layer in layers.items()}


def _judge_invariances(case, output):
    truths = _invariance_truths()
    missing = [name for name in truths if name not in output]
    if missing:
        return f"no answer given for {', '.join(missing)}"
    wrong = []
    for name, truth in truths.items():
        given = np.atleast_1d(output[name])
        layer, why = _INVARIANCE_LAYERS[name]
        if given.shape != (len(truth),):
            wrong.append(f"{name} holds one count per edit, {len(truth)} in all "
                         f"(you answered {' '.join(map(str, given))})")
            continue
        slips = [f"{edit} (you answered {answer})" for edit, answer, right in zip(
            INVARIANCE_EDITS, given, truth) if number_from_answer(answer) != right]
        if slips:
            wrong.append(f"{layer}: " + "; ".join(slips) + f". {layer} {why}")
    return "not yet right: " + " | ".join(wrong) if wrong else None


# Question 3's tensors: x, the sublayer's output, in bfloat16 and the residual
# stream in float32, both of this shape.
ADD_NORM_SHAPE = (8, 1024, 4096)

# Each kernel reads each full-size input once and writes each full-size output
# once: (dtypes read, dtypes written). Unfused, torch promotes bfloat16 + float32
# to float32, F.layer_norm keeps float32 and a third kernel casts normed to x's
# dtype; fused, flash-attn's kernel reads x and residual and writes both outputs.
_UNFUSED_KERNELS = {
    "x + residual": (("bfloat16", "float32"), ("float32",)),
    "F.layer_norm of the float32 sum": (("float32",), ("float32",)),
    ".to(torch.bfloat16) of normed": (("float32",), ("bfloat16",)),
}
_FUSED_KERNELS = {"add and norm in one kernel": (("bfloat16", "float32"),
                                                  ("float32", "bfloat16"))}

_BYTES_QUESTIONS = {
    "UNFUSED_BYTES": "bytes read and written by the three unfused kernels",
    "FUSED_BYTES": "bytes read and written by the fused kernel",
}


def _bytes_per_element(kernels, size_of):
    return sum(size_of(dtype) for reads, writes in kernels.values()
               for dtype in reads + writes)


def _memory_bytes_truths(size_of=None):
    """Bytes moved, from torch's element sizes (or `size_of`, to name a slip)."""
    import torch

    size_of = size_of or (lambda dtype: torch.empty(0, dtype=getattr(torch, dtype))
                          .element_size())
    elements = int(np.prod(ADD_NORM_SHAPE))
    return {"UNFUSED_BYTES": elements * _bytes_per_element(_UNFUSED_KERNELS, size_of),
            "FUSED_BYTES": elements * _bytes_per_element(_FUSED_KERNELS, size_of)}


def _memory_byte_slips(name):
    """[(bytes, what that count reproduces)] for the modelled slips of question
    `name`. Several slips can give the same count (the unfused kernels counted at
    4 bytes each move 7 * 4 bytes an element; counted right, with the norm reading
    its input twice, 2 * 2 + 6 * 4): _memory_bytes_slip names all of them."""
    import torch

    def size(dtype):
        return torch.empty(0, dtype=getattr(torch, dtype)).element_size()

    truths = _memory_bytes_truths()
    truth = truths[name]
    elements = int(np.prod(ADD_NORM_SHAPE))
    slips = [
        (truth // elements, "that is the count per element: multiply by the number of "
         f"elements, {elements}"),
        (_memory_bytes_truths(lambda dtype: 4)[name], "every tensor counted at 4 bytes: "
         "x and normed are bfloat16, 2 bytes each"),
        (_memory_bytes_truths(lambda dtype: 2)[name], "every tensor counted at 2 bytes: "
         "the residual stream and its sum are float32, 4 bytes each"),
        (truth / 2 ** 20, "that is in MiB: give bytes"),
        (truth / 10 ** 6, "that is in MB: give bytes"),
    ]
    if name == "UNFUSED_BYTES":
        bfloat16_sum = {"x + residual": (("bfloat16", "float32"), ("bfloat16",)),
                        "F.layer_norm": (("bfloat16",), ("bfloat16",))}
        slips += [
            (truth - elements * (size("float32") + size("bfloat16")),
             "F.layer_norm on a float32 sum returns float32: a third kernel reads it "
             "and writes normed in bfloat16"),
            (truth + elements * size("float32"),
             "F.layer_norm counted as reading the float32 sum twice (for the statistics, "
             "then to normalize): the rule counts each kernel's full-size input once"),
            (elements * _bytes_per_element(bfloat16_sum, size),
             "x + residual counted as a bfloat16 sum: torch promotes bfloat16 + float32 "
             "to float32, so the sum and F.layer_norm's output are float32 and a third "
             "kernel casts normed"),
            (truths["FUSED_BYTES"], "that is the fused kernel's count, not the three "
             "unfused kernels'"),
        ]
    else:
        slips += [
            (truth + elements * size("float32"),
             "the fused kernel counted as reading residual_sum back: it writes the sum "
             "once and normalizes the values it still holds on chip"),
            (truths["UNFUSED_BYTES"], "that is the three unfused kernels' count, not "
             "the fused kernel's"),
        ]
    return slips


def _memory_bytes_slip(name, given):
    """What a wrong byte count reproduces: every modelled slip that gives it, or
    None."""
    reproduced = [text for count, text in _memory_byte_slips(name) if count == given]
    if len(reproduced) > 1:
        return ("this count fits more than one slip, so check each: "
                + "; or ".join(reproduced))
    return reproduced[0] if reproduced else None


def _judge_memory_bytes(case, output):
    truths = {name: truth for name, truth in _memory_bytes_truths().items()
              if name in output}
    if not truths:
        return f"no answer given for {' or '.join(_BYTES_QUESTIONS)}"
    wrong = []
    for name, truth in truths.items():
        given = number_from_answer(str(output[name]))
        if given != float(truth):
            slip = _memory_bytes_slip(name, given) if given is not None else None
            wrong.append(f"{_BYTES_QUESTIONS[name]} (you answered {str(output[name])}"
                         + (f": {slip}" if slip else "") + ")")
    return "not yet right: " + "; ".join(wrong) if wrong else None


CHECKS = {
    "add_layer_norm_module": Check(_add_cases, _judge_add_layer_norm),
    "add_layer_norm_fp32_residual": Check(_fp32_residual_cases, _judge_add_fp32_residual),
    "channel_norm_invariances": Check(
        lambda rng: [("your six counts", {})], _judge_invariances),
    "add_norm_memory_bytes": Check(
        lambda rng: [("your byte count", {})], _judge_memory_bytes),
    "my_layer_norm_parameters": Check(_parameter_cases, _judge_parameters),
    "my_layer_norm_forward": Check(_forward_cases, _judge_forward),
    "my_layer_norm_float64": Check(_float64_cases, _judge_float64),
    "my_layer_norm_low_precision": Check(_low_precision_cases, _judge_low_precision),
    "my_layer_norm_flags": Check(_flag_cases, _judge_flags),
    "my_layer_norm_state_dict": Check(_state_dict_cases, _judge_state_dict),
    "my_layer_norm_autograd": Check(_autograd_cases, _judge_autograd),
    "my_layer_norm_shape_error": Check(_shape_error_cases, _judge_shape_error),
    "my_layer_norm_factory_kwargs": Check(_factory_cases, _judge_factory_kwargs),
    "my_layer_norm_reset_repr": Check(_reset_repr_cases, _judge_reset_repr),
    "adamw_param_groups": Check(_param_group_cases, _judge_param_groups),
    "layer_norm_2d_forward": Check(_ln2d_forward_cases, _judge_ln2d_forward),
    "layer_norm_2d_dtypes_layouts": Check(_ln2d_dtype_layout_cases,
                                          _judge_ln2d_dtypes_layouts),
    "layer_norm_2d_gradients": Check(_ln2d_gradient_cases, _judge_ln2d_gradients),
}
