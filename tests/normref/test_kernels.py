"""normref.kernels (unit 07) against torch, in Triton's CPU interpreter, and its checks
(the RMSNorm kernels of assignment 07, forward and backward, and the two byte questions).

The interpreter must be on before triton defines a kernel, so this module
switches it on (when there is no GPU) before importing normref.kernels or
defining the student-style kernels below. Shapes stay small: every program
of a launch runs one after another in numpy.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from normref.checks import (  # noqa: E402
    CheckFailed,
    check_backward_bytes,
    check_eager_time_prediction,
    check_fused_fraction_of_peak,
    check_llama_bytes,
    check_rms_autograd_function,
    check_rms_backward_dx,
    check_rms_backward_partial_dw,
    check_rms_forward_half_precision,
    check_rms_forward_ragged_rows,
    check_rms_forward_rows,
    check_rms_forward_rstd,
)
from normref.kernels import bench, ops  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# max |error| allowed against float64, for outputs of size ~1 to 5
ATOL = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 5e-2}


def _inputs(shape, dtype, offset=0.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = shape[-1]
    x = (torch.randn(shape, generator=gen) * 2 + offset).to(dtype).to(DEVICE)
    w = (torch.randn(n, generator=gen) * 0.5 + 1).to(dtype).to(DEVICE)
    b = (torch.randn(n, generator=gen) * 0.5).to(dtype).to(DEVICE)
    return x, w, b


def _float64_layer_norm(x, w, b, dy):
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y = F.layer_norm(leaves[0], (x.shape[-1],), leaves[1], leaves[2], 1e-5)
    y.backward(dy.double())
    return y.detach(), *(leaf.grad for leaf in leaves)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 100), (1, 37), (2, 3, 48), (5, 1)], ids=str)
def test_forward_and_backward_match_autograd(shape, dtype):
    x, w, b = _inputs(shape, dtype, seed=shape[-1])
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y = ops.layer_norm(*leaves, 1e-5)
    y.backward(dy)
    assert y.dtype == dtype and y.shape == x.shape
    expected = _float64_layer_norm(x, w, b, dy)
    rows = x.numel() // shape[-1]
    for name, got, want in zip(("y", "dx", "dw", "db"), [y] + [t.grad for t in leaves],
                               expected):
        assert got.dtype == dtype, name
        scale = rows if name in ("dw", "db") else 1  # sums over rows round at their size
        error = (got.double() - want).abs().max().item()
        assert error <= ATOL[dtype] * scale, f"{name}: {error}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_large_offset_forward_and_backward(dtype):
    """Rows near 1000 (float32) or 100: the statistics' float32 sums round at the
    offset's scale (about 6e-5 at 1000), so allow a few of those per unit of std."""
    offset = 1000.0 if dtype == torch.float32 else 100.0
    x, w, b = _inputs((4, 64), dtype, offset=offset)
    dy = torch.randn(4, 64, generator=torch.Generator().manual_seed(2)).to(dtype).to(DEVICE)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y = ops.layer_norm(*leaves)
    y.backward(dy)
    expected = _float64_layer_norm(x, w, b, dy)
    tolerance = 5e-4 if dtype == torch.float32 else ATOL[dtype]
    for name, got, want in zip(("y", "dx", "dw", "db"), [y] + [t.grad for t in leaves],
                               expected):
        scale = 4 if name in ("dw", "db") else 1  # sums over the 4 rows
        error = (got.double() - want).abs().max().item()
        assert error <= tolerance * scale, f"{name}: {error}"


def test_weight_and_bias_may_be_none():
    x, _, _ = _inputs((3, 20), torch.float32)
    leaf = x.clone().requires_grad_()
    y = ops.layer_norm(leaf)
    y.sum().backward()
    torch.testing.assert_close(y, F.layer_norm(x, (20,)), atol=2e-5, rtol=1e-5)
    assert leaf.grad.abs().max() < 1e-5  # the sum of a normalized row never changes


def test_statistics_are_saved_in_float32():
    x, w, b = _inputs((4, 50), torch.float16)
    y, mean, rstd = ops.layer_norm_forward(x, w, b, 1e-5)
    assert mean.dtype == rstd.dtype == torch.float32
    x64 = x.double()
    torch.testing.assert_close(mean.double(), x64.mean(-1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rstd.double(), (x64.var(-1, unbiased=False) + 1e-5).rsqrt(),
                               atol=1e-5, rtol=1e-5)


def test_padded_rows_are_read_through_their_stride():
    x, w, b = _inputs((3, 128), torch.float32)
    view = x[:, :100]  # rows 128 elements apart
    torch.testing.assert_close(ops.layer_norm(view, w[:100], b[:100]),
                               F.layer_norm(view, (100,), w[:100], b[:100]),
                               atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 100), (1, 64), (2, 2, 7)], ids=str)
def test_rms_norm_matches_torch(shape, dtype):
    x, w, _ = _inputs(shape, dtype, offset=1.0, seed=3)
    y = ops.rms_norm(x, w, 1e-5)
    expected = F.rms_norm(x.double(), (shape[-1],), w.double(), 1e-5)
    assert y.dtype == dtype
    assert (y.double() - expected).abs().max().item() <= ATOL[dtype]


def _float64_rms_norm(x, w, dy):
    leaves = [t.detach().double().requires_grad_() for t in (x, w)]
    y = F.rms_norm(leaves[0], (x.shape[-1],), leaves[1], 1e-5)
    y.backward(dy.double())
    return y.detach(), *(leaf.grad for leaf in leaves)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 100), (9, 37), (2, 3, 48), (5, 1)], ids=str)
def test_rms_norm_forward_and_backward_match_autograd(shape, dtype):
    """9 rows make several programs, the last one short, in the backward."""
    x, w, _ = _inputs(shape, dtype, offset=1.0, seed=shape[-1])
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    leaves = [t.clone().requires_grad_() for t in (x, w)]
    y = ops.rms_norm(*leaves, 1e-5)
    y.backward(dy)
    expected = _float64_rms_norm(x, w, dy)
    rows = x.numel() // shape[-1]
    for name, got, want in zip(("y", "dx", "dw"), [y] + [t.grad for t in leaves], expected):
        assert got.dtype == dtype, name
        scale = rows if name == "dw" else 1  # sums over rows round at their size
        error = (got.double() - want).abs().max().item()
        assert error <= ATOL[dtype] * scale, f"{name}: {error}"


def test_rms_norm_weight_may_be_none():
    x, _, _ = _inputs((3, 20), torch.float32)
    leaf = x.clone().requires_grad_()
    y = ops.rms_norm(leaf)
    y.backward(torch.ones_like(y))
    expected = _float64_rms_norm(x, torch.ones(20, device=DEVICE), torch.ones_like(x))
    assert (y.double() - expected[0]).abs().max() < 2e-5
    assert (leaf.grad.double() - expected[1]).abs().max() < 2e-5


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_wider_than_one_block_get_a_clear_error(dtype):
    largest = 65536 // torch.empty((), dtype=dtype).element_size()
    assert ops.max_features(dtype) == largest
    with pytest.raises(ValueError, match=f"N <= {largest}"):
        ops.layer_norm(torch.zeros(1, largest + 1, dtype=dtype, device=DEVICE))


def test_unsupported_inputs_get_clear_errors():
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        ops.layer_norm(torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"weight has shape \(3,\); expected \(4,\)"):
        ops.layer_norm(torch.zeros(2, 4), torch.ones(3))
    with pytest.raises(ValueError, match="no features"):
        ops.layer_norm(torch.zeros(2, 0))


def test_cpu_tensors_without_the_interpreter_get_the_hint():
    """In a fresh process without TRITON_INTERPRET, CPU tensors are refused with the fix."""
    import subprocess
    import sys

    code = ("import torch; from normref.kernels import layer_norm\n"
            "try:\n    layer_norm(torch.zeros(2, 4))\n"
            "except RuntimeError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120).stdout
    assert "TRITON_INTERPRET" in out and "before importing" in out


def test_kernels_compile_for_an_h200_without_one():
    """Triton compiles to sm_90 machine code on any machine: the GPU run cannot
    meet a compile error, and the forward kernels keep the row without spilling."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "normref.kernels.compile_check", "--quick"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    for kernel in ("layer_norm_fwd_kernel", "rms_norm_fwd_kernel", "layer_norm_bwd_dx_kernel",
                   "rms_norm_bwd_kernel", "sum_partials_kernel"):
        assert kernel in done.stdout


def test_no_rows_gives_empty_results():
    y = ops.layer_norm(torch.zeros(0, 5, device=DEVICE))
    assert y.shape == (0, 5)


def test_bench_gpu_path_runs_on_the_cpu_in_the_interpreter(capsys):
    """The GPU run's code, with tiny sizes and a wall-clock timer: it must not crash."""
    failures = bench.Failures()
    failed = bench.run_gpu(ops, True, failures, device=DEVICE,
                           timer=lambda fn: bench.perf_counter_timer(fn, 1), m=2,
                           features=(64,), backward_features=(32,), tune=True,
                           tune_features=(16,))
    out = capsys.readouterr().out
    assert failed == 0 and failures.items == []
    assert "Tri.LN" in out and "LN/copy" in out and "Backward" in out and "32w" in out


def test_bench_reports_failures_instead_of_dying():
    failures = bench.Failures()
    assert failures.guard("a row", lambda: 1 / 0) is None
    assert failures.items == ["a row: ZeroDivisionError: division by zero"]
    rows = [{"dtype": "float16", "N": 4096, "copy": 100.0, "triton_ln": None}]
    bench.print_gpu_table(rows)  # a missing measurement prints as "-"
    assert bench.summarize_gpu(rows) == []


# -- the checks: a student's kernels, right and wrong ---------------------------------------

@triton.jit
def correct_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * row_stride + cols, x * rstd * w, mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def unmasked_load_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * row_stride + cols, x * rstd * w, mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def unmasked_store_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * row_stride + cols, x * rstd * w)
    tl.store(Rstd + row, rstd)


@triton.jit
def block_divisor_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / BLOCK_SIZE + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * row_stride + cols, x * rstd * w, mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def half_sums_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0)
    tl.store(Y + row * row_stride + cols, x * rstd * w, mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def centred_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    """Subtracts the mean: layer norm's statistic, not RMSNorm's."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    xc = tl.where(mask, x - tl.sum(x, axis=0) / N, 0.0)
    rstd = 1 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * row_stride + cols, x * rstd * w, mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def stride_ignored_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, x * rstd * w, mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def rms_saved_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rms = tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * row_stride + cols, x / rms * w, mask=mask)
    tl.store(Rstd + row, rms)


@triton.jit
def no_rstd_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * row_stride + cols, x * rstd * w, mask=mask)


@triton.jit
def no_weight_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(Y + row * row_stride + cols, x * rstd, mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def blank_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    raise NotImplementedError()


@triton.jit
def correct_bwd(DX, DY, X, W, Rstd, PartialDW, row_stride, M, N, rows_per_program,
                BLOCK_SIZE: tl.constexpr):
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw_sum = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    first = program * rows_per_program
    for row in range(first, tl.minimum(first + rows_per_program, M)):
        x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + row)
        x_hat = x * rstd
        g = dy * w
        dx = rstd * (g - x_hat * tl.sum(g * x_hat, axis=0) / N)
        tl.store(DX + row * row_stride + cols, dx, mask=mask)
        dw_sum += dy * x_hat
    tl.store(PartialDW + program * N + cols, dw_sum, mask=mask)


def _bwd_variant(dx_line="dx = rstd * (g - x_hat * tl.sum(g * x_hat, axis=0) / N)",
                 acc_line="dw_sum += dy * x_hat",
                 store_line="tl.store(PartialDW + program * N + cols, dw_sum, mask=mask)",
                 stop="tl.minimum(first + rows_per_program, M)",
                 x_load="tl.load(X + row * row_stride + cols, mask=mask, other=0.0)"):
    """correct_bwd with one line changed, defined from a file as a cell would be."""
    import linecache

    source = (
        "@triton.jit\n"
        "def variant_bwd(DX, DY, X, W, Rstd, PartialDW, row_stride, M, N, rows_per_program,\n"
        "                BLOCK_SIZE: tl.constexpr):\n"
        "    program = tl.program_id(0)\n"
        "    cols = tl.arange(0, BLOCK_SIZE)\n"
        "    mask = cols < N\n"
        "    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)\n"
        "    dw_sum = tl.zeros([BLOCK_SIZE], dtype=tl.float32)\n"
        "    first = program * rows_per_program\n"
        f"    for row in range(first, {stop}):\n"
        f"        x = {x_load}.to(tl.float32)\n"
        "        dy = tl.load(DY + row * row_stride + cols, mask=mask, other=0.0)\n"
        "        dy = dy.to(tl.float32)\n"
        "        rstd = tl.load(Rstd + row)\n"
        "        x_hat = x * rstd\n"
        "        g = dy * w\n"
        f"        {dx_line}\n"
        "        tl.store(DX + row * row_stride + cols, dx, mask=mask)\n"
        f"        {acc_line}\n"
        f"    {store_line}\n")
    name = f"<variant-{abs(hash(source))}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    namespace = {"triton": triton, "tl": tl}
    exec(compile(source, name, "exec"), namespace)
    return namespace["variant_bwd"]


FORWARD_CHECKS = [check_rms_forward_rows, check_rms_forward_ragged_rows, check_rms_forward_rstd,
                  check_rms_forward_half_precision]
BACKWARD_CHECKS = [check_rms_backward_dx, check_rms_backward_partial_dw]


@pytest.mark.parametrize("check", FORWARD_CHECKS + BACKWARD_CHECKS, ids=lambda c: c.__name__)
def test_checks_pass_the_solution(check, capsys):
    check(correct_fwd if check in FORWARD_CHECKS else correct_bwd)
    assert "cases passed" in capsys.readouterr().out


def _failure(check, kernel):
    with pytest.raises(CheckFailed) as info:
        check(kernel)
    return str(info.value)


# (kernel, checks it must fail, words the message must contain). The mask slips cost the
# ragged-rows cell alone: the rstd and half-precision cases keep N a power of two, so that
# one slip is not charged three times.
MASK_CHECKS = [check_rms_forward_ragged_rows]
FORWARD_MISTAKES = {
    "unmasked load": (unmasked_load_fwd, MASK_CHECKS, "mask=cols < N and other=0.0"),
    "unmasked store": (unmasked_store_fwd, MASK_CHECKS, "store with mask=cols < N"),
    "divides by BLOCK_SIZE": (block_divisor_fwd, MASK_CHECKS, "not by BLOCK_SIZE"),
    "no float32 sums": (half_sums_fwd, [check_rms_forward_half_precision], "float32"),
    "mean subtracted": (centred_fwd, FORWARD_CHECKS, "without centring"),
    "row_stride ignored": (stride_ignored_fwd, [check_rms_forward_rows,
                                                check_rms_forward_ragged_rows,
                                                check_rms_forward_rstd,
                                                check_rms_forward_half_precision], "row_stride"),
    "rms saved as rstd": (rms_saved_fwd, [check_rms_forward_rstd], "reciprocal"),
    "rstd not saved": (no_rstd_fwd, [check_rms_forward_rstd], "tl.store(Rstd + row, rstd)"),
    "weight left out": (no_weight_fwd, FORWARD_CHECKS, "y = x * rstd * w"),
    "blank": (blank_fwd, FORWARD_CHECKS, "NotImplementedError"),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # float16 sums overflow on purpose
@pytest.mark.parametrize("mistake", FORWARD_MISTAKES)
def test_forward_checks_name_the_typical_mistakes(mistake):
    kernel, failing, words = FORWARD_MISTAKES[mistake]
    for check in FORWARD_CHECKS:
        if check in failing:
            message = _failure(check, kernel)
            assert words in message, message
        else:
            check(kernel)


BACKWARD_MISTAKES = {  # variant of correct_bwd, checks it fails, words
    "no rstd term": (dict(dx_line="dx = rstd * g"), [check_rms_backward_dx],
                     "path through x itself"),
    "layer norm's dx": (
        dict(dx_line="dx = rstd * (g - tl.sum(g, axis=0) / N - x_hat * tl.sum(g * x_hat, "
                     "axis=0) / N)"),
        [check_rms_backward_dx], "only layer norm has"),
    "no weight in g": (dict(dx_line="dx = rstd * (dy - x_hat * tl.sum(dy * x_hat, axis=0) / N)"),
                       [check_rms_backward_dx], "weight is missing from dx"),
    "accumulator overwritten": (dict(acc_line="dw_sum = dy * x_hat"),
                                [check_rms_backward_partial_dw], "acc += ..."),
    "weight in dW": (dict(acc_line="dw_sum += g * x_hat"), [check_rms_backward_partial_dw],
                     "weight once too often"),
    "partials stored by row": (
        dict(store_line="tl.store(PartialDW + (first + 1) * N + cols, dw_sum, mask=mask)"),
        [check_rms_backward_partial_dw], "PartialDW + p * N"),
    # program 0 does every row, the others store zeros: dW adds up, the split is wrong
    "one program does every row": (
        dict(stop="tl.where(program == 0, M, first)"), [check_rms_backward_partial_dw],
        "nothing ran in parallel"),
    # the running sum rounded to the input's type after every row
    "half-precision accumulator": (
        dict(acc_line="dw_sum = (dw_sum.to(DY.dtype.element_ty) + dy * x_hat).to(tl.float32)"),
        [check_rms_backward_partial_dw], "accumulator must still be float32"),
    "rstd recomputed without eps": (
        dict(dx_line="r = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N); xh = x * r; "
                     "dx = r * (g - xh * tl.sum(g * xh, axis=0) / N)"),
        [check_rms_backward_dx], "recomputed from x without eps"),
    "last row of each program skipped": (
        dict(stop="tl.minimum(first + rows_per_program, M) - 1"), BACKWARD_CHECKS,
        "every one of its rows"),
    # the spare rows past M hold NaN: the slip shows in dx and in the sum of dW, with
    # the hint, instead of a load past the end of the memory that kills the kernel
    "last program runs past row M - 1": (
        dict(stop="first + rows_per_program"), BACKWARD_CHECKS, "tl.minimum(first + "),
    # the NaN past N reach dx through the row's sum; dW's lanes past N are never stored
    "unmasked load": (dict(x_load="tl.load(X + row * row_stride + cols)"),
                      [check_rms_backward_dx], "mask=cols < N and other=0.0"),
}


@pytest.mark.parametrize("mistake", BACKWARD_MISTAKES)
def test_backward_checks_name_the_typical_mistakes(mistake):
    change, failing, words = BACKWARD_MISTAKES[mistake]
    kernel = _bwd_variant(**change)
    for check in BACKWARD_CHECKS:
        if check in failing:
            message = _failure(check, kernel)
            assert words in message, message
        else:
            check(kernel)


def test_a_strided_split_of_rows_among_programs_passes():
    """The grader judges the sum of PartialDW's rows, not how programs share the rows:
    dealing them out like cards (rows p, p + P, p + 2P, ...) is right too."""
    for check in BACKWARD_CHECKS:
        check(_dealt_kernel())


def _dealt_kernel():
    import linecache

    source = (
        "@triton.jit\n"
        "def dealt_bwd(DX, DY, X, W, Rstd, PartialDW, row_stride, M, N, rows_per_program,\n"
        "              BLOCK_SIZE: tl.constexpr):\n"
        "    program = tl.program_id(0)\n"
        "    cols = tl.arange(0, BLOCK_SIZE)\n"
        "    mask = cols < N\n"
        "    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)\n"
        "    dw_sum = tl.zeros([BLOCK_SIZE], dtype=tl.float32)\n"
        "    for row in range(program, M, tl.num_programs(0)):\n"
        "        x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0)\n"
        "        dy = tl.load(DY + row * row_stride + cols, mask=mask, other=0.0)\n"
        "        x_hat = x.to(tl.float32) * tl.load(Rstd + row)\n"
        "        g = dy.to(tl.float32) * w\n"
        "        dx = tl.load(Rstd + row) * (g - x_hat * tl.sum(g * x_hat, axis=0) / N)\n"
        "        tl.store(DX + row * row_stride + cols, dx, mask=mask)\n"
        "        dw_sum += dy.to(tl.float32) * x_hat\n"
        "    tl.store(PartialDW + program * N + cols, dw_sum, mask=mask)\n")
    name = "<dealt-rows-kernel>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    namespace = {"triton": triton, "tl": tl}
    exec(compile(source, name, "exec"), namespace)
    return namespace["dealt_bwd"]


def test_checks_refuse_a_plain_function():
    with pytest.raises(CheckFailed, match="the @triton.jit kernel itself"):
        check_rms_forward_rows(lambda *args: None)
    with pytest.raises(CheckFailed, match=r"rms_norm_bwd_kernel\(DX, DY"):
        check_rms_backward_dx(lambda *args: None)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_solution_passes_for_other_seeds(seed):
    from normref.checks import _registry
    from normref.checks._runner import _probe_all
    from normref.checks.kernels_probes import _launch_backward, _launch_forward

    for names, kernel, launch in (
            (("rms_forward_rows", "rms_forward_ragged", "rms_forward_rstd", "rms_forward_half"),
             correct_fwd, _launch_forward),
            (("rms_backward_dx", "rms_backward_partial_dw"), correct_bwd, _launch_backward)):
        for name in names:
            cases = _registry.make_cases(name, seed)
            outputs, errors = _probe_all(kernel, cases, launch)
            verdict = _registry.judge(name, cases, outputs, errors)
            assert verdict["passed"], verdict["message"]


def test_judges_pass_the_float64_reference_for_any_seed():
    """What a perfect kernel would return (the float64 reference, rounded to the
    output's dtype) passes every case for 20 seeds."""
    from normref.checks import _registry
    from normref.checks import kernels_judges as J

    def rounded(values, dtype):
        return J._rounded(values, dtype).astype(np.float64)

    for name, check in J.CHECKS.items():
        for seed in range(20):
            for label, case in check.cases(np.random.default_rng(seed)):
                if name.startswith("rms_forward"):
                    rstd, y = J._forward_reference(case)
                    output = {"y": rounded(y, str(case["dtype"])),
                              "rstd": rstd.astype(np.float32), "padding_written": np.array(0)}
                elif name in ("rms_backward_dx", "rms_backward_partial_dw"):
                    partial = J._partial_reference(case)
                    output = {"dx": rounded(J._dx_reference(case), str(case["dtype"])),
                              "partial_dw": partial.astype(np.float32),
                              "padding_written": np.array(0), "partial_overrun": np.array(0)}
                else:
                    continue
                assert check.judge(case, output) is None, (name, seed, label)
    assert _registry.check_names()


@pytest.mark.parametrize("answer, right", [
    (302092288, True), (36 * 4096 * 2048, True), ("302092288", True), (3.02e8, True),
    (24 * 4096 * 2048, False), (9.0, False), (3.5, False), (None, False), ([3.0e8], False)])
def test_the_llama_bytes_question(answer, right):
    if right:
        check_llama_bytes(answer)
    else:
        with pytest.raises(CheckFailed):
            check_llama_bytes(answer)


def test_the_llama_bytes_count_matches_what_torch_runs():
    """Every aten operation LlamaRMSNorm's forward runs on bfloat16 x, with the
    bytes of each tensor it reads and writes in that tensor's own dtype."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from normref.checks.kernels_judges import llama_rms_norm_bytes

    class Bytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.moved = [], 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tensors = [a for a in args if isinstance(a, torch.Tensor)] + [out]
            self.ops.append(func.__name__.split(".")[0])
            self.moved += sum(t.numel() * t.element_size() for t in tensors)
            return out

    m, n = 64, 32
    x = torch.randn(m, n).to(torch.bfloat16)
    weight = torch.rand(n).to(torch.bfloat16)
    with Bytes() as counted:
        hidden = x.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + 1e-6)
        weight * hidden.to(torch.bfloat16)
    assert counted.ops == ["_to_copy", "pow", "mean", "add", "rsqrt", "mul", "_to_copy", "mul"]
    assert counted.moved == llama_rms_norm_bytes(m, n)


def test_the_backward_bytes_are_the_tensors_each_stage_touches():
    """Question 2's count against the tensors themselves: what the kernel reads and
    writes (w once per program) and what the launcher's sum reads and writes."""
    import torch

    from normref.checks.kernels_judges import rms_backward_bytes

    m, n, programs = 4096, 4096, 64

    def nbytes(*shape, dtype):
        return torch.empty(shape, dtype=dtype, device="meta").nbytes

    bf16, f32 = torch.bfloat16, torch.float32
    kernel = (3 * nbytes(m, n, dtype=bf16) + nbytes(m, dtype=f32)  # x, dy, dx; rstd
              + programs * nbytes(n, dtype=bf16)  # w, once per program
              + nbytes(programs, n, dtype=f32))  # the partial sums, written
    launcher_sum = nbytes(programs, n, dtype=f32) + nbytes(n, dtype=f32)
    assert rms_backward_bytes(m, n, programs) == kernel + launcher_sum == 103317504


@pytest.mark.parametrize("answer, right", [
    (103317504, True), (103317504 - 4096 * 4 - 4096 * 4, True),  # without rstd and dW
    (103317504 + 4096 * 6, True),  # with dW's conversion to bfloat16
    (3 * 4096 * 4096 * 2, False), (103317504 - 64 * 4096 * 4, False),
    (103317504 - 64 * 4096 * 2, False), (103317504 + 4032 * 4096 * 2, False),
    (24576, False), ("many", False)])
def test_the_backward_bytes_question(answer, right):
    if right:
        check_backward_bytes(answer)
    else:
        with pytest.raises(CheckFailed):
            check_backward_bytes(answer)


# -- what counts as a kernel: a real @triton.jit function whose body stays in Triton --------

from normref.checks import kernels_probes  # noqa: E402


@triton.jit
def numpy_stats_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    """Takes rstd with numpy from the interpreter's arrays: right numbers."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    values = x.handle.data[mask.handle.data].astype(np.float64)
    rstd = float(1 / np.sqrt(np.mean(values * values) + eps))
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * row_stride + cols, x * rstd * w, mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def torch_rms_norm_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    """Calls torch.rms_norm from the kernel body."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    x = tl.load(X + row * row_stride + cols, mask=cols < N, other=0.0)
    y = torch.rms_norm(x, (N,), eps=eps)
    tl.store(Y + row * row_stride + cols, y, mask=cols < N)


@triton.jit
def _row_rstd(x, N, eps):
    return 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)


@triton.jit
def helper_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    """Right, with rstd in a @triton.jit helper."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = _row_rstd(x, N, eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * row_stride + cols, x * rstd * w, mask=mask)
    tl.store(Rstd + row, rstd)


EPS_FLOOR = 0.0  # a global constant a kernel may read


@triton.jit
def unusual_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr,
                   HAS_WEIGHT: tl.constexpr = True):
    """Right: an extra constexpr flag with a default, a global constant, tl.math,
    tl.static_range, a docstring."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    squares = tl.sum(tl.zeros([BLOCK_SIZE], dtype=tl.float32), axis=0)
    for _ in tl.static_range(1):
        squares += tl.sum(x * x, axis=0) / N
    rstd = tl.math.rsqrt(squares + eps + EPS_FLOOR)
    y = x * rstd
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * row_stride + cols, y, mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def _numpy_helper(x):
    return np.mean(x)


@triton.jit
def bad_helper_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    x = tl.load(X + tl.arange(0, BLOCK_SIZE))
    tl.store(Y + tl.arange(0, BLOCK_SIZE), x - _numpy_helper(x))


@triton.jit
def builtins_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    x = tl.load(X + tl.arange(0, BLOCK_SIZE))
    tl.core.builtins.print(x)


@triton.jit
def module_in_a_variable_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    core = tl.core
    x = tl.load(X + tl.arange(0, BLOCK_SIZE))
    tl.store(Y + tl.arange(0, BLOCK_SIZE), core.builtins.abs(x))


@triton.jit
def handle_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    x = tl.load(X + tl.arange(0, BLOCK_SIZE))
    tl.store(Y + tl.arange(0, BLOCK_SIZE), x - x.handle.data.mean())


@triton.jit
def getattr_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    x = tl.load(X + tl.arange(0, BLOCK_SIZE))
    name = "handle"
    tl.store(Y + tl.arange(0, BLOCK_SIZE), getattr(x, name))


@triton.jit
def dunder_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    x = tl.load(X + tl.arange(0, BLOCK_SIZE))
    tl.store(Y + tl.arange(0, BLOCK_SIZE), x.__class__)


@triton.jit
def no_triton_kernel(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    pass


class SpoofedKernel:
    """Says it is a kernel (isinstance agrees) and computes y with torch."""

    __class__ = type(correct_fwd)

    def __getitem__(self, grid):
        def launch(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE):
            m = grid[0]
            x = X[: m * row_stride].view(m, row_stride)[:, :N].double()
            rstd = (x.pow(2).mean(-1) + eps).rsqrt()
            Y[: m * row_stride].view(m, row_stride)[:, :N] = (
                x * rstd[:, None] * W[:N].double()).to(Y.dtype)
            Rstd[:m] = rstd.float()

        return launch


def _refusal(kernel, check=check_rms_forward_rows):
    with pytest.raises(CheckFailed) as info:
        check(kernel)
    assert "KernelRefused" in str(info.value) or "kernel itself" in str(info.value)
    return str(info.value)


def test_a_spoofed_kernel_object_is_refused():
    """isinstance(kernel, InterpretedFunction) would let any object through whose
    __class__ says so, and its __getitem__ runs plain torch."""
    assert isinstance(SpoofedKernel(), type(correct_fwd))
    assert "not SpoofedKernel" in _refusal(SpoofedKernel())
    assert "not SpoofedKernel" in _refusal(SpoofedKernel(), check_rms_backward_dx)


@pytest.mark.parametrize("kernel, words", [
    (numpy_stats_kernel, "`np` (the module numpy), which is not Triton"),
    (handle_kernel, "the attribute .handle leads out of Triton"),
    (torch_rms_norm_kernel, "`torch` (the module torch), which is not Triton"),
    (bad_helper_kernel, "in _numpy_helper, line"),
    (builtins_kernel, "tl.core.builtins is not Triton's own"),
    (module_in_a_variable_kernel, "tl.core is a module"),
    (getattr_kernel, "`getattr` is not an argument"),
    (dunder_kernel, "the attribute .__class__"),
    (no_triton_kernel, "calls no tl. operation"),
], ids=lambda v: getattr(v, "__name__", "")[:40])
def test_kernel_bodies_that_leave_triton_are_refused(kernel, words):
    """Under the interpreter a kernel body is plain Python: the first three would
    give the right numbers through numpy and torch."""
    message = _refusal(kernel)
    assert words in message, message
    assert "line" in message or "calls no" in message


def test_the_refusal_of_torch_names_the_line_and_the_rule():
    message = _refusal(torch_rms_norm_kernel)
    line = torch_rms_norm_kernel.fn.__code__.co_firstlineno + 6  # torch.rms_norm's line
    assert f"line {line}:" in message
    assert "tl.* (and triton.*) operations" in message


@pytest.mark.parametrize("kernel", [helper_kernel, unusual_kernel], ids=lambda k: k.__name__)
@pytest.mark.parametrize("check", FORWARD_CHECKS, ids=lambda c: c.__name__)
def test_unusual_but_right_kernels_pass(check, kernel, capsys):
    check(kernel)
    assert "cases passed" in capsys.readouterr().out


def test_a_replaced_triton_function_is_refused(monkeypatch):
    def sum_with_numpy(x, axis=None):
        return np.sum(x)

    monkeypatch.setattr(tl, "sum", sum_with_numpy)
    assert "tl.sum is not Triton's own" in _refusal(correct_fwd)


def test_a_rebound_tl_is_refused(monkeypatch):
    import types

    fake_tl = types.SimpleNamespace(**{n: getattr(tl, n) for n in dir(tl) if not n.startswith("_")})
    monkeypatch.setitem(correct_fwd.fn.__globals__, "tl", fake_tl)
    assert "`tl` (a SimpleNamespace), which is not Triton" in _refusal(correct_fwd)


def test_hooks_and_swapped_code_are_refused(monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction

    hooked = triton.jit(correct_fwd.fn)
    hooked.add_pre_run_hook(lambda *args, **kwargs: None)
    assert "pre-run hooks" in _refusal(hooked)
    swapped = triton.jit(correct_fwd.fn)
    monkeypatch.setattr(swapped, "rewriter", None, raising=False)
    assert "changed after @triton.jit" in _refusal(swapped)
    # a poisoned cache of rewritten functions is dropped: the source checked is what runs
    cached = triton.jit(correct_fwd.fn)
    InterpretedFunction.rewritten_fn[cached.fn] = lambda *args, **kwargs: None
    check_rms_forward_rows(cached)


def test_replaced_launch_machinery_is_refused(monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction

    def run_with_torch(self, *args, grid, warmup, **kwargs):
        return None

    monkeypatch.setattr(InterpretedFunction, "run", run_with_torch)
    assert "InterpretedFunction.run has been replaced" in _refusal(correct_fwd)


def test_a_kernel_without_source_is_refused():
    namespace = {"triton": triton, "tl": tl}
    exec("@triton.jit\ndef k(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: "
         "tl.constexpr):\n    tl.store(Y, tl.load(X))\n", namespace)
    assert "source code cannot be found" in _refusal(namespace["k"])


def test_compiled_kernels_are_checked_the_same_way(tmp_path):
    """Without the interpreter triton.jit gives a JITFunction: the exact type is
    required there too, its body is read the same way, and launch hooks are refused."""
    script = tmp_path / "compiled.py"
    script.write_text('''
import triton, triton.language as tl, torch
from normref.checks import kernels_probes as P

@triton.jit
def good(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    cols = tl.arange(0, BLOCK_SIZE)
    tl.store(Y + cols, tl.load(X + cols, mask=cols < N, other=0.0), mask=cols < N)

@triton.jit
def bad(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    tl.store(Y, torch.rms_norm(X, (N,)))

class Fake:
    __class__ = triton.runtime.jit.JITFunction

def outcome(kernel):
    try:
        return P.verify_kernel_object(kernel)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"

print(type(good).__name__)
print(outcome(good).split(":")[0])
print(outcome(bad))
print(outcome(Fake()))
triton.knobs.runtime.launch_enter_hook.add(lambda *args: None)
print(outcome(good))
triton.knobs.runtime.launch_enter_hook.calls.clear()
good.run = lambda *args, **kwargs: None
print(outcome(good))
''')
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    lines = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=env, timeout=300, check=True).stdout.splitlines()
    assert lines[0] == "JITFunction"
    assert lines[1] in ("cuda", "RuntimeError")  # passes the checks; a GPU or the hint
    assert "`torch` (the module torch), which is not Triton" in lines[2]
    assert "not Fake" in lines[3]
    assert "launch_enter_hook is set" in lines[4]
    assert "changed after @triton.jit made it (run)" in lines[5]


def test_kernel_object_check_accepts_the_examples_right_and_wrong():
    """The checks on the object refuse nothing a real attempt writes: all the
    kernels of this file that are honest Triton pass it."""
    for kernel in (correct_fwd, unmasked_load_fwd, block_divisor_fwd, half_sums_fwd,
                   centred_fwd, stride_ignored_fwd, rms_saved_fwd, helper_kernel,
                   correct_bwd, _dealt_kernel(), _bwd_variant(acc_line="dw_sum = dy * x_hat")):
        assert kernels_probes.verify_kernel_object(kernel) in ("cpu", "cuda")


# -- the sample class and the solution keep their scores ------------------------------------

EXAMPLES_07 = os.path.join(os.path.dirname(__file__), "..", "..", "autograder", "examples",
                           "07_fused_kernel")
SOURCE_07 = os.path.join(os.path.dirname(__file__), "..", "..", "source", "07_fused_kernel",
                         "07_fused_kernel.ipynb")
# grade cell -> (check, the name the notebook gives its answer)
CELL_CHECKS = {
    "rms_forward_rows": (check_rms_forward_rows, "rms_norm_fwd_kernel"),
    "rms_forward_ragged_rows": (check_rms_forward_ragged_rows, "rms_norm_fwd_kernel"),
    "rms_forward_saves_rstd": (check_rms_forward_rstd, "rms_norm_fwd_kernel"),
    "rms_forward_half_precision": (check_rms_forward_half_precision, "rms_norm_fwd_kernel"),
    "rms_backward_dx": (check_rms_backward_dx, "rms_norm_bwd_kernel"),
    "rms_backward_partial_dw": (check_rms_backward_partial_dw, "rms_norm_bwd_kernel"),
    "rms_autograd_function": (check_rms_autograd_function, "RMSNormFunction"),
    "llama_bytes": (check_llama_bytes, "llama_eager_bytes"),
    "backward_bytes": (check_backward_bytes, "backward_bytes"),
    "fused_fraction_of_peak": (check_fused_fraction_of_peak, "fused_fraction_of_peak"),
    "eager_time_prediction": (check_eager_time_prediction, "predicted_eager_ms"),
}
ANSWER_CELLS = ("rms_forward_answer", "launcher", "rms_backward_answer",
                "rms_function_answer", "llama_bytes_answer", "backward_bytes_answer",
                "quoted_timings_answer")


def _notebook_answers(path):
    """The notebook's answer cells (and the launchers they call) run in one
    namespace, their source kept where inspect finds it (IPython keeps a cell's
    source in linecache the same way).
    An answer cell that raises leaves its names undefined, as in a notebook."""
    import json
    import linecache

    cells = json.load(open(path))["cells"]
    namespace = {"triton": triton, "tl": tl, "torch": torch, "F": F, "os": os,
                 "DEVICE": "cuda" if torch.cuda.is_available() else "cpu"}
    for cell in cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid not in ANSWER_CELLS:
            continue
        source = "".join(cell["source"])
        name = f"<ipython-input-{os.path.basename(path)}-{gid}>"
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        try:
            exec(compile(source, name, "exec"), namespace)
        except NotImplementedError:
            pass
    return namespace, cells


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("student", ["ada_perfect", "ben_unusual", "kim_unusual_correct",
                                     "pat_tiled_rows", "quin_scaled_two_pass",
                                     "cy_missing_mask_serial_dw", "dee_wrong_dw_reduction",
                                     "eve_rstd_not_saved_no_row_clamp",
                                     "tom_time_slips_layer_norm_dx",
                                     "hal_half_sums_fwd_and_dw", "gus_blank",
                                     "uma_dy_view_rstd_without_eps",
                                     "vic_rstd_recomputed_dw_per_row",
                                     "solution"])
def test_the_examples_and_the_solution_keep_their_scores(student, capsys):
    """The hidden checks alone (the grader adds the visible asserts and the sandbox)."""
    import json

    if student == "solution":
        namespace, cells = _notebook_answers(SOURCE_07)
        expected = {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"]["points"]
                    for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")}
    else:
        namespace, _ = _notebook_answers(os.path.join(EXAMPLES_07, f"{student}.ipynb"))
        expected = json.load(open(os.path.join(EXAMPLES_07, "expected.json")))[student]
    scores = {}
    for cell, (check, name) in CELL_CHECKS.items():
        try:
            check(namespace.get(name))
            scores[cell] = expected[cell] if expected[cell] else "passed"
        except CheckFailed as failure:
            assert "KernelRefused" not in str(failure) or student == "gus_blank", failure
            scores[cell] = 0
    assert scores == expected
