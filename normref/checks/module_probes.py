"""Unit 03 checks, the student-facing half: how a `MyLayerNorm` class is probed.

Every probe builds the student's module from a case's constructor arguments
and reports plain arrays: parameter names and shapes as text, values,
outputs, gradients, error messages. torch itself (nn.LayerNorm included) may
be used here: it is the library the student's module must agree with, not
the course's reference. torch is imported inside the probes so that checks
of other units do not pay for importing it.
"""

import numpy as np

from normref.checks._runner import answer_text, run_check

MAX_MESSAGE = 2000


def _shape_argument(case):
    """normalized_shape as the student's constructor receives it."""
    import torch

    dims = [int(n) for n in case["normalized_shape"]]
    kind = str(case["shape_kind"])
    if kind == "int":
        return dims[0]
    return {"tuple": tuple, "list": list, "size": torch.Size}[kind](dims)


def _keyword_arguments(case):
    """Only the flags a case names are passed, so defaults get tested too."""
    kwargs = {}
    if "eps" in case:
        kwargs["eps"] = float(case["eps"])
    for flag in ("elementwise_affine", "bias", "residual_in_fp32"):
        if flag in case:
            kwargs[flag] = bool(case[flag])
    return kwargs


def _construct(MyLayerNorm, case):
    from torch import nn

    module = MyLayerNorm(_shape_argument(case), **_keyword_arguments(case))
    if not isinstance(module, nn.Module):
        name = getattr(MyLayerNorm, "__name__", "MyLayerNorm")
        raise TypeError(
            f"{name} must subclass torch.nn.Module (class {name}(nn.Module): ...)"
        )
    return module


def _affine_parameters(module):
    """(gamma, beta) of the student's module: by name when it uses torch's
    names, else in the order they were registered (so a misnamed parameter
    costs the points of the naming checks only)."""
    import torch

    named = dict(module.named_parameters())
    if "weight" in named:
        return named["weight"], named.get("bias")
    found = [p for p in module.parameters() if isinstance(p, torch.Tensor)]
    return (found + [None, None])[:2]


def _set_affine(module, weight, bias):
    import torch

    gamma, beta = _affine_parameters(module)
    with torch.no_grad():
        if weight is not None:
            if gamma is None:
                raise AttributeError("the module has no parameters to hold weight (gamma)")
            gamma.copy_(torch.as_tensor(weight))
        if bias is not None:
            if beta is None:
                raise AttributeError("the module has no second parameter to hold bias (beta)")
            beta.copy_(torch.as_tensor(bias))


def _describe_parameters(module):
    params = dict(module.named_parameters())
    report = {
        "names": np.array(",".join(params)),
        "shapes": np.array(";".join(f"{n}={list(p.shape)}" for n, p in params.items())),
        "dtypes": np.array(
            ";".join(f"{n}={str(p.dtype).replace('torch.', '')}" for n, p in params.items())
        ),
        "trainable": np.array(",".join(n for n, p in params.items() if p.requires_grad)),
        "state_keys": np.array(",".join(module.state_dict())),
    }
    for name in ("weight", "bias"):
        if name in params:
            report[f"initial_{name}"] = params[name]
    return report


def _run_forward(module, case):
    """The module's output on case["x"] (a float64 input runs in float64)."""
    import torch

    x = torch.tensor(case["x"])
    if x.dtype == torch.float64:
        module = module.double()
    if "param_dtype" in case:  # a low-precision model: module.to(torch.bfloat16)
        module = module.to(getattr(torch, str(case["param_dtype"])))
    if "x_dtype" in case:  # a half-precision input, its values held as float32
        x = x.to(getattr(torch, str(case["x_dtype"])))
    _set_affine(module, case.get("set_weight"), case.get("set_bias"))
    with torch.no_grad():
        y = module(x)
        report = {"y": y, "y_dtype": np.array(str(getattr(y, "dtype", type(y).__name__)))}
        if "x_dtype" in case:  # the same values in float32: is the slip the half dtype's?
            try:
                report["y_from_float32"] = module(x.float())
            except Exception:  # noqa: BLE001 - the half-precision output is what is graded
                pass
    return report


def _probe_module(MyLayerNorm, case):
    module = _construct(MyLayerNorm, case)
    report = _describe_parameters(module)
    if "x" in case:
        report.update(_run_forward(module, case))
    return report


def _error_text(exc):
    return np.array(f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE])


def _probe_state_dict(MyLayerNorm, case):
    """Load nn.LayerNorm's state_dict into the student's module and back."""
    import torch
    from torch import nn

    shape = _shape_argument(case)
    mine = _construct(MyLayerNorm, case)
    report = {"state_keys": np.array(",".join(mine.state_dict()))}

    theirs = nn.LayerNorm(shape)
    _set_affine(theirs, case["torch_weight"], case["torch_bias"])
    try:
        mine.load_state_dict(theirs.state_dict())
        loaded = mine.state_dict()
        report["mine_weight"] = loaded["weight"]
        report["mine_bias"] = loaded["bias"]
    except Exception as exc:  # the student's module may refuse torch's keys
        report["into_mine_error"] = _error_text(exc)

    mine = _construct(MyLayerNorm, case)
    _set_affine(mine, case["my_weight"], case["my_bias"])
    fresh = nn.LayerNorm(shape)
    try:
        fresh.load_state_dict(mine.state_dict())
        with torch.no_grad():
            report["torch_weight"] = fresh.weight.clone()
            report["torch_bias"] = fresh.bias.clone()
    except Exception as exc:
        report["into_torch_error"] = _error_text(exc)
    return report


def _probe_autograd(MyLayerNorm, case):
    """Gradients of sum(upstream * module(x)) with respect to x, gamma, beta."""
    import torch

    module = _construct(MyLayerNorm, case)
    x = torch.tensor(case["x"])
    if x.dtype == torch.float64:
        module = module.double()
    _set_affine(module, case["set_weight"], case["set_bias"])
    x.requires_grad_(True)
    y = module(x)
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        return {"missing": np.array("all: the output is not connected to the autograd graph")}
    (y * torch.tensor(case["upstream"])).sum().backward()
    gamma, beta = _affine_parameters(module)
    return _gradients({"y": y.detach()},  # the forward, to tell its slips from the backward's
                      (("x_grad", x), ("weight_grad", gamma), ("bias_grad", beta)))


def _probe_shape_error(MyLayerNorm, case):
    """Call the module on an input of case["x_shape"]; report any error."""
    import torch

    module = _construct(MyLayerNorm, case)
    shape = tuple(int(n) for n in case["x_shape"])
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    try:
        module(x)
    except Exception as exc:  # the error is what is being checked
        return {
            "raised": np.array(True),
            "error_type": np.array(type(exc).__name__),
            "error_classes": np.array([f"{c.__module__}.{c.__qualname__}"
                                       for c in type(exc).__mro__]),
            "message": np.array(str(exc)[:MAX_MESSAGE]),
        }
    return {"raised": np.array(False)}


def _inherited_normed(module, x, residual):
    """The layer norm an AddLayerNorm that subclasses the student's MyLayerNorm
    inherits, applied to the float32-or-wider sum, or None for a module written
    from scratch (or one whose inherited forward fails). Exercise 1 grades that
    norm; the AddLayerNorm checks judge the add and the dtypes around it, so one
    slip in MyLayerNorm is not charged again here."""
    import torch

    parents = [cls for cls in type(module).__mro__[1:] if cls.__name__ == "MyLayerNorm"]
    if not parents:
        return None
    wide = torch.promote_types(x.dtype, torch.float32)
    if residual is not None:
        wide = torch.promote_types(wide, residual.dtype)
    total = x.detach().to(wide)
    if residual is not None:
        total = total + residual.detach().to(wide)
    try:
        with torch.no_grad():
            return parents[0].forward(module, total)
    except Exception:  # noqa: BLE001 - Exercise 1's checks report its errors
        return None


def _probe_add_layer_norm(AddLayerNorm, case):
    """Call module(x, residual) (module(x) when the case has no residual);
    report both outputs and, when the case carries upstream gradients, the
    gradients of sum(upstream_sum * residual_sum + upstream_normed * normed)."""
    import torch
    from torch import nn

    module = _construct(AddLayerNorm, case)
    report = {"names": np.array(",".join(dict(module.named_parameters())))}
    x = torch.tensor(case["x"])
    if x.dtype == torch.float64:
        module = module.double()
    if "torch_weight" in case:
        theirs = nn.LayerNorm(_shape_argument(case)).to(x.dtype)
        _set_affine(theirs, case["torch_weight"], case["torch_bias"])
        try:
            module.load_state_dict(theirs.state_dict())
        except Exception as exc:  # the student's module may refuse torch's keys
            report["load_error"] = _error_text(exc)
            return report
    else:
        _set_affine(module, case.get("set_weight"), case.get("set_bias"))
    graded = "upstream_sum" in case
    x.requires_grad_(graded)
    residual = None
    if "residual" in case:
        residual = torch.tensor(case["residual"]).requires_grad_(graded)
        out = module(x, residual)
    else:
        out = module(x)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        report["returned"] = np.array(
            f"a {type(out).__name__}" + (f" of length {len(out)}"
                                          if isinstance(out, (tuple, list)) else ""))
        return report
    normed, residual_sum = out  # flash-attn's order: (out, residual)
    report["sum"], report["y"] = residual_sum, normed
    inherited = _inherited_normed(module, x, residual)
    if inherited is not None:
        report["inherited_y"] = inherited
    if not graded:
        return report
    loss = 0.0
    for output, key in ((residual_sum, "upstream_sum"), (normed, "upstream_normed")):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            loss = loss + (output * torch.tensor(case[key])).sum()
    if isinstance(loss, torch.Tensor):
        loss.backward()
    gamma, beta = _affine_parameters(module)
    return _gradients(report, (("x_grad", x), ("residual_grad", residual),
                               ("weight_grad", gamma), ("bias_grad", beta)))


def _dtype_name(tensor):
    return np.array(str(getattr(tensor, "dtype", type(tensor).__name__)).replace("torch.", ""))


def _probe_add_fp32_residual(AddLayerNorm, case):
    """Call module(x, residual) with x in case["x_dtype"] (bfloat16 values held
    as float32 in the case) and the residual in case["residual_dtype"]; report
    both outputs and their dtypes. Nothing is converted before the module
    sees it: the dtypes are the point."""
    import torch

    module = _construct(AddLayerNorm, case)
    _set_affine(module, case.get("set_weight"), case.get("set_bias"))
    x = torch.tensor(case["x"]).to(getattr(torch, str(case["x_dtype"])))
    residual = None
    with torch.no_grad():
        if "residual" in case:
            residual = torch.tensor(case["residual"]).to(
                getattr(torch, str(case["residual_dtype"])))
            out = module(x, residual)
        else:
            out = module(x)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return {"returned": np.array(f"a {type(out).__name__}")}
    normed, residual_sum = out
    report = {"sum": residual_sum, "y": normed, "sum_dtype": _dtype_name(residual_sum),
              "y_dtype": _dtype_name(normed)}
    inherited = _inherited_normed(module, x, residual)
    if inherited is not None:
        report["inherited_y"] = inherited
    return report


def _construct_2d(LayerNorm2d, case):
    """LayerNorm2d(C), or LayerNorm2d(C, eps=...) when the case names eps."""
    from torch import nn

    kwargs = {"eps": float(case["eps"])} if "eps" in case else {}
    module = LayerNorm2d(int(case["channels"]), **kwargs)
    if not isinstance(module, nn.Module):
        name = getattr(LayerNorm2d, "__name__", "LayerNorm2d")
        raise TypeError(
            f"{name} must subclass torch.nn.Module (class {name}(nn.Module): ...)"
        )
    return module


def _probe_layer_norm_2d(LayerNorm2d, case):
    """Build LayerNorm2d(C), report its parameters as built, set gamma and
    beta, call it on case["x"] (N, C, H, W); when the case carries
    "upstream", also the gradients of sum(upstream * y). An error raised by
    the forward pass is reported, not raised, so that the judge can name it."""
    import torch

    module = _construct_2d(LayerNorm2d, case)
    params = dict(module.named_parameters())
    report = {
        "names": np.array(",".join(params)),
        "shapes": np.array(";".join(f"{n}={list(p.shape)}" for n, p in params.items())),
    }
    for name in ("weight", "bias"):
        if name in params:
            report[f"initial_{name}"] = params[name].detach().clone()
    x = torch.tensor(case["x"])
    if x.dtype == torch.float64:
        module = module.double()
    if "set_weight" in case:
        _set_affine(module, case["set_weight"], case["set_bias"])
    if "x_dtype" in case:  # a bfloat16 input, its values held as float32
        x = x.to(getattr(torch, str(case["x_dtype"])))
    if bool(case.get("channels_last", False)):
        x = x.contiguous(memory_format=torch.channels_last)
    graded = "upstream" in case
    x.requires_grad_(graded)
    try:
        with torch.set_grad_enabled(graded):
            y = module(x)
    except Exception as exc:  # the judge names the likely cause
        report["forward_error"] = _error_text(exc)
        return report
    report["y"] = y
    report["y_dtype"] = np.array(str(getattr(y, "dtype", type(y).__name__)))
    if not graded:
        return report
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        report["missing"] = np.array("all: the output is not connected to the autograd graph")
        return report
    (y * torch.tensor(case["upstream"])).sum().backward()
    gamma, beta = _affine_parameters(module)
    return _gradients(report, (("x_grad", x), ("weight_grad", gamma), ("bias_grad", beta)))


def _probe_factory_kwargs(MyLayerNorm, case):
    """Build MyLayerNorm(shape, device=..., dtype=...) with the case's factory
    arguments (only those it names) and report each parameter's dtype and
    device, and its values where they live on the CPU."""
    import torch

    kwargs = _keyword_arguments(case)
    for key in ("device", "dtype"):
        if key in case:
            value = str(case[key])
            kwargs[key] = getattr(torch, value) if key == "dtype" else value
    module = MyLayerNorm(_shape_argument(case), **kwargs)
    params = dict(module.named_parameters())
    report = {"names": np.array(",".join(params)),
              "dtypes": np.array(";".join(f"{n}={str(p.dtype).replace('torch.', '')}"
                                          for n, p in params.items())),
              "devices": np.array(";".join(f"{n}={p.device.type}"
                                           for n, p in params.items()))}
    for name, parameter in params.items():
        if parameter.device.type == "cpu" and name in ("weight", "bias"):
            report[f"initial_{name}"] = parameter.detach().float()
    return report


def _probe_reset_repr(MyLayerNorm, case):
    """Scramble the parameters in place, call reset_parameters(), and report
    their values after it, whether they are still the same objects, and the
    module's extra_repr()."""
    import torch

    module = _construct(MyLayerNorm, case)
    before = {name: parameter for name, parameter in module.named_parameters()}
    with torch.no_grad():
        for parameter in before.values():
            parameter.uniform_(2.0, 3.0)
    report = {"extra_repr": np.array(str(module.extra_repr())[:MAX_MESSAGE])}
    try:
        module.reset_parameters()
    except Exception as exc:  # the judge names it
        report["reset_error"] = _error_text(exc)
        return report
    after = dict(module.named_parameters())
    report["same_objects"] = np.array(all(after.get(n) is p for n, p in before.items()))
    for name, parameter in after.items():
        report[f"reset_{name}"] = parameter.detach().float()
    return report


def _tied(model):
    """The model with its last Linear's weight set to its first module's, an
    nn.Embedding's: one Parameter held by two modules, as GPT-2 ties them."""
    model[-1].weight = model[0].weight
    return model


def _tied_head_first(MyLayerNorm):
    """A language model whose tied output head is registered before its
    embedding, so that a walk over the modules meets the shared Parameter
    first as an nn.Linear's weight."""
    from torch import nn

    class HeadFirstLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(16, 50, bias=False)
            self.emb = nn.Embedding(50, 16)
            self.mix = nn.Linear(16, 16)
            self.norm = MyLayerNorm(16)
            self.head.weight = self.emb.weight

    return HeadFirstLM()


def _probe_param_groups(pair, case):
    """Build the case's model from the student's MyLayerNorm and torch's layers,
    call adamw_param_groups(model, weight_decay) and report, for every named
    parameter of the model, the weight_decay of each group that holds it, and
    whether torch.optim.AdamW accepts the groups."""
    import torch
    from torch import nn

    adamw_param_groups, MyLayerNorm = pair
    torch.manual_seed(0)
    layers = {"mlp": lambda: nn.Sequential(
        nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 16, bias=False),
        MyLayerNorm(16)),
        "multi_axis": lambda: nn.Sequential(
        nn.Linear(12, 12), nn.Unflatten(-1, (3, 4)), MyLayerNorm((3, 4)),
        nn.Flatten(), nn.Linear(12, 2)),
        "conv": lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.Conv2d(8, 8, 1, bias=False),
        nn.BatchNorm2d(8)),
        "embedding": lambda: nn.Sequential(
        nn.Embedding(50, 16), nn.Linear(16, 16), MyLayerNorm(16), nn.Linear(16, 50)),
        "tied": lambda: _tied(nn.Sequential(
        nn.Embedding(50, 16), nn.Linear(16, 16), MyLayerNorm(16),
        nn.Linear(16, 50, bias=False))),
        "tied_head_first": lambda: _tied_head_first(MyLayerNorm)}
    model = layers[str(case["model"])]()
    weight_decay = float(case["weight_decay"])
    groups = adamw_param_groups(model, weight_decay)
    groups = list(groups)
    report = {}
    owner = {id(p): name for name, p in model.named_parameters()}
    held = {name: [] for name in owner.values()}
    strangers = 0
    for group in groups:
        params = group["params"] if isinstance(group, dict) else group
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        decay = float(group.get("weight_decay", 0.01)) if isinstance(group, dict) else 0.01
        for parameter in params:
            name = owner.get(id(parameter))
            if name is None:
                strangers += 1
            else:
                held[name].append(decay)
    for name, decays in held.items():
        report[f"decay:{name}"] = np.array(decays, np.float64)
    report["strangers"] = np.array(strangers)
    try:
        torch.optim.AdamW(groups, lr=1e-3)
        report["adamw_error"] = np.array("")
    except Exception as exc:  # the judge names it
        report["adamw_error"] = _error_text(exc)
    return report


def _gradients(report, tensors):
    """`report` with each (key, tensor)'s gradient, and under "missing" the keys of
    those that got none."""
    missing = []
    for key, tensor in tensors:
        if tensor is None or tensor.grad is None:
            missing.append(key)
        else:
            report[key] = tensor.grad
    report["missing"] = np.array(",".join(missing))
    return report


def _answers_as_text(answers, case):
    return {name: np.array(answer_text(value)[:MAX_MESSAGE]) for name, value in answers.items()}


def _sequences_as_text(answers, case):
    """Each answer that is a sequence of numbers (tuple, list, numpy array,
    tensor) as the text of each entry (answer_text); anything else as its own."""
    report = {}
    for name, value in answers.items():
        if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
            value = value.tolist()
        if isinstance(value, (list, tuple)) and value:
            report[name] = np.array([answer_text(entry)[:MAX_MESSAGE] for entry in value])
        else:
            report[name] = np.array(answer_text(value)[:MAX_MESSAGE])
    return report


def check_my_layer_norm_parameters(MyLayerNorm):
    """Check MyLayerNorm's parameters: names, shapes, dtype, initial values."""
    run_check("my_layer_norm_parameters", MyLayerNorm, _probe_module)


def check_my_layer_norm_forward(MyLayerNorm):
    """Check MyLayerNorm(...)(x) against nn.LayerNorm for int and tuple shapes."""
    run_check("my_layer_norm_forward", MyLayerNorm, _probe_module)


def check_my_layer_norm_float64(MyLayerNorm):
    """Check MyLayerNorm on float64 inputs: normalized in float64, not narrower."""
    run_check("my_layer_norm_float64", MyLayerNorm, _probe_module)


def check_my_layer_norm_low_precision(MyLayerNorm):
    """Check MyLayerNorm on bfloat16 and float16 inputs: float32 statistics,
    the output in the input's dtype."""
    run_check("my_layer_norm_low_precision", MyLayerNorm, _probe_module)


def check_my_layer_norm_flags(MyLayerNorm):
    """Check the eps, elementwise_affine and bias arguments of MyLayerNorm."""
    run_check("my_layer_norm_flags", MyLayerNorm, _probe_module)


def check_my_layer_norm_state_dict(MyLayerNorm):
    """Check that state_dicts move between MyLayerNorm and nn.LayerNorm."""
    run_check("my_layer_norm_state_dict", MyLayerNorm, _probe_state_dict)


def check_my_layer_norm_autograd(MyLayerNorm):
    """Check the gradients MyLayerNorm gives to its input, weight and bias."""
    run_check("my_layer_norm_autograd", MyLayerNorm, _probe_autograd)


def check_my_layer_norm_shape_error(MyLayerNorm):
    """Check that MyLayerNorm refuses a mismatched input with a clear message."""
    run_check("my_layer_norm_shape_error", MyLayerNorm, _probe_shape_error)


def check_add_layer_norm_module(AddLayerNorm):
    """Check AddLayerNorm(...)(x, residual) -> (normed, residual_sum)."""
    run_check("add_layer_norm_module", AddLayerNorm, _probe_add_layer_norm)


def check_add_layer_norm_fp32_residual(AddLayerNorm):
    """Check AddLayerNorm's dtypes: a bfloat16 x on a float32 residual stream."""
    run_check("add_layer_norm_fp32_residual", AddLayerNorm, _probe_add_fp32_residual)


def check_layer_norm_2d_forward(LayerNorm2d):
    """Check LayerNorm2d(C)(x) for (N, C, H, W) inputs: parameters and output."""
    run_check("layer_norm_2d_forward", LayerNorm2d, _probe_layer_norm_2d)


def check_layer_norm_2d_dtypes_layouts(LayerNorm2d):
    """Check LayerNorm2d on float64 and bfloat16 inputs and on maps stored
    channels last."""
    run_check("layer_norm_2d_dtypes_layouts", LayerNorm2d, _probe_layer_norm_2d)


def check_layer_norm_2d_gradients(LayerNorm2d):
    """Check the gradients autograd finds through LayerNorm2d, for its input,
    weight and bias, against torch's layer norm on the channels-last view."""
    run_check("layer_norm_2d_gradients", LayerNorm2d, _probe_layer_norm_2d)


def check_my_layer_norm_factory_kwargs(MyLayerNorm):
    """Check MyLayerNorm's device= and dtype= arguments, as nn.LayerNorm's."""
    run_check("my_layer_norm_factory_kwargs", MyLayerNorm, _probe_factory_kwargs)


def check_my_layer_norm_reset_repr(MyLayerNorm):
    """Check MyLayerNorm.reset_parameters() and MyLayerNorm.extra_repr()."""
    run_check("my_layer_norm_reset_repr", MyLayerNorm, _probe_reset_repr)


def check_adamw_param_groups(adamw_param_groups, MyLayerNorm):
    """Check which parameters adamw_param_groups puts under weight decay."""
    run_check("adamw_param_groups", (adamw_param_groups, MyLayerNorm), _probe_param_groups)


def check_channel_norm_invariances(**answers):
    """Check the predicted counts of outputs that three edits change, under
    instance norm and under GroupNorm with two groups."""
    run_check("channel_norm_invariances", answers, _sequences_as_text)


def check_add_norm_memory_bytes(**answers):
    """Check the bytes moved by the unfused and the fused add + norm."""
    run_check("add_norm_memory_bytes", answers, _answers_as_text)
