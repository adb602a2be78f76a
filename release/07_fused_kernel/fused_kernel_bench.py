"""The GPU benchmark of unit 07, shared by its lesson and its assignment.

Each notebook says what it times: a function of the input rows `x` and the
vectors `w` and `b` that returns {method name: a call with no arguments}, or
{method name: (the call, the bytes it is charged)} for a method that is not
charged a forward's 2 * M * N * bytes (a backward pass, say). `sweep` times
every method for each dtype and row length with the timer it is given
(`time_on_gpu` on a GPU); `benchmark_rows` turns the times into GB/s = bytes
charged / time, and that as a fraction of a copy's GB/s and of the GPU's peak
memory bandwidth; `show_benchmark` prints the table.
"""

import torch

ELEMENT_SIZE = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes a number
# Peak memory bandwidth, bytes a second, from NVIDIA's datasheets, keyed by
# the end of the name torch.cuda.get_device_name gives
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100 80GB HBM3": 3.35e12,
                  "A100-SXM4-80GB": 2.039e12, "A100-SXM4-40GB": 1.555e12,
                  "L4": 300e9, "T4": 320e9}
ROWS = 4096
FEATURES = (1024, 4096, 16384)
DTYPES = ("float16", "bfloat16", "float32")


def peak_bandwidth(device_name):
    """The datasheet's peak for this GPU in bytes a second, None if unknown."""
    for name, peak in PEAK_BANDWIDTH.items():
        if device_name.endswith(name):
            return peak
    return None


def time_on_gpu(fn):
    """Median seconds of fn() (do_bench flushes the cache before each run)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def sweep(methods_for, timer, device="cuda", rows=ROWS, features=FEATURES,
          dtypes=DTYPES, charged=None):
    """{(dtype, N): {method: seconds}}, each time from timer(fn) for each
    method of methods_for(x, w, b); a method that fails (a kernel of yours,
    bfloat16 on an old GPU) is reported and left out. A method given as
    (fn, bytes) has its bytes put in `charged`, {(dtype, N): {method: bytes}},
    when a dict is passed."""
    results = {}
    for dtype in dtypes:
        for n in features:
            gen = torch.Generator(device).manual_seed(n)
            x = torch.randn(rows, n, generator=gen, device=device,
                            dtype=getattr(torch, dtype))
            w = torch.rand(n, generator=gen, device=device).to(x.dtype) + 0.5
            b = torch.rand(n, generator=gen, device=device).to(x.dtype) - 0.5
            times = results.setdefault((dtype, n), {})
            for method, fn in methods_for(x, w, b).items():
                if isinstance(fn, tuple):  # (the call, the bytes it moves)
                    fn, moved = fn
                    if charged is not None:
                        charged.setdefault((dtype, n), {})[method] = moved
                try:
                    times[method] = timer(fn)
                except Exception as error:  # report it and go on
                    print(f"{dtype} N={n} {method}: "
                          f"{type(error).__name__}: {error}")
    return results


def benchmark_rows(results, peak, rows=ROWS, charged=None):
    """One row per (dtype, N, method): microseconds, GB/s = bytes charged /
    time (2 M N bytes unless `charged`, as sweep fills it, says otherwise),
    and that as a fraction of the copy's GB/s and of the peak (or None)."""
    table = []
    for (dtype, n), times in results.items():
        forward = 2 * rows * n * ELEMENT_SIZE[dtype]
        moved = {method: forward for method in times}
        moved.update((charged or {}).get((dtype, n), {}))
        copy_rate = (moved["copy"] / times["copy"] if "copy" in times
                     else None)
        for method, seconds in times.items():
            rate = moved[method] / seconds  # bytes a second
            table.append({
                "dtype": dtype, "N": n, "method": method,
                "us": seconds * 1e6, "GB/s": rate / 1e9,
                "of copy": rate / copy_rate if copy_rate else None,
                "of peak": rate / peak if peak else None})
    return table


def show_benchmark(table):
    """Print the table, one line per row of benchmark_rows."""
    print(f"{'dtype':9s}{'N':>6s}  {'method':13s}{'time us':>9s}"
          f"{'GB/s':>8s}{'of copy':>9s}{'of peak':>9s}")
    for row in table:
        shares = "".join(f"{row[k]:9.2f}" if row[k] is not None
                         else f"{'-':>9s}" for k in ("of copy", "of peak"))
        print(f"{row['dtype']:9s}{row['N']:6d}  {row['method']:13s}"
              f"{row['us']:9.1f}{row['GB/s']:8.0f}{shares}")


def run(methods_for, device_name):
    """Time methods_for's methods on this GPU, print the table, return it."""
    peak = peak_bandwidth(device_name)
    print(device_name, f"peak {peak / 1e9:,.0f} GB/s (datasheet)" if peak else
          "(no datasheet peak listed: the 'of peak' column shows -)")
    charged = {}  # the bytes of the methods not charged a forward's
    times = sweep(methods_for, time_on_gpu, charged=charged)
    table = benchmark_rows(times, peak, charged=charged)
    show_benchmark(table)
    return table
