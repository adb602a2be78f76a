"""Unit 04 checks, the grader-facing half: inputs, references, diagnoses.

Every verdict compares with normref.backward at the tolerance table's
precision. When a gradient is wrong, the message also quotes a centred finite
difference of the loss sum(dy * y) at the worst entry: evidence the student
can reproduce without trusting the reference.
"""

import numpy as np

from normref import backward, recipe
from normref.checks._registry import Check
from normref.checks.tolerances import matches, mismatch

EXAMPLE_A = np.array([2.0, 4.0, 6.0, 8.0])
FD_STEP = 1e-5  # centred differences in float64: error ~1e-10 relative


# ---------------------------------------------------------------- cases

def _case(x, gamma=None, beta=None, dy=None, eps=1e-5, rng=None):
    x = np.asarray(x)
    d = x.shape[-1]
    rng = rng if rng is not None else np.random.default_rng(4)
    return {
        "x": x,
        "gamma": np.ones(d, x.dtype) if gamma is None else np.asarray(gamma, x.dtype),
        "beta": np.zeros(d, x.dtype) if beta is None else np.asarray(beta, x.dtype),
        "dy": rng.normal(size=x.shape).astype(x.dtype) if dy is None else np.asarray(dy, x.dtype),
        "eps": np.array(eps),
    }


def _random_case(rng, shape, loc=0.0, scale=1.0, dtype=np.float64):
    d = shape[-1]
    return _case(rng.normal(loc, scale, size=shape).astype(dtype),
                 rng.normal(1.0, 0.5, size=d), rng.normal(size=d), rng=rng)


def _forward_cases(rng):
    return [
        ("x = [2, 4, 6, 8]", _case(EXAMPLE_A)),
        ("x = [2, 4, 6, 8] with gamma = 2, beta = 1", _case(EXAMPLE_A, [2.0] * 4, [1.0] * 4)),
        ("a batch of 4 tokens, d = 8", _random_case(rng, (4, 8))),
        ("a 3-D batch (2, 3, 16)", _random_case(rng, (2, 3, 16), 2.0, 3.0)),
        ("a constant token [5, 5, 5, 5] (variance 0)", _case(np.full(4, 5.0))),
        ("a tiny spread, 0.001 * [2, 4, 6, 8], where eps matters", _case(0.001 * EXAMPLE_A)),
        ("a float32 batch (6, 32)", _random_case(rng, (6, 32), dtype=np.float32)),
    ]


def _ln_backward_cases(rng):
    return [
        ("x = [2, 4, 6, 8], gamma = [2, -1, 0.5, 3], dy = [1, 0, -2, 0.5]",
         _case(EXAMPLE_A, [2.0, -1.0, 0.5, 3.0], [0.0] * 4, [1.0, 0.0, -2.0, 0.5])),
        ("a batch of 5 tokens, d = 8", _random_case(rng, (5, 8))),
        ("a 3-D batch (2, 3, 16)", _random_case(rng, (2, 3, 16), 1.0, 2.0)),
        ("a 4-D batch (2, 2, 3, 8)", _random_case(rng, (2, 2, 3, 8))),
        ("a tiny spread, 0.001 * [2, 4, 6, 8], where eps matters",
         _case(0.001 * EXAMPLE_A, [1.5, 0.5, -1.0, 2.0], rng=rng)),
        ("tokens with a large offset (1000 + N(0, 1)), (3, 16)",
         _random_case(rng, (3, 16), 1000.0)),
        ("a float32 batch (4, 32)", _random_case(rng, (4, 32), dtype=np.float32)),
    ]


def _ln_params_cases(rng):
    """The same cases, batches first: summing over axis 0 alone then fails on
    a 3-D batch, with a message about leading axes, before the single token."""
    cases = _ln_backward_cases(rng)
    return cases[1:] + cases[:1]


def _rms_cases(rng):
    return [
        ("x = [2, 4, 6, 8], gamma = [2, -1, 0.5, 3], dy = [1, 0, -2, 0.5]",
         _case(EXAMPLE_A, [2.0, -1.0, 0.5, 3.0], dy=[1.0, 0.0, -2.0, 0.5])),
        ("a batch of 5 tokens, d = 8", _random_case(rng, (5, 8))),
        ("a 3-D batch (2, 3, 16) of tokens with mean 3", _random_case(rng, (2, 3, 16), 3.0)),
        ("a 4-D batch (2, 2, 3, 8)", _random_case(rng, (2, 2, 3, 8))),
        ("tiny values, 0.001 * [2, 4, 6, 8], where eps matters",
         _case(0.001 * EXAMPLE_A, [1.5, 0.5, -1.0, 2.0], rng=rng)),
        ("a float32 batch (4, 32)", _random_case(rng, (4, 32), dtype=np.float32)),
    ]


# ---------------------------------------------------------------- helpers

def _float64(case):
    return {key: np.asarray(value, dtype=np.float64) for key, value in case.items()}


def _per_token(values, x):
    """Accept one number per token as shape (...) or (..., 1)."""
    values = np.asarray(values)
    if values.shape == x.shape[:-1] + (1,):
        return values[..., 0]
    return values


def _token_sum(values):
    return values.reshape(-1, values.shape[-1]).sum(axis=0)


def _ln_loss(c):
    y = recipe.layer_norm(c["x"], c["gamma"], c["beta"], float(c["eps"]))
    return float(np.sum(c["dy"] * y))


def _rms_loss(c):
    rms = np.sqrt((c["x"] ** 2).mean(axis=-1, keepdims=True) + float(c["eps"]))
    return float(np.sum(c["dy"] * c["gamma"] * c["x"] / rms))


def _finite_difference(loss, case, key, index, h=FD_STEP):
    """Centred difference of loss(case) in case[key][index], in float64."""
    c = _float64(case)
    start = c[key][index]
    c[key][index] = start + h
    up = loss(c)
    c[key][index] = start - h
    down = loss(c)
    return (up - down) / (2 * h)


def _fd_evidence(loss, case, key, name, yours, expected):
    """A sentence quoting a finite difference where `yours` is furthest off."""
    try:
        yours = np.asarray(yours, dtype=np.float64)
        if yours.shape != expected.shape:
            return ""
        index = np.unravel_index(np.argmax(np.abs(yours - expected)), expected.shape)
    except (TypeError, ValueError):
        return ""
    estimate = _finite_difference(loss, case, key, index)
    where = ", ".join(str(int(i)) for i in index)
    return (f". A centred finite difference of sum(dy * y) (h = {FD_STEP:g}) puts "
            f"{name}[{where}] at {estimate:.6g}; yours is {yours[index]:.6g}")


def _first_hint(actual, candidates, dtype):
    """The hint of the first wrong formula that reproduces `actual`, if any."""
    actual = np.asarray(actual)
    if not np.issubdtype(actual.dtype, np.number):
        return None
    with np.errstate(all="ignore"):
        for hint, wrong in candidates.items():
            if actual.shape == wrong.shape and matches(actual, wrong, dtype=dtype):
                return hint
    return None


def _with_hint(problem, hint):
    return problem + (f". Hint: {hint}" if hint else "")


def _axis_hint(actual, x, name):
    """Explain a (d,)-shaped parameter gradient that came back another shape."""
    shape = np.shape(actual)
    any_shape = "x.reshape(-1, d).sum(axis=0) sums over the tokens of any batch shape"
    if shape == x.shape[:-1]:
        return (f"{name} has one entry per feature: sum over the tokens (every leading "
                f"axis), not over the features (the last axis); {any_shape}")
    if x.ndim > 2 and shape == x.shape[1:]:
        return f"{name} sums over every leading axis, not only axis 0: {any_shape}"
    if shape == x.shape:
        return f"{name} is summed over every token, giving one number per feature"
    return None


# ---------------------------------------------------------------- forward

def _judge_forward(case, output):
    if "cache_problem" in output:
        return str(output["cache_problem"])
    x = case["x"]
    gamma, beta, eps = case["gamma"], case["beta"], float(case["eps"])
    y_ref, cache = backward.layer_norm_forward(x, gamma, beta, eps)
    problem = mismatch(output["y"], y_ref, dtype=x.dtype, what="y")
    if problem:
        return problem
    problem = mismatch(_per_token(output["mean"], x), cache["mean"], dtype=x.dtype,
                       what="cache['mean']")
    if problem:
        wrong_shape = np.shape(_per_token(output["mean"], x)) != x.shape[:-1]
        return _with_hint(problem, "keep one mean per token, averaged over its features "
                          "(the last axis)" if wrong_shape else None)
    rstd = _per_token(output["rstd"], x)
    problem = mismatch(rstd, cache["rstd"], dtype=x.dtype, what="cache['rstd']")
    if problem:
        var = 1.0 / cache["rstd"] ** 2 - eps
        hint = _first_hint(rstd, {
            "rstd is the reciprocal, 1 / sqrt(var + eps), not the standard deviation":
                np.sqrt(var + eps),
            "eps goes inside the square root, with the variance: 1 / sqrt(var + eps)":
                1.0 / (np.sqrt(var) + eps),
            "add eps to the variance: rstd = 1 / sqrt(var + eps)": 1.0 / np.sqrt(var),
            "take the square root: rstd = 1 / sqrt(var + eps)": 1.0 / (var + eps),
            "that is the variance; rstd = 1 / sqrt(var + eps)": var,
        }, x.dtype)
        return _with_hint(problem, hint)
    return None


# ---------------------------------------------------------------- layer norm backward

def _ln_parts(case):
    """Float64 pieces of the backward pass, for the reference and the mistakes."""
    c = _float64(case)
    x, eps = c["x"], float(case["eps"])
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    x_hat = (x - mean) * rstd
    return c, var, rstd, x_hat


def _ln_dx_mistakes(case):
    c, var, rstd, x_hat = _ln_parts(case)
    g = c["dy"] * c["gamma"]
    dy = c["dy"]

    def avg(v):
        return v.mean(axis=-1, keepdims=True)

    def dx_from(g, rstd=rstd):
        return rstd * (g - avg(g) - x_hat * avg(g * x_hat))

    return {
        "dx is missing the -mean(g) term: the mean mu depends on every feature, so "
        "each entry of g = dy * gamma loses the token's average of g":
            rstd * (g - x_hat * avg(g * x_hat)),
        "dx is missing the -x_hat * mean(g * x_hat) term: rstd depends on x "
        "through the variance, and that path carries gradient too":
            rstd * (g - avg(g)),
        "dx is missing both correction terms, -mean(g) and -x_hat * mean(g * x_hat)":
            rstd * g,
        "the gradient reaching x_hat is g = dy * gamma: y = gamma * x_hat + beta, so "
        "dy passes through gamma before it reaches x_hat":
            dx_from(dy),
        "dx ends with a factor rstd = 1 / sqrt(var + eps)": dx_from(g, 1.0),
        "the factor in front is rstd = 1 / sqrt(var + eps), not the standard deviation":
            dx_from(g, 1.0 / rstd),
        "rstd includes eps: 1 / sqrt(var + eps)": dx_from(g, 1.0 / np.sqrt(var)),
        "the sign of dx is flipped": -dx_from(g),
    }


def _judge_ln_dx(case, output):
    x = case["x"]
    _, cache = backward.layer_norm_forward(x, case["gamma"], case["beta"], float(case["eps"]))
    dx, _, _ = backward.layer_norm_backward(case["dy"], cache)
    problem = mismatch(output["dx"], dx, dtype=x.dtype, what="dx")
    if problem is None:
        return None
    hint = _first_hint(output["dx"], _ln_dx_mistakes(case), x.dtype)
    evidence = _fd_evidence(_ln_loss, case, "x", "dx", output["dx"], dx)
    return _with_hint(problem + evidence, hint)


def _param_mistakes(case, x_hat, name, has_beta):
    """Wrong dgamma (name="dgamma") or dbeta formulas that still have shape (d,)."""
    c = _float64(case)
    dy = c["dy"]
    right = _token_sum(dy * x_hat) if name == "dgamma" else _token_sum(dy)
    n_tokens = dy.size // dy.shape[-1]
    mistakes = {f"{name} is a sum over tokens, not an average": right / n_tokens}
    if has_beta:
        mistakes["dgamma and dbeta are swapped"] = (
            _token_sum(dy) if name == "dgamma" else _token_sum(dy * x_hat))
    if name == "dgamma":
        mistakes.update({
            "dgamma multiplies dy by x_hat (the normalized input), not by x":
                _token_sum(dy * c["x"]),
            "dgamma is the sum of dy * x_hat; gamma itself does not appear in it":
                _token_sum(dy * x_hat * c["gamma"]),
        })
    return mistakes


def _judge_param(output, case, name, expected, x_hat, loss, key, has_beta=True):
    x = case["x"]
    actual = output[name]
    problem = mismatch(actual, expected, dtype=x.dtype, what=name)
    if problem is None:
        return None
    hint = _axis_hint(actual, x, name) if np.shape(actual) != expected.shape else (
        _first_hint(actual, _param_mistakes(case, x_hat, name, has_beta), x.dtype))
    return _with_hint(problem + _fd_evidence(loss, case, key, name, actual, expected), hint)


def _judge_ln_params(case, output):
    x = case["x"]
    _, cache = backward.layer_norm_forward(x, case["gamma"], case["beta"], float(case["eps"]))
    _, dgamma, dbeta = backward.layer_norm_backward(case["dy"], cache)
    _, _, _, x_hat = _ln_parts(case)
    return (_judge_param(output, case, "dgamma", dgamma, x_hat, _ln_loss, "gamma")
            or _judge_param(output, case, "dbeta", dbeta, x_hat, _ln_loss, "beta"))


# ---------------------------------------------------------------- RMSNorm backward

def _rms_parts(case):
    c = _float64(case)
    mean_square = (c["x"] ** 2).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(mean_square + float(case["eps"]))
    return c, mean_square, rstd, c["x"] * rstd


def _rms_dx_mistakes(case):
    c, mean_square, rstd, x_hat = _rms_parts(case)
    g = c["dy"] * c["gamma"]

    def avg(v):
        return v.mean(axis=-1, keepdims=True)

    def dx_from(g, rstd=rstd):
        return rstd * (g - x_hat * avg(g * x_hat))

    return {
        "dx is missing the -x_hat * mean(g * x_hat) term: rstd depends on x "
        "through mean(x^2), and that path carries gradient too": rstd * g,
        "RMSNorm subtracts no mean, so its dx has no -mean(g) term (that one is "
        "layer norm's)": rstd * (g - avg(g) - x_hat * avg(g * x_hat)),
        "the gradient reaching x_hat is g = dy * gamma: dy passes through gamma "
        "before it reaches x_hat": dx_from(c["dy"]),
        "dx ends with a factor rstd = 1 / sqrt(mean(x^2) + eps)": dx_from(g, 1.0),
        "rstd includes eps: 1 / sqrt(mean(x^2) + eps)": dx_from(g, 1.0 / np.sqrt(mean_square)),
        "the sign of dx is flipped": -dx_from(g),
    }


def _judge_rms(case, output):
    x = case["x"]
    dx, dgamma = backward.rms_norm_backward(case["dy"], x, case["gamma"], float(case["eps"]))
    problem = mismatch(output["dx"], dx, dtype=x.dtype, what="dx")
    if problem:
        hint = _first_hint(output["dx"], _rms_dx_mistakes(case), x.dtype)
        evidence = _fd_evidence(_rms_loss, case, "x", "dx", output["dx"], dx)
        return _with_hint(problem + evidence, hint)
    _, _, _, x_hat = _rms_parts(case)
    return _judge_param(output, case, "dgamma", dgamma, x_hat, _rms_loss, "gamma",
                        has_beta=False)


CHECKS = {
    "backward_ln_forward_cache": Check(_forward_cases, _judge_forward),
    "backward_ln_dx": Check(_ln_backward_cases, _judge_ln_dx),
    "backward_ln_params": Check(_ln_params_cases, _judge_ln_params),
    "backward_rms": Check(_rms_cases, _judge_rms),
}
