"""Unit 05 checks, the student-facing half: how each exercise is called.

The cases carry weights as plain arrays keyed "w:<parameter name>"; a probe
builds the student's module, checks its parameters against the naming
contract below, loads the weights, runs forward and backward in float64 and
returns the outputs and gradients ("g:<parameter name>" for a parameter).
The small harness blocks here are test scaffolding, not answers: they let the
make_model and gradient_profile checks run without depending on the
student's blocks, which exercises 1 and 2 judge.
"""

import contextlib

import numpy as np

from normref.checks._runner import answer_text, run_check, to_array

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


def _scale_like_deepnet(block, beta):
    """Test scaffolding: DeepNet's beta on the value rows of attn.qkv and on
    attn.proj, mlp.fc and mlp.proj, so that make_model is judged on how it
    builds and initializes a model, not on the student's deepnorm_scale_,
    which exercise 3 grades."""
    torch = _torch()
    with torch.no_grad():
        qkv = block.attn.qkv.weight
        qkv[2 * qkv.shape[1]:] *= beta
        for linear in (block.attn.proj, block.mlp.fc, block.mlp.proj):
            linear.weight *= beta


def _deepnorm_harness(PostLNBlock):
    """Test scaffolding: a DeepNorm block made from the notebook's provided
    Post-LN block, standing in for a DeepNormBlock not yet written."""

    class DeepNormHarnessBlock(PostLNBlock):
        def __init__(self, d_model, n_heads, d_ff, alpha):
            super().__init__(d_model, n_heads, d_ff)
            self.alpha = alpha

        def forward(self, x):
            x = self.ln1(self.alpha * x + self.attn(x))
            return self.ln2(self.alpha * x + self.mlp(x))

    return DeepNormHarnessBlock


def _unfinished(block_class, *extra):
    """Whether the student's block still raises NotImplementedError when it
    is built or run on a tiny input (an exercise left for later)."""
    try:
        block_class(8, 2, 16, *extra)(_torch().zeros(1, 2, 8))
    except NotImplementedError:
        return True
    except Exception:  # a finished block with a slip: its exercise judges it
        return False
    return False


def _stand_ins(found):
    """The scaffolding make_model's notebook globals get while it is judged:
    DeepNet's scaling, and a harness for each of exercises 1 and 2 that is
    not written yet, so that make_model loses no points for them."""
    stand_ins = {"deepnorm_scale_": _scale_like_deepnet}
    harnesses = {"SandwichLNBlock": ("PreLNBlock", _sandwich_harness, ()),
                 "DeepNormBlock": ("PostLNBlock", _deepnorm_harness, (1.5,))}
    for name, (base, harness, extra) in harnesses.items():
        own, provided = found.get(name), found.get(base)
        if own is not None and provided is not None and _unfinished(own, *extra):
            stand_ins[name] = harness(provided)
    return stand_ins


@contextlib.contextmanager
def _scaffold_for_make_model(make_model):
    """While make_model runs, the deepnorm_scale_ it calls by name from its
    notebook is the scaffolding above, and so is each block it would build
    from an exercise not written yet."""
    found = getattr(make_model, "__globals__", {})
    stand_ins = {name: value for name, value in _stand_ins(found).items()
                 if name in found}
    replaced = {name: found[name] for name in stand_ins}
    found.update(stand_ins)
    try:
        yield
    finally:
        found.update(replaced)


def _probe_make_model(make_model, case):
    """Build the student's model for one kind and seed. Report its parameter
    names and the norm of each parameter (the initialization), each block's
    alpha (NaN where it has none) and, for the provided Pre-LN and Post-LN
    blocks only, the gradient norm of every block's mlp.proj.weight on the
    case's batch, as the notebook's grad_norms_by_layer measures it: the
    student's own new blocks are judged by their own exercises, and so is
    their deepnorm_scale_ (see _scaffold_for_make_model)."""
    torch = _torch()
    F = torch.nn.functional
    kind = str(case["kind"])
    with _scaffold_for_make_model(make_model):
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


# --- exercise 9: the gradient profile with the later branches cut ---

def _sandwich_harness(PreLNBlock):
    """Test scaffolding: a sandwich-LN block made from the notebook's
    provided Pre-LN block, so that gradient_profile is checked on sandwich-LN
    without depending on the student's own SandwichLNBlock (exercise 1)."""
    nn = _torch().nn

    class SandwichHarnessBlock(PreLNBlock):
        def __init__(self, d_model, n_heads, d_ff):
            super().__init__(d_model, n_heads, d_ff)
            self.ln1_out = nn.LayerNorm(d_model)
            self.ln2_out = nn.LayerNorm(d_model)

        def forward(self, x):
            x = x + self.ln1_out(self.attn(self.ln1(x)))
            return x + self.ln2_out(self.mlp(self.ln2(x)))

    return SandwichHarnessBlock


def _probe_gradient_profile(subject, case):
    """Build a Pre-LN or sandwich-LN TinyLM from the notebook's provided
    classes, load the case's weights (float64), and call the student's
    gradient_profile three times on it: cut, intact, then with the default,
    in that order (so that a cut left behind by the first call shows in the
    next two)."""
    gradient_profile, TinyLM, PreLNBlock = subject
    torch = _torch()
    d, heads, d_ff = int(case["d_model"]), int(case["n_heads"]), int(case["d_ff"])
    block = (_sandwich_harness(PreLNBlock) if str(case["kind"]) == "sandwich"
             else PreLNBlock)
    model = TinyLM(int(case["vocab"]), d,
                   [block(d, heads, d_ff) for _ in range(int(case["n_layers"]))],
                   True, max_len=int(case["max_len"]))
    _load_by_contract(model, _weights(case), "the test model")
    batch = (torch.from_numpy(case["inputs"].copy()), torch.from_numpy(case["targets"].copy()))
    result = {}
    for key, kwargs in (("cut", {"detach_branches": True}),
                        ("intact", {"detach_branches": False}), ("default", {})):
        try:
            profile = gradient_profile(model, batch, **kwargs)
        except RuntimeError as error:
            if key == "cut" and "not have been used in the graph" in str(error):
                raise RuntimeError(
                    f"{error} Hint: with detach_branches=True an early block's "
                    "mlp.proj lost every road to the loss: cut only what each ln1 "
                    "and ln2 reads, not a whole block's input, so that the residual "
                    "path stays") from None
            raise
        result[key] = to_array(profile, what=f"gradient_profile's result ({key})")
    return result


def check_gradient_profile(gradient_profile, TinyLM, PreLNBlock):
    """Check gradient_profile(model, batch, detach_branches) on Pre-LN and
    sandwich-LN models built from the provided classes, against the
    reference, in float64."""
    run_check("blocks_gradient_profile", (gradient_profile, TinyLM, PreLNBlock),
              _probe_gradient_profile)


# --- exercise 6: the first step's update ---

def _probe_first_step_update(subject, case):
    """Build a TinyLM of the case's kind ("pre" or "post") from the notebook's
    provided classes, load the case's weights (float64), call the student's
    first_step_update twice on it, and report both values and the weights
    the model holds afterwards ("p:<name>")."""
    first_step_update, TinyLM, blocks_by_kind = subject
    torch = _torch()
    kind = str(case["kind"])
    d, heads, d_ff = int(case["d_model"]), int(case["n_heads"]), int(case["d_ff"])
    block = blocks_by_kind[kind]
    model = TinyLM(int(case["vocab"]), d,
                   [block(d, heads, d_ff) for _ in range(int(case["n_layers"]))],
                   kind == "pre", max_len=int(case["max_len"]))
    params = _load_by_contract(model, _weights(case), "the test model")
    batch = (torch.from_numpy(case["inputs"].copy()), torch.from_numpy(case["targets"].copy()))
    lr = float(case["lr"])
    result = {key: to_array(first_step_update(model, batch, lr),
                            what=f"first_step_update's result ({key} call)")
              for key in ("first", "second")}
    result.update({f"p:{name}": p.detach() for name, p in params.items()})
    return result


def check_first_step_update(first_step_update, TinyLM, PreLNBlock, PostLNBlock):
    """Check first_step_update(model, batch, lr) on Pre-LN and Post-LN models
    built from the provided classes, against the reference, in float64."""
    run_check("blocks_first_step_update",
              (first_step_update, TinyLM, {"pre": PreLNBlock, "post": PostLNBlock}),
              _probe_first_step_update)


# --- exercise 10: adaLN-Zero ---

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


# --- exercise 7: warm-up ---

def _probe_warmup_lr(warmup_lr, case):
    """The student's learning rate at every step of the case's range, as
    floats; NaN where the call failed by dividing by zero (reported as such)."""
    lr, warmup_steps = float(case["lr"]), int(case["warmup_steps"])
    rates = []
    for step in range(int(case["steps"])):
        try:
            value = warmup_lr(step, lr, warmup_steps)
        except ZeroDivisionError:
            return {"rates": np.array([]), "zero_division": np.array(True)}
        rates.append(float(to_array(value, what=f"warmup_lr({step}, {lr:g}, "
                                               f"{warmup_steps})").reshape(())))
    return {"rates": np.array(rates), "zero_division": np.array(False)}


def check_warmup_lr(warmup_lr):
    """Check warmup_lr(step, lr, warmup_steps) against the linear warm-up."""
    run_check("blocks_warmup_lr", warmup_lr, _probe_warmup_lr)


def _rates_as_numbers(answers, case):
    """Each answer as a float (numbers, numpy and torch scalars, fractions,
    strings such as "1e-2"); NaN with "<name>:text" when it is none of them."""
    result = {}
    for name, value in answers.items():
        try:
            result[name] = np.array(float(value))
        except (TypeError, ValueError):
            result[name] = np.array(np.nan)
            result[f"{name}:text"] = np.array(answer_text(value))
    return result


def _probe_warmup_sweep(subject, case):
    """The answers as numbers, and the rate the student's warmup_lr gives each
    step of the sweep's warm-up runs (one row per rate of the case), which
    their sweep trained with; no "schedule" where warmup_lr fails."""
    warmup_lr, answers = subject
    result = _rates_as_numbers(answers, case)
    warmup, steps = int(case["warmup_steps"]), int(case["steps"])
    try:
        result["schedule"] = np.array([
            [float(to_array(warmup_lr(step, lr, warmup), what="warmup_lr's result").reshape(()))
             for step in range(steps)]
            for lr in case["rates"].tolist()])
    except Exception:  # a broken warmup_lr costs its own cell: judge on the reference's
        pass
    return result


def check_warmup_sweep(warmup_lr, **answers):
    """Check the lowest learning rates at which the Post-LN toy fails to
    learn, without and with warm-up, against training runs of the reference
    that follow the student's warm-up schedule (so that a slip in warmup_lr
    costs that cell only) or the reference's."""
    run_check("blocks_warmup_sweep", (warmup_lr, answers), _probe_warmup_sweep)


def _probe_lowest_failing_lr(lowest_failing_lr, case):
    """Call lowest_failing_lr with a stand-in for train_post_ln that returns
    the case's losses, one per rate, and record every (lr, warmup_steps) it
    was called with; the answer is NaN with "none" set when it is None."""
    losses = dict(zip(case["rates"].tolist(), case["losses"].tolist()))
    calls = []

    def train(lr, warmup_steps, *args, **kwargs):
        calls.append((float(lr), float(warmup_steps)))
        for rate, loss in losses.items():
            if abs(float(lr) - rate) <= 1e-6 * rate:
                return loss
        raise ValueError(f"train was called with lr {float(lr):g}, which is not "
                         "one of the rates it was given")

    answer = lowest_failing_lr(int(case["warmup_steps"]), tuple(losses), train=train)
    value = np.nan if answer is None else float(
        to_array(answer, what="lowest_failing_lr's result").reshape(()))
    return {"answer": np.array(value), "none": np.array(answer is None),
            "calls": np.array(calls, dtype=float).reshape(-1, 2)}


def check_lowest_failing_lr(lowest_failing_lr):
    """Check lowest_failing_lr(warmup_steps, rates, train) on training runs
    whose losses the grader makes up, so that only the search is judged."""
    run_check("blocks_lowest_failing_lr", lowest_failing_lr, _probe_lowest_failing_lr)



# --- exercise 8: DeepNet's two changes, one at a time ---

def _probe_ablation_model(ablation_model, case):
    """Build the student's ablation model for one pair of switches, with the
    scaffolding of make_model's check (DeepNet's scaling, and a DeepNorm block
    where exercise 2 is not written yet); report its parameter names, the
    norm of each parameter and each block's alpha (NaN where it has none)."""
    with _scaffold_for_make_model(ablation_model):
        model = ablation_model(bool(case["use_alpha"]), bool(case["use_beta"]),
                               int(case["n_layers"]), int(case["seed"]))
    params = sorted(model.named_parameters())
    return {
        "names": np.array("\n".join(name for name, _ in params)),
        "param_norms": np.array([float(p.detach().double().norm()) for _, p in params]),
        "alphas": np.array([float(getattr(block, "alpha", float("nan")))
                            for block in model.blocks]),
    }


def check_ablation_model(ablation_model):
    """Check ablation_model(use_alpha, use_beta, n_layers, seed) for the four
    pairs of switches: parameters, initialization and alpha, against the
    reference's."""
    run_check("blocks_ablation_model", ablation_model, _probe_ablation_model)


def _reported_losses(losses, names):
    """The student's loss for each variant name as a float (NaN where it is
    missing or not a number); dict keys are read in any case."""
    by_name = {str(key).strip().lower(): value for key, value in losses.items()}
    reported = []
    for name in names:
        try:
            reported.append(float(to_array(by_name[name]).reshape(())))
        except (KeyError, TypeError, ValueError):
            reported.append(np.nan)
    return np.array(reported)


def _probe_ablation(subject, case):
    """The student's reported losses and conclusion, and their own runs again:
    each variant's model from their ablation_model, trained by the notebook's
    train_model at the case's rate without warm-up. The runs are repeated only
    when every reported loss is a number."""
    ablation_model, train_model, losses, rescued_by = subject
    names = str(case["names"]).split()
    result = {"rescued_by": np.array(answer_text(rescued_by))}
    if not isinstance(losses, dict):
        result["losses_type"] = np.array(type(losses).__name__)
        return result
    result["reported"] = _reported_losses(losses, names)
    if np.all(np.isfinite(result["reported"])):
        rerun = []
        for use_alpha, use_beta in case["switches"].tolist():
            model = ablation_model(bool(use_alpha), bool(use_beta), int(case["n_layers"]),
                                   int(case["seed"]))
            loss = train_model(model, float(case["lr"]), 0, seed=int(case["seed"]))
            rerun.append(float(to_array(loss, what="train_model's result").reshape(())))
        result["rerun"] = np.array(rerun)
    return result


def check_ablation(ablation_model, train_model, *, losses, rescued_by):
    """Check the reported losses of the four variants against the student's
    own runs, repeated, and the conclusion against those losses."""
    run_check("blocks_ablation", (ablation_model, train_model, losses, rescued_by),
              _probe_ablation)


# --- exercise 11: QK-norm ---

QK_CONTRACT = (
    "qkv.weight (3d, d), qkv.bias (3d,), proj.weight (d, d), proj.bias (d,), "
    "ln_q.weight (d_head,), ln_q.bias (d_head,), ln_k.weight (d_head,), ln_k.bias (d_head,)"
)


def _probe_qk_norm_attention(attention_class, case):
    attn = attention_class(int(case["d_model"]), int(case["n_heads"]))
    params = _load_by_contract(attn, _weights(case), "your attention",
                               f"The contract is: {QK_CONTRACT}.")
    attn.eval()
    return _forward_backward(attn, params, [case["x"]], case["dy"])


def check_qk_norm_attention(QKNormAttention):
    """Check QKNormAttention(d_model, n_heads): output and gradients, float64."""
    run_check("blocks_qk_norm_attention", QKNormAttention, _probe_qk_norm_attention)


def _harness_attention(d_model, n_heads, qk_norm):
    """The parts attention_logits reads, with no forward pass: qkv, n_heads,
    and ln_q and ln_k where qk_norm."""
    nn = _torch().nn

    class Parts(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_heads = n_heads
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            if qk_norm:
                self.ln_q = nn.LayerNorm(d_model // n_heads)
                self.ln_k = nn.LayerNorm(d_model // n_heads)

    return Parts()


def _probe_attention_logits(attention_logits, case):
    torch = _torch()
    attn = _harness_attention(int(case["d_model"]), int(case["n_heads"]),
                              bool(case["qk_norm"]))
    _load_by_contract(attn, _weights(case), "the test attention")
    with torch.no_grad():
        logits = attention_logits(attn, torch.from_numpy(case["x"].copy()))
    return {"logits": to_array(logits, what="attention_logits' result")}


def check_attention_logits(attention_logits):
    """Check attention_logits(attn, x) on attention modules with and without
    ln_q and ln_k, against the reference, in float64."""
    run_check("blocks_attention_logits", attention_logits, _probe_attention_logits)
