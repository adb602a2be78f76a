"""Unit 05 checks, the student-facing half: how each exercise is called.

The cases carry weights as plain arrays keyed "w:<parameter name>"; a probe
builds the student's module, checks its parameters against the naming
contract below, loads the weights, runs forward and backward in float64 and
returns the outputs and gradients ("g:<parameter name>" for a parameter).
The small harness block here is test scaffolding, not an answer: it lets the
initialization check run without depending on the student's blocks; the
model check, likewise, runs only the provided blocks.
"""

import numpy as np

from normref.checks._runner import run_check, to_array

BLOCK_CONTRACT = (
    "ln1.weight (d,), ln1.bias (d,), attn.qkv.weight (3d, d), attn.qkv.bias (3d,), "
    "attn.proj.weight (d, d), attn.proj.bias (d,), ln2.weight (d,), ln2.bias (d,), "
    "mlp.fc.weight (d_ff, d), mlp.fc.bias (d_ff,), mlp.proj.weight (d, d_ff), "
    "mlp.proj.bias (d,)"
)
SANDWICH_CONTRACT = BLOCK_CONTRACT + (
    ", ln1_out.weight (d,), ln1_out.bias (d,), ln2_out.weight (d,), ln2_out.bias (d,)")


def _torch():
    import torch

    return torch


def _weights(case):
    return {key[2:]: value for key, value in case.items() if key.startswith("w:")}


def _load_by_contract(module, weights, what, contract_hint=""):
    """Copy `weights` into `module` (made float64) after checking the names and shapes."""
    torch = _torch()
    module.double()
    params = dict(module.named_parameters())
    missing = sorted(set(weights) - set(params))
    unexpected = sorted(set(params) - set(weights))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unexpected:
            parts.append(f"unexpected {unexpected}")
        raise ValueError(f"{what}'s parameters do not follow the naming contract: "
                         f"{'; '.join(parts)}. {contract_hint}".strip())
    for name, value in weights.items():
        if tuple(params[name].shape) != value.shape:
            raise ValueError(f"{what}'s parameter {name} has shape {tuple(params[name].shape)}; "
                             f"the contract gives it shape {value.shape}. {contract_hint}".strip())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(torch.from_numpy(value))
    return params


def _forward_backward(module, params, inputs, dy):
    """y = module(*inputs); backward from the upstream gradient dy; all as arrays."""
    torch = _torch()
    tensors = [torch.from_numpy(a.copy()).requires_grad_(a.dtype.kind == "f") for a in inputs]
    y = module(*tensors)
    if not torch.is_tensor(y):
        raise TypeError(f"forward returned a {type(y).__name__}, not a tensor")
    if tuple(y.shape) != dy.shape:
        return {"y": y.detach()}  # the judge reports the shape
    (y * torch.from_numpy(dy)).sum().backward()
    result = {"y": y.detach()}
    for i, t in enumerate(tensors):
        if t.requires_grad:
            result[f"d{i}"] = t.grad if t.grad is not None else torch.zeros_like(t)
    for name, p in params.items():
        # NaN marks a parameter the forward pass never used.
        result[f"g:{name}"] = p.grad if p.grad is not None else torch.full_like(p, float("nan"))
    return result


def _block_args(case):
    args = [int(case["d_model"]), int(case["n_heads"]), int(case["d_ff"])]
    if "alpha" in case:
        args.append(float(case["alpha"]))
    return args


def _probe_block(block_class, case):
    block = block_class(*_block_args(case))
    contract = SANDWICH_CONTRACT if "w:ln1_out.weight" in case else BLOCK_CONTRACT
    params = _load_by_contract(block, _weights(case), "your block",
                               f"The contract is: {contract}.")
    block.eval()
    return _forward_backward(block, params, [case["x"]], case["dy"])


def check_sandwich_ln_block(SandwichLNBlock):
    """Check SandwichLNBlock(d_model, n_heads, d_ff): output and gradients, float64."""
    run_check("blocks_sandwich_ln", SandwichLNBlock, _probe_block)


def check_deepnorm_block(DeepNormBlock):
    """Check DeepNormBlock(d_model, n_heads, d_ff, alpha): output and gradients, float64."""
    run_check("blocks_deepnorm", DeepNormBlock, _probe_block)


def _harness_block(d_model, d_ff):
    """A block with the contract's submodules and no forward pass: something
    for deepnorm_scale_ to work on."""
    nn = _torch().nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_heads = 1
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)

    class Feedforward(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(d_model, d_ff)
            self.proj = nn.Linear(d_ff, d_model)

    class HarnessBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(d_model), Attention()
            self.ln2, self.mlp = nn.LayerNorm(d_model), Feedforward()

    return HarnessBlock()


def _probe_deepnorm_scale(deepnorm_scale_, case):
    block = _harness_block(int(case["d_model"]), int(case["d_ff"]))
    params = _load_by_contract(block, _weights(case), "the test block")
    deepnorm_scale_(block, float(case["beta"]))
    return {f"p:{name}": p.detach() for name, p in params.items()}


def check_deepnorm_scale(deepnorm_scale_):
    """Check deepnorm_scale_(block, beta): which weights it scales, in place."""
    run_check("blocks_deepnorm_scale", deepnorm_scale_, _probe_deepnorm_scale)


def _probe_make_model(make_model, case):
    """Build the student's model for one kind and seed. Report its parameter
    names and the norm of each parameter (the initialization), each block's
    alpha (NaN where it has none) and, for the provided Pre-LN and Post-LN
    blocks only, the gradient norm of every block's mlp.proj.weight on the
    case's batch, as the notebook's grad_norms_by_layer measures it: the
    student's own new blocks are judged by their own exercises."""
    torch = _torch()
    F = torch.nn.functional
    kind = str(case["kind"])
    model = make_model(kind, int(case["n_layers"]), int(case["seed"]))
    params = sorted(model.named_parameters())
    result = {
        "names": np.array("\n".join(name for name, _ in params)),
        "param_norms": np.array([float(p.detach().double().norm()) for _, p in params]),
        "alphas": np.array([float(getattr(block, "alpha", float("nan")))
                            for block in model.blocks]),
    }
    if kind in ("pre", "post"):
        inputs = torch.from_numpy(case["inputs"].copy())
        targets = torch.from_numpy(case["targets"].copy())
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        weights = [block.mlp.proj.weight for block in model.blocks]
        grads = torch.autograd.grad(loss, weights)
        result["norms"] = np.array([float(g.double().norm()) for g in grads])
    return result


def check_make_model(make_model):
    """Check make_model(kind, n_layers, seed) for the four kinds: parameter
    names, initialization, DeepNorm's alpha, and for Pre-LN and Post-LN the
    gradient norms of its blocks, against the reference's."""
    run_check("blocks_make_model", make_model, _probe_make_model)


def _answers_as_text(answers, case):
    return {name: np.array(str(value)) for name, value in answers.items()}


# The assignment's experiment: 8 blocks, seeds 0, 1, 2, one copy-task batch
# per seed (the case carries them as "inputs<seed>", "targets<seed>").
PROFILE_KINDS = ("pre", "post", "sandwich", "deepnorm")
PROFILE_LAYERS, PROFILE_SEEDS = 8, (0, 1, 2)


def _own_profiles(make_model, case):
    """{kind: (PROFILE_LAYERS,)} measured with the student's make_model, as
    the notebook's experiment cell measures it; None if it cannot be run."""
    torch = _torch()
    F = torch.nn.functional
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        profiles = {}
        for kind in PROFILE_KINDS:
            rows = []
            for seed in PROFILE_SEEDS:
                model = make_model(kind, PROFILE_LAYERS, seed)
                inputs = torch.from_numpy(case[f"inputs{seed}"].copy())
                targets = torch.from_numpy(case[f"targets{seed}"].copy())
                logits = model(inputs)
                loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
                weights = [block.mlp.proj.weight for block in model.blocks]
                grads = torch.autograd.grad(loss, weights)
                rows.append([float(g.double().norm()) for g in grads])
            profiles[kind] = np.median(np.array(rows), axis=0)
        return profiles
    except Exception:  # a broken make_model: only the grader's table counts
        return None
    finally:
        torch.set_num_threads(before)


def _answers_and_own_profiles(answers, case):
    """The answers as text and, when make_model is given, the profiles that
    the student's own make_model gives ("own:<kind>")."""
    answers = dict(answers)
    make_model = answers.pop("make_model", None)
    result = _answers_as_text(answers, case)
    own = _own_profiles(make_model, case) if make_model is not None else None
    for kind, profile in (own or {}).items():
        result[f"own:{kind}"] = profile
    return result


def check_prediction(**answers):
    """Check that the predictions are given, before the experiment runs."""
    run_check("blocks_prediction", answers, _answers_as_text)


def check_profile_shapes(make_model=None, **answers):
    """Check the two choices read off the measured profiles: right for the
    grader's table, or for the table the student's make_model gives."""
    answers["make_model"] = make_model
    run_check("blocks_profile_shapes", answers, _answers_and_own_profiles)


def check_profile_numbers(make_model=None, **answers):
    """Check the two ratios read off the measured profiles: right for the
    grader's table, or for the table the student's make_model gives."""
    answers["make_model"] = make_model
    run_check("blocks_profile_numbers", answers, _answers_and_own_profiles)


# --- exercise 7: the gradient profile with the later branches cut ---

def _probe_gradient_profile(subject, case):
    """Build a Pre-LN TinyLM from the notebook's provided classes, load the
    case's weights (float64), and call the student's gradient_profile three
    times on it: cut, intact, then with the default, in that order (so that
    a cut left behind by the first call shows in the next two)."""
    gradient_profile, TinyLM, PreLNBlock = subject
    torch = _torch()
    d, heads, d_ff = int(case["d_model"]), int(case["n_heads"]), int(case["d_ff"])
    model = TinyLM(int(case["vocab"]), d,
                   [PreLNBlock(d, heads, d_ff) for _ in range(int(case["n_layers"]))],
                   True, max_len=int(case["max_len"]))
    _load_by_contract(model, _weights(case), "the test model")
    batch = (torch.from_numpy(case["inputs"].copy()), torch.from_numpy(case["targets"].copy()))
    result = {}
    for key, kwargs in (("cut", {"detach_branches": True}),
                        ("intact", {"detach_branches": False}), ("default", {})):
        result[key] = to_array(gradient_profile(model, batch, **kwargs),
                               what=f"gradient_profile's result ({key})")
    return result


def check_gradient_profile(gradient_profile, TinyLM, PreLNBlock):
    """Check gradient_profile(model, batch, detach_branches) on Pre-LN models
    built from the provided classes, against the reference, in float64."""
    run_check("blocks_gradient_profile", (gradient_profile, TinyLM, PreLNBlock),
              _probe_gradient_profile)


def check_cut_prediction(**answers):
    """Check that the prediction about the cut branches is given."""
    run_check("blocks_cut_prediction", answers, _answers_as_text)


def check_cut_reading(gradient_profile=None, make_model=None, **answers):
    """Check the letter and the ratio read off the cut profiles: right for the
    grader's table, or for the one the student's own functions give."""
    answers["functions"] = (gradient_profile, make_model)
    run_check("blocks_cut_reading", answers, _answers_and_cut_profiles)


def _cut_profiles(functions, case):
    """{"intact": ..., "cut": ...}: the sandwich-LN profiles (PROFILE_LAYERS,)
    measured with the student's own make_model and gradient_profile, median
    over PROFILE_SEEDS; None if they cannot be run."""
    gradient_profile, make_model = functions
    if gradient_profile is None or make_model is None:
        return None
    torch = _torch()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = {"intact": [], "cut": []}
        for seed in PROFILE_SEEDS:
            batch = (torch.from_numpy(case[f"inputs{seed}"].copy()),
                     torch.from_numpy(case[f"targets{seed}"].copy()))
            for key in rows:
                model = make_model("sandwich", PROFILE_LAYERS, seed)
                profile = gradient_profile(model, batch, detach_branches=key == "cut")
                rows[key].append(to_array(profile).astype(np.float64))
        return {key: np.median(np.array(value), axis=0) for key, value in rows.items()}
    except Exception:  # broken functions: only the grader's table counts
        return None
    finally:
        torch.set_num_threads(before)


def _answers_and_cut_profiles(answers, case):
    answers = dict(answers)
    functions = answers.pop("functions", (None, None))
    result = _answers_as_text(answers, case)
    own = _cut_profiles(functions, case)
    for key, profile in (own or {}).items():
        result[f"own:{key}"] = profile
    return result


# --- exercise 8: adaLN-Zero ---

ADALN_CONTRACT = (
    "attn.qkv.weight (3d, d), attn.qkv.bias (3d,), attn.proj.weight (d, d), "
    "attn.proj.bias (d,), mlp.fc.weight (d_ff, d), mlp.fc.bias (d_ff,), "
    "mlp.proj.weight (d, d_ff), mlp.proj.bias (d,), ada.weight (6d, d_cond), "
    "ada.bias (6d,); ln1 and ln2 have no parameters"
)


def _probe_adaln_zero(block_class, case):
    """A new block as the student's __init__ leaves it (its output and the
    gradient of its parameters on the case's x and cond), then the same
    block with the case's weights: output and every gradient, float64."""
    torch = _torch()
    d, heads, d_ff, d_cond = (int(case[k]) for k in ("d_model", "n_heads", "d_ff", "d_cond"))
    torch.manual_seed(int(case["init_seed"]))
    block = block_class(d, heads, d_ff, d_cond)
    block.double().eval()
    fresh = _forward_backward(block, dict(block.named_parameters()),
                              [case["x"], case["cond"]], case["dy"])
    result = {f"fresh_{key}": value for key, value in fresh.items()
              if key in ("y", "g:ada.weight", "g:ada.bias")}
    for p in block.parameters():
        p.grad = None
    params = _load_by_contract(block, _weights(case), "your block",
                               f"The contract is: {ADALN_CONTRACT}.")
    result.update(_forward_backward(block, params, [case["x"], case["cond"]], case["dy"]))
    return result


def check_adaln_zero_block(AdaLNZeroBlock):
    """Check AdaLNZeroBlock(d_model, n_heads, d_ff, d_cond): a new block is the
    identity with a gradient reaching ada; with the grader's weights, output
    and gradients (x, cond, every parameter) against the reference, float64."""
    run_check("blocks_adaln_zero", AdaLNZeroBlock, _probe_adaln_zero)
