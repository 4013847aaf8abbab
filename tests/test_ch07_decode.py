"""Chapter 07 kernels: split-KV decode attention (contiguous and paged), the paged cache's append and
block-table checks, the 4-bit GEMV, and the decode step, against float64 references on fresh inputs; odd
shapes, poisoned outputs, bad inputs, opcheck and a fullgraph compile. CPU-lane sizes stay tiny (the
interpreter's cost is per program)."""

import math

import pytest
import torch

import labkernels
from labkernels.ch07_decode import bench, int4, paged, rope_append
from labkernels.ch07_decode import decode_attention as dec
from labkernels.ch07_decode import decode_step as ds

DEVICE = labkernels.DEVICE
ON_GPU = labkernels.on_gpu()
gpu = pytest.mark.skipif(not ON_GPU, reason="needs the GPU lane")
DTYPES = [torch.float32, torch.float16] if not ON_GPU else [torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _randn(*shape, dtype):
    return torch.randn(*shape, device=DEVICE).to(dtype)


def _attention_inputs(batch, q_heads, kv_heads, n_tokens, seq_len, head_dim, dtype):
    q = _randn(batch, q_heads, n_tokens, head_dim, dtype=dtype)
    k = _randn(batch, kv_heads, seq_len, head_dim, dtype=dtype)
    v = _randn(batch, kv_heads, seq_len, head_dim, dtype=dtype)
    return q, k, v


def _close(got, want, dtype):
    torch.testing.assert_close(got.double(), want.to(got.device), atol=TOL[dtype], rtol=TOL[dtype])


# --- decode attention ---------------------------------------------------------------------------------------

SHAPES = [  # (B, Hq, Hkv, T, L, D, splits)
    (1, 4, 1, 1, 77, 64, None),
    (3, 8, 1, 3, 45, 64, 3),
    (2, 2, 2, 2, 33, 128, 1),
    (1, 8, 2, 8, 130, 64, 4),
    (5, 4, 4, 1, 17, 64, 2),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}_Hq{}_Hkv{}_T{}_L{}_D{}_s{}".format(*s))
def test_decode_attention_matches_float64(shape, dtype):
    batch, q_heads, kv_heads, n_tokens, seq_len, head_dim, splits = shape
    q, k, v = _attention_inputs(batch, q_heads, kv_heads, n_tokens, seq_len, head_dim, dtype)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    dec.launch(q, k, v, out, max_len=seq_len, sm_scale=head_dim**-0.5, splits=splits)
    _close(out, dec.reference(q, k, v), dtype)
    _close(dec.decode_attention(q, k, v, splits=splits), dec.reference(q, k, v), dtype)


def test_decode_attention_large_scores_and_strided_q():
    dtype = DTYPES[0]
    q, k, v = _attention_inputs(2, 4, 2, 2, 70, 64, dtype)
    wide = (torch.randn(2, 4, 2, 64 + 8, device=DEVICE) * 30).to(dtype)
    q = wide[..., :64]  # rows strided, last dim contiguous
    got, want = dec.decode_attention(q, k * 3, v, splits=3), dec.reference(q, k * 3, v)
    tol = max(TOL[dtype], 1e-4)  # scores in the hundreds: fp32's exp loses a few more bits
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


def test_causal_within_the_new_tokens():
    """Token t of T sees L - T + t + 1 keys: changing the last key changes only the last token's output."""
    q, k, v = _attention_inputs(1, 2, 2, 3, 40, 64, DTYPES[0])
    before = dec.decode_attention(q, k, v, splits=2)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, -1] += 5
    v2[:, :, -1] += 5
    after = dec.decode_attention(q, k2, v2, splits=2)
    torch.testing.assert_close(after[:, :, :2], before[:, :, :2])
    assert not torch.allclose(after[:, :, 2], before[:, :, 2])


def test_num_splits_model():
    assert dec.num_splits(1, 8, 4096, sms=132) == 16  # capped by MIN_SPLIT_KEYS: 4096 / 256
    assert dec.num_splits(1, 8, 131072, sms=132) == 33  # 2 programs an SM over 8 pairs
    assert dec.num_splits(64, 8, 131072, sms=132) == 1  # 512 pairs already fill 132 SMs
    assert dec.num_splits(1, 1, 10**7, sms=132) == dec.MAX_SPLITS
    assert dec.num_splits(1, 8, 1, sms=132) == 1


def test_traffic_counts_the_cache_once():
    t = dec.traffic(2, 32, 8, 1, 1000, 128, torch.bfloat16)
    assert t.bytes == (2 * 2 * 8 * 1000 * 128 + 2 * 2 * 32 * 128) * 2
    assert t.flops == 4 * 2 * 32 * 1000 * 128
    assert int4.traffic(1, 4096, 4096).bytes == 4096 * 4096 // 2 + (4096 + 4096 * 32 + 4096) * 2


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda q, k, v: (q.double(), k, v), "dtype"),
        (lambda q, k, v: (q[:, :3], k, v), "query heads"),
        (lambda q, k, v: (q, k[..., :32], v[..., :32]), "head dim"),
        (lambda q, k, v: (q.expand(-1, -1, 9, -1), k, v), "new tokens"),
        (lambda q, k, v: (q, k, v[:, :, :5]), "must match"),
        (lambda q, k, v: (q[:1], k, v), "batch"),
        (lambda q, k, v: (q, k.transpose(-1, -2), v.transpose(-1, -2)), "contiguous"),
        (lambda q, k, v: (q.requires_grad_(), k, v), "inference only"),
        (lambda q, k, v: (q, k[:, :, :0], v[:, :, :0]), "fewer than"),
        (lambda q, k, v: ([1.0], k, v), "torch.Tensor"),
    ],
)
def test_decode_attention_refuses_bad_inputs(bad, message):
    q, k, v = _attention_inputs(2, 4, 2, 1, 20, 64, DTYPES[0])
    with pytest.raises((ValueError, TypeError, RuntimeError), match=message):
        dec.decode_attention(*bad(q, k, v))


# --- paged cache --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [8, 32, 64])  # below, at and above the kernel's tile of keys
def test_paged_matches_contiguous_with_ragged_lengths(block_size):
    dtype = DTYPES[0]
    q, k, v = _attention_inputs(3, 8, 2, 2, 100, 64, dtype)
    k_pool, v_pool, table = paged.paginate(k, v, block_size, spare_blocks=3)
    lens = torch.tensor([100, 2, 57], dtype=torch.int32, device=DEVICE)  # the 2-token one leaves splits empty
    got = paged.paged_decode_attention(q, k_pool, v_pool, table, lens, splits=4)
    _close(got, dec.reference(q, k, v, lens), dtype)
    full = torch.full_like(lens, 100)
    same = paged.paged_decode_attention(q, k_pool, v_pool, table, full)
    torch.testing.assert_close(same, dec.decode_attention(q, k, v), atol=TOL[dtype], rtol=TOL[dtype])


def test_cache_append_and_attend_one_token_at_a_time():
    dtype = DTYPES[0]
    cache = paged.PagedKVCache(12, 8, 2, 64, batch=2, max_pages=4, dtype=dtype, device=DEVICE)
    cache.reserve(0, 20)
    cache.reserve(1, 11)
    ks, vs = [], []
    for step in range(11):
        k_new, v_new = _randn(2, 2, 1, 64, dtype=dtype), _randn(2, 2, 1, 64, dtype=dtype)
        cache.append(k_new, v_new)
        ks.append(k_new)
        vs.append(v_new)
        assert cache.seq_lens.tolist() == [step + 1, step + 1]
    k, v = torch.cat(ks, dim=2), torch.cat(vs, dim=2)
    got_k, got_v = paged.gather(cache.k_pool, cache.v_pool, cache.block_table, cache.seq_lens)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
    q = _randn(2, 4, 1, 64, dtype=dtype)
    _close(cache.attend(q), dec.reference(q, k, v), dtype)
    with pytest.raises(ValueError, match=r"block_table\[1, 2\] = -1 is outside the pool"):
        cache.append(_randn(2, 2, 8, 64, dtype=dtype), _randn(2, 2, 8, 64, dtype=dtype))  # seq 1 has 2 blocks


def test_append_several_tokens_across_a_block_boundary():
    dtype = DTYPES[0]
    k_pool = torch.zeros(6, 1, 4, 64, dtype=dtype, device=DEVICE)
    v_pool = torch.zeros_like(k_pool)
    table = torch.tensor([[5, 2, 0]], dtype=torch.int32, device=DEVICE)
    pos = torch.tensor([3], dtype=torch.int32, device=DEVICE)
    k_new, v_new = _randn(1, 1, 3, 64, dtype=dtype), _randn(1, 1, 3, 64, dtype=dtype)
    paged.paged_append(k_pool, v_pool, table, pos, k_new, v_new)
    assert torch.equal(k_pool[5, 0, 3], k_new[0, 0, 0]) and torch.equal(k_pool[2, 0, :2], k_new[0, 0, 1:])
    assert torch.equal(v_pool[2, 0, 1], v_new[0, 0, 2])
    assert int((k_pool != 0).any(dim=-1).sum()) == 3  # nothing else written


def test_unvalidated_table_never_touches_outside_the_pool():
    """validate=False (inside a CUDA graph): block ids outside the pool are masked, reads and writes."""
    dtype = DTYPES[0]
    q, k, v = _attention_inputs(1, 2, 2, 1, 40, 64, dtype)
    k_pool, v_pool, table = paged.paginate(k, v, 16)
    guard = torch.full((3 * k_pool.numel(),), 7.0, dtype=dtype, device=DEVICE)
    pools = guard[k_pool.numel() :].view(2, *k_pool.shape)
    pools[0].copy_(k_pool)
    pools[1].copy_(v_pool)
    bad = table.clone()
    bad[0, 1] = 10**6
    lens = torch.tensor([40], dtype=torch.int32, device=DEVICE)
    out = paged.paged_decode_attention(q, pools[0], pools[1], bad, lens, validate=False)
    assert torch.isfinite(out).all()
    keep = torch.ones(40, dtype=torch.bool)
    keep[16:32] = False  # the keys of the bad block are masked out
    _close(out, dec.reference(q, k[:, :, keep], v[:, :, keep]), dtype)
    before = guard.clone()
    pos = torch.tensor([20], dtype=torch.int32, device=DEVICE)
    new = _randn(1, 2, 1, 64, dtype=dtype)
    paged.paged_append(pools[0], pools[1], bad, pos, new, new.clone(), validate=False)
    assert torch.equal(guard, before)  # the token's block is outside the pool: nothing written anywhere


def _table_case(kind):
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    lens = torch.tensor([40, 33], dtype=torch.int32)
    if kind == "out of range":
        table[1, 2] = 6
    elif kind == "negative":
        table[0, 0] = -1
    elif kind == "duplicated":
        table[1, 0] = 2
    elif kind == "too short":
        lens[1] = 49
    return table.to(DEVICE), lens.to(DEVICE)


@pytest.mark.parametrize(
    "kind, message",
    [
        ("out of range", r"block_table\[1, 2\] = 6 is outside the pool of 6"),
        ("negative", r"block_table\[0, 0\] = -1"),
        ("duplicated", "block 2 is used twice"),
        ("too short", "too short"),
    ],
)
def test_block_table_errors(kind, message):
    table, lens = _table_case(kind)
    k_pool = torch.zeros(6, 2, 16, 64, dtype=DTYPES[0], device=DEVICE)
    q = _randn(2, 4, 1, 64, dtype=DTYPES[0])
    with pytest.raises(ValueError, match=message):
        paged.paged_decode_attention(q, k_pool, k_pool.clone(), table, lens)


def test_a_valid_table_passes_and_unused_entries_may_be_anything():
    table, lens = _table_case("none")
    table[1, 2] = -1  # sequence 1 holds 33 tokens: 3 blocks of 16... so shorten it to 2 blocks
    lens[1] = 32
    paged.validate_block_table(table, lens, 6, 16)


@pytest.mark.parametrize(
    "change, message",
    [
        ("int64 table", "int32"),
        ("odd block size", "power of two"),
        ("short lengths", "shorter than"),
        ("lengths of another batch", "sequences"),
    ],
)
def test_paged_refuses_bad_inputs(change, message):
    dtype = DTYPES[0]
    q, k, v = _attention_inputs(2, 4, 2, 2, 30, 64, dtype)
    block = 12 if change == "odd block size" else 16
    k_pool, v_pool, table = paged.paginate(k, v, block)
    lens = torch.full((2,), 30, dtype=torch.int32, device=DEVICE)
    if change == "int64 table":
        table = table.long()
    elif change == "short lengths":
        lens[0] = 1
    elif change == "lengths of another batch":
        lens = lens[:1]
    with pytest.raises((ValueError, TypeError), match=message):
        paged.paged_decode_attention(q, k_pool, v_pool, table, lens)


def test_append_refuses_overlap_and_mismatch():
    k_pool = torch.zeros(4, 2, 16, 64, dtype=DTYPES[0], device=DEVICE)
    table = torch.tensor([[0, 1]], dtype=torch.int32, device=DEVICE)
    pos = torch.tensor([0], dtype=torch.int32, device=DEVICE)
    new = torch.zeros(1, 2, 1, 64, dtype=DTYPES[0], device=DEVICE)
    with pytest.raises(ValueError, match="overlap"):
        paged.paged_append(k_pool, k_pool, table, pos, new, new.clone())
    with pytest.raises(ValueError, match="does not match"):
        paged.paged_append(k_pool, k_pool.clone(), table, pos, new[:, :1], new[:, :1].clone())


# --- 4-bit weights ------------------------------------------------------------------------------------------


def test_pack_unpack_and_quantize():
    q = torch.randint(0, 16, (7, 256), dtype=torch.uint8)
    packed = int4.pack_int4(q)
    assert packed.shape == (7, 128) and torch.equal(int4.unpack_int4(packed), q)
    assert torch.equal(packed[0, 0], q[0, 0] | (q[0, 1] << 4))  # the even k in the low nibble
    w = torch.randn(5, 384)
    packed, scales = int4.quantize_int4(w)
    err = (int4.dequantize_int4(packed, scales) - w).abs()
    assert (err <= scales.repeat_interleave(128, dim=1) / 2 + 1e-6).all()  # half a step at most


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m, n, k, splits", [(1, 100, 256, None), (3, 70, 512, 3), (5, 33, 384, 2), (16, 64, 128, 1)]
)
def test_int4_matmul_matches_float64(m, n, k, splits, dtype, poisoned_int4_outputs):
    a = _randn(m, k, dtype=dtype)
    packed, scales = int4.quantize_int4(_randn(n, k, dtype=dtype))
    got = int4.int4_matmul(a, packed, scales, **({"splits": splits} if splits else {}))
    want = int4.reference(a, packed, scales)
    tol = TOL[dtype] * max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=TOL[dtype])


@pytest.fixture
def poisoned_int4_outputs(monkeypatch):
    """Every output and partial-sum buffer of the int4 kernels starts as NaN: an element no program writes
    shows up in the result."""
    monkeypatch.setattr(
        int4,
        "_output",
        lambda shape, like, dtype: torch.full(shape, float("nan"), device=like.device, dtype=dtype),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n, k, config",
    [
        (100, 256, {}),  # the lane's defaults
        (70, 640, {"splits": 3, "block_n": 16}),  # 5 groups in splits of 2, 2, 1; a partial column tile
        (
            33,
            384,
            {"splits": 1, "block_n": 32, "num_warps": 2},
        ),  # one group a step, the prefetch past the end
        (129, 128, {"splits": 4, "block_n": 64}),  # one group: the split count shrinks to 1
    ],
)
def test_int4_one_row_kernel_matches_float64(n, k, config, dtype, poisoned_int4_outputs):
    a = _randn(1, k, dtype=dtype)
    packed, scales = int4.quantize_int4(_randn(n, k, dtype=dtype))
    got = int4.int4_matmul(a, packed, scales, row=True, **config)
    want = int4.reference(a, packed, scales)
    tol = TOL[dtype] * max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=TOL[dtype])
    many_rows = int4.int4_matmul(a, packed, scales, row=False).double()  # the other kernel, same answer
    torch.testing.assert_close(got.double(), many_rows, atol=tol, rtol=TOL[dtype])


def test_int4_one_row_config_fills_the_sms():
    """The one-row defaults reproduce the H200's measured best (K = 4096: 128 columns, 4 warps, 16 splits of
    2 groups at N = 4096; 64 columns, 2 warps, 4 splits of 8 groups at N = 14336), and every split is whole,
    non-empty groups."""
    assert int4.row_config(4096, 4096, sms=132) == {"block_n": 128, "num_warps": 4, "splits": 16}
    assert int4.row_config(14336, 4096, sms=132) == {"block_n": 64, "num_warps": 2, "splits": 4}
    for n, k in [(4096, 14336), (100, 256), (50000, 128), (8, 128 * 1000)]:
        splits, groups = int4.row_config(n, k, sms=132)["splits"], k // int4.GROUP
        per_split = -(-groups // splits)
        assert 1 <= splits <= groups and (splits - 1) * per_split < groups <= splits * per_split


def test_int4_one_row_refuses_what_it_cannot_run():
    dtype = DTYPES[0]
    packed, scales = int4.quantize_int4(_randn(8, 256, dtype=dtype))
    with pytest.raises(ValueError, match="one-row kernel, and a has 2 rows"):
        int4.int4_matmul(_randn(2, 256, dtype=dtype), packed, scales, row=True)
    with pytest.raises(ValueError, match="power of two"):
        int4.int4_matmul(_randn(1, 256, dtype=dtype), packed, scales, block_n=24)
    with pytest.raises(ValueError, match="at least 1"):
        int4.int4_matmul(_randn(1, 256, dtype=dtype), packed, scales, splits=0)
    with pytest.raises(ValueError, match="no num_stages"):  # never a setting silently dropped
        int4.int4_matmul(_randn(1, 256, dtype=dtype), packed, scales, num_stages=3)
    got = int4.int4_matmul(_randn(1, 256, dtype=dtype), packed, scales, num_stages=3, row=False)
    assert got.shape == (1, 8)


def test_int4_both_paths_agree():
    dtype = DTYPES[0]
    a = _randn(4, 256, dtype=dtype)
    packed, scales = int4.quantize_int4(_randn(48, 256, dtype=dtype))
    fma = int4.int4_matmul(a, packed, scales, dot=False).double()
    dot = int4.int4_matmul(a, packed, scales, dot=True).double()
    tol = TOL[dtype] * max(1.0, float(fma.abs().max()))
    torch.testing.assert_close(fma, dot, atol=tol, rtol=TOL[dtype])


@pytest.mark.parametrize(
    "change, message",
    [
        ("k not a multiple of 128", "multiple of 128"),
        ("17 rows", "1 to 16"),
        ("int8 weights", "uint8"),
        ("scales of another dtype", "one dtype"),
        ("scales of another shape", "scales must be"),
        ("misaligned packed", "multiples of 4"),
        ("requires grad", "inference only"),
        ("an output past 2^31 - 1", "32-bit offsets"),
    ],
)
def test_int4_refuses_bad_inputs(change, message):
    dtype = DTYPES[0]
    a = _randn(2, 256, dtype=dtype)
    packed, scales = int4.quantize_int4(_randn(8, 256, dtype=dtype))
    if change == "k not a multiple of 128":
        a, packed = a[:, :200], packed[:, :100]
    elif change == "17 rows":
        a = _randn(17, 256, dtype=dtype)
    elif change == "int8 weights":
        packed = packed.view(torch.int8)
    elif change == "scales of another dtype":
        scales = scales.double()
    elif change == "scales of another shape":
        scales = scales[:, :1]
    elif change == "misaligned packed":
        wide = torch.zeros(8, 129, dtype=torch.uint8, device=DEVICE)
        wide[:, 1:] = packed
        packed = wide[:, 1:]
    elif change == "requires grad":
        scales = scales.clone().requires_grad_()
    elif change == "an output past 2^31 - 1":  # expanded: 16 x (2^27 + 1) outputs, nothing allocated
        n = 2**27 + 1
        a = _randn(16, 256, dtype=dtype)
        packed, scales = packed[:1].expand(n, 128), scales[:1].expand(n, 2)
    with pytest.raises((ValueError, TypeError, RuntimeError), match=message):
        int4.int4_matmul(a, packed, scales)


# --- the registered ops -------------------------------------------------------------------------------------


def test_opcheck_every_op():
    dtype = DTYPES[0]
    q, k, v = _attention_inputs(2, 4, 2, 1, 20, 64, dtype)
    torch.library.opcheck(torch.ops.labkernels.ch07_decode_attention, (q, k, v, 0.125, 2))
    k_pool, v_pool, table = paged.paginate(k, v, 16)
    lens = torch.tensor([20, 7], dtype=torch.int32, device=DEVICE)
    args = (q, k_pool, v_pool, table, lens, 0.125, None)
    torch.library.opcheck(torch.ops.labkernels.ch07_paged_decode_attention, args)
    new = _randn(2, 2, 1, 64, dtype=dtype)
    pos = torch.tensor([20, 7], dtype=torch.int32, device=DEVICE)
    append_args = (k_pool, v_pool, table, pos, new, new.clone())
    torch.library.opcheck(torch.ops.labkernels.ch07_paged_append, append_args)
    packed, scales = int4.quantize_int4(_randn(8, 128, dtype=dtype))
    torch.library.opcheck(
        torch.ops.labkernels.ch07_int4_matmul, (_randn(1, 128, dtype=dtype), packed, scales)
    )


def test_a_compiled_model_calls_the_ops_without_a_graph_break():
    dtype = DTYPES[0]
    q, k, v = _attention_inputs(1, 2, 1, 1, 20, 64, dtype)
    k_pool, v_pool, table = paged.paginate(k, v, 16)
    lens = torch.tensor([20], dtype=torch.int32, device=DEVICE)
    packed, scales = int4.quantize_int4(_randn(128, 128, dtype=dtype))

    def model(q, k, v, lens):
        a = dec.decode_attention(q, k, v) + paged.paged_decode_attention(
            q, k_pool, v_pool, table, lens, validate=False
        )
        return int4.int4_matmul(a.reshape(1, 128), packed, scales)

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, lens), model(q, k, v, lens))


# --- rotary + append ---------------------------------------------------------------------------------------


def _rope_case(dtype, batch=3, q_heads=4, kv_heads=2, head_dim=64, block_size=8):
    qkv = _randn(batch, (q_heads + 2 * kv_heads) * head_dim, dtype=dtype)
    k_pool = torch.zeros(9, kv_heads, block_size, head_dim, dtype=dtype, device=DEVICE)
    table = torch.randperm(9)[: batch * 3].view(batch, 3).to(DEVICE, torch.int32)
    positions = torch.tensor([0, 13, 23][:batch], dtype=torch.int32, device=DEVICE)
    inv_freq = rope_append.inv_frequencies(head_dim, 10000.0, DEVICE)
    return qkv, positions, inv_freq, k_pool, table


def test_rope_append_matches_torch():
    dtype = DTYPES[0]
    qkv, positions, inv_freq, k_pool, table = _rope_case(dtype)
    pools = [k_pool.clone() for _ in range(4)]
    q = rope_append.rope_append(qkv, positions, inv_freq, pools[0], pools[1], table, 4)
    want = rope_append.reference(qkv, positions, inv_freq, pools[2], pools[3], table, 4)
    tol = max(TOL[dtype], 1e-5)
    torch.testing.assert_close(q, want, atol=tol, rtol=tol)
    torch.testing.assert_close(pools[0], pools[2], atol=tol, rtol=tol)  # k, turned, in its slot
    assert torch.equal(pools[1], pools[3])  # v, as it came
    assert int((pools[1] != 0).any(dim=-1).sum()) == 3 * 2  # one slot per sequence and head, nothing else
    turned = ds.rotary(qkv[:, : 4 * 64].view(3, 4, 1, 64), positions, 10000.0)
    torch.testing.assert_close(q, turned, atol=tol, rtol=tol)


@pytest.mark.parametrize(
    "change, message", [("inv_freq", "inv_freq must be"), ("width", "qkv must be"), ("table", "int32")]
)
def test_rope_append_refuses_bad_inputs(change, message):
    qkv, positions, inv_freq, k_pool, table = _rope_case(DTYPES[0])
    if change == "inv_freq":
        inv_freq = inv_freq[:5]
    elif change == "width":
        qkv = qkv[:, :-64]
    else:
        table = table.long()
    with pytest.raises((ValueError, TypeError), match=message):
        rope_append.rope_append(qkv, positions, inv_freq, k_pool, k_pool.clone(), table, 4)


# --- the decode step ----------------------------------------------------------------------------------------


def _step_case(batch=2, context=24):
    cfg = ds.LayerConfig(d_model=128, q_heads=2, kv_heads=1, head_dim=64, d_ff=128)
    dtype = torch.float32 if not ON_GPU else torch.float16
    w = ds.make_weights(cfg, dtype, DEVICE)
    k = _randn(batch, 1, context + 1, 64, dtype=dtype)
    v = _randn(batch, 1, context + 1, 64, dtype=dtype)
    k_pool, v_pool, table = paged.paginate(k, v, 16)
    positions = torch.tensor([context, context // 2][:batch], dtype=torch.int32, device=DEVICE)
    delta, residual = _randn(batch, 128, dtype=dtype), _randn(batch, 128, dtype=dtype)
    return cfg, w, (k, v), (k_pool, v_pool, table), (positions, delta, residual)


def test_decode_step_matches_the_torch_layer_in_float64():
    cfg, w, (k, v), pools, (positions, delta, residual) = _step_case()
    out, h = ds.step(cfg, w, *pools, positions, delta, residual)
    wd = {name: (t if isinstance(t, tuple) else t.double()) for name, t in w.items()}
    wd = {name: ((t[0], t[1].double()) if isinstance(t, tuple) else t) for name, t in wd.items()}
    layer = ds.TorchLayer(cfg, wd, 2, k.shape[2])
    layer.k_cache.copy_(k)
    layer.v_cache.copy_(v)
    want_out, want_h = layer(positions, delta.double(), residual.double())
    tol = 1e-4 if out.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(h.double(), want_h, atol=tol, rtol=tol)
    torch.testing.assert_close(out.double(), want_out, atol=tol, rtol=tol)
    k_after, _ = paged.gather(pools[0], pools[1], pools[2], positions + 1)
    torch.testing.assert_close(k_after[0, :, -1].double(), layer.k_cache[0, :, -1], atol=tol, rtol=tol)


def test_rotary_turns_pairs_and_keeps_norms():
    x = torch.randn(2, 3, 2, 64, dtype=torch.float64)
    pos = torch.tensor([0, 5], dtype=torch.int32)
    y = ds.rotary(x, pos, 10000.0)
    torch.testing.assert_close(y[0, :, 0], x[0, :, 0])  # position 0: no turn
    norms = lambda t: t[..., :32] ** 2 + t[..., 32:] ** 2  # noqa: E731
    torch.testing.assert_close(norms(y), norms(x), atol=1e-5, rtol=1e-5)  # turned in fp32
    assert not torch.allclose(y[1], x[1])


@gpu
def test_decode_step_graph_replay_equals_eager():
    cfg, w, _, pools, inputs = _step_case()
    eager = ds.step(cfg, w, *pools, *inputs)
    graph = ds.Captured(lambda *a: ds.step(cfg, w, *pools, *a), *inputs)
    replayed = graph.replay()
    assert all(torch.equal(a, b) for a, b in zip(eager, replayed, strict=True))
    assert math.isfinite(float(replayed[0].float().abs().max()))


# --- the graders --------------------------------------------------------------------------------------------


def gather_with_the_course_code(k_pool, v_pool, block_table, seq_lens, k_out, v_out):
    from labkernels.ch07_decode import paged

    k, v = paged.gather(k_pool, v_pool, block_table, seq_lens)
    k_out.copy_(k)
    v_out.copy_(v)


def bytes_without_the_block_table(cfg, seq_lens, block_size, weight_bits, group):
    d, hq, hkv, hd, ff = cfg["d_model"], cfg["q_heads"], cfg["kv_heads"], cfg["head_dim"], cfg["d_ff"]
    weights = 2 * d * 2
    for n, k in [((hq + 2 * hkv) * hd, d), (d, hq * hd), (2 * ff, d), (d, ff)]:
        weights += n * k * weight_bits // 8 + (n * (k // group) * 2 if weight_bits < 16 else 0)
    return cfg["layers"] * (weights + sum(2 * hkv * n * hd * 2 for n in seq_lens))


def test_7_1_refuses_an_answer_that_calls_the_course_gather():
    from labkernels.grading import format_record, grade

    rec = grade("7.1", gather_with_the_course_code)
    assert rec["possible"] == 4 and rec["earned"] == 0, format_record(rec)
    assert "labkernels.ch07_decode.paged" in format_record(rec)


def test_7_2_grades_the_block_table_bytes():
    from labkernels.grading import format_record, grade

    rec = grade("7.2", bytes_without_the_block_table)
    assert rec["earned"] == 0, format_record(rec)  # every case has a block table: each one fails


def test_int4_table_names_each_shape_and_judges_its_targets():
    from labkernels.results import Table

    def rows(m, k, n, ours, cublas, int4pack):
        times = {"labkernels": ours, "cublas_bf16": cublas, "torch_int4pack": int4pack}
        return [{"impl": i, "timing": "graph", "m": m, "k": k, "n": n, "ms": t} for i, t in times.items()]

    table = Table(
        rows(1, 4096, 14336, 0.015, 0.031, 0.016)  # 2.07x cuBLAS, 1.07x int4pack: both targets met
        + rows(1, 4096, 4096, 0.008, 0.010, 0.006)  # 0.75x int4pack
        + rows(16, 8192, 4096, 0.010, 0.009, 0.020)  # no cuBLAS target at this shape
        + rows(16, 4096, 14336, 0.030, 0.030, 0.060)  # 1.0x cuBLAS where 2.0x is the target
    )
    got = {(r["m"], r["k_x_n"]): r for r in bench.int4_table(table).rows}
    assert set(got) == {(1, "4096x14336"), (1, "4096x4096"), (16, "8192x4096"), (16, "4096x14336")}
    assert got[(1, "4096x14336")]["x_cublas"] == 2.07 and got[(1, "4096x14336")]["target_met"]
    assert not got[(1, "4096x4096")]["target_met"]
    assert got[(16, "8192x4096")]["target_met"]
    assert not got[(16, "4096x14336")]["target_met"]


@pytest.mark.parametrize("block_size", [8, 16, 32, 64])
def test_paged_attention_at_each_block_size_matches_the_contiguous_cache(block_size):
    dtype = DTYPES[0]
    q, k, v = _attention_inputs(2, 4, 2, 1, 150, 64, dtype)
    k_pool, v_pool, table = paged.paginate(k, v, block_size)
    lens = torch.tensor([150, 150], dtype=torch.int32, device=DEVICE)
    for splits in (1, 3):
        got = paged.paged_decode_attention(q, k_pool, v_pool, table, lens, splits=splits)
        torch.testing.assert_close(got, dec.decode_attention(q, k, v, splits=splits), atol=2e-3, rtol=2e-3)


def test_flex_rows_report_a_failure_instead_of_a_time():
    from labkernels.results import Table

    def rows(batch, seq_len, flex_gbps, failed=""):
        gbps = {"labkernels": 100.0, "sdpa_default": 90.0, "sdpa_flash": 50.0, "labkernels_paged": 98.0}
        gbps["flex_attention"] = flex_gbps
        return [
            {"impl": i, "timing": "graph", "batch": batch, "seq_len": seq_len, "gbps": g,
             "fraction_of_read": g / 200, "failed": failed if i == "flex_attention" else ""}
            for i, g in gbps.items()
        ]  # fmt: skip

    table = Table(rows(1, 4096, 25.0) + rows(64, 32768, float("nan"), "BackendCompilerFailed: out of memory"))
    got = {r["batch"]: r for r in bench.attention_table(table).rows}
    assert got[1]["ours_over_flex"] == 4.0 and got[64]["ours_over_flex"] == "failed"


def test_flex_gives_a_call_that_computes_attention_or_says_why():
    dtype = torch.float32
    q, k, v = _attention_inputs(1, 4, 2, 1, 37, 64, dtype)
    call, why = bench.flex(q, k, v, compiled=False)
    assert why is None
    torch.testing.assert_close(call().double(), dec.reference(q, k, v), atol=1e-4, rtol=1e-4)
    call, why = bench.flex(q, k[:, :, :, :32], v, compiled=False)  # mismatched head dims
    assert call is None and why
