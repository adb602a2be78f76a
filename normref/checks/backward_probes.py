"""Unit 04 checks, the student-facing half: how each exercise is called.

A student's cache is theirs to shape (a dict, a tuple, anything): the backward
probes hand it straight from the student's forward to the student's backward,
so only the resulting arrays travel back to be judged.
"""

from collections.abc import Mapping

import numpy as np

from normref.checks._runner import run_check


def _ln_inputs(case):
    return case["x"].copy(), case["gamma"].copy(), case["beta"].copy(), float(case["eps"])


def _cache_statistics(cache):
    """The cache's "mean" and "rstd", or a note saying why they are not there."""
    if not isinstance(cache, Mapping):
        return {"cache_problem": np.array(
            f"the cache is a {type(cache).__name__}; return a dict with keys 'mean' and 'rstd'")}
    missing = [key for key in ("mean", "rstd") if key not in cache]
    if missing:
        return {"cache_problem": np.array(
            f"the cache has no key {', '.join(repr(k) for k in missing)} "
            f"(its keys are {', '.join(repr(k) for k in cache)})")}
    return {"mean": cache["mean"], "rstd": cache["rstd"]}


def _call_forward(layer_norm_forward, case):
    result = layer_norm_forward(*_ln_inputs(case))
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return {"cache_problem": np.array(
            "layer_norm_forward should return two things, (y, cache)")}
    y, cache = result
    return {"y": y, **_cache_statistics(cache)}


def _call_ln_backward(functions, case):
    layer_norm_forward, layer_norm_backward = functions
    _, cache = layer_norm_forward(*_ln_inputs(case))
    dx, dgamma, dbeta = layer_norm_backward(case["dy"].copy(), cache)
    return {"dx": dx, "dgamma": dgamma, "dbeta": dbeta}


def _call_rms_backward(rms_norm_backward, case):
    dx, dgamma = rms_norm_backward(case["dy"].copy(), case["x"].copy(),
                                   case["gamma"].copy(), float(case["eps"]))
    return {"dx": dx, "dgamma": dgamma}


def check_layer_norm_forward(layer_norm_forward):
    """Check layer_norm_forward(x, gamma, beta, eps) -> (y, cache): y, and the
    cache's per-token "mean" and "rstd" = 1 / sqrt(var + eps)."""
    run_check("backward_ln_forward_cache", layer_norm_forward, _call_forward)


def check_layer_norm_backward_dx(layer_norm_forward, layer_norm_backward):
    """Check dx from layer_norm_backward(dy, cache), the cache coming from your
    own layer_norm_forward."""
    run_check("backward_ln_dx", (layer_norm_forward, layer_norm_backward), _call_ln_backward)


def check_layer_norm_backward_params(layer_norm_forward, layer_norm_backward):
    """Check dgamma and dbeta from layer_norm_backward(dy, cache), for batches
    with one or several leading axes."""
    run_check("backward_ln_params", (layer_norm_forward, layer_norm_backward),
              _call_ln_backward)


def check_rms_norm_backward(rms_norm_backward):
    """Check rms_norm_backward(dy, x, gamma, eps) -> (dx, dgamma)."""
    run_check("backward_rms", rms_norm_backward, _call_rms_backward)
