"""Chapter 05 exercises: count a chain's bytes eager vs fused, write a fused SwiGLU kernel, and read a
program Inductor generated.

Sizes come from `labkernels.size`; every size is drawn at grading time. The Inductor programs of 5.3 are
generated fresh at each grading, in the form `torch._inductor.utils.run_and_get_code` returns them.
"""

from __future__ import annotations

import torch

from labkernels import size, traffic
from labkernels.grading.core import exercise


def _odd(g, low: int, high: int) -> int:
    n = g.randint(low, high)
    return n if n % 16 else n + 7


# --- 5.1 bytes of a chain -----------------------------------------------------------------------------------


def _chain_bytes(ops, n: int, element_size: int) -> tuple[int, int]:
    eager = sum(sum(fresh) + (n if i else 0) + n for i, (_, fresh) in enumerate(ops))
    fused = sum(sum(fresh) for _, fresh in ops) + n
    return eager * element_size, fused * element_size


def _random_chain(g, n: int, length: int):
    unary = ["relu", "exp", "sigmoid", "neg", "tanh", "square"]
    ops = [("add", [n, n])]
    for _ in range(length - 1):
        kind = g.randint(0, 2)
        if kind == 0:
            ops.append((g.choice(unary), []))
        elif kind == 1:
            ops.append((g.choice(["mul", "sub", "add"]), [n]))  # a second full-size input
        else:
            ops.append(("add_bias", [g.randint(1, 4096)]))  # a broadcast input: a row of bias
    return ops


@exercise("5.1", "Bytes of a pointwise chain, eager vs fused", points=4, timeout_s=60)
def _grade_5_1(student, g):
    # student(ops, n, element_size) -> (eager_bytes, fused_bytes); ops = [(name, [elements of each input
    # read from HBM that the chain did not produce]), ...], every op writing n elements.
    def one(ops, n, element_size):
        got = tuple(student(ops, n, element_size))
        want = _chain_bytes(ops, n, element_size)
        g.expect(got == want, f"chain {[name for name, _ in ops]} of n={n}: got {got}, expected {want}")

    with g.case("add + relu: 5T eager, 3T fused", points=1):
        n = g.randint(1000, 10**6)
        one([("add", [n, n]), ("relu", [])], n, 4)
    with g.case("a chain of unary ops after x + y (2N+1 vs 3 passes)", points=1):
        n, length = g.randint(1000, 10**6), g.randint(3, 20)
        ops = [("add", [n, n])] + [("relu", [])] * (length - 1)
        one(ops, n, 2)
    with g.case("binary ops that read a second full-size tensor", points=1):
        n = g.randint(1000, 10**6)
        one([("add", [n, n]), ("mul", [n]), ("sigmoid", []), ("sub", [n])], n, 4)
    with g.case("random chains with broadcast inputs", points=1):
        for _ in range(20):
            n = g.randint(4096, 10**6)
            one(_random_chain(g, n, g.randint(1, 12)), n, g.choice([2, 4]))


# --- 5.2 fused SwiGLU ---------------------------------------------------------------------------------------

SWIGLU_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _swiglu_reference(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[1] // 2
    gate, up = x[:, :n].double(), x[:, n:].double()
    return torch.nn.functional.silu(gate) * up


@exercise("5.2", "A fused SwiGLU kernel", points=4, speed_points=2, timeout_s=180, requires="triton")
def _grade_5_2(student, g):
    # student(x, out): x (M, 2N) holds [gate | up] side by side; writes silu(gate) * up into out (M, N).
    def one(m, n, dtype, x=None):
        x = g.randn(m, 2 * n, dtype=dtype) * 3 if x is None else x
        out = g.guarded_empty((m, n), dtype)
        student(x, out)
        atol, rtol = SWIGLU_TOL[dtype]
        g.check_close(out, _swiglu_reference(x), atol=atol, rtol=rtol)

    rows = size(cpu=(1, 40), gpu=(100, 3000))
    with g.case("rows whose length is not a power of two", points=1):
        one(g.randint(*rows), _odd(g, 100, 3000), torch.float32)
    with g.case("one row, and rows shorter than a warp", points=1):
        one(1, _odd(g, 100, 3000), torch.float32)
        one(g.randint(*rows), _odd(g, 1, 31), torch.float32)
    with g.case("float16 in, float16 out (compute in fp32)", points=1):
        one(g.randint(*rows), _odd(g, 100, 3000), torch.float16)
    with g.case("rows with a stride (a slice of a wider matrix)", points=1):
        n = _odd(g, 100, 1000)
        m = g.randint(*rows)
        wide = g.randn(m, 2 * n + g.randint(1, 50)) * 3
        one(m, n, torch.float32, x=wide[:, : 2 * n])
    with g.case("bandwidth >= 80% of copy at 8192 x 2*4096 bfloat16", points=2, gpu_only=True):
        m, n = 8192, 4096
        x = g.randn(m, 2 * n, dtype=torch.bfloat16)
        out = g.guarded_empty((m, n), x.dtype)
        student(x, out)
        atol, rtol = SWIGLU_TOL[torch.bfloat16]
        g.check_close(out, _swiglu_reference(x), atol=atol, rtol=rtol)
        moved = traffic.Traffic("swiglu", 3 * m * n * x.element_size(), 4 * m * n)  # read 2MN, write MN
        g.expect_bandwidth(
            lambda: student(x, out),
            moved,
            fraction=0.8,
            check=lambda x, out: g.check_close(out, _swiglu_reference(x), atol=atol, rtol=rtol),
        )


# --- 5.3 reading Inductor's output --------------------------------------------------------------------------

_OPS = ["_to_copy", "add", "amax", "clamp_min", "div", "exp", "gelu", "mean", "mul", "native_layer_norm"]
_OPS += ["neg", "pow", "relu", "rsqrt", "sigmoid", "sub", "sum", "tanh", "where"]
_KINDS = {"poi": "x", "per": "r0_", "red": "r0_"}


def _triton_kernel(name: str, loads: int, stores: int, prefix: str) -> str:
    lines = [
        f"{name} = async_compile.triton('{name}', '''",
        "import triton",
        "import triton.language as tl",
        "",
    ]
    lines += ["@triton.jit", f"def {name}(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):"]
    lines += ["    xoffset = tl.program_id(0) * XBLOCK", "    xindex = xoffset + tl.arange(0, XBLOCK)[:]"]
    lines += ["    xmask = xindex < xnumel", "    x0 = xindex"]
    for i in range(loads):
        lines.append(f"    tmp{i} = tl.load(in_ptr{i} + ({prefix}0), xmask, eviction_policy='evict_last')")
    lines.append(f"    tmp{loads} = tmp0 * tmp0  # the ops")
    for i in range(stores):
        lines.append(f"    tl.store(out_ptr{i} + (x0), tmp{loads}, xmask)")
    lines.append("''', device_str='cuda')")
    return "\n".join(lines)


def _random_program(g) -> tuple[str, dict]:
    parts = ["# AOT ID: ['0_inference']", "from torch._inductor.select_algorithm import extern_kernels", ""]
    expected = {}
    for index in range(g.randint(2, 4)):
        kind = g.choice(sorted(_KINDS))
        ops = sorted(g.random.sample(_OPS, g.randint(1, 4)))
        name = f"triton_{kind}_fused_{'_'.join(ops)}_{index}"
        loads, stores = g.randint(1, 4), g.randint(1, 2)
        parts += [_triton_kernel(name, loads, stores, _KINDS[kind]), ""]
        expected[name] = {"ops": ops, "loads": loads, "stores": stores}
    parts += ["def call(args):", "    buf0 = empty_strided_cuda((64, 64), (64, 1), torch.float16)"]
    parts += ["    extern_kernels.mm(arg0_1, arg1_1, out=buf0)"]
    parts += [f"    {name}.run(buf0, buf0, 4096, stream=stream0)" for name in expected]
    return "\n".join(parts) + "\n", expected


@exercise(
    "5.3",
    "Read a program Inductor generated",
    points=3,
    timeout_s=60,
    forbids=("labkernels.ch05_fusion.inductor",),
)
def _grade_5_3(student, g):
    # student(code) -> {kernel_name: {"ops": [aten ops it fused], "loads": tl.load count, "stores": ...}} for
    # every Triton kernel the program defines (library calls such as extern_kernels.mm are not kernels here).
    def answers(code):
        got = student(code)
        g.expect(isinstance(got, dict), f"expected a dict keyed by kernel name, got {type(got).__name__}")
        return got

    programs = [_random_program(g) for _ in range(5)]
    with g.case("names every generated kernel, and nothing else", points=1):
        for code, expected in programs:
            got = answers(code)
            g.expect(sorted(got) == sorted(expected), f"kernels {sorted(got)}, expected {sorted(expected)}")
    with g.case("the ops each kernel fused (from its name)", points=1):
        for code, expected in programs:
            got = answers(code)
            for name, want in expected.items():
                ops = sorted(got.get(name, {}).get("ops", []))
                g.expect(ops == want["ops"], f"{name}: ops {ops}, expected {want['ops']}")
    with g.case("loads and stores of each kernel (from its body)", points=1):
        for code, expected in programs:
            got = answers(code)
            for name, want in expected.items():
                pair = (got.get(name, {}).get("loads"), got.get(name, {}).get("stores"))
                wanted = (want["loads"], want["stores"])
                g.expect(pair == wanted, f"{name}: (loads, stores) {pair}, expected {wanted}")
