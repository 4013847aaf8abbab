"""Online softmax for wide rows with Hopper thread-block clusters (experiments/softmax_cluster.cu).

One cluster of C blocks a row; each block holds its chunk in registers, the blocks exchange (max, sum)
through distributed shared memory after a cluster barrier, and write exp(x - M) / L: read MN, write MN.
Measured against the shipped online_softmax (Triton; its split mode exchanges through global memory with
atomics and polling) and a same-size copy, every configuration checked against the fp64 reference with
the output poisoned first. The kernel is built here with nvcc alone (experiments/softmax_cluster.cu,
ctypes), not through the torch extension, so a run takes seconds to start.

    python experiments/softmax_cluster.py OUTDIR [--budget-s 170]   # GPU: table on stdout, OUTDIR/results.csv
"""

import argparse
import ctypes
import itertools
import os
import sys
import time

import softmax_lagged as lagged  # Case, Recorder, bench: the same measurement as the other experiments
import torch
import triton

DTYPE_TAG = {"float32": 0, "float16": 2, "bfloat16": 3}  # launch.h's Dtype
CASES = [(8192, 5000), (4096, 32768), (1024, 262144), (37, 100008)]


def build(out_dir: str, plain: bool) -> ctypes.CDLL:
    lib = os.path.join(out_dir, f"libsoftmax_cluster{'_plain' * plain}.so")
    flags = ("-DLK_SOFTMAX_PLAIN_ACCESS",) * plain  # plain loads and stores instead of the streaming hints
    done = lagged.nvcc_library("softmax_cluster.cu", lib, flags)
    with open(os.path.join(out_dir, f"ptxas{'_plain' * plain}.txt"), "w") as f:
        f.write(done.stdout + done.stderr)
    return ctypes.CDLL(lib)


def configs(row_vecs: int):
    """(cluster, threads, vecs_per_thread) that cover a row: threads a multiple of 32 from 64 to 1024."""
    out = []
    for cluster in (1, 2, 4, 8, 16):
        chunk = triton.cdiv(row_vecs, cluster)
        for vecs in (1, 2, 4, 8):
            threads = max(64, 32 * triton.cdiv(triton.cdiv(chunk, vecs), 32))
            if threads <= (512 if vecs == 8 else 1024):
                out.append((cluster, threads, vecs))
    return out


def launcher(lib, case, cluster, threads, vecs, persistent, x=None):
    x = case.x if x is None else x
    vec = 16 // x.element_size()
    tag = DTYPE_TAG[case.dtype]
    args = (ctypes.c_int(tag), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(case.out.data_ptr()),
            ctypes.c_longlong(x.shape[0]), ctypes.c_longlong(x.shape[1] // vec),
            ctypes.c_longlong(x.stride(0) // vec), ctypes.c_longlong(case.out.stride(0) // vec),
            ctypes.c_int(cluster), ctypes.c_int(threads), ctypes.c_int(vecs), ctypes.c_int(persistent))  # fmt: skip
    return lagged.ctypes_launch(lib.lk_softmax_cluster, args)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--budget-s", type=float, default=150)
    a = parser.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    libs = {"": build(a.out_dir, False), "plain_": build(a.out_dir, True)}
    from labkernels.ch06_attention import online_softmax as osm

    rec = lagged.Recorder(os.path.join(a.out_dir, "results.csv"))
    start = time.time()
    for rows, cols in CASES:
        for dtype in ("bfloat16", "float32", "float16"):
            if dtype == "float16" and cols != 262144:
                continue
            if time.time() - start > a.budget_s:
                print("budget spent", flush=True)
                break
            case = lagged.case_beside_shipped(rec, rows, cols, dtype)
            vec = 16 // case.x.element_size()
            for cluster, threads, vecs in configs(cols // vec):
                fits = libs[""].lk_active_clusters(DTYPE_TAG[dtype], cluster, threads, vecs)
                for (access, lib), persistent in itertools.product(libs.items(), (0, 1)):
                    cfg = f"cluster={cluster} threads={threads} vecs={vecs} resident={fits}"
                    variant = access + ("cluster_persistent" if persistent else "cluster")
                    rec.measure(case, variant, cfg, launcher(lib, case, cluster, threads, vecs, persistent))
            if rows == 37:  # strided rows: a view of every other row of a wider buffer
                wide = torch.randn(rows, cols + 64, device="cuda").to(getattr(torch, dtype))
                case.x = wide[:, :cols]
                case.ref = osm.reference(case.x.double())
                cluster, threads, vecs = configs(cols // vec)[-1]
                for persistent in (0, 1):
                    rec.measure(
                        case,
                        "strided" + "_persistent" * persistent,
                        f"cluster={cluster} threads={threads} vecs={vecs}",
                        launcher(libs[""], case, cluster, threads, vecs, persistent),
                    )
    rec.print_best()
    return 0


if __name__ == "__main__":
    sys.exit(main())
