"""Tiles that are not a power of two, made of two power-of-two blocks (an experiment; GPU, CPU smoke mode).

Triton's blocks are powers of two, so chapter 03's tiles are 64, 128 or 256 on a side. At 1536^3 on 132 SMs
none of them fills the machine: 128 x 128 makes 144 tiles (a second wave 9% full), 64 x 128 makes 288 (2.2
waves), 128 x 256 makes 72. cuBLAS runs 192 x 96 tiles there: 128 tiles, one wave, 97% of the SMs. A tile of
(BLOCK_M + EXTRA_M) x (BLOCK_N + EXTRA_N) is up to four power-of-two blocks sharing their operand loads: each
K-step loads A's rows (BLOCK_M, then EXTRA_M) and B's columns (BLOCK_N, then EXTRA_N) once and runs one
tl.dot per pair. 128 x (128 + 16) = 128 x 144 makes 12 x 11 = 132 tiles at 1536^3; (128 + 64) x (64 + 32)
is cuBLAS's 192 x 96.

Each variant is checked against an fp64 reference (output poisoned first), then timed as CUDA-graph replays
in alternating rounds beside cuBLAS and the shipped matmul (chapter 04's auto). CSV to $OUT/wide/wide.csv.

    PYTHONPATH=$PWD python experiments/wide_tiles.py            # GPU
    PYTHONPATH=$PWD python experiments/wide_tiles.py --cpu-smoke  # interpreter: correctness, small fp32
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import time
from typing import NamedTuple

import torch

import labkernels  # noqa: F401  (before triton: it sets the lane)
import recording
import triton
import triton.language as tl

from labkernels.ch03_triton.matmul import _tile_coordinates
from labkernels.lane import sm_count
from labkernels.ch04_libraries import splitk
from labkernels.timing import graph_ms


@triton.jit
def _block_ptrs(base, start, size: tl.constexpr, extent, stride):
    """Pointers to `size` rows (or columns) from `start`, wrapped at `extent`: valid memory, never stored."""
    return base + ((start + tl.arange(0, size)) % extent) * stride


@triton.jit
def _store(c_ptr, acc, row, col, M, N, stride_cm, stride_cn, ROWS: tl.constexpr, COLS: tl.constexpr):
    offs_m = row + tl.arange(0, ROWS)
    offs_n = col + tl.arange(0, COLS)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)  # write ROWS x COLS


@triton.jit
def _load(ptrs, k_ok, EVEN_K: tl.constexpr):
    if EVEN_K:  # unmasked: a mask along K caps each load at one element
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=k_ok, other=0.0)


@triton.jit
def _wide_tile_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, EXTRA_M: tl.constexpr, BLOCK_N: tl.constexpr, EXTRA_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr, EVEN_K: tl.constexpr, USE_TMA: tl.constexpr,
):  # fmt: skip
    """One (BLOCK_M + EXTRA_M) x (BLOCK_N + EXTRA_N) tile of C per program; EXTRA_* = 0 drops that block.
    USE_TMA: operands by TMA copies (rows contiguous; zeros past the edges), else by pointers."""
    TILE_M: tl.constexpr = BLOCK_M + EXTRA_M
    TILE_N: tl.constexpr = BLOCK_N + EXTRA_N
    pid_m, pid_n = _tile_coordinates(tl.program_id(axis=0), M, N, TILE_M, TILE_N, GROUP_SIZE_M)
    row = pid_m * TILE_M
    col = pid_n * TILE_N
    offs_k = tl.arange(0, BLOCK_K)
    if USE_TMA:
        a_main = tl.make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [BLOCK_M, BLOCK_K])
        b_main = tl.make_tensor_descriptor(b_ptr, [K, N], [stride_bk, 1], [BLOCK_K, BLOCK_N])
    else:
        a_main = _block_ptrs(a_ptr, row, BLOCK_M, M, stride_am)[:, None] + offs_k[None, :] * stride_ak
        b_main = _block_ptrs(b_ptr, col, BLOCK_N, N, stride_bn)[None, :] + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if EXTRA_N > 0:
        if USE_TMA:
            b_side = tl.make_tensor_descriptor(b_ptr, [K, N], [stride_bk, 1], [BLOCK_K, EXTRA_N])
        else:
            b_side = _block_ptrs(b_ptr, col + BLOCK_N, EXTRA_N, N, stride_bn)[None, :]
            b_side += offs_k[:, None] * stride_bk
        acc_n = tl.zeros((BLOCK_M, EXTRA_N), dtype=tl.float32)
    if EXTRA_M > 0:
        if USE_TMA:
            a_side = tl.make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [EXTRA_M, BLOCK_K])
        else:
            a_side = _block_ptrs(a_ptr, row + BLOCK_M, EXTRA_M, M, stride_am)[:, None]
            a_side += offs_k[None, :] * stride_ak
        acc_m = tl.zeros((EXTRA_M, BLOCK_N), dtype=tl.float32)
        if EXTRA_N > 0:
            acc_mn = tl.zeros((EXTRA_M, EXTRA_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K  # masks the ragged last step's loads (pointers, EVEN_K false)
        if USE_TMA:
            a = a_main.load([row, k * BLOCK_K])  # read BLOCK_M x BK
            b = b_main.load([k * BLOCK_K, col])  # read BK x BLOCK_N
        else:
            a = _load(a_main, offs_k[None, :] < k_left, EVEN_K)  # read BLOCK_M x BK
            b = _load(b_main, offs_k[:, None] < k_left, EVEN_K)  # read BK x BLOCK_N
            a_main += BLOCK_K * stride_ak
            b_main += BLOCK_K * stride_bk
        acc = tl.dot(a, b, acc)
        if EXTRA_N > 0:
            if USE_TMA:
                b2 = b_side.load([k * BLOCK_K, col + BLOCK_N])  # read BK x EXTRA_N
            else:
                b2 = _load(b_side, offs_k[:, None] < k_left, EVEN_K)
                b_side += BLOCK_K * stride_bk
            acc_n = tl.dot(a, b2, acc_n)
        if EXTRA_M > 0:
            if USE_TMA:
                a2 = a_side.load([row + BLOCK_M, k * BLOCK_K])  # read EXTRA_M x BK
            else:
                a2 = _load(a_side, offs_k[None, :] < k_left, EVEN_K)
                a_side += BLOCK_K * stride_ak
            acc_m = tl.dot(a2, b, acc_m)
            if EXTRA_N > 0:
                acc_mn = tl.dot(a2, b2, acc_mn)
    _store(c_ptr, acc, row, col, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
    if EXTRA_N > 0:
        _store(c_ptr, acc_n, row, col + BLOCK_N, M, N, stride_cm, stride_cn, BLOCK_M, EXTRA_N)
    if EXTRA_M > 0:
        _store(c_ptr, acc_m, row + BLOCK_M, col, M, N, stride_cm, stride_cn, EXTRA_M, BLOCK_N)
        if EXTRA_N > 0:
            _store(c_ptr, acc_mn, row + BLOCK_M, col + BLOCK_N, M, N, stride_cm, stride_cn, EXTRA_M, EXTRA_N)


class Variant(NamedTuple):
    block_m: int
    extra_m: int
    block_n: int
    extra_n: int
    block_k: int
    stages: int
    warps: int
    tma: bool = False

    @property
    def name(self) -> str:
        return (
            f"{self.block_m}+{self.extra_m}x{self.block_n}+{self.extra_n}x{self.block_k} "
            f"s{self.stages} w{self.warps}{' tma' if self.tma else ''}"
        )

    def tiles(self, m: int, n: int) -> int:
        return triton.cdiv(m, self.block_m + self.extra_m) * triton.cdiv(n, self.block_n + self.extra_n)

    def smem_bytes(self, element_size: int) -> int:
        rows, cols = self.block_m + self.extra_m, self.block_n + self.extra_n
        return self.stages * (rows + cols) * self.block_k * element_size

    def launch(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
        """Launch on C; returns Triton's compiled kernel (registers, shared memory) on the GPU lane."""
        (M, K), N = a.shape, b.shape[1]
        grid = (self.tiles(M, N),)
        return _wide_tile_kernel[grid](
            a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(),
            BLOCK_M=self.block_m, EXTRA_M=self.extra_m, BLOCK_N=self.block_n, EXTRA_N=self.extra_n,
            BLOCK_K=self.block_k, GROUP_SIZE_M=8, EVEN_K=K % self.block_k == 0, USE_TMA=self.tma,
            num_stages=self.stages, num_warps=self.warps,
        )  # fmt: skip

    def __call__(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        self.launch(a, b, c)
        return c

    def resident(self, a, b, c) -> int:
        """Programs of this variant an SM holds at once: the fewest its shared memory and its registers
        allow (a program's are all in one SM; an H100/H200 SM has 64K 32-bit registers)."""
        compiled = self.launch(a, b, c)
        compiled._init_handles()  # reads the registers from the loaded binary
        by_shared = splitk.SHARED_MEMORY_BYTES // max(1, compiled.metadata.shared)
        by_registers = 65536 // (compiled.n_regs * 32 * self.warps)
        return min(by_shared, by_registers)


def _both(*variant) -> list[Variant]:
    """The variant with pointer loads and with TMA copies."""
    return [Variant(*variant), Variant(*variant, tma=True)]


# The tiles near one wave at each shape, and the power-of-two ones chapter 03 runs, as controls.
GPU_VARIANTS = {
    (1536, 1536, 1536): [
        *_both(64, 0, 128, 0, 64, 3, 4),  # the shipped pick: 288 tiles
        *_both(128, 0, 128, 0, 64, 4, 8),  # 144 tiles
        *_both(128, 0, 128, 16, 64, 4, 8),  # 128 x 144: 132 tiles
        *_both(128, 0, 128, 16, 64, 3, 8),
        *_both(128, 64, 64, 32, 64, 4, 8),  # 192 x 96: 128 tiles (cuBLAS's)
        *_both(128, 64, 64, 32, 64, 3, 8),
        *_both(64, 32, 128, 64, 64, 4, 4),  # 96 x 192: 128 tiles
        *_both(64, 32, 128, 64, 64, 4, 8),
        *_both(128, 0, 128, 64, 64, 3, 8),  # 128 x 192: 96 tiles
        # smaller power-of-two tiles: more programs an SM holds, finer waves (576 tiles of 64 x 64: 4.4 an SM)
        Variant(64, 0, 64, 0, 64, 3, 4),
        Variant(64, 0, 64, 0, 64, 4, 4),
        Variant(64, 0, 64, 0, 128, 3, 4),
        Variant(64, 0, 128, 0, 64, 2, 4),
        Variant(64, 0, 128, 0, 128, 3, 4),
        Variant(128, 0, 64, 0, 64, 3, 4),
    ],
    (3000, 5000, 1000): [
        # TMA only: K = 1000 leaves a ragged last K-step, and the pointer loads mask every step (13x slower)
        Variant(128, 0, 256, 0, 64, 3, 8, tma=True),  # 480 tiles, 3.6 waves
        Variant(128, 0, 128, 64, 64, 4, 8, tma=True),  # 128 x 192: 648 tiles, 4.9 waves
        Variant(128, 0, 128, 64, 64, 3, 8, tma=True),
        Variant(128, 64, 128, 0, 64, 3, 8, tma=True),  # 192 x 128: 640 tiles
    ],
    (4096, 4096, 4096): [
        *_both(128, 0, 256, 0, 64, 3, 8),
        *_both(128, 0, 128, 64, 64, 4, 8),  # 128 x 192: 704 tiles, 5.3 waves
    ],
}
# 1536^3 cut into about three tiles an SM (384 for 396 slots): every SM holds three programs, as chapter 03's
# pick does on 24 SMs only (`tile_count.py`: its 264 first tiles take 13.9 us, all 288 take 16.5 us).
THREE_AN_SM = {
    (1536, 1536, 1536): [
        *_both(64, 0, 128, 0, 64, 3, 4),  # the shipped pick: 288 tiles
        *_both(64, 0, 64, 32, 64, 3, 4),  # 64 x 96: 384 tiles
        *_both(64, 0, 64, 32, 32, 4, 4),
        *_both(64, 32, 64, 0, 64, 3, 4),  # 96 x 64: 384 tiles
        *_both(128, 0, 32, 16, 64, 3, 4),  # 128 x 48: 384 tiles
    ],
}
CPU_VARIANTS = [
    *_both(32, 0, 32, 16, 32, 1, 4),
    *_both(32, 16, 32, 0, 32, 1, 4),
    *_both(32, 16, 32, 16, 16, 1, 4),
]


def checked(variant: Variant, a, b) -> float:
    c = torch.full((a.shape[0], b.shape[1]), float("nan"), device=a.device, dtype=a.dtype)  # poisoned
    return recording.rel_err(variant(a, b, c), splitk.reference(a, b))


def cpu_smoke() -> int:
    torch.manual_seed(0)
    failures = 0
    for m, n, k in ((97, 61, 45), (64, 80, 64), (130, 68, 44)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        aligned = k % 4 == 0 and n % 4 == 0  # TMA: 16-byte row strides
        for v in CPU_VARIANTS:
            if v.tma and not aligned:
                continue
            err = checked(v, a, b)
            ok = err < 1e-5
            failures += not ok
            print(f"{m}x{n}x{k} {v.name:28s} rel err {err:.1e} {'ok' if ok else 'WRONG'}")
    return int(failures > 0)


def gpu_main(out_dir: str, args) -> int:
    meta = recording.versioned()
    sms = sm_count()
    rows, failures = [], 0
    for (m, n, k), variants in (THREE_AN_SM if args.three else GPU_VARIANTS).items():
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        calls = {"cublas": lambda a=a, b=b: a @ b, "shipped": lambda a=a, b=b: splitk.matmul(a, b)}
        calls["shipped"]()  # tunes and chooses
        errors = {"shipped": recording.rel_err(splitk.matmul(a, b), splitk.reference(a, b))}
        resident = {}
        for v in variants:
            if v.smem_bytes(2) > splitk.SHARED_MEMORY_BYTES:
                print(f"{m}x{n}x{k} {v.name}: needs {v.smem_bytes(2)} B of shared memory, skipped")
                continue
            t0 = time.time()
            try:
                errors[v.name] = checked(v, a, b)
                resident[v.name] = v.resident(a, b, c)
            except Exception as e:  # out of resources, a compile error: the other variants still run
                print(f"{m}x{n}x{k} {v.name}: FAILED {e!r:.300}", flush=True)
                failures += 1
                continue
            print(f"{m}x{n}x{k} {v.name}: compiled and checked in {time.time() - t0:.1f} s, "
                  f"rel err {errors[v.name]:.1e}", flush=True)  # fmt: skip
            calls[v.name] = lambda v=v, a=a, b=b, c=c: v(a, b, c)
        timed = recording.alternating_medians(calls, args.rounds, lambda call: graph_ms(call, rep=30))
        cublas = timed["cublas"][0]
        for name, (med, spread) in timed.items():
            err = errors.get(name, 0.0)
            ok = err < 2e-2
            failures += not ok
            variant = next((v for v in variants if v.name == name), None)
            tiles = variant.tiles(m, n) if variant else ""
            rows.append(meta | {"m": m, "n": n, "k": k, "impl": name, "tiles": tiles, "sms": sms,
                         "resident_per_sm": resident.get(name, ""), "ms": med,
                         "spread": spread, "of_cublas": cublas / med,
                         "tflops": 2 * m * n * k / med / 1e9, "rel_err": err})  # fmt: skip
            print(
                f"{m}x{n}x{k} {name:30s} tiles {tiles!s:>4} {med * 1e3:7.1f} us  {cublas / med:.3f} of "
                f"cuBLAS  spread {rows[-1]['spread']:.2f}  err {err:.1e} {'' if ok else 'WRONG'}",
                flush=True,
            )
    recording.write_csv(f"{out_dir}/wide.csv", rows)
    return int(failures > 0)


def _options(parser) -> None:
    parser.add_argument("--three", action="store_true", help="only the tiles that make ~3 programs an SM")


if __name__ == "__main__":
    recording.main(__doc__, cpu_smoke, gpu_main, "wide", _options)
