"""Instructions a thread in chapter 03's matmul per epilogue, compiled for sm_90 (an H100/H200) anywhere.

Compiles the tiled matmul kernel (bf16, the tile the autotuner keeps at 4096^3, in 3 and 4 stages) with
each epilogue: none, bias, bias + ReLU, bias + GELU through tl.erf (what activation="gelu" runs) and bias +
the 16-bit GELU polynomial (`_gelu_for_16_bit`, ACTIVATION="gelu_poly"). Disassembles each with the
cuobjdump bundled with Triton and records the SASS instruction count, the extra instructions an element of
the C tile over the same kernel without an epilogue, ptxas's registers and spill bytes: what
`ch05_epilogue_sass.csv` records and notebook 05 reads. A static count (each instruction once; the epilogue
runs once a tile, so its count is what each thread executes there).

    python experiments/epilogue_sass.py [labkernels/reference/ch05_epilogue_sass.csv]
"""

import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU: no interpreter, so no labkernels lane yet

import torch  # noqa: E402

torch.cuda.is_available = lambda: True  # labkernels picks the GPU lane; nothing here launches a kernel
from sm90 import compile_sm90, compiled_meta, opcodes, sass_and_ptxas, write_reference  # noqa: E402

from labkernels.ch03_triton import matmul  # noqa: E402

FIELDS = ["device", "torch", "triton", "cuda", "date", "git", "kernel", "tile", "num_warps", "num_stages",
          "epilogue", "elements_per_thread", "instructions", "extra_per_element", "registers", "spill_bytes",
          "mufu"]  # fmt: skip
EPILOGUES = {  # name: (HAS_BIAS, ACTIVATION)
    "none": (False, None),
    "bias": (True, None),
    "bias + relu": (True, "relu"),
    "bias + gelu (tl.erf)": (True, "gelu"),
    "bias + gelu (polynomial)": (True, "gelu_poly"),
}
# The tiled kernel's two 128 x 256 x 64 configs (ch03_matmul keeps the 4-stage one at 4096^3). Not the TMA
# kernel: its flattened tile loop is software-pipelined, which puts two copies of the epilogue in its SASS, so
# a static count there is no count a thread executes.
CASES = [("tiled", (128, 256, 64), 8, 3), ("tiled", (128, 256, 64), 8, 4)]


def compile_case(kernel: str, tile, warps: int, stages: int, has_bias: bool, activation) -> str:
    bm, bn, bk = tile
    meta = {"HAS_BIAS": has_bias, "ACTIVATION": activation, "BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn,
            "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8}  # fmt: skip
    pointers = {name: "*bf16" for name in ("a_ptr", "b_ptr", "c_ptr", "bias_ptr")}
    sizes = {"M": "i32", "N": "i32", "K": "i32"}
    if kernel == "tiled":  # rows contiguous: the unit strides are specialized, as a launch on torch tensors
        strides = {"stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32"}
        consts = meta | {"stride_ak": 1, "stride_bn": 1, "stride_cn": 1, "INPUT_PRECISION": "ieee"}
        consts |= {"EVEN_K": True, "INDEX_64": False, "ALIGN": 16}  # what a launch at 4096^3 passes
        signature = pointers | sizes | strides  # all multiples of 16 at 4096^3: marked so, as a launch would
        kernel_fn = matmul._matmul_tiles
        return compile_sm90(kernel_fn, signature, consts, warps, aligned=list(signature), stages=stages)
    raise ValueError(f"no case for kernel {kernel!r}")


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else "labkernels/reference/ch05_epilogue_sass.csv"
    meta = compiled_meta()
    rows = []
    for kernel, tile, warps, stages in CASES:
        per_thread = tile[0] * tile[1] // (32 * warps)
        plain = None
        for name, (has_bias, activation) in EPILOGUES.items():
            sass, info = sass_and_ptxas(compile_case(kernel, tile, warps, stages, has_bias, activation))
            ops = opcodes(sass)
            total = sum(ops.values())
            plain = total if plain is None else plain  # "none" comes first
            rows.append(meta | dict(kernel=kernel, tile="x".join(map(str, tile)), num_warps=warps,
                                    num_stages=stages, epilogue=name, elements_per_thread=per_thread,
                                    instructions=total,
                                    extra_per_element=round((total - plain) / per_thread, 2),
                                    registers=int(re.search(r"Used (\d+) registers", info).group(1)),
                                    spill_bytes=int(re.search(r"(\d+) bytes spill stores", info).group(1)),
                                    mufu=ops["MUFU"]))  # fmt: skip
            print({k: rows[-1][k] for k in FIELDS[6:]}, flush=True)
    write_reference(path, FIELDS, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
