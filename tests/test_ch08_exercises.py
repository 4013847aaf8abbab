"""Chapter 08's exercises: right answers score full marks; each common mistake loses the case that is about
it, with a reason; an answer that calls the chapter's models scores nothing; the graders' references agree
with hand-worked cases."""

import math

import pytest
import torch

import labkernels  # noqa: F401  (first: it picks the lane)
from labkernels.grading import format_record, grade
from labkernels.grading.exercises_ch08 import _attention_reference, _copy_reference, _waits_reference

# --- 8.1 ----------------------------------------------------------------------------------------------------


def ring_waits(k_steps, stages):
    waits, it = [], 0
    for steps in k_steps:
        tile = []
        for _ in range(steps):
            lap = it // stages
            tile.append((it % stages, lap & 1, (lap & 1) ^ 1))
            it += 1
        waits.append(tile)
    return waits


def ring_waits_restarting_each_tile(k_steps, stages):
    """Right within a tile; the ring's position restarts at every tile."""
    return [[(i % stages, (i // stages) & 1, ((i // stages) & 1) ^ 1) for i in range(n)] for n in k_steps]


def ring_waits_swapped_parities(k_steps, stages):
    """The producer waits for the consumer's parity and the other way round."""
    return [[(s, e, r) for s, r, e in tile] for tile in ring_waits(k_steps, stages)]


def ring_waits_with_the_course_models(k_steps, stages):
    from labkernels.ch08_hopper import models

    waits, it = [], 0
    for steps in k_steps:
        waits.append([(models.ring_slot(i, stages), models.ready_parity(i, stages),
                       models.empty_parity(i, stages)) for i in range(it, it + steps)])  # fmt: skip
        it += steps
    return waits


# --- 8.2 ----------------------------------------------------------------------------------------------------


def attention_stages(block_m, block_n, head_dim, consumers, in_bytes, out_bytes, barriers=24,
                     budget=227 * 1024, refuse=True):  # fmt: skip
    if refuse:
        for value in (block_m, block_n, head_dim, consumers):
            if not isinstance(value, int) or value < 1:
                raise ValueError("a size below 1")
        if in_bytes not in (1, 2, 4) or out_bytes not in (1, 2, 4):
            raise ValueError("element size")
        if block_m % 64 or max(block_m, block_n, head_dim) > 256:
            raise ValueError("block_m, or a box above 256")
        if head_dim * in_bytes % 16 or head_dim * out_bytes % 16:
            raise ValueError("a row of head_dim elements is not 16k bytes")
    fixed = consumers * (block_m * head_dim * (in_bytes + out_bytes) + 8)
    stages = (budget - fixed) // (2 * block_n * head_dim * in_bytes + barriers)
    if refuse and stages < 2:
        raise ValueError("fewer than two stages fit")
    return stages


def attention_stages_without_stage_barriers(block_m, block_n, head_dim, consumers, in_bytes, out_bytes):
    return attention_stages(block_m, block_n, head_dim, consumers, in_bytes, out_bytes, barriers=0)


def attention_stages_with_the_sm_budget(block_m, block_n, head_dim, consumers, in_bytes, out_bytes):
    return attention_stages(block_m, block_n, head_dim, consumers, in_bytes, out_bytes, budget=228 * 1024)


def attention_stages_never_refusing(block_m, block_n, head_dim, consumers, in_bytes, out_bytes):
    return attention_stages(block_m, block_n, head_dim, consumers, in_bytes, out_bytes, refuse=False)


def attention_stages_refusing_with_type_error(block_m, block_n, head_dim, consumers, in_bytes, out_bytes):
    try:
        return attention_stages(block_m, block_n, head_dim, consumers, in_bytes, out_bytes)
    except ValueError as e:
        raise TypeError(str(e)) from None


# --- 8.3 ----------------------------------------------------------------------------------------------------


def copy_ring_stages(bandwidth_gbps, latency_ns, box_rows, box_cols, element_bytes, sms, programs_per_sm,
                     reads=0.5, store_buffer=1, fit=True):  # fmt: skip
    tile = box_rows * box_cols * element_bytes
    in_flight = bandwidth_gbps * reads * latency_ns  # GB/s x ns = bytes
    stages = math.ceil(in_flight / (sms * programs_per_sm * tile)) + store_buffer
    ring = stages * (tile + 8)
    if fit and (ring > 227 * 1024 or programs_per_sm * ring > 228 * 1024):
        raise ValueError("the ring does not fit")
    return stages


def copy_ring_stages_counting_writes_in_flight(bw, latency, rows, cols, element_bytes, sms, programs_per_sm):
    return copy_ring_stages(bw, latency, rows, cols, element_bytes, sms, programs_per_sm, reads=1.0)


def copy_ring_stages_without_the_store_buffer(bw, latency, rows, cols, element_bytes, sms, programs_per_sm):
    return copy_ring_stages(bw, latency, rows, cols, element_bytes, sms, programs_per_sm, store_buffer=0)


def copy_ring_stages_that_always_fit(bw, latency, rows, cols, element_bytes, sms, programs_per_sm):
    return copy_ring_stages(bw, latency, rows, cols, element_bytes, sms, programs_per_sm, fit=False)


# --- the graders --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ex_id, answer", [("8.1", ring_waits), ("8.2", attention_stages), ("8.3", copy_ring_stages)]
)
def test_right_answers_get_full_marks(ex_id, answer):
    rec = grade(ex_id, answer)
    assert rec["possible"] == 4 and rec["earned"] == 4, format_record(rec)


def _failed(rec) -> dict[str, str]:
    return {c["case"]: c["reason"] for c in rec["cases"] if c["status"] == "fail"}


@pytest.mark.parametrize(
    "ex_id, answer, failing_case, reason, most",
    [
        ("8.1", ring_waits_restarting_each_tile, "its position runs on across tiles", "tile 1, step 0", 1),
        ("8.1", ring_waits_swapped_parities, "deliver every tile in order", "read an empty buffer", 0),
        ("8.2", attention_stages_without_stage_barriers, "the barriers, or 227 KB", "expected", 3),
        ("8.2", attention_stages_with_the_sm_budget, "the barriers, or 227 KB", "expected", 3),
        ("8.2", attention_stages_never_refusing, "refused with a ValueError", "expected a ValueError", 3),
        ("8.2", attention_stages_refusing_with_type_error, "refused with a ValueError", "got TypeError", 3),
        ("8.3", copy_ring_stages_counting_writes_in_flight, "an H200", "expected", 1),
        ("8.3", copy_ring_stages_without_the_store_buffer, "an H200", "expected", 0),
        ("8.3", copy_ring_stages_that_always_fit, "one stage more is refused", "expected a ValueError", 3),
    ],
)
def test_each_mistake_loses_its_case_with_a_reason(ex_id, answer, failing_case, reason, most):
    rec = grade(ex_id, answer)
    text = format_record(rec)
    failed = _failed(rec)
    assert rec["earned"] <= most, text
    assert any(failing_case in case and reason in why for case, why in failed.items()), text


def waits_of_a_table(k_steps, stages):
    return [[(0, 0, 1)] * n for n in k_steps]


def two_stages(*args):
    return 2


def refusing_everything(*args):
    raise ValueError("no")


@pytest.mark.parametrize(
    "ex_id, answer",
    [("8.1", waits_of_a_table), ("8.2", two_stages), ("8.3", two_stages), ("8.2", refusing_everything),
     ("8.3", refusing_everything)],
)  # fmt: skip
def test_constant_answers_score_nothing(ex_id, answer):
    rec = grade(ex_id, answer)
    assert rec["earned"] == 0, format_record(rec)


def test_an_answer_that_calls_the_chapter_models_is_refused():
    rec = grade("8.1", ring_waits_with_the_course_models)
    assert rec["possible"] == 4 and rec["earned"] == 0, format_record(rec)
    assert "your answer called labkernels.ch08_hopper.models." in format_record(rec)


# --- the references, by hand --------------------------------------------------------------------------------


def test_waits_run_on_across_tiles():
    # 3 stages: steps 0..4 of two tiles (2 + 3 steps); step 3 is slot 0's second use (lap 1)
    assert _waits_reference([2, 0, 3], 3) == [
        [(0, 0, 1), (1, 0, 1)],
        [],
        [(2, 0, 1), (0, 1, 0), (1, 1, 0)],
    ]


def test_attention_budget_by_hand():
    # two consumers of 64 rows, D 128, bf16: Q + O = 2 x (64 x 128 x 4 + 8) = 65552 bytes;
    # a stage: K + V = 2 x 128 x 128 x 2 + 24 = 65560 bytes; (232448 - 65552) // 65560 = 2
    assert _attention_reference(64, 128, 128, 2, 2, 2) == 2
    # with block_n 160 a stage is 81944 bytes: still two; with 176, 90136: one (refused)
    assert _attention_reference(64, 160, 128, 2, 2, 2) == 2
    assert _attention_reference(64, 176, 128, 2, 2, 2) == 1


def test_copy_ring_by_hand():
    # 4000 GB/s x 800 ns / 2 = 1.6 MB of reads in flight over 132 programs of 16 KiB tiles: 0.74 tiles each,
    # so one load ahead and one buffer being stored: 2 stages
    assert _copy_reference(4000.0, 800.0, 64, 128, 2, 132, 1) == 2
    # 8 SMs: 12.2 tiles each -> 13 + 1 = 14 stages of 16392 bytes = 229488: fits one program, not two an SM
    assert _copy_reference(4000.0, 800.0, 64, 128, 2, 8, 1) == 14
    assert _copy_reference(4000.0, 800.0, 64, 128, 2, 4, 2) == 0


# --- 8.4: a Gluon kernel, graded on a Hopper GPU only -------------------------------------------------------

import triton  # noqa: E402  (after labkernels: it picks the lane)
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

TILE = 64


@gluon.jit
def _transpose_kernel(in_desc, out_desc, FLIP: gl.constexpr, num_warps: gl.constexpr):
    rows: gl.constexpr = in_desc.block_type.shape[0]
    cols: gl.constexpr = in_desc.block_type.shape[1]
    row, col = gl.program_id(0) * rows, gl.program_id(1) * cols
    tile = gl.allocate_shared_memory(in_desc.dtype, [rows, cols], in_desc.layout)
    flipped = gl.allocate_shared_memory(out_desc.dtype, [cols, rows], out_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, in_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(in_desc, [row, col], bar, tile)
    mbarrier.wait(bar, 0)
    values = tile.load(gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0]))
    if FLIP:
        flipped.store(gl.permute(values, [1, 0]))
    else:
        flipped.store(values)
    fence_async_shared()
    tma.async_copy_shared_to_global(out_desc, [col, row], flipped)
    tma.store_wait(pendings=0)


def _launch_transpose(x, out, flip):
    dtypes = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}
    layout = gl.NVMMASharedLayout.get_default_for([TILE, TILE], dtypes[x.dtype])
    in_desc = TensorDescriptor.from_tensor(x, [TILE, TILE], layout)
    out_desc = TensorDescriptor.from_tensor(out, [TILE, TILE], layout)
    grid = (triton.cdiv(x.shape[0], TILE), triton.cdiv(x.shape[1], TILE))
    _transpose_kernel[grid](in_desc, out_desc, flip, num_warps=4)


def transpose(x, out):
    """A learner's right answer: its own Gluon kernel and launcher."""
    _launch_transpose(x, out, True)


def transpose_forgetting_to_flip(x, out):
    """Loads, stores at the swapped coordinates, but never permutes the tile."""
    _launch_transpose(x, out, False)


def test_a_gluon_exercise_off_hopper_is_skipped_and_costs_no_points():
    from labkernels.ch08_hopper.device import hopper_problem

    if labkernels.on_gpu() and hopper_problem(labkernels.DEVICE) is None:
        pytest.skip("a Hopper GPU grades the kernel: test_the_transpose_is_graded_on_hopper")
    rec = grade("8.4", transpose)
    text = format_record(rec)
    assert rec["possible"] == 0 and rec["earned"] == 0, text
    assert [c["status"] for c in rec["cases"]] == ["skip"] * 4, text
    assert "graded on a Hopper GPU only" in text and "(and 4 points graded on a Hopper GPU, not here)" in text
    speed = grade("8.4", transpose, speed=True)
    assert speed["possible"] == 0 and "2 points graded on a Hopper GPU" in format_record(speed)


@pytest.mark.gpu
def test_the_transpose_is_graded_on_hopper():
    from labkernels.ch08_hopper.device import hopper_problem

    if not labkernels.on_gpu() or hopper_problem(labkernels.DEVICE) is not None:
        pytest.skip("Gluon kernels run on a Hopper GPU only")
    right = grade("8.4", transpose)
    assert right["earned"] == right["possible"] == 4, format_record(right)
    wrong = grade("8.4", transpose_forgetting_to_flip)
    assert wrong["earned"] == 0 and "is not x transposed" in format_record(wrong), format_record(wrong)


def test_a_gluon_answer_ships_with_the_names_its_decorators_and_annotations_use(tmp_path):
    """`@gluon.jit` and `FLIP: gl.constexpr` are evaluated when the shipped module defines the kernel: the
    bundle must import them even where the body never names them (on the H200 it once did not: NameError)."""
    import importlib.util

    from labkernels.grading import sandbox

    source = sandbox.bundle(transpose)["source"]
    assert "import triton.experimental.gluon as gluon" in source
    path = tmp_path / "submission.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("submission", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the kernel: every decorator's name resolves
    assert callable(module.transpose) and hasattr(module._transpose_kernel, "fn")
