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


def _reference_rms_norm_backward(dy, x, gamma, eps=1e-5):
    """RMSNorm's right gradients, numpy arrays in float64 (or tensors, when the
    student's own rms_norm_backward gives tensors)."""
    dy, x, gamma = (np.asarray(to_array(a), dtype=np.float64) for a in (dy, x, gamma))
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + float(eps))
    x_hat = x * rstd
    g = dy * gamma
    dx = rstd * (g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
    return dx, (dy * x_hat).reshape(-1, x.shape[-1]).sum(axis=0)


def _standing_in_for(own):
    """A stand-in for the student's rms_norm_backward, with its results' types but
    right values: Exercise 9 grades the Function's wiring, not Exercise 2 again."""
    def rms_norm_backward(dy, x, gamma, eps=1e-5):
        right = _reference_rms_norm_backward(dy, x, gamma, eps)
        try:
            theirs = own(dy, x, gamma, eps)
        except Exception:  # noqa: BLE001 - their Exercise 2 is graded on its own
            return right
        if isinstance(theirs, (tuple, list)) and len(theirs) == 2 and all(
                hasattr(t, "detach") for t in theirs):
            import torch
            return tuple(torch.as_tensor(r, dtype=t.dtype) for r, t in zip(right, theirs))
        return right
    return rms_norm_backward


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


def _saved_for_backward(y, x, gamma, eps):
    """What forward saved on ctx, matched against what backward needs: x (or
    x_hat with rstd, from which x follows) and gamma."""
    x, gamma = (np.asarray(to_array(a), dtype=np.float64) for a in (x, gamma))
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    wanted = {"x": x, "gamma": gamma, "x_hat": x * rstd, "rstd": rstd}
    matched, described = set(), []
    for where, value in _on_ctx(getattr(y, "grad_fn", None))[:32]:
        try:
            array = np.asarray(to_array(value), dtype=np.float64)
        except Exception:  # noqa: BLE001 - eps, None, anything else: named, not matched
            described.append(f"{where} ({type(value).__name__})")
            continue
        names = [name for name, right in wanted.items()
                 if array.size == right.size
                 and np.allclose(array.reshape(right.shape), right, rtol=1e-12, atol=0)]
        matched.update(names)
        described.append(f"{where} ({' = '.join(names) or f'an array of shape {array.shape}'})")
    return {"saved": np.array("; ".join(described)[:600] or "nothing"),
            "saved_x": np.array("x" in matched or {"x_hat", "rstd"} <= matched),
            "saved_gamma": np.array("gamma" in matched)}


def _call_rms_function(function, case):
    """y and the gradients autograd gets through the student's Function, whether
    its backward ran their rms_norm_backward, and gradcheck's verdict on it. The
    backward's rms_norm_backward is swapped for a right one while it runs."""
    import torch

    eps = float(case["eps"])
    x, gamma = (torch.tensor(np.asarray(case[key], dtype=np.float64), requires_grad=True)
                for key in ("x", "gamma"))

    def through_autograd():
        y = function.apply(x, gamma, eps)
        saved = _saved_for_backward(y, case["x"], case["gamma"], eps)
        y.backward(torch.from_numpy(np.asarray(case["dy"], dtype=np.float64)))
        passed = torch.autograd.gradcheck(
            lambda a, b: function.apply(a, b, eps),
            (x.detach().clone().requires_grad_(), gamma.detach().clone().requires_grad_()),
            raise_exception=False)
        return {"y": to_array(y), "dx": to_array(x.grad), "dgamma": to_array(gamma.grad),
                "gradcheck": np.array(bool(passed)), **saved}

    backward = getattr(function, "backward", None)
    namespace = getattr(backward, "__globals__", {})
    own = namespace.get("rms_norm_backward")
    if callable(own):
        namespace["rms_norm_backward"] = _standing_in_for(own)
    try:
        result, ran = calling_own_functions(backward, ["rms_norm_backward"],
                                            through_autograd)
    finally:
        if callable(own):
            namespace["rms_norm_backward"] = own
    return {**result, "ran_rms_norm_backward": np.array(ran)}


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
    """Check a torch.autograd.Function whose backward hands the work to your
    rms_norm_backward: y, x.grad and gamma.grad from function.apply(x, gamma,
    eps).backward(dy), and torch.autograd.gradcheck on it, in float64."""
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
