"""Unit 02 checks, the student-facing half: how each exercise is called."""

import numpy as np

from normref.checks._runner import run_check, to_array


def exception_classes(exc):
    """The qualified names of the classes along the exception's MRO, most derived
    first: a subclass of ValueError reports builtins.ValueError too."""
    return np.array([f"{cls.__module__}.{cls.__qualname__}" for cls in type(exc).__mro__])


def _raised(call):
    """Run call(); report the exception it raised (its name, and every class it
    is an instance of), or "nothing"."""
    try:
        call()
    except Exception as exc:  # which exception it is, is what gets judged
        return {"raised": np.array(type(exc).__name__), "raised_classes": exception_classes(exc)}
    return {"raised": np.array("nothing"), "raised_classes": np.array([], dtype=str)}


def _call_batch_norm_training(batch_norm, case):
    """Feed the batches of case["x"] (steps, N, C) one after another in
    training mode, passing each step the running statistics the last returned."""
    gamma, beta = case["gamma"], case["beta"]
    momentum, eps = float(case["momentum"]), float(case["eps"])
    running_mean, running_var = case["running_mean"].copy(), case["running_var"].copy()
    if "must_raise" in case:
        return _raised(lambda: batch_norm(case["x"][0].copy(), gamma.copy(), beta.copy(),
                                          running_mean, running_var, True, momentum, eps))
    ys, means, variances = [], [], []
    for batch in case["x"]:
        y, running_mean, running_var = batch_norm(
            batch.copy(), gamma.copy(), beta.copy(), running_mean, running_var,
            True, momentum, eps)
        running_mean = to_array(running_mean, what="the new running mean")
        running_var = to_array(running_var, what="the new running variance")
        ys.append(to_array(y))
        means.append(running_mean.copy())
        variances.append(running_var.copy())
    return {"y": np.stack(ys), "running_mean": np.stack(means),
            "running_var": np.stack(variances)}


def _call_batch_norm_eval(batch_norm, case):
    y, running_mean, running_var = batch_norm(
        case["x"].copy(), case["gamma"].copy(), case["beta"].copy(),
        case["running_mean"].copy(), case["running_var"].copy(),
        False, float(case["momentum"]), float(case["eps"]))
    return {"y": y, "running_mean": running_mean, "running_var": running_var}


def _call_rms_norm(rms_norm, case):
    return {"y": rms_norm(case["x"].copy(), case["gamma"].copy(), float(case["eps"]))}


def _call_group_norm(group_norm, case):
    def call():
        return group_norm(case["x"].copy(), int(case["num_groups"]), case["gamma"].copy(),
                          case["beta"].copy(), float(case["eps"]))

    if "must_raise" in case:
        return _raised(call)
    return {"y": call()}


def _answers_as_text(answers, case):
    return {name: np.array(str(value)) for name, value in answers.items()}


def check_batch_norm_training(batch_norm):
    """Check batch_norm(x, gamma, beta, running_mean, running_var, True,
    momentum, eps) over several training steps, running statistics included."""
    run_check("rows_batch_norm_training", batch_norm, _call_batch_norm_training)


def check_batch_norm_eval(batch_norm):
    """Check batch_norm(..., training=False): normalizes with the running
    statistics and leaves them unchanged."""
    run_check("rows_batch_norm_eval", batch_norm, _call_batch_norm_eval)


def check_rms_norm(rms_norm):
    """Check rms_norm(x, gamma, eps) on tokens and batches of tokens."""
    run_check("rows_rms_norm", rms_norm, _call_rms_norm)


def check_group_norm(group_norm):
    """Check group_norm(x, num_groups, gamma, beta, eps) for x of shape (N, C, *)."""
    run_check("rows_group_norm", group_norm, _call_group_norm)


def check_batch_dependence(**answers):
    """Check the answers of unit 02 on which methods depend on the batch."""
    run_check("rows_batch_dependence", answers, _answers_as_text)
