"""Unit 05 checks, the grader-facing half: inputs, references, diagnoses."""

import contextlib
import functools

import numpy as np
import torch
import torch.nn.functional as F

from normref import blocks
from normref.checks import blocks_probes as probes
from normref.checks._registry import Check
from normref.checks.tolerances import _show, matches, mismatch

F64 = np.float64


def _linear(rng, fan_out, fan_in, prefix):
    return {f"w:{prefix}.weight": rng.normal(0, fan_in**-0.5, (fan_out, fan_in)),
            f"w:{prefix}.bias": rng.normal(0, 0.1, fan_out)}


def _layer_norm(rng, d, prefix):
    return {f"w:{prefix}.weight": 1 + 0.3 * rng.normal(size=d),
            f"w:{prefix}.bias": 0.2 * rng.normal(size=d)}


def _block_weights(rng, d, d_ff):
    case = {}
    case.update(_layer_norm(rng, d, "ln1"))
    case.update(_linear(rng, 3 * d, d, "attn.qkv"))
    case.update(_linear(rng, d, d, "attn.proj"))
    case.update(_layer_norm(rng, d, "ln2"))
    case.update(_linear(rng, d_ff, d, "mlp.fc"))
    case.update(_linear(rng, d, d_ff, "mlp.proj"))
    return case


def _block_case(rng, batch, seq_len, d, heads, d_ff, offset=0.0, **extra):
    case = {"d_model": np.array(d), "n_heads": np.array(heads), "d_ff": np.array(d_ff),
            "x": offset + rng.normal(size=(batch, seq_len, d)),
            "dy": rng.normal(size=(batch, seq_len, d))}
    case.update(_block_weights(rng, d, d_ff))
    case.update({key: np.array(value) for key, value in extra.items()})
    return case


def _reference_run(module, case, inputs):
    params = probes._load_by_contract(module, probes._weights(case), "the reference")
    module.eval()
    return {k: v.detach().numpy() for k, v in
            probes._forward_backward(module, params, inputs, case["dy"]).items()}


def _compare_gradients(case, output, expected):
    """Messages for the input gradient and parameter gradients, first mismatch only."""
    for key, label in (("d0", "the gradient with respect to x"),) + tuple(
            (k, f"the gradient of {k[2:]}") for k in sorted(expected) if k.startswith("g:")):
        got = output[key]
        if key.startswith("g:") and got.shape == expected[key].shape and np.all(np.isnan(got)):
            return (f"no gradient reached {key[2:]}: is it used in your forward pass "
                    "(and not under torch.no_grad or .detach)?")
        problem = mismatch(got, expected[key], dtype=F64, what=label)
        if problem:
            return (problem + ". The output is right, so look for a .detach(), .data or "
                    "in-place change that cuts the graph")
    return None


def _block_judge(kind, diagnose, *, make=None, what="your block's output"):
    """kind names the reference block; make(case), where given, builds it instead."""
    def judge(case, output):
        reference = (make(case) if make is not None
                     else blocks.BLOCK_CLASSES[kind](*probes._block_args(case)))
        expected = _reference_run(reference, case, [case["x"]])
        y = output["y"]
        problem = mismatch(y, expected["y"], dtype=F64, what=what)
        if problem:
            hint = diagnose(reference, case, y) if y.shape == expected["y"].shape else None
            return problem + (f". Hint: {hint}" if hint else "")
        return _compare_gradients(case, output, expected)

    return judge


def _first_match(candidates, x, y):
    with torch.no_grad():
        for hint, forward in candidates.items():
            wrong = forward(x).numpy()
            if wrong.shape == y.shape and matches(y, wrong, dtype=F64):
                return hint
    return None


# --- exercise 1: sandwich-LN ---

def _sandwich_cases(rng):
    def case(*args, **kwargs):
        c = _block_case(rng, *args, **kwargs)
        d = int(c["d_model"])
        c.update(_layer_norm(rng, d, "ln1_out"))
        c.update(_layer_norm(rng, d, "ln2_out"))
        return c

    return [
        ("one sequence of 5 tokens, d = 8, 2 heads, d_ff = 32", case(1, 5, 8, 2, 32)),
        ("3 sequences of 7 tokens, d = 16, 4 heads, d_ff = 24", case(3, 7, 16, 4, 24)),
        ("2 sequences of 6 tokens far from zero (x = 5 + N(0, 1)), d = 12, 3 heads, d_ff = 20",
         case(2, 6, 12, 3, 20, offset=5.0)),
        ("a single token, d = 8, 1 head, d_ff = 16", case(2, 1, 8, 1, 16)),
    ]


def _diagnose_sandwich(block, case, y):
    attn, mlp = block.attn, block.mlp
    ln1, ln2, out1, out2 = block.ln1, block.ln2, block.ln1_out, block.ln2_out

    def pre_only(x):
        x = x + attn(ln1(x))
        return x + mlp(ln2(x))

    def out_after_add(x):
        x = out1(x + attn(ln1(x)))
        return out2(x + mlp(ln2(x)))

    def swapped(x):
        x = x + out2(attn(ln1(x)))
        return x + out1(mlp(ln2(x)))

    def output_norms_only(x):
        x = x + out1(attn(x))
        return x + out2(mlp(x))

    candidates = {
        "normalize each sublayer's output with its own LN before the add: "
        "x + ln1_out(attn(ln1(x))); as written, ln1_out and ln2_out change nothing": pre_only,
        "ln1_out normalizes the sublayer's output before the add, not the sum: the "
        "residual path must stay unnormalized": out_after_add,
        "ln1_out belongs to the attention sublayer and ln2_out to the MLP": swapped,
        "keep Pre-LN's input norms too: each sublayer reads ln1(x) (or ln2(x))":
            output_norms_only,
    }
    return _first_match(candidates, torch.from_numpy(case["x"]), y)


# --- exercise 2: the DeepNorm block ---

def _deepnorm_cases(rng):
    return [
        ("one sequence of 5 tokens, d = 8, 2 heads, d_ff = 32, alpha = 1.75",
         _block_case(rng, 1, 5, 8, 2, 32, alpha=1.75)),
        ("3 sequences of 7 tokens, d = 16, 4 heads, d_ff = 24, alpha = 2.875",
         _block_case(rng, 3, 7, 16, 4, 24, alpha=2.875)),
        ("2 sequences of 6 tokens far from zero (x = 5 + N(0, 1)), d = 12, 3 heads, "
         "d_ff = 20, alpha = 1.25", _block_case(rng, 2, 6, 12, 3, 20, offset=5.0, alpha=1.25)),
        ("a single token, d = 8, 1 head, d_ff = 16, alpha = 1 (plain Post-LN)",
         _block_case(rng, 2, 1, 8, 1, 16, alpha=1.0)),
    ]


def _diagnose_deepnorm(block, case, y):
    attn, mlp, ln1, ln2, a = block.attn, block.mlp, block.ln1, block.ln2, block.alpha

    def no_alpha(x):
        x = ln1(x + attn(x))
        return ln2(x + mlp(x))

    def alpha_on_sublayer(x):
        x = ln1(x + a * attn(x))
        return ln2(x + a * mlp(x))

    def alpha_after_norm(x):
        x = a * ln1(x + attn(x))
        return a * ln2(x + mlp(x))

    def pre_order(x):
        x = a * x + attn(ln1(x))
        return a * x + mlp(ln2(x))

    def first_only(x):
        x = ln1(a * x + attn(x))
        return ln2(x + mlp(x))

    candidates = {
        "alpha multiplies the residual x before the add: ln1(alpha * x + attn(x))":
            alpha_on_sublayer,
        "alpha scales x inside the LN, before the add, not the LN's output": alpha_after_norm,
        "DeepNorm keeps Post-LN's order: add, then normalize, ln1(alpha * x + attn(x))":
            pre_order,
        "scale the residual in both sublayers: ln2(alpha * x + mlp(x)) too": first_only,
        "scale the residual by alpha: ln1(alpha * x + attn(x)); this is plain Post-LN":
            no_alpha,
    }
    if a == 1.0:
        candidates = {}
    return _first_match(candidates, torch.from_numpy(case["x"]), y)


# --- exercise 3: DeepNet's initialization ---

SCALED = ("attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight")


def _deepnorm_scale_cases(rng):
    def case(d, d_ff, beta):
        return {"d_model": np.array(d), "d_ff": np.array(d_ff), "beta": np.array(beta),
                **_block_weights(rng, d, d_ff)}

    return [("d = 8, d_ff = 32, beta = 0.35", case(8, 32, 0.35)),
            ("d = 6, d_ff = 10, beta = 0.5", case(6, 10, 0.5))]


def _scaled_weights(case, beta, *, qkv_rows="values", others=SCALED):
    weights = probes._weights(case)
    d = int(case["d_model"])
    out = {name: value.copy() for name, value in weights.items()}
    rows = {"values": slice(2 * d, 3 * d), "queries": slice(0, d), "all": slice(0, 3 * d),
            "none": slice(0, 0)}[qkv_rows]
    out["attn.qkv.weight"][rows] *= beta
    for name in others:
        out[name] *= beta
    return out


def _judge_deepnorm_scale(case, output):
    beta = float(case["beta"])
    expected = _scaled_weights(case, beta)
    got = {name[2:]: value for name, value in output.items() if name.startswith("p:")}
    if all(matches(got[name], expected[name], dtype=F64) for name in expected):
        return None
    candidates = {
        "change the block's own weights in place (for example `weight.mul_(beta)` under "
        "torch.no_grad()); a new tensor or a new block is not seen by the model":
            probes._weights(case),
        "scale only the value rows of attn.qkv.weight (rows 2d to 3d): queries and keys "
        "keep their initialization": _scaled_weights(case, beta, qkv_rows="all"),
        "the values are the last d rows of attn.qkv.weight (queries, keys, values, in "
        "that order)": _scaled_weights(case, beta, qkv_rows="queries"),
        "multiply by beta, do not divide": _scaled_weights(case, 1 / beta),
    }
    for hint, wrong in candidates.items():
        if all(matches(got[name], wrong[name], dtype=F64) for name in wrong):
            return f"the weights after deepnorm_scale_(block, {beta:g}) are not right. Hint: {hint}"
    weights = [name for name in expected if name.endswith("weight")]
    if all(matches(got[name], expected[name], dtype=F64) for name in weights):
        changed = [name for name in sorted(expected) if name not in weights
                   and not matches(got[name], expected[name], dtype=F64)]
        return (f"the weights are right, but {', '.join(changed)} changed too. Hint: leave "
                "the biases as they are: only the weights are scaled")
    for name in sorted(expected):
        problem = mismatch(got[name], expected[name], dtype=F64, what=name)
        if problem:
            original = probes._weights(case)[name]
            should = ("should be left as it is" if np.array_equal(expected[name], original)
                      else "should be multiplied by beta (for attn.qkv.weight: its value rows)")
            return f"{problem}: it {should}"
    return None


# --- exercise 4: the four models of the experiment ---

KINDS = ("pre", "post", "sandwich", "deepnorm")
MODEL_LAYERS = 3


def _make_model_cases(rng):
    cases = []
    for kind in KINDS:
        seed = int(rng.integers(100_000))
        inputs, targets = blocks.experiment_batch(seed)
        cases.append((f"{kind}, {MODEL_LAYERS} blocks, seed {seed}", {
            "kind": np.array(kind), "n_layers": np.array(MODEL_LAYERS),
            "seed": np.array(seed), "inputs": inputs.numpy(), "targets": targets.numpy()}))
    return cases


@contextlib.contextmanager
def _one_thread():
    """Tiny models on one thread: on a loaded machine two threads that wait
    for each other make them fifty times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _norms(model, case):
    batch = (torch.from_numpy(case["inputs"]), torch.from_numpy(case["targets"]))
    return blocks.grad_norms_by_layer(model, batch).numpy()


def _variant(kind, n_layers, seed, *, alpha=None, beta=None, final_ln=None):
    """experiment_model with one ingredient changed, to name a likely slip."""
    c = blocks.EXPERIMENT
    model = blocks.TinyLM(c["vocab"], c["d_model"], n_layers, c["n_heads"], kind,
                          d_ff=c["d_ff"], max_len=2 * c["n_symbols"])
    if final_ln is not None:
        model.ln_f = torch.nn.LayerNorm(c["d_model"]) if final_ln else torch.nn.Identity()
    if alpha is not None:
        for block in model.blocks:
            block.alpha = alpha
    blocks.init_like_xiong(model, seed)
    if beta is not None:
        for block in model.blocks:
            blocks.deepnorm_scale_(block, beta)
    return model


def _judge_make_model(case, output):
    with _one_thread():
        return _judge_model_norms(case, output)


def _param_norms(model):
    return np.array([float(p.detach().double().norm())
                     for _, p in sorted(model.named_parameters())])


def _judge_model_norms(case, output):
    kind, n_layers, seed = str(case["kind"]), int(case["n_layers"]), int(case["seed"])
    model = blocks.experiment_model(kind, n_layers, seed)
    names = sorted(name for name, _ in model.named_parameters())
    got_names = str(output["names"]).split("\n")
    if got_names != names:
        missing = sorted(set(names) - set(got_names))
        unexpected = sorted(set(got_names) - set(names))
        hint = {True: "this kind needs the final LN (final_ln=True): its residual stream "
                      "is never normalized",
                False: "this kind ends every block with an LN already: no final LN "
                       "(final_ln=False)"}[blocks.FINAL_LN[kind]]
        if not ({"ln_f.weight", "ln_f.bias"} & set(missing + unexpected)):
            hint = (f"build {n_layers} blocks of this kind's class and pass them to the "
                    "notebook's TinyLM")
        return (f"your {kind} model's parameters differ from the expected ones "
                f"(missing {missing[:4]}, unexpected {unexpected[:4]}). Hint: {hint}")
    alpha, beta = blocks.deepnorm_constants(n_layers)
    got = output["param_norms"]
    problem = mismatch(got, _param_norms(model), dtype="float32",
                       what=f"the norms of your {kind} model's parameters after initialization")
    if problem:
        candidates = {
            "initialize with init_like_xiong(model, seed), with the seed you are given":
                _variant(kind, n_layers, seed + 1),
        }
        if kind == "deepnorm":
            candidates = {
                "apply deepnorm_scale_(block, beta) to every block after init_like_xiong "
                "(initializing afterwards undoes it)": _variant(kind, n_layers, seed),
                "n_layers counts blocks, not sublayers: take beta from "
                "deepnorm_constants(n_layers)": _variant(
                    kind, n_layers, seed, beta=blocks.deepnorm_constants(2 * n_layers)[1]),
                **candidates}
        for hint, wrong in candidates.items():
            if matches(got, _param_norms(wrong), dtype="float32"):
                return f"{problem}. Hint: {hint}"
        return problem
    if kind == "deepnorm":
        alphas = output["alphas"]
        if alphas.shape != (n_layers,) or not np.allclose(alphas, alpha, rtol=1e-6):
            return (f"your DeepNorm blocks have alpha {_show(alphas)}; expected "
                    f"{alpha:.6g} in each, from deepnorm_constants({n_layers})")
    if kind in ("pre", "post"):
        problem = mismatch(output["norms"], _norms(model, case), dtype="float32",
                           what=f"the gradient norms of your {kind} model's blocks")
        if problem:
            other = {"pre": "post", "post": "pre"}[kind]
            if matches(output["norms"], _norms(blocks.experiment_model(other, n_layers, seed),
                                               case), dtype="float32"):
                return (f"{problem}. Hint: those are the norms of a {other} model: "
                        f"'{kind}' takes {blocks.BLOCK_CLASSES[kind].__name__}")
            return problem
    return None


# --- answers given as a choice ---

def _choice(answer):
    """A choice as a student may type it: any case, spaces around it."""
    return str(answer).strip().lower()


# --- exercise 9: the gradient profile with the later branches cut ---

def _model_weights(rng, vocab, d, n_layers, d_ff, max_len):
    """Weights for every parameter of a Pre-LN TinyLM, keyed "w:<name>"."""
    case = {"w:tok_emb.weight": rng.normal(size=(vocab, d)),
            "w:pos_emb.weight": rng.normal(size=(max_len, d)),
            "w:head.weight": rng.normal(0, d**-0.5, (vocab, d))}
    for i in range(n_layers):
        case.update({f"w:blocks.{i}.{k[2:]}": v for k, v in _block_weights(rng, d, d_ff).items()})
    case.update(_layer_norm(rng, d, "ln_f"))
    return case


def _gradient_profile_cases(rng):
    def case(kind, vocab, d, heads, d_ff, n_layers, batch, n_symbols):
        max_len = 2 * n_symbols
        inputs = rng.integers(0, vocab, (batch, max_len))
        targets = rng.integers(0, vocab, (batch, max_len))
        targets[:, :n_symbols] = blocks.IGNORE
        weights = _model_weights(rng, vocab, d, n_layers, d_ff, max_len)
        if kind == "sandwich":
            for i in range(n_layers):
                for norm in ("ln1_out", "ln2_out"):
                    weights.update(_layer_norm(rng, d, f"blocks.{i}.{norm}"))
        return {"kind": np.array(kind), "vocab": np.array(vocab), "d_model": np.array(d),
                "n_heads": np.array(heads), "d_ff": np.array(d_ff),
                "n_layers": np.array(n_layers), "max_len": np.array(max_len),
                "inputs": inputs, "targets": targets, **weights}

    return [("3 Pre-LN blocks, d = 8, 2 heads, d_ff = 16, vocabulary 7, 2 sequences of 6",
             case("pre", 7, 8, 2, 16, 3, 2, 3)),
            ("4 Pre-LN blocks, d = 12, 3 heads, d_ff = 20, vocabulary 9, 3 sequences of 8",
             case("pre", 9, 12, 3, 20, 4, 3, 4)),
            ("3 sandwich-LN blocks, d = 8, 2 heads, d_ff = 16, vocabulary 7, 2 sequences "
             "of 6", case("sandwich", 7, 8, 2, 16, 3, 2, 3))]


def _reference_model(case):
    d, heads, d_ff = int(case["d_model"]), int(case["n_heads"]), int(case["d_ff"])
    model = blocks.TinyLM(int(case["vocab"]), d, int(case["n_layers"]), heads,
                          str(case["kind"]), d_ff=d_ff, max_len=int(case["max_len"]))
    probes._load_by_contract(model, probes._weights(case), "the reference")
    batch = (torch.from_numpy(case["inputs"]), torch.from_numpy(case["targets"]))
    return model, batch


def _profile_by_hand(model, batch, *, cut_attn=False, cut_mlp=False, cut_stream=False,
                     final_ln=True, positions=True, output_norms=True):
    """The profile of a slip, computed step by step: which tensors are cut,
    and what the forward pass leaves out (output_norms=False: a sandwich-LN
    block run as a Pre-LN one, without ln1_out and ln2_out)."""
    inputs, targets = batch
    h = model.tok_emb(inputs)  # B, T, d
    if positions:
        h = h + model.pos_emb(torch.arange(inputs.shape[1]))
    keep = torch.nn.Identity()
    for block in model.blocks:
        out1, out2 = ((getattr(block, "ln1_out", keep), getattr(block, "ln2_out", keep))
                      if output_norms else (keep, keep))
        a_in = h.detach() if cut_attn else h
        h = (h.detach() if cut_stream else h) + out1(block.attn(block.ln1(a_in)))
        m_in = h.detach() if cut_mlp else h
        h = (h.detach() if cut_stream else h) + out2(block.mlp(block.ln2(m_in)))
    logits = model.head(model.ln_f(h) if final_ln else h)  # B, T, vocab
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=blocks.IGNORE)
    weights = [block.mlp.proj.weight for block in model.blocks]
    grads = torch.autograd.grad(loss, weights, allow_unused=True)
    return np.array([0.0 if g is None else float(g.double().norm()) for g in grads])


def _judge_gradient_profile(case, output):
    model, batch = _reference_model(case)
    n_layers = int(case["n_layers"])
    with _one_thread():
        cut = blocks.grad_norms_by_layer(model, batch, detach_branches=True).numpy()
        intact = blocks.grad_norms_by_layer(model, batch).numpy()
        slips_cut = {
            "detach_branches=True changed nothing: cut the gradient where each sublayer "
            "reads the stream (the input of ln1 and of ln2)": intact,
            "you cut the residual stream itself, so no gradient reaches earlier blocks at "
            "all; cut only the copy each sublayer reads (the input of ln1 and ln2) and "
            "keep the residual path": _profile_by_hand(model, batch, cut_attn=True,
                                                        cut_mlp=True, cut_stream=True),
            "cut the attention branch too: ln1's input must be detached as well as ln2's":
                _profile_by_hand(model, batch, cut_mlp=True),
            "cut the MLP branch too: ln2's input must be detached as well as ln1's":
                _profile_by_hand(model, batch, cut_attn=True),
        }
        if str(case["kind"]) == "sandwich":
            slips_cut["on this sandwich-LN model your cut profile leaves out ln1_out and "
                      "ln2_out, as if its blocks were Pre-LN ones: cut where ln1 and ln2 "
                      "read the stream and keep every block's own forward pass (a hook "
                      "on ln1 and ln2 does; replacing the blocks' class does not)"] = (
                _profile_by_hand(model, batch, cut_attn=True, cut_mlp=True,
                                 output_norms=False))
        slips_both = {
            "the loss goes through the final LN, ln_f, before the head":
                (_profile_by_hand(model, batch, cut_attn=True, cut_mlp=True, final_ln=False),
                 _profile_by_hand(model, batch, final_ln=False)),
            "the stream starts as the token embedding plus the position embedding":
                (_profile_by_hand(model, batch, cut_attn=True, cut_mlp=True, positions=False),
                 _profile_by_hand(model, batch, positions=False)),
            "return the norm of each gradient, not its square": (cut**2, intact**2),
        }
    for key in ("cut", "intact", "default"):
        got = output[key]
        if got.shape != (n_layers,):
            return (f"gradient_profile returned shape {got.shape} ({key}); expected "
                    f"({n_layers},), one norm per block, first block first")
    right = {key: matches(output[key], value, dtype=F64)
             for key, value in (("cut", cut), ("intact", intact), ("default", intact))}
    if all(right.values()):
        return None
    if right["cut"] and not right["intact"] and matches(output["intact"], cut, dtype=F64):
        return ("with detach_branches=False after a call with True, your function still cut "
                "the branches. Hint: remove every hook (or undo every change) before "
                "returning, also when something fails (try/finally): the model must be left "
                "as it was")
    if right["cut"] and right["intact"]:
        return ("gradient_profile(model, batch), without detach_branches, does not give the "
                "intact profile. Hint: detach_branches defaults to False")
    for hint, (wrong_cut, wrong_intact) in slips_both.items():
        if matches(output["cut"], wrong_cut, dtype=F64) and (
                matches(output["intact"], wrong_intact, dtype=F64)):
            return f"your profiles are not right. Hint: {hint}"
    if not right["cut"]:
        problem = mismatch(output["cut"], cut, dtype=F64,
                           what="your profile with detach_branches=True")
        for hint, wrong in slips_cut.items():
            if matches(output["cut"], wrong, dtype=F64):
                return f"{problem}. Hint: {hint}"
        return problem
    return mismatch(output["intact"], intact, dtype=F64,
                    what="your profile with detach_branches=False")


# --- exercise 6: the first step's update ---

UPDATE_LR = {"pre": 1e-3, "post": 3e-3}


def _first_step_update_cases(rng):
    def case(kind, vocab, d, heads, d_ff, n_layers, batch, n_symbols):
        max_len = 2 * n_symbols
        inputs = rng.integers(0, vocab, (batch, max_len))
        targets = rng.integers(0, vocab, (batch, max_len))
        targets[:, :n_symbols] = blocks.IGNORE
        weights = _model_weights(rng, vocab, d, n_layers, d_ff, max_len)
        if kind == "post":
            weights = {k: v for k, v in weights.items() if not k.startswith("w:ln_f.")}
        return {"kind": np.array(kind), "vocab": np.array(vocab), "d_model": np.array(d),
                "n_heads": np.array(heads), "d_ff": np.array(d_ff),
                "n_layers": np.array(n_layers), "max_len": np.array(max_len),
                "lr": np.array(UPDATE_LR[kind]), "inputs": inputs, "targets": targets,
                **weights}

    return [("3 Post-LN blocks, d = 8, 2 heads, d_ff = 16, vocabulary 7, 2 sequences of 6, "
             "lr 3e-3", case("post", 7, 8, 2, 16, 3, 2, 3)),
            ("2 Pre-LN blocks, d = 12, 3 heads, d_ff = 20, vocabulary 9, 3 sequences of 8, "
             "lr 1e-3", case("pre", 9, 12, 3, 20, 2, 3, 4))]


def _update_model(case):
    d, heads, d_ff = int(case["d_model"]), int(case["n_heads"]), int(case["d_ff"])
    model = blocks.TinyLM(int(case["vocab"]), d, int(case["n_layers"]), heads,
                          str(case["kind"]), d_ff=d_ff, max_len=int(case["max_len"]))
    probes._load_by_contract(model, probes._weights(case), "the reference")
    batch = (torch.from_numpy(case["inputs"]), torch.from_numpy(case["targets"]))
    return model, batch


def _update_by_hand(model, batch, lr, *, step="sign", relative=True):
    """The update of a slip: another step (Adam's own with eps 1e-8, plain
    gradient descent, up the gradient), or the change not divided by the
    output's size. The model is put back afterwards."""
    inputs, _ = batch
    params = list(model.parameters())
    grads = torch.autograd.grad(blocks.lm_loss(model, batch), params)
    moves = {"sign": lambda g: -g.sign(), "adam": lambda g: -g / (g.abs() + 1e-8),
             "sgd": lambda g: -g, "up": lambda g: g.sign()}[step]
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        before = model(inputs)
        for p, g in zip(params, grads):
            p += lr * moves(g)
        after = model(inputs)
        for p, value in zip(params, saved):
            p.copy_(value)
    change = float((after - before).norm())
    return change / float(before.norm()) if relative else change


def _judge_first_step_update(case, output):
    model, batch = _update_model(case)
    lr = float(case["lr"])
    with _one_thread():
        expected = blocks.first_step_update(model, batch, lr)
        adam = _update_by_hand(model, batch, lr, step="adam")
        slips = {
            "Adam's first step moves every parameter by lr * sign(g), whatever the size of "
            "its gradient g: this is plain gradient descent, lr * g":
                _update_by_hand(model, batch, lr, step="sgd"),
            "step down the gradient, p - lr * sign(g), as an optimizer does":
                _update_by_hand(model, batch, lr, step="up"),
            "divide the change of the logits by the size of the logits before the step: "
            "the update is relative": _update_by_hand(model, batch, lr, relative=False),
        }
    first, second = output["first"], output["second"]
    if first.size != 1:
        return (f"first_step_update returned shape {first.shape}; expected one number, "
                "the relative change of the logits")
    right = [matches(value, expected, dtype=F64) or matches(value, adam, dtype=F64)
             for value in (first.reshape(()), second.reshape(()))]
    restored = all(matches(output[f"p:{name}"], value, dtype=F64)
                   for name, value in probes._weights(case).items())
    if right[0] and (not right[1] or not restored):
        return ("the first call is right, but it left the model changed, so a second call "
                "measured another model. Hint: put every parameter back as it was before "
                "returning (keep a copy and copy it back, also when something fails)")
    if right[0]:
        return None
    problem = mismatch(first.reshape(()), expected, dtype=F64,
                       what="the update of your first_step_update")
    for hint, wrong in slips.items():
        if matches(first.reshape(()), wrong, dtype=F64):
            return f"{problem}. Hint: {hint}"
    return problem


# --- exercise 10: adaLN-Zero ---

def _adaln_cases(rng):
    def case(batch, seq_len, d, heads, d_ff, d_cond, offset=0.0):
        c = {"d_model": np.array(d), "n_heads": np.array(heads), "d_ff": np.array(d_ff),
             "d_cond": np.array(d_cond), "init_seed": np.array(int(rng.integers(100_000))),
             "x": offset + rng.normal(size=(batch, seq_len, d)),
             "cond": rng.normal(size=(batch, d_cond)),
             "dy": rng.normal(size=(batch, seq_len, d))}
        c.update(_linear(rng, 3 * d, d, "attn.qkv"))
        c.update(_linear(rng, d, d, "attn.proj"))
        c.update(_linear(rng, d_ff, d, "mlp.fc"))
        c.update(_linear(rng, d, d_ff, "mlp.proj"))
        c.update(_linear(rng, 6 * d, d_cond, "ada"))
        c["w:ada.bias"] = rng.normal(0, 0.5, 6 * d)  # gates and scales well away from 0
        return c

    return [
        ("2 sequences of 4 tokens, d = 8, 2 heads, d_ff = 16, d_cond = 5",
         case(2, 4, 8, 2, 16, 5)),
        ("3 sequences of 5 tokens far from zero (x = 3 + N(0, 1)), d = 12, 3 heads, "
         "d_ff = 20, d_cond = 7", case(3, 5, 12, 3, 20, 7, offset=3.0)),
        ("a single token, d = 8, 1 head, d_ff = 8, d_cond = 3", case(2, 1, 8, 1, 8, 3)),
    ]


def _adaln_variant(block, x, cond, *, order=(0, 1, 2), one_plus=True, silu=True, gates=True,
                   shared=False):
    """AdaLNZeroBlock's forward with one slip: the chunk order (positions of
    shift, scale and gate), no 1 +, no SiLU, no gates, one set for both."""
    mod = block.ada(F.silu(cond) if silu else cond).unsqueeze(1)  # B, 1, 6d
    parts = mod.chunk(6, dim=-1)
    first, second = parts[:3], parts[:3] if shared else parts[3:]
    for chunk, (norm, sub) in zip((first, second),
                                  ((block.ln1, block.attn), (block.ln2, block.mlp))):
        shift, scale, gate = (chunk[i] for i in order)
        h = sub(norm(x) * ((1 + scale) if one_plus else scale) + shift)
        x = x + (gate * h if gates else h)
    return x


def _judge_adaln_zero(case, output):
    d, heads, d_ff, d_cond = (int(case[k]) for k in ("d_model", "n_heads", "d_ff", "d_cond"))
    reference = blocks.AdaLNZeroBlock(d, heads, d_ff, d_cond)
    expected = _reference_run(reference, case, [case["x"], case["cond"]])
    y = output["y"]
    problem = mismatch(y, expected["y"], dtype=F64, what="your block's output")
    if problem:
        candidates = {
            "the six vectors come in the order shift, scale, gate (attention), then shift, "
            "scale, gate (MLP)": {"order": (1, 0, 2)},
            "scale the normalized token by (1 + scale), not by scale: a zero output of ada "
            "must mean no change": {"one_plus": False},
            "ada reads silu(cond), not cond": {"silu": False},
            "multiply each sublayer's output by its gate before the add (that is what makes "
            "a new block the identity)": {"gates": False},
            "the MLP has its own shift, scale and gate: the last three of the six":
                {"shared": True},
        }
        if y.shape == expected["y"].shape:
            x, cond = torch.from_numpy(case["x"]), torch.from_numpy(case["cond"])
            with torch.no_grad():
                for hint, slip in candidates.items():
                    if matches(y, _adaln_variant(reference, x, cond, **slip).numpy(), dtype=F64):
                        return f"{problem}. Hint: {hint}"
        return problem
    problem = mismatch(output["d1"], expected["d1"], dtype=F64,
                       what="the gradient with respect to cond")
    if problem:
        return problem + ". The output is right: is cond detached somewhere?"
    problem = _compare_gradients(case, output, expected)
    if problem:
        return problem
    fresh = output["fresh_y"]
    if not matches(fresh, case["x"], dtype=F64):
        return ("a new block, as your __init__ leaves it, is not the identity: "
                f"{mismatch(fresh, case['x'], dtype=F64, what='its output')}. Hint: "
                "initialize ada's weight and bias to zero (nn.init.zeros_), so that every "
                "gate starts at 0")
    grads = [output.get(f"fresh_g:ada.{name}") for name in ("weight", "bias")]
    if any(g is None or not np.all(np.isfinite(g)) or not np.any(g) for g in grads):
        return ("a new block is the identity, but no gradient reaches ada: it could never "
                "learn to open its gates. Hint: make the block start as the identity through "
                "ada's zeros (every gate 0), and leave attn and mlp with their ordinary "
                "initialization")
    return None

# --- exercise 7: warm-up ---

def _warmup_lr_cases(rng):
    return [("lr 3e-3, warm-up of 4 steps, steps 0 to 7",
             {"lr": np.array(3e-3), "warmup_steps": np.array(4), "steps": np.array(8)}),
            ("lr 0.05, warm-up of 20 steps, steps 0 to 29",
             {"lr": np.array(0.05), "warmup_steps": np.array(20), "steps": np.array(30)}),
            ("lr 1e-2, no warm-up (warmup_steps = 0), steps 0 to 4",
             {"lr": np.array(1e-2), "warmup_steps": np.array(0), "steps": np.array(5)})]


def _judge_warmup_lr(case, output):
    lr, warmup, steps = float(case["lr"]), int(case["warmup_steps"]), int(case["steps"])
    if bool(output["zero_division"]):
        return (f"warmup_lr(step, {lr:g}, 0) divides by zero. Hint: warmup_steps = 0 means "
                "no warm-up: the rate is lr from the first step")
    got = output["rates"]
    expected = np.array([blocks.warmup_lr(step, lr, warmup) for step in range(steps)])
    problem = mismatch(got, expected, dtype=F64,
                       what=f"your rates for steps 0 to {steps - 1}")
    if not problem:
        return None
    ramp = np.arange(steps) / max(warmup, 1)
    slips = {
        "step counts from 0, and the first step already moves: it gets lr / warmup_steps, "
        "not 0, and step warmup_steps - 1 reaches lr": lr * np.minimum(1.0, ramp),
        "after the warm-up the rate stays at lr: it does not go on rising":
            lr * (np.arange(steps) + 1) / max(warmup, 1),
        "the rate rises to lr, it does not fall from it":
            lr * np.maximum(0.0, 1 - np.arange(steps) / max(warmup, 1)),
    }
    if warmup:
        for hint, wrong in slips.items():
            if matches(got, wrong, dtype=F64):
                return f"{problem}. Hint: {hint}"
    return problem


def _reference_stuck(lr, warmup_steps, schedules=None):
    """Whether the reference Post-LN toy, seed 0, ends stuck near chance; and its
    loss. schedules, where given, maps each rate to the rate of every step."""
    if schedules is None or not warmup_steps:
        loss = _sweep_loss(float(lr), int(warmup_steps))
    else:
        loss = _schedule_loss(float(lr), int(warmup_steps), schedules[lr])
    return loss > blocks.SWEEP["stuck_above"], loss


@functools.lru_cache(maxsize=32)
def _sweep_loss(lr, warmup_steps):
    """The reference run's final loss: from blocks.SWEEP_SEED0_LOSSES for the
    sweep's own rates and warm-up, else trained here."""
    known = blocks.SWEEP_SEED0_LOSSES.get((lr, warmup_steps))
    if known is not None and warmup_steps in (0, blocks.SWEEP["warmup_steps"]):
        return known
    with _one_thread():
        return blocks.sweep_final_loss(lr, warmup_steps, seed=0)


@functools.lru_cache(maxsize=32)
def _schedule_loss(lr, warmup_steps, schedule):
    with _one_thread():
        return blocks.sweep_final_loss(lr, warmup_steps, seed=0, schedule=schedule)


def _grid_rate(value, rates):
    """The grid rate that value is (relative tolerance 1e-6), or None."""
    for rate in rates:
        if np.isfinite(value) and abs(value - rate) <= 1e-6 * rate:
            return rate
    return None


def _warmup_sweep_cases(rng):
    return [("the rates at which the toy fails",
             {"rates": np.array(blocks.SWEEP["rates"]),
              "warmup_steps": np.array(blocks.SWEEP["warmup_steps"]),
              "steps": np.array(blocks.SWEEP["steps"])})]


def _student_schedules(case, output):
    """{rate: the rate of every step} under the student's warmup_lr, or None
    where it gave none, gave a rate that is not a finite number >= 0, or
    agrees with the reference's linear warm-up."""
    schedule = output.get("schedule")
    rates = blocks.SWEEP["rates"]
    shape = (len(rates), blocks.SWEEP["steps"])
    if schedule is None or schedule.shape != shape or not np.all(np.isfinite(schedule)) \
            or np.any(schedule < 0):
        return None
    reference = np.array([[blocks.warmup_lr(step, lr, blocks.SWEEP["warmup_steps"])
                           for step in range(shape[1])] for lr in rates])
    if matches(schedule, reference, dtype=F64):
        return None
    return {rate: tuple(row.tolist()) for rate, row in zip(rates, schedule)}


def _sweep_problem(found, schedules):
    """What is wrong with the two rates under these warm-up schedules (None:
    the reference's), or None."""
    rates, warmup = blocks.SWEEP["rates"], blocks.SWEEP["warmup_steps"]
    for name, steps in (("fails_without", 0), ("fails_with", warmup)):
        rate = found[name]
        setting = f"{steps}-step warm-up" if steps else "no warm-up"
        if steps and schedules is not None:
            setting += " (your warmup_lr's rates)"
        stuck, loss = _reference_stuck(rate, steps, schedules)
        if not stuck:
            return (f"{name} is {rate:g}, but at that rate Post-LN with {setting} learns "
                    f"(final loss {loss:.2f}, not above {blocks.SWEEP['stuck_above']}). "
                    "Hint: a run fails when its final loss stays above the threshold; check "
                    "which run your sweep reads")
        lower = [r for r in rates if r < rate]
        if lower:
            stuck_below, loss_below = _reference_stuck(lower[-1], steps, schedules)
            if stuck_below:
                return (f"{name} is {rate:g}, but Post-LN with {setting} already fails at "
                        f"{lower[-1]:g} (final loss {loss_below:.2f}). Hint: return the "
                        "lowest failing rate: try the rates from small to large and stop "
                        "at the first failure")
    return None


def _judge_warmup_sweep(case, output):
    """The two rates, judged on runs with the student's own warm-up schedule
    (what their sweep trained with), or with the reference's: a slip in
    warmup_lr is charged in its own cell, not here again."""
    rates = blocks.SWEEP["rates"]
    grid = ", ".join(f"{r:g}" for r in rates)
    found = {}
    for name in ("fails_without", "fails_with"):
        if name not in output:
            return f"no answer given for {name}"
        value = float(output[name])
        rate = _grid_rate(value, rates)
        if rate is None:
            shown = str(output.get(f"{name}:text", value))
            return (f"{name} is {shown}; answer with one of the rates of the sweep "
                    f"({grid}), the lowest at which the model fails")
        found[name] = rate
    # the reference's runs first: they are read from a table, while a student's own
    # schedule has to be trained here, inside the cell's time limit, which is scaled
    # from the reference solution's (table-fast) run
    problem = _sweep_problem(found, None)
    student = _student_schedules(case, output)
    if problem is None or student is None:
        return problem
    return _sweep_problem(found, student)


def _lowest_failing_cases(rng):
    return [
        ("rates 2e-3 to 5e-2 given out of order, warm-up of 0 steps; the runs fail at "
         "5e-3 and at 5e-2 and learn at 2e-2",
         {"rates": np.array([5e-2, 2e-2, 5e-3, 2e-3]),
          "losses": np.array([2.7, 0.4, 2.9, 0.3]), "warmup_steps": np.array(0)}),
        ("rates 1e-3, 4e-3, 1.6e-2, warm-up of 10 steps; only 1.6e-2 fails",
         {"rates": np.array([1e-3, 4e-3, 1.6e-2]),
          "losses": np.array([0.2, 0.5, 2.6]), "warmup_steps": np.array(10)}),
        ("rates 1e-3 and 1e-2, warm-up of 5 steps; every run learns",
         {"rates": np.array([1e-3, 1e-2]),
          "losses": np.array([0.1, 1.0]), "warmup_steps": np.array(5)}),
    ]


def _judge_lowest_failing_lr(case, output):
    rates, losses = case["rates"].tolist(), case["losses"].tolist()
    warmup, stuck = int(case["warmup_steps"]), blocks.SWEEP["stuck_above"]
    calls = output["calls"].reshape(-1, 2)
    if not len(calls):
        return ("your lowest_failing_lr never trained: it must call train(lr, "
                "warmup_steps), the function it is given, for its rates. Hint: the "
                "grader passes made-up runs through train; an answer read off elsewhere "
                "does not follow them")
    if np.any(calls[:, 1] != warmup):
        return (f"train was called with warmup_steps {calls[0, 1]:g}, not the {warmup} "
                "that lowest_failing_lr was given")
    failing = [rate for rate, loss in sorted(zip(rates, losses)) if loss > stuck]
    expected = failing[0] if failing else None
    got = None if bool(output["none"]) else float(output["answer"])
    if got is None and expected is None:
        return None
    if got is not None and expected is not None and abs(got - expected) <= 1e-6 * expected:
        return None
    shown = "None" if got is None else f"{got:g}"
    truth = "None" if expected is None else f"{expected:g}"
    problem = f"you returned {shown}, expected {truth}"
    first_given = next((rate for rate, loss in zip(rates, losses) if loss > stuck), None)
    if expected is None:
        hint = f"every run ends at or below STUCK = {stuck}: return None"
    elif got is None:
        hint = f"a run fails when its loss is above STUCK = {stuck}"
    elif np.isclose(got, first_given, rtol=1e-6, atol=0):
        hint = "the rates may come in any order: try them from the smallest up"
    elif np.any(np.isclose(got, failing, rtol=1e-6, atol=0)):
        hint = "return the lowest failing rate: stop at the first failure"
    else:
        hint = "return the rate whose run fails, not one whose run learns"
    return f"{problem}. Hint: {hint}"


# --- exercise 8: DeepNet's two changes, one at a time ---

ABLATION_LAYERS_CHECKED = 3  # the model check; the runs use blocks.ABLATION's depth
RESCUE_CHOICES = ("alpha", "beta", "either", "neither")
SWITCHES_SAID = {(True, False): "alpha only", (False, True): "beta only",
                 (True, True): "alpha and beta", (False, False): "neither"}


def _ablation_model_cases(rng):
    cases = []
    for use_alpha, use_beta in blocks.ABLATION["variants"].values():
        seed = int(rng.integers(100_000))
        cases.append((f"{SWITCHES_SAID[use_alpha, use_beta]}, {ABLATION_LAYERS_CHECKED} "
                       f"blocks, seed {seed}", {
                           "use_alpha": np.array(use_alpha), "use_beta": np.array(use_beta),
                           "n_layers": np.array(ABLATION_LAYERS_CHECKED),
                           "seed": np.array(seed)}))
    return cases


def _judge_ablation_model(case, output):
    with _one_thread():
        return _judge_ablation_norms(case, output)


def _judge_ablation_norms(case, output):
    use_alpha, use_beta = bool(case["use_alpha"]), bool(case["use_beta"])
    n_layers, seed = int(case["n_layers"]), int(case["seed"])
    model = blocks.ablation_model(use_alpha, use_beta, n_layers, seed)
    names = sorted(name for name, _ in model.named_parameters())
    got_names = str(output["names"]).split("\n")
    if got_names != names:
        missing = sorted(set(names) - set(got_names))
        unexpected = sorted(set(got_names) - set(names))
        return (f"your model's parameters differ from the expected ones (missing "
                f"{missing[:4]}, unexpected {unexpected[:4]}). Hint: {n_layers} DeepNorm "
                "blocks in the notebook's TinyLM, without the final LN, as make_model "
                "builds a DeepNorm model")
    # a block without alpha is a Post-LN block: alpha 1
    alphas = np.where(np.isnan(output["alphas"]), 1.0, output["alphas"])

    def built_like(wrong):
        own = np.array([block.alpha for block in wrong.blocks])
        return (matches(output["param_norms"], _param_norms(wrong), dtype="float32")
                and alphas.shape == own.shape and np.allclose(alphas, own, rtol=1e-6))

    problem = mismatch(output["param_norms"], _param_norms(model), dtype="float32",
                       what="the norms of your model's parameters after initialization")
    if problem:
        candidates = {
            "use_beta decides whether deepnorm_scale_ runs, and use_alpha decides alpha: "
            "the two switches are crossed": blocks.ablation_model(use_beta, use_alpha,
                                                                  n_layers, seed),
            "with use_beta False no weight is scaled: init_like_xiong alone":
                blocks.ablation_model(use_alpha, True, n_layers, seed),
            "with use_beta, apply deepnorm_scale_(block, beta) to every block after "
            "init_like_xiong (initializing afterwards undoes it)":
                blocks.ablation_model(use_alpha, False, n_layers, seed),
            "initialize with init_like_xiong(model, seed), with the seed you are given":
                blocks.ablation_model(use_alpha, use_beta, n_layers, seed + 1),
        }
        for hint, wrong in candidates.items():
            if built_like(wrong):
                return f"{problem}. Hint: {hint}"
        return problem
    alpha = blocks.deepnorm_constants(n_layers)[0] if use_alpha else 1.0
    if alphas.shape != (n_layers,) or not np.allclose(alphas, alpha, rtol=1e-6):
        source = (f"deepnorm_constants({n_layers})" if use_alpha
                  else "1, a Post-LN block, since use_alpha is False")
        return f"your blocks have alpha {_show(alphas)}; expected {alpha:.6g} in each, {source}"
    return None


def _ablation_cases(rng):
    c = blocks.ABLATION
    return [(f"the four variants, {c['n_layers']} blocks, lr {c['lr']:g}, seed {c['seed']}, "
             "no warm-up", {
                 "names": np.array(" ".join(c["variants"])),
                 "switches": np.array(list(c["variants"].values()), dtype=np.int64),
                 "n_layers": np.array(c["n_layers"]), "lr": np.array(c["lr"]),
                 "seed": np.array(c["seed"])})]


def _same_run(reported, rerun):
    """One run's loss, reported and repeated: the same run agrees to rounding
    (two decimals), a run at another rate or seed does not."""
    return abs(reported - rerun) <= 0.006 + 1e-3 * abs(rerun)


def _judge_ablation(case, output):
    names = str(case["names"]).split()
    if "losses_type" in output:
        return (f"ABLATION_LOSSES is a {output['losses_type']}, not a dict: give it the keys "
                f"{', '.join(repr(n) for n in names)}, each with its run's final loss")
    reported = output["reported"]
    missing = [name for name, value in zip(names, reported) if not np.isfinite(value)]
    if missing:
        return (f"ABLATION_LOSSES has no number for {', '.join(repr(n) for n in missing)}: "
                "each of the four variants needs its run's final loss")
    rerun = output["rerun"]
    for name, got, again in zip(names, reported, rerun):
        if not _same_run(got, again):
            return (f"ABLATION_LOSSES[{name!r}] is {got:.4g}, but your ablation_model's "
                    f"{name!r} model, trained again by train_model(model, ABLATION_LR, 0), "
                    f"ends at {again:.4g}. Hint: report what your own runs return, each on a "
                    "fresh model at ABLATION_LR without warm-up")
    stuck = blocks.SWEEP["stuck_above"]
    losses = dict(zip(names, reported))
    alpha_learns, beta_learns = losses["alpha"] <= stuck, losses["beta"] <= stuck
    expected = {(True, True): "either", (True, False): "alpha", (False, True): "beta",
                (False, False): "neither"}[alpha_learns, beta_learns]
    answer = _choice(output.get("rescued_by", "None"))
    if answer not in RESCUE_CHOICES:
        return (f"RESCUED_BY is {str(output.get('rescued_by'))!r}; answer with one of "
                f"{', '.join(repr(c) for c in RESCUE_CHOICES)}")
    if answer != expected:
        said = {True: "learns", False: "fails"}
        return (f"RESCUED_BY is {answer!r}, but your own table says otherwise: alpha alone "
                f"ends at {losses['alpha']:.2f} ({said[alpha_learns]}), beta alone at "
                f"{losses['beta']:.2f} ({said[beta_learns]}); a run fails when it ends above "
                f"STUCK = {stuck}. Hint: read the conclusion off your measured losses, not "
                "off your prediction")
    return None


# --- exercise 11: QK-norm ---

def _attention_weights(rng, d, heads, qk_norm):
    case = {}
    case.update(_linear(rng, 3 * d, d, "qkv"))
    case.update(_linear(rng, d, d, "proj"))
    if qk_norm:
        case.update(_layer_norm(rng, d // heads, "ln_q"))
        case.update(_layer_norm(rng, d // heads, "ln_k"))
    return case


def _qk_case(rng, batch, seq_len, d, heads, *, offset=0.0, scale=1.0, qk_norm=True):
    case = {"d_model": np.array(d), "n_heads": np.array(heads), "qk_norm": np.array(qk_norm),
            "x": offset + scale * rng.normal(size=(batch, seq_len, d)),
            "dy": rng.normal(size=(batch, seq_len, d))}
    case.update(_attention_weights(rng, d, heads, qk_norm))
    return case


def _qk_norm_cases(rng):
    return [
        ("one sequence of 5 tokens, d = 8, 2 heads", _qk_case(rng, 1, 5, 8, 2)),
        ("3 sequences of 7 tokens, d = 16, 4 heads", _qk_case(rng, 3, 7, 16, 4)),
        ("2 sequences of 6 large tokens (x = 2 + 4 N(0, 1)), d = 12, 3 heads",
         _qk_case(rng, 2, 6, 12, 3, offset=2.0, scale=4.0)),
        ("a single token, d = 8, 1 head", _qk_case(rng, 2, 1, 8, 1)),
    ]


def _qk_forward(attn, x, *, norm_q=True, norm_k=True, scale=True, swap=False, norm_v=False,
                affine=True):
    """QK-norm attention with one thing changed: the slips the judge names."""
    B, T, d = x.shape
    h = attn.n_heads
    d_head = d // h
    q, k, v = (t.view(B, T, h, d_head).transpose(1, 2) for t in attn.qkv(x).split(d, dim=-1))
    ln_q, ln_k = (attn.ln_k, attn.ln_q) if swap else (attn.ln_q, attn.ln_k)
    if not affine:
        ln_q = ln_k = functools.partial(F.layer_norm, normalized_shape=(d_head,))
    if norm_q:
        q = ln_q(q)
    if norm_k:
        k = ln_k(k)
    if norm_v:
        v = ln_k(v)
    scores = q @ k.transpose(-2, -1) / (d_head**0.5 if scale else 1.0)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    weights = scores.masked_fill(future, float("-inf")).softmax(-1)
    return attn.proj((weights @ v).transpose(1, 2).reshape(B, T, d))


def _diagnose_qk_norm(attn, case, y):
    slips = {
        "normalize each head's queries with ln_q and its keys with ln_k before q k^T; "
        "as written, neither is normalized": dict(norm_q=False, norm_k=False),
        "normalize the keys too, with ln_k": dict(norm_k=False),
        "normalize the queries too, with ln_q": dict(norm_q=False),
        "ln_q is for the queries and ln_k for the keys, not the other way round": dict(swap=True),
        "keep the division by sqrt(d_head) after the dot product: the norms set the size of "
        "q and k, the division still scales their dot product": dict(scale=False),
        "normalize q and k only, not the values": dict(norm_v=True),
        "use ln_q and ln_k themselves, with their gains and biases, not a bare normalization":
            dict(affine=False),
    }
    candidates = {hint: functools.partial(_qk_forward, attn, **kwargs)
                  for hint, kwargs in slips.items()}
    return _first_match(candidates, torch.from_numpy(case["x"]), y)


_judge_qk_norm_attention = _block_judge(
    None, _diagnose_qk_norm, what="your attention's output",
    make=lambda case: blocks.QKNormAttention(int(case["d_model"]), int(case["n_heads"])))


def _attention_logits_cases(rng):
    return [
        ("plain attention, 2 sequences of 5 tokens, d = 8, 2 heads",
         _qk_case(rng, 2, 5, 8, 2, qk_norm=False)),
        ("QK-norm attention, 2 sequences of 5 tokens, d = 8, 2 heads",
         _qk_case(rng, 2, 5, 8, 2)),
        ("plain attention, large tokens (x = 1 + 3 N(0, 1)), 3 sequences of 6, d = 12, 3 heads",
         _qk_case(rng, 3, 6, 12, 3, offset=1.0, scale=3.0, qk_norm=False)),
        ("QK-norm attention, large tokens (x = 1 + 3 N(0, 1)), 3 sequences of 6, d = 12, "
         "3 heads", _qk_case(rng, 3, 6, 12, 3, offset=1.0, scale=3.0)),
        ("QK-norm attention, one token, d = 8, 1 head", _qk_case(rng, 1, 1, 8, 1)),
    ]


def _logits_variant(attn, x, *, mask=True, scale=True, norms=True, softmax=False):
    B, T, d = x.shape
    d_head = d // attn.n_heads
    q, k, _ = attn.qkv(x).split(d, dim=-1)
    q, k = (t.view(B, T, attn.n_heads, d_head).transpose(1, 2) for t in (q, k))
    if norms and hasattr(attn, "ln_q"):
        q, k = attn.ln_q(q), attn.ln_k(k)
    scores = q @ k.transpose(-2, -1) / (d_head**0.5 if scale else 1.0)
    if mask:
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(-1) if softmax else scores


def _same_logits(a, b):
    """Equal to float32 accuracy, every logit at or below -1e30 read as masked."""
    if a.shape != b.shape:
        return False
    a, b = (np.where(t <= -1e30, -1e300, t.astype(np.float64)) for t in (a, b))
    return bool(np.allclose(a, b, rtol=1e-4, atol=1e-6))


def _judge_attention_logits(case, output):
    d, heads = int(case["d_model"]), int(case["n_heads"])
    attn = probes._harness_attention(d, heads, bool(case["qk_norm"]))
    probes._load_by_contract(attn, probes._weights(case), "the reference")
    x = torch.from_numpy(case["x"])
    with torch.no_grad():
        expected = blocks.attention_logits(attn, x).numpy()
    got = np.asarray(output["logits"])
    if got.shape != expected.shape:
        B, T = case["x"].shape[:2]
        return (f"attention_logits returned shape {got.shape}; expected {expected.shape}: "
                f"(B, heads, T, T) = ({B}, {heads}, {T}, {T}), one logit per head, query and key")
    if not np.issubdtype(got.dtype, np.number):
        return f"attention_logits returned {got.dtype} values, not numbers"
    future = np.isneginf(expected)
    tolerance = np.float32 if got.dtype == np.float32 else F64
    got = got.astype(np.float64)
    masked_ok = bool(np.all(got[future] <= -1e30))
    shown = np.where(future, 0.0, got)
    problem = mismatch(shown, np.where(future, 0.0, expected), dtype=tolerance,
                       what="your logits where a query sees the key")
    if problem is None and masked_ok:
        return None
    candidates = {
        "the causal mask: a query must not see later keys; set their logits to -inf, as "
        "masked_fill(future, float('-inf')) does": dict(mask=False),
        "divide q k^T by sqrt(d_head)": dict(scale=False),
        "where the module has ln_q and ln_k, the softmax reads the normalized q and k: "
        "apply them to each head's queries and keys first": dict(norms=False),
        "return the logits the softmax reads, not the softmax's output": dict(softmax=True),
    }
    with torch.no_grad():
        for hint, kwargs in candidates.items():
            wrong = _logits_variant(attn, x, **kwargs).numpy()
            if _same_logits(got, wrong):
                first = problem or "your logits where a key is in the future are not -inf"
                return f"{first}. Hint: {hint}"
    if problem:
        return problem
    return ("your logits where a key is in the future are " + _show(got[future])
            + "; they must be -inf, so that the softmax gives them weight 0 and a largest "
            "logit never counts them")


CHECKS = {
    "blocks_sandwich_ln": Check(_sandwich_cases, _block_judge("sandwich", _diagnose_sandwich)),
    "blocks_deepnorm": Check(_deepnorm_cases, _block_judge("deepnorm", _diagnose_deepnorm)),
    "blocks_deepnorm_scale": Check(_deepnorm_scale_cases, _judge_deepnorm_scale),
    "blocks_make_model": Check(_make_model_cases, _judge_make_model),
    "blocks_gradient_profile": Check(_gradient_profile_cases, _judge_gradient_profile),
    "blocks_first_step_update": Check(_first_step_update_cases, _judge_first_step_update),
    "blocks_adaln_zero": Check(_adaln_cases, _judge_adaln_zero),
    "blocks_warmup_lr": Check(_warmup_lr_cases, _judge_warmup_lr),
    "blocks_warmup_sweep": Check(_warmup_sweep_cases, _judge_warmup_sweep),
    "blocks_lowest_failing_lr": Check(_lowest_failing_cases, _judge_lowest_failing_lr),
    "blocks_ablation_model": Check(_ablation_model_cases, _judge_ablation_model),
    "blocks_ablation": Check(_ablation_cases, _judge_ablation),
    "blocks_qk_norm_attention": Check(_qk_norm_cases, _judge_qk_norm_attention),
    "blocks_attention_logits": Check(_attention_logits_cases, _judge_attention_logits),
}
