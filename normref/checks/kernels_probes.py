"""Unit 07 checks, the student-facing half: launching the student's Triton kernel.

The contract: the student passes the @triton.jit kernel itself,

    layer_norm_fwd_kernel(X, Y, W, B, Mean, Rstd, row_stride, N, eps, BLOCK_SIZE)

and the probe launches it with one program per row. Its memory is laid out
to make mistakes visible and harmless: rows sit `row_stride` >= BLOCK_SIZE
elements apart; the lanes of x, w and b past N hold NaN, so a kernel that
loads them gets NaN; the outputs (y, its padding, Mean, Rstd) start as
UNWRITTEN, so what was never stored and what was stored past N both show; and
every buffer has room for BLOCK_SIZE lanes of every row, so no kernel can
touch memory outside it (which can crash the interpreter).
"""

import numpy as np

from normref.checks._runner import run_check

UNWRITTEN = -1024.0  # exact in float16, bfloat16 and float32; no case's output is near it
KERNEL_SIGNATURE = "layer_norm_fwd_kernel(X, Y, W, B, Mean, Rstd, row_stride, N, eps, BLOCK_SIZE)"


def _device_for(kernel):
    """CPU tensors for the interpreter, CUDA tensors for a compiled kernel."""
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    if not hasattr(kernel, "__getitem__"):
        raise TypeError(f"pass the @triton.jit kernel itself ({KERNEL_SIGNATURE}), "
                        f"not {type(kernel).__name__}")
    if isinstance(kernel, InterpretedFunction):
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    raise RuntimeError("your kernel was compiled for a GPU and there is none: set "
                       "os.environ['TRITON_INTERPRET'] = '1' before importing triton "
                       "(restart the kernel and run the cells from the top)")


def _padded(values, width, length, dtype, device):
    """A NaN buffer of `length` elements holding `values` (rows, N) at rows `width` apart."""
    import torch

    buffer = torch.full((length,), float("nan"), dtype=dtype, device=device)
    rows = values.reshape(-1, values.shape[-1])
    grid = buffer[: rows.shape[0] * width].view(rows.shape[0], width)
    grid[:, : rows.shape[1]] = rows.to(dtype)
    return buffer


def _launch_layer_norm_kernel(kernel, case):
    import torch

    device = _device_for(kernel)
    dtype = getattr(torch, str(case["dtype"]))
    x = torch.from_numpy(np.asarray(case["x"], dtype=np.float32)).to(device)  # M, N
    m, n = x.shape
    block = 1 << (n - 1).bit_length()  # next power of two >= n
    stride = block + int(case["pad"])
    size = m * stride + block  # spare room past the last row
    x_buffer = _padded(x, stride, size, dtype, device)
    y_buffer = torch.full((size,), UNWRITTEN, dtype=dtype, device=device)
    params = [_padded(torch.from_numpy(np.asarray(case[k], dtype=np.float32)).to(device),
                      block, block, dtype, device) for k in ("gamma", "beta")]
    mean = torch.full((m + block,), UNWRITTEN, dtype=torch.float32, device=device)
    rstd = torch.full((m + block,), UNWRITTEN, dtype=torch.float32, device=device)
    kernel[(m,)](x_buffer, y_buffer, params[0], params[1], mean, rstd,
                 stride, n, float(case["eps"]), BLOCK_SIZE=block)
    rows = y_buffer[: m * stride].view(m, stride)
    padding = rows[:, n:block]
    return {
        "y": rows[:, :n].float(),
        "mean": mean[:m],
        "rstd": rstd[:m],
        "padding_written": np.array(int((padding != UNWRITTEN).sum())),
    }


def check_kernel_rows(layer_norm_fwd_kernel):
    """Check the kernel's y on float32 rows whose N is a power of two."""
    run_check("kernel_ln_rows", layer_norm_fwd_kernel, _launch_layer_norm_kernel)


def check_kernel_ragged_rows(layer_norm_fwd_kernel):
    """Check the kernel's y on rows whose N is not a power of two (masked lanes)."""
    run_check("kernel_ln_ragged", layer_norm_fwd_kernel, _launch_layer_norm_kernel)


def check_kernel_statistics(layer_norm_fwd_kernel):
    """Check the mean and rstd the kernel saves for the backward pass."""
    run_check("kernel_ln_statistics", layer_norm_fwd_kernel, _launch_layer_norm_kernel)


def check_kernel_half_precision(layer_norm_fwd_kernel):
    """Check the kernel on float16 and bfloat16 rows."""
    run_check("kernel_ln_half", layer_norm_fwd_kernel, _launch_layer_norm_kernel)
