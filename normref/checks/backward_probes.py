"""Unit 04 checks, the student-facing half: how each exercise is called.

The assignment grades RMSNorm's, GroupNorm's and BatchNorm's backward passes
(BatchNorm's by stages, whose recorded stage gradients are graded too, then
spatial BatchNorm's over (N, C, H, W) in closed form), the running sum behind
dgamma in two dtypes, and five inline answers;
the layer-norm checks grade the lesson's own case (an instructor can run them
on the lesson's functions) and guard the grader's autograd recorder in the
test suite.

A student's cache is theirs to shape (a dict, a tuple, anything): the backward
probes hand it straight from the student's forward to the student's backward,
so only the resulting arrays travel back to be judged.
"""

import signal
import threading
from collections.abc import Mapping
from time import perf_counter as _clock  # bound when the checks load, before a hand-in runs

import numpy as np

from normref.checks._runner import answer_text, calling_own_functions, run_check, to_array


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


class _OverBudget(BaseException):
    """Raised inside the hand-in's call when a large case's time budget is spent
    (a BaseException, so that the hand-in's `except Exception` lets it through)."""


def _timed(probe):
    """`probe`, which on a case with a "time_budget" also reports the call's
    "seconds", stops the call (reporting "stopped") once the budget is spent, and
    reports a MemoryError as "out_of_memory" (a per-token Jacobian there is 34 GB)."""
    def timed(subject, case):
        if "time_budget" not in case:
            return probe(subject, case)
        budget = float(case["time_budget"])
        armed = [threading.current_thread() is threading.main_thread()
                 and hasattr(signal, "setitimer")]

        def stop(signum, frame):
            if armed[0]:
                raise _OverBudget

        timer_set, before = False, None
        if armed[0]:
            try:
                before = signal.signal(signal.SIGALRM, stop)
                signal.setitimer(signal.ITIMER_REAL, budget)
                timer_set = True
            except (ValueError, OSError):  # no timer here: the time is still judged
                armed[0] = False
        start = _clock()
        try:
            try:
                result = probe(subject, case)
            finally:
                armed[0] = False
                seconds = _clock() - start
        except _OverBudget:
            return {"seconds": np.array(seconds), "stopped": np.array(True)}
        except MemoryError as exc:  # a Jacobian of the large case: judged, with why
            return {"seconds": np.array(seconds),
                    "out_of_memory": np.array(f"MemoryError: {exc}"[:300])}
        finally:
            if timer_set:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, before if before is not None else signal.SIG_DFL)
        return {**result, "seconds": np.array(seconds)}
    return timed


def _unpack(result, name, count):
    if not isinstance(result, (tuple, list)) or len(result) != count:
        raise TypeError(f"{name} should return {count} arrays, "
                        f"got {type(result).__name__}")
    return result


@_timed
def _call_rms_backward(rms_norm_backward, case):
    result = rms_norm_backward(case["dy"].copy(), case["x"].copy(),
                               case["gamma"].copy(), float(case["eps"]))
    dx, dgamma = _unpack(result, "rms_norm_backward", 2)
    return {"dx": dx, "dgamma": dgamma}


@_timed
def _call_gn_backward(group_norm_backward, case):
    result = group_norm_backward(case["dy"].copy(), case["x"].copy(),
                                 int(case["num_groups"]), case["gamma"].copy(),
                                 float(case["eps"]))
    dx, dgamma, dbeta = _unpack(result, "group_norm_backward", 3)
    return {"dx": dx, "dgamma": dgamma, "dbeta": dbeta}


@_timed
def _call_bn_backward(batch_norm_backward, case):
    result = batch_norm_backward(case["dy"].copy(), case["x"].copy(),
                                 case["gamma"].copy(), float(case["eps"]))
    name = getattr(batch_norm_backward, "__name__", "batch_norm_backward")
    dx, dgamma, dbeta = _unpack(result, name, 3)
    return {"dx": dx, "dgamma": dgamma, "dbeta": dbeta}


# The values of Exercise 6's table whose gradients the staged route records.
BN_STAGES = ("x_hat", "var", "xc", "mean")


@_timed
def _call_bn_stages(batch_norm_backward, case):
    """dx, and the gradients the staged route recorded in a dict passed as
    `grads`, one entry per value of the table (or a note on what is missing)."""
    grads = {}
    result = batch_norm_backward(case["dy"].copy(), case["x"].copy(),
                                 case["gamma"].copy(), float(case["eps"]),
                                 grads=grads)
    dx, _, _ = _unpack(result, "batch_norm_backward", 3)
    missing = [key for key in BN_STAGES if key not in grads]
    if missing:
        return {"dx": dx, "grads_problem": np.array(
            f"grads has no key {', '.join(repr(key) for key in missing)} "
            f"(its keys are {', '.join(repr(key) for key in grads) or 'none'})")}
    return {"dx": dx, **{f"grad_{key}": grads[key] for key in BN_STAGES}}


def _calling_other_route(other_name, probe=_call_bn_backward):
    """A probe for one of the two BatchNorm routes that also notes whether the
    call ran the student's other route, `other_name` in the same notebook."""
    def call(batch_norm_backward, case):
        # converted while watched: a lazy result runs its code here
        result, ran = calling_own_functions(
            batch_norm_backward, [other_name],
            lambda: {key: to_array(value) for key, value in
                     probe(batch_norm_backward, case).items()})
        return {**result, "other_route": np.array(ran)}
    return call


def _on_ctx(grad_fn):
    """(where, value) for what a custom Function's forward saved on its ctx (which
    is y.grad_fn): ctx.save_for_backward's tensors and ctx's own attributes, with
    one level of tuples, lists and dicts opened."""
    found = []
    try:
        found += [(f"saved_tensors[{i}]", t) for i, t in enumerate(grad_fn.saved_tensors)]
    except Exception:  # noqa: BLE001 - no saved tensors, or not a custom Function's ctx
        pass
    try:
        attributes = dict(vars(grad_fn))
    except TypeError:
        attributes = {}
    for name, value in attributes.items():
        if isinstance(value, (tuple, list)):
            found += [(f"ctx.{name}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, dict):
            found += [(f"ctx.{name}[{k!r}]", v) for k, v in value.items()]
        else:
            found.append((f"ctx.{name}", value))
    return found


def _saved_for_backward(y, x, gamma, rstd):
    """What forward saved on ctx, matched against the cache Exercise 9 asks for:
    x, gamma and the rstd forward returned."""
    wanted = {name: np.asarray(to_array(a), dtype=np.float64)
              for name, a in (("x", x), ("gamma", gamma), ("rstd", rstd))}
    matched, described = set(), []
    for where, value in _on_ctx(getattr(y, "grad_fn", None))[:32]:
        try:
            array = np.asarray(to_array(value), dtype=np.float64)
        except Exception:  # noqa: BLE001 - eps, None, anything else: named, not matched
            described.append(f"{where} ({type(value).__name__})")
            continue
        names = [name for name, right in wanted.items()
                 if array.size == right.size > 0
                 and np.allclose(array.reshape(right.shape), right, rtol=1e-12, atol=0)]
        matched.update(names)
        described.append(f"{where} ({' = '.join(names) or f'an array of shape {array.shape}'})")
    return {"saved": np.array("; ".join(described)[:600] or "nothing"),
            **{f"saved_{name}": np.array(name in matched) for name in wanted}}


def _error_text(error):
    """An exception as one line a hint can quote."""
    return np.array(f"{type(error).__name__}: {error}".splitlines()[0][:300])


def _call_rms_function(function, case):
    """What autograd gets through the student's Function, in float64: forward's
    (y, rstd); the first derivatives for a loss through y alone and for one
    through y and rstd; the second derivatives (a Hessian-vector product through
    backward); and what forward saved on ctx. A stage
    that raises is reported as text, the stages before it kept."""
    import torch

    eps = float(case["eps"])
    c = {key: np.asarray(case[key], dtype=np.float64)
         for key in ("x", "gamma", "dy", "drstd", "u", "v")}
    dy, drstd, u, v = (torch.from_numpy(c[key]) for key in ("dy", "drstd", "u", "v"))

    def leaves():
        return tuple(torch.tensor(c[key], requires_grad=True) for key in ("x", "gamma"))

    found = {}
    try:
        x, gamma = leaves()
        outputs = function.apply(x, gamma, eps)
        if not isinstance(outputs, (tuple, list)) or len(outputs) != 2:
            return {"forward_problem": np.array(
                f"RMSNormFunction.apply(x, gamma, eps) returned a {type(outputs).__name__}, "
                "not the two tensors (y, rstd)")}
        y, rstd = outputs
        found.update(y=to_array(y), rstd=to_array(rstd),
                     **_saved_for_backward(y, c["x"], c["gamma"], rstd))
        found["dx"], found["dgamma"] = (to_array(t) for t in torch.autograd.grad(
            (y * dy).sum(), (x, gamma)))
        x, gamma = leaves()
        y, rstd = function.apply(x, gamma, eps)
        found["dx_r"], found["dgamma_r"] = (to_array(t) for t in torch.autograd.grad(
            (y * dy).sum() + (rstd * drstd).sum(), (x, gamma)))
        x, gamma = leaves()
        y, rstd = function.apply(x, gamma, eps)
        # backward called here, autograd on, as create_graph=True would call it, but
        # outside the engine: grad mode inside the engine's backward is the mark of a
        # backward that differentiates again, which the policy forbids
        with torch.enable_grad():
            dx, dgamma = function.backward(y.grad_fn, dy, torch.zeros_like(rstd))[:2]
        found["hx"], found["hgamma"] = (to_array(t) for t in torch.autograd.grad(
            (dx * u).sum() + (dgamma * v).sum(), (x, gamma), allow_unused=True,
            materialize_grads=True))
    except Exception as error:  # noqa: BLE001 - the judge names the stage that failed
        found["error"] = _error_text(error)
    return found


def _answer_as_text(answer, case):
    return {"answer": np.array(answer_text(answer))}


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


def check_rms_norm_backward_dx(rms_norm_backward):
    """Check dx from rms_norm_backward(dy, x, gamma, eps) -> (dx, dgamma)."""
    run_check("backward_rms_dx", rms_norm_backward, _call_rms_backward)


def _call_dx_dot_x(dx_dot_x, case):
    return {"dot": to_array(dx_dot_x(float(case["row_loss"]), float(case["mean_square"]),
                                     float(case["eps"])),
                            what="dx_dot_x(row_loss, mean_square, eps)")}


def check_rms_dx_dot_x(dx_dot_x):
    """Check dx_dot_x(row_loss, mean_square, eps): RMSNorm's sum(dx * x) over one
    token, from sum(dy * y), mean(x^2) and eps, each given as a float."""
    run_check("backward_rms_dx_dot_x", dx_dot_x, _call_dx_dot_x)


def check_rms_norm_backward_dgamma(rms_norm_backward):
    """Check dgamma from rms_norm_backward(dy, x, gamma, eps), for batches with
    one or several leading axes."""
    run_check("backward_rms_dgamma", rms_norm_backward, _call_rms_backward)


def check_group_norm_backward_dx(group_norm_backward):
    """Check dx from group_norm_backward(dy, x, num_groups, gamma, eps) ->
    (dx, dgamma, dbeta), with x: (N, C, *) on random shapes."""
    run_check("backward_gn_dx", group_norm_backward, _call_gn_backward)


def check_group_norm_backward_params(group_norm_backward):
    """Check dgamma and dbeta from group_norm_backward: one number a channel."""
    run_check("backward_gn_params", group_norm_backward, _call_gn_backward)


def check_batch_norm_backward_dx(batch_norm_backward):
    """Check dx from batch_norm_backward(dy, x, gamma, eps) -> (dx, dgamma,
    dbeta), x: (N, D), statistics over the batch (training mode)."""
    run_check("backward_bn_dx", batch_norm_backward,
              _calling_other_route("batch_norm_2d_backward"))


def check_batch_norm_stage_gradients(batch_norm_backward):
    """Check the gradients batch_norm_backward(dy, x, gamma, eps, grads={})
    records in grads: one per value of the staged forward pass, "x_hat",
    "var", "xc" (both of its uses) and "mean"."""
    run_check("backward_bn_stages", batch_norm_backward,
              _calling_other_route("batch_norm_2d_backward", _call_bn_stages))


def check_batch_norm_backward_params(batch_norm_backward):
    """Check dgamma and dbeta from batch_norm_backward: one number a feature."""
    run_check("backward_bn_params", batch_norm_backward,
              _calling_other_route("batch_norm_2d_backward"))


def check_batch_norm_2d_backward_dx(batch_norm_2d_backward):
    """Check dx from batch_norm_2d_backward(dy, x, gamma, eps) -> (dx, dgamma,
    dbeta), x: (N, C, H, W), statistics per channel over N, H and W."""
    run_check("backward_bn2d_dx", batch_norm_2d_backward,
              _calling_other_route("batch_norm_backward"))


def check_batch_norm_2d_backward_params(batch_norm_2d_backward):
    """Check dgamma and dbeta from batch_norm_2d_backward: one number a channel."""
    run_check("backward_bn2d_params", batch_norm_2d_backward,
              _calling_other_route("batch_norm_backward"))


def check_rms_norm_function(function):
    """Check a twice-differentiable torch.autograd.Function for RMSNorm:
    function.apply(x, gamma, eps) -> (y, rstd), x, gamma and rstd saved on ctx,
    first derivatives through y and rstd, and second derivatives through
    backward, in float64."""
    run_check("backward_rms_function", function, _call_rms_function)


def _call_running_sum(accumulate_rows, case):
    """The student's sum with the running total kept in bfloat16, then in float32;
    the case's float32 arrays hold bfloat16 values exactly."""
    import torch

    dy, x_hat = (torch.from_numpy(case[key]).to(torch.bfloat16) for key in ("dy", "x_hat"))
    return {name: to_array(accumulate_rows(dy.clone(), x_hat.clone(), dtype),
                           what=f"accumulate_rows(dy, x_hat, {dtype})")
            for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32))}


def check_accumulate_rows(accumulate_rows):
    """Check accumulate_rows(dy, x_hat, acc_dtype) -> (d,): the sum over the rows of
    dy * x_hat, one running sum kept in acc_dtype, for bfloat16 and float32."""
    run_check("backward_running_sum", accumulate_rows, _call_running_sum)


def check_accumulation_answer(answer):
    """Check the answer to: how much further from float64 is a bfloat16 running sum?"""
    run_check("backward_accumulation_answer", answer, _answer_as_text)


def check_bn_eval_answer(answer):
    """Check the answer to: which sums of BatchNorm's evaluation-mode dx vanish?"""
    run_check("backward_bn_eval_answer", answer, _answer_as_text)


def _answer_as_number(answer, case):
    return {"answer": to_array(answer, what="dgamma_off")}


def check_dgamma_off_answer(answer):
    """Check dgamma_off: dgamma of a switched-off feature (gamma = 0), from y and rstd."""
    run_check("backward_dgamma_off_answer", answer, _answer_as_number)


def check_rms_zero_answer(answer):
    """Check the answer to: which quantity is zero for RMSNorm's dx?"""
    run_check("backward_rms_zero_answer", answer, _answer_as_text)


def check_gn_zero_sums_answer(answer):
    """Check the answer to: which sums of GroupNorm's dx are always zero?"""
    run_check("backward_gn_zero_sums_answer", answer, _answer_as_text)


def check_blind_check_answer(answer):
    """Check the answer to: which mistake does a check with dy = 1 miss?"""
    run_check("backward_blind_check_answer", answer, _answer_as_text)


@_timed
def _call_backward_from_output(layer_norm_backward_from_output, case):
    result = layer_norm_backward_from_output(*(case[key].copy() for key in (
        "dy", "y", "gamma", "beta", "rstd")))
    dx, dgamma, dbeta = _unpack(result, "layer_norm_backward_from_output", 3)
    return {"dx": dx, "dgamma": dgamma, "dbeta": dbeta}


def check_backward_from_output_dx(layer_norm_backward_from_output):
    """Check dx from layer_norm_backward_from_output(dy, y, gamma, beta, rstd) ->
    (dx, dgamma, dbeta), layer norm's backward from its output y and rstd (x_hat got
    back from y; where |gamma| < eps any x_hat from 0 to the true one, sign kept)."""
    run_check("backward_from_output_dx", layer_norm_backward_from_output,
              _call_backward_from_output)


def check_backward_from_output_params(layer_norm_backward_from_output):
    """Check dgamma and dbeta from layer_norm_backward_from_output, for batches with
    one or several leading axes."""
    run_check("backward_from_output_params", layer_norm_backward_from_output,
              _call_backward_from_output)
