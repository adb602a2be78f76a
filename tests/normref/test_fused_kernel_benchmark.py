"""The benchmark of lesson 07 and assignment 07 (fused_kernel_bench.py, which
ships with the assignment, timing the methods each notebook's benchmark cell
names) builds its tables from whatever timer it is given. On a GPU that timer
is triton's do_bench; here a fake timer stands in, under TRITON_INTERPRET, so
the very code that a GPU runs builds the table, and each figure is checked
against one worked out here from the fake times."""

import importlib.util
import json
import linecache
import sys

import matplotlib
import pytest
import torch

from conftest import REPO

LESSON = REPO / "notebooks" / "07_fused_kernel_lesson.ipynb"
SOURCE = REPO / "source" / "07_fused_kernel" / "07_fused_kernel.ipynb"
BENCH = REPO / "source" / "07_fused_kernel" / "fused_kernel_bench.py"
ELEMENT_SIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
LESSON_BENCHMARK_CELL = "if not torch.cuda.is_available():\n    print(\"No CUDA GPU"


def _bench():
    """fused_kernel_bench, loaded from its one file."""
    spec = importlib.util.spec_from_file_location("fused_kernel_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeTimer:
    """Runs each method once, as do_bench would, and says it took a known
    time: 100 us for the first call, 200 us for the second, and so on."""

    def __init__(self):
        self.calls = 0

    def __call__(self, fn):
        fn()
        self.calls += 1
        return self.calls * 1e-4


def _run_cells(path, last, capsys, monkeypatch, wanted=None):
    """Run the notebook's code cells in one namespace, in order, up to and
    including the first whose source starts with `last`; with `wanted`, only
    the cells whose nbgrader grade_id is in it. Returns (namespace, what the
    last cell printed)."""
    matplotlib.use("Agg")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as the notebooks set it on a CPU
    namespace = {"__name__": "notebook"}
    threads = torch.get_num_threads()
    try:
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
            if cell["cell_type"] != "code" or (wanted and grade_id not in wanted):
                continue
            source = "".join(cell["source"])
            # @triton.jit reads a kernel's source through linecache, as in IPython
            name = f"<{path.name} cell {index}>"
            linecache.cache[name] = (len(source), None, source.splitlines(True), name)
            capsys.readouterr()
            exec(compile(source, name, "exec"), namespace)  # noqa: S102
            if source.startswith(last):
                return namespace, capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)
    raise AssertionError(f"no cell of {path.name} starts with {last!r}")


def _check_table(table, times, rows, peak, charged=None):
    """Every figure of the table from the fake times, worked out here; a
    method in `charged` is charged its own bytes, the rest a forward's."""
    assert len(table) == sum(len(t) for t in times.values())
    for row in table:
        key = row["dtype"], row["N"]
        seconds = times[key][row["method"]]
        forward = 2 * rows * row["N"] * ELEMENT_SIZE[row["dtype"]]
        moved = (charged or {}).get(key, {}).get(row["method"], forward)
        copy = times[key]["copy"]
        assert row["us"] == pytest.approx(seconds * 1e6)
        assert row["GB/s"] == pytest.approx(moved / seconds / 1e9)
        assert row["of copy"] == pytest.approx(moved / seconds / (forward / copy))
        if peak is None:
            assert row["of peak"] is None
        else:
            assert row["of peak"] == pytest.approx(moved / seconds / peak)


def test_the_lesson_skips_its_gpu_benchmark_on_a_cpu_and_says_why(capsys, monkeypatch):
    _, printed = _run_cells(LESSON, LESSON_BENCHMARK_CELL,
                            capsys, monkeypatch)
    assert "No CUDA GPU here, so the benchmark is skipped" in printed
    assert "Triton LN" in printed and "F.rms_norm" in printed  # the bytes table


@pytest.mark.parametrize("gpu_name, peak", [("NVIDIA H100 80GB HBM3", 3.35e12),
                                            ("NVIDIA GeForce RTX 3060", None)])
def test_the_lesson_table_is_built_from_the_timer_alone(gpu_name, peak, capsys, monkeypatch):
    ns, _ = _run_cells(LESSON, LESSON_BENCHMARK_CELL, capsys, monkeypatch)
    bench = _bench()
    assert bench.peak_bandwidth(gpu_name) == peak
    ns["your_rms_norm"] = lambda x, w: ns["eager_rms_norm"](x, w)
    timer = FakeTimer()
    times = bench.sweep(ns["benchmark_methods"], timer, device="cpu", rows=3,
                        features=[64, 100], dtypes=["float32", "float16"])
    methods = ["copy", "naive LN", "compiled LN", "F.layer_norm", "Triton LN",
               "eager RMS", "compiled RMS", "F.rms_norm", "your RMS"]
    assert all(list(t) == methods for t in times.values())
    assert timer.calls == 4 * len(methods)
    table = bench.benchmark_rows(times, peak, rows=3)
    _check_table(table, times, 3, peak)
    bench.show_benchmark(table)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 + len(table)
    assert printed[0].split() == ["dtype", "N", "method", "time", "us", "GB/s", "of",
                                  "copy", "of", "peak"]
    assert printed[-1].split()[-1] == ("-" if peak is None else
                                       f"{table[-1]['of peak']:.2f}")


def test_a_method_that_fails_is_reported_and_the_rest_are_timed(capsys, monkeypatch):
    ns, _ = _run_cells(LESSON, LESSON_BENCHMARK_CELL, capsys, monkeypatch)

    def broken_launcher(x, w):
        raise RuntimeError("out of resources")

    ns["your_rms_norm"] = broken_launcher
    times = _bench().sweep(ns["benchmark_methods"], FakeTimer(), device="cpu",
                           rows=2, features=[64], dtypes=["float32"])
    assert "float32 N=64 your RMS: RuntimeError: out of resources" in capsys.readouterr().out
    assert "your RMS" not in times["float32", 64] and "F.rms_norm" in times["float32", 64]


ASSIGNMENT_CELLS = {"imports", "rms_forward_answer", "launcher", "rms_backward_answer",
                    "gpu_benchmark", "gpu_reading"}
BACKWARD_METHODS = ["eager bwd", "your bwd", "eager f+b", "compiled f+b", "your f+b"]


def test_the_assignment_skips_its_gpu_benchmark_on_a_cpu_and_says_why(capsys, monkeypatch):
    _, printed = _run_cells(SOURCE, "compiled = {}", capsys, monkeypatch, ASSIGNMENT_CELLS)
    assert "No CUDA GPU here, so the benchmark is skipped" in printed


def test_the_assignment_table_times_the_students_kernel_by_the_timer_alone(capsys, monkeypatch):
    ns, _ = _run_cells(SOURCE, "compiled = {}", capsys, monkeypatch, ASSIGNMENT_CELLS)
    bench = _bench()
    timer, charged = FakeTimer(), {}
    times = bench.sweep(ns["benchmark_methods"], timer, device="cpu", rows=3,
                        features=[64, 100], dtypes=["float32", "bfloat16"], charged=charged)
    assert ": " not in capsys.readouterr().out  # no method failed
    methods = ["copy", "eager RMS", "compiled RMS", "F.rms_norm", "your RMS",
               "F.layer_norm"] + BACKWARD_METHODS
    assert all(list(t) == methods for t in times.values())
    assert timer.calls == 4 * len(methods)
    for (dtype, n), moved in charged.items():  # Question 2's count, 2 programs
        size, programs = ELEMENT_SIZE[dtype], 2  # 3 rows, 2 rows a program
        backward = 3 * 3 * n * size + 3 * 4 + programs * n * size + 2 * programs * n * 4 + n * 4
        assert moved == dict.fromkeys(BACKWARD_METHODS[:2], backward) | dict.fromkeys(
            BACKWARD_METHODS[2:], 2 * 3 * n * size + 3 * 4 + backward)
    peak = bench.peak_bandwidth("NVIDIA A100-SXM4-80GB")
    assert peak == 2.039e12  # the figure the assignment's question 3 gives
    _check_table(bench.benchmark_rows(times, peak, rows=3, charged=charged), times, 3, peak,
                 charged)


def test_the_assignment_launches_the_students_kernels_with_the_lessons_warps(capsys,
                                                                              monkeypatch):
    """num_warps by lesson 07's rule, a warp per 1024 bytes of the block; and the
    backward kernel's dx and partial sums are right, on the interpreter."""
    ns, _ = _run_cells(SOURCE, "compiled = {}", capsys, monkeypatch, ASSIGNMENT_CELLS)
    assert [ns["num_warps_for"](block, size) for block, size in (
        (1024, 2), (4096, 2), (16384, 2), (16384, 4), (128, 4))] == [2, 8, 16, 16, 1]
    launches = []

    class Recording:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(kwargs["num_warps"])
                return self.kernel[grid](*args, **kwargs)
            return launch

    for name in ("rms_norm_fwd_kernel", "rms_norm_bwd_kernel"):
        ns[name] = Recording(ns[name])
    x = torch.randn(3, 600)
    w, b = torch.rand(600) + 0.5, torch.zeros(600)
    methods = ns["benchmark_methods"](x, w, b)
    methods["your RMS"]()
    your_dw = methods["your bwd"][0]()
    assert launches == [4, 4]  # a block of 1024 float32 numbers: 4096 bytes
    _, eager_dw = methods["eager bwd"][0]()  # autograd, with the same dy
    assert torch.allclose(your_dw, eager_dw, rtol=1e-4, atol=1e-5)
    your_dw = methods["your f+b"][0]()
    assert launches == [4, 4, 4, 4]
    assert torch.allclose(your_dw, methods["compiled f+b"][0]()[1], rtol=1e-4, atol=1e-5)


def test_a_students_kernel_that_fails_on_launch_is_reported_not_fatal(capsys, monkeypatch):
    ns, _ = _run_cells(SOURCE, "compiled = {}", capsys, monkeypatch, ASSIGNMENT_CELLS)

    class KernelThatFails:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise IndexError("the launch failed")
            return launch

    ns["rms_norm_fwd_kernel"] = KernelThatFails()
    times = _bench().sweep(ns["benchmark_methods"], FakeTimer(), device="cpu",
                           rows=2, features=[64], dtypes=["float32"])
    assert ("float32 N=64 your RMS: IndexError: the launch failed"
            in capsys.readouterr().out)
    assert "your RMS" not in times["float32", 64] and "F.rms_norm" in times["float32", 64]


def test_the_lesson_quotes_the_benchmarks_peaks_and_shapes(capsys, monkeypatch):
    lesson, _ = _run_cells(LESSON, LESSON_BENCHMARK_CELL, capsys, monkeypatch)
    bench = _bench()
    assert bench.PEAK_BANDWIDTH["H200"] == lesson["H200_SPEC_TBPS"] * 1e12
    # the bytes table and the plots the lesson draws are for the shapes timed
    assert (bench.ROWS, list(bench.FEATURES), list(bench.DTYPES)) == (
        lesson["GPU_ROWS"], lesson["GPU_FEATURES"], lesson["GPU_DTYPES"])
    assert bench.ELEMENT_SIZE == lesson["SIZES"]
    # a longer name that ends differently is not taken for a listed GPU
    assert bench.peak_bandwidth("NVIDIA L40S") is None
    assert bench.peak_bandwidth("NVIDIA L4") == 300e9


def test_the_release_ships_the_module_the_assignment_imports():
    release = REPO / "release" / "07_fused_kernel"
    assert (release / BENCH.name).read_bytes() == BENCH.read_bytes()
    cells = json.loads((release / "07_fused_kernel.ipynb").read_text())["cells"]
    (benchmark,) = [c for c in cells
                    if c["metadata"].get("nbgrader", {}).get("grade_id") == "gpu_benchmark"]
    assert "import fused_kernel_bench" in "".join(benchmark["source"])


COLAB_PAGE = ("https://colab.research.google.com/github/Owner/course/blob/fall/"
              "notebooks/07_fused_kernel_lesson.ipynb")
RAW_BENCH = ("https://raw.githubusercontent.com/Owner/course/fall/assignments/"
             "07_fused_kernel/fused_kernel_bench.py")


def _fake_download(monkeypatch, content, fails=False):
    """urllib.request.urlretrieve, writing `content` where it is asked to; the
    addresses it was asked for."""
    import urllib.error
    import urllib.request

    asked = []

    def urlretrieve(address, filename):
        asked.append(address)
        if fails:
            raise urllib.error.URLError("no network")
        with open(filename, "w") as file:
            file.write(content)

    monkeypatch.setattr(urllib.request, "urlretrieve", urlretrieve)
    return asked


@pytest.mark.parametrize("where", ["shipped", "missing", "colab", "colab offline"])
def test_the_lesson_finds_or_downloads_the_module_or_says_where_it_is(
        where, tmp_path, capsys, monkeypatch):
    """Laid out as students get the course (notebooks/ beside assignments/), or
    opened alone on Colab with the page's address in COURSE_REPOSITORY."""
    ns, _ = _run_cells(LESSON, LESSON_BENCHMARK_CELL, capsys, monkeypatch)
    (tmp_path / "notebooks").mkdir()
    if where == "shipped":
        (tmp_path / "assignments" / "07_fused_kernel").mkdir(parents=True)
        (tmp_path / "assignments" / "07_fused_kernel" / BENCH.name).write_bytes(
            BENCH.read_bytes())
    if where.startswith("colab"):
        ns["COURSE_REPOSITORY"] = COLAB_PAGE
    asked = _fake_download(monkeypatch, BENCH.read_text(), fails=where == "colab offline")
    monkeypatch.chdir(tmp_path / "notebooks")
    monkeypatch.setattr("sys.path", [p for p in sys.path if "07_fused_kernel" not in p])
    monkeypatch.delitem(sys.modules, "fused_kernel_bench", raising=False)
    bench = ns["benchmark_helpers"]()
    printed = capsys.readouterr().out
    assert asked == ([RAW_BENCH] if where.startswith("colab") else [])
    if where in ("shipped", "colab"):
        assert bench.run is not None and bench.__file__.startswith(str(tmp_path))
    else:
        assert bench is None
        assert "assignments/07_fused_kernel" in printed and "COURSE_REPOSITORY" in printed


@pytest.mark.parametrize("address", ["", COLAB_PAGE])
def test_the_assignment_downloads_the_module_on_colab(address, tmp_path, capsys,
                                                      monkeypatch):
    """The assignment's benchmark cell as on a Colab GPU, the notebook alone in
    its folder: with the page's address it downloads the module and runs it."""
    cells = json.loads((REPO / "release" / "07_fused_kernel" /
                        "07_fused_kernel.ipynb").read_text())["cells"]
    (source,) = ["".join(c["source"]) for c in cells
                 if c["metadata"].get("nbgrader", {}).get("grade_id") == "gpu_benchmark"]
    assert source.count('COURSE_REPOSITORY = ""') == 1
    source = source.replace('COURSE_REPOSITORY = ""', f"COURSE_REPOSITORY = {address!r}")
    asked = _fake_download(monkeypatch, "def run(methods, gpu):\n    print('ran on', gpu)\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA T4")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", ["", *[p for p in sys.path if "07_fused_kernel" not in p]])
    monkeypatch.delitem(sys.modules, "fused_kernel_bench", raising=False)
    import torch.nn.functional as F
    import triton

    exec(compile(source, "<gpu_benchmark>", "exec"),  # noqa: S102
         {"torch": torch, "triton": triton, "F": F})
    printed = capsys.readouterr().out
    if address:
        assert asked == [RAW_BENCH] and printed == "ran on NVIDIA T4\n"
    else:
        assert asked == [] and "COURSE_REPOSITORY" in printed
    monkeypatch.delitem(sys.modules, "fused_kernel_bench", raising=False)


def test_time_on_gpu_asks_do_bench_for_the_median_and_gives_seconds(monkeypatch):
    """The one GPU-only line of the module, with do_bench faked: the median of
    do_bench's runs, in milliseconds, comes back in seconds."""
    import triton.testing

    asked = {}

    def fake_do_bench(fn, **kwargs):
        fn()
        asked.update(kwargs)
        return 0.25  # milliseconds, as do_bench gives them

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    ran = []
    assert _bench().time_on_gpu(lambda: ran.append(1)) == pytest.approx(0.25e-3)
    assert ran == [1] and asked["return_mode"] == "median"


@pytest.mark.parametrize("gpu_name, peak, header", [
    ("NVIDIA H100 80GB HBM3", 3.35e12, "peak 3,350 GB/s (datasheet)"),
    ("NVIDIA L40S", None, "no datasheet peak listed"),
])
def test_run_prints_the_peak_and_the_table_of_the_timer(gpu_name, peak, header, capsys,
                                                        monkeypatch):
    """run() end to end as on a GPU: the sweep on the CPU, time_on_gpu faked."""
    import functools

    bench = _bench()
    timer = FakeTimer()
    monkeypatch.setattr(bench, "time_on_gpu", timer)
    monkeypatch.setattr(bench, "sweep", functools.partial(
        bench.sweep, device="cpu", features=[64], dtypes=["float32"]))

    def methods(x, w, b):
        out = torch.empty_like(x)
        return {"copy": lambda: out.copy_(x), "scale": lambda: x * w}

    table = bench.run(methods, gpu_name)
    printed = capsys.readouterr().out
    assert printed.startswith(gpu_name) and header in printed.splitlines()[0]
    times = {("float32", 64): {"copy": 1e-4, "scale": 2e-4}}
    _check_table(table, times, bench.ROWS, peak)
    assert timer.calls == 2 and len(printed.splitlines()) == 2 + len(table)


def test_the_students_timer_and_normrefs_are_the_same_timer(monkeypatch):
    """fused_kernel_bench ships without normref, so normref.kernels.bench keeps a
    twin of its GPU timer: both must ask do_bench the same and convert alike."""
    import triton.testing

    from normref.kernels import bench as normref_bench

    asked = []
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, **kwargs: asked.append(kwargs) or 1.5)
    assert _bench().time_on_gpu(lambda: None) == normref_bench.do_bench_timer(lambda: None)
    assert asked[0] == asked[1]
