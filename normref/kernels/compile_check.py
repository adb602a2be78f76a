"""Compile the fused kernels for an H200 (sm_90) without a GPU, and report registers.

    python -m normref.kernels.compile_check          # the benchmark's configurations
    python -m normref.kernels.compile_check --quick  # one per kernel

Triton compiles all the way to a cubin on any machine (LLVM and ptxas ship
in its wheel); only loading the cubin needs a GPU. So this catches, on a
laptop, what would otherwise surface as a compile error on the GPU, and shows
each configuration's registers per thread and spilled bytes (from ptxas -v):
the forward kernels are meant to keep a whole row in registers without
spilling. Must run without TRITON_INTERPRET (it exits with a message if set).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SM90 = ("cuda", 90, 32)


def _signature(kernel_name, dtype):
    """Argument types as Triton's compiler names them, for a launch on `dtype` data."""
    t = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[dtype]
    rows = {"x_row_stride": "i32", "y_row_stride": "i32", "N": "i32", "eps": "fp32"}
    if kernel_name == "layer_norm_fwd_kernel":
        return {"X": f"*{t}", "Y": f"*{t}", "W": f"*{t}", "B": f"*{t}", "Mean": "*fp32",
                "Rstd": "*fp32", **rows, "BLOCK_SIZE": "constexpr"}
    if kernel_name == "rms_norm_fwd_kernel":
        return {"X": f"*{t}", "Y": f"*{t}", "W": f"*{t}", "Rstd": "*fp32", **rows,
                "BLOCK_SIZE": "constexpr"}
    if kernel_name == "layer_norm_bwd_dx_kernel":
        return {"DX": f"*{t}", "DY": f"*{t}", "X": f"*{t}", "W": f"*{t}", "Mean": "*fp32",
                "Rstd": "*fp32", "PartialDW": "*fp32", "PartialDB": "*fp32",
                "x_row_stride": "i32", "dy_row_stride": "i32", "dx_row_stride": "i32",
                "M": "i32", "N": "i32", "rows_per_program": "i32", "BLOCK_SIZE": "constexpr"}
    if kernel_name == "rms_norm_bwd_kernel":
        return {"DX": f"*{t}", "DY": f"*{t}", "X": f"*{t}", "W": f"*{t}", "Rstd": "*fp32",
                "PartialDW": "*fp32", "x_row_stride": "i32", "dy_row_stride": "i32",
                "dx_row_stride": "i32", "M": "i32", "N": "i32", "rows_per_program": "i32",
                "BLOCK_SIZE": "constexpr"}
    return {"PartialDW": "*fp32", "PartialDB": "*fp32", "DW": f"*{t}", "DB": f"*{t}",
            "groups": "i32", "N": "i32", "BLOCK_GROUPS": "constexpr", "BLOCK_COLS": "constexpr"}


def _ptxas_report(ptx):
    """(registers, spilled bytes) from ptxas -v, or (None, None) if it cannot tell."""
    import triton

    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        return _ask_ptxas(bin_dir, source)


def _ask_ptxas(bin_dir, source):
    for name in ("ptxas-blackwell", "ptxas"):  # the newer one reads newer PTX
        tool = bin_dir / name
        if not tool.exists():
            continue
        done = subprocess.run([str(tool), "-arch=sm_90a", "-v", str(source), "-o", os.devnull],
                              capture_output=True, text=True)
        registers = re.search(r"Used (\d+) registers", done.stderr)
        spills = re.search(r"(\d+) bytes spill stores", done.stderr)
        if registers and spills:
            return int(registers.group(1)), int(spills.group(1))
    return None, None


def compile_for_sm90(kernel, kernel_name, dtype, constants, num_warps, num_stages=3):
    """Compile one configuration as a launch with 16-aligned pointers, N and strides
    would be; returns (registers, spilled bytes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = _signature(kernel_name, dtype)
    aligned = {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
               if kind.startswith("*") or name.endswith("stride") or name == "N"}
    source = ASTSource(kernel, signature, constexprs=constants, attrs=aligned)
    compiled = triton.compile(source, target=GPUTarget(*SM90),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    return _ptxas_report(compiled.asm["ptx"])


def configurations(quick):
    """(kernel name, dtype, constants, num_warps, num_stages) as the launchers choose them."""
    from normref.kernels.ops import backward_num_warps, num_warps_for

    sizes = {"float32": 4, "float16": 2, "bfloat16": 2}
    blocks = (4096,) if quick else (512, 1024, 2048, 4096, 8192, 16384, 32768)
    dtypes = ("float16",) if quick else tuple(sizes)
    for dtype in dtypes:
        for block in blocks:
            if block * sizes[dtype] > 65536:
                continue
            warps = num_warps_for(block, sizes[dtype])
            yield "layer_norm_fwd_kernel", dtype, {"BLOCK_SIZE": block}, warps, 3
            yield "rms_norm_fwd_kernel", dtype, {"BLOCK_SIZE": block}, warps, 3
            yield ("layer_norm_bwd_dx_kernel", dtype, {"BLOCK_SIZE": block},
                   backward_num_warps(block), 1)
            yield ("rms_norm_bwd_kernel", dtype, {"BLOCK_SIZE": block},
                   backward_num_warps(block), 1)
        yield "sum_partials_kernel", dtype, {"BLOCK_GROUPS": 32, "BLOCK_COLS": 128}, 4, 3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one configuration per kernel")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("unset TRITON_INTERPRET: the interpreter replaces the compiler")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the default, without its warning
    from normref.kernels import triton_kernels

    spilled_forward = []
    print(f"{'kernel':26s}{'dtype':>9s}{'block':>7s}{'warps':>6s}{'registers':>10s}{'spills':>8s}")
    for name, dtype, constants, warps, stages in configurations(args.quick):
        kernel = getattr(triton_kernels, name)
        registers, spills = compile_for_sm90(kernel, name, dtype, constants, warps, stages)
        block = constants.get("BLOCK_SIZE", constants.get("BLOCK_COLS"))
        print(f"{name:26s}{dtype:>9s}{block:7d}{warps:6d}{registers or '?':>10}"
              f"{spills if spills is not None else '?':>8}", flush=True)
        if spills and "fwd" in name:
            spilled_forward.append(f"{name} {dtype} {block}")
    if spilled_forward:
        print("forward kernels that spill:", ", ".join(spilled_forward))
    return 1 if spilled_forward else 0


if __name__ == "__main__":
    sys.exit(main())
