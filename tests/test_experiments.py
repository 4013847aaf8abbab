"""The GPU experiments (experiments/, see its README) still run: their CPU-lane smoke modes (the interpreter,
tiny shapes, every variant checked against fp64 with its output poisoned first). Device time is scarce; a
script broken by a change to the package should fail here, not on the GPU."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import labkernels

ROOT = Path(__file__).resolve().parent.parent
cpu_lane = pytest.mark.skipif(labkernels.on_gpu(), reason="smoke modes are the CPU lane's (the interpreter)")


@cpu_lane
@pytest.mark.parametrize("script", ["epilogue_variants.py", "int8_variants.py", "int8_tiles.py"])
def test_experiment_smoke_mode_passes(script):
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'experiments'}"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / script), "--smoke", "--budget-s", "600"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " 0 failed or errored" in done.stdout


@cpu_lane
def test_weight_gemv_designs_smoke_mode_passes():
    """Every GEMV design of experiments/weight_gemv.py (int8 and int4, split and not, 1 to 16 rows) matches
    fp64 under the interpreter: the sweep behind chapter 05's GEMV designs times only correct kernels."""
    out = _smoke_output("weight_gemv.py")
    assert out.count("smoke ") >= 20 and "err nan" not in out


def _smoke_output(script: str) -> str:
    """stdout of `experiments/<script> --smoke`, which must exit 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / script), "--smoke"],
        cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@cpu_lane
def test_int4_gemv_designs_smoke_mode_passes():
    """experiments/int4_gemv.py: the one-row 4-bit GEMV with one logic op a weight (`lop`: nibbles OR-ed into
    the floats 128 and 2048, their offsets taken off once a word) matches fp64 under the interpreter, beside
    the `fma` design it is measured against, and `lop_pf` / `lop_pf2` (the next one or two steps' words
    loaded before this step's conversion)."""
    out = _smoke_output("int4_gemv.py")
    errors = [float(line.rsplit("err ", 1)[1]) for line in out.splitlines() if line.startswith("smoke int4")]
    assert len(errors) == 7 and max(errors) < 5e-3
    assert out.count("smoke int4 lop ") == 2 and out.count("smoke int4 lop_pf ") == 2
    assert out.count("smoke int4 lop_pf2 ") == 2


@cpu_lane
def test_alignment_experiment_smoke_mode_passes():
    """experiments/alignment.py: the tiled kernel with ALIGN = 1 and with the true alignment, both checked."""
    out = _smoke_output("alignment.py")
    assert "'align': 1," in out and "'align': 4," in out


@cpu_lane
def test_register_race_diagnosis_smoke_mode_passes():
    """experiments/conv_box_diagnose.py: the TF32 B^T-from-registers kernel it repeats on the GPU, with and
    without the wait, and the shipped path with either K-major kernel, checked."""
    out = _smoke_output("conv_box_diagnose.py")
    assert "wait=False: 0/2 differ, 0 wrong" in out and "wait=True: 0/2 differ, 0 wrong" in out
    errors = [float(line.rsplit("rel err ", 1)[1]) for line in out.splitlines() if line.startswith("k_major")]
    assert len(errors) == 4 and max(errors) < 1e-2  # TMA and pointer kernels, both layouts of B
    assert out.count("k_major TMA") == out.count("launched k_major_tma;") == 2
    assert out.count("k_major pointer") == out.count("launched k_major;") == 2


@cpu_lane
def test_tuning_cost_smoke_mode_passes():
    """experiments/tuning_cost.py: two fresh tunings of the tiled matmul (the second must tune again, from
    cleared caches), and gc's cost."""
    out = _smoke_output("tuning_cost.py")
    assert out.count("pick BLOCK_SIZE_M") == 2 and "host, again" in out
    assert "gc.collect() in this process" in out


@cpu_lane
def test_tuning_cost_ranks_smoke_mode_passes():
    """experiments/tuning_cost.py --ranks: each config the pruning keeps, launched alone, timed in every round
    by both timers."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "tuning_cost.py"), "--ranks", "--smoke"],
        cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if " ranks: " in line]
    assert lines and all(len(line.split("graph_ms ")[1].split("shipped")[0].split()) == 3 for line in lines)


@cpu_lane
@pytest.mark.parametrize(
    "script, checked",
    [
        ("wide_tiles.py", 8),
        ("sk_tail.py", 8),
        ("wave_tail.py", 6),
        ("one_launch_tail.py", 6),
        ("tma_variants.py", 3),
    ],
)
def test_matmul_fill_experiments_cpu_smoke_passes(script, checked):
    """Tiles of power-of-two blocks, the stream-K tail (tickets, bitwise repeatable, tickets reset), the
    leftover tiles as a second launch and in the same launch, the TMA kernel's epilogue in column slices:
    each variant checked on odd shapes."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / script), "--cpu-smoke"],
        cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "WRONG" not in done.stdout and done.stdout.count(" ok") >= checked


# --- the house: what is course and what is experiment -------------------------------------------------


def _index_rows() -> dict[str, str]:
    """experiments/README.md's index: script -> its row."""
    rows = {}
    for line in (ROOT / "experiments" / "README.md").read_text().splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            for name in re.findall(r"`([\w.]+\.py)`", first):
                rows[name] = line
    return rows


def test_every_experiment_is_in_the_index_with_what_it_wrote():
    """Each script, CUDA source and job script in experiments/ has its row in the README's index (script ->
    the CSV it wrote -> the notebook section that reads it), so a newcomer can tell what each one is for. The
    shared helpers are named in the README's text."""
    readme = (ROOT / "experiments" / "README.md").read_text()
    rows = _index_rows()
    missing = []
    for path in sorted((ROOT / "experiments").iterdir()):
        if path.suffix not in (".py", ".sh", ".cu", ".cuh"):
            continue
        sibling = rows.get(path.with_suffix(".py").name, "")
        if path.name in rows or f"`{path.name}`" in readme or (path.suffix == ".sh" and "`.sh`" in sibling):
            continue
        missing.append(path.name)
    assert not missing, f"not in experiments/README.md's index: {missing}"
    assert {"recording.py", "sm90.py"} <= {p.name for p in (ROOT / "experiments").glob("*.py")}


def test_every_shipped_record_is_read_or_indexed():
    """A reference CSV is read by a notebook, the package or a test, or is named in the experiments' index as
    the record of the experiment behind a choice: none is left that nothing shows or explains."""
    import glob

    patterns = ("notebooks/*.ipynb", "notebooks/appendix/*.ipynb", "labkernels/**/*.py", "tests/*.py",
                "solutions/*.ipynb", "experiments/README.md")  # fmt: skip
    files = [p for pattern in patterns for p in glob.glob(str(ROOT / pattern), recursive=True)]
    texts = [Path(p).read_text(errors="replace") for p in files]
    blob = "\n".join(texts)
    unread = [p.name for p in sorted((ROOT / "labkernels" / "reference").glob("*.csv")) if p.stem not in blob]
    assert not unread, f"reference CSVs that nothing reads or indexes: {unread}"


def test_the_house_checks_can_fail(tmp_path, monkeypatch):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "README.md").write_text("| `a.py` (`.sh`) | x.csv | 01 |\n")
    for name in ("a.py", "a.sh", "b.py", "recording.py", "sm90.py"):
        (tmp_path / "experiments" / name).write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match=r"\['b.py', 'recording.py', 'sm90.py'\]"):
        test_every_experiment_is_in_the_index_with_what_it_wrote()
