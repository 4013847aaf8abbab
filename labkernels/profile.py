"""Profiler evidence: run one named kernel launch under Nsight Compute (`ncu`) and read its counters.

A *case* (`@case("ch02.transpose_cuda_tiled")`, in a chapter's `profiles.py`) builds fresh inputs, warms up
(compiles, autotunes) and returns the launch to measure. `profile(case)` runs that case in a subprocess under
ncu with the profiler window (`torch.cuda.profiler.start()/stop()`, ncu `--profile-from-start off`) around
that one launch only, so only the kernels of interest are replayed, whatever their names. A *question*
(`QUESTIONS`) is a small fixed set of metrics; the table gets the raw counters and derived columns
(sectors per request, the occupancy limiter, DRAM bytes, spilled bytes). A case that launches several
kernels (eager torch ops, one per op) can ask for their sum (`total=True`: one more row, bytes and time
summed), and a case can carry the bytes its traffic model predicts (`model_bytes`), set beside ncu's.

    python -m labkernels.profile list
    python -m labkernels.profile profile ch02.transpose_cuda_tiled [--question coalescing ...]
    python -m labkernels.profile run ch02.transpose_cuda_tiled      # what ncu launches

GPU lane only (`available()`); the H200's tables ship in labkernels/reference/chNN_profile.csv, and
`show("ch02_profile")` prints them in both lanes.
"""

from __future__ import annotations

import csv
import glob
import io
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from labkernels.results import Table, load_reference

# Every question's table also has the kernel's duration.
TIME = "gpu__time_duration.sum"

# question -> ncu metric names (Hopper, GH100). Names this ncu does not know are dropped with a warning.
QUESTIONS: dict[str, list[str]] = {
    "dram": [
        "dram__bytes_read.sum",  # bytes the kernel made HBM deliver
        "dram__bytes_write.sum",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    ],
    "l2": ["lts__t_sector_hit_rate.pct", "dram__bytes_read.sum", "lts__t_sectors_op_read.sum"],
    "coalescing": [
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",  # one per warp-wide load instruction
        "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",  # 32-byte sectors those requests touched
        "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
        "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    ],
    "shared_memory": [
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",  # one per bank-conflict-free pass
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
        "smsp__inst_executed_op_shared_ld.sum",
        "smsp__inst_executed_op_shared_st.sum",
    ],
    "occupancy": [
        "sm__warps_active.avg.pct_of_peak_sustained_active",  # achieved occupancy
        "sm__maximum_warps_per_active_cycle_pct",  # theoretical occupancy
        "launch__occupancy_limit_registers",  # blocks per SM each resource allows
        "launch__occupancy_limit_shared_mem",
        "launch__occupancy_limit_blocks",
        "launch__occupancy_limit_warps",
        "launch__registers_per_thread",
        "launch__block_size",
        "launch__grid_size",
        "launch__waves_per_multiprocessor",
        "launch__shared_mem_per_block_static",
        "launch__shared_mem_per_block_dynamic",
    ],
    "tensor_pipe": [
        # the tensor pipe's busy cycles; on the H200 it counts Hopper's wgmma too (cuBLAS's nvjet kernels read
        # 70%), and ncu 2025.3 gives no value for the separate gmma counter
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    ],
    "spills": [
        "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",  # local memory: registers spilled and reloaded
        "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
        "launch__registers_per_thread",
    ],
    "in_flight": [
        "dram__bytes_read.sum.per_second",
        "sm__warps_active.avg.per_cycle_active",  # resident warps per SM, on average
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
        "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
    ],
}

# Where ncu is found when it is not on PATH: CUDA toolkits and the standalone Nsight Compute installs.
NCU_GLOBS = (
    "{cuda_home}/bin/ncu",
    "/usr/local/cuda/bin/ncu",
    "/usr/local/cuda-*/bin/ncu",
    "/opt/nvidia/nsight-compute/*/ncu",
    "/usr/local/cuda*/nsight-compute*/ncu",
)
NCU_TIMEOUT_S = 300
_REPO = Path(__file__).resolve().parent.parent


# --- cases --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], Callable[[], object]]  # makes inputs, warms up, returns the launch to profile
    questions: tuple[str, ...]  # what this case is profiled for by default
    kernel: str | None  # regex a kernel's name must match to be kept (None: every kernel in the window)
    doc: str
    total: bool = False  # add a row summing its kernels when several ran
    model_bytes: int | None = None  # the bytes labkernels.traffic says the whole case moves


CASES: dict[str, Case] = {}


def case(
    name: str,
    *,
    questions: Iterable[str],
    kernel: str | None = None,
    doc: str | None = None,
    total: bool = False,
    model_bytes: int | None = None,
):
    """Register a case: a function that builds inputs, warms up, and returns a zero-argument launch.
    `doc` (default: the function's docstring, first line) says what it runs. `total`: when several kernels
    run, add a row with their sum (`total_row`). `model_bytes`: the traffic model's bytes for the whole
    case, kept on the row that stands for it (the sum, or the only kernel) beside ncu's DRAM bytes."""
    questions = tuple(questions)
    _check_questions(questions)
    if model_bytes is not None and (
        not isinstance(model_bytes, int) or isinstance(model_bytes, bool) or model_bytes <= 0
    ):
        raise ValueError(f"profile case {name!r}: model_bytes must be a positive int, got {model_bytes!r}")

    def register(fn: Callable[[], Callable[[], object]]):
        if name in CASES and CASES[name].build is not fn:
            raise ValueError(f"profile case {name!r} registered twice")
        text = doc if doc is not None else (fn.__doc__ or "").strip().split("\n")[0]
        CASES[name] = Case(name, fn, questions, kernel, text, bool(total), model_bytes)
        return fn

    return register


def discover() -> dict[str, Case]:
    """Import every `labkernels.<pkg>.profiles` module so its cases register."""
    from labkernels.bench import import_chapter_modules

    import_chapter_modules("profiles")
    return CASES


def get_case(name: str) -> Case:
    found = discover()
    if name not in found:
        raise KeyError(f"unknown profile case {name!r}; known: {sorted(found)}")
    return found[name]


def _check_questions(questions: Iterable[str]) -> None:
    unknown = [q for q in questions if q not in QUESTIONS]
    if unknown:
        raise KeyError(f"unknown profile question(s) {unknown}; known: {sorted(QUESTIONS)}")


def metrics_for(questions: Iterable[str]) -> list[str]:
    """The metrics the questions ask for, each once, the kernel's duration first."""
    questions = list(questions)
    _check_questions(questions)
    return list(dict.fromkeys([TIME, *(m for q in questions for m in QUESTIONS[q])]))


def run_case(name: str) -> None:
    """Build the case, then launch it once inside the profiler window (what runs under ncu)."""
    import torch

    launch = get_case(name).build()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    launch()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


# --- finding and running ncu --------------------------------------------------------------------------------


def ncu_path() -> str | None:
    """The ncu executable: PATH, then $CUDA_HOME/bin, /usr/local/cuda*/bin, /opt/nvidia/nsight-compute/*."""
    found = shutil.which("ncu")
    if found:
        return found
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for pattern in NCU_GLOBS:
        for path in sorted(glob.glob(pattern.format(cuda_home=cuda_home)), reverse=True):  # newest first
            if os.access(path, os.X_OK):
                return path
    return None


def available() -> bool:
    """True where ncu can profile: the GPU lane, with ncu installed."""
    from labkernels.lane import on_gpu

    return on_gpu() and ncu_path() is not None


class ProfilerUnavailable(RuntimeError):
    """No GPU or no ncu here: `make bench` skips the profiler's tables (keeping the shipped ones) on this."""


def _require_ncu() -> str:
    from labkernels.lane import on_gpu

    if not on_gpu():
        raise ProfilerUnavailable(
            "profiling reads a GPU's counters: it needs the GPU lane (show() reads the H200's)"
        )
    path = ncu_path()
    if path is None:
        raise ProfilerUnavailable(
            "ncu (Nsight Compute) not found on PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin"
        )
    return path


_KNOWN: dict[str, set[str]] = {}


def known_metrics(ncu: str) -> set[str]:
    """Base metric names (before the first '.') this ncu lists for this machine's GPU; empty if it would not
    say. Launch statistics (launch__*) are not always listed: `_unknown` only judges families it lists."""
    if ncu not in _KNOWN:
        try:
            out = subprocess.run(
                [ncu, "--query-metrics"], capture_output=True, text=True, timeout=120, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        _KNOWN[ncu] = set(re.findall(r"^\s*([a-z0-9_]+__[A-Za-z0-9_]+)", out, flags=re.M))
    return _KNOWN[ncu]


def _unknown(metrics: list[str], known: set[str]) -> list[str]:
    """Metrics whose base name is missing from `known`, judged only for families (the part before '__')
    that `known` lists at all."""
    families = {k.split("__")[0] for k in known}
    return [m for m in metrics if m.split("__")[0] in families and m.split(".")[0] not in known]


def _named_in(output: str, metrics: list[str]) -> list[str]:
    """The requested metrics that ncu's error lines name: by full name, else by base name."""
    errors = "\n".join(line for line in output.splitlines() if "error" in line.lower())
    full = [m for m in metrics if re.search(rf"{re.escape(m)}\b(?!\.)", errors)]
    return full or [m for m in metrics if m.split(".")[0] in errors]


def _ncu_command(ncu: str, name: str, metrics: list[str], report: Path) -> list[str]:
    # --clock-control none: the clocks as they are (ncu's own locking fails in the H200's VM);
    # --profile-from-start off: only the case's window, torch.cuda.profiler.start()/stop(), is profiled
    options = "--clock-control none --profile-from-start off --target-processes application-only"
    app = [sys.executable, "-m", "labkernels.profile", "run", name]
    return [ncu, *options.split(), "--metrics", ",".join(metrics), "--export", str(report), "-f", *app]


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH")) if p)
    return env


def run_ncu(name: str, metrics: list[str], *, keep: str | Path | None = None) -> tuple[str, list[str]]:
    """Profile case `name` for `metrics`; return (ncu's raw CSV page, the metrics measured). When ncu refuses
    a metric, the ones its error names (else the ones missing from its metric list) are dropped, with a
    warning, and the case runs again."""
    ncu, dropped = _require_ncu(), []
    with tempfile.TemporaryDirectory(prefix="labkernels-ncu-") as tmp:
        report = Path(tmp) / f"{name}.ncu-rep"
        for _attempt in range(3):
            done = _run(_ncu_command(ncu, name, metrics, report), NCU_TIMEOUT_S)
            if done.returncode == 0:
                break
            output = done.stdout + done.stderr
            refused = _named_in(output, metrics) or _unknown(metrics, known_metrics(ncu))
            if not refused:
                break
            dropped += refused
            metrics = [m for m in metrics if m not in refused]
        if "No kernels were profiled" in done.stdout + done.stderr:
            raise RuntimeError(
                f"case {name!r}: no kernel ran inside the profiler window (a cudaMemcpy, such as torch's "
                "copy between contiguous tensors, is not a kernel and ncu does not profile it)"
            )
        if done.returncode != 0 or not report.exists():
            tail = (done.stdout + done.stderr)[-3000:]
            raise RuntimeError(f"ncu failed on case {name!r} (exit {done.returncode}):\n{tail}")
        if dropped:
            warnings.warn(f"ncu here refused {dropped}: measured without them", stacklevel=2)
        if keep is not None:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(report, Path(keep) / report.name)
        page = _run([ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"], 120)
        if page.returncode != 0:
            raise RuntimeError(f"ncu could not read its report of {name!r}:\n{page.stderr[-2000:]}")
    return page.stdout, metrics


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=_environment(), check=False
    )


# --- ncu's raw CSV page -------------------------------------------------------------------------------------

# unit -> factor to the base unit the table uses: bytes, nanoseconds, bytes per second
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1.0, "us": 1e3, "ms": 1e6}
_UNIT = re.compile(r"([KMGT]?)(byte)(/second)?")
_KERNEL_COLUMNS = {"ID": "id", "Kernel Name": "kernel", "Block Size": "block", "Grid Size": "grid"}


def _scale(unit: str) -> float:
    """The factor from `unit` to the table's base unit (1 for units it does not convert: %, cycle, ...)."""
    if unit in _TIME:
        return _TIME[unit]
    match = _UNIT.fullmatch(unit)
    return _PREFIX[match.group(1)] if match else 1.0


def parse_value(text: str, unit: str = ""):
    """A raw-page cell as a number in base units ('1,234.5' with unit 'Kbyte' -> 1234500.0); 'n/a' and ''
    -> None; any other text stays text."""
    text = text.strip()
    if text in ("", "n/a", "N/A"):
        return None
    plain = text.replace(",", "")
    try:
        number = float(plain)
    except ValueError:
        return text
    number *= _scale(unit.strip())
    return int(number) if number.is_integer() and abs(number) < 2**53 and "." not in plain else number


def parse_raw_csv(text: str) -> list[dict]:
    """Rows of `ncu --import R --csv --page raw`: one per profiled kernel, the kernel's id, name, block and
    grid, and each metric as a number in base units (the second row of the page gives the units). Lines
    before the header (ncu's ==PROF== notes) are skipped."""
    lines = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(lines) if "ID" in r and "Kernel Name" in r), None)
    if start is None:
        raise ValueError("not an ncu raw CSV page: no header row with 'ID' and 'Kernel Name'")
    header, body = lines[start], lines[start + 1 :]
    units = [""] * len(header)
    if body and len(body[0]) == len(header) and body[0][header.index("ID")] == "":
        units, body = body[0], body[1:]
    rows = []
    for record in body:
        if len(record) != len(header):
            continue  # a blank or trailing line
        row = {}
        for column, unit, cell in zip(header, units, record, strict=True):
            if column in _KERNEL_COLUMNS:
                row[_KERNEL_COLUMNS[column]] = parse_value(cell) if column == "ID" else cell
            elif "__" in column:  # a metric; the page's other columns (process, device...) are dropped
                row[column] = parse_value(cell, unit)
        rows.append(row)
    return rows


# A qualified name: identifiers, "(anonymous namespace)" or "<unnamed>", joined by "::".
_QUALIFIED = re.compile(
    r"(?:void\s+)?((?:\w+|\(anonymous namespace\)|<unnamed>)(?:::(?:\w+|\(anonymous namespace\)|<unnamed>))*)"
)


def base_name(kernel: str) -> str:
    """A kernel's function name without 'void', namespaces, template arguments or parameters:
    'void ns::copy_2d_tiled_kernel<float, true>(const float *, ...)' -> 'copy_2d_tiled_kernel'. The name is
    the qualified name at the start, up to the first '<' or '(' that is not an anonymous namespace."""
    found = _QUALIFIED.match(kernel.strip())
    return found.group(1).split("::")[-1] if found else kernel.strip()


def kernel_matches(kernel: str, pattern: str | None) -> bool:
    """Whether `pattern` (a regex, searched) finds the kernel's base name or its full name. Triton names a
    kernel after its function (`_matmul_tiles`), Inductor `triton_<kind>_fused_<ops>_<n>`; CUDA names come
    demangled with their templates."""
    if pattern is None:
        return True
    return bool(re.search(pattern, base_name(kernel)) or re.search(pattern, kernel))


# --- derived columns ----------------------------------------------------------------------------------------

LIMITS = {
    "registers": "launch__occupancy_limit_registers",
    "shared_mem": "launch__occupancy_limit_shared_mem",
    "blocks": "launch__occupancy_limit_blocks",
    "warps": "launch__occupancy_limit_warps",
}


def _ratio(row: dict, top: str, bottom: str) -> float | None:
    a, b = row.get(top), row.get(bottom)
    if not isinstance(a, int | float) or not isinstance(b, int | float) or b == 0:
        return None
    return a / b


def _total(row: dict, *names: str) -> float | None:
    values = [row.get(n) for n in names]
    return sum(values) if all(isinstance(v, int | float) for v in values) else None


def occupancy_limiter(row: dict) -> str | None:
    """The resource that allows the fewest blocks per SM ('registers', 'shared_mem', 'blocks', 'warps');
    ties are joined with '='. None without the launch__occupancy_limit_* metrics."""
    limits = {k: row[m] for k, m in LIMITS.items() if isinstance(row.get(m), int | float)}
    if not limits:
        return None
    least = min(limits.values())
    return "=".join(k for k, v in limits.items() if v == least)


def derive(row: dict) -> dict:
    """Columns computed from a row's metrics, present only where their metrics are."""
    pipe = "l1tex__t_{}_pipe_lsu_mem_global_op_{}.sum"
    shared = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{0}.sum", "smsp__inst_executed_op_shared_{0}.sum"
    out = {
        "time_us": row[TIME] / 1e3 if isinstance(row.get(TIME), int | float) else None,
        "dram_bytes": _total(row, "dram__bytes_read.sum", "dram__bytes_write.sum"),
        "sectors_per_request_ld": _ratio(row, pipe.format("sectors", "ld"), pipe.format("requests", "ld")),
        "sectors_per_request_st": _ratio(row, pipe.format("sectors", "st"), pipe.format("requests", "st")),
        "shared_wavefronts_per_ld": _ratio(row, shared[0].format("ld"), shared[1].format("ld")),
        "shared_wavefronts_per_st": _ratio(row, shared[0].format("st"), shared[1].format("st")),
        "occupancy_limiter": occupancy_limiter(row),
        "spill_bytes": _total(
            row, "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"
        ),
        "load_bytes_per_request": _ratio(row, pipe.format("bytes", "ld"), pipe.format("requests", "ld")),
    }
    # The tensor pipe's own counter only: the SM's throughput beside it is any pipe's (a softmax keeps the SM
    # busy with the tensor cores idle), so it never stands in for it.
    tensor = row.get(QUESTIONS["tensor_pipe"][0])
    out["tensor_pipe_pct"] = tensor if isinstance(tensor, int | float) else None
    # One load instruction outstanding per resident warp: the bytes an SM keeps in flight at the least.
    warps, per_request = row.get("sm__warps_active.avg.per_cycle_active"), out["load_bytes_per_request"]
    if isinstance(warps, int | float) and per_request is not None:
        out["load_bytes_in_flight_per_sm"] = warps * per_request
    return {k: v for k, v in out.items() if v is not None}


def total_row(rows: list[dict]) -> dict:
    """One row standing for several kernels of a case, in the parsed page's metrics. Counts, bytes and
    durations (`.sum` metrics) add up; a %-of-peak over elapsed time is averaged weighted by each kernel's
    duration (the share of peak over the kernels' whole time). Per-launch settings, rates and other
    averages are left out: no sum of them means anything. `derive` then gives its columns."""
    out: dict = {"kernels": len(rows)}
    times = [r.get(TIME) for r in rows]
    names = dict.fromkeys(m for r in rows for m in r if "__" in m)
    for m in names:
        values = [r.get(m) for r in rows]
        if not all(isinstance(v, int | float) for v in values):
            continue  # a kernel without the value: no total, rather than a wrong one
        if m.endswith(".sum"):
            out[m] = sum(values)
        elif m.endswith(".pct_of_peak_sustained_elapsed") and all(isinstance(t, int | float) for t in times):
            if sum(times) > 0:
                out[m] = sum(v * t for v, t in zip(values, times, strict=True)) / sum(times)
    return out


def _summed(name: str, rows: list[dict], questions: list[str], measured: list[str]) -> dict:
    """The table row of `total_row`: the kernel column says how many kernels it sums."""
    raw = total_row(rows)
    derived = derive(raw)
    head = {"case": name, "kernel": f"sum of {len(rows)} kernels", "question": "+".join(questions)}
    return {**head, "kernels": raw["kernels"], **derived, **{m: raw[m] for m in measured if m in raw}}


# --- profile ------------------------------------------------------------------------------------------------


def profile(
    name: str, questions: str | Iterable[str] | None = None, *, keep: str | Path | None = None
) -> Table:
    """Profile case `name` under ncu for `questions` (a name from QUESTIONS, several, or None for the
    case's own); one row per kernel launched in its window (filtered by the case's kernel regex), with the
    metrics and the derived columns, then (case registered with `total=True`, several kernels) their sum.
    `keep`: a folder to copy the .ncu-rep report into."""
    c = get_case(name)
    questions = [questions] if isinstance(questions, str) else list(questions or c.questions)
    page, measured = run_ncu(name, metrics_for(questions), keep=keep)
    rows = [r for r in parse_raw_csv(page) if kernel_matches(r.get("kernel", ""), c.kernel)]
    if not rows:
        raise RuntimeError(f"case {name!r}: no kernel matching {c.kernel!r} ran inside the profiler window")
    missing = [m for m in measured if all(m not in r for r in rows)]
    if missing:
        warnings.warn(f"case {name!r}: ncu reported no value for {missing}", stacklevel=2)
    table = []
    for r in rows:
        metrics = {m: r[m] for m in measured if m in r}
        head = {"case": name, "kernel": base_name(r["kernel"]), "question": "+".join(questions)}
        table.append({**head, **derive(r), **metrics})
    if c.total and len(rows) > 1:
        table.append(_summed(name, rows, questions, measured))
    if c.model_bytes is not None:
        if len(table) == 1 or c.total:  # the last row stands for the whole case
            whole = table[-1]
            whole["model_bytes"] = c.model_bytes
            if isinstance(whole.get("dram_bytes"), int | float):
                whole["dram_vs_model"] = whole["dram_bytes"] / c.model_bytes
        else:
            warnings.warn(
                f"case {name!r}: {len(rows)} kernels and no total=True: model_bytes not set beside any row",
                stacklevel=2,
            )
    return Table(table)


def profile_rows(names: Iterable[str], *, keep: str | Path | None = None) -> list[dict]:
    """`profile(name)` for each case with its own questions, as rows for `make bench`; the case's one-line
    description is kept with each row."""
    keep = keep or os.environ.get("LABKERNELS_NCU_REPORTS")
    rows = []
    for name in names:
        rows += [{**r, "label": get_case(name).doc} for r in profile(name, keep=keep).rows]
    return rows


# --- showing the shipped tables -----------------------------------------------------------------------------

SHOW_COLUMNS = {
    "dram": [
        "time_us",
        "dram_bytes",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "model_bytes",  # cases that carry the traffic model's bytes only
        "dram_vs_model",
    ],
    "l2": ["time_us", "lts__t_sector_hit_rate.pct", "dram__bytes_read.sum"],
    "coalescing": ["sectors_per_request_ld", "sectors_per_request_st"],
    "shared_memory": [
        "shared_wavefronts_per_ld",
        "shared_wavefronts_per_st",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    ],
    "occupancy": [
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "sm__maximum_warps_per_active_cycle_pct",
        "launch__registers_per_thread",
        "occupancy_limiter",
    ],
    "tensor_pipe": ["time_us", "tensor_pipe_pct", "sm__throughput.avg.pct_of_peak_sustained_elapsed"],
    "spills": ["spill_bytes", "launch__registers_per_thread"],
    "in_flight": [
        "sm__warps_active.avg.per_cycle_active",
        "load_bytes_per_request",
        "load_bytes_in_flight_per_sm",
    ],
}
# The columns of SHOW_COLUMNS that hold numbers (the occupancy limiter is a name).
NUMERIC = {c for cs in SHOW_COLUMNS.values() for c in cs} - {"occupancy_limiter"}
# Short headings for the long metric names in `show`.
SHORT = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_%peak",
    "lts__t_sector_hit_rate.pct": "l2_hit_%",
    "dram__bytes_read.sum": "dram_read_bytes",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "bank_conflicts_ld",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "bank_conflicts_st",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occ_%",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occ_%",
    "launch__registers_per_thread": "regs/thread",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_%peak",
    "sm__warps_active.avg.per_cycle_active": "warps/SM",
    "sectors_per_request_ld": "sectors/req_ld",
    "sectors_per_request_st": "sectors/req_st",
    "shared_wavefronts_per_ld": "wavefronts/ld",
    "shared_wavefronts_per_st": "wavefronts/st",
    "load_bytes_per_request": "bytes/req",
    "load_bytes_in_flight_per_sm": "bytes_in_flight/SM",
    "tensor_pipe_pct": "tensor_pipe_%",
    "occupancy_limiter": "limiter",
    "dram_vs_model": "dram/model",
}


def _cell(value) -> str:
    """Three significant digits (counts below a million in full): the same text for the same CSV in either
    lane."""
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if isinstance(value, int) and abs(value) < 10**6:
        return f"{value:,}"
    if isinstance(value, int | float):
        return f"{value:.3g}"
    return "-" if value in (None, "") else str(value)


def summary(
    table: Table,
    questions: Iterable[str] | None = None,
    cases: Iterable[str] | None = None,
    *,
    per_kernel: bool = True,
) -> str:
    """A compact text table of `table`'s rows: case, kernel and the columns of `questions` (default: every
    question with a column present). `per_kernel=False`: a case with a sum row shows that row only."""
    rows = [r for r in table.rows if cases is None or r.get("case") in set(cases)]
    if not per_kernel:
        summed = {r.get("case") for r in rows if _is_sum(r)}
        rows = [r for r in rows if _is_sum(r) or r.get("case") not in summed]
    present = set(Table(rows).columns)
    chosen = list(questions) if questions is not None else list(SHOW_COLUMNS)
    _check_questions(chosen)
    columns = [c for q in chosen for c in SHOW_COLUMNS[q] if c in present]
    columns = ["case", "kernel", *dict.fromkeys(columns)]
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    # a case profiled for other questions has none of these counters: leave it out rather than print dashes
    cells = [row for row in cells if any(v != "-" for v, c in zip(row, columns, strict=True) if c in NUMERIC)]
    for row in cells:  # "ch02.transpose_torch" -> "transpose_torch": the table is already one chapter's
        row[0] = re.sub(r"^ch\d\d\.", "", row[0])
    heads = [SHORT.get(c, c) for c in columns]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(heads)]
    return "\n".join(_line(cells_, widths) for cells_ in [heads, *cells])


def _is_sum(row: dict) -> bool:
    """A row of `total_row` (it counts its kernels); a CSV read back gives "" to the other rows."""
    return isinstance(row.get("kernels"), int | float) and not isinstance(row.get("kernels"), bool)


def _line(cells: list[str], widths: list[int]) -> str:
    """Case and kernel left-aligned, numbers right-aligned."""
    return "  ".join(
        v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(cells, widths, strict=True))
    )


def show(
    reference_name: str, questions: str | Iterable[str] | None = None, cases=None, *, per_kernel: bool = True
) -> None:
    """Print the shipped profiler table `reference_name` (e.g. "ch02_profile"): one line per kernel (or per
    case's sum, `per_kernel=False`), the columns that answer `questions`. Reads the CSV only: the same
    output in both lanes."""
    table = load_reference(reference_name)
    if table is None:
        print(f"{reference_name}: no profiler results recorded yet (run `make bench` on a GPU with ncu)")
        return
    questions = [questions] if isinstance(questions, str) else questions
    print(summary(table, questions, cases, per_kernel=per_kernel))


# --- command line -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m labkernels.profile")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the registered cases and their questions")
    r = sub.add_parser("run", help="build a case and launch it in the profiler window (ncu runs this)")
    r.add_argument("case")
    p = sub.add_parser("profile", help="profile a case under ncu and print its table")
    p.add_argument("case")
    p.add_argument("--question", action="append", choices=sorted(QUESTIONS))
    p.add_argument("--keep", help="a folder to copy the .ncu-rep report into")
    args = parser.parse_args(argv)
    if args.command == "list":
        for c in discover().values():
            print(f"{c.name:40s} {'+'.join(c.questions):40s} {c.doc}")
    elif args.command == "run":
        run_case(args.case)
    else:
        table = profile(args.case, args.question, keep=args.keep)
        print(summary(table, args.question or get_case(args.case).questions))
    return 0


if __name__ == "__main__":
    # Run as `python -m labkernels.profile`: hand over to the imported module, so that the cases the
    # chapters register land in the same registry that `main` reads.
    from labkernels.profile import main as _main

    sys.exit(_main())
