"""Unit 07, the fused kernels themselves: Triton code only, no launching logic.

Every kernel works on a 2-D view (M rows = tokens, N features) whose rows
may sit `row_stride` elements apart in memory. A forward program owns one
row and holds all of it in registers, in a block of BLOCK_SIZE lanes
(the next power of two >= N); lanes at or past N are masked off on every
load and store and zeroed before every sum, so they never count. All
arithmetic is float32, whatever the input's dtype; results are rounded to
the output's dtype only when they are stored.

Whether these run compiled (CUDA tensors) or in Triton's CPU interpreter is
decided when this module is imported: TRITON_INTERPRET=1 must be set before
that for the interpreter.
"""

import triton
import triton.language as tl


@triton.jit
def layer_norm_fwd_kernel(
    X, Y, W, B, Mean, Rstd,  # pointers: X, Y (M, N); W, B (N,); Mean, Rstd (M,) float32
    x_row_stride, y_row_stride, N, eps,
    BLOCK_SIZE: tl.constexpr,
):
    """y = (x - mean) * rstd * w + b for one row; stores mean and rstd too."""
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride may pass 2**31
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    # x is read exactly once and kept in registers: tell the cache not to
    # keep it, and to keep w and b, which every row reads again.
    x = tl.load(X + row * x_row_stride + cols, mask=mask, other=0.0,
                eviction_policy="evict_first").to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    # Masked lanes hold 0, so x - mean there is -mean: zero them before squaring.
    x_centred = tl.where(mask, x - mean, 0.0)
    var = tl.sum(x_centred * x_centred, axis=0) / N
    rstd = tl.rsqrt(var + eps)
    w = tl.load(W + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    y = x_centred * rstd * w + b
    tl.store(Y + row * y_row_stride + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)


@triton.jit
def rms_norm_fwd_kernel(
    X, Y, W, Rstd,  # pointers: X, Y (M, N); W (N,); Rstd (M,) float32
    x_row_stride, y_row_stride, N, eps,
    BLOCK_SIZE: tl.constexpr,
):
    """y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps), for one row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * x_row_stride + cols, mask=mask, other=0.0,
                eviction_policy="evict_first").to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)  # masked lanes are 0 and add 0
    w = tl.load(W + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(Y + row * y_row_stride + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def layer_norm_bwd_dx_kernel(
    DX, DY, X, W, Mean, Rstd,  # pointers: DX, DY, X (M, N); W (N,); Mean, Rstd (M,)
    PartialDW, PartialDB,  # pointers: (groups, N) float32, one row per program
    x_row_stride, dy_row_stride, dx_row_stride, M, N, rows_per_program,
    BLOCK_SIZE: tl.constexpr,
):
    """dx for a run of consecutive rows, and that run's share of dgamma and dbeta.

    With g = dy * w and x_hat = (x - mean) * rstd:
    dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)). The program adds
    dy * x_hat and dy over its rows in float32 registers and writes the two
    sums once, so no two programs ever write the same address (no atomics,
    no locks, and the result does not depend on scheduling order).
    """
    group = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw_sum = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    db_sum = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    first_row = group.to(tl.int64) * rows_per_program  # int64 offsets, as in the forward
    last_row = tl.minimum(first_row + rows_per_program, M)
    for row in range(first_row, last_row):
        x = tl.load(X + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + row)
        rstd = tl.load(Rstd + row)
        x_hat = tl.where(mask, (x - mean) * rstd, 0.0)
        g = dy * w  # zero on masked lanes, because dy and w are
        mean_g = tl.sum(g, axis=0) / N
        mean_g_xhat = tl.sum(g * x_hat, axis=0) / N
        dx = rstd * (g - mean_g - x_hat * mean_g_xhat)
        tl.store(DX + row * dx_row_stride + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw_sum += dy * x_hat
        db_sum += dy
    tl.store(PartialDW + group.to(tl.int64) * N + cols, dw_sum, mask=mask)
    tl.store(PartialDB + group.to(tl.int64) * N + cols, db_sum, mask=mask)


@triton.jit
def sum_partials_kernel(
    PartialDW, PartialDB, DW, DB,  # pointers: partials (groups, N) float32; DW, DB (N,)
    groups, N,
    BLOCK_GROUPS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):
    """Second stage of the dgamma / dbeta reduction: add the partials' rows."""
    cols = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_mask = cols < N
    dw = tl.zeros([BLOCK_GROUPS, BLOCK_COLS], dtype=tl.float32)
    db = tl.zeros([BLOCK_GROUPS, BLOCK_COLS], dtype=tl.float32)
    for start in range(0, groups, BLOCK_GROUPS):
        rows = start + tl.arange(0, BLOCK_GROUPS)
        offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
        mask = (rows[:, None] < groups) & col_mask[None, :]
        dw += tl.load(PartialDW + offsets, mask=mask, other=0.0)
        db += tl.load(PartialDB + offsets, mask=mask, other=0.0)
    tl.store(DW + cols, tl.sum(dw, axis=0).to(DW.dtype.element_ty), mask=col_mask)
    tl.store(DB + cols, tl.sum(db, axis=0).to(DB.dtype.element_ty), mask=col_mask)


@triton.jit
def rms_norm_bwd_kernel(
    DX, DY, X, W, Rstd,  # pointers: DX, DY, X (M, N); W (N,); Rstd (M,) float32
    PartialDW,  # pointer: (groups, N) float32, one row per program
    x_row_stride, dy_row_stride, dx_row_stride, M, N, rows_per_program,
    BLOCK_SIZE: tl.constexpr,
):
    """dx for a run of consecutive rows, and that run's share of dw.

    With g = dy * w and x_hat = x * rstd: dx = rstd * (g - x_hat * mean(g * x_hat))
    (x moves rstd too: that is the second term). The program adds dy * x_hat over
    its rows in float32 registers and writes the sum once, as in the layer-norm
    backward above; the launcher adds the programs' rows.
    """
    group = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw_sum = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    first_row = group.to(tl.int64) * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, M)
    for row in range(first_row, last_row):
        x = tl.load(X + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + row)
        x_hat = x * rstd  # zero on masked lanes, because x is
        g = dy * w
        mean_g_xhat = tl.sum(g * x_hat, axis=0) / N
        dx = rstd * (g - x_hat * mean_g_xhat)
        tl.store(DX + row * dx_row_stride + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw_sum += dy * x_hat
    tl.store(PartialDW + group.to(tl.int64) * N + cols, dw_sum, mask=mask)
