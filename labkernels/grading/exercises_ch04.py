"""Chapter 04 exercises: the roofline verdict and best-case time of GEMMs and convolutions, the split-K
partial-sum reduction, the implicit-GEMM index of a filter tap, choosing cuDNN/cuBLAS settings, and split-K's
fixed-order reduction as a Triton kernel.

Shapes are drawn at grading time; K is odd where a split must not divide it. The closed forms the answers
are checked against live here, in the grader, not in the package the learner imports.
"""

from __future__ import annotations

import functools
import math

import torch

from labkernels import size, timing, traffic
from labkernels.grading.core import CaseFailed, exercise
from labkernels.lane import LANE

# --- 4.1: compute- or memory-bound, and the best-case time -------------------------------------------------


def _op_traffic(op: dict) -> tuple[int, int]:
    """(bytes, FLOPs) that at best move and run: inputs read once, output written once."""
    es = op["dtype_bytes"]
    if op["kind"] == "gemm":
        m, n, k = op["m"], op["n"], op["k"]
        return es * (m * k + k * n + m * n), 2 * m * n * k
    r, stride, pad = op["kernel"], op["stride"], op["padding"]
    p = (op["height"] + 2 * pad - r) // stride + 1
    q = (op["width"] + 2 * pad - r) // stride + 1
    b, c, oc = op["batch"], op["channels"], op["out_channels"]
    nbytes = es * (b * c * op["height"] * op["width"] + oc * c * r * r + b * oc * p * q)
    return nbytes, 2 * b * p * q * oc * c * r * r


def _closed_form(op: dict, bandwidth_gbps: float, peak_tflops: float) -> tuple[str, float]:
    nbytes, flops = _op_traffic(op)
    memory_ms, compute_ms = nbytes / (bandwidth_gbps * 1e6), flops / (peak_tflops * 1e9)
    return ("compute" if compute_ms >= memory_ms else "memory"), max(memory_ms, compute_ms)


def _check_prediction(g, student, op: dict, bandwidth: float, peak: float) -> None:
    want_bound, want_ms = _closed_form(op, bandwidth, peak)
    got = student(dict(op), bandwidth, peak)
    g.expect(isinstance(got, tuple | list) and len(got) == 2, f"return (bound, ms), got {got!r}")
    bound, ms = got
    g.expect(bound == want_bound, f"{op}: {bound!r} is wrong at {bandwidth:.0f} GB/s, {peak:.0f} TFLOP/s")
    g.expect(
        isinstance(ms, int | float) and math.isclose(ms, want_ms, rel_tol=1e-6),
        f"{op}: best-case time {ms!r} ms, expected {want_ms:.6g} ms",
    )


def _gemm_op(g, m, n, k) -> dict:
    return {"kind": "gemm", "m": m, "n": n, "k": k, "dtype_bytes": g.choice([2, 4])}


def _machines(g):
    """A few (bandwidth GB/s, peak TFLOP/s) pairs: an H200-like one in bf16 and in fp32, and random ones."""
    yield 4200.0, 700.0
    yield 4200.0, 51.0
    for _ in range(3):
        yield float(g.randint(100, 8000)), float(g.randint(1, 2000))


# How far above cuBLAS's measured time a best-case prediction may sit. The bound uses the copy bandwidth, but
# a GEMM with a tiny K is nearly all writes of C, and writes alone stream faster than a copy: 1.10x at 1 GiB
# on the H200 (ch00_read_write_mix), so at 8192 x 8192 x 16 a correct bound sits at about 1.1x cuBLAS's time.
# A 1.1 margin failed the solution once (the shape was not recorded); a wrong byte or FLOP count is off by 2x.
BOUND_MARGIN = 1.25


@exercise(
    "4.1",
    "Compute- or memory-bound, and the best-case time",
    points=3,
    speed_points=1,
    timeout_s=120,
    forbids=("labkernels.roofline", "labkernels.traffic", "labkernels.ch04_libraries.gemm_model"),
)
def _grade_4_1(student, g):
    # student(op: dict, bandwidth_gbps, peak_tflops) -> ("compute" | "memory", best-case ms)
    with g.case("GEMMs: squares, M=100 K=10 (a common example), and random shapes", points=1):
        ops = [_gemm_op(g, 4096, 4096, 4096), _gemm_op(g, 100, 4096, 10)]
        ops += [_gemm_op(g, g.randint(1, 9000), g.randint(1, 9000), g.randint(1, 9000)) for _ in range(6)]
        for bandwidth, peak in _machines(g):
            for op in ops:
                _check_prediction(g, student, op, bandwidth, peak)
    with g.case("skinny GEMMs: M, N ≫ K and K ≫ M, N", points=1):
        for bandwidth, peak in _machines(g):
            for _ in range(4):
                big, small = g.randint(2000, 60000), g.randint(1, 64)
                _check_prediction(
                    g, student, _gemm_op(g, big, big + g.randint(0, 99), small), bandwidth, peak
                )
                _check_prediction(g, student, _gemm_op(g, small, small + 3, big), bandwidth, peak)
    with g.case("convolutions with stride and padding (an implicit GEMM)", points=1):
        for bandwidth, peak in _machines(g):
            for _ in range(6):
                kernel = g.choice([1, 3, 5, 7])
                op = {"kind": "conv", "batch": g.randint(1, 64), "channels": g.randint(1, 512)}
                op |= {"height": g.randint(kernel, 120), "width": g.randint(kernel, 120)}
                op |= {"out_channels": g.randint(1, 512), "kernel": kernel, "stride": g.randint(1, 3)}
                op |= {"padding": g.randint(0, kernel // 2), "dtype_bytes": g.choice([2, 4])}
                _check_prediction(g, student, op, bandwidth, peak)
    with g.case(
        "on this GPU: your best-case times bound cuBLAS's measured times from below", points=1, gpu_only=True
    ):
        from labkernels.roofline import measure_matmul_peak

        bandwidth, peak = g.copy_bandwidth(), measure_matmul_peak(torch.bfloat16)
        for m, n, k in [(8192, 8192, 16), (8192, 8192, 8192), (100, 4096, 10), (3000, 5000, 1000)]:
            op = {"kind": "gemm", "m": m, "n": n, "k": k, "dtype_bytes": 2}
            bound, ms = student(dict(op), bandwidth, peak)
            a, b = g.randn(m, k, dtype=torch.bfloat16), g.randn(k, n, dtype=torch.bfloat16)
            measured = timing.time_ms(lambda a=a, b=b: a @ b)
            g.expect(
                ms <= BOUND_MARGIN * measured,
                f"{m}x{n}x{k}: you predict {ms:.4f} ms, cuBLAS took {measured:.4f}",
            )
            g.expect(bound == _closed_form(op, bandwidth, peak)[0], f"{m}x{n}x{k}: wrong verdict {bound!r}")


# --- 4.2: split-K ------------------------------------------------------------------------------------------


def _odd(g, low: int, high: int) -> int:
    n = g.randint(low, high)
    return n if n % 2 else n + 1


def _fold(partials: torch.Tensor) -> torch.Tensor:
    total = partials[0].clone()
    for p in partials[1:]:  # s = 1, 2, ... in order: the order fixes every rounding
        total = total + p
    return total


@exercise("4.2", "Split-K: partial products and their fixed-order reduction", points=4, timeout_s=120)
def _grade_4_2(student, g):
    # student(a, b, splits) -> (partials (splits, M, N) float32, c (M, N) float32)
    def one(m, n, k, splits, dtype):
        a, b = g.randn(m, k, dtype=dtype), g.randn(k, n, dtype=dtype)
        got = student(a, b, splits)
        if not (isinstance(got, tuple | list) and len(got) == 2):
            raise CaseFailed(f"return (partials, c), got {type(got).__name__}")
        partials, c = got
        g.expect(isinstance(partials, torch.Tensor), "partials must be a tensor")
        g.expect(tuple(partials.shape) == (splits, m, n), f"partials shape {tuple(partials.shape)}")
        g.expect(partials.dtype == torch.float32 and c.dtype == torch.float32, "accumulate in float32")
        chunk = -(-k // splits)
        for s in range(splits):
            ks = slice(s * chunk, min(k, (s + 1) * chunk))
            want = a[:, ks].double() @ b[ks, :].double()
            g.check_close(partials[s], want, atol=1e-3 * math.sqrt(chunk + 1), rtol=1e-3)
        g.check_close(c, a.double() @ b.double(), atol=2e-3 * math.sqrt(k), rtol=1e-3)
        g.expect(
            torch.equal(c.cpu(), _fold(partials.cpu())),
            "c is not the partials summed in order s = 0, 1, 2, ...: not bitwise reproducible",
        )

    with g.case("odd K that the split does not divide", points=1):
        one(g.randint(3, 70), g.randint(3, 70), _odd(g, 101, 999), g.choice([2, 4, 6, 8]), torch.float32)
    with g.case("more splits than fit: some chunks are shorter (or empty)", points=1):
        k = _odd(g, 3, 15)
        one(g.randint(3, 40), g.randint(3, 40), k, k + g.randint(1, 5), torch.float32)
    with g.case("float16 inputs, float32 partials", points=1):
        one(g.randint(3, 70), g.randint(3, 70), _odd(g, 101, 999), 3, torch.float16)
    with g.case("one split is a plain matmul", points=1):
        one(g.randint(3, 70), g.randint(3, 70), _odd(g, 11, 99), 1, torch.float32)


# --- 4.3: implicit GEMM index math -------------------------------------------------------------------------


def _tap_table(batch, height, width, channels, r, stride, padding) -> torch.Tensor:
    """For every (n, c·R·S + r·S + s, p·Q + q): the flat NHWC offset of the input element that filter tap
    reads, or -1 where it reads padding. Built by torch's unfold on a tensor holding its own offsets."""
    offsets = torch.arange(batch * height * width * channels, dtype=torch.float64)
    x = offsets.view(batch, height, width, channels).permute(0, 3, 1, 2)  # NCHW view of NHWC memory
    padded = torch.nn.functional.pad(x, (padding,) * 4, value=-1.0)
    return torch.nn.functional.unfold(padded, r, stride=stride).long()


@exercise("4.3", "Implicit GEMM: the NHWC input offset of a filter tap", points=3, timeout_s=60)
def _grade_4_3(student, g):
    # student(n, p, q, r, s, c, H, W, C, stride, padding) -> flat offset into NHWC input, or -1 for padding
    def shape_cases(count, paddings, strides):  # (lowest, highest) of each: a case's shapes are what it names
        for _ in range(count):
            kernel = g.choice([1, 3, 5])
            padding, stride = g.randint(*paddings), g.randint(*strides)
            batch, channels = g.randint(1, 3), g.randint(1, 7)
            height, width = g.randint(kernel, 13), g.randint(kernel, 13)
            if height + 2 * padding < kernel or width + 2 * padding < kernel:
                continue
            yield batch, height, width, channels, kernel, stride, padding

    def check_all(batch, height, width, channels, kernel, stride, padding):
        table = _tap_table(batch, height, width, channels, kernel, stride, padding)
        out_w = (width + 2 * padding - kernel) // stride + 1
        for _ in range(60):
            n, col = g.randint(0, batch - 1), g.randint(0, table.shape[2] - 1)
            row = g.randint(0, table.shape[1] - 1)
            c, rs = divmod(row, kernel * kernel)
            r, s = divmod(rs, kernel)
            p, q = divmod(col, out_w)
            got = student(n, p, q, r, s, c, height, width, channels, stride, padding)
            want = int(table[n, row, col])
            g.expect(
                got == want,
                f"H={height} W={width} C={channels} R=S={kernel} stride={stride} padding={padding}: "
                f"tap (n={n}, p={p}, q={q}, r={r}, s={s}, c={c}) gave {got}, expected {want}",
            )

    with g.case("stride 1, no padding", points=1):
        for shape in shape_cases(6, (0, 0), (1, 1)):
            check_all(*shape)
    with g.case("padding: taps outside the image read nothing (-1)", points=1):
        for shape in shape_cases(6, (1, 2), (1, 1)):
            check_all(*shape)
    with g.case("stride 2 and 3 with padding", points=1):
        for shape in shape_cases(8, (1, 2), (2, 3)):
            check_all(*shape)


# --- 4.4: choose the settings ------------------------------------------------------------------------------

TASKS = {
    "training": {"shapes_change": False, "max_rel_err": 1e-2},
    "variable_batch_inference": {"shapes_change": True, "max_rel_err": 1e-2},
    "float32_reference": {"shapes_change": False, "max_rel_err": 1e-5},
}
PRECISIONS = ("float32", "tf32", "float16", "bfloat16")
# Slack over the fastest allowed setting: enough for run-to-run noise and near-ties between layouts, far
# less than what a wrong precision (several x) or NCHW at 16 bits costs on an H200.
SPEED_MARGIN = 1.4


def _settings(g, student, task: str, spec: dict | None = None) -> dict:
    got = student(task, dict(TASKS[task] if spec is None else spec))
    g.expect(isinstance(got, dict), f"{task}: return a dict, got {type(got).__name__}")
    want = {"precision", "channels_last", "cudnn_benchmark"}
    g.expect(set(got) == want, f"{task}: keys must be {sorted(want)}, got {sorted(got)}")
    g.expect(got["precision"] in PRECISIONS, f"{task}: precision must be one of {PRECISIONS}")
    g.expect(all(isinstance(got[k], bool) for k in ("channels_last", "cudnn_benchmark")), "flags are bools")
    return got


def _prepare(settings: dict, x: torch.Tensor, w: torch.Tensor):
    """The inputs in the dtype and layout `settings` ask for (TF32 emulated by rounding off the GPU)."""
    from labkernels.ch04_libraries.libraries import round_to_tf32

    precision = settings["precision"]
    fmt = torch.channels_last if settings["channels_last"] else torch.contiguous_format
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(precision, torch.float32)
    x, w = x.to(dtype).contiguous(memory_format=fmt), w.to(dtype).contiguous(memory_format=fmt)
    if precision == "tf32" and LANE != "gpu":
        x, w = round_to_tf32(x), round_to_tf32(w)
    return x, w


def _conv(settings: dict, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A 3x3 convolution of prepared inputs with the cuDNN flags `settings` ask for."""
    from labkernels.ch04_libraries.libraries import cudnn_conv_precision

    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = settings["cudnn_benchmark"]
    try:
        with cudnn_conv_precision("tf32" if settings["precision"] == "tf32" else "ieee"):
            return torch.nn.functional.conv2d(x, w, padding=1)
    finally:
        torch.backends.cudnn.benchmark = old


def _timed_conv(settings: dict, x: torch.Tensor, w: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(relative error, median ms) of the convolution run as `settings` say."""
    xs, ws = _prepare(settings, x, w)
    err = _rel_err(_conv(settings, xs, ws), exact)
    return err, timing.time_ms(functools.partial(_conv, settings, xs, ws))


def _rel_err(out: torch.Tensor, exact: torch.Tensor) -> float:
    return float((out.double() - exact).norm() / exact.norm())


# The chapter's H200 table (ch04_cudnn): the layout rows at the shape the GPU speed case runs, and the rows
# of cudnn.benchmark's first calls and steady state. On the CPU lane they decide what "fast" means.
TABLE_SHAPE = {"batch": 32, "channels": 128, "size": 28}


def _h200_layout_ms() -> dict[tuple[str, bool], float]:
    """(precision, channels_last) -> the H200's ms for the 3x3 convolution at TABLE_SHAPE."""
    from labkernels.results import load_reference

    rows = load_reference("ch04_cudnn").where(kind="layout", **TABLE_SHAPE).rows
    return {(r["precision"], r["layout"] == "channels_last"): float(r["ms"]) for r in rows}


def _h200_benchmark_pays(shapes_change: bool) -> bool:
    """Whether the table says cudnn.benchmark pays: with changing shapes, the cost of a new shape's first call
    (the search, every shape); with fixed shapes, the steady state (the search is paid once)."""
    from labkernels.results import load_reference

    table = load_reference("ch04_cudnn")
    kind, column = ("changing_shapes", "first_ms") if shapes_change else ("first_call", "steady_ms")
    rows = table.where(kind=kind).rows
    on = sum(float(r[column]) for r in rows if str(r["benchmark"]) == "True")
    off = sum(float(r[column]) for r in rows if str(r["benchmark"]) == "False")
    return on < off


def _fresh_tasks(g) -> list[tuple[str, dict]]:
    """Workloads drawn now: both kinds of shapes, and both a tolerance a 16-bit format meets (1e-2 to 5e-2)
    and one only IEEE fp32 meets (1e-5 to 3e-5), so that no constant answer is right for all of them."""
    tasks = []
    for shapes_change in (False, True):
        for exponent in (g.randint(-200, -130), g.randint(-500, -450)):
            max_rel_err = float(f"{10 ** (exponent / 100):.2g}")
            name = f"{'changing' if shapes_change else 'fixed'}_shapes_err_{max_rel_err:.0e}"
            tasks.append((name, {"shapes_change": shapes_change, "max_rel_err": max_rel_err}))
    g.random.shuffle(tasks)
    return tasks


def _errors(g, settings: dict, max_rel_err: float) -> dict[tuple[str, bool], float]:
    """Measured here: the relative error of every (precision, layout), and of `settings`, on fresh inputs;
    `settings`' must be within the task's tolerance. On the GPU at the table's shape: cuDNN picks its
    algorithm per shape, and at a small one its "TF32" convolution met 1e-5 on the H200 (no tensor cores)
    while the table times TF32 tensor cores: the error must belong to the setting that was timed."""
    batch, channels, side = size(cpu=(2, 32, 14), gpu=tuple(TABLE_SHAPE.values()))
    x, w = g.randn(batch, channels, side, side), g.randn(channels, channels, 3, 3) * 0.1
    exact = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    errors = {}
    for precision in PRECISIONS:
        for channels_last in (False, True):
            option = {"precision": precision, "channels_last": channels_last, "cudnn_benchmark": False}
            errors[(precision, channels_last)] = _rel_err(_conv(option, *_prepare(option, x, w)), exact)
    err = _rel_err(_conv(settings, *_prepare(settings, x, w)), exact)
    g.expect(err <= max_rel_err, f"{settings} gives relative error {err:.1e}, more than {max_rel_err:g}")
    return errors


def _judge_speed(g, name: str, task: dict, settings: dict) -> None:
    """Precision and layout: within SPEED_MARGIN of the fastest setting, in the H200 table, whose error
    measured here stays within the task's tolerance."""
    errors, h200 = _errors(g, settings, task["max_rel_err"]), _h200_layout_ms()
    allowed = {option: ms for option, ms in h200.items() if errors[option] <= task["max_rel_err"]}
    best = min(allowed, key=allowed.get)
    mine = h200[(settings["precision"], settings["channels_last"])]
    g.expect(
        mine <= SPEED_MARGIN * allowed[best],
        f"{name}: {settings['precision']}, {'channels_last' if settings['channels_last'] else 'NCHW'} took "
        f"{mine:.3f} ms on the H200 (the chapter's table); {best[0]}, "
        f"{'channels_last' if best[1] else 'NCHW'} stays within {task['max_rel_err']:g} and took "
        f"{allowed[best]:.3f} ms",
    )


def _judge_benchmark(g, name: str, task: dict, settings: dict) -> None:
    _errors(g, settings, task["max_rel_err"])
    want = _h200_benchmark_pays(task["shapes_change"])
    g.expect(
        settings["cudnn_benchmark"] == want,
        f"{name}: cudnn_benchmark={settings['cudnn_benchmark']}, but with shapes that "
        f"{'change' if task['shapes_change'] else 'stay fixed'} the chapter's H200 rows say it "
        f"{'pays' if want else 'costs'}",
    )


@exercise("4.4", "Choose the settings: precision, layout, cudnn.benchmark", points=3, speed_points=2)
def _grade_4_4(student, g):
    # student(task_name, task: dict) -> {"precision": ..., "channels_last": bool, "cudnn_benchmark": bool}
    # Every case asks about workloads that need different answers (a tolerance 16-bit meets and one it does
    # not; fixed and changing shapes), each drawn now: no constant answer earns a point.
    with g.case(
        "precision and layout: within the tolerance (measured), and within 1.4x of the fastest such setting "
        "in the chapter's H200 table; workloads drawn now",
        points=1,
    ):
        for name, task in _fresh_tasks(g):
            _judge_speed(g, name, task, _settings(g, student, name, task))
    with g.case(
        "cudnn.benchmark: on where the chapter's H200 rows say it pays (workloads drawn now)", points=1
    ):
        for name, task in _fresh_tasks(g):
            _judge_benchmark(g, name, task, _settings(g, student, name, task))
    with g.case("the chapter's three workloads: all three settings", points=1):
        for name, task in TASKS.items():
            settings = _settings(g, student, name, task)
            _judge_speed(g, name, task, settings)
            _judge_benchmark(g, name, task, settings)

    with g.case(
        "fixed shapes: within 1.4x of the fastest allowed setting (measured)", points=1, gpu_only=True
    ):
        for task in ("training", "float32_reference"):
            settings = _settings(g, student, task)
            x, w = g.randn(32, 128, 28, 28), g.randn(128, 128, 3, 3) * 0.1
            exact = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
            times = {}
            for precision in PRECISIONS:
                for channels_last in (False, True):
                    option = {"precision": precision, "channels_last": channels_last, "cudnn_benchmark": True}
                    err, ms = _timed_conv(option, x, w, exact)
                    if err <= TASKS[task]["max_rel_err"]:
                        times[(precision, channels_last)] = ms
            err, mine = _timed_conv(settings, x, w, exact)
            g.expect(err <= TASKS[task]["max_rel_err"], f"{task}: {settings} gives relative error {err:.1e}")
            best = min(times.values())
            g.expect(
                mine <= SPEED_MARGIN * best,
                f"{task}: {settings} takes {mine:.3f} ms; the best allowed, {best:.3f} ms",
            )
    with g.case("changing shapes: no search cost on every new shape (measured)", points=1, gpu_only=True):
        from labkernels.ch04_libraries.libraries import first_calls

        settings = _settings(g, student, "variable_batch_inference")
        batches = [g.randint(2, 40) for _ in range(6)]
        mine = first_calls([(8, 64, 56)], benchmark=settings["cudnn_benchmark"], changing=batches)
        plain = first_calls([(8, 64, 56)], benchmark=False, changing=batches)
        g.expect(
            mine["changing_ms"] <= 1.5 * plain["changing_ms"],
            f"six new shapes took {mine['changing_ms']:.1f} ms with your settings, "
            f"{plain['changing_ms']:.1f} ms without cudnn.benchmark",
        )


# --- 4.5: the split-K reduction, a Triton kernel ----------------------------------------------------------


@exercise(
    "4.5", "Split-K's fixed-order reduction as a Triton kernel", points=4, speed_points=2, timeout_s=180,
    requires="triton",
)  # fmt: skip
def _grade_4_5(student, g):
    # student(partials, c): partials (S, M, N) float32, contiguous; c (M, N) contiguous, float32 / float16
    # (bfloat16 on the GPU lane). Writes partials[0] + partials[1] + ... + partials[S-1], added in that order
    # in fp32, then cast to c's dtype: bitwise what `_fold` gives.
    def one(splits, m, n, dtype):
        partials = g.randn(splits, m, n)
        c = g.guarded_empty((m, n), dtype)
        student(partials, c)
        want = _fold(partials.cpu()).to(dtype)
        atol = 1e-5 * math.sqrt(splits) if dtype == torch.float32 else 2e-3 * math.sqrt(splits)
        g.check_close(c, partials.double().sum(0), atol=atol, rtol=1e-3)  # the right sum, whatever the order
        g.expect(torch.equal(c.cpu(), want), "c is not the partials added in order s = 0, 1, ..., then cast")

    rows = size(cpu=(3, 40), gpu=(100, 3000))
    with g.case("odd M and N, a few splits", points=1):
        # three or more: two partials added in either order give the same bits (a + b == b + a)
        one(g.randint(3, 8), _odd(g, *rows), _odd(g, 33, 700), torch.float32)
    with g.case("one split: the partial itself", points=1):
        one(1, _odd(g, *rows), _odd(g, 3, 700), torch.float32)
    with g.case("many splits (more than a block of them)", points=1):
        one(g.randint(17, 40), _odd(g, 3, 40), _odd(g, 3, 300), torch.float32)
    with g.case("a float16 output (summed in fp32, cast once)", points=1):
        one(g.randint(2, 8), _odd(g, *rows), _odd(g, 3, 700), torch.float16)
    with g.case("bandwidth >= 70% of copy: 8 splits of 4096 x 2048 into bfloat16", points=2, gpu_only=True):
        splits, m, n = 8, 4096, 2048
        partials = g.randn(splits, m, n)
        c = g.guarded_empty((m, n), torch.bfloat16)
        student(partials, c)

        def right(partials, c):
            g.check_close(c, _fold(partials.cpu()).to(torch.bfloat16).double(), atol=0, rtol=0)

        right(partials, c)
        nbytes = splits * m * n * 4 + m * n * 2  # read S x M x N fp32, write M x N bf16
        moved = traffic.Traffic("split-K reduction", nbytes, splits * m * n)
        g.expect_bandwidth(lambda: student(partials, c), moved, fraction=0.7, check=right)
