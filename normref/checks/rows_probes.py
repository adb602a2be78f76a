"""Unit 02 checks, the student-facing half: how each exercise is called."""

import numpy as np

from normref.checks._runner import calling_own_functions, run_check, to_array


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


def _call_group_norm(group_norm, case):
    def call():
        return group_norm(case["x"].copy(), int(case["num_groups"]), case["gamma"].copy(),
                          case["beta"].copy(), float(case["eps"]))

    if "must_raise" in case:
        return _raised(call)
    return {"y": call()}


def _call_group_norm_limits(functions, case):
    instance_norm, example_layer_norm = functions
    eps = float(case["eps"])
    return {"instance": instance_norm(case["x"].copy(), eps),
            "layer": example_layer_norm(case["x"].copy(), eps)}


def _call_batch_norm_train(batch_norm_train, case):
    """Feed the batches of case["x"] (steps, N, C, *) one after another,
    passing each step the running statistics the last one returned."""
    gamma, beta = case["gamma"], case["beta"]
    momentum, eps = float(case["momentum"]), float(case["eps"])
    convention = str(case["convention"])
    running_mean, running_var = case["running_mean"].copy(), case["running_var"].copy()
    if "must_raise" in case:
        return _raised(lambda: batch_norm_train(
            case["x"][0].copy(), gamma.copy(), beta.copy(), running_mean, running_var,
            momentum, convention, eps))
    ys, means, variances = [], [], []
    for batch in case["x"]:
        y, running_mean, running_var = batch_norm_train(
            batch.copy(), gamma.copy(), beta.copy(), running_mean, running_var,
            momentum, convention, eps)
        running_mean = to_array(running_mean, what="the new running mean")
        running_var = to_array(running_var, what="the new running variance")
        ys.append(to_array(y))
        means.append(running_mean.copy())
        variances.append(running_var.copy())
    return {"y": np.stack(ys), "running_mean": np.stack(means),
            "running_var": np.stack(variances)}


def _call_spatial(function, case):
    """Call a spatial norm on copies of the case, with Python numbers for G and eps."""
    x, gamma, beta = case["x"].copy(), case["gamma"].copy(), case["beta"].copy()
    if "num_groups" in case:
        y = function(x, gamma, beta, int(case["num_groups"]), float(case["eps"]))
    else:
        y = function(x, gamma, beta, float(case["eps"]))
    return {"y": to_array(y)}


def _answers_as_text(answers, case):
    return {name: np.array(str(value)) for name, value in answers.items()}


def check_group_norm(group_norm):
    """Check group_norm(x, num_groups, gamma, beta, eps) for x of shape (N, C, *)."""
    run_check("rows_group_norm", group_norm, _call_group_norm)


def check_group_norm_limits(instance_norm, example_layer_norm):
    """Check instance_norm(x, eps) and example_layer_norm(x, eps), x: (N, C, *)."""
    run_check("rows_group_norm_limits", (instance_norm, example_layer_norm),
              _call_group_norm_limits)


def check_batch_norm_train(batch_norm_train):
    """Check batch_norm_train(x, gamma, beta, running_mean, running_var,
    momentum, convention, eps) over several steps, under both conventions."""
    run_check("rows_batch_norm_train", batch_norm_train, _call_batch_norm_train)


def check_nudge_answer(**answers):
    """Check the answer on how many outputs one nudged input moves."""
    run_check("rows_nudge_answer", answers, _answers_as_text)


def check_running_var_prediction(**answers):
    """Check that both predictions were given, as numbers (not judged right or wrong)."""
    run_check("rows_running_var_prediction", answers, _answers_as_text)


def check_running_var_answers(**answers):
    """Check the answers on the running variance and the momentum conventions."""
    run_check("rows_running_var_answers", answers, _answers_as_text)


def check_spatial_batch_norm(spatial_batch_norm_forward):
    """Check spatial_batch_norm_forward(x, gamma, beta, eps), x: (N, C, H, W)."""
    run_check("rows_spatial_batch_norm", spatial_batch_norm_forward, _call_spatial)


def _call_spatial_on_its_own(function, case):
    """_call_spatial, noting whether it ran Exercise 1's or 2's functions."""
    result, ran = calling_own_functions(
        function, ["group_norm", "instance_norm", "example_layer_norm"],
        lambda: {key: to_array(value) for key, value in _call_spatial(function, case).items()})
    return {**result, "ran_group_norm": np.array(ran)}


def check_spatial_group_norm(spatial_group_norm_forward):
    """Check spatial_group_norm_forward(x, gamma, beta, G, eps), x: (N, C, H, W),
    written without calling the notebook's group_norm."""
    run_check("rows_spatial_group_norm", spatial_group_norm_forward, _call_spatial_on_its_own)
