"""Chapter 02's exercises 2.2 and 2.3: no shipped function answers them (every graded chain of 2.2 holds an op
`views` does not model; 2.3 copies a batch of 3-D views, which the chapter's 2-D kernel does not), a right
answer scores full marks, and a mistake loses the cases that are about it."""

import random

import pytest
import torch

import labkernels  # noqa: F401  (first: it picks the lane before triton is imported)

# isort: split
import triton
import triton.language as tl

from labkernels.ch02_strides import views
from labkernels.grading import format_record, grade
from labkernels.grading.exercises_ch02 import NEW_VIEW_OPS, _apply_op, _random_chain

# --- 2.2 ----------------------------------------------------------------------------------------------------


def _cut(dims, d, *new):
    return dims[:d] + list(new) + dims[d + 1 :]


def _transpose(dims, offset, d0, d1):
    dims = list(dims)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return dims, offset


def _slice(dims, offset, d, start, stop, step):
    d %= len(dims)
    return _cut(dims, d, (len(range(start, stop, step)), dims[d][1] * step)), offset + start * dims[d][1]


def _expand(dims, offset, target):
    dims = [(1, 0)] * (len(target) - len(dims)) + dims
    return [(w, 0) if w not in (-1, n) else (n, s) for (n, s), w in zip(dims, target, strict=True)], offset


def _unsqueeze(dims, offset, d):
    d %= len(dims) + 1
    return dims[:d] + [(1, dims[d][0] * dims[d][1] if d < len(dims) else 1)] + dims[d:], offset


def _squeeze(dims, offset, d):
    d %= len(dims)
    return (_cut(dims, d) if dims[d][0] == 1 else dims), offset


def _unfold(dims, offset, d, size, step):
    d %= len(dims)
    n, s = dims[d]
    return _cut(dims, d, ((n - size) // step + 1, s * step)) + [(size, s)], offset


def _unfold_with_the_window_stride_inside(dims, offset, d, size, step):
    """Gives a window's elements the stride between windows (stride * step), not the dim's own stride."""
    d %= len(dims)
    n, s = dims[d]
    return _cut(dims, d, ((n - size) // step + 1, s * step)) + [(size, s * step)], offset


def _diagonal(dims, offset, k, d1, d2):
    d1, d2 = d1 % len(dims), d2 % len(dims)
    (n1, s1), (n2, s2) = dims[d1], dims[d2]
    length, start = (min(n1, n2 - k), k * s2) if k >= 0 else (min(n1 + k, n2), -k * s1)
    return [p for j, p in enumerate(dims) if j not in (d1, d2)] + [(length, s1 + s2)], offset + start


def _permute(dims, offset, order):
    return [dims[k] for k in order], offset


def _narrow(dims, offset, d, start, length):
    return _slice(dims, offset, d, start, start + length, 1)


def _select(dims, offset, d, i):
    d %= len(dims)
    return _cut(dims, d), offset + i * dims[d][1]


def _rules(package_ops_only=False, wrong_unfold=False):
    """One rule per op; graded answers ship as source, so the table is built inside a function."""
    rules = {"transpose": _transpose, "permute": _permute, "slice": _slice, "narrow": _narrow}
    rules.update(select=_select, expand=_expand, unsqueeze=_unsqueeze)
    if not package_ops_only:
        rules.update(squeeze=_squeeze, unfold=_unfold, diagonal=_diagonal)
    if wrong_unfold:
        rules["unfold"] = _unfold_with_the_window_stride_inside
    return rules


def _predict(sizes, strides, offset, ops, rules):
    dims = list(zip(sizes, strides, strict=True))
    for kind, *args in ops:
        if kind in rules:  # an op it does not know leaves the view as it was
            dims, offset = rules[kind](dims, offset, *args)
    row_major, wanted = True, 1
    for n, s in reversed(dims):
        row_major = row_major and (n == 1 or s == wanted)
        wanted *= n
    return tuple(n for n, _ in dims), tuple(s for _, s in dims), offset, row_major


def predict_view(sizes, strides, offset, ops):
    return _predict(sizes, strides, offset, ops, _rules())


def predict_view_knowing_the_seven_package_ops(sizes, strides, offset, ops):
    return _predict(sizes, strides, offset, ops, _rules(package_ops_only=True))


def predict_view_with_a_wrong_unfold(sizes, strides, offset, ops):
    return _predict(sizes, strides, offset, ops, _rules(wrong_unfold=True))


def test_every_graded_chain_of_2_2_holds_an_op_the_package_does_not_model():
    rng = random.Random(2)
    kinds = views.VIEW_OPS + NEW_VIEW_OPS
    for _ in range(300):
        base = torch.empty(400)[rng.randint(0, 50) :][:60].view(3, 4, 5)
        ops, t = _random_chain(base, rng, rng.choice([kinds, ("unfold", "slice"), ("squeeze", "expand")]))
        assert any(op[0] in NEW_VIEW_OPS for op in ops)
        with pytest.raises(ValueError, match="unknown view op"):
            views.predict_view(base.shape, base.stride(), base.storage_offset(), ops)
        want = (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.is_contiguous())
        assert predict_view(base.shape, base.stride(), base.storage_offset(), ops) == want, ops


def test_new_view_ops_are_applied_with_torch():
    t = torch.empty(100)[5:][:60].view(3, 4, 5)
    assert _apply_op(t, ("unfold", 1, 2, 1)).stride() == (20, 5, 1, 5)
    assert _apply_op(t, ("diagonal", -1, 0, -1)).storage_offset() == 25
    assert _apply_op(t.unsqueeze(1), ("squeeze", -3)).shape == (3, 4, 5)


def test_exercise_2_2_passes_a_right_answer():
    rec = grade("2.2", predict_view)
    assert rec["earned"] == rec["possible"] == 4, format_record(rec)


def test_exercise_2_2_an_answer_knowing_only_the_package_ops_scores_nothing():
    rec = grade("2.2", predict_view_knowing_the_seven_package_ops)
    assert rec["earned"] == 0, format_record(rec)
    assert len(rec["cases"]) == 4 and all(c["status"] == "fail" for c in rec["cases"]), format_record(rec)


def test_exercise_2_2_a_wrong_unfold_loses_the_cases_with_unfold():
    rec = grade("2.2", predict_view_with_a_wrong_unfold)
    failed = {c["case"] for c in rec["cases"] if c["status"] == "fail"}
    want = {"unfold among transpose, slice and narrow", "random chains of every op"}
    assert failed == want, format_record(rec)


# --- 2.3 ----------------------------------------------------------------------------------------------------

TILE = 32


@triton.jit
def _tiles_kernel(x_ptr, out_ptr, M, N, sb, sm, sn, BLOCK: tl.constexpr):
    b = tl.program_id(1).to(tl.int64)
    per_row = tl.cdiv(N, BLOCK)
    r = (tl.program_id(0) // per_row) * BLOCK + tl.arange(0, BLOCK)
    c = (tl.program_id(0) % per_row) * BLOCK + tl.arange(0, BLOCK)
    ok = (r[:, None] < M) & (c[None, :] < N)
    values = tl.load(x_ptr + b * sb + r[:, None] * sm + c[None, :] * sn, mask=ok)
    tl.store(out_ptr + (b * M + r[:, None]) * N + c[None, :], values, mask=ok)


def copy_3d(x, out):
    B, M, N = x.shape
    grid = (triton.cdiv(M, TILE) * triton.cdiv(N, TILE), B)
    _tiles_kernel[grid](x, out, M, N, *x.stride(), BLOCK=TILE)


def copy_3d_as_rows_of_one_matrix(x, out):
    """The chapter's 2-D kernel on x seen as (B*M, N) rows: right only where the batch stride is M rows."""
    B, M, N = x.shape
    grid = (triton.cdiv(B * M, TILE) * triton.cdiv(N, TILE), 1)
    _tiles_kernel[grid](x, out, B * M, N, 0, x.stride(1), x.stride(2), BLOCK=TILE)


def test_exercise_2_3_passes_a_right_batched_kernel():
    rec = grade("2.3", copy_3d)
    assert rec["earned"] == rec["possible"] == 5, format_record(rec)


def test_exercise_2_3_the_2d_kernel_on_flattened_rows_loses_every_case_with_another_batch_stride():
    rec = grade("2.3", copy_3d_as_rows_of_one_matrix)
    passed = {c["case"] for c in rec["cases"] if c["status"] == "pass"}
    want = {"a contiguous batch of matrices", "a stepped view with a storage offset (x[1:, ::2, 2::3])"}
    assert passed == want, format_record(rec)
