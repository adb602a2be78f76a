"""Unit 02 checks, the student-facing half: how each exercise is called."""

import numpy as np

from normref.checks._runner import answer_text, calling_code, run_check, to_array


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


def _group_norm_exactly(x, num_groups, gamma=None, beta=None, eps=1e-5):
    """Group norm in float64, given back in x's kind (a torch tensor for a tensor):
    what channel_layer_norm is graded with, so that a slip in the student's own
    group_norm costs group_norm_correct alone."""
    as_tensor = hasattr(x, "detach") and hasattr(x, "cpu")
    given = to_array(x)
    x64 = given.astype(np.float64)
    n, c = x64.shape[:2]
    groups = int(num_groups)
    if groups < 1 or c % groups:
        raise ValueError(f"num_channels ({c}) must be divisible by num_groups ({groups})")
    grouped = x64.reshape(n, groups, -1)
    y = ((grouped - grouped.mean(-1, keepdims=True))
         / np.sqrt(grouped.var(-1, keepdims=True) + float(eps))).reshape(x64.shape)
    per_channel = (1, c) + (1,) * (x64.ndim - 2)
    if gamma is not None:
        y = y * to_array(gamma).astype(np.float64).reshape(per_channel)
    if beta is not None:
        y = y + to_array(beta).astype(np.float64).reshape(per_channel)
    if np.issubdtype(given.dtype, np.floating):
        y = y.astype(given.dtype)
    if as_tensor:
        import torch

        return torch.from_numpy(y)
    return y


# The group_norm swapped in for channel_layer_norm scales its output by 1 + this: an
# output that came through it carries the mark, one computed by hand does not.
GROUP_NORM_MARK = 1e-3


def _call_channel_layer_norm(channel_layer_norm, case):
    """Call channel_layer_norm(x, eps) with the notebook's group_norm swapped for an
    exact one that counts its calls and marks its output (-1 calls: the function's
    globals could not be reached, so the calls are not known). The student's own
    group_norm is swapped wherever the function holds it: under its name or another
    global name (an alias), as a default argument, or in a closure cell."""
    calls = []

    def group_norm(x, num_groups, gamma=None, beta=None, eps=1e-5):
        calls.append(int(num_groups))
        return _group_norm_exactly(x, num_groups, gamma, beta, eps) * (1 + GROUP_NORM_MARK)

    found = getattr(channel_layer_norm, "__globals__", None)
    if not isinstance(found, dict):
        return {"y": to_array(channel_layer_norm(case["x"].copy(), float(case["eps"]))),
                "group_norm_calls": np.array(-1)}
    had, own = "group_norm" in found, found.get("group_norm")
    undo = []
    if callable(own):
        for name, value in list(found.items()):
            if value is own and name != "group_norm":
                found[name] = group_norm
                undo.append(lambda name=name: found.__setitem__(name, own))
        defaults = getattr(channel_layer_norm, "__defaults__", None)
        if defaults and any(value is own for value in defaults):
            channel_layer_norm.__defaults__ = tuple(
                group_norm if value is own else value for value in defaults)
            undo.append(lambda: setattr(channel_layer_norm, "__defaults__", defaults))
        keywords = getattr(channel_layer_norm, "__kwdefaults__", None)
        if keywords and any(value is own for value in keywords.values()):
            channel_layer_norm.__kwdefaults__ = {
                key: group_norm if value is own else value
                for key, value in keywords.items()}
            undo.append(lambda: setattr(channel_layer_norm, "__kwdefaults__", keywords))
        for cell in getattr(channel_layer_norm, "__closure__", None) or ():
            try:
                held = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if held is own:
                cell.cell_contents = group_norm
                undo.append(lambda cell=cell: setattr(cell, "cell_contents", own))
    found["group_norm"] = group_norm
    try:
        y = to_array(channel_layer_norm(case["x"].copy(), float(case["eps"])))
    finally:
        for step in reversed(undo):
            step()
        if had:
            found["group_norm"] = own
        else:
            del found["group_norm"]
    return {"y": y, "group_norm_calls": np.array(len(calls))}


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
    """Call a spatial norm on copies of the case, with a Python number for eps."""
    x, gamma, beta = case["x"].copy(), case["gamma"].copy(), case["beta"].copy()
    return {"y": to_array(function(x, gamma, beta, float(case["eps"])))}


def _call_batch_norm_eval(batch_norm_eval, case):
    """Call it on copies, and send back the running statistics as they are
    after the call: eval mode must leave them alone."""
    running_mean, running_var = case["running_mean"].copy(), case["running_var"].copy()
    y = batch_norm_eval(case["x"].copy(), case["gamma"].copy(), case["beta"].copy(),
                        running_mean, running_var, float(case["eps"]))
    return {"y": to_array(y), "running_mean_after": to_array(running_mean),
            "running_var_after": to_array(running_var)}


def _is_torch_fold(code):
    """PyTorch's own Linear/Conv2d + BatchNorm folds (torch.nn.utils.fusion)."""
    return code.co_filename.replace("\\", "/").endswith("torch/nn/utils/fusion.py")


def _call_fold_batch_norm(fold_batch_norm, case):
    """Call it on copies; send back the two parts of the pair it returns, and
    whether PyTorch's own fold ran to make them."""
    folded, torch_fold = calling_code(_is_torch_fold, lambda: fold_batch_norm(*(
        case[key].copy() for key in (
            "weight", "bias", "gamma", "beta", "running_mean", "running_var")),
        float(case["eps"])))
    if isinstance(folded, (str, bytes, dict)) or not hasattr(folded, "__len__"):
        raise TypeError("fold_batch_norm returns (folded_weight, folded_bias), a pair, "
                        f"not a {type(folded).__name__}")
    if len(folded) != 2:
        raise TypeError("fold_batch_norm returns (folded_weight, folded_bias), a pair, "
                        f"not {len(folded)} things")
    return {"weight": to_array(folded[0], what="folded_weight"),
            "bias": to_array(folded[1], what="folded_bias"),
            "torch_fold": np.array(torch_fold)}


def _call_fold_conv_batch_norm(fold_conv_batch_norm, case):
    """The Conv2d fold is called as the Linear one is."""
    return _call_fold_batch_norm(fold_conv_batch_norm, case)


def _call_rms_norm(rms_norm, case):
    """eps=None where the case has no eps: the machine epsilon of x's dtype."""
    eps = float(case["eps"]) if "eps" in case else None
    return {"y": to_array(rms_norm(case["x"].copy(), case["gamma"].copy(), eps))}


def _call_for_precision(functions, case):
    """Call the function the case names on float64 copies; send back the dtype of
    every array it returns."""
    name = str(case["function"])
    function = functions[name]
    x, gamma, beta = case["x"].copy(), case["gamma"].copy(), case["beta"].copy()
    mean, var = case["running_mean"].copy(), case["running_var"].copy()
    if name == "group_norm":
        returned = [function(x, 2, gamma, beta, 1e-5)]
    elif name == "channel_layer_norm":
        returned = [function(x, 1e-5)]
    elif name == "batch_norm_train":
        returned = list(function(x, gamma, beta, mean, var, 0.1, "pytorch", 1e-5))
    elif name == "spatial_batch_norm_forward":
        returned = [function(x, gamma, beta, 1e-5)]
    elif name == "batch_norm_eval":
        returned = [function(x, gamma, beta, mean, var, 1e-5)]
    elif name == "fold_batch_norm":
        returned = list(function(case["weight"].copy(), case["bias"].copy(), gamma, beta,
                                 mean, var, 1e-5))
    else:
        returned = [function(x, gamma, None)]
    return {"dtypes": np.array([str(to_array(value).dtype) for value in returned])}


def _answers_as_text(answers, case):
    """Each answer as the text it travels as (answer_text: a one-number tensor or
    numpy scalar as its number in full, a tensor detached)."""
    return {name: np.array(answer_text(value)) for name, value in answers.items()}


def check_group_norm(group_norm):
    """Check group_norm(x, num_groups, gamma, beta, eps) for x of shape (N, C, *)."""
    run_check("rows_group_norm", group_norm, _call_group_norm)


def check_channel_layer_norm(channel_layer_norm):
    """Check channel_layer_norm(x, eps), x: (N, C, *), written with group_norm."""
    run_check("rows_channel_layer_norm", channel_layer_norm, _call_channel_layer_norm)


def check_batch_norm_train_pytorch(batch_norm_train):
    """Check batch_norm_train(x, gamma, beta, running_mean, running_var,
    momentum, "pytorch", eps) over several steps, batches of two examples or more."""
    run_check("rows_batch_norm_train_pytorch", batch_norm_train, _call_batch_norm_train)


def check_batch_norm_train_cs231n(batch_norm_train):
    """Check batch_norm_train(..., momentum, "cs231n", eps) over several steps,
    batches of two examples or more."""
    run_check("rows_batch_norm_train_cs231n", batch_norm_train, _call_batch_norm_train)


def check_batch_norm_train_one_example(batch_norm_train):
    """Check batch_norm_train on batches of one example: it trains when the example's
    positions give two values per channel, and raises ValueError on one value."""
    run_check("rows_batch_norm_train_one_example", batch_norm_train, _call_batch_norm_train)


def check_nudge_answer(**answers):
    """Check the answer on how many outputs one nudged input moves."""
    run_check("rows_nudge_answer", answers, _answers_as_text)


def check_running_var_answers(**answers):
    """Check the answers on the running variance and the momentum conventions."""
    run_check("rows_running_var_answers", answers, _answers_as_text)


def check_spatial_batch_norm(spatial_batch_norm_forward):
    """Check spatial_batch_norm_forward(x, gamma, beta, eps), x: (N, C, H, W)."""
    run_check("rows_spatial_batch_norm", spatial_batch_norm_forward, _call_spatial)


def check_batch_norm_eval(batch_norm_eval):
    """Check batch_norm_eval(x, gamma, beta, running_mean, running_var, eps),
    x: (N, C, *), against torch's batch norm in eval mode."""
    run_check("rows_batch_norm_eval", batch_norm_eval, _call_batch_norm_eval)


def check_fold_batch_norm(fold_batch_norm):
    """Check fold_batch_norm(weight, bias, gamma, beta, running_mean, running_var,
    eps) -> (folded_weight, folded_bias)."""
    run_check("rows_fold_batch_norm", fold_batch_norm, _call_fold_batch_norm)


def check_fold_conv_batch_norm(fold_conv_batch_norm):
    """Check fold_conv_batch_norm(weight, bias, gamma, beta, running_mean, running_var,
    eps) -> (folded_weight, folded_bias), weight: (C_out, C_in, kh, kw)."""
    run_check("rows_fold_conv_batch_norm", fold_conv_batch_norm, _call_fold_conv_batch_norm)


def check_rms_norm(rms_norm):
    """Check rms_norm(x, gamma, eps) over the last axis, eps=None included."""
    run_check("rows_rms_norm", rms_norm, _call_rms_norm)


def check_rms_offset_answer(**answers):
    """Check the answer on RMSNorm's output for tokens with an offset."""
    run_check("rows_rms_offset_answer", answers, _answers_as_text)


def check_pair_output_answer(**answers):
    """Check the answer on batch norm's output for a batch of two close values."""
    run_check("rows_pair_output_answer", answers, _answers_as_text)


def check_sign_only_gap_answer(**answers):
    """Check the answer on the gap beyond which a batch of two's output is within
    0.01 of +1 or -1."""
    run_check("rows_sign_only_gap_answer", answers, _answers_as_text)


def check_pair_information_answers(**answers):
    """Check the answer on how many bits per feature survive a batch of two when
    eps is 0."""
    run_check("rows_pair_information_answers", answers, _answers_as_text)


def check_precision_kept(**functions):
    """Check that each of the unit's functions returns float64 for float64 input."""
    run_check("rows_precision_kept", functions, _call_for_precision)


def check_statistic_sizes_answer(**answers):
    """Check the answers on how many values each statistic of the run's three norms
    is taken over at batch 2."""
    run_check("rows_statistic_sizes_answer", answers, _answers_as_text)


def check_eval_mode_accuracy(**answers):
    """Check the held-out accuracy of the batch-2 run scored in eval mode, with the
    running statistics of training, and feature 21's mean over the held-out images."""
    run_check("rows_eval_mode_accuracy", answers, _answers_as_text)
