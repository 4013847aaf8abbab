"""Where the box kernel's wrong results fall (an experiment's reproducer; GPU only).

`conv_variants.py --tma` found `_conv_box_kernel` wrong in some runs and right in others, on the same
inputs, whichever way the descriptors are built (device or host), y is stored (TMA or pointers) or the
filters are laid out. This runs each listed config eight times with its output poisoned (NaN), without and
with SYNC (acc used each step: the compiler then waits for the step's MMAs before the next step loads new
values into their register operand), and prints per wrong run how many outputs are off and where. On the
H200 (triton 3.6) the first four failed in some or all runs without SYNC and never with it. Last, the shipped
TF32 matmul with a row-major B (`splitk._swapped_k_major`, whose wgmma also takes an operand from registers)
is run eight times per shape: being deterministic, any run that differs from the first is a race.

    PYTHONPATH=$PWD python gpu_jobs/conv_box_diagnose.py            # GPU
    PYTHONPATH=$PWD python gpu_jobs/conv_box_diagnose.py --smoke    # CPU lane: the TF32 launch path only
"""

import sys

import torch

import labkernels  # noqa: F401  (before triton: it sets the lane)

sys.path.insert(0, "gpu_jobs")
import conv_variants as cv  # noqa: E402

CASES = [  # (shape, tile, filters K-major?, descriptors, TMA store?)
    ((32, 128, 28, 128, 3, 1, 1), (8, 4, 4, 128, 64, 3, 8), False, "host", True),
    ((32, 128, 28, 128, 3, 1, 1), (4, 4, 4, 128, 64, 3, 4), False, "device", True),
    ((32, 256, 14, 256, 3, 1, 1), (32, 2, 2, 256, 64, 3, 8), False, "host", True),
    ((32, 512, 7, 512, 3, 1, 1), (16, 1, 8, 256, 64, 3, 8), False, "host", True),
    # the fastest of the last run
    ((32, 64, 56, 64, 3, 1, 1), (4, 4, 8, 64, 64, 3, 4), True, "host", True),
    ((32, 128, 28, 128, 3, 1, 1), (4, 4, 4, 128, 64, 3, 4), True, "host", True),
    ((32, 256, 14, 256, 3, 1, 1), (32, 1, 2, 256, 128, 3, 4), False, "host", True),
    ((32, 512, 7, 512, 3, 1, 1), (16, 1, 4, 128, 128, 4, 4), True, "host", False),
]
RUNS = 8


def wrong_runs(call, ref) -> list[str]:
    cv._empty = lambda *a, **k: torch.full(*a[:1], float("nan"), **k)
    fails = []
    for run in range(RUNS):
        y = call().float()
        torch.cuda.synchronize()
        bad = ((y - ref).abs() > 0.05 * ref.abs().max()) | y.isnan()
        if bad.any():
            idx = bad.nonzero()
            fails.append(
                f"run{run}: {bad.sum().item()} bad ({y.isnan().sum().item()} NaN) in "
                f"{idx[:, 0].unique().numel()} images, k {idx[:, 3].unique().numel()} distinct"
            )
    cv._empty = torch.empty
    return fails


def conv_cases() -> None:
    for shape, tile, kn, descriptors, store_tma in CASES:
        x, w, _, _, ref = cv.operands(shape, torch.float16)
        ref = ref.float()
        for sync in (False, True):
            meta = cv._box_meta(shape, *tile, kn, descriptors, store_tma, sync)
            call = cv.box_call(x, w, shape, meta)
            fails = wrong_runs(call, ref)
            tag = f"C={shape[1]} {cv._fmt_box(meta)}" + (" sync" if sync else "")
            timing = "" if fails else f"  {cv.MODES['graph'](call) * 1e3:.1f} us (graph)"
            print(f"{tag:60} {len(fails)}/{RUNS} wrong{timing}", flush=True)
            for f in fails[:2]:
                print("   ", f, flush=True)


def _swapped_tf32(a, b, c, cfg) -> None:
    """C = A B computed as C^T = B^T A^T by `splitk._split_k_kernel` with one config, B^T from registers (as
    `splitk._swapped_k_major` launches it, without the autotuner)."""
    from labkernels.ch03_triton import matmul as ch03
    from labkernels.ch04_libraries import splitk

    (m, k), n = a.shape, b.shape[1]
    bt, at, ct = b.t(), a.t(), c.t()
    strides = (*bt.stride(), *at.stride(), *ct.stride())
    meta = cfg.all_kwargs() | {
        "INPUT_PRECISION": "tf32", "BIG": False, "A_VIA_REGISTERS": True, "MODE": "direct",
        "EVEN_K": k % cfg.kwargs["BLOCK_SIZE_K"] == 0, "ALIGN": ch03.row_alignment(m, strides),
    }  # fmt: skip
    grid = (splitk._tiles(n, m, meta), 1)
    splitk._split_k_kernel[grid](bt, at, ct, ct, n, m, k, splitk.split_chunk(k, 1), *strides, **meta)


def tf32_register_path(shapes, runs: int, configs=None) -> int:
    """The shipped TF32 matmul with a row-major B takes B^T from registers (`splitk._swapped_k_major`), and
    its K loop leaves MMAs pending across steps as the box kernel's did (compiled for sm_90: pendings = 3 at
    the end of a step). Deterministic, so every run must give the same bits: each config is launched `runs`
    times per shape, C poisoned each time. Returns the number of (shape, config) pairs with a bad run."""
    from labkernels.ch04_libraries import splitk

    device = labkernels.DEVICE
    bad_pairs = 0
    for m, n, k in shapes:
        a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        ref = (a.double() @ b.double()).float()
        for cfg in configs or splitk.K_MAJOR_CONFIGS:
            first, differ, wrong = None, 0, 0
            for _ in range(runs):
                c = torch.full((m, n), float("nan"), device=device)
                _swapped_tf32(a, b, c, cfg)
                if labkernels.on_gpu():
                    torch.cuda.synchronize()
                first = c.clone() if first is None else first
                differ += not torch.equal(c, first)
                wrong += bool(((c - ref).abs() > 0.05 * ref.abs().max()).any() or c.isnan().any())
            kw = cfg.kwargs
            tile = f"{kw['BLOCK_SIZE_M']}x{kw['BLOCK_SIZE_N']}x{kw['BLOCK_SIZE_K']}"
            name = f"{tile} s{cfg.num_stages} w{cfg.num_warps}"
            print(f"TF32 B^T from registers {m}x{n}x{k} {name}: {differ}/{runs} runs differ from the first, "
                  f"{wrong} wrong", flush=True)  # fmt: skip
            bad_pairs += bool(differ or wrong)
    return bad_pairs


if __name__ == "__main__":
    torch.manual_seed(0)
    if "--smoke" in sys.argv:  # the CPU lane: the TF32 launch path under the interpreter, tiny shapes
        from labkernels.ch04_libraries import splitk

        sys.exit(tf32_register_path([(37, 45, 96)], runs=2, configs=splitk.CPU_CONFIGS))
    conv_cases()
    shapes = [(4096, 4096, 4096), (3000, 5000, 1000), (1024, 1024, 1024), (4095, 257, 1537)]
    sys.exit(tf32_register_path(shapes, runs=20))
