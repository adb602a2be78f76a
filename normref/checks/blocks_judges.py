"""Unit 05 checks, the grader-facing half: inputs, references, diagnoses."""

import contextlib
import functools

import numpy as np
import torch

from normref import blocks
from normref.checks import blocks_probes as probes
from normref.checks._registry import Check
from normref.checks.tolerances import _show, matches, mismatch, number_from_answer

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


def _block_judge(kind, diagnose):
    def judge(case, output):
        reference = blocks.BLOCK_CLASSES[kind](*probes._block_args(case))
        expected = _reference_run(reference, case, [case["x"]])
        y = output["y"]
        problem = mismatch(y, expected["y"], dtype=F64, what="your block's output")
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


# --- the prediction and the questions on the measured profiles ---

PROFILE_LAYERS, PROFILE_SEEDS = probes.PROFILE_LAYERS, probes.PROFILE_SEEDS
CHOICES = {"predict_flattest": KINDS, "predict_steepest": KINDS,
           "flattest": KINDS, "steepest": KINDS}
_QUESTIONS = {
    "flattest": "Which model's profile is flattest (smallest largest/smallest block norm)?",
    "steepest": "Which model's profile falls most from the first block to the last "
                "(smallest last/first)?",
    "sandwich_over_pre": "SANDWICH_OVER_PRE, the last-block norm of sandwich-LN over "
                         "Pre-LN's",
    "deepnorm_over_post": "DEEPNORM_OVER_POST, the last-block norm of DeepNorm over "
                          "Post-LN's",
}
RELATIVE_TOLERANCE = 0.05  # numbers read off a printout, rounded to two digits


@functools.lru_cache(maxsize=1)
def measured_profiles():
    """The experiment of the assignment, run with the references:
    {kind: (PROFILE_LAYERS,) median over PROFILE_SEEDS}."""
    with _one_thread():
        return {kind: blocks.experiment_profile(kind, PROFILE_LAYERS, PROFILE_SEEDS).numpy()
                for kind in KINDS}


def true_answers():
    """Each answer worked out from the measured profiles, not typed in."""
    return _answers_from(measured_profiles())


def _answers_from(profiles):
    spread = {kind: p.max() / p.min() for kind, p in profiles.items()}
    fall = {kind: p[-1] / p[0] for kind, p in profiles.items()}
    return {
        "flattest": min(spread, key=spread.get),
        "steepest": min(fall, key=fall.get),
        "sandwich_over_pre": float(profiles["sandwich"][-1] / profiles["pre"][-1]),
        "deepnorm_over_post": float(profiles["deepnorm"][-1] / profiles["post"][-1]),
    }


def _one_case(label):
    return lambda rng: [(label, {})]


def _profile_case(label):
    """One case with the experiment's batches, for measuring the student's
    own make_model the way the notebook does."""
    def cases(rng):
        case = {}
        for seed in PROFILE_SEEDS:
            inputs, targets = blocks.experiment_batch(seed)
            case[f"inputs{seed}"], case[f"targets{seed}"] = inputs.numpy(), targets.numpy()
        return [(label, case)]

    return cases


def _given(output, names):
    missing = [name for name in names if name not in output]
    if missing:
        return f"no answer given for {', '.join(missing)}"
    for name in names:
        answer = str(output[name])
        if answer not in CHOICES[name]:
            return (f"{name.upper()} is {answer!r}; answer with one of "
                    f"{', '.join(repr(c) for c in CHOICES[name])}")
    return None


def _judge_prediction(case, output):
    return _given(output, ("predict_flattest", "predict_steepest"))


def _own_answers(output):
    """The answers for the table the student's own make_model gives, or None
    when the probe could not measure it."""
    own = {}
    for kind in KINDS:
        profile = np.asarray(output.get(f"own:{kind}", np.zeros(0)), dtype=F64)
        if profile.shape != (PROFILE_LAYERS,) or not np.all(np.isfinite(profile) & (profile > 0)):
            return None
        own[kind] = profile
    return _answers_from(own)


def _tables(output):
    """The answer sets an answer may match: the grader's, then the student's own."""
    own = _own_answers(output)
    return [true_answers()] + ([own] if own is not None else [])


BOTH_TABLES = ("(checked against the grader's table and against the one your make_model "
               "gives, so a slip in exercise 4 is not counted twice)")


def _judge_profile_shapes(case, output):
    problem = _given(output, ("flattest", "steepest"))
    if problem:
        return problem
    tables = _tables(output)
    wrong = [name for name in ("flattest", "steepest")
             if not any(str(output[name]) == truths[name] for truths in tables)]
    if wrong:
        return "not yet right: " + "; ".join(
            f"{_QUESTIONS[name]} (you answered {output[name]})" for name in wrong
        ) + f" {BOTH_TABLES}"
    return None


def _judge_profile_numbers(case, output):
    tables = _tables(output)
    problems = []
    for name in ("sandwich_over_pre", "deepnorm_over_post"):
        if name not in output:
            return f"no answer given for {name.upper()}"
        value = number_from_answer(output[name])
        if value is None:
            return f"{name.upper()} is {str(output[name])!r}, not a number"
        if not any(abs(value - truths[name]) <= RELATIVE_TOLERANCE * abs(truths[name])
                   for truths in tables):
            problems.append(f"{_QUESTIONS[name]} (you answered {value:g})")
    if problems:
        return ("not yet right, within 5%: " + "; ".join(problems)
                + f". Read them off the printed profiles at L = 8, seeds 0, 1, 2 {BOTH_TABLES}")
    return None


CHECKS = {
    "blocks_sandwich_ln": Check(_sandwich_cases, _block_judge("sandwich", _diagnose_sandwich)),
    "blocks_deepnorm": Check(_deepnorm_cases, _block_judge("deepnorm", _diagnose_deepnorm)),
    "blocks_deepnorm_scale": Check(_deepnorm_scale_cases, _judge_deepnorm_scale),
    "blocks_make_model": Check(_make_model_cases, _judge_make_model),
    "blocks_prediction": Check(_one_case("your two predictions"), _judge_prediction),
    "blocks_profile_shapes": Check(_profile_case("your two choices"), _judge_profile_shapes),
    "blocks_profile_numbers": Check(_profile_case("your two ratios"), _judge_profile_numbers),
}
