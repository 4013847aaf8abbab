"""Chapter 05's pointwise kernels at other launch configs, against torch.compile (an experiment; GPU).

At 2^26 fp32 elements the hand-fused add+relu, mul-add-sigmoid and sin/cos kernels record 0.995-0.998 of
torch.compile's speed, both at the copy roofline. Does any (BLOCK_SIZE, num_warps) move that? Each config of
each kernel is launched directly (checked against the reference first), timed as the chapter's bench times
(`timing.time_ms`, L2 cleared), in ROUNDS alternating rounds beside compile and a same-size copy: the
median per config, as a ratio to compile's median.

    PYTHONPATH=$PWD python experiments/pointwise_blocks.py  # GPU; CSV to $OUT/pointwise/blocks.csv
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import os
import sys

import torch

import labkernels
import recording
import triton

from labkernels import timing
from labkernels.ch03_triton.add_relu import add_relu
from labkernels.ch05_fusion import horizontal, pointwise

N = 1 << 26
ROUNDS = 7
CONFIGS = [(512, 4), (1024, 4), (1024, 8), (2048, 4), (2048, 8), (4096, 4), (4096, 8), (8192, 8), (8192, 16)]


def launcher(op: str, tensors: dict, block: int, warps: int):
    grid = (triton.cdiv(N, block),)
    meta = {"BLOCK_SIZE": block, "INT64": False, "num_warps": warps}
    x, y, a, b, out, out2 = (tensors[k] for k in ("x", "y", "a", "b", "out", "out2"))
    if op == "add_relu":
        return lambda: add_relu(x, y, out, block_size=block, num_warps=warps)
    if op == "mul_add_sigmoid":
        return lambda: pointwise._mul_add_sigmoid_kernel[grid](x, a, b, out, N, **meta)
    return lambda: horizontal._sincos_kernel[grid](x, out, out2, N, **meta)


def main() -> int:
    if not labkernels.on_gpu():
        print("pointwise_blocks: needs the GPU lane")
        return 1
    out_dir = os.path.join(os.environ.get("OUT", "/tmp"), "pointwise")
    os.makedirs(out_dir, exist_ok=True)
    meta = recording.versioned()
    t = {k: torch.randn(N, device="cuda") for k in ("x", "y", "a", "b")}
    t |= {"out": torch.empty(N, device="cuda"), "out2": torch.empty(N, device="cuda")}
    references = {
        "add_relu": (lambda x, y: torch.relu(x + y), ("x", "y")),
        "mul_add_sigmoid": (pointwise.reference_mul_add_sigmoid, ("x", "a", "b")),
        "sincos": (horizontal.reference, ("x",)),
    }
    src, dst = torch.empty(N * 3 // 2, device="cuda"), torch.empty(N * 3 // 2, device="cuda")
    rows, failures = [], 0
    for op, (ref_fn, names) in references.items():
        args = [t[k] for k in names]
        compiled = torch.compile(ref_fn)
        calls = {"compile": lambda c=compiled, a=args: c(*a), "copy(4n)": lambda: dst.copy_(src)}
        expect = ref_fn(*args)
        expect = expect if isinstance(expect, tuple) else (expect,)
        for block, warps in CONFIGS:
            run = launcher(op, t, block, warps)
            t["out"].fill_(float("nan"))
            t["out2"].fill_(float("nan"))
            run()
            got = (t["out"], t["out2"])[: len(expect)]
            ok = all(torch.allclose(g, e, rtol=1e-5, atol=1e-6) for g, e in zip(got, expect, strict=True))
            failures += not ok
            calls[f"{block}/{warps}{'' if ok else ' WRONG'}"] = run
        for call in calls.values():
            call()  # compiles and warms up outside the timed rounds
        timed = recording.alternating_medians(calls, ROUNDS, timing.time_ms)
        base = timed["compile"][0]
        for name, (med, spread) in timed.items():
            rows.append(meta | {"op": op, "elements": N, "dtype": "float32", "impl": name, "ms": med,
                                "vs_compile": base / med, "spread": spread})  # fmt: skip
            print(
                f"{op:16s} {name:14s} {med * 1e3:8.1f} us  {base / med:.4f} x compile  spread {spread:.3f}",
                flush=True,
            )
    recording.write_csv(f"{out_dir}/blocks.csv", rows)
    return int(failures > 0)


if __name__ == "__main__":
    sys.exit(main())
