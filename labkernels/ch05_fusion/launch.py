"""Host cost per call: what a call costs on the CPU before any GPU work, and where it goes.

A GPU kernel of a few KB finishes in a few microseconds; launching it from Python costs more. At small sizes
the host, not HBM, sets the pace, and fusion's byte savings are invisible. `host_rows` measures the cost per
call (`labkernels.timing.host_us`: back-to-back calls on tiny inputs, no wait for the GPU) of the same op
four ways: eager torch (one launch per op), torch.compile (one launch for the fused kernel, plus guards and a
Python wrapper), torch.compile with `mode="reduce-overhead"` (the whole graph replayed as a CUDA graph: one
launch from the host, whatever the number of kernels), and the labkernels kernel (for a key seen before, a
dict lookup, an allocation and a cached launcher: `labkernels.launch_cache`). `breakdown_rows` takes the
labkernels call apart step by step.
"""

from __future__ import annotations

import torch
import triton

from labkernels import launch_cache, timing
from labkernels.ch03_triton.vector_add import check_elementwise
from labkernels.ch05_fusion import pointwise
from labkernels.lane import DEVICE, on_gpu


def _compiled(fn, **options):
    torch._dynamo.reset()
    return torch.compile(fn, **options)


def host_rows(n: int = 4096, calls: int = 2000) -> list[dict]:
    """Host µs per call of mul_add_sigmoid and the 15-op chain, four ways each, plus chapter 03's softmax and
    matmul beside torch's. GPU lane (reduce-overhead needs CUDA graphs)."""
    if not on_gpu():
        raise RuntimeError("host_rows measures GPU launches: it needs the GPU lane")
    from labkernels.ch03_triton.matmul import matmul
    from labkernels.ch03_triton.softmax import softmax

    x, a, b = (torch.randn(n, device=DEVICE) for _ in range(3))
    cases = {
        "mul_add_sigmoid": (pointwise.reference_mul_add_sigmoid, lambda: pointwise.mul_add_sigmoid(x, a, b)),
        "chain, 15 ops": (
            lambda x, a, b: pointwise.reference_chain(x, a, 15),
            lambda: pointwise.chain(x, a, 15),
        ),
    }
    rows = []
    for op, (eager, hand) in cases.items():
        impls = {"eager": lambda eager=eager: eager(x, a, b)}
        for label, options in (("compile", {}), ("compile reduce-overhead", {"mode": "reduce-overhead"})):
            compiled = _compiled(eager, **options)
            impls[label] = lambda compiled=compiled: compiled(x, a, b)
        impls["labkernels"] = hand
        for impl, fn in impls.items():
            rows.append({"op": op, "n": n, "impl": impl, "host_us": timing.host_us(fn, calls=calls)})
    s = torch.randn(64, 256, device=DEVICE)
    ma, mb = (torch.randn(64, 64, device=DEVICE, dtype=torch.float16) for _ in range(2))
    pairs = {
        "softmax": {"labkernels": lambda: softmax(s), "torch": lambda: torch.softmax(s, dim=-1)},
        "matmul": {"labkernels": lambda: matmul(ma, mb), "torch": lambda: ma @ mb},
    }
    for op, impls in pairs.items():
        for impl, fn in impls.items():
            rows.append({"op": op, "n": s.numel() if op == "softmax" else 64, "impl": impl,
                         "host_us": timing.host_us(fn, calls=calls)})  # fmt: skip
    return rows


def breakdown_rows(n: int = 4096, calls: int = 2000) -> list[dict]:
    """The labkernels mul_add_sigmoid call, step by step: the checks a key's first call (or any call with
    out=) makes, the allocation, Triton's launch of the jitted kernel, and whole calls: of a known key (a
    cached thin launcher), of a known key with thin launches off, and with out=. Each step is timed on its
    own, back to back."""
    x, a, b = (torch.randn(n, device=DEVICE) for _ in range(3))
    out = torch.empty_like(x)
    block, warps, int64 = pointwise.launch_config(n)
    grid = (triton.cdiv(n, block),)
    kernel = pointwise._mul_add_sigmoid_kernel

    def launch_only():
        kernel[grid](x, a, b, out, n, BLOCK_SIZE=block, INT64=int64, num_warps=warps)

    steps = {
        "input checks (check_elementwise)": lambda: check_elementwise("mul_add_sigmoid", x, a, b),
        "input checks with out= (adds the overlap check)": lambda: check_elementwise(
            "mul_add_sigmoid", x, a, b, out=out
        ),
        "allocate the output (torch.empty_like)": lambda: torch.empty_like(x),
        "Triton launch (kernel[grid](...))": launch_only,
        "the whole call, a known key (cached thin launcher)": lambda: pointwise.mul_add_sigmoid(x, a, b),
        "the whole call, a known key, thin launches off": launch_cache.thin_off(
            lambda: pointwise.mul_add_sigmoid(x, a, b)
        ),
        "the whole call with out= (checked every time)": lambda: pointwise.mul_add_sigmoid(x, a, b, out=out),
        "eager torch, one op (torch.sigmoid)": lambda: torch.sigmoid(x),
    }
    times = launch_cache.host_us_per_step(steps, calls=calls)
    return [{"step": step, "host_us": us} for step, us in times.items()]
