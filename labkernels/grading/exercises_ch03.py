"""Chapter 03 exercises: a fused bias + ReLU kernel over a matrix's rows, a row softmax for any row length, a
tiled matmul's K loop, the grouped program order that keeps its tiles in L2, and reading an Nsight Compute
table (the occupancy limiter; memory-, compute- or latency-bound), checked on the H200's shipped profiles and
on random rows.

Sizes come from `labkernels.size`: small on the CPU lane (the interpreter costs ~1-2 ms per program), large on
the GPU. Every size is drawn at grading time and is deliberately not a multiple of any power of two.
"""

from __future__ import annotations

import math

import torch

from labkernels import size, traffic
from labkernels.ch03_triton import matmul as matmul_mod
from labkernels.ch03_triton import softmax as softmax_mod
from labkernels.grading.core import exercise


def _odd(g, low: int, high: int) -> int:
    """A random size in [low, high] that is not a multiple of 16 (so never of a block size)."""
    n = g.randint(low, high)
    return n if n % 16 else n + 7


def _bias_relu_reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """relu(x + bias) in float64, bias added to every row; NaN stays NaN (as torch.relu)."""
    return torch.relu(x.double() + bias.double())


def _bias_relu_bytes(rows: int, cols: int, dtype: torch.dtype) -> traffic.Traffic:
    """Read x (rows x cols) and the bias once, write out (the bias's rereads hit the cache, not HBM)."""
    e = traffic.element_size(dtype)
    return traffic.Traffic("bias_relu", (2 * rows * cols + cols) * e, 2 * rows * cols)


def _matrix(g, rows: int, cols: int, dtype, row_stride: int | None = None) -> torch.Tensor:
    """A (rows, cols) matrix; with `row_stride`, the left columns of a wider one (rows row_stride apart)."""
    if row_stride is None:
        return g.randn(rows, cols, dtype=dtype)
    return g.randn(rows, row_stride, dtype=dtype)[:, :cols]


@exercise("3.1", "Fused bias + ReLU over the rows of a matrix", points=4, speed_points=2, timeout_s=120,
          requires="triton")  # fmt: skip
def _grade_3_1(student, g):
    def one(x, bias, nan_ok=False):
        out = g.guarded_empty(tuple(x.shape), x.dtype)  # NaN inside, canaries around it
        student(x, bias, out)
        expected = _bias_relu_reference(x, bias)
        if nan_ok:  # NaN where x held NaN, nowhere else; then the other values
            wrong = int((torch.isnan(out.cpu()) != torch.isnan(expected.cpu())).sum())
            g.expect(wrong == 0, f"{wrong} elements are NaN where relu(x + bias) is not, or the reverse")
            out, expected = out.nan_to_num(0.0), expected.nan_to_num(0.0)
        tol = 1e-6 if x.dtype == torch.float32 else 1e-3
        g.check_close(out, expected.to(x.dtype), atol=tol, rtol=tol)

    rows, cols = size(cpu=(3, 40), gpu=(200, 3000)), size(cpu=(100, 900), gpu=(1000, 9000))
    with g.case("rows whose length is not a multiple of the block", points=1):
        x = _matrix(g, g.randint(*rows), _odd(g, *cols), torch.float32)
        one(x, g.randn(x.shape[1]))
    with g.case("a matrix smaller than one block: one row, a few columns", points=1):
        x = _matrix(g, 1, _odd(g, 1, 30), torch.float32)
        one(x, g.randn(x.shape[1]))
    with g.case("float16 inputs", points=1):
        x = _matrix(g, g.randint(*rows), _odd(g, *cols), torch.float16)
        one(x, g.randn(x.shape[1], dtype=torch.float16))
    with g.case("rows a stride apart (a slice of a wider matrix), NaN kept as NaN", points=1):
        n_cols = _odd(g, *cols)
        x = _matrix(g, g.randint(*rows), n_cols, torch.float32, row_stride=n_cols + g.randint(1, 64))
        x[g.randint(0, x.shape[0] - 1), g.randint(0, n_cols - 1)] = float("nan")
        one(x, g.randn(n_cols), nan_ok=True)
    with g.case("bandwidth >= 70% of copy at 8192 x 8192 float32", points=2, gpu_only=True):
        x, bias = g.randn(8192, 8192), g.randn(8192)
        out = g.guarded_empty((8192, 8192), torch.float32)
        student(x, bias, out)
        g.check_close(out, _bias_relu_reference(x, bias).float(), atol=1e-6, rtol=1e-6)
        g.expect_bandwidth(
            lambda: student(x, bias, out),
            _bias_relu_bytes(8192, 8192, torch.float32),
            fraction=0.7,
            check=lambda x, bias, out: g.check_close(
                out, _bias_relu_reference(x, bias).float(), atol=1e-6, rtol=1e-6
            ),
        )


SOFTMAX_TOL = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 1e-2)}


@exercise(
    "3.2", "Row softmax for any row length", points=5, speed_points=1, timeout_s=120, requires="triton",
    forbids=("labkernels.ch03_triton.softmax", "labkernels.ch06_attention.online_softmax"),
)  # fmt: skip
def _grade_3_2(student, g):
    def one(x):
        out = g.guarded_empty(tuple(x.shape), x.dtype)
        student(x, out)
        atol, rtol = SOFTMAX_TOL[x.dtype]
        g.check_close(out, softmax_mod.reference(x.double()), atol=atol, rtol=rtol)

    rows = size(cpu=(1, 40), gpu=(100, 3000))
    with g.case("rows whose length is not a power of two", points=1):
        one(g.randn(g.randint(*rows), _odd(g, 100, 3000)))
    with g.case("rows of one element, and rows shorter than a warp", points=1):
        one(g.randn(g.randint(*rows), 1))
        one(g.randn(g.randint(*rows), _odd(g, 2, 31)))
    with g.case("large values (subtract the row max before exp)", points=1):
        one(g.randn(g.randint(*rows), _odd(g, 100, 1000)) * 1000)
    with g.case("float16 in, float16 out", points=1):
        one(g.randn(g.randint(*rows), _odd(g, 100, 3000), dtype=torch.float16))
    with g.case("rows with a stride (a slice of a wider matrix)", points=1):
        n_cols = _odd(g, 100, 1000)
        wide = g.randn(g.randint(*rows), n_cols + g.randint(1, 50))
        one(wide[:, :n_cols])
    with g.case("bandwidth >= 50% of copy at 4096 x 5000 float32", points=1, gpu_only=True):
        x = g.randn(4096, 5000)
        out = g.guarded_empty((4096, 5000), torch.float32)
        student(x, out)
        g.check_close(out, torch.softmax(x, dim=1), atol=1e-6, rtol=1e-5)
        g.expect_bandwidth(
            lambda: student(x, out),
            traffic.softmax(4096, 5000, torch.float32),
            fraction=0.5,
            check=lambda x, out: g.check_close(out, torch.softmax(x, dim=1), atol=1e-6, rtol=1e-5),
        )


@exercise(
    "3.3",
    "The K loop of a tiled matmul, with grouped program order",
    points=4,
    timeout_s=180,
    requires="triton",
    forbids=("labkernels.ch03_triton.matmul",),
)
def _grade_3_3(student, g):
    # student(a, b, c, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M) writes a @ b into c (float32).
    def one(m, n, k, dtype, tiles):
        a, b = g.randn(m, k, dtype=dtype), g.randn(k, n, dtype=dtype)
        c = g.guarded_empty((m, n), torch.float32)
        student(a, b, c, *tiles)
        # TF32 (triton's default for fp32 on the GPU) and IEEE both pass; a lost K step does not.
        g.check_close(c, matmul_mod.reference(a, b), atol=1e-2 * math.sqrt(k), rtol=1e-2)

    small, big = size(cpu=(40, 100), gpu=(300, 1500))
    with g.case("float32, no dimension a multiple of its tile", points=1):
        one(_odd(g, small, big), _odd(g, small, big), _odd(g, small, big), torch.float32, (32, 32, 16, 4))
    with g.case("K smaller than one BLOCK_SIZE_K step", points=1):
        one(_odd(g, small, big), _odd(g, small, big), g.randint(1, 15), torch.float32, (32, 32, 16, 4))
    with g.case("float16 inputs, float32 accumulator", points=1):
        one(_odd(g, small, big), _odd(g, small, big), _odd(g, small, big), torch.float16, (32, 32, 32, 2))
    with g.case("a short last group (row tiles not a multiple of GROUP_SIZE_M)", points=1):
        group = 3
        tiles_m = group * g.randint(1, 3) + g.randint(1, group - 1)
        m = 16 * tiles_m - g.randint(1, 15)
        one(m, _odd(g, small, big), _odd(g, 20, 60), torch.float32, (16, 32, 16, group))


def _grouped_order_reference(pid, num_pid_m, num_pid_n, group_size_m):
    num_pid_in_group = group_size_m * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * group_size_m
    group_rows = min(num_pid_m - first_pid_m, group_size_m)
    return first_pid_m + (pid % num_pid_in_group) % group_rows, (pid % num_pid_in_group) // group_rows


@exercise(
    "3.4",
    "Grouped program order, in plain Python",
    points=2,
    timeout_s=60,
    forbids=("labkernels.ch04_libraries.wave_tail", "labkernels.ch03_triton.matmul"),
)
def _grade_3_4(student, g):
    # student(pid, num_pid_m, num_pid_n, group_size_m) -> (pid_m, pid_n)
    def grids(count):
        for _ in range(count):
            yield g.randint(1, 40), g.randint(1, 40), g.randint(1, 9)

    def tiles_of(num_pid_m, num_pid_n, group):
        # One round trip for the whole grid; tile indices are ints (a float index is not an index).
        got = student.map([(pid, num_pid_m, num_pid_n, group) for pid in range(num_pid_m * num_pid_n)])
        for pid, tile in enumerate(got):
            g.expect(
                isinstance(tile, tuple | list)
                and len(tile) == 2
                and all(isinstance(i, int) and not isinstance(i, bool) for i in tile),
                f"pid {pid}: return (pid_m, pid_n) as two ints, got {tile!r}",
            )
        return [tuple(t) for t in got]

    with g.case("every tile computed exactly once (short last groups included)", points=1):
        for num_pid_m, num_pid_n, group in grids(30):
            tiles = tiles_of(num_pid_m, num_pid_n, group)
            g.expect(
                sorted(tiles) == [(i, j) for i in range(num_pid_m) for j in range(num_pid_n)],
                f"grid {num_pid_m} x {num_pid_n}, GROUP_SIZE_M={group}: the tiles are not each visited once",
            )
    with g.case("programs walk down a group of rows before moving right", points=1):
        for num_pid_m, num_pid_n, group in grids(30):
            tiles = tiles_of(num_pid_m, num_pid_n, group)
            for pid in range(num_pid_m * num_pid_n):
                want = _grouped_order_reference(pid, num_pid_m, num_pid_n, group)
                got = tiles[pid]
                g.expect(
                    got == want,
                    f"grid {num_pid_m} x {num_pid_n}, GROUP_SIZE_M={group}: pid {pid} gave {got}, not {want}",
                )


# --- 3.5 and 3.6: reading an Nsight Compute table -----------------------------------------------------------

RESOURCES = ("registers", "shared_mem", "blocks", "warps")
H200_MAX_WARPS_PER_SM = 64  # 2048 resident threads per Hopper SM
# The H200's profiles that ship with the course; a row with the launch__occupancy_limit_* columns is a case.
PROFILE_TABLES = ("ch03_profile", "ch04_profile")
BOUND_THRESHOLD_PCT = 60.0  # Nsight Compute's guideline: a unit above 60% of its peak is the limiter
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"


def _occupancy_reference(row: dict) -> tuple[set[str], float]:
    """(the tied limiting resources, the theoretical occupancy as a fraction)."""
    limits = {k: row[f"limit_{k}"] for k in RESOURCES}
    least = min(limits.values())
    fraction = min(1.0, least * row["warps_per_block"] / row["max_warps_per_sm"])
    return {k for k, v in limits.items() if v == least}, fraction


def _bound_reference(row: dict) -> set[str]:
    """The accepted answers: the busier unit if it reaches the threshold (either on an exact tie), else
    latency."""
    dram, sm = row["dram_pct"], row["sm_pct"]
    if max(dram, sm) < BOUND_THRESHOLD_PCT:
        return {"latency"}
    return {name for name, pct in (("memory", dram), ("compute", sm)) if pct == max(dram, sm)}


def occupancy_rows_of(table_name: str) -> list[tuple[str, dict, float | None]]:
    """(case name, the row as `occupancy` reads it, ncu's theoretical occupancy in percent or None) for every
    row of a shipped profile that has the occupancy limits and the block size."""
    from labkernels.results import load_reference

    table = load_reference(table_name)
    out = []
    for r in table.rows if table is not None else []:
        limits = [r.get(f"launch__occupancy_limit_{k}") for k in RESOURCES]
        block = r.get("launch__block_size")
        if not all(isinstance(v, int | float) for v in [*limits, block]):
            continue
        row = {f"limit_{k}": int(v) for k, v in zip(RESOURCES, limits, strict=True)}
        row |= {"warps_per_block": -(-int(block) // 32), "max_warps_per_sm": H200_MAX_WARPS_PER_SM}
        theoretical = r.get("sm__maximum_warps_per_active_cycle_pct")
        out.append((r["case"], row, theoretical if isinstance(theoretical, int | float) else None))
    return out


def _synthetic_occupancy_row(g, want: str) -> dict:
    """A row as ncu would report it on some GPU (64, 48 or 32 warps per SM; 32, 24 or 16 blocks), drawn until
    `want` holds: one resource the strict minimum ('registers', ..., 'warps'), a two- or three-way tie
    ('tie2', 'tie3'), or anything ('any')."""
    for _ in range(10_000):
        max_warps = g.choice([64, 48, 32])
        warps_per_block = g.randint(1, min(32, max_warps))
        row = {
            "warps_per_block": warps_per_block,
            "limit_registers": g.randint(1, 40),
            "limit_shared_mem": g.randint(1, 40),
            "limit_blocks": g.choice([32, 24, 16]),
            "limit_warps": max_warps // warps_per_block,  # how ncu computes it
            "max_warps_per_sm": max_warps,
        }
        least = min(row[f"limit_{k}"] for k in RESOURCES)
        if want in ("tie2", "tie3"):
            # registers and shared memory are free to equal the blocks or warps limit
            others = [k for k in ("blocks", "warps") if row[f"limit_{k}"] == least] or ["registers"]
            free = [k for k in ("registers", "shared_mem") if k not in others]
            for k in free[: 1 if want == "tie2" else 2]:
                row[f"limit_{k}"] = least
            tied, _ = _occupancy_reference(row)
            if len(tied) == (2 if want == "tie2" else 3):
                return row
            continue
        tied, _ = _occupancy_reference(row)
        if want == "any" or tied == {want}:
            return row
    raise RuntimeError(f"no synthetic occupancy row for {want!r}")


_SYNTHETIC_LABELS = {"tie2": "two resources tied", "tie3": "three resources tied", "any": "any limiter"}


def _occupancy_cases(g) -> list[tuple[str, dict]]:
    """(what the row is, the row): the H200's real rows and synthetic ones, shuffled."""
    cases = [
        (f"{name} (H200, ncu)", row) for table in PROFILE_TABLES for name, row, _ in occupancy_rows_of(table)
    ]
    if not cases:
        raise RuntimeError(
            "no shipped profile rows with occupancy limits (labkernels/reference/*_profile.csv)"
        )
    for want in [*RESOURCES, "warps", "tie2", "tie2", "tie3", *["any"] * 6]:
        label = _SYNTHETIC_LABELS.get(want, f"{want} the least")
        cases.append((f"a random row ({label})", _synthetic_occupancy_row(g, want)))
    g.random.shuffle(cases)
    return cases


@exercise(
    "3.5",
    "Read a profile: which resource limits occupancy",
    points=2,
    timeout_s=60,
    forbids=("labkernels.profile",),
)
def _grade_3_5(student, g):
    # student(row) -> (limiter, theoretical_occupancy)
    def answers():
        cases = _occupancy_cases(g)
        got = student.map([(dict(row),) for _, row in cases])
        for (what, _), answer in zip(cases, got, strict=True):
            g.expect(
                isinstance(answer, tuple | list) and len(answer) == 2,
                f"{what}: return (limiter, theoretical_occupancy), got {answer!r}",
            )
        return [(what, row, *answer) for (what, row), answer in zip(cases, got, strict=True)]

    with g.case("the limiting resource (the H200's rows and random ones, ties included)", points=1):
        for what, row, limiter, _ in answers():
            tied, _ = _occupancy_reference(row)
            g.expect(
                isinstance(limiter, str) and limiter in tied,
                f"{what} {row}: limiter {limiter!r}, expected "
                + (f"{next(iter(tied))!r}" if len(tied) == 1 else f"one of {sorted(tied)}"),
            )
    with g.case("theoretical occupancy, as a fraction (agrees with ncu's on the H200's rows)", points=1):
        for what, row, _, fraction in answers():
            _, want = _occupancy_reference(row)
            ok = isinstance(fraction, int | float) and not isinstance(fraction, bool)
            g.expect(ok, f"{what}: theoretical occupancy must be a number, got {fraction!r}")
            if fraction > 1 and math.isclose(fraction, 100 * want, rel_tol=1e-6):
                g.expect(False, f"{what}: {fraction!r} is a percentage; return the fraction {want:.6g}")
            g.expect(
                math.isclose(fraction, want, rel_tol=1e-9, abs_tol=1e-9),
                f"{what} {row}: theoretical occupancy {fraction!r}, expected {want:.6g}",
            )


def _synthetic_bound_rows(g) -> list[tuple[str, dict]]:
    """Both sides of the threshold, in both orders, and the threshold itself."""
    t = BOUND_THRESHOLD_PCT

    def pct(low, high):
        return round(low + (high - low) * g.random.random(), 2)

    rows = []
    for _ in range(3):
        high, low = pct(t + 0.01, 99.0), pct(0.0, t + 30)
        rows.append(("memory above the threshold", {"dram_pct": high, "sm_pct": min(low, high - 0.01)}))
        rows.append(("compute above the threshold", {"dram_pct": min(low, high - 0.01), "sm_pct": high}))
        rows.append(
            ("neither reaches the threshold", {"dram_pct": pct(0, t - 0.01), "sm_pct": pct(0, t - 0.01)})
        )
    rows.append(("memory exactly at the threshold", {"dram_pct": t, "sm_pct": pct(0, t - 0.01)}))
    rows.append(("compute exactly at the threshold", {"dram_pct": pct(0, t - 0.01), "sm_pct": t}))
    rows.append(("both just under the threshold", {"dram_pct": t - 0.01, "sm_pct": t - 0.01}))
    return rows


def bound_rows_of(table_name: str) -> list[tuple[str, dict]]:
    """(case name, {"dram_pct", "sm_pct"}) for every row of a shipped profile that has both throughputs."""
    from labkernels.results import load_reference

    table = load_reference(table_name)
    rows = table.rows if table is not None else []
    return [
        (r["case"], {"dram_pct": float(r[DRAM_PCT]), "sm_pct": float(r[SM_PCT])})
        for r in rows
        if isinstance(r.get(DRAM_PCT), int | float) and isinstance(r.get(SM_PCT), int | float)
    ]


@exercise(
    "3.6",
    "Read a profile: memory-, compute- or latency-bound",
    points=1,
    timeout_s=60,
    forbids=("labkernels.profile",),
)
def _grade_3_6(student, g):
    # student(row) -> "memory" | "compute" | "latency"
    with g.case(
        "memory, compute or latency (random rows around the threshold, the H200's ch04 rows)", points=1
    ):
        cases = [(f"{name} (H200, ncu)", row) for name, row in bound_rows_of("ch04_profile")]
        cases += _synthetic_bound_rows(g)
        g.random.shuffle(cases)
        got = student.map([(dict(row),) for _, row in cases])
        for (what, row), answer in zip(cases, got, strict=True):
            want = _bound_reference(row)
            g.expect(
                isinstance(answer, str) and answer in want,
                f"{what}, dram {row['dram_pct']}% and sm {row['sm_pct']}% of peak: {answer!r}, expected "
                + " or ".join(repr(w) for w in sorted(want)),
            )
