"""Chapter 02 — stride math: what a view really points at.

- `views`: the address arithmetic (storage offset of an element, spans, contiguity, view ops as pure
  arithmetic), input checks shared by the chapter's kernels, random poisoned views for tests and grading,
  the storage-vs-view picture and its widget.
- `triton_strided`: 2-D copies in Triton — contiguous-only (the bug), naive stride-aware, tiled stride-aware —
  and a stride-aware add+relu.
- `ops`: the C++/CUDA stride-aware ops (csrc/strided.cpp, csrc/cuda/strided.cu) with Python-side checks.
- `bench`: the `ch02_transpose` benchmark (copy-first vs stride-aware on a transposed matrix).
"""
