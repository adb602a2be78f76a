"""Unit 07: launching the fused kernels, autograd, and the public wrappers.

    layer_norm(x, weight=None, bias=None, eps=1e-5)   # differentiable
    rms_norm(x, weight=None, eps=1e-5)                # differentiable

x: (..., N) float32, float16 or bfloat16 -> y: (..., N), same dtype.
CUDA tensors run the compiled kernels; CPU tensors run in Triton's
interpreter, which must be switched on (TRITON_INTERPRET=1) before triton
and this module are imported. A row is held in one block, so N is limited
to MAX_FUSED_BYTES // element size (16384 for float32, 32768 for float16).
"""

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from normref.kernels import triton_kernels as K

MAX_FUSED_BYTES = 65536  # one row in one block, as in Triton's layer-norm tutorial
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INTERPRETER_HINT = (
    "CPU tensors run in Triton's interpreter, and it is off. Set it before importing "
    "triton and normref.kernels, for example at the top of the notebook or script:\n"
    "    import os; os.environ['TRITON_INTERPRET'] = '1'\n"
    "(in a notebook that already imported them, restart the kernel first)."
)


def interpreter_on():
    """True when the kernels were defined under TRITON_INTERPRET=1."""
    return isinstance(K.layer_norm_fwd_kernel, InterpretedFunction)


def max_features(dtype):
    """The largest N one block can hold for `dtype`."""
    return MAX_FUSED_BYTES // torch.empty((), dtype=dtype).element_size()


def block_size_for(n):
    """Lanes per program: the next power of two >= n."""
    return triton.next_power_of_2(n)


def num_warps_for(block_size, element_size):
    """Warps per row: about 32 bytes of the row per thread (two 16-byte loads).

    Fewer threads than that leave each with many registers of x and fewer
    rows in flight per SM; more make the cross-warp reduction the cost. The
    bounds are 1 warp (small rows) and 16: 512 threads, so that the widest
    row (64 KB) costs each thread 32 float32 registers for x in float32 and
    64 in float16 (compiled for sm_90: 64 and 127 registers in all, no spills).
    """
    threads = block_size * element_size // 32
    return max(1, min(16, triton.next_power_of_2(max(threads // 32, 1))))


def _check(x, weight, bias):
    """Validate the inputs; return N. Raises with a message that says what to change."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, not {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x is {x.dtype}; the fused kernels take float32, float16 or bfloat16")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x of shape {tuple(x.shape)} has no features to normalize")
    n = x.shape[-1]
    largest = max_features(x.dtype)
    if n > largest:
        raise ValueError(
            f"N = {n} features do not fit in one block: this kernel keeps a whole row in "
            f"registers, which allows at most {MAX_FUSED_BYTES} bytes, i.e. N <= {largest} "
            f"for {x.dtype}. Larger rows need a kernel that loops over the row in chunks."
        )
    for name, param in (("weight", weight), ("bias", bias)):
        if param is None:
            continue
        if tuple(param.shape) != (n,):
            raise ValueError(f"{name} has shape {tuple(param.shape)}; expected ({n},)")
        if param.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} is {param.dtype}; expected float32, float16 or bfloat16")
        if param.device != x.device:
            raise ValueError(f"{name} is on {param.device} but x is on {x.device}")
    if x.device.type == "cpu" and not interpreter_on():
        raise RuntimeError(INTERPRETER_HINT)
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"x is on {x.device}; the kernels run on CUDA, or on the CPU "
                         "in the interpreter")
    return n


def _as_rows(x, n):
    """(..., N) -> (M, N) view or copy whose rows are unit-stride."""
    rows = x.reshape(-1, n)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _param(param, n, fill, like):
    return param if param is not None else torch.full((n,), fill, dtype=like.dtype,
                                                      device=like.device)


def backward_num_warps(block_size):
    """The backward holds x, dy, w and two running sums: more threads for wide rows."""
    return 32 if block_size >= 16384 else num_warps_for(block_size, 4)


def layer_norm_forward(x2d, weight, bias, eps, num_warps=None):
    """Launch the forward kernel on (M, N) rows; returns y (M, N), mean, rstd (M,).

    num_warps overrides the heuristic (for tuning experiments).
    """
    m, n = x2d.shape
    y = torch.empty((m, n), dtype=x2d.dtype, device=x2d.device)
    mean = torch.empty(m, dtype=torch.float32, device=x2d.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x2d.device)
    if m == 0:
        return y, mean, rstd
    block = block_size_for(n)
    K.layer_norm_fwd_kernel[(m,)](
        x2d, y, weight, bias, mean, rstd, x2d.stride(0), y.stride(0), n, eps,
        BLOCK_SIZE=block, num_warps=num_warps or num_warps_for(block, x2d.element_size()),
    )
    return y, mean, rstd


def rms_norm_forward(x2d, weight, eps):
    """Launch the RMSNorm kernel on (M, N) rows; returns y (M, N), rstd (M,)."""
    m, n = x2d.shape
    y = torch.empty((m, n), dtype=x2d.dtype, device=x2d.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x2d.device)
    if m == 0:
        return y, rstd
    block = block_size_for(n)
    K.rms_norm_fwd_kernel[(m,)](
        x2d, y, weight, rstd, x2d.stride(0), y.stride(0), n, eps,
        BLOCK_SIZE=block, num_warps=num_warps_for(block, x2d.element_size()),
    )
    return y, rstd


def _partial_groups(m, device):
    """How many programs share the backward's rows: a few per SM on a GPU."""
    if device.type == "cuda":
        programs = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        programs = 8  # the interpreter runs programs one after another anyway
    return max(1, min(m, programs))


def layer_norm_backward(dy2d, x2d, weight, mean, rstd):
    """dx (M, N) in x's dtype; dweight, dbias (N,) in weight's dtype."""
    m, n = x2d.shape
    dx = torch.empty((m, n), dtype=x2d.dtype, device=x2d.device)
    dw = torch.empty(n, dtype=weight.dtype, device=x2d.device)
    db = torch.empty(n, dtype=weight.dtype, device=x2d.device)
    if m == 0:
        return dx, dw.zero_(), db.zero_()
    rows_per_program = triton.cdiv(m, _partial_groups(m, x2d.device))
    groups = triton.cdiv(m, rows_per_program)
    partial_dw = torch.empty((groups, n), dtype=torch.float32, device=x2d.device)
    partial_db = torch.empty((groups, n), dtype=torch.float32, device=x2d.device)
    block = block_size_for(n)
    K.layer_norm_bwd_dx_kernel[(groups,)](
        dx, dy2d, x2d, weight, mean, rstd, partial_dw, partial_db,
        x2d.stride(0), dy2d.stride(0), dx.stride(0), m, n, rows_per_program,
        BLOCK_SIZE=block, num_warps=backward_num_warps(block), num_stages=1,
    )
    block_cols = 128
    K.sum_partials_kernel[(triton.cdiv(n, block_cols),)](
        partial_dw, partial_db, dw, db, groups, n,
        BLOCK_GROUPS=32, BLOCK_COLS=block_cols, num_warps=4,
    )
    return dx, dw, db


class LayerNormFunction(torch.autograd.Function):
    """Fused layer norm over the last axis, with the fused backward.

    apply(x, weight, bias, eps); weight and bias may be None (1 and 0), and
    then get no gradient.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        n = x.shape[-1]
        w = _param(weight, n, 1.0, x)
        b = _param(bias, n, 0.0, x)
        x2d = _as_rows(x, n)
        y, mean, rstd = layer_norm_forward(x2d, w, b, eps)
        ctx.save_for_backward(x2d, w, mean, rstd)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2d, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(_as_rows(dy, x2d.shape[1]), x2d, w, mean, rstd)
        dweight = dw if ctx.needs_input_grad[1] else None
        dbias = db.to(ctx.bias_dtype) if ctx.needs_input_grad[2] else None
        return dx.reshape(dy.shape), dweight, dbias, None


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Fused layer norm over the last axis, like F.layer_norm(x, (N,), weight, bias, eps).

    x: (..., N); weight, bias: (N,) or None (meaning 1 and 0) -> (..., N)
    """
    _check(x, weight, bias)
    return LayerNormFunction.apply(x, weight, bias, float(eps))


def rms_norm_backward(dy2d, x2d, weight, rstd):
    """dx (M, N) in x's dtype; dweight (N,) in weight's dtype.

    Each program writes one float32 row of partial sums of dy * x_hat; adding
    those rows (groups x N numbers) is left to torch, as Liger-Kernel does.
    """
    m, n = x2d.shape
    dx = torch.empty((m, n), dtype=x2d.dtype, device=x2d.device)
    if m == 0:
        return dx, torch.zeros(n, dtype=weight.dtype, device=x2d.device)
    rows_per_program = triton.cdiv(m, _partial_groups(m, x2d.device))
    groups = triton.cdiv(m, rows_per_program)
    partial_dw = torch.empty((groups, n), dtype=torch.float32, device=x2d.device)
    block = block_size_for(n)
    K.rms_norm_bwd_kernel[(groups,)](
        dx, dy2d, x2d, weight, rstd, partial_dw,
        x2d.stride(0), dy2d.stride(0), dx.stride(0), m, n, rows_per_program,
        BLOCK_SIZE=block, num_warps=backward_num_warps(block), num_stages=1,
    )
    return dx, partial_dw.sum(0).to(weight.dtype)


class RMSNormFunction(torch.autograd.Function):
    """Fused RMSNorm over the last axis, with the fused backward.

    apply(x, weight, eps); weight may be None (1), and then gets no gradient.
    """

    @staticmethod
    def forward(ctx, x, weight, eps):
        n = x.shape[-1]
        w = _param(weight, n, 1.0, x)
        x2d = _as_rows(x, n)
        y, rstd = rms_norm_forward(x2d, w, eps)
        ctx.save_for_backward(x2d, w, rstd)
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2d, w, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(_as_rows(dy, x2d.shape[1]), x2d, w, rstd)
        return dx.reshape(dy.shape), dw if ctx.needs_input_grad[1] else None, None


def rms_norm(x, weight=None, eps=1e-5):
    """Fused RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * weight.

    Note that F.rms_norm's default eps is the dtype's machine epsilon, not
    1e-5: pass eps to both when comparing.
    x: (..., N); weight: (N,) or None -> (..., N)
    """
    _check(x, weight, None)
    return RMSNormFunction.apply(x, weight, float(eps))
