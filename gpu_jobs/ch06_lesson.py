"""Chapter 06 on the H200, after issue 48: this chapter's attention against SDPA's FLASH and cuDNN backends,
forward and forward + backward, at the four shapes of ch06_attention.csv (B=4, H=16, N=4096, D 64/128, causal
or not, bfloat16), timed in alternating rounds (`timing.alternating_ms`: each round times every implementation
once, so the clock's drift with power draw is shared). Every implementation's output is checked against fp32
SDPA math before it is timed. Writes OUTDIR/ch06_lesson.csv and prints the table.

    python gpu_jobs/ch06_lesson.py OUTDIR
"""

import sys

import torch
import torch.nn.functional as F

from labkernels import results, timing, traffic
from labkernels.ch06_attention import flash_attention as fa

SHAPES = [(4, 16, 4096, d, c) for d in (64, 128) for c in (False, True)]
BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}


def _sdpa(backend, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v):
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def shape_rows(batch, heads, seq, head_dim, causal, rounds):
    shape = (batch, heads, seq, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    impls = {"labkernels": lambda q, k, v: fa.flash_attention(q, k, v, causal=causal)}
    impls |= {name: _sdpa(backend, causal) for name, backend in BACKENDS.items()}
    want = _sdpa("MATH", causal)(q.float(), k.float(), v.float())
    errors = {}
    for name, fn in impls.items():  # checked (and tuned) before anything is timed
        got = fn(q, k, v)
        errors[name] = (got.float() - want).abs().max().item()
        got.backward(grad)
    with torch.no_grad():
        fwd = timing.alternating_ms(
            {n: (lambda fn=fn: fn(q, k, v)) for n, fn in impls.items()}, rounds=rounds
        )
    both = timing.alternating_ms(
        {n: (lambda fn=fn: fn(q, k, v).backward(grad)) for n, fn in impls.items()}, rounds=rounds
    )
    flops = traffic.flash_attention(*shape, torch.bfloat16, causal=causal).flops
    rows = []
    for name in impls:
        row = {
            "batch": batch,
            "heads": heads,
            "seq": seq,
            "head_dim": head_dim,
            "causal": causal,
            "impl": name,
        }
        row |= {"max_err_vs_math": errors[name], "fwd_ms": fwd[name], "fwd_bwd_ms": both[name]}
        row |= {
            "fwd_tflops": timing.tflops(flops, fwd[name]),
            "fwd_bwd_tflops": timing.tflops(3.5 * flops, both[name]),
        }
        row |= {"fwd_vs_flash": fwd["sdpa_flash"] / fwd[name], "fwd_vs_cudnn": fwd["sdpa_cudnn"] / fwd[name]}
        row |= {
            "fwd_bwd_vs_flash": both["sdpa_flash"] / both[name],
            "fwd_bwd_vs_cudnn": both["sdpa_cudnn"] / both[name],
        }
        rows.append(row)
    return rows


def main(out_dir: str, rounds: int = 5) -> None:
    print(
        f"{'D':>4} {'causal':>6} {'impl':>11} {'err':>8} {'fwd ms':>8} {'x FLASH':>8} {'x cuDNN':>8} "
        f"{'f+b ms':>8} {'x FLASH':>8} {'x cuDNN':>8}",
        flush=True,
    )
    rows = []
    for shape in SHAPES:  # each shape's rows printed as they come: a run cut off still shows what it measured
        rows += shape_rows(*shape, rounds)
        for r in rows[-len(BACKENDS) - 1 :]:
            print(
                f"{r['head_dim']:>4} {r['causal']!s:>6} {r['impl']:>11} {r['max_err_vs_math']:8.4f} "
                f"{r['fwd_ms']:8.3f} {r['fwd_vs_flash']:8.2f} {r['fwd_vs_cudnn']:8.2f} "
                f"{r['fwd_bwd_ms']:8.3f} {r['fwd_bwd_vs_flash']:8.2f} {r['fwd_bwd_vs_cudnn']:8.2f}",
                flush=True,
            )
    print("wrote", results.record("ch06_lesson", rows, out_dir, replace=True))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out")
