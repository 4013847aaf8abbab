"""Instructions a thread in online_softmax's kernels, compiled for sm_90 (an H100/H200) on any machine.

Compiles the whole-row prefetch kernels (one 16-bit element a register, and 32-bit words of two) and the
split kernel for sm_90, disassembles them with the cuobjdump bundled with Triton, and counts the SASS
instructions of each, with ptxas's register count: what `ch06_softmax_sass.csv` records and notebook 06 reads.
A static count (every instruction once, loops once), so it compares kernels of one shape, not run times.

    python experiments/softmax_sass.py [labkernels/reference/ch06_softmax_sass.csv]
"""

import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU: no interpreter, so no labkernels lane yet

import torch  # noqa: E402

torch.cuda.is_available = lambda: True  # labkernels picks the GPU lane; nothing here launches a kernel
import triton  # noqa: E402
from sm90 import compile_sm90, compiled_meta, opcodes, sass_and_ptxas, write_reference  # noqa: E402

from labkernels.ch06_attention import online_softmax as osm  # noqa: E402

FIELDS = ["device", "torch", "triton", "cuda", "date", "git", "kernel", "dtype", "block_size", "num_warps",
          "elements_per_thread", "instructions", "instructions_per_element", "registers", "mufu", "prmt"]  # fmt: skip
KERNELS = {
    "prefetch": osm._prefetch_rows_kernel,
    "prefetch_words": osm._prefetch_words_kernel,
    "split": osm._split_row_kernel,
}
CASES = [  # (kernel, dtype, block, warps)
    ("prefetch", "bf16", 32768, 16),
    ("prefetch_words", "bf16", 32768, 16),
    ("prefetch", "bf16", 32768, 32),
    ("prefetch_words", "bf16", 32768, 32),
    ("split", "bf16", 8192, 4),
    ("split", "fp32", 8192, 4),
]


def signature(kernel: str, dtype: str) -> dict:
    sig = {"out_ptr": f"*{dtype}", "x_ptr": f"*{dtype}"}
    if kernel == "split":
        sig |= {"stats_ptr": "*fp32", "sync_ptr": "*i32"}
    else:
        sig |= {"n_rows": "i32"}
    return sig | {"n_col_vecs": "i32", "x_row_vecs": "i32", "out_row_vecs": "i32"}


def constexprs(kernel: str, dtype: str, block: int) -> dict:
    vec = 8 if dtype == "bf16" else 4
    consts = {"BLOCK_SIZE": block, "VEC": vec}
    if kernel == "split":
        consts |= {"CHUNKS": 32, "MAX_SPIN": osm.MAX_SPIN}
    if kernel == "prefetch_words":
        consts |= {"NEG_INF": osm.NEG_INF_WORD[torch.bfloat16], "PTX": True}
    return consts


def sass_and_registers(ptx: str) -> tuple[str, int]:
    sass, info = sass_and_ptxas(ptx)
    return sass, int(re.search(r"Used (\d+) registers", info).group(1))


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else "labkernels/reference/ch06_softmax_sass.csv"
    meta = compiled_meta()
    rows = []
    for kernel, dtype, block, warps in CASES:
        ptx = compile_sm90(KERNELS[kernel], signature(kernel, dtype), constexprs(kernel, dtype, block), warps)
        sass, registers = sass_and_registers(ptx)
        ops = opcodes(sass)
        per_thread = block // (32 * warps)
        total = sum(ops.values())
        rows.append(meta | dict(kernel=kernel, dtype=dtype, block_size=block, num_warps=warps,
                                elements_per_thread=per_thread, instructions=total,
                                instructions_per_element=round(total / per_thread, 2), registers=registers,
                                mufu=ops["MUFU"], prmt=ops["PRMT"]))  # fmt: skip
        print(rows[-1])
    write_reference(path, FIELDS, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
