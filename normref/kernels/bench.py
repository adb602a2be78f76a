"""Benchmark and correctness run for the fused kernels (unit 07).

    python -m normref.kernels.bench            # full run
    python -m normref.kernels.bench --quick    # a short one
    python -m normref.kernels.bench --tune     # the full run, then num_warps tried

On a CUDA GPU: a correctness run of the compiled kernels against torch, then
the forward table for M = 4096 rows, N = 512 ... 16384, float16 / bfloat16 /
float32: naive eager layer norm, F.layer_norm, the Triton layer norm,
F.rms_norm and the Triton RMSNorm, each in GB/s = 2 * M * N * bytes / time
and as a fraction of a device-to-device copy of the same tensor timed in the
same run (triton.testing.do_bench: median, L2 flushed before every call);
then the backward at the two points Triton's tutorial publishes.

Without a GPU: the same memory story on the CPU (numpy, naive torch and
F.layer_norm against a measured CPU copy, timed with time.perf_counter),
then the kernels' correctness run in Triton's interpreter.

Every measurement is guarded: one that fails is reported in its cell and in
the list of failures at the end, and the run goes on. The exit status is 1
when a correctness check failed or a measurement raised, else 0.
"""

import argparse
import math
import os
import statistics
import sys
import time
import traceback

GPU_ROWS = 4096
GPU_FEATURES = (512, 1024, 2048, 4096, 8192, 16384)
GPU_FEATURES_QUICK = (1024, 4096, 16384)
TARGET_FRACTION_OF_COPY = 0.90  # for N >= 4096, on an H200
TUTORIAL_BACKWARD_GBPS = {  # Triton's layer-norm tutorial, backward, float16, M = 4096
    1024: {"triton": 124, "torch": 378},
    8192: {"triton": 969, "torch": 549},
}
CPU_ELEMENTS = 1 << 22  # M * N of every CPU case: 16 MiB of float32, past most L2 caches
CPU_FEATURES = (256, 1024, 4096)
CPU_FEATURES_QUICK = (1024,)
EPS = 1e-5


def naive_layer_norm(x, weight, bias, eps=EPS):
    """Layer norm as eager PyTorch code: nine kernels, each a pass over memory."""
    mean = x.mean(-1, keepdim=True)
    centred = x - mean
    var = (centred**2).mean(-1, keepdim=True)
    rstd = (var + eps).rsqrt()
    return centred * rstd * weight + bias


def numpy_layer_norm(x, weight, bias, eps=EPS):
    import numpy as np

    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(-1, keepdims=True)
    return centred / np.sqrt(var + eps) * weight + bias


class Failures:
    """Collects what went wrong, so that one failure never stops the run."""

    def __init__(self):
        self.items = []

    def guard(self, label, fn, default=None):
        try:
            return fn()
        except Exception as exc:  # report and carry on: the run must finish
            self.items.append(f"{label}: {type(exc).__name__}: {exc}".splitlines()[0][:300])
            if os.environ.get("NORMREF_BENCH_TRACEBACK"):
                traceback.print_exc()
            return default


def _gbps(bytes_moved, seconds):
    return bytes_moved / seconds / 1e9 if seconds and seconds > 0 else float("nan")


def _fmt(value, width=7, digits=0):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-".rjust(width)
    return f"{value:{width}.{digits}f}"


def perf_counter_timer(fn, repeats=5):
    """Median wall time of fn() in seconds, after one warm-up call (CPU)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def do_bench_timer(fn):
    """Median GPU time of fn() in seconds (triton.testing.do_bench, L2 flushed).

    The student module source/07_fused_kernel/fused_kernel_bench.py has the same
    timer (time_on_gpu). Neither can import the other: the release ships that
    module without normref, and normref is installed without the course's
    source/ folder. tests/normref/test_fused_kernel_benchmark.py checks that the
    two ask do_bench the same and convert alike."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


# -- correctness ---------------------------------------------------------------------------

# A result passes when its error against float64 is at most twice torch's own error in the
# same dtype, plus a floor for the rounding of the output itself. Float32 sums of a row
# that sits far from zero round at the scale of its offset (the fused kernel's plain
# two-pass statistics, like the tutorial's; torch's Welford does a little better), so the
# floor grows with offset / std.
ERROR_FLOOR = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}


def correctness_cases(quick):
    import torch

    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    shapes = [(1, 37), (3, 100), (2, 5, 64), (4, 1000)] if quick else \
        [(1, 1), (1, 37), (3, 100), (2, 5, 64), (4, 1000), (7, 3000), (2, 4096)]
    return [(dtype, shape, offset) for dtype in dtypes for shape in shapes
            for offset in (0.0, 1000.0 if dtype == torch.float32 else 100.0)]


def _layer_norm_and_grads(forward, x, w, b, dy):
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    y = forward(*leaves)
    y.backward(dy)
    return [y.detach()] + [leaf.grad for leaf in leaves]


def check_one(ops, dtype, shape, offset, device):
    """Errors of the fused forward, dx, dweight, dbias and RMSNorm against float64.

    Returns (passed, text); each error must be within twice torch's own error
    in the same dtype plus ERROR_FLOOR.
    """
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(shape[-1] * 7 + len(shape))
    n, std = shape[-1], 2.0
    x = (torch.randn(shape, generator=gen) * std + offset).to(dtype).to(device)
    w = (torch.randn(n, generator=gen) * 0.5 + 1).to(dtype).to(device)
    b = (torch.randn(n, generator=gen) * 0.5).to(dtype).to(device)
    dy = torch.randn(shape, generator=gen).to(dtype).to(device)

    def torch_ln(x, w, b):
        return F.layer_norm(x, (n,), w, b, EPS)

    ours = _layer_norm_and_grads(lambda x, w, b: ops.layer_norm(x, w, b, EPS), x, w, b, dy)
    theirs = _layer_norm_and_grads(torch_ln, x, w, b, dy)
    exact = _layer_norm_and_grads(torch_ln, x.double(), w.double(), b.double(), dy.double())
    with torch.no_grad():
        ours.append(ops.rms_norm(x, w, EPS))
        theirs.append(F.rms_norm(x, (n,), w, EPS))
        exact.append(F.rms_norm(x.double(), (n,), w.double(), EPS))
    floor = ERROR_FLOOR[str(dtype).replace("torch.", "")] * (1 + abs(offset) / std)
    passed, parts = True, []
    for name, a, t, e in zip(("y", "dx", "dw", "db", "rms"), ours, theirs, exact):
        # dw and db are sums over rows: their rounding grows with the sum's size
        scale = e.abs().max().item() if name in ("dw", "db") else 1.0
        mine = (a.double() - e).abs().max().item()
        allowed = 2 * (t.double() - e).abs().max().item() + floor * max(1.0, scale)
        passed &= mine <= allowed
        parts.append(f"{name} {mine:.1e}")
    return passed, "  ".join(parts)


def correctness_run(ops, device, quick, failures):
    """Print one line per case; return the number of failed cases."""
    import torch

    print(f"\nCorrectness on {device}: max |error| against float64 of the fused layer norm "
          "(y, dx, dw, db) and RMSNorm;\na case passes when each is within twice torch's "
          "own error in the same dtype (plus a rounding floor).")
    failed = 0
    for dtype, shape, offset in correctness_cases(quick):
        label = f"{str(dtype).replace('torch.', ''):9s}{str(shape):13s} offset {offset:6g}"
        result = failures.guard(f"correctness {label}",
                                lambda d=dtype, s=shape, o=offset: check_one(ops, d, s, o, device))
        if result is None:
            failed += 1
            print(f"  {label}  ERROR (see the errors below)")
            continue
        passed, text = result
        failed += not passed
        print(f"  {label}  {'ok  ' if passed else 'FAIL'} {text}")
    for dtype in (torch.float32, torch.float16):
        n = ops.max_features(dtype) + 1

        def too_wide(n=n, dtype=dtype):
            try:
                ops.layer_norm(torch.zeros(2, n, dtype=dtype, device=device))
            except ValueError as exc:
                return str(exc).split(":")[0]
            raise AssertionError(f"N = {n} in {dtype} was accepted")

        message = failures.guard(f"N = {n} error", too_wide)
        failed += message is None
        print(f"  {dtype} N = {n}: {'clear error: ' + message if message else 'FAIL'}")
    return failed


# -- GPU ---------------------------------------------------------------------------------

def forward_methods(ops, x, w, b):
    """What the GPU table times, each a no-argument call on the same (M, N) input."""
    import torch
    import torch.nn.functional as F

    n = x.shape[-1]
    out = torch.empty_like(x)
    return {
        "copy": lambda: out.copy_(x),
        "naive": lambda: naive_layer_norm(x, w, b),
        "F.layer_norm": lambda: F.layer_norm(x, (n,), w, b, EPS),
        "triton_ln": lambda: ops.layer_norm_forward(x, w, b, EPS),
        "F.rms_norm": lambda: F.rms_norm(x, (n,), w, EPS),
        "triton_rms": lambda: ops.rms_norm_forward(x, w, EPS),
    }


def measure_row(ops, device, timer, m, n, dtype, failures):
    """GB/s (and microseconds) of every forward method for one (dtype, N)."""
    import torch

    name = str(dtype).replace("torch.", "")
    row = {"dtype": name, "N": n,
           "warps": ops.num_warps_for(ops.block_size_for(n), dtype.itemsize)}

    def setup():
        gen = torch.Generator(device=device).manual_seed(n)
        x = torch.randn(m, n, device=device, dtype=dtype, generator=gen)
        w = torch.rand(n, device=device, dtype=dtype, generator=gen) + 0.5
        b = torch.rand(n, device=device, dtype=dtype, generator=gen) - 0.5
        return x, w, b

    tensors = failures.guard(f"{name} N={n} allocation", setup)
    if tensors is None:
        return row
    bytes_moved = 2 * tensors[0].numel() * tensors[0].element_size()
    for method, fn in forward_methods(ops, *tensors).items():
        seconds = failures.guard(f"{name} N={n} {method}", lambda fn=fn: timer(fn))
        row[method] = None if seconds is None else _gbps(bytes_moved, seconds)
        row[method + "_us"] = None if seconds is None else seconds * 1e6
    return row


def copy_and_norm_rows(ops, device, timer, m, features, dtypes, failures):
    """Time the copy and the five layer norms for each (dtype, N).

    Returns a list of dicts with GB/s per method (None where a measurement
    failed). Works on any device the kernels run on, so the table's logic can
    be tried on the CPU in the interpreter with a perf_counter timer.
    """
    import torch

    rows = []
    for dtype in dtypes:
        for n in features:
            rows.append(measure_row(ops, device, timer, m, n, dtype, failures))
            print(f"  (measured {dtype} N={n})", file=sys.stderr, flush=True)
            if device != "cpu":
                failures.guard("empty cache", torch.cuda.empty_cache)
    return rows


def _ratio(a, b):
    return a / b if a is not None and b else None


def print_gpu_table(rows):
    head = (f"{'dtype':9s}{'N':>6s} {'copy':>7s} {'naive':>7s} {'F.ln':>7s} {'Tri.LN':>7s} "
            f"{'F.rms':>7s} {'Tri.RMS':>7s} | {'LN/copy':>7s} {'RMS/copy':>8s} "
            f"{'LN/F.ln':>7s} {'LN/RMS':>6s} {'LN us':>7s} {'warps':>5s}")
    print(head)
    print("-" * len(head))
    for row in rows:
        g = row.get
        print(f"{row['dtype']:9s}{row['N']:6d} {_fmt(g('copy'))} {_fmt(g('naive'))} "
              f"{_fmt(g('F.layer_norm'))} {_fmt(g('triton_ln'))} {_fmt(g('F.rms_norm'))} "
              f"{_fmt(g('triton_rms'))} | {_fmt(_ratio(g('triton_ln'), g('copy')), 7, 3)} "
              f"{_fmt(_ratio(g('triton_rms'), g('copy')), 8, 3)} "
              f"{_fmt(_ratio(g('triton_ln'), g('F.layer_norm')), 7, 2)} "
              f"{_fmt(_ratio(g('triton_ln'), g('triton_rms')), 6, 2)} "
              f"{_fmt(g('triton_ln_us'), 7, 1)} {g('warps') or '-':>5}")


def summarize_gpu(rows):
    """The three claims, worked out from the table. Returns lines of text."""
    lines = []
    big = [r for r in rows if r["N"] >= 4096 and r.get("triton_ln") and r.get("copy")]
    if big:
        worst = min(big, key=lambda r: r["triton_ln"] / r["copy"])
        fraction = worst["triton_ln"] / worst["copy"]
        verdict = "met" if fraction >= TARGET_FRACTION_OF_COPY else "NOT met"
        lines.append(f"Triton LN for N >= 4096: at least {fraction:.1%} of the copy "
                     f"(worst: {worst['dtype']} N={worst['N']}); target "
                     f"{TARGET_FRACTION_OF_COPY:.0%} {verdict}")
    both = [r for r in rows if r.get("triton_ln") and r.get("F.layer_norm")]
    if both:
        worst = min(both, key=lambda r: r["triton_ln"] / r["F.layer_norm"])
        ratio = worst["triton_ln"] / worst["F.layer_norm"]
        lines.append(f"Triton LN / F.layer_norm: at worst {ratio:.2f}x "
                     f"({worst['dtype']} N={worst['N']}); "
                     f"{'never slower' if ratio >= 1 else 'slower there'}")
    pairs = [r["triton_ln"] / r["triton_rms"] for r in rows
             if r.get("triton_ln") and r.get("triton_rms")]
    if pairs:
        lines.append(f"Fused LN / fused RMSNorm speed: {min(pairs):.2f} to {max(pairs):.2f} "
                     f"(median {statistics.median(pairs):.2f}); the seed claim: nearly the same")
    return lines


def _torch_layer_norm(x, w, b, eps):
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def backward_points(ops, device, timer, failures, m=GPU_ROWS,
                    features=tuple(TUTORIAL_BACKWARD_GBPS)):
    """The backward in float16 at the tutorial's points: {N: {"triton"/"torch": GB/s}}."""
    import torch

    results = {}
    for n in features:
        def measure(n=n):
            gen = torch.Generator(device=device).manual_seed(n)
            shape = (m, n)
            x = torch.randn(shape, device=device, dtype=torch.float16, generator=gen)
            w = torch.rand(n, device=device, dtype=torch.float16, generator=gen)
            b = torch.rand(n, device=device, dtype=torch.float16, generator=gen)
            dy = 0.1 * torch.randn(shape, device=device, dtype=torch.float16, generator=gen)
            bytes_moved = 3 * x.numel() * x.element_size()
            out = {}
            for method, forward in (("triton", ops.layer_norm), ("torch", _torch_layer_norm)):
                leaves = [t.clone().requires_grad_() for t in (x, w, b)]
                y = forward(*leaves, EPS)

                def backward(y=y, leaves=leaves):
                    for leaf in leaves:  # as do_bench's grad_to_none: no accumulation
                        leaf.grad = None
                    y.backward(dy, retain_graph=True)

                out[method] = _gbps(bytes_moved, timer(backward))
            return out
        results[n] = failures.guard(f"backward N={n}", measure, default={})
    return results


TUNE_FEATURES = (4096, 8192, 16384)
TUNE_WARPS = (4, 8, 16, 32)


def tuning_sweep(ops, device, timer, m, failures, features=TUNE_FEATURES, warps=TUNE_WARPS):
    """Triton layer norm GB/s at each num_warps; prints a table, returns its rows."""
    import torch

    print(f"\nnum_warps tried, Triton layer norm forward, M = {m} (GB/s; '*' = the "
          "heuristic's choice):")
    print(f"{'dtype':9s}{'N':>6s} {'copy':>7s} | " + " ".join(f"{w:>6d}w" for w in warps)
          + " | best")
    rows = []
    for dtype in (torch.float16, torch.float32):
        for n in features:
            name = str(dtype).replace("torch.", "")
            x = failures.guard(f"tune {name} N={n} allocation",
                               lambda n=n, dtype=dtype: torch.randn(m, n, device=device,
                                                                    dtype=dtype))
            if x is None:
                continue
            w, b = torch.ones(n, device=device, dtype=dtype), torch.zeros(n, device=device,
                                                                           dtype=dtype)
            moved = 2 * x.numel() * x.element_size()
            out = torch.empty_like(x)
            copy = failures.guard(f"tune {name} N={n} copy",
                                  lambda x=x, out=out: timer(lambda: out.copy_(x)))
            row = {"dtype": name, "N": n, "copy": None if copy is None else _gbps(moved, copy)}
            for k in warps:
                seconds = failures.guard(
                    f"tune {name} N={n} {k} warps",
                    lambda x=x, w=w, b=b, k=k: timer(
                        lambda: ops.layer_norm_forward(x, w, b, EPS, num_warps=k)))
                row[k] = None if seconds is None else _gbps(moved, seconds)
            chosen = ops.num_warps_for(ops.block_size_for(n), x.element_size())
            measured = {k: row[k] for k in warps if row[k]}
            best = max(measured, key=measured.get) if measured else None
            cells = " ".join(_fmt(row[k], 6) + ("*" if k == chosen else " ") for k in warps)
            print(f"{name:9s}{n:6d} {_fmt(row['copy'])} | {cells} | "
                  f"{best if best else '-'}w")
            rows.append(row)
    return rows


def run_gpu(ops, quick, failures, device="cuda", timer=do_bench_timer, m=GPU_ROWS,
            features=None, backward_features=tuple(TUTORIAL_BACKWARD_GBPS), tune=False,
            tune_features=TUNE_FEATURES):
    """Correctness, the forward table and the backward points; returns the failed count.

    The defaults are the real run; the test suite passes device="cpu", a
    perf_counter timer and tiny sizes to run the same code in the interpreter.
    """
    import torch

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        print(f"GPU: {props.name}, {props.multi_processor_count} SMs, "
              f"{props.total_memory / 2**30:.0f} GiB")
    failed = correctness_run(ops, device, quick, failures)
    if features is None:
        features = GPU_FEATURES_QUICK if quick else GPU_FEATURES
    dtypes = (torch.float16, torch.float32) if quick else \
        (torch.float16, torch.bfloat16, torch.float32)
    print(f"\nForward, M = {m}: GB/s = 2*M*N*bytes / time (do_bench median, L2 "
          "flushed); copy = out.copy_(x) of the same tensor, timed in this run.\n"
          "naive = eager PyTorch (9 kernels); Tri.LN / Tri.RMS = the fused kernels' "
          "launchers (allocate y, mean/rstd; launch).")
    rows = copy_and_norm_rows(ops, device, timer, m, features, dtypes, failures)
    print_gpu_table(rows)
    for line in summarize_gpu(rows):
        print(line)
    print(f"\nBackward, float16, M = {m}: GB/s = 3*M*N*bytes / time "
          "(y.backward(dy), as in Triton's tutorial)")
    points = backward_points(ops, device, timer, failures, m, backward_features)
    for n in backward_features:
        here = points.get(n, {})
        published = TUTORIAL_BACKWARD_GBPS.get(n)
        note = (f"; the tutorial published Triton {published['triton']} vs torch "
                f"{published['torch']}" if published else "")
        print(f"  N = {n:5d}: Triton {_fmt(here.get('triton'))} GB/s, torch "
              f"{_fmt(here.get('torch'))} GB/s here{note}")
    if tune:
        tuning_sweep(ops, device, timer, m, failures, tune_features)
    return failed


# -- CPU -----------------------------------------------------------------------------------

def cpu_methods(x, w, b):
    """What the CPU table times: a copy, numpy, naive torch, F.layer_norm."""
    import torch
    import torch.nn.functional as F

    n = x.shape[-1]
    out = torch.empty_like(x)
    xn, wn, bn = x.numpy(), w.numpy(), b.numpy()
    return {
        "copy": lambda: out.copy_(x),
        "numpy": lambda: numpy_layer_norm(xn, wn, bn),
        "naive": lambda: naive_layer_norm(x, w, b),
        "F.layer_norm": lambda: F.layer_norm(x, (n,), w, b, EPS),
    }


def cpu_rows(features, repeats=5):
    """GB/s of a CPU copy, numpy, naive torch and F.layer_norm; float32, M*N = 2**22.

    torch runs on one thread here, like numpy: like is compared with like, and
    a shared machine's other processes disturb one thread far less than two.
    """
    import torch

    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for n in features:
            m = CPU_ELEMENTS // n
            gen = torch.Generator().manual_seed(n)
            x = torch.randn(m, n, generator=gen)
            w, b = torch.rand(n, generator=gen) + 0.5, torch.rand(n, generator=gen) - 0.5
            bytes_moved = 2 * x.numel() * x.element_size()
            row = {"M": m, "N": n}
            for method, fn in cpu_methods(x, w, b).items():
                row[method] = _gbps(bytes_moved, perf_counter_timer(fn, repeats))
            rows.append(row)
    finally:
        torch.set_num_threads(threads)
    return rows


def run_cpu(ops, quick, failures):
    print(f"No CUDA device: the GPU table is skipped. CPU: {os.cpu_count()} cores.")
    print("\nCPU, float32, M*N = 2**22, one thread: GB/s = 2*M*N*4 / time (median of 5, "
          "time.perf_counter)")
    rows = failures.guard("CPU table", lambda: cpu_rows(CPU_FEATURES_QUICK if quick
                                                         else CPU_FEATURES), default=[])
    head = (f"{'M':>6s}{'N':>6s} {'copy':>7s} {'numpy':>7s} {'naive':>7s} {'F.ln':>7s} | "
            f"{'F.ln/copy':>9s} {'naive/copy':>10s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['M']:6d}{r['N']:6d} {_fmt(r['copy'], 7, 1)} {_fmt(r['numpy'], 7, 1)} "
              f"{_fmt(r['naive'], 7, 1)} {_fmt(r['F.layer_norm'], 7, 1)} | "
              f"{_fmt(r['F.layer_norm'] / r['copy'], 9, 2)} {_fmt(r['naive'] / r['copy'], 10, 2)}")
    start = time.perf_counter()
    failed = correctness_run(ops, "cpu", quick, failures)
    print(f"(interpreter correctness run: {time.perf_counter() - start:.1f} s)")
    return failed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and dtypes")
    parser.add_argument("--tune", action="store_true",
                        help="on a GPU, also time the Triton layer norm at several num_warps")
    args = parser.parse_args(argv)

    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        # The interpreter must be on before the kernels are defined (imported).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import triton

    from normref.kernels import ops

    flags = "".join(f" --{f}" for f in ("quick", "tune") if getattr(args, f))
    print(f"normref.kernels.bench{flags}: "
          f"{time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, "
          f"triton {triton.__version__}, interpreter {'on' if ops.interpreter_on() else 'off'}")
    failures = Failures()
    start = time.perf_counter()
    if on_gpu and ops.interpreter_on():
        print("TRITON_INTERPRET=1 is set on a machine with a GPU: the kernels would run in "
              "the CPU interpreter, so timing them means nothing. Unset it and run again.")
        failed = 1
    elif on_gpu:
        failed = run_gpu(ops, args.quick, failures, tune=args.tune)
    else:
        failed = run_cpu(ops, args.quick, failures)
    print(f"\nDone in {time.perf_counter() - start:.0f} s. Correctness failures: {failed}. "
          f"Errors: {len(failures.items)}.")
    for item in failures.items:
        print("  " + item)
    return 1 if failed or failures.items else 0


if __name__ == "__main__":
    sys.exit(main())
