"""Where the box kernel's wrong results fall (an experiment's reproducer; GPU only).

`conv_variants.py --tma` found `_conv_box_kernel` wrong in some runs and right in others, on the same
inputs, whichever way the descriptors are built (device or host), y is stored (TMA or pointers) or the
filters are laid out. This runs each listed config six times with its output poisoned (NaN) and prints,
per wrong run, how many outputs are off and where (images, rows h, columns w, channels k). The last case
is a control that passed every run.

    PYTHONPATH=$PWD python gpu_jobs/conv_box_diagnose.py
"""

import sys

import torch

import labkernels  # noqa: F401  (before triton: it sets the lane)

sys.path.insert(0, "gpu_jobs")
import conv_variants as cv  # noqa: E402

CASES = [
    ((32, 128, 28, 128, 3, 1, 1), (8, 4, 4, 128, 64, 3, 8)),
    ((32, 128, 28, 128, 3, 1, 1), (4, 4, 4, 128, 64, 3, 4)),
    ((32, 256, 14, 256, 3, 1, 1), (32, 2, 2, 256, 64, 3, 8)),
    ((32, 512, 7, 512, 3, 1, 1), (16, 1, 8, 256, 64, 3, 8)),
    ((32, 256, 14, 256, 3, 1, 1), (32, 1, 2, 256, 64, 4, 4)),  # passed: a control
]
torch.manual_seed(0)
for shape, tile in CASES:
    x, w, _, _, ref = cv.operands(shape, torch.float16)
    ref = ref.float()
    for kn in (False, True):
        for mode in (("host", True), ("host", False), ("device", True)):
            meta = cv._box_meta(shape, *tile, kn, *mode)
            call = cv.box_call(x, w, shape, meta)
            cv._empty = lambda *a, **k: torch.full(*a[:1], float("nan"), **k)
            fails = []
            for run in range(6):
                y = call().float()
                torch.cuda.synchronize()
                err = (y - ref).abs()
                bad = (err > 0.05 * ref.abs().max()) | y.isnan()
                if bad.any():
                    idx = bad.nonzero()
                    n_bad = bad.sum().item()
                    nan = y.isnan().sum().item()
                    imgs = idx[:, 0].unique().numel()
                    hs = idx[:, 1].unique().tolist()
                    ws = idx[:, 2].unique().tolist()
                    ks = idx[:, 3]
                    fails.append(
                        f"run{run}: {n_bad} bad ({nan} NaN) imgs {imgs} h {hs[:8]} w {ws[:8]} "
                        f"k {ks.min().item()}-{ks.max().item()} ({ks.unique().numel()} distinct)"
                    )
            tag = f"C={shape[1]} {cv._fmt_box(meta)}"
            print(tag, "OK" if not fails else f"{len(fails)}/6 wrong", flush=True)
            for f in fails[:3]:
                print("   ", f, flush=True)
