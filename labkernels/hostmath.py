"""Launch arithmetic on the host, in plain Python.

`triton.cdiv` and `triton.next_power_of_2` are constexpr functions: a call from host code goes through
Triton's JIT dispatch and costs about 2 µs (triton 3.6 and 3.7), a hundred times the division. A launcher
that sizes its grid with a few of them spends more host time on them than on the rest of its Python, and a
decode step makes fifteen launches. These give the same answers for the host.
"""

from __future__ import annotations


def cdiv(x: int, y: int) -> int:
    """ceil(x / y) for integers, y > 0."""
    return -(-x // y)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, and 0 for n = 0 (as triton's)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()
