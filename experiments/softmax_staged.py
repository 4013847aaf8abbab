"""Online softmax for wide rows, split over blocks that stage their chunk in shared memory (an experiment).

softmax_staged.cu says why: the shipped split kernel holds its chunk in registers, so few blocks fit
an SM and the wait for a row's other chunks leaves its loads idle; staged in shared memory the chunk leaves
the registers free and more blocks keep loading. Measured against the shipped online_softmax and a same-size
copy, each configuration checked against the fp64 reference with the output poisoned first (softmax_lagged's
Case and Recorder). Built with nvcc alone and loaded with ctypes, as softmax_cluster.py.

    python experiments/softmax_staged.py OUTDIR [--budget-s 120]   # GPU: table on stdout, OUTDIR/results.csv
    python experiments/softmax_staged.py --build-only OUTDIR       # no GPU: nvcc and ptxas's register counts
"""

import argparse
import ctypes
import os
import sys
import time

import softmax_lagged as lagged  # Case, Recorder, bench: the same measurement as the other experiments
import torch

CASES = [(1024, 262144), (4096, 32768)]
CHUNK_ELEMENTS = (4096, 8192, 16384, 32768)
THREADS = (128, 256, 512)
MAX_SPIN = 1 << 16


def build(out_dir: str) -> str:
    lib = os.path.join(out_dir, "libsoftmax_staged.so")
    done = lagged.nvcc_library("softmax_staged.cu", lib)
    print("\n".join(line for line in done.stderr.splitlines() if "Used" in line), flush=True)  # registers
    return lib


def launcher(lib, case, chunk_vecs: int, threads: int):
    x, out = case.x, case.out
    vec = 16 // x.element_size()
    chunks = -(-(x.shape[1] // vec) // chunk_vecs)
    stats = torch.empty(x.shape[0] * chunks * 2, device="cuda", dtype=torch.float32)
    sync = torch.empty(1 + x.shape[0], device="cuda", dtype=torch.int32)  # zeroed by each launch
    args = (ctypes.c_int(0 if x.dtype == torch.float32 else 3), ctypes.c_void_p(x.data_ptr()),
            ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(stats.data_ptr()),
            ctypes.c_void_p(sync.data_ptr()),
            ctypes.c_longlong(x.shape[0]), ctypes.c_longlong(x.shape[1] // vec),
            ctypes.c_longlong(x.stride(0) // vec), ctypes.c_longlong(out.stride(0) // vec),
            ctypes.c_int(chunk_vecs), ctypes.c_int(threads), ctypes.c_int(MAX_SPIN))  # fmt: skip
    return lagged.ctypes_launch(lib.lk_softmax_staged, args)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--budget-s", type=float, default=120)
    parser.add_argument("--build-only", action="store_true")
    a = parser.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    path = build(a.out_dir)
    if a.build_only:
        return 0
    lib = ctypes.CDLL(path)

    rec = lagged.Recorder(os.path.join(a.out_dir, "results.csv"))
    start = time.time()
    for rows, cols in CASES:
        for dtype in ("bfloat16", "float32"):
            if time.time() - start > a.budget_s:
                print("budget spent", flush=True)
                break
            case = lagged.case_beside_shipped(rec, rows, cols, dtype)
            vec = 16 // case.x.element_size()
            for elements in CHUNK_ELEMENTS:
                chunk_vecs = elements // vec
                if cols // elements > 64:
                    continue  # the shipped kernel's limit on chunks a row, too
                for threads in THREADS:
                    fits = lib.lk_staged_resident(0 if dtype == "float32" else 3, chunk_vecs, threads)
                    cfg = f"chunk={elements} threads={threads} resident/SM={fits}"
                    rec.measure(case, "staged", cfg, launcher(lib, case, chunk_vecs, threads))
    rec.print_best()
    return 0


if __name__ == "__main__":
    sys.exit(main())
