"""Unit 04 checks, the grader-facing half: inputs, references, diagnoses.

Every verdict compares with normref.backward at the tolerance table's
precision, except BatchNorm's (over vectors and over images), which compare with
torch's autograd through F.batch_norm in float64. When a gradient is wrong, the
message also quotes a centred finite difference of the loss sum(dy * y) at the
worst entry: evidence the student can reproduce without trusting the reference.
"""

import re

import numpy as np

from normref import backward, batchnorm, recipe
from normref.checks._registry import Check
from normref.checks.tolerances import matches
from normref.checks.tolerances import mismatch as _table_mismatch

EXAMPLE_A = np.array([2.0, 4.0, 6.0, 8.0])
FD_STEP = 1e-5  # centred differences in float64: error ~1e-10 relative
# Seconds one call of a backward pass may take on a check's large case: 65,536
# values that all share their statistics (one token of 65,536 features, one group,
# one column), so that no shortcut batches independent tokens. A closed form takes
# milliseconds there, and under a second in plain Python loops. Numerical
# differentiation needs a forward pass of 65,536 values per input value, 65,536 of
# them, and takes minutes; a per-token Jacobian has 65,536 x 65,536 entries (34 GB
# in float64), more memory than the grader gives.
TIME_BUDGET = 5.0
LARGE = 65536


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


def _random_case(rng, shape, loc=0.0, scale=1.0, dtype=np.float64, eps=1e-5):
    d = shape[-1]
    return _case(rng.normal(loc, scale, size=shape).astype(dtype),
                 rng.normal(1.0, 0.5, size=d), rng.normal(size=d), eps=eps, rng=rng)


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
        ("eps = 0.1, not 1e-5: values of size 0.1, (3, 8), where eps is most of "
         "mean(x^2) + eps", _random_case(rng, (3, 8), 0.0, 0.1, eps=0.1)),
    ]


def _rms_params_cases(rng):
    """Batches first: a sum over axis 0 alone then fails on a 3-D batch."""
    cases = _rms_cases(rng)
    return cases[1:] + cases[:1]


def _rms_large(rng):
    return _large("one token of 65,536 features, (1, 65536)", _random_case(rng, (1, LARGE)))


def _rms_large_3d(rng):
    return _large("one token of 65,536 features, 3-D (1, 1, 65536)",
                  _random_case(rng, (1, 1, LARGE)))


# ---------------------------------------------------------------- rules every backward obeys

def _sharing(case, what):
    """How many of the case's values share one set of statistics: a token's
    features, a group's values, a column's examples."""
    x = case["x"]
    if "num_groups" in case:
        return x[0].size // int(case["num_groups"])
    # BatchNorm: one channel's values, x.shape[0] of them in (N, D), N * H * W in images
    return x.size // x.shape[1] if what.startswith("batch_norm") else x.shape[-1]


def _within_budget(judge, what):
    """`judge`, after refusing a call on the large case that ran past its budget
    (the probe stops it there and says so) or ran out of memory."""
    def judged(case, output):
        if "time_budget" in case:
            budget = float(case["time_budget"])
            seconds = float(np.asarray(output.get("seconds", np.inf)))
            size, shared = case["x"].size, _sharing(case, what)
            values = (f"these {size:,} values, which all share their statistics"
                      if shared == size else
                      f"these {size:,} values, {shared:,} of which share each statistic")
            if "out_of_memory" in output:
                return (f"{what} ran out of memory on {values} "
                        f"({str(np.asarray(output['out_of_memory']))[:200]}). A Jacobian of "
                        f"{shared:,} values by {shared:,} is {shared ** 2 * 8 / 1e9:.3g} GB "
                        "in float64, far past the grader's memory; a closed-form backward "
                        "needs a few arrays of the input's size: derive the gradient")
            if "stopped" in output or not seconds <= budget:  # NaN fails too
                taken = (f"was stopped after {budget:g} s" if "stopped" in output
                         else f"took {seconds:.1f} s")
                return (f"{what} {taken} on {values}, past the {budget:g} s a backward "
                        "pass may take here. A closed-form backward takes milliseconds "
                        "(under a second even in Python loops); numerical "
                        f"differentiation needs {shared:,} forward passes of them, one "
                        "per input value, and takes minutes, and a per-token Jacobian has "
                        f"{shared:,} x {shared:,} entries: the exercise rules both out, "
                        "derive the gradient")
        return _real_only(judge)(case, output)
    return judged


def _real_only(judge):
    """`judge`, after refusing complex numbers: every input is real, so is every
    gradient, and a complex result is a sign of complex-step differentiation."""
    def judged(case, output):
        for key, value in output.items():
            if np.iscomplexobj(np.asarray(value)):
                return (f"{key} holds complex numbers ({np.asarray(value).dtype}); every "
                        "input is real, and so is every gradient. Return real arrays, from "
                        "a closed-form backward (complex-step differentiation is "
                        "numerical differentiation, which the exercise rules out)")
        return judge(case, output)
    return judged


def _large(label, case):
    """A large batch that every backward check ends with: the call must finish
    within TIME_BUDGET seconds."""
    return (f"{label}, within {TIME_BUDGET:g} s",
            {**case, "time_budget": np.array(TIME_BUDGET)})


# ---------------------------------------------------------------- helpers

def mismatch(actual, expected, *, dtype, what="your result"):
    """The tolerance table's verdict, which first names a float64 input answered in
    a narrower float (a float32 result cannot reach float64's tolerance)."""
    problem = _table_mismatch(actual, expected, dtype=dtype, what=what)
    kind = np.asarray(actual).dtype
    if (problem and np.dtype(dtype) == np.float64 and np.issubdtype(kind, np.floating)
            and kind.itemsize < 8):
        return (f"your {what} is {kind.name}, though the input is float64: compute in "
                f"float64, as the exercise asks; {kind.name} carries too few digits for "
                f"float64's tolerance ({problem})")
    return problem


DEFAULT_EPS = 1e-5


def _names_fixed_eps(judge):
    """`judge`, whose verdict on a case whose eps is not DEFAULT_EPS also says when
    the answer is right for eps = DEFAULT_EPS: the eps argument was ignored."""
    def judged(case, output):
        problem = judge(case, output)
        if not problem or "eps" not in case or float(case["eps"]) == DEFAULT_EPS:
            return problem
        if judge({**case, "eps": np.array(DEFAULT_EPS)}, output) is None:
            return (f"{problem}. Hint: this case's eps is {float(case['eps']):g}, and your "
                    f"answer is the right one for eps = {DEFAULT_EPS:g}: use the eps "
                    "argument you are given, not a hard-coded 1e-5")
        return problem
    return judged

def _float64(case):
    """Float64 copies of the case's arrays: the finite differences perturb them, and a
    case's arrays (EXAMPLE_A among them) must come out of a verdict unchanged."""
    return {key: np.array(value, dtype=np.float64) for key, value in case.items()}


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


def _fd_evidence(loss, case, key, name, yours, expected, loss_name="sum(dy * y)"):
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
    return (f". A centred finite difference of {loss_name} (h = {FD_STEP:g}) puts "
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
        "dx treats rstd as a constant: rstd depends on every x_j through "
        "mean(x^2), and that path adds a term of its own": rstd * g,
        "RMSNorm subtracts no mean: no path runs through a mean, so no term of dx "
        "comes from one": rstd * (g - avg(g) - x_hat * avg(g * x_hat)),
        "the gradient reaching x_hat is g = dy * gamma: dy passes through gamma "
        "before it reaches x_hat": dx_from(c["dy"]),
        "dx ends with a factor rstd = 1 / sqrt(mean(x^2) + eps)": dx_from(g, 1.0),
        "rstd includes eps: 1 / sqrt(mean(x^2) + eps)": dx_from(g, 1.0 / np.sqrt(mean_square)),
        "the sign of dx is flipped": -dx_from(g),
    }


def _rms_dx_extra_mistakes(case):
    """Slips of the derivation's arithmetic: d - 1 for d, a doubled factor."""
    c, mean_square, rstd, x_hat = _rms_parts(case)
    d = c["x"].shape[-1]
    g = c["dy"] * c["gamma"]

    def avg(v):
        return v.mean(axis=-1, keepdims=True)

    unbiased = 1.0 / np.sqrt(mean_square * d / max(d - 1, 1) + float(case["eps"]))
    return {
        "mean(x^2) divides by d, the number of features, not d - 1 (RMSNorm has "
        "no mean to lose a degree of freedom to)":
            unbiased * (g - c["x"] * unbiased * avg(g * c["x"] * unbiased)),
        "the derivative of mean(x^2) with respect to x_j is 2 x_j / d, and the "
        "power -1/2 halves it again: the 2s cancel":
            rstd * (g - 2 * x_hat * avg(g * x_hat)),
    }


def _judge_rms_dx(case, output):
    x = case["x"]
    dx, _ = backward.rms_norm_backward(case["dy"], x, case["gamma"], float(case["eps"]))
    problem = mismatch(output["dx"], dx, dtype=x.dtype, what="dx")
    if problem is None:
        return None
    hint = _first_hint(output["dx"], {**_rms_dx_mistakes(case),
                                      **_rms_dx_extra_mistakes(case)}, x.dtype)
    evidence = _fd_evidence(_rms_loss, case, "x", "dx", output["dx"], dx)
    return _with_hint(problem + evidence, hint)


def _dx_dot_x_case(row_loss, mean_square, eps):
    return {"row_loss": np.array(row_loss), "mean_square": np.array(mean_square),
            "eps": np.array(eps)}


def _dx_dot_x_cases(rng):
    return [
        ("row_loss = 1, mean(x^2) = 4, eps = 1e-5", _dx_dot_x_case(1.0, 4.0, 1e-5)),
        ("row_loss = -2.5, mean(x^2) = 3e-6, eps = 1e-5 (a tiny token, where eps matters)",
         _dx_dot_x_case(-2.5, 3e-6, 1e-5)),
        ("row_loss = 3, mean(x^2) = 0.5, eps = 0.5", _dx_dot_x_case(3.0, 0.5, 0.5)),
        ("row_loss = 0.7, mean(x^2) = 2, eps = 0", _dx_dot_x_case(0.7, 2.0, 0.0)),
        ("a random token's numbers",
         _dx_dot_x_case(rng.normal(), rng.uniform(0.1, 10.0), rng.uniform(1e-3, 1.0))),
    ]


def _judge_dx_dot_x(case, output):
    row_loss, ms, eps = (float(case[key]) for key in ("row_loss", "mean_square", "eps"))
    right = backward.rms_dx_dot_x(row_loss, ms, eps)
    yours = np.asarray(output["dot"])
    if yours.size != 1 or not np.issubdtype(yours.dtype, np.number):
        return (f"dx_dot_x gave an array of shape {yours.shape}; it should give one "
                "number, the sum over the token's features")
    yours = float(yours.reshape(()))
    if abs(yours - right) <= 1e-6 * abs(right) + 1e-12 * abs(row_loss):
        return None
    rstd = 1.0 / np.sqrt(ms + eps)
    hints = {
        "that is the value when eps = 0; with eps > 0, stretching the token changes "
        "y a little, and sum(dx * x) measures how much": 0.0,
        "that is sum(dx * x_hat); x = x_hat / rstd": right * rstd,
        "as eps goes to 0 your value goes to sum(dy * y): does stretching the token "
        "still change y when eps = 0?": row_loss * ms / (ms + eps),
        "divide by mean(x^2) + eps, not by mean(x^2) alone": row_loss * eps / ms if ms else 0.0,
        "check the sign: stretching the token a little moves y along y itself, "
        "not against it": -right,
    }
    hint = next((words for words, wrong in hints.items()
                 if abs(yours - wrong) <= 1e-6 * abs(wrong) + 1e-12 * abs(row_loss)
                 and abs(wrong - right) > 1e-6 * abs(right) + 1e-12 * abs(row_loss)), None)
    return _with_hint(f"dx_dot_x gave {yours:.6g}; that is not RMSNorm's sum(dx * x) for "
                      "this token", hint)


def _judge_rms_dgamma(case, output):
    x = case["x"]
    _, dgamma = backward.rms_norm_backward(case["dy"], x, case["gamma"], float(case["eps"]))
    _, _, _, x_hat = _rms_parts(case)
    return _judge_param(output, case, "dgamma", dgamma, x_hat, _rms_loss, "gamma",
                        has_beta=False)


# ---------------------------------------------------------------- GroupNorm backward

def _gn_case(rng, shape, num_groups, loc=0.0, scale=1.0, dtype=np.float64, eps=1e-5):
    channels = shape[1]
    return {
        "x": rng.normal(loc, scale, size=shape).astype(dtype),
        "num_groups": np.array(num_groups),
        "gamma": rng.normal(1.0, 0.5, size=channels).astype(dtype),
        "beta": rng.normal(size=channels).astype(dtype),
        "dy": rng.normal(size=shape).astype(dtype),
        "eps": np.array(eps),
    }


def _random_gn_shape(rng):
    """(N, C, *positions) with C = groups * channels per group, each >= 2."""
    num_groups = int(rng.integers(2, 4))
    channels = num_groups * int(rng.integers(2, 4))
    positions = tuple(int(n) for n in rng.integers(2, 6, size=int(rng.integers(1, 3))))
    return (int(rng.integers(1, 4)), channels) + positions, num_groups


def _gn_cases(rng):
    shape, groups = _random_gn_shape(rng)
    other_shape, other_groups = _random_gn_shape(rng)
    two_per_group = _gn_case(rng, (2, 4), 2)
    return [
        (f"a random shape {shape}, {groups} groups", _gn_case(rng, shape, groups, 1.0, 2.0)),
        (f"a random shape {other_shape}, {other_groups} groups",
         _gn_case(rng, other_shape, other_groups)),
        ("x of shape (2, 4), 2 groups of 2 values, no positions", two_per_group),
        ("1 group, shape (2, 6, 4): layer norm over channels and positions",
         _gn_case(rng, (2, 6, 4), 1)),
        ("as many groups as channels, shape (2, 3, 5): instance norm",
         _gn_case(rng, (2, 3, 5), 3)),
        ("a 4-D input (2, 6, 3, 3), 3 groups, values near 100",
         _gn_case(rng, (2, 6, 3, 3), 3, 100.0)),
        ("groups of a single value, shape (3, 4), 4 groups", _gn_case(rng, (3, 4), 4)),
        ("a float32 input (2, 8, 6), 4 groups", _gn_case(rng, (2, 8, 6), 4, dtype=np.float32)),
        ("eps = 0.1, not 1e-5: values of spread 0.1, (2, 6, 4), 3 groups, where eps "
         "is most of var + eps", _gn_case(rng, (2, 6, 4), 3, 0.0, 0.1, eps=0.1)),
    ]


def _gn_params_cases(rng):
    """Inputs with positions first: a sum over the wrong axes then shows in the shape."""
    cases = _gn_cases(rng)
    return cases[:2] + cases[3:] + cases[2:3]


def _gn_large(rng):
    return _large("one example (1, 16, 4096), 2 groups of 32,768 values",
                  _gn_case(rng, (1, 16, LARGE // 16), 2))


def _gn_loss(c):
    y = batchnorm.group_norm(c["x"], int(c["num_groups"]), c["gamma"], c["beta"],
                             float(c["eps"]))
    return float(np.sum(c["dy"] * y))


def _grouped(values, num_groups, interleaved=False):
    """(N, C, *) -> (N, G, M): consecutive channels per group, or every G-th."""
    n, channels = values.shape[:2]
    if interleaved:  # channel c in group c % G
        values = values.reshape((n, channels // num_groups, num_groups) + values.shape[2:])
        values = np.moveaxis(values, 2, 1)
    return values.reshape(n, num_groups, -1)


def _ungrouped(values, shape, num_groups, interleaved=False):
    if not interleaved:
        return values.reshape(shape)
    n, channels = shape[:2]
    values = values.reshape((n, num_groups, channels // num_groups) + shape[2:])
    return np.moveaxis(values, 1, 2).reshape(shape)


def _gn_dx_variant(case, num_groups=None, interleaved=False, ddof=0, mean_term=True,
                   projection_term=True, use_gamma=True, gamma_outside=False):
    """GroupNorm's dx, or one of its wrong variants; gamma_outside multiplies the
    group's bracket by gamma afterwards, instead of putting it into g first."""
    c = _float64(case)
    x, eps = c["x"], float(case["eps"])
    num_groups = int(case["num_groups"]) if num_groups is None else num_groups
    per_channel = (x.shape[1],) + (1,) * (x.ndim - 2)
    gamma = c["gamma"].reshape(per_channel)
    g = c["dy"] * gamma if use_gamma and not gamma_outside else c["dy"]
    xg = _grouped(x, num_groups, interleaved)  # N, G, M
    gg = _grouped(g, num_groups, interleaved)  # N, G, M
    size = xg.shape[-1]
    mean = xg.mean(axis=-1, keepdims=True)
    var = ((xg - mean) ** 2).sum(axis=-1, keepdims=True) / max(size - ddof, 1)
    rstd = 1.0 / np.sqrt(var + eps)
    x_hat = (xg - mean) * rstd
    dx = gg.copy()
    if mean_term:
        dx = dx - gg.mean(axis=-1, keepdims=True)
    if projection_term:
        dx = dx - x_hat * (gg * x_hat).mean(axis=-1, keepdims=True)
    dx = _ungrouped(rstd * dx, x.shape, num_groups, interleaved)
    return dx * gamma if gamma_outside else dx


def _gn_dx_mistakes(case):
    x = case["x"]
    variants = {
        "dx is missing the -mean(g) term: each group's mean depends on every value "
        "in the group": {"mean_term": False},
        "dx is missing the -x_hat * mean(g * x_hat) term: each group's rstd depends "
        "on its values too": {"projection_term": False},
        "dx is missing both correction terms": {"mean_term": False, "projection_term": False},
        "the gradient reaching x_hat is g = dy * gamma, gamma taken per channel":
            {"use_gamma": False},
        "gamma multiplies dy before the group's means, g = dy * gamma, not the "
        "result after them: a group's channels have different gammas, so gamma does "
        "not factor out of mean(g) and mean(g * x_hat) as one number would":
            {"gamma_outside": True},
        "a group is num_channels / num_groups consecutive channels (channels 0 to "
        "C/G - 1 form group 0), as in torch's GroupNorm, not every G-th channel":
            {"interleaved": True},
        "the statistics belong to each group, not to each channel": {
            "num_groups": x.shape[1]},
        "the statistics belong to each group, not to the whole example": {"num_groups": 1},
        "the variance is the biased one: divide by the group's size M, not M - 1":
            {"ddof": 1},
    }
    mistakes = {}
    for hint, options in variants.items():
        if options.get("num_groups") == int(case["num_groups"]):
            continue  # the same as the right answer on this case
        with np.errstate(all="ignore"):
            mistakes[hint] = _gn_dx_variant(case, **options)
    mistakes["the sign of dx is flipped"] = -_gn_dx_variant(case)
    return mistakes


def _gn_reference(case):
    return backward.group_norm_backward(case["dy"], case["x"], int(case["num_groups"]),
                                        case["gamma"], float(case["eps"]))


def _judge_gn_dx(case, output):
    x = case["x"]
    dx, _, _ = _gn_reference(case)
    problem = mismatch(output["dx"], dx, dtype=x.dtype, what="dx")
    if problem is None:
        return None
    hint = _first_hint(output["dx"], _gn_dx_mistakes(case), x.dtype)
    evidence = _fd_evidence(_gn_loss, case, "x", "dx", output["dx"], dx)
    return _with_hint(problem + evidence, hint)


def _gn_x_hat(case):
    c = _float64(case)
    return batchnorm.group_norm(c["x"], int(case["num_groups"]), eps=float(case["eps"]))


def _gn_param_hint(actual, case, name, expected):
    x = case["x"]
    shape = np.shape(actual)
    if shape != expected.shape:
        if len(shape) == 1 and shape[0] == x.shape[-1] != x.shape[1]:
            return (f"{name} has one entry per channel, and the channels are axis 1, "
                    f"not the last axis")
        return (f"{name} has one entry per channel (axis 1): sum over the examples "
                f"(axis 0) and over every position (axes 2 and up)")
    c = _float64(case)
    x_hat = _gn_x_hat(case)
    not_channels = (0,) + tuple(range(2, x.ndim))
    count = x.size // x.shape[1]
    right = (c["dy"] * x_hat if name == "dgamma" else c["dy"]).sum(axis=not_channels)
    candidates = {
        f"{name} is a sum over examples and positions, not an average": right / count,
        "dgamma and dbeta are swapped": (
            c["dy"].sum(axis=not_channels) if name == "dgamma"
            else (c["dy"] * x_hat).sum(axis=not_channels)),
    }
    if name == "dgamma":
        candidates["dgamma multiplies dy by x_hat (the normalized input), not by x"] = (
            c["dy"] * c["x"]).sum(axis=not_channels)
        candidates["x_hat uses the group's statistics, not each channel's"] = (
            c["dy"] * batchnorm.group_norm(c["x"], x.shape[1], eps=float(case["eps"]))
        ).sum(axis=not_channels)
    return _first_hint(actual, candidates, x.dtype)


def _params_verdict(case, output, reference, param_hint, loss):
    """The first of dgamma, dbeta that differs from `reference`'s, with its hint and a
    centred-difference value; None when both agree."""
    x = case["x"]
    _, dgamma, dbeta = reference(case)
    for name, expected, key in (("dgamma", dgamma, "gamma"), ("dbeta", dbeta, "beta")):
        problem = mismatch(output[name], expected, dtype=x.dtype, what=name)
        if problem:
            hint = param_hint(output[name], case, name, expected)
            evidence = _fd_evidence(loss, case, key, name, output[name], expected)
            return _with_hint(problem + evidence, hint)
    return None


def _judge_gn_params(case, output):
    return _params_verdict(case, output, _gn_reference, _gn_param_hint, _gn_loss)


# ---------------------------------------------------------------- BatchNorm backward

def _bn_case(rng, shape, loc=0.0, scale=1.0, dtype=np.float64, eps=1e-5):
    features = shape[1]
    return {
        "x": rng.normal(loc, scale, size=shape).astype(dtype),
        "gamma": rng.normal(1.0, 0.5, size=features).astype(dtype),
        "beta": rng.normal(size=features).astype(dtype),
        "dy": rng.normal(size=shape).astype(dtype),
        "eps": np.array(eps),
    }


def _bn_cases(rng):
    return [
        ("a batch of 4 examples, 3 features, x of shape (4, 3)", _bn_case(rng, (4, 3))),
        ("a batch (16, 8) whose features have mean 3", _bn_case(rng, (16, 8), 3.0, 2.0)),
        ("two examples, shape (2, 5)", _bn_case(rng, (2, 5), 1.0)),
        ("a square batch (6, 6)", _bn_case(rng, (6, 6), -2.0)),
        ("a tiny spread, 0.001 * N(0, 1), shape (5, 4), where eps matters",
         _bn_case(rng, (5, 4), 0.0, 0.001)),
        ("values near 100, shape (8, 4)", _bn_case(rng, (8, 4), 100.0)),
        ("a float32 batch (32, 16)", _bn_case(rng, (32, 16), 1.0, dtype=np.float32)),
        ("eps = 0.1, not 1e-5: values of spread 0.1, shape (6, 4), where eps is most "
         "of var + eps", _bn_case(rng, (6, 4), 0.0, 0.1, eps=0.1)),
    ]


def _bn_params_cases(rng):
    """Non-square batches first: a sum over the wrong axis then shows in the shape."""
    cases = _bn_cases(rng)
    return cases[1:] + cases[:1]


def _bn_large(rng):
    return _large("one feature over a batch of 65,536 examples, (65536, 1)",
                  _bn_case(rng, (LARGE, 1), 1.0))


def _bn_torch_reference(case):
    """(dx, dgamma, dbeta) from torch's autograd through F.batch_norm in training
    mode, in float64: a reference independent of normref.backward."""
    import torch
    import torch.nn.functional as F

    c = _float64(case)
    x, gamma, beta = (torch.tensor(c[key], requires_grad=True)
                      for key in ("x", "gamma", "beta"))
    with torch.enable_grad():
        y = F.batch_norm(x, None, None, gamma, beta, training=True, eps=float(case["eps"]))
        y.backward(torch.from_numpy(c["dy"]))
    return x.grad.numpy(), gamma.grad.numpy(), beta.grad.numpy()


def _bn_loss(c):
    y, _, _ = batchnorm.batch_norm(c["x"], c["gamma"], c["beta"], None, None, True,
                                   eps=float(c["eps"]))
    return float(np.sum(c["dy"] * y))


def _bn_x_hat(x, eps, axis=0, ddof=0):
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).sum(axis=axis, keepdims=True) / max(x.shape[axis] - ddof, 1)
    return (x - mean) / np.sqrt(var + eps), 1.0 / np.sqrt(var + eps)


def _bn_dx_mistakes(case):
    c = _float64(case)
    x, eps, dy = c["x"], float(case["eps"]), c["dy"]
    n = x.shape[0]
    g = dy * c["gamma"]
    x_hat, rstd = _bn_x_hat(x, eps)

    def avg(v, axis=0):
        return v.mean(axis=axis, keepdims=True)

    def dx_from(g, rstd=rstd, x_hat=x_hat, axis=0):
        return rstd * (g - avg(g, axis) - x_hat * avg(g * x_hat, axis))

    right = dx_from(g)
    dvar = -0.5 * rstd**3 * (g * (x - avg(x))).sum(axis=0, keepdims=True)
    x_hat_u, rstd_u = _bn_x_hat(x, eps, ddof=1)
    x_hat_ln, rstd_ln = _bn_x_hat(x, eps, axis=-1)
    with np.errstate(all="ignore"):
        unbiased_exact = rstd_u * (g - avg(g) - x_hat_u * (g * x_hat_u).sum(
            axis=0, keepdims=True) / max(n - 1, 1))
    return {
        "dx is missing the -mean(g) term: the batch mean depends on every example, "
        "so it cannot be treated as a constant (mean(g) is taken over the batch)":
            rstd * (g - x_hat * avg(g * x_hat)),
        "dx is missing the -x_hat * mean(g * x_hat) term: the variance (and so rstd) "
        "depends on every example, so it cannot be treated as a constant":
            rstd * (g - avg(g)),
        "dx treats the mean and the variance as constants: both depend on every "
        "example of the batch, and each adds a term": rstd * g,
        "the variance is the biased one, divided by N (np.var's default, "
        "torch.var(..., correction=0)), not by N - 1": unbiased_exact,
        "the variance is the biased one, divided by N, not by N - 1 (x_hat and rstd "
        "are off)": dx_from(g, rstd_u, x_hat_u),
        "var = mean(x^2) - mean^2 depends on x through the mean too: its local "
        "gradient is 2 (x - mean) / N, not 2 x / N":
            right + dvar * 2 * avg(x) / n,
        "BatchNorm's statistics are per feature over the batch (axis 0), not per "
        "example over the features (that is layer norm)":
            dx_from(g, rstd_ln, x_hat_ln, axis=-1),
        "the gradient reaching x_hat is g = dy * gamma: dy passes through gamma "
        "before it reaches x_hat": dx_from(dy),
        "dx ends with a factor rstd = 1 / sqrt(var + eps)": right / rstd,
        "the sign of dx is flipped": -right,
    }


def _torch_dx_judge(mistakes, loss):
    """A judge of dx against torch's autograd through F.batch_norm, naming the first
    of `mistakes(case)` the answer reproduces, with a centred difference of `loss`."""
    def judge(case, output):
        x = case["x"]
        dx, _, _ = _bn_torch_reference(case)
        problem = mismatch(output["dx"], dx, dtype=x.dtype, what="dx")
        if problem is None:
            return None
        hint = _first_hint(output["dx"], mistakes(case), x.dtype)
        evidence = _fd_evidence(loss, case, "x", "dx", output["dx"], dx)
        return _with_hint(problem + evidence, hint)
    return judge


_judge_bn_dx = _torch_dx_judge(_bn_dx_mistakes, _bn_loss)


def _bn_param_hint(actual, case, name, expected):
    c = _float64(case)
    x, dy, eps = c["x"], c["dy"], float(case["eps"])
    if np.shape(actual) != expected.shape:
        if np.shape(actual) == (x.shape[0],):
            return (f"{name} has one entry per feature: sum over the batch (axis 0), "
                    f"not over the features (axis 1)")
        if np.shape(actual) == x.shape:
            return f"{name} is summed over the batch (axis 0), one number per feature"
        return None
    x_hat, _ = _bn_x_hat(x, eps)
    right = (dy * x_hat if name == "dgamma" else dy).sum(axis=0)
    candidates = {
        f"{name} sums over the batch (axis 0), not over the features (axis 1)":
            (dy * x_hat if name == "dgamma" else dy).sum(axis=1),
        f"{name} is a sum over the batch, not an average": right / x.shape[0],
        "dgamma and dbeta are swapped": (dy.sum(axis=0) if name == "dgamma"
                                         else (dy * x_hat).sum(axis=0)),
    }
    if name == "dgamma":
        candidates.update({
            "dgamma multiplies dy by x_hat (the normalized input), not by x":
                (dy * x).sum(axis=0),
            "the variance is the biased one, divided by N, not by N - 1":
                (dy * _bn_x_hat(x, eps, ddof=1)[0]).sum(axis=0),
            "x_hat uses each feature's statistics over the batch (axis 0), not each "
            "example's over its features": (dy * _bn_x_hat(x, eps, axis=-1)[0]).sum(axis=0),
        })
    with np.errstate(all="ignore"):
        return _first_hint(actual, candidates, x.dtype)


def _judge_bn_params(case, output):
    return _params_verdict(case, output, _bn_torch_reference, _bn_param_hint, _bn_loss)


def _bn_stage_reference(case):
    """The gradient of sum(dy * y) with respect to each value of Exercise 6's
    table (x_hat, var, xc, mean), from torch's autograd in float64 on that
    table's graph: xc's gradient collects both of its uses (x_hat and sq)."""
    import torch

    c = _float64(case)
    x = torch.tensor(c["x"])
    gamma, beta, dy = (torch.from_numpy(c[key]) for key in ("gamma", "beta", "dy"))
    with torch.enable_grad():
        mean = x.mean(dim=0).requires_grad_()
        xc = x - mean
        sq = xc**2
        var = sq.mean(dim=0)
        x_hat = xc / torch.sqrt(var + float(case["eps"]))
        stages = {"x_hat": x_hat, "var": var, "xc": xc, "mean": mean}
        for value in stages.values():
            value.retain_grad()
        (gamma * x_hat + beta).backward(dy)
    return {key: value.grad.numpy() for key, value in stages.items()}


_TABLE_GRAPH = (
    "each value is graded as the table of Exercise 6 computes it (mean = x.mean(axis=0), "
    "xc = x - mean, sq = xc ** 2, var = sq.mean(axis=0), then std, rstd, x_hat): a "
    "value's gradient depends on the graph it sits in, so stages that compute var "
    "another way, as mean(x ** 2) - mean ** 2 say, give xc and mean other gradients")


def _bn_stage_mistakes(case, key):
    """{hint: a wrong gradient for stage `key`} for the usual slips of the walk."""
    c = _float64(case)
    x, dy, eps = c["x"], c["dy"], float(case["eps"])
    n = x.shape[0]
    xc = x - x.mean(axis=0)
    rstd = 1.0 / np.sqrt((xc**2).mean(axis=0) + eps)
    dx_hat = dy * c["gamma"]
    drstd = (dx_hat * xc).sum(axis=0)
    dvar = -0.5 * rstd**3 * drstd
    if key == "x_hat":
        return {"y = gamma * x_hat + beta: the gradient reaching x_hat is dy * gamma, "
                "not dy": dy}
    if key == "var":
        return {
            "that is the gradient of rstd (or of std): var reaches x_hat through std = "
            "sqrt(var + eps) and rstd = 1 / std, and each stage multiplies by its own "
            "local gradient (-1 / std**2, then 0.5 / std)": drstd,
            "grads['var'] is missing the factor 0.5 / std of std = sqrt(var + eps)":
                -rstd**2 * drstd,
            "the sign of grads['var'] is flipped: rstd = 1 / std has local gradient "
            "-1 / std**2": -dvar,
            "var is one number per feature, broadcast over the batch: its gradient is "
            "summed over the batch (axis 0)": -0.5 * rstd**3 * dx_hat * xc,
        }
    if key == "xc":
        return {
            "grads['xc'] holds only the gradient that comes back through x_hat = xc * "
            "rstd; in the table's graph xc is used twice (also by sq = xc ** 2), so it "
            "collects the sum of both, and the one through sq is 2 * xc * grads['var'] / N":
                dx_hat * rstd,
            "grads['xc'] holds only the gradient that comes back through sq = xc ** 2; "
            "xc is also used by x_hat = xc * rstd, and it collects the sum of both":
                2 * xc * dvar / n,
            "var = mean(sq) over the batch: its local gradient is 1 / N, not 1 / (N - 1)":
                dx_hat * rstd + 2 * xc * dvar / max(n - 1, 1),
        }
    if key == "mean":
        right = -(dx_hat * rstd).sum(axis=0)
        return {
            "the sign of grads['mean'] is flipped: xc = x - mean has local gradient -1 "
            "for the mean": -right,
            "mean is one number per feature, broadcast over the batch: its gradient is "
            "summed over the batch (axis 0)": -(dx_hat * rstd + 2 * xc * dvar / n),
            "grads['mean'] is divided by N: the 1 / N belongs to the next stage back "
            "(mean = x.mean(axis=0) hands each example grads['mean'] / N)": right / n,
        }
    return {}


def _per_feature(values, features):
    """Accept one number per feature as shape (D,) or (1, D)."""
    values = np.asarray(values)
    if values.shape == (1, features):
        return values[0]
    return values


def _judge_bn_stages(case, output):
    """The recorded stage gradients, walked back from y: the first wrong one is
    where the walk went astray, so it is the one named."""
    if "grads_problem" in output:
        problem = str(output["grads_problem"])
        dx_right = mismatch(output["dx"], _bn_torch_reference(case)[0],
                            dtype=case["x"].dtype) is None
        return problem + (
            ". Your dx is right, but this part grades the staged walk itself: store "
            "in grads, under each value's name, the gradient that value collected "
            "on the way back" if dx_right else
            ". Store in grads, under each value's name, the gradient that value "
            "collected on the way back")
    x = case["x"]
    reference = _bn_stage_reference(case)
    for key in ("x_hat", "var", "xc", "mean"):
        yours = output[f"grad_{key}"]
        if reference[key].ndim == 1:
            yours = _per_feature(yours, x.shape[1])
        problem = mismatch(yours, reference[key], dtype=x.dtype, what=f"grads[{key!r}]")
        if problem:
            hint = _first_hint(yours, _bn_stage_mistakes(case, key), x.dtype)
            return _with_hint(problem, hint or (_TABLE_GRAPH if key in ("xc", "mean") else None))
    return None


def _on_its_own(judge, exercise, other):
    """`judge`, after refusing a route that ran the student's other route. A call
    stopped past its budget is judged for that alone: the stop may land inside the
    watch on what the call runs, which then reads as replaced."""
    def judged(case, output):
        cut_short = "stopped" in output or "out_of_memory" in output
        if not cut_short and bool(np.asarray(output.get("other_route", False))):
            return (f"this route ran your {other} (or stopped the grader's watch on "
                    f"what it runs): {exercise}")
        return judge(case, output)
    return judged


_STAGED = "Exercise 6 asks for the staged route, each stage's gradient of its own"
_CLOSED = ("Exercise 7 asks for a closed form of its own (it may call your "
           "batch_norm_stages for x_hat and rstd, but not your staged batch_norm_backward)")


# ---------------------------------------------------------------- spatial BatchNorm backward

# BatchNorm2d: x is (N, C, H, W), and a channel's statistics run over the batch and
# every position, the N * H * W values of these axes
BN2D_AXES = (0, 2, 3)


def _bn2d_cases(rng):
    return [
        ("a batch of 4 images, 3 channels of 2 x 5 positions, x of shape (4, 3, 2, 5)",
         _bn_case(rng, (4, 3, 2, 5))),
        ("a batch (2, 4, 3, 3) whose channels have mean 3", _bn_case(rng, (2, 4, 3, 3), 3.0, 2.0)),
        ("images of one pixel, shape (6, 3, 1, 1): Exercise 6's BatchNorm",
         _bn_case(rng, (6, 3, 1, 1), 1.0)),
        ("one image, shape (1, 3, 4, 4): a batch of one, its positions still share "
         "statistics", _bn_case(rng, (1, 3, 4, 4), -1.0)),
        ("two images of 2 x 6 positions, shape (2, 2, 2, 6)", _bn_case(rng, (2, 2, 2, 6))),
        ("a tiny spread, 0.001 * N(0, 1), shape (2, 3, 2, 2), where eps matters",
         _bn_case(rng, (2, 3, 2, 2), 0.0, 0.001)),
        ("values near 100, shape (3, 2, 3, 4)", _bn_case(rng, (3, 2, 3, 4), 100.0)),
        ("a float32 batch (4, 8, 3, 3)", _bn_case(rng, (4, 8, 3, 3), 1.0, dtype=np.float32)),
        ("eps = 0.1, not 1e-5: values of spread 0.1, shape (2, 3, 2, 2), where eps is "
         "most of var + eps", _bn_case(rng, (2, 3, 2, 2), 0.0, 0.1, eps=0.1)),
    ]


def _bn2d_large(rng):
    return _large("one channel of 4 images of 128 x 128, (4, 1, 128, 128)",
                  _bn_case(rng, (4, 1, 128, 128), 1.0))


def _bn2d_loss(c):
    """sum(dy * y) through normref.batchnorm's forward, the positions flattened."""
    x = c["x"]
    y, _, _ = batchnorm.batch_norm(x.reshape(x.shape[0], x.shape[1], -1), c["gamma"],
                                   c["beta"], None, None, True, eps=float(c["eps"]))
    return float(np.sum(c["dy"] * y.reshape(x.shape)))


def _bn2d_x_hat(x, eps, axes=BN2D_AXES, ddof=0):
    mean = x.mean(axis=axes, keepdims=True)
    size = int(np.prod([x.shape[axis] for axis in axes]))
    var = ((x - mean) ** 2).sum(axis=axes, keepdims=True) / max(size - ddof, 1)
    return (x - mean) / np.sqrt(var + eps), 1.0 / np.sqrt(var + eps)


def _bn2d_dx_variant(case, axes=BN2D_AXES, count=None, ddof=0, mean_term=True,
                     projection_term=True, use_gamma=True):
    """Spatial BatchNorm's dx, or one of its wrong variants: statistics over other
    `axes`, the means in dx divided by another `count`, an unbiased variance, a term
    left out."""
    c = _float64(case)
    x, dy = c["x"], c["dy"]
    x_hat, rstd = _bn2d_x_hat(x, float(case["eps"]), axes, ddof)
    count = int(np.prod([x.shape[axis] for axis in axes])) if count is None else count
    g = dy * c["gamma"].reshape(1, -1, 1, 1) if use_gamma else dy
    dx = g.copy()
    if mean_term:
        dx = dx - g.sum(axis=axes, keepdims=True) / count
    if projection_term:
        dx = dx - x_hat * (g * x_hat).sum(axis=axes, keepdims=True) / count
    return rstd * dx


def _channels_last(values):
    """(N, C, H, W) -> (N * H * W, C): one column per channel."""
    return np.moveaxis(values, 1, -1).reshape(-1, values.shape[1])


def _bn2d_flat_without_moving(case):
    """The 2-D backward run on x.reshape(-1, C), the channel axis left where it was."""
    c = _float64(case)
    x = c["x"]
    flat = [c[key].reshape(-1, x.shape[1]) for key in ("dy", "x")]
    return [grad.reshape(-1) if grad.ndim == 1 else grad.reshape(x.shape) for grad in
            backward.batch_norm_backward(*flat, c["gamma"], float(case["eps"]))]


_WRONG_AXES = ("a channel's statistics run over the batch and every position (axes 0, 2 "
               "and 3: N * H * W values), not over the batch (axis 0) alone, which gives "
               "every position statistics of its own")
_NOT_MOVED = ("x.reshape(-1, C) does not gather each channel's values into a column: the "
              "channels are axis 1 of (N, C, H, W), so move them last first "
              "(np.moveaxis(x, 1, -1).reshape(-1, C)), or take the sums over axes (0, 2, 3)")


def _bn2d_dx_mistakes(case):
    x = case["x"]
    variants = {
        _WRONG_AXES: {"axes": (0,)},
        "the means in dx run over the N * H * W values that share a channel's statistics: "
        "divide the sums by N * H * W, not by N": {"count": x.shape[0]},
        "the statistics run over the batch too (axis 0), not over each image's positions "
        "alone (that is instance norm)": {"axes": (2, 3)},
        "dx is missing the -mean(g) term: a channel's mean depends on every one of its "
        "N * H * W values": {"mean_term": False},
        "dx is missing the -x_hat * mean(g * x_hat) term: a channel's variance (and so "
        "rstd) depends on every one of its values": {"projection_term": False},
        "the variance is the biased one: divide by N * H * W, not N * H * W - 1":
            {"ddof": 1},
        "the gradient reaching x_hat is g = dy * gamma, gamma taken per channel (axis 1)":
            {"use_gamma": False},
    }
    with np.errstate(all="ignore"):
        mistakes = {hint: _bn2d_dx_variant(case, **options)
                    for hint, options in variants.items()}
        mistakes[_NOT_MOVED] = _bn2d_flat_without_moving(case)[0]
        mistakes["the sign of dx is flipped"] = -_bn2d_dx_variant(case)
    return mistakes


_judge_bn2d_dx = _torch_dx_judge(_bn2d_dx_mistakes, _bn2d_loss)


def _bn2d_param_hint(actual, case, name, expected):
    c = _float64(case)
    x, dy, eps = c["x"], c["dy"], float(case["eps"])
    if np.shape(actual) != expected.shape:
        if np.shape(actual) == x.shape[1:]:
            return (f"{name} sums over every position too (axes 2 and 3), not over the "
                    "batch (axis 0) alone: one number per channel")
        return (f"{name} has one entry per channel (axis 1): sum over the batch and every "
                "position, axes (0, 2, 3)")
    x_hat, _ = _bn2d_x_hat(x, eps)
    right = (dy * x_hat if name == "dgamma" else dy).sum(axis=BN2D_AXES)
    candidates = {
        f"{name} is a sum over the batch and the positions, not an average":
            right / (x.size // x.shape[1]),
        "dgamma and dbeta are swapped": (dy.sum(axis=BN2D_AXES) if name == "dgamma"
                                         else (dy * x_hat).sum(axis=BN2D_AXES)),
    }
    if name == "dgamma":
        candidates.update({
            "dgamma multiplies dy by x_hat (the normalized input), not by x":
                (dy * x).sum(axis=BN2D_AXES),
            _WRONG_AXES: (dy * _bn2d_x_hat(x, eps, axes=(0,))[0]).sum(axis=BN2D_AXES),
            "the variance is the biased one: divide by N * H * W, not N * H * W - 1":
                (dy * _bn2d_x_hat(x, eps, ddof=1)[0]).sum(axis=BN2D_AXES),
            _NOT_MOVED: _bn2d_flat_without_moving(case)[1],
        })
    with np.errstate(all="ignore"):
        return _first_hint(actual, candidates, x.dtype)


def _judge_bn2d_params(case, output):
    return _params_verdict(case, output, _bn_torch_reference, _bn2d_param_hint, _bn2d_loss)


# ---------------------------------------------------------------- RMSNorm in autograd

def _rms_function_cases(rng):
    """RMSNorm's cases in float64, the precision gradcheck asks for, each with a
    gradient for rstd (drstd) and the directions u, v of a Hessian-vector product."""
    return [(label, {**case,
                     "drstd": rng.normal(size=case["x"].shape[:-1] + (1,)),
                     "u": rng.normal(size=case["x"].shape),
                     "v": rng.normal(size=case["x"].shape[-1:])})
            for label, case in _rms_cases(rng) if case["x"].dtype == np.float64]


def _rms_function_reference(case):
    """What the probe measures, from torch's autograd through RMSNorm written out
    in float64: y, rstd, first derivatives without and with drstd, and the
    Hessian-vector product."""
    import torch

    c = {key: torch.from_numpy(np.array(case[key], dtype=np.float64))
         for key in ("x", "gamma", "dy", "drstd", "u", "v")}
    eps = float(case["eps"])

    def forward():
        x, gamma = (c[key].clone().requires_grad_() for key in ("x", "gamma"))
        rstd = 1.0 / torch.sqrt((x**2).mean(dim=-1, keepdim=True) + eps)
        return x, gamma, gamma * x * rstd, rstd

    with torch.enable_grad():
        x, gamma, y, rstd = forward()
        dx, dgamma = torch.autograd.grad((y * c["dy"]).sum(), (x, gamma), create_graph=True)
        hx, hgamma = torch.autograd.grad((dx * c["u"]).sum() + (dgamma * c["v"]).sum(),
                                         (x, gamma))
        x, gamma, y2, rstd2 = forward()
        dx_r, dgamma_r = torch.autograd.grad(
            (y2 * c["dy"]).sum() + (rstd2 * c["drstd"]).sum(), (x, gamma))
    return {key: value.detach().numpy() for key, value in dict(
        y=y, rstd=rstd, dx=dx, dgamma=dgamma, dx_r=dx_r, dgamma_r=dgamma_r, hx=hx,
        hgamma=hgamma).items()}


_ONCE_DIFFERENTIABLE = (
    "autograd cannot differentiate your backward: its gradients carry no history "
    "back to x and gamma (computed outside torch, in numpy, on detached tensors, "
    "under no_grad, or marked @once_differentiable). Write backward in torch "
    "operations on the tensors saved on ctx")

_RMS_FUNCTION_STAGES = (  # (the key a stage writes first, what failing there means)
    ("y", "forward raised"),
    ("dx", "backward raised for a loss through y alone"),
    ("dx_r", "backward raised for a loss through y and rstd"),
    ("hx", "second derivatives (autograd differentiating your backward) raised"),
)

_RMS_FUNCTION_HINTS = {
    "y": "forward returns RMSNorm's output y = gamma * x * rstd first",
    "rstd": "forward returns rstd = 1 / sqrt(mean(x^2) + eps), shape (..., 1), second",
    "dx": "backward returns one gradient per input of forward, in its order (x, gamma, "
          "eps), as tensors: dx, dgamma, and None for eps; dx is Exercise 2's formula",
    "dgamma": "dgamma is Exercise 2's, one number per feature, summed over every token",
    "dx_r": "a gradient that reaches rstd, forward's second output, arrives as backward's "
            "drstd and must reach x too: how does rstd move when x_j moves?",
    "dgamma_r": "rstd does not depend on gamma: drstd adds nothing to dgamma",
    "hx": "the first derivatives are right, the second are not. Autograd differentiates "
          "the operations your backward runs, on what forward saved; forward runs with "
          "autograd off, so a tensor it made and did not return (x_hat, say) has no "
          "history and is a constant to it. Save inputs and outputs of forward only",
    "hgamma": "the first derivatives are right, the second (in gamma) are not: does "
              "backward's dx use gamma as saved on ctx, and dgamma the saved x and rstd?",
}


def _judge_rms_function(case, output):
    if "forward_problem" in output:
        return str(np.asarray(output["forward_problem"]))
    if "error" in output:
        stage = next((what for key, what in _RMS_FUNCTION_STAGES if key not in output),
                     "it raised")
        error = str(np.asarray(output["error"]))
        hint = None
        if stage.startswith("second") and ("grad_fn" in error or "once" in error):
            hint = _ONCE_DIFFERENTIABLE
        elif stage.startswith("backward") and "positional argument" in error:
            hint = ("backward receives one gradient per output of forward, "
                    "backward(ctx, dy, drstd)")
        return _with_hint(f"{stage}: {error}", hint)
    expected = _rms_function_reference(case)
    for key, hint in _RMS_FUNCTION_HINTS.items():
        problem = mismatch(output[key], expected[key], dtype=np.float64, what=key)
        if problem:
            if key in ("hx", "hgamma") and not np.any(np.asarray(output[key])):
                hint = _ONCE_DIFFERENTIABLE
            return _with_hint(problem, hint)
    missing = [name for name in ("x", "gamma", "rstd")
               if not bool(np.asarray(output[f"saved_{name}"]))]
    if missing:
        return (f"forward saves on ctx the cache backward works from, x, gamma and the "
                f"rstd it made, with ctx.save_for_backward; {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not there (your forward saved: "
                f"{np.asarray(output['saved'])})")
    return None


# ---------------------------------------------------------------- backward from the output

def _from_output_case(rng, shape, loc=0.0, scale=1.0, dtype=np.float64, beta_loc=0.0,
                      gamma=None):
    """Layer norm's forward on x, and what a memory-efficient backward is given: y and
    rstd (..., 1), with gamma (of both signs, away from 0 unless given) and beta."""
    d = shape[-1]
    x = rng.normal(loc, scale, size=shape)
    if gamma is None:
        gamma = rng.choice([-1.0, 1.0], size=d) * rng.uniform(0.5, 1.5, size=d)
    beta = rng.normal(beta_loc, 1.0, size=d)
    case = _case(x.astype(dtype), gamma, beta, rng=rng)
    c = _float64(case)
    mean = c["x"].mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(c["x"].var(axis=-1, keepdims=True) + DEFAULT_EPS)  # ..., 1
    y = c["gamma"] * (c["x"] - mean) * rstd + c["beta"]
    return {**case, "y": y.astype(dtype), "rstd": rstd.astype(dtype)}


SMALL_GAMMA = {3: 0.0, 10: 2e-6, 20: -4e-6, 30: 3e-5, 40: -2e-4}  # feature: gamma


def _small_gamma_case(rng):
    gamma = rng.choice([-1.0, 1.0], size=64) * rng.uniform(0.5, 1.5, size=64)
    for feature, value in SMALL_GAMMA.items():
        gamma[feature] = value
    return _from_output_case(rng, (4, 64), 1.0, 2.0, gamma=gamma)


def _from_output_cases(rng):
    return [
        ("a batch of 4 tokens, d = 8", _from_output_case(rng, (4, 8), 1.0, 2.0)),
        ("a 3-D batch (2, 3, 16)", _from_output_case(rng, (2, 3, 16))),
        ("one token, d = 6, rstd of shape (1,)", _from_output_case(rng, (6,))),
        ("a 4-D batch (2, 2, 3, 8)", _from_output_case(rng, (2, 2, 3, 8), -1.0, 0.5)),
        ("beta near 100, (3, 16)", _from_output_case(rng, (3, 16), beta_loc=100.0)),
        ("gamma with entries near 0, (4, 64): 0, 2e-6 and -4e-6 (under eps = 1e-5) "
         "at features 3, 10 and 20, 3e-5 and -2e-4 at features 30 and 40",
         _small_gamma_case(rng)),
        ("a float32 batch (4, 32)", _from_output_case(rng, (4, 32), dtype=np.float32)),
    ]


def _from_output_params_cases(rng):
    """Batches of several leading axes first: a sum over axis 0 alone fails there."""
    cases = _from_output_cases(rng)
    return [cases[1], cases[3], cases[0], cases[2]] + cases[4:]


def _from_output_large(rng):
    return _large("one token of 65,536 features, (1, 65536)",
                  _from_output_case(rng, (1, LARGE), 1.0))


def _from_output_reference(case):
    """(dx, dgamma, dbeta) computed from x, exactly: the gradients being approximated."""
    _, cache = backward.layer_norm_forward(_float64(case)["x"], case["gamma"], case["beta"],
                                           DEFAULT_EPS)
    return backward.layer_norm_backward(np.asarray(case["dy"], np.float64), cache)


def _clamp_allowance(case):
    """How far dx and dgamma may land from the exact ones when the x_hat got back at a
    feature with |gamma| < eps lies anywhere between 0 and the true x_hat (the clamp's
    range), through the token's two means that x_hat enters, mean(g * x_hat) and (in a
    staged walk) mean(x_hat). With m = |mean(g * x_hat)|, and delta_g, delta the sums
    over those features of |g_j * x_hat_j| / d and |x_hat_j| / d: per entry of dx,
    rstd * (|x_hat_i| * (delta_g + m at such a feature) + delta * (m + delta_g)); per
    entry of dgamma at such a feature, |exact dgamma_j|: the clamp scales that feature's
    x_hat by one factor in [0, 1], so dgamma_j lies between 0 and the exact one, and an
    x_hat of the wrong sign (a clamp that drops gamma's sign) falls outside. Zero when
    no |gamma| is under eps."""
    c, _, rstd, x_hat = _ln_parts({**case, "eps": np.array(DEFAULT_EPS)})
    g = c["dy"] * c["gamma"]
    under = np.abs(c["gamma"]) < DEFAULT_EPS  # d
    d = x_hat.shape[-1]
    delta_g = (np.abs(g * x_hat) * under).sum(axis=-1, keepdims=True) / d  # ..., 1
    delta = (np.abs(x_hat) * under).sum(axis=-1, keepdims=True) / d  # ..., 1
    m = np.abs((g * x_hat).mean(axis=-1, keepdims=True))  # ..., 1
    dx_room = rstd * (np.abs(x_hat) * (delta_g + m * under)
                      + delta * (m + delta_g)) * under.any()  # ..., d
    dgamma_room = np.abs(_token_sum(c["dy"] * x_hat)) * under  # d
    return dx_room, dgamma_room


def _allowed(actual, expected, room):
    """`expected`, with `actual` in its place wherever `actual` is finite and within
    `room` of it: the comparison that follows then holds the rest to the tolerance."""
    try:
        a = np.asarray(actual, dtype=np.float64)
    except (TypeError, ValueError):
        return expected
    if a.shape != expected.shape or not np.any(room):
        return expected
    with np.errstate(invalid="ignore"):
        inside = np.isfinite(a) & (np.abs(a - expected) <= room * (1 + 1e-6) + 1e-8)
    return np.where((room > 0) & inside, a, expected)


def _from_output_parts(case):
    """Float64 g, rstd and the x_hat a backward gets back from y with gamma
    clamped as Apex clamps it, for the mistakes."""
    c = _float64(case)
    gamma = c["gamma"]
    clamped = np.where(gamma >= 0, np.maximum(gamma, DEFAULT_EPS),
                       np.minimum(gamma, -DEFAULT_EPS))
    rstd = c["rstd"].reshape(c["y"].shape[:-1] + (1,))
    return c, c["dy"] * gamma, rstd, clamped


_NO_CLAMP = ("gamma has entries at or near 0 in this case; dividing y - beta by them "
             "gives inf or nan (0 / 0 where gamma is 0). Divide by gamma clamped to a "
             "magnitude of at least eps = 1e-5, its sign kept, as Apex does")


_UNSIGNED_CLAMP = ("keep gamma's sign when you clamp it: a negative gamma clamped to +eps "
                   "flips the sign of the x_hat you get back (Apex clamps -4e-6 to -1e-5)")


def _from_output_mistakes(case):
    """{hint: a wrong dx} for the usual slips of the backward from y."""
    c, g, rstd, clamped = _from_output_parts(case)

    def avg(v):
        return v.mean(axis=-1, keepdims=True)

    def dx_from(x_hat, g=g):
        return rstd * (g - avg(g) - x_hat * avg(g * x_hat))

    x_hat = (c["y"] - c["beta"]) / clamped
    unsigned = np.maximum(np.abs(c["gamma"]), DEFAULT_EPS)
    return {
        "x_hat is (y - beta) / gamma: y = gamma * x_hat + beta, so subtract beta "
        "before dividing": dx_from(c["y"] / clamped),
        "y = gamma * x_hat + beta: x_hat is y minus beta, divided by gamma, not y "
        "minus beta alone": dx_from(c["y"] - c["beta"]),
        _UNSIGNED_CLAMP: dx_from((c["y"] - c["beta"]) / np.where(
            np.abs(c["gamma"]) < DEFAULT_EPS, unsigned, c["gamma"])),
        "dx is missing the -mean(g) term: the mean depends on every feature":
            rstd * (g - x_hat * avg(g * x_hat)),
        "dx is missing the -x_hat * mean(g * x_hat) term: rstd depends on x too":
            rstd * (g - avg(g)),
        "the gradient reaching x_hat is g = dy * gamma: dy passes through gamma "
        "before it reaches x_hat": dx_from(x_hat, c["dy"]),
        "dx ends with a factor rstd, the one you are given": dx_from(x_hat) / rstd,
        "the sign of dx is flipped": -dx_from(x_hat),
    }


def _judge_from_output_dx(case, output):
    x = case["x"]
    dx, _, _ = _from_output_reference(case)
    actual = output["dx"]
    dx_room, _ = _clamp_allowance(case)
    expected = _allowed(actual, dx, dx_room)
    problem = mismatch(actual, expected, dtype=x.dtype, what="dx")
    if problem is None:
        return None
    try:
        finite = np.all(np.isfinite(np.asarray(actual, dtype=np.float64)))
    except (TypeError, ValueError):
        finite = True
    if not finite and np.any(np.abs(case["gamma"]) < 1e-3):
        return _with_hint(problem, _NO_CLAMP)
    hint = _first_hint(actual, _from_output_mistakes(case), x.dtype)
    if hint is None and np.any(dx_room):
        hint = ("at a feature whose |gamma| is under eps, the x_hat you get back should "
                "lie between 0 and the true one, as the clamp gives it: divide by gamma "
                "clamped to a magnitude of at least eps, its sign kept")
    # quoted where yours is furthest from the allowance-adjusted answer: an entry within
    # the clamp's room is never cited against the unclamped dx
    evidence = _fd_evidence(_ln_loss, {**case, "eps": np.array(DEFAULT_EPS)}, "x", "dx",
                            actual, expected)
    return _with_hint(problem + evidence, hint)


def _judge_from_output_params(case, output):
    x = case["x"]
    c = {**case, "eps": np.array(DEFAULT_EPS)}
    _, dgamma, dbeta = _from_output_reference(case)
    _, _, _, x_hat = _ln_parts(c)
    _, dgamma_room = _clamp_allowance(case)
    for name, expected in (("dgamma", _allowed(output["dgamma"], dgamma, dgamma_room)),
                           ("dbeta", dbeta)):
        problem = mismatch(output[name], expected, dtype=x.dtype, what=name)
        if problem is None:
            continue
        try:
            finite = np.all(np.isfinite(np.asarray(output[name], dtype=np.float64)))
        except (TypeError, ValueError):
            finite = True
        if not finite and np.any(np.abs(case["gamma"]) < 1e-3):
            return _with_hint(problem, _NO_CLAMP)
        if name == "dgamma" and np.shape(output[name]) == dgamma.shape:
            f, _, _, clamped = _from_output_parts(case)
            if matches(output[name], _token_sum(f["dy"] * f["y"] / clamped), dtype=x.dtype):
                return _with_hint(problem, "x_hat is (y - beta) / gamma: subtract beta "
                                  "before dividing")
            unsigned = np.where(np.abs(f["gamma"]) < DEFAULT_EPS, DEFAULT_EPS, f["gamma"])
            if matches(output[name], _token_sum(f["dy"] * (f["y"] - f["beta"]) / unsigned),
                       dtype=x.dtype):
                return _with_hint(problem, _UNSIGNED_CLAMP)
        return _judge_param(output, c, name, expected, x_hat, _ln_loss,
                            "gamma" if name == "dgamma" else "beta")
    return None

# ---------------------------------------------------------------- the running sum behind dgamma

def _bfloat16_values(array):
    """float32 copies of `array` rounded to bfloat16: exact in both dtypes."""
    import torch

    return torch.from_numpy(np.asarray(array, np.float32)).to(torch.bfloat16).float().numpy()


def _running_sum_case(rng, rows, d, correlation=0.0):
    dy = rng.normal(size=(rows, d))
    x_hat = correlation * dy + rng.normal(size=(rows, d))
    return {"dy": _bfloat16_values(dy), "x_hat": _bfloat16_values(x_hat)}


def _running_sum_cases(rng):
    return [
        ("M = 4096 rows of d = 64, dy and x_hat independent", _running_sum_case(rng, 4096, 64)),
        ("M = 1500 rows of d = 48, dy and x_hat correlated (each row adds about 0.5)",
         _running_sum_case(rng, 1500, 48, 0.5)),
    ]


def _sum_error(total, exact):
    """The assignment's relative_error: max|a - b| / max(1e-8, max(|a| + |b|))."""
    return float(np.max(np.abs(total - exact)) / max(1e-8, np.max(np.abs(total) + np.abs(exact))))


_RUNNING_SUM_SLACK = 4  # a running sum rounded another way lands within this factor


def _bf16_products_summed(dy, x_hat, acc_dtype):
    """The slip: each row's products formed in bfloat16 (dy and x_hat are), then
    converted and added to a running sum of acc_dtype."""
    import torch

    total = torch.zeros(dy.shape[-1], dtype=acc_dtype)
    for dy_row, x_hat_row in zip(dy, x_hat):
        total = total + (dy_row * x_hat_row).to(acc_dtype)
    return total


def _judge_running_sum(case, output):
    import torch

    dy, x_hat = (torch.from_numpy(case[key]).to(torch.bfloat16) for key in ("dy", "x_hat"))
    exact = (dy.double() * x_hat.double()).sum(dim=0).numpy()
    for key, dtype, name in (("bf16", torch.bfloat16, "bfloat16"),
                             ("fp32", torch.float32, "float32")):
        yours = np.asarray(output[key])
        call = f"accumulate_rows(dy, x_hat, torch.{name})"
        if not np.issubdtype(yours.dtype, np.number) or yours.shape != exact.shape:
            return (f"{call} gave shape {yours.shape}; it should give {exact.shape}, one "
                    "number per feature: the rows are what is summed (axis 0)")
        error = _sum_error(yours.astype(np.float64), exact)
        reference = _sum_error(backward.running_row_sum(dy, x_hat, dtype).double().numpy(),
                               exact)
        if not np.isfinite(error) or error > _RUNNING_SUM_SLACK * reference:
            slip = _sum_error(_bf16_products_summed(dy, x_hat, dtype).double().numpy(),
                              exact)
            if key == "fp32" and abs(error - slip) <= 0.25 * slip:
                return (f"{call} lands {error:.1e} from the float64 sum, as far as a "
                        "float32 running sum of products formed in bfloat16 lands: "
                        "dy * x_hat of two bfloat16 tensors is rounded to "
                        "bfloat16 before it reaches the sum. Convert dy and x_hat to "
                        "acc_dtype first, then multiply (each product is then exact in "
                        "float32)")
            return (f"{call} lands {error:.1e} from the float64 sum, further than a "
                    f"running sum kept in {name} lands. Is every row added once, its "
                    "product dy * x_hat formed feature by feature?")
        if key == "bf16" and error * _RUNNING_SUM_SLACK < reference:
            return (f"{call} lands {error:.1e} from the float64 sum, much closer than a "
                    "running sum kept in bfloat16 lands: the sum is held wider somewhere. "
                    "torch's .sum() and .cumsum() of bfloat16 tensors add in float32 "
                    "inside and round only at the end; add the rows one at a time into a "
                    "bfloat16 tensor, so that it is rounded after every row")
    return None


def _accumulation_truth():
    """How much further from float64 a bfloat16 running sum of M = 4096 rows lands than
    a float32 one: (a) less than 10 times, (b) 10 to 1e3, (c) 1e3 to 1e6, (d) more."""
    import torch

    case = _running_sum_case(np.random.default_rng(0), 4096, 256)
    dy, x_hat = (torch.from_numpy(case[key]).to(torch.bfloat16) for key in ("dy", "x_hat"))
    exact = (dy.double() * x_hat.double()).sum(dim=0).numpy()
    bf16, fp32 = (_sum_error(backward.running_row_sum(dy, x_hat, dtype).double().numpy(), exact)
                  for dtype in (torch.bfloat16, torch.float32))
    return "abcd"[int(np.searchsorted([10.0, 1e3, 1e6], bf16 / fp32))]


# ---------------------------------------------------------------- inline answers

# "a" followed by a space and a word that is not made of the letters a to d alone,
# nor "and", "or", "nor", is the article ("b (a column)"), not the letter (a)
_ARTICLE = re.compile(r"\ba\s+(?!(?:and|or|nor)\b)(?=[a-z]*[e-z])")


def _letters(text):
    """'(b), C' -> 'bc', '(d) neither' -> 'd', 'b (a column)' -> 'b': the chosen
    letters a to d, sorted, each once, read from the words made of those letters
    alone, the article "a" left out (as the visible checks read them: "and" is a
    word, not an a and a d)."""
    text = _ARTICLE.sub(" ", str(text).lower())
    words = "".join(ch if ch.isalpha() else " " for ch in text).split()
    return "".join(sorted({ch for word in words if set(word) <= set("abcd") for ch in word}))


def _letter_for(first, second):
    """The choice among (a) first only, (b) second only, (c) both, (d) neither."""
    return {(True, False): "a", (False, True): "b", (True, True): "c"}.get(
        (bool(first), bool(second)), "d")


def _rms_zero_truth():
    """With eps = 0: is sum(dx) zero, is dx . x zero, for every token and dy?"""
    rng = np.random.default_rng(0)
    x, dy, gamma = rng.normal(1.0, 2.0, (64, 8)), rng.normal(size=(64, 8)), rng.normal(size=8)
    dx, _ = backward.rms_norm_backward(dy, x, gamma, eps=0.0)
    scale = np.abs(dx).max() * np.abs(x).max() * 8
    return _letter_for(np.all(np.abs(dx.sum(axis=-1)) < 1e-12 * scale),
                       np.all(np.abs((dx * x).sum(axis=-1)) < 1e-12 * scale))


def _gn_zero_sums_truth():
    """Which of four sums of GroupNorm's dx vanish, for random dy (N, C, L)."""
    rng = np.random.default_rng(0)
    x, dy = rng.normal(size=(4, 6, 5)), rng.normal(size=(4, 6, 5))
    dx, _, _ = backward.group_norm_backward(dy, x, 3, rng.normal(1.0, 0.5, 6))
    tiny = 1e-12 * np.abs(dx).max() * dx.size
    sums = {
        "a": dx.sum(axis=2),  # each channel of each example
        "b": dx.reshape(4, 3, -1).sum(axis=2),  # each group of each example
        "c": dx.sum(axis=(1, 2)),  # each example
        "d": dx.sum(axis=(0, 2)),  # each channel over the batch
    }
    return "".join(letter for letter, values in sums.items() if np.all(np.abs(values) < tiny))


def _blind_check_truth():
    """Which wrong dx equals the right one when dy and gamma are all ones?"""
    rng = np.random.default_rng(0)
    case = _gn_case(rng, (2, 6, 5), 3)
    case["dy"], case["gamma"] = np.ones_like(case["x"]), np.ones(6)
    right = _gn_dx_variant(case)
    missed = [np.allclose(_gn_dx_variant(case, **{term: False}), right, atol=1e-12)
              for term in ("mean_term", "projection_term")]
    return _letter_for(*missed)


def _bn_eval_truth():
    """Which sums of BatchNorm's evaluation-mode dx are zero for every dy: (a) over
    the features of each example, (b) over the batch for each feature? Evaluation
    mode normalizes with the running mean and variance, numbers fixed in training."""
    rng = np.random.default_rng(0)
    x, dy = rng.normal(1.0, 2.0, (8, 5)), rng.normal(size=(8, 5))
    gamma = rng.normal(1.0, 0.5, 5)
    running_mean, running_var = rng.normal(size=5), rng.uniform(0.5, 2.0, 5)

    def loss(x):
        y = batchnorm.batch_norm(x, gamma, np.zeros(5), running_mean.copy(),
                                 running_var.copy(), False)[0]
        return float(np.sum(dy * y))

    dx = np.zeros_like(x)  # centred differences: the forward is linear in x
    for index in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[index] += 1e-3
        down[index] -= 1e-3
        dx[index] = (loss(up) - loss(down)) / 2e-3
    tiny = 1e-9 * np.abs(dx).max() * dx.size
    return _letter_for(np.all(np.abs(dx.sum(axis=1)) < tiny),
                       np.all(np.abs(dx.sum(axis=0)) < tiny))


def _switched_off_batch():
    """The batch of Exercise 10's question, as its cell makes it: 3 tokens of d = 6,
    feature 2 switched off (gamma = 0); y and rstd (3, 1) from x, then dy."""
    rng = np.random.default_rng(12)
    x = rng.normal(1.0, 2.0, size=(3, 6))
    gamma, beta = rng.normal(1.0, 0.5, size=6), rng.normal(size=6)
    gamma[2] = 0.0
    dy = rng.normal(size=(3, 6))
    mean = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + DEFAULT_EPS)  # 3, 1
    return x, gamma, beta, dy, gamma * (x - mean) * rstd + beta, rstd


def _switched_off_dgamma():
    """dgamma of the switched-off feature 2, from x: sum over tokens of dy * x_hat."""
    x, _, _, dy, _, rstd = _switched_off_batch()
    x_hat = (x - x.mean(axis=-1, keepdims=True)) * rstd  # 3, 6
    return float((dy[:, 2] * x_hat[:, 2]).sum())


def _judge_dgamma_off(case, output):
    """dgamma_off: dgamma of a gamma = 0 feature, which y and rstd still determine,
    since each token's x_hat adds up to 0 over its features."""
    answer = np.asarray(output["answer"], dtype=np.float64)
    if answer.size != 1 or np.iscomplexobj(output["answer"]):
        return f"store one real number in dgamma_off (yours has shape {answer.shape})"
    answer, truth = float(answer.reshape(())), _switched_off_dgamma()
    if abs(answer - truth) <= 1e-6 * abs(truth):
        return None
    if np.isnan(answer):
        return ("not right yet: y and rstd do determine it. Whatever x was, x_hat has a "
                "property over each token's features that does not need gamma: which?")
    if answer == 0.0:
        return ("not right yet: 0 is what x_hat = 0 at that feature gives, a safe guess, "
                "not the value; each token's x_hat has a property over its features "
                "that pins the missing entry down")
    return f"not right yet: dgamma of feature 2 is not {answer:.6g}"


ONE_LETTER = "one letter"
LETTERS_THAT_APPLY = "the letters that apply"
# {check: (its question, what the answer is, the truth)}
_ANSWERS = {
    "backward_rms_zero_answer": (
        "which quantity is zero for RMSNorm's dx (eps = 0), for every token and every dy",
        ONE_LETTER, _rms_zero_truth),
    "backward_gn_zero_sums_answer": (
        "which sums of GroupNorm's dx are zero for every dy", LETTERS_THAT_APPLY,
        _gn_zero_sums_truth),
    "backward_blind_check_answer": (
        "which wrong dx a gradient check with dy = 1 and gamma = 1 cannot catch",
        ONE_LETTER, _blind_check_truth),
    "backward_bn_eval_answer": (
        "which sums of BatchNorm's evaluation-mode dx are zero for every dy (it "
        "normalizes with the running mean and variance, fixed numbers)",
        ONE_LETTER, _bn_eval_truth),
    "backward_accumulation_answer": (
        "how much further from the float64 sum a running sum kept in bfloat16 lands than "
        "one kept in float32", ONE_LETTER, _accumulation_truth),
}


def _answer_judge(name):
    question, expected, truth = _ANSWERS[name]

    def judge(case, output):
        given = _letters(output["answer"])
        if not given or (expected == ONE_LETTER and len(given) > 1):
            # the visible test's words for an answer left as released, or of two letters
            # where one is asked for
            return f"give your answer: {expected}, from a to d" + (
                f" (you answered {given})" if given else "")
        if given != truth():
            return f"not right yet: {question} (you answered {given})"
        return None

    return judge


def _budgeted(judge, what):
    """`judge`, within its large case's time budget, naming an eps ignored."""
    return _within_budget(_names_fixed_eps(judge), what)


def _and_large(cases, large):
    """cases(rng), then the large case large(rng) last."""
    return lambda rng: cases(rng) + [large(rng)]


CHECKS = {
    "backward_ln_forward_cache": Check(_forward_cases, _judge_forward),
    "backward_ln_dx": Check(_ln_backward_cases, _judge_ln_dx),
    "backward_ln_params": Check(_ln_params_cases, _judge_ln_params),
    "backward_rms_dx": Check(_and_large(_rms_cases, _rms_large),
                             _budgeted(_judge_rms_dx, "rms_norm_backward")),
    "backward_rms_dgamma": Check(_and_large(_rms_params_cases, _rms_large_3d),
                                 _budgeted(_judge_rms_dgamma, "rms_norm_backward")),
    "backward_rms_dx_dot_x": Check(_dx_dot_x_cases, _real_only(_judge_dx_dot_x)),
    "backward_gn_dx": Check(_and_large(_gn_cases, _gn_large),
                            _budgeted(_judge_gn_dx, "group_norm_backward")),
    "backward_gn_params": Check(_and_large(_gn_params_cases, _gn_large),
                                _budgeted(_judge_gn_params, "group_norm_backward")),
    "backward_bn_dx": Check(_and_large(_bn_cases, _bn_large), _on_its_own(_budgeted(
        _judge_bn_dx, "batch_norm_backward"), _STAGED, "batch_norm_2d_backward")),
    "backward_bn_stages": Check(_and_large(_bn_cases, _bn_large), _on_its_own(_budgeted(
        _judge_bn_stages, "batch_norm_backward"), _STAGED, "batch_norm_2d_backward")),
    "backward_bn_params": Check(_and_large(_bn_params_cases, _bn_large), _on_its_own(
        _budgeted(_judge_bn_params, "batch_norm_backward"), _STAGED,
        "batch_norm_2d_backward")),
    "backward_bn2d_dx": Check(_and_large(_bn2d_cases, _bn2d_large), _on_its_own(
        _budgeted(_judge_bn2d_dx, "batch_norm_2d_backward"), _CLOSED,
        "batch_norm_backward")),
    "backward_bn2d_params": Check(_and_large(_bn2d_cases, _bn2d_large), _on_its_own(
        _budgeted(_judge_bn2d_params, "batch_norm_2d_backward"), _CLOSED,
        "batch_norm_backward")),
    "backward_rms_function": Check(_rms_function_cases,
                                   _real_only(_names_fixed_eps(_judge_rms_function))),
    "backward_from_output_dx": Check(
        _and_large(_from_output_cases, _from_output_large),
        _within_budget(_judge_from_output_dx, "layer_norm_backward_from_output")),
    "backward_from_output_params": Check(
        _and_large(_from_output_params_cases, _from_output_large),
        _within_budget(_judge_from_output_params, "layer_norm_backward_from_output")),
    "backward_running_sum": Check(_running_sum_cases, _judge_running_sum),
    "backward_dgamma_off_answer": Check(lambda rng: [("your answer", {})],
                                        _judge_dgamma_off),
    **{name: Check(lambda rng: [("your answer", {})], _answer_judge(name))
       for name in _ANSWERS},
}
