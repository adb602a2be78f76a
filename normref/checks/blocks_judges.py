"""Unit 05 checks, the grader-facing half: inputs, references, diagnoses."""

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from normref import blocks
from normref.checks import blocks_probes as probes
from normref.checks._registry import Check
from normref.checks.tolerances import matches, mismatch

F64 = np.float64


def _linear(rng, fan_out, fan_in, prefix):
    return {f"w:{prefix}.weight": rng.normal(0, fan_in**-0.5, (fan_out, fan_in)),
            f"w:{prefix}.bias": rng.normal(0, 0.1, fan_out)}


def _layer_norm(rng, d, prefix):
    return {f"w:{prefix}.weight": 1 + 0.3 * rng.normal(size=d),
            f"w:{prefix}.bias": 0.2 * rng.normal(size=d)}


def _block_case(rng, batch, seq_len, d, heads, d_ff, offset=0.0):
    case = {"d_model": np.array(d), "n_heads": np.array(heads), "d_ff": np.array(d_ff),
            "x": offset + rng.normal(size=(batch, seq_len, d)),
            "dy": rng.normal(size=(batch, seq_len, d))}
    case.update(_layer_norm(rng, d, "ln1"))
    case.update(_linear(rng, 3 * d, d, "attn.qkv"))
    case.update(_linear(rng, d, d, "attn.proj"))
    case.update(_layer_norm(rng, d, "ln2"))
    case.update(_linear(rng, d_ff, d, "mlp.fc"))
    case.update(_linear(rng, d, d_ff, "mlp.proj"))
    return case


def _block_cases(rng):
    return [
        ("one sequence of 5 tokens, d = 8, 2 heads, d_ff = 32", _block_case(rng, 1, 5, 8, 2, 32)),
        ("3 sequences of 7 tokens, d = 16, 4 heads, d_ff = 24",
         _block_case(rng, 3, 7, 16, 4, 24)),
        ("2 sequences of 6 tokens far from zero (x = 5 + N(0, 1)), d = 12, 3 heads, d_ff = 20",
         _block_case(rng, 2, 6, 12, 3, 20, offset=5.0)),
        ("a single token, d = 8, 1 head, d_ff = 16", _block_case(rng, 2, 1, 8, 1, 16)),
    ]


def _reference_run(module, case, inputs):
    params = probes._load_by_contract(module, probes._weights(case), "the reference")
    module.eval()
    return {k: v.detach().numpy() for k, v in
            probes._forward_backward(module, params, inputs, case["dy"]).items()}


# --- wrong-but-plausible versions of a block, to name the likely mistake ---

def _attention(x, block, causal=True, scale="head"):
    B, T, d = x.shape
    heads = block.attn.n_heads
    q, k, v = block.attn.qkv(x).split(d, dim=-1)
    q, k, v = (t.view(B, T, heads, d // heads).transpose(1, 2) for t in (q, k, v))
    divisor = {"head": math.sqrt(d // heads), "model": math.sqrt(d), "none": 1.0}[scale]
    scores = q @ k.transpose(-2, -1) / divisor
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return block.attn.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d))


def _mlp(x, block, activation=F.gelu):
    return block.mlp.proj(activation(block.mlp.fc(x)))


def _arrangements(attn, mlp, ln1, ln2):
    def pre(x):
        x = x + attn(ln1(x))
        return x + mlp(ln2(x))

    def post(x):
        x = ln1(x + attn(x))
        return ln2(x + mlp(x))

    def ln_on_sublayer_output(x):
        x = x + ln1(attn(x))
        return x + ln2(mlp(x))

    def residual_carries_normalized(x):
        h = ln1(x)
        x = h + attn(h)
        h = ln2(x)
        return h + mlp(h)

    def parallel(x):
        return x + attn(ln1(x)) + mlp(ln2(x))

    def pre_missing_ln2(x):
        x = x + attn(ln1(x))
        return x + mlp(x)

    def post_missing_ln1(x):
        x = x + attn(x)
        return ln2(x + mlp(x))

    def mlp_first_pre(x):
        x = x + mlp(ln2(x))
        return x + attn(ln1(x))

    def no_residual_post(x):
        return ln2(mlp(ln1(attn(x))))

    return locals()


_HINTS = {
    "pre": {
        "post": "you normalized after each residual add, which is Post-LN; a Pre-LN block "
                "normalizes the sublayer's input: x + attn(ln1(x))",
        "ln_on_sublayer_output": "the LayerNorm goes on the sublayer's input, x + attn(ln1(x)), "
                                 "not on its output",
        "residual_carries_normalized": "the residual path must carry the unnormalized x: add "
                                       "attn(ln1(x)) to x itself, not to ln1(x)",
        "parallel": "the MLP sublayer reads the output of the attention step, not the "
                    "block's input",
        "pre_missing_ln2": "the MLP's input needs ln2 too: x + mlp(ln2(x))",
        "mlp_first_pre": "attention comes first, then the MLP",
    },
    "post": {
        "pre": "that is a Pre-LN block; Post-LN normalizes after each residual add: "
               "ln1(x + attn(x)), then ln2(x + mlp(x))",
        "ln_on_sublayer_output": "the LayerNorm goes after the residual add, ln1(x + attn(x)), "
                                 "not on the sublayer's output before the add",
        "post_missing_ln1": "normalize after the attention step too: x = ln1(x + attn(x))",
        "no_residual_post": "keep the residual connections: ln1(x + attn(x)), not ln1(attn(x))",
        "parallel": "the two sublayers run one after the other, each followed by its own "
                    "add and LN",
    },
}

_COMPONENT_HINTS = {
    "no_mask": "the attention must be causal: give the scores of later tokens -inf before the "
               "softmax, so a token sees only itself and earlier tokens",
    "scale_model": "scale the scores by 1/sqrt(d_head), with d_head = d_model / n_heads, "
                   "not 1/sqrt(d_model)",
    "scale_none": "scale the scores by 1/sqrt(d_head) before the softmax",
    "relu": "the MLP uses GELU (F.gelu), not ReLU",
    "gelu_tanh": "use the exact GELU (F.gelu's default), not the tanh approximation",
}


def _diagnose_block(kind, case, y):
    block = blocks.BLOCK_CLASSES[kind](int(case["d_model"]), int(case["n_heads"]),
                                       int(case["d_ff"]))
    probes._load_by_contract(block, probes._weights(case), "the reference")
    x = torch.from_numpy(case["x"])
    attn, mlp = (lambda h: _attention(h, block)), (lambda h: _mlp(h, block))
    candidates = {}
    for name, forward in _arrangements(attn, mlp, block.ln1, block.ln2).items():
        if name != kind and name in _HINTS[kind]:
            candidates[_HINTS[kind][name]] = forward
    components = {
        "no_mask": (lambda h: _attention(h, block, causal=False), mlp),
        "scale_model": (lambda h: _attention(h, block, scale="model"), mlp),
        "scale_none": (lambda h: _attention(h, block, scale="none"), mlp),
        "relu": (attn, lambda h: _mlp(h, block, F.relu)),
        "gelu_tanh": (attn, lambda h: _mlp(h, block, lambda t: F.gelu(t, approximate="tanh"))),
    }
    for name, (a, m) in components.items():
        candidates[_COMPONENT_HINTS[name]] = _arrangements(a, m, block.ln1, block.ln2)[kind]
    with torch.no_grad():
        for hint, forward in candidates.items():
            wrong = forward(x).numpy()
            if wrong.shape == y.shape and matches(y, wrong, dtype=F64):
                return hint
    return None


def _compare_gradients(case, output, expected):
    """Messages for the input gradient and parameter gradients, first mismatch only."""
    for key, label in (("d0", "the gradient with respect to x"),) + tuple(
            (k, f"the gradient of {k[2:]}") for k in sorted(expected) if k.startswith("g:")):
        if key not in expected:
            continue
        got = output[key]
        if got.shape == expected[key].shape and np.all(np.isnan(got)):
            return (f"no gradient reached {key[2:]}: is it used in your forward pass "
                    "(and not under torch.no_grad or .detach)?")
        problem = mismatch(got, expected[key], dtype=F64, what=label)
        if problem:
            return (problem + ". The output is right, so look for a .detach(), .data or "
                    "in-place change that cuts the graph")
    return None


def _block_judge(kind):
    def judge(case, output):
        expected = _reference_run(blocks.BLOCK_CLASSES[kind](
            int(case["d_model"]), int(case["n_heads"]), int(case["d_ff"])), case, [case["x"]])
        y = output["y"]
        problem = mismatch(y, expected["y"], dtype=F64, what="your block's output")
        if problem:
            hint = _diagnose_block(kind, case, y) if y.shape == expected["y"].shape else None
            return problem + (f". Hint: {hint}" if hint else "")
        return _compare_gradients(case, output, expected)

    return judge


# --- the model's assembly, checked with stand-in blocks ---

def _tiny_lm_case(rng, position, vocab, d, n_layers, batch, seq_len, max_len):
    case = {"vocab": np.array(vocab), "d_model": np.array(d), "n_layers": np.array(n_layers),
            "n_heads": np.array(2), "d_ff": np.array(3 * d), "max_len": np.array(max_len),
            "norm_position": np.array(position),
            "tokens": rng.integers(0, vocab, (batch, seq_len)),
            "w:tok_emb.weight": rng.normal(size=(vocab, d)),
            "w:pos_emb.weight": rng.normal(size=(max_len, d)),
            "w:head.weight": rng.normal(0, d**-0.5, (vocab, d))}
    for i in range(n_layers):
        case.update(_linear(rng, d, d, f"blocks.{i}.mix"))
    if position == "pre":
        case.update(_layer_norm(rng, d, "ln_f"))
    return case


def _tiny_lm_cases(rng):
    return [
        ("Pre-LN, 3 blocks, vocab 11, d = 8, 2 sequences of 6 tokens (max_len 10)",
         _tiny_lm_case(rng, "pre", 11, 8, 3, 2, 6, 10)),
        ("Post-LN, 3 blocks, vocab 11, d = 8, 2 sequences of 6 tokens (max_len 10)",
         _tiny_lm_case(rng, "post", 11, 8, 3, 2, 6, 10)),
        ("Pre-LN, 1 block, vocab 5, d = 4, 3 sequences of 4 tokens (max_len 4)",
         _tiny_lm_case(rng, "pre", 5, 4, 1, 3, 4, 4)),
        ("Post-LN, 4 blocks, vocab 7, d = 6, 1 sequence of 9 tokens (max_len 12)",
         _tiny_lm_case(rng, "post", 7, 6, 4, 1, 9, 12)),
    ]


def _stand_in_logits(case, *, final_ln=True, positions=True, order=1):
    """The stand-in model's logits in numpy, optionally with one part wrong."""
    tokens = case["tokens"]
    h = case["w:tok_emb.weight"][tokens]  # B, T, d
    if positions:
        h = h + case["w:pos_emb.weight"][: tokens.shape[1]]
    n_layers = int(case["n_layers"])
    for i in list(range(n_layers))[::order]:
        h = h + np.tanh(h @ case[f"w:blocks.{i}.mix.weight"].T + case[f"w:blocks.{i}.mix.bias"])
    if final_ln and "w:ln_f.weight" in case:
        mu = h.mean(-1, keepdims=True)
        h = (h - mu) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
        h = h * case["w:ln_f.weight"] + case["w:ln_f.bias"]
    return h @ case["w:head.weight"].T  # B, T, vocab


def _judge_tiny_lm(case, output):
    expected = _stand_in_logits(case)
    got = output["logits"]
    problem = mismatch(got, expected, dtype=F64, what="your model's logits")
    if problem is None or got.shape != expected.shape:
        return problem
    candidates = {
        "a Pre-LN model applies its final LayerNorm ln_f to the last block's output, "
        "before the head": _stand_in_logits(case, final_ln=False),
        "add the position embedding of each position (0, 1, ..., T - 1) to the token "
        "embedding": _stand_in_logits(case, positions=False),
        "run the blocks in order, blocks[0] first": _stand_in_logits(case, order=-1),
    }
    for hint, wrong in candidates.items():
        if matches(got, wrong, dtype=F64):
            return f"{problem}. Hint: {hint}"
    return problem


# --- per-layer gradient norms ---

def _grad_norms_case(rng, vocab, d, n_layers, batch, seq_len, ignored):
    case = {"vocab": np.array(vocab), "d_model": np.array(d), "n_layers": np.array(n_layers),
            "inputs": rng.integers(0, vocab, (batch, seq_len)),
            "w:tok_emb.weight": rng.normal(size=(vocab, d)),
            "w:ln_f.weight": 1 + 0.2 * rng.normal(size=d), "w:ln_f.bias": 0.1 * rng.normal(size=d),
            "w:head.weight": rng.normal(0, d**-0.5, (vocab, d))}
    targets = rng.integers(0, vocab, (batch, seq_len))
    if ignored:
        targets[:, : seq_len // 2] = blocks.IGNORE
    case["targets"] = targets
    for i in range(n_layers):
        case.update(_layer_norm(rng, d, f"blocks.{i}.ln2"))
        case.update(_linear(rng, 2 * d, d, f"blocks.{i}.mlp.fc"))
        case.update(_linear(rng, d, 2 * d, f"blocks.{i}.mlp.proj"))
    return case


def _grad_norms_cases(rng):
    return [
        ("3 blocks, d = 8, vocab 7, 4 sequences of 5 tokens",
         _grad_norms_case(rng, 7, 8, 3, 4, 5, ignored=False)),
        ("5 blocks, d = 6, vocab 5, 2 sequences of 8 tokens, first half of targets -100 "
         "(ignored)", _grad_norms_case(rng, 5, 6, 5, 2, 8, ignored=True)),
        ("1 block, d = 4, vocab 3, 3 sequences of 2 tokens",
         _grad_norms_case(rng, 3, 4, 1, 3, 2, ignored=False)),
    ]


def _judge_grad_norms(case, output):
    model, params, batch = probes.build_grad_probe_lm(case)
    expected = blocks.grad_norms_by_layer(model, batch).numpy()
    got = output["norms"]
    problem = mismatch(got, expected, dtype=F64, what="your norms")
    if problem is None or got.shape != expected.shape:
        if got.shape != expected.shape:
            problem += ": one norm per block, in order"
        return problem
    n_layers = len(model.blocks)
    proj = [b.mlp.proj.weight for b in model.blocks]
    fc = [b.mlp.fc.weight for b in model.blocks]
    loss = blocks.lm_loss(model, batch)
    grads = torch.autograd.grad(loss, proj + fc)
    g_proj = [g.norm().item() for g in grads[:n_layers]]
    counted = int((batch[1] != blocks.IGNORE).sum())
    candidates = {
        "clear old gradients before the backward pass (model.zero_grad(), or use "
        "torch.autograd.grad): .grad adds up across calls":
            [(g + probes.STALE_GRAD).norm().item() for g in grads[:n_layers]],
        "take the norm, not the squared norm": [v**2 for v in g_proj],
        "use each block's mlp.proj.weight (the FFN's second weight), not mlp.fc.weight":
            [g.norm().item() for g in grads[n_layers:]],
        "the loss is the mean cross-entropy over the counted targets, not the sum":
            [v * counted for v in g_proj],
        "list the blocks first to last": g_proj[::-1],
    }
    for hint, wrong in candidates.items():
        if matches(got, np.array(wrong), dtype=F64):
            return f"{problem}. Hint: {hint}"
    return problem


# --- the depth experiment, rerun by the grader on seeds it picks ---

DEPTHS = (2, 6, 12)
N_DEPTH_SEEDS = 5  # odd, so every way of taking a median agrees
DEPTH_CONFIG = {"vocab": 16, "d_model": 64, "n_heads": 4, "batch": 16, "n_symbols": 8}
NOTEBOOK_SEEDS = (0, 1, 2)  # last_block_ratio's default in the notebook


def _depth_cases(rng):
    seeds = sorted(int(s) for s in rng.choice(100_000, size=N_DEPTH_SEEDS, replace=False))
    c = DEPTH_CONFIG
    batches = [blocks.copy_task_batch(c["batch"], c["n_symbols"], c["vocab"], seed)
               for seed in seeds]
    return [(f"d = 64, 4 heads, depths {list(DEPTHS)}, seeds {seeds}", {
        "d_model": np.array(c["d_model"]), "n_heads": np.array(c["n_heads"]),
        "vocab": np.array(c["vocab"]), "depths": np.array(DEPTHS), "seeds": np.array(seeds),
        "inputs": np.stack([b[0].numpy() for b in batches]),
        "targets": np.stack([b[1].numpy() for b in batches]),
    })]


@functools.lru_cache(maxsize=8)
def _reference_last_norms(seeds):
    """(2 [pre, post], depths, seeds): the last block's mlp.proj gradient norm
    of the reference TinyLM, initialized as the notebook does, on each seed's
    copy-task batch. float32, like the student's run."""
    c = DEPTH_CONFIG
    last = np.zeros((2, len(DEPTHS), len(seeds)))
    for j, seed in enumerate(seeds):
        batch = blocks.copy_task_batch(c["batch"], c["n_symbols"], c["vocab"], seed)
        for k, position in enumerate(("pre", "post")):
            for i, depth in enumerate(DEPTHS):
                model = blocks.TinyLM(c["vocab"], c["d_model"], depth, c["n_heads"], position,
                                      d_ff=4 * c["d_model"], max_len=2 * c["n_symbols"])
                probes.init_like_xiong(model, seed)
                last[k, i, j] = float(blocks.grad_norms_by_layer(model, batch)[-1])
    return last


def depth_ratios(last_layer_norms):
    """(2 [pre, post], depths, seeds) -> the median Post/Pre ratio at each depth."""
    return np.median(last_layer_norms[1] / last_layer_norms[0], axis=-1)


def _norms_problem(norms, expected, seeds):
    """Which model of the experiment gives other norms than the reference, or None."""
    if norms.shape != expected.shape:
        return (f"the experiment gave norms of shape {norms.shape}; expected "
                f"{expected.shape} (Pre/Post, depths {list(DEPTHS)}, {len(seeds)} seeds)")
    wrong = {}
    for k, position in enumerate(("Pre-LN", "Post-LN")):
        for i, depth in enumerate(DEPTHS):
            problem = mismatch(norms[k, i], expected[k, i], dtype="float32",
                               what=f"the last-block gradient norm of your {depth}-block "
                                    f"{position} TinyLM (one per seed)")
            if problem:
                wrong.setdefault(position, problem)
    if not wrong:
        return None
    if len(wrong) == 2:
        hint = ("both kinds of model differ: check that your blocks, TinyLM and "
                "grad_norms_by_layer pass their own checks")
    elif "Pre-LN" in wrong:
        hint = ("only the Pre-LN models differ: check PreLNBlock, and that a Pre-LN "
                "TinyLM ends with ln_f before its head")
    else:
        hint = ("only the Post-LN models differ: check PostLNBlock (add, then "
                "normalize: ln1(x + attn(x)))")
    first = next(iter(wrong.values()))
    return (f"{first}, rerunning the experiment with the reference blocks on the same "
            f"seeds {list(seeds)}. Hint: {hint}")


def _judge_depth_ratio(case, output):
    seeds = tuple(int(s) for s in case["seeds"])
    expected = _reference_last_norms(seeds)
    norms = np.asarray(output["last_layer_norms"], dtype=np.float64)
    problem = _norms_problem(norms, expected, seeds)
    if problem:
        return problem
    ratios = np.asarray(output["ratios"])
    expected_ratios = depth_ratios(expected)
    problem = mismatch(ratios, expected_ratios, dtype="float32",
                       what=f"last_block_ratio(depth, seeds={list(seeds)}) for depths "
                            f"{list(DEPTHS)}")
    if problem is None:
        return None
    if ratios.shape != expected_ratios.shape:
        return problem
    per_seed = expected[1] / expected[0]  # depths, seeds
    candidates = {
        "divide the Post-LN norm by the Pre-LN one, not the other way round":
            np.median(expected[0] / expected[1], axis=-1),
        "take the median of the per-seed ratios, not their mean": per_seed.mean(axis=-1),
        "divide per seed first, then take the median of the ratios (not a ratio of "
        "medians)": np.median(expected[1], axis=-1) / np.median(expected[0], axis=-1),
        "use the seeds you are given, not (0, 1, 2)":
            depth_ratios(_reference_last_norms(NOTEBOOK_SEEDS)),
    }
    for hint, wrong in candidates.items():
        if matches(ratios, wrong, dtype="float32"):
            return f"{problem}. Hint: {hint}"
    return (f"{problem}. Your TinyLM and grad_norms_by_layer measure the right norms on "
            "these seeds, so look at last_block_ratio itself: copy_task_batch(16, 8, seed), "
            "both models built with max_len=16 and initialized with init_like_xiong(model, "
            "seed), the last block's norm, Post-LN over Pre-LN, the median over the seeds")


# --- adaLN ---

def _ada_ln_case(rng, batch, seq_len, d, d_cond, offset=0.0):
    return {"d_model": np.array(d), "d_cond": np.array(d_cond),
            "x": offset + rng.normal(size=(batch, seq_len, d)),
            "cond": rng.normal(size=(batch, d_cond)),
            "dy": rng.normal(size=(batch, seq_len, d)),
            **_linear(rng, 2 * d, d_cond, "to_scale_shift")}


def _ada_ln_cases(rng):
    return [
        ("2 sequences of 3 tokens, d = 8, d_cond = 4", _ada_ln_case(rng, 2, 3, 8, 4)),
        ("3 sequences of 5 tokens, d = 16, d_cond = 6", _ada_ln_case(rng, 3, 5, 16, 6)),
        ("4 sequences of 2 tokens far from zero (x = 3 + 2 N(0, 1)), d = 6, d_cond = 10",
         _ada_ln_case(rng, 4, 2, 6, 10, offset=3.0)),
    ]


def _ada_ln_variants(case):
    x, cond = case["x"], case["cond"]
    d = x.shape[-1]
    x_hat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    out = cond @ case["w:to_scale_shift.weight"].T + case["w:to_scale_shift.bias"]  # B, 2d
    first, second = out[:, None, :d], out[:, None, d:]  # B, 1, d each
    return x_hat, {
        "scale by (1 + gamma), not gamma: a zero gamma must leave the token as it is":
            x_hat * first + second,
        "the first half of to_scale_shift(cond) is gamma (the scale), the second beta":
            x_hat * (1 + second) + first,
        "normalize x before scaling and shifting it": x * (1 + first) + second,
    }


def _judge_ada_ln(case, output):
    x_hat, variants = _ada_ln_variants(case)
    d, d_cond = int(case["d_model"]), int(case["d_cond"])
    expected = _reference_run(blocks.AdaLN(d, d_cond), case, [case["x"], case["cond"]])
    y = output["y"]
    problem = mismatch(y, expected["y"], dtype=F64, what="your AdaLN's output")
    if problem:
        for hint, wrong in variants.items():
            if y.shape == wrong.shape and matches(y, wrong, dtype=F64):
                return f"{problem}. Hint: {hint}"
        return problem
    problem = mismatch(output["y_fresh"], x_hat, dtype=F64, what="a new AdaLN's output")
    if problem:
        return (problem + ". A new AdaLN should be a plain LayerNorm (no parameters of its own), "
                "so start to_scale_shift at zero: nn.init.zeros_ on its weight and bias")
    problem = mismatch(output["d1"], expected["d1"], dtype=F64,
                       what="the gradient with respect to cond")
    return problem or _compare_gradients(case, output, expected)


CHECKS = {
    "blocks_pre_ln": Check(_block_cases, _block_judge("pre")),
    "blocks_post_ln": Check(_block_cases, _block_judge("post")),
    "blocks_tiny_lm": Check(_tiny_lm_cases, _judge_tiny_lm),
    "blocks_grad_norms": Check(_grad_norms_cases, _judge_grad_norms),
    "blocks_depth_ratio": Check(_depth_cases, _judge_depth_ratio),
    "blocks_ada_ln": Check(_ada_ln_cases, _judge_ada_ln),
}
