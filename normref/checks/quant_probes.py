"""Unit 06 checks, the student-facing half: how each exercise is called.

torch is imported inside the probes, not at the top, so that importing
normref.checks stays quick for the units that do not use it.
"""

import numpy as np

from normref.checks._runner import CheckFailed, answer_text, run_check

FLOAT8_HINT = ("arithmetic on float8 tensors is not implemented on the CPU; "
               "cast back with .float() first, then unscale in float32")
LOUD = 1e5  # how much louder the loud token and the loud channel are
TOKEN_SET_NAMES = ("plain", "loud token", "loud channel", "RMSNorm, mu = 20")


def as_choice(answer):
    """A choice as the grader reads it: case, the spaces around it, and
    hyphens, underscores or spaces between its words do not matter
    ("Per_Token " reads as "per-token")."""
    return "-".join(str(answer).strip().lower().replace("_", " ").replace("-", " ")
                    .split())


def _by_choice(table, names, what, form, entry="entry"):
    """{name: table's entry} for each of `names`, the table's keys read with
    as_choice; a KeyError naming the missing ones."""
    if not hasattr(table, "keys"):
        raise TypeError(f"{what} is {type(table).__name__}, not a dict {form}")
    entries = {as_choice(key): table[key] for key in table.keys()}
    missing = [name for name in names if as_choice(name) not in entries]
    if missing:
        raise KeyError(f"{what} has no {entry} for {missing}; it needs {list(names)}")
    return {name: entries[as_choice(name)] for name in names}


def _torch_dtype(name):
    import torch

    return getattr(torch, str(name))


def _dtype_name(value):
    return np.array(str(getattr(value, "dtype", type(value).__name__)))


def _tensor(array):
    import torch

    return torch.from_numpy(np.array(array, copy=True))


def _with_float8_hint(call):
    try:
        return call()
    except (NotImplementedError, RuntimeError) as exc:
        if "Float8" in str(exc):
            raise type(exc)(f"{exc} (hint: {FLOAT8_HINT})") from None
        raise


def experiment_token_sets(n_tokens=64, d=256, seed=0):
    """{name: (tokens, keep)}: the experiment's four batches, (n_tokens, d)
    float32, and the bool mask of the entries whose error is measured (all
    but the loud ones). The assignment builds the same batches."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    plain = torch.randn(n_tokens, d, generator=gen)
    everywhere = torch.ones(n_tokens, d, dtype=torch.bool)
    loud_token = plain.clone()
    loud_token[0] *= LOUD  # token 0 is LOUD times louder
    quiet_tokens = everywhere.clone()
    quiet_tokens[0] = False
    loud_channel = plain.clone()
    loud_channel[:, 0] += LOUD  # feature 0 sits near LOUD in every token
    quiet_channels = everywhere.clone()
    quiet_channels[:, 0] = False
    rms_out = F.rms_norm(20 + plain, (d,), eps=1e-5)
    return {"plain": (plain, everywhere),
            "loud token": (loud_token, quiet_tokens),
            "loud channel": (loud_channel, quiet_channels),
            "RMSNorm, mu = 20": (rms_out, everywhere)}


def per_tensor_round_trip(x, dtype):
    """The lesson's round trip: one amax scale for the whole tensor."""
    import torch

    fmax = torch.finfo(dtype).max
    amax = x.abs().max()
    scale = fmax / amax if amax > 0 else 1.0
    return (x * scale).clamp(-fmax, fmax).to(dtype).float() / scale


def masked_error(x, x_rt, keep):
    """RMSE over std, in float64, on the entries where keep is True."""
    x64, rt64 = x[keep].double(), x_rt[keep].double()
    return float((rt64 - x64).pow(2).mean().sqrt() / x64.std(correction=0))


def _call_per_token(per_token_round_trip, case):
    x, dtype = _tensor(case["x"]), _torch_dtype(case["dtype"])
    y = _with_float8_hint(lambda: per_token_round_trip(x, dtype))
    return {"y": y, "dtype": _dtype_name(y)}


def _call_delayed_scaler(scaler_class, case):
    """Feed the stream to a new scaler; note each output, the scale after
    each call, the history's length after each call and the last history."""
    dtype = _torch_dtype(case["dtype"])
    scaler = scaler_class(dtype, history_len=int(case["history_len"]))
    outputs, scales, lengths = [], [], []
    for x in case["stream"]:
        y = _with_float8_hint(lambda x=x: scaler(_tensor(x)))
        if "float8" in str(getattr(y, "dtype", "")):
            return {"dtype": _dtype_name(y)}
        outputs.append(np.asarray(y.detach().numpy() if hasattr(y, "detach") else y,
                                  dtype=np.float64))
        scales.append(float(scaler.scale))
        lengths.append(len(scaler.history))
    return {"y": np.stack(outputs), "scales": np.array(scales),
            "lengths": np.array(lengths),
            "history": np.array([float(a) for a in scaler.history], np.float64)}


def _table_probe(subject, case):
    """The student's table, and the same measurement redone here: the
    per-tensor column with the lesson's round trip, the per-token column
    with the student's per_token_round_trip, on the same batches."""
    import torch

    table, per_token_round_trip = subject
    by_name = _by_choice(table, TOKEN_SET_NAMES, "the table",
                         "{name: (per-tensor error, per-token error)}", entry="row")
    rows = [tuple(float(v) for v in by_name[name]) for name in TOKEN_SET_NAMES]
    if any(len(row) != 2 for row in rows):
        raise ValueError("each row must be a pair (per-tensor error, per-token error)")
    e4m3 = torch.float8_e4m3fn
    measured = []
    for x, keep in experiment_token_sets().values():
        y = _with_float8_hint(lambda x=x: per_token_round_trip(x.clone(), e4m3))
        y = torch.as_tensor(y).float()
        measured.append((masked_error(x, per_tensor_round_trip(x, e4m3), keep),
                         masked_error(x, y, keep)))
    return {"table": np.array(rows, np.float64), "measured": np.array(measured, np.float64)}


def _answers_as_text(answers, case):
    return {name: np.array(answer_text(value)) for name, value in answers.items()}


def check_per_token_round_trip(per_token_round_trip):
    """Check per_token_round_trip(x, dtype): one amax scale per token."""
    run_check("quant_per_token", per_token_round_trip, _call_per_token)


def check_delayed_scaler(DelayedScaler):
    """Check DelayedScaler(dtype, history_len): scales from the amax history."""
    run_check("quant_delayed_scaler", DelayedScaler, _call_delayed_scaler)


def check_delayed_scaler_saturates(DelayedScaler):
    """Check that a spike beyond the remembered amax saturates at +-fmax."""
    run_check("quant_delayed_saturation", DelayedScaler, _call_delayed_scaler)


def check_scaling_table(table, per_token_round_trip):
    """Check the table against the same measurement made with your function."""
    run_check("quant_scaling_table", (table, per_token_round_trip), _table_probe)


def check_spike_answer(steps):
    """Check the number of calls whose scale the spike sets."""
    run_check("quant_spike_answer", {"steps": steps}, _answers_as_text)


def check_scaling_answers(rms_scale_spread, quiet_stored_max):
    """Check the two scales that explain the table: the spread of RMSNorm's
    per-token scales, and where a quiet feature of the loud-channel batch lands."""
    run_check("quant_scaling_answers", {"rms_scale_spread": rms_scale_spread,
                                        "quiet_stored_max": quiet_stored_max},
              _answers_as_text)


# -- per-channel and MX block scaling, SmoothQuant, and the matmul they feed --

MATMUL_SCHEMES = ("per-tensor", "per-token", "per-channel", "per-block", "smoothquant")
OUTLIER_CHANNELS = (5, 77, 130, 201)
OUTLIER_GAMMA = 1e5
LOUD_TOKENS = (0, 31, 64, 100)
LOUD_TOKEN_FACTOR = 1e5


def _tokens_and_weight(n_tokens, d, d_out, seed):
    import torch

    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randn(n_tokens, d, generator=gen)
    return tokens, torch.randn(d, d_out, generator=gen) / d**0.5


def outlier_layer(n_tokens=128, d=256, d_out=128, seed=0):
    """(A, W) of the matmul experiment: layer norm's output with gamma 1e5 on
    four channels, (n_tokens, d), and a weight (d, d_out) whose rows for those
    channels are divided by 1e5. The assignment builds the same pair."""
    import torch
    import torch.nn.functional as F

    tokens, W = _tokens_and_weight(n_tokens, d, d_out, seed)
    gamma = torch.ones(d)
    gamma[list(OUTLIER_CHANNELS)] = OUTLIER_GAMMA
    W[list(OUTLIER_CHANNELS)] /= OUTLIER_GAMMA
    return F.layer_norm(tokens, (d,), weight=gamma), W


def loud_token_layer(n_tokens=128, d=256, d_out=128, seed=0):
    """(A, W, quiet) of question 3: layer norm's output (no gamma) with four
    tokens 1e5 times louder, the weight before any row was divided, and the
    bool mask of the other tokens. The assignment asks for the same A."""
    import torch
    import torch.nn.functional as F

    tokens, W = _tokens_and_weight(n_tokens, d, d_out, seed)
    A = F.layer_norm(tokens, (d,))
    A[list(LOUD_TOKENS)] *= LOUD_TOKEN_FACTOR
    quiet = torch.ones(n_tokens, dtype=torch.bool)
    quiet[list(LOUD_TOKENS)] = False
    return A, W, quiet


def matmul_relative_error(A, A_rt, W, W_rt=None, rows=None):
    """||A_rt @ W_rt - A @ W|| / ||A @ W|| on the token rows `rows`, float64."""
    exact = A.double() @ W.double()
    approx = A_rt.double() @ (W if W_rt is None else W_rt).double()
    if rows is not None:
        exact, approx = exact[rows], approx[rows]
    return float((approx - exact).norm() / exact.norm())


def _as_float32(value):
    import torch

    return torch.as_tensor(value).float()


def _stored(q):
    """What a quantizer stored: its values as float64, and its dtype's name."""
    values = q.float() if hasattr(q, "float") else q
    return (np.asarray(getattr(values, "detach", lambda: values)(), np.float64),
            _dtype_name(q))


def _call_quantizer(subject, case):
    """quantize(x, dtype) -> (q, scales); then dequantize(q, scales)."""
    quantize, dequantize = subject
    x, dtype = _tensor(case["x"]), _torch_dtype(case["dtype"])
    result = _with_float8_hint(lambda: quantize(x.clone(), dtype))
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError("the quantizer must return a pair (q, scales), "
                        f"not {type(result).__name__}")
    q, scales = result
    y = _with_float8_hint(lambda: dequantize(q, scales))
    q_values, q_dtype = _stored(q)
    return {"q": q_values, "q_dtype": q_dtype,
            "scales": np.asarray(_as_float32(scales).numpy(), np.float64),
            "y": np.asarray(_as_float32(y).numpy(), np.float64), "y_dtype": _dtype_name(y)}


def _folded(smoothquant_fold, X, W, alpha):
    """The student's (X_smooth, W_smooth) as float64 tensors."""
    import torch

    result = smoothquant_fold(X.clone(), W.clone(), alpha)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError("smoothquant_fold must return a pair (X_smooth, W_smooth), "
                        f"not {type(result).__name__}")
    return tuple(torch.as_tensor(part).detach().double() for part in result)


def _call_fold(smoothquant_fold, case):
    X, W = _tensor(case["x"]), _tensor(case["w"])
    x_smooth, w_smooth = _folded(smoothquant_fold, X, W, float(case["alpha"]))
    return {"x_smooth": x_smooth.numpy(), "w_smooth": w_smooth.numpy()}


def _measure_schemes(quantizers, A, W, rows=None):
    """The five schemes' matmul errors, measured with the student's functions."""
    import torch

    per_token, channel_pair, block_pair, smoothquant_fold = quantizers
    e4m3 = torch.float8_e4m3fn

    def smoothed():
        A_smooth, W_smooth = _folded(smoothquant_fold, A, W, 0.5)
        return per_tensor_round_trip(A_smooth.float(), e4m3), W_smooth

    stored = {
        "per-tensor": lambda: (per_tensor_round_trip(A, e4m3), W),
        "per-token": lambda: (per_token(A.clone(), e4m3), W),
        "per-channel": lambda: (channel_pair[1](*channel_pair[0](A.clone(), e4m3)), W),
        "per-block": lambda: (block_pair[1](*block_pair[0](A.clone(), e4m3)), W),
        "smoothquant": smoothed,
    }
    measured = []
    for name in MATMUL_SCHEMES:
        A_rt, W_rt = _with_float8_hint(stored[name])
        measured.append(matmul_relative_error(A, _as_float32(A_rt), W,
                                              _as_float32(W_rt), rows))
    return np.array(measured, np.float64)


def _matmul_probe(subject, case):
    """The student's matmul errors, and the same measurement redone here with
    the lesson's round trip and the student's other quantizers."""
    errors, *quantizers = subject
    by_name = _by_choice(errors, MATMUL_SCHEMES, "MATMUL_ERRORS", "{scheme: relative error}")
    A, W = outlier_layer()
    return {"errors": np.array([float(by_name[name]) for name in MATMUL_SCHEMES]),
            "measured": _measure_schemes(quantizers, A, W)}


def _loud_token_probe(subject, case):
    """The same for question 3's loud tokens, measured on the quiet tokens."""
    errors, *quantizers = subject
    by_name = _by_choice(errors, MATMUL_SCHEMES, "LOUD_TOKEN_ERRORS",
                         "{scheme: relative error}")
    A, W, quiet = loud_token_layer()
    return {"errors": np.array([float(by_name[name]) for name in MATMUL_SCHEMES]),
            "measured": _measure_schemes(quantizers, A, W, quiet)}


def _smooth_spread_probe(subject, case):
    """The answer as text, and the same ratio measured on the student's own
    fold of the loud-token layer (NaN where the fold fails)."""
    answer, smoothquant_fold = subject
    A, W, quiet = loud_token_layer()
    try:
        X_smooth = _folded(smoothquant_fold, A, W, 0.5)[0]
        measured = float(X_smooth[~quiet].abs().max() / X_smooth[quiet].abs().max())
    except Exception:  # a broken fold is the fold check's to report, not this one's
        measured = float("nan")
    return {"answer": np.array(answer_text(answer)), "measured": np.array(measured)}



def _call_mx_matmul(subject, case):
    """mx_block_partials(qa, qw_t) and mx_matmul(qa, Xa, qw_t, Xw_t) on
    operands quantized by the grader (the student's mx_quantize is not used)."""
    import torch

    block_partials, matmul = subject
    dtype = _torch_dtype(case["dtype"])
    qa, qw_t = (_tensor(case[name]).to(dtype) for name in ("qa", "qw_t"))
    Xa, Xw_t = _tensor(case["Xa"]), _tensor(case["Xw_t"])
    partials = _with_float8_hint(lambda: block_partials(qa.clone(), qw_t.clone()))
    z = _with_float8_hint(lambda: matmul(qa.clone(), Xa.clone(), qw_t.clone(),
                                         Xw_t.clone()))
    return {name: np.asarray(torch.as_tensor(value).detach().double().numpy())
            for name, value in (("partials", partials), ("z", z))}

def check_per_channel(per_channel_quantize, per_channel_dequantize):
    """Check per_channel_quantize(x, dtype) and per_channel_dequantize(q, scale)."""
    run_check("quant_per_channel", (per_channel_quantize, per_channel_dequantize),
              _call_quantizer)


def check_mx_blocks(mx_quantize, mx_dequantize):
    """Check mx_quantize(x, dtype) and mx_dequantize(q, X): MX blocks of 32."""
    run_check("quant_mx_blocks", (mx_quantize, mx_dequantize), _call_quantizer)



def _call_mxfp4(mxfp4_round_trip, case):
    import torch

    x = _tensor(case["x"])
    y = mxfp4_round_trip(x.clone())
    if "float8" in str(getattr(y, "dtype", "")):
        return {"dtype": _dtype_name(y)}
    return {"y": torch.as_tensor(y).detach().double().numpy(), "dtype": _dtype_name(y)}


def check_mxfp4_round_trip(mxfp4_round_trip):
    """Check mxfp4_round_trip(x): e2m1 elements, one E8M0 scale per block of 32."""
    run_check("quant_mxfp4", mxfp4_round_trip, _call_mxfp4)


def _call_per_channel_matmul(per_channel_matmul, case):
    """per_channel_matmul(q, s, W) on a q and s quantized by the grader."""
    import torch

    dtype = _torch_dtype(case["dtype"])
    q, s, W = _tensor(case["q"]).to(dtype), _tensor(case["s"]), _tensor(case["W"])
    z = _with_float8_hint(lambda: per_channel_matmul(q.clone(), s.clone(), W.clone()))
    if "float8" in str(getattr(z, "dtype", "")):
        return {"dtype": _dtype_name(z)}
    return {"z": np.asarray(torch.as_tensor(z).detach().double().numpy()),
            "dtype": _dtype_name(z)}


def check_per_channel_matmul(per_channel_matmul):
    """Check per_channel_matmul(q, s, W): 1 / s folded into W's rows, then q @ W."""
    run_check("quant_per_channel_matmul", per_channel_matmul, _call_per_channel_matmul)


def _choices_probe(answer, case):
    """A choice or a collection of choices, each as text."""
    if isinstance(answer, str) or not hasattr(answer, "__iter__"):
        answer = [answer]
    return {"choices": np.array([answer_text(choice) for choice in answer] or [""])}


def check_factor_out(answer):
    """Check which scales factor out of the matmul's sum over the channels."""
    run_check("quant_factor_out", answer, _choices_probe)


def check_mx_matmul(mx_block_partials, mx_matmul):
    """Check mx_block_partials(qa, qw_t) and mx_matmul(qa, Xa, qw_t, Xw_t)."""
    run_check("quant_mx_matmul", (mx_block_partials, mx_matmul), _call_mx_matmul)

def check_smoothquant_fold(smoothquant_fold):
    """Check smoothquant_fold(X, W, alpha): SmoothQuant's per-channel fold."""
    run_check("quant_smoothquant_fold", smoothquant_fold, _call_fold)


def check_matmul_errors(errors, per_token_round_trip, per_channel_pair, mx_pair,
                        smoothquant_fold):
    """Check MATMUL_ERRORS against the same measurement made with your functions."""
    run_check("quant_matmul_errors",
              (errors, per_token_round_trip, per_channel_pair, mx_pair, smoothquant_fold),
              _matmul_probe)


def check_loud_token_errors(errors, per_token_round_trip, per_channel_pair, mx_pair,
                            smoothquant_fold):
    """Check LOUD_TOKEN_ERRORS against the same measurement on the quiet tokens."""
    run_check("quant_loud_token_errors",
              (errors, per_token_round_trip, per_channel_pair, mx_pair, smoothquant_fold),
              _loud_token_probe)


def check_loud_token_answers(smooth_spread, smoothquant_fold):
    """Check how much louder the loud tokens still are after SmoothQuant's fold."""
    run_check("quant_loud_token_answers", (smooth_spread, smoothquant_fold),
              _smooth_spread_probe)


# -- the conclusions ----------------------------------------------------------

BEST_SCHEME_CASES = ("loud channel", "loud token", "RMSNorm, mu = 20")


def _measured_or_nan(measure, size):
    """What `measure` returns, or NaNs where the student's code raises: a
    broken function is its own exercise's to report, not the conclusions'."""
    try:
        return np.asarray(measure(), np.float64)
    except Exception:
        return np.full(size, np.nan)


def _one_case_probe(name):
    """A probe for the one case `name` of ANSWER_BEST_SCHEME: its answer, and
    only the figures that case is read from, measured with the student's
    functions (NaN where their code raises)."""

    def probe(subject, case):
        import torch

        answers, per_token_round_trip, *quantizers = subject
        answer = _by_choice(answers, (name,), "ANSWER_BEST_SCHEME", "{case: scheme}")[name]
        if name == "RMSNorm, mu = 20":
            rms_out, everywhere = experiment_token_sets()[name]
            e4m3 = torch.float8_e4m3fn

            def rms_row():
                per_token = torch.as_tensor(
                    per_token_round_trip(rms_out.clone(), e4m3)).float()
                return [masked_error(rms_out, per_tensor_round_trip(rms_out, e4m3),
                                     everywhere),
                        masked_error(rms_out, per_token, everywhere)]

            return {"answer": np.array(answer_text(answer)),
                    "rms_row": _measured_or_nan(rms_row, 2)}
        schemes = (per_token_round_trip, *quantizers)
        if name == "loud channel":
            A, W = outlier_layer()
            measure = lambda: _measure_schemes(schemes, A, W)  # noqa: E731
        else:
            A_loud, W_plain, quiet = loud_token_layer()
            measure = lambda: _measure_schemes(schemes, A_loud, W_plain, quiet)  # noqa: E731
        return {"answer": np.array(answer_text(answer)),
                "errors": _measured_or_nan(measure, len(MATMUL_SCHEMES))}

    return probe


def check_best_scheme_loud_channel(answers, per_token_round_trip, per_channel_pair,
                                   mx_pair, smoothquant_fold):
    """Check ANSWER_BEST_SCHEME["loud channel"] against your own measurement."""
    run_check("quant_best_scheme_loud_channel",
              (answers, per_token_round_trip, per_channel_pair, mx_pair, smoothquant_fold),
              _one_case_probe("loud channel"))


def check_best_scheme_loud_token(answers, per_token_round_trip, per_channel_pair,
                                 mx_pair, smoothquant_fold):
    """Check ANSWER_BEST_SCHEME["loud token"] against your own measurement."""
    run_check("quant_best_scheme_loud_token",
              (answers, per_token_round_trip, per_channel_pair, mx_pair, smoothquant_fold),
              _one_case_probe("loud token"))


def check_best_scheme_rms_offset(answers, per_token_round_trip, per_channel_pair,
                                 mx_pair, smoothquant_fold):
    """Check ANSWER_BEST_SCHEME["RMSNorm, mu = 20"] against your own measurement."""
    run_check("quant_best_scheme_rms_offset",
              (answers, per_token_round_trip, per_channel_pair, mx_pair, smoothquant_fold),
              _one_case_probe("RMSNorm, mu = 20"))


BEST_SCHEME_CHECKS = {"loud channel": check_best_scheme_loud_channel,
                      "loud token": check_best_scheme_loud_token,
                      "RMSNorm, mu = 20": check_best_scheme_rms_offset}


def check_best_scheme(answers, case, per_token_round_trip, per_channel_pair, mx_pair,
                      smoothquant_fold):
    """The check of one case by its name (for tests; a grade cell calls the
    case's own check_best_scheme_* so that the grader knows which it runs)."""
    if case not in BEST_SCHEME_CHECKS:
        raise ValueError(f"case is one of {list(BEST_SCHEME_CHECKS)}, not {case!r}")
    BEST_SCHEME_CHECKS[case](answers, per_token_round_trip, per_channel_pair, mx_pair,
                             smoothquant_fold)


def check_best_schemes(answers, per_token_round_trip, per_channel_pair, mx_pair,
                       smoothquant_fold):
    """Check the scheme you name for every case (each case is graded on its own
    in the assignment: check_best_scheme)."""
    functions = (per_token_round_trip, per_channel_pair, mx_pair, smoothquant_fold)
    _all_parts([(check_best_scheme, (answers, case, *functions))
                for case in BEST_SCHEME_CASES])


# -- exercise 9: the offset, and a zero-point per token ----------------------

def _call_zero_point(zero_point_round_trip, case):
    import torch

    x, dtype = _tensor(case["x"]), _torch_dtype(case["dtype"])
    y = _with_float8_hint(lambda: zero_point_round_trip(x.clone(), dtype))
    if "float8" in str(getattr(y, "dtype", "")):
        return {"dtype": _dtype_name(y)}
    return {"y": torch.as_tensor(y).detach().double().numpy(), "dtype": _dtype_name(y)}


def check_offset_answer(mu):
    """Check the offset at which RMSNorm's per-tensor e4m3 error passes 0.1."""
    run_check("quant_offset_answer", {"mu": mu}, _answers_as_text)


def _as_pair(answer, first, second):
    """{first: answer[0], second: answer[1]} for a pair (a tuple, list, 1-d
    tensor or array); {first: answer, second: None} for anything else."""
    pair = None
    if not isinstance(answer, str) and hasattr(answer, "__iter__"):
        try:
            pair = list(answer)
        except Exception:  # not iterable after all: read as one value
            pair = None
    if pair is not None and len(pair) == 2:
        return {first: pair[0], second: pair[1]}
    return {first: answer, second: None}


def check_offset_bracket(bracket):
    """Check the range of mu in which h / sqrt(12) passes 0.1, (low, high)."""
    run_check("quant_offset_bracket", _as_pair(bracket, "low", "high"), _answers_as_text)


def check_zero_point_round_trip(zero_point_round_trip):
    """Check zero_point_round_trip(x, dtype): each token's range [min, max]
    onto [-fmax, fmax], its midpoint as the zero-point, a scale per token."""
    run_check("quant_zero_point", zero_point_round_trip, _call_zero_point)


MX_RULE_SHAPE, MX_RULE_SEED = (4096, 32), 0  # exercise 5's blocks for the scale rules


def _own_mx_rule_figures(mx_quantize, mx_dequantize):
    """(fraction of the blocks whose largest |value| clips, floor-rule error,
    1 if the student's X is the floor rule's on every block else 0), measured
    with the student's pair; NaN where their code raises or returns scales of
    the wrong shape."""
    import torch

    try:
        x = torch.randn(*MX_RULE_SHAPE,
                        generator=torch.Generator().manual_seed(MX_RULE_SEED))
        q, X = mx_quantize(x.clone(), torch.float8_e4m3fn)
        per_block = torch.as_tensor(X).detach().double().reshape(MX_RULE_SHAPE[0])
        # a power-of-two X divides exactly; the margin spares an X = amax / 448
        # computed in float32 the rounding of its division
        ratio = x.double().abs().amax(dim=-1) / per_block
        clipped = float((ratio > 448 * (1 + 1e-6)).double().mean())
        back = torch.as_tensor(mx_dequantize(q, X)).detach().float()
        everywhere = torch.ones(MX_RULE_SHAPE, dtype=torch.bool)
        # the floor rule's X, exact: amax = m 2^e with m in [0.5, 1), so
        # floor(log2(amax)) = e - 1, and e4m3's largest exponent is 8
        _, exponent = np.frexp(x.double().abs().amax(dim=-1).numpy())
        floor_rule = float(np.array_equal(per_block.numpy(),
                                          np.ldexp(1.0, exponent - 1 - 8)))
        return np.array([clipped, masked_error(x, back, everywhere), floor_rule],
                        np.float64)
    except Exception:  # a broken pair is exercise 5's to report, not this one's
        return np.full(3, np.nan)


def _mx_rule_probe(subject, case):
    answers, mx_quantize, mx_dequantize = subject
    return {**_answers_as_text(answers, case),
            "own": _own_mx_rule_figures(mx_quantize, mx_dequantize)}


def check_mx_clipped_fraction(fraction, mx_quantize, mx_dequantize):
    """Check the fraction of blocks whose largest value clips under the floor rule."""
    run_check("quant_mx_clipped_fraction",
              ({"clipped": fraction}, mx_quantize, mx_dequantize), _mx_rule_probe)


def check_mx_rule_errors(errors, mx_quantize, mx_dequantize):
    """Check (floor-rule error, round-up-rule error) on the same blocks."""
    answers = _as_pair(errors, "floor", "round_up")
    run_check("quant_mx_rule_errors", (answers, mx_quantize, mx_dequantize),
              _mx_rule_probe)


def check_mx_last_exact_k(last_exact_k):
    """Check the largest k at which the others of the MX block stay exact."""
    run_check("quant_mx_last_exact_k", {"last_exact_k": last_exact_k}, _answers_as_text)


def check_mx_first_zero_k(first_zero_k):
    """Check the smallest k at which the others of the MX block come back as 0."""
    run_check("quant_mx_first_zero_k", {"first_zero_k": first_zero_k}, _answers_as_text)


def _all_parts(checks):
    """Run every (check, args) pair; one CheckFailed with every part's message."""
    problems = []
    for check, args in checks:
        try:
            check(*args)
        except CheckFailed as failure:
            problems.append(str(failure))
    if problems:
        raise CheckFailed("; ".join(problems))


def check_mx_outlier_answers(last_exact_k, first_zero_k):
    """Check both k of the MX block with one loud entry (each part is graded on
    its own in the assignment: check_mx_last_exact_k, check_mx_first_zero_k)."""
    _all_parts([(check_mx_last_exact_k, (last_exact_k,)),
                (check_mx_first_zero_k, (first_zero_k,))])


# -- exercise 10: a learned beta against RMSNorm -----------------------------

BETA_TABLE_ROWS = ("LayerNorm + beta", "RMSNorm")


def _beta_table_probe(table, case):
    by_name = _by_choice(table, BETA_TABLE_ROWS, "BETA_TABLE",
                         "{row: (e4m3 error, bf16 error)}", entry="row")
    rows = [tuple(float(v) for v in by_name[name]) for name in BETA_TABLE_ROWS]
    if any(len(row) != 2 for row in rows):
        raise ValueError("each row of BETA_TABLE must be a pair (e4m3 error, bf16 error)")
    return {"table": np.array(rows, np.float64)}


def _beta_loses_more_probe(subject, case):
    """The answer, and the e4m3 column of the student's own table (NaN where
    it cannot be read), so that the answer may be read against it."""
    answer, table = subject
    try:
        e4m3 = [float(row[0]) for row in _beta_table_probe(table, case)["table"]]
    except (TypeError, ValueError, KeyError, IndexError):
        e4m3 = [float("nan")] * len(BETA_TABLE_ROWS)
    return {"answer": np.array(answer_text(answer)), "own_e4m3": np.array(e4m3, np.float64)}


def check_beta_table(table):
    """Check BETA_TABLE against the grader's own measurement of both norms."""
    run_check("quant_beta_table", table, _beta_table_probe)


def check_beta_loses_more(answer, table):
    """Check which norm's output loses more when stored, against the true
    measurement or your own table's e4m3 column."""
    run_check("quant_beta_loses_more", (answer, table), _beta_loses_more_probe)


def check_beta_folded_error(error):
    """Check the e4m3 error of LayerNorm + beta with beta folded into the bias."""
    run_check("quant_beta_folded_error", {"error": error}, _answers_as_text)


def check_spread_fold_errors(errors):
    """Check (error without the shift, error with the calibrated shift folded)
    on RMSNorm's output of tokens whose offsets differ from token to token."""
    run_check("quant_spread_fold_errors", _as_pair(errors, "without", "with"),
              _answers_as_text)


def check_beta_why(answer):
    """Check the reason you chose for the table."""
    run_check("quant_beta_why", {"why": answer}, _answers_as_text)
