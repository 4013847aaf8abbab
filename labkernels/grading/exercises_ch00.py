"""Chapter 00 exercises: count bytes and FLOPs, place an op on the roofline, predict its best time."""

from __future__ import annotations

import torch

from labkernels import roofline, traffic
from labkernels.grading.core import exercise

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _op_cases(g):
    """(op, shape) pairs with fresh random sizes; weird (non-power-of-two) sizes on purpose."""
    n = g.randint(1000, 10_000_000)
    m, k, c = g.randint(1, 8192), g.randint(1, 8192), g.randint(1, 8192)
    return [
        ("copy", (n,)),
        ("add", (n,)),
        ("add_relu", (n,)),
        ("add_relu_unfused", (n,)),
        ("softmax", (m, c)),
        ("matmul", (m, c, k)),
    ]


def _expected(op: str, shape: tuple, dtype: torch.dtype) -> traffic.Traffic:
    if op == "add_relu_unfused":
        return traffic.add_relu(*shape, dtype, fused=False)
    return getattr(traffic, op)(*shape, dtype)


@exercise(
    "0.1",
    "Count the bytes and FLOPs of an op",
    points=6,
    forbids=("labkernels.traffic", "labkernels.roofline"),
)
def _grade_0_1(student, g):
    for op, _ in _op_cases(g):
        with g.case(f"{op}: bytes and FLOPs on random sizes and dtypes", points=1):
            for _ in range(5):
                shape = dict(_op_cases(g))[op]
                dtype = g.choice(DTYPES)
                want = _expected(op, shape, dtype)
                got = student(op, shape, dtype)
                g.expect(isinstance(got, tuple) and len(got) == 2, f"return (bytes, flops), got {got!r}")
                g.expect(
                    int(got[0]) == want.bytes, f"{op}{shape} {dtype}: bytes {got[0]}, expected {want.bytes}"
                )
                g.expect(
                    int(got[1]) == want.flops, f"{op}{shape} {dtype}: FLOPs {got[1]}, expected {want.flops}"
                )


def _random_machine(g):
    return g.randint(100, 8000) * 1.0, g.randint(1, 1000) * 1.0  # GB/s, TFLOP/s


@exercise(
    "0.2", "Memory-bound or compute-bound?", points=3, forbids=("labkernels.traffic", "labkernels.roofline")
)
def _grade_0_2(student, g):
    cases = [
        ("elementwise ops", ["copy", "add", "add_relu", "softmax"]),
        ("matmuls of every shape", ["matmul"]),
        ("ops near the ridge point", ["matmul"]),
    ]
    for name, ops in cases:
        with g.case(name, points=1):
            for _ in range(20):
                op = g.choice(ops)
                shape = dict(_op_cases(g))[op]
                t = _expected(op, shape, g.choice(DTYPES))
                bw, peak = _random_machine(g)
                if name.startswith("ops near"):  # put the machine's ridge within 2x of this op's intensity
                    peak = t.intensity * bw * 1e9 / 1e12 * g.choice([0.5, 0.8, 1.25, 2.0])
                want = roofline.bound(t, bw, peak)
                got = student(t.bytes, t.flops, bw, peak)
                g.expect(
                    got == want,
                    f"{t.bytes} bytes, {t.flops} FLOPs on {bw:g} GB/s, {peak:g} TFLOP/s: "
                    f"said {got!r}, it is {want!r}",
                )


@exercise(
    "0.3",
    "Predict an op's best possible time on a machine",
    points=3,
    forbids=("labkernels.traffic", "labkernels.roofline"),
)
def _grade_0_3(student, g):
    for name, ops in [
        ("memory-bound ops", ["copy", "add", "add_relu_unfused", "softmax"]),
        ("matmuls", ["matmul"]),
        ("any op, any machine", ["add", "matmul", "softmax"]),
    ]:
        with g.case(name, points=1):
            for _ in range(10):
                op = g.choice(ops)
                shape, dtype = dict(_op_cases(g))[op], g.choice(DTYPES)
                bw, peak = _random_machine(g)
                want = roofline.best_time_ms(_expected(op, shape, dtype), bw, peak)
                got = student(op, shape, dtype, bw, peak)
                g.expect(isinstance(got, int | float), f"return a number of milliseconds, got {got!r}")
                g.expect(
                    abs(got - want) <= 1e-6 * want,
                    f"{op}{shape} {dtype} on {bw:g} GB/s, {peak:g} TFLOP/s: {got} ms, expected {want:.6g} ms",
                )
