"""A kernel that only moves an epilogue op's bytes: the decode-size reference for its time.

It reads what the op reads (two 16-bit activation tensors and, where the op has one, the
weight), writes what the op writes (the FP8 codes, the new residual for add_rms_quant, one
scale a row) and does one add or multiply a value in between: no reduction, no exchange. It
launches like the epilogue kernels (programmatic dependent launch, the static weight read
before the wait for the previous kernel), so at M <= 64 its time is what launch, latency and
the bytes leave of a call with none of the op's row math. Triton, the best of a few launch
shapes, timed on the same input sets as the kernel.
"""

from __future__ import annotations

import torch

SHAPES = ((1024, 4), (2048, 4), (2048, 8), (4096, 8), (8192, 8))  # (columns a program, warps)


def _kernel():
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def bytes_pass(a_ptr, b_ptr, w_ptr, o_ptr, q_ptr, s_ptr, K, a_stride, w_mask,
                   ADD: tl.constexpr, HAS_W: tl.constexpr, HAS_O: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < K
        if HAS_W:
            w = tl.load(w_ptr + (cols & w_mask), mask=ok, other=0.0).to(tl.float32)
        gdc_wait()
        a = tl.load(a_ptr + row * a_stride + cols, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + row * a_stride + cols, mask=ok, other=0.0).to(tl.float32)
        gdc_launch_dependents()
        v = a + b if ADD else a * b
        if HAS_O:
            tl.store(o_ptr + row * K + cols, v.to(tl.bfloat16), mask=ok)
        if HAS_W:
            v = v * w
        v = tl.minimum(tl.maximum(v, -448.0), 448.0)
        tl.store(q_ptr + row * K + cols, v.to(tl.float8e4nv), mask=ok)
        if tl.program_id(1) == 0:
            tl.store(s_ptr + row, 1.0)

    return bytes_pass


_KERNEL = None


def _call(op, args, out, block, warps):
    """One launch over one input set; returns the values it must have written (for the check)."""
    global _KERNEL
    import triton
    _KERNEL = _KERNEL or _kernel()
    if op == "silu_mul_quant":
        (x,) = args
        k = x.shape[1] // 2
        a, b, w, stride, mask, add = x, x[:, k:], None, x.stride(0), 0, False
    else:
        a, b, w = args[0], args[1], args[2]
        k, stride, add = a.shape[1], a.stride(0), op == "add_rms_quant"
        mask = (1 << 30) - 1 if add else w.numel() - 1  # gdn: the head's weight, cols % 128
    m = a.shape[0]
    o, q, s = out
    _KERNEL[(m, triton.cdiv(k, block))](a, b, w if w is not None else a, o, q, s, k, stride, mask,
                                         ADD=add, HAS_W=w is not None, HAS_O=add, BLOCK=block,
                                         num_warps=warps, launch_pdl=True)
    return a[:, :k], b[:, :k], w, add


def time_bytes_pass(op: str, sets, graph_time_us) -> tuple[float, str]:
    """Fastest launch shape's µs per call on ``sets`` (timed by ``graph_time_us(fn, sets)``), and
    the shape. Each shape's output is first checked against torch: a pass that moved the wrong
    bytes is not a reference."""
    a0 = sets[0][0]
    m, k = a0.shape[0], a0.shape[1] // 2 if op == "silu_mul_quant" else a0.shape[1]
    out = (torch.empty(m, k, dtype=torch.bfloat16, device=a0.device),
           torch.empty(m, k, dtype=torch.float8_e4m3fn, device=a0.device),
           torch.empty(m, dtype=torch.float32, device=a0.device))
    best = (float("inf"), "")
    for block, warps in SHAPES:
        if block > max(1024, 1 << (k - 1).bit_length()):
            continue
        out[1].fill_(0)
        a, b, w, add = _call(op, sets[0], out, block, warps)
        v = a.float() + b.float() if add else a.float() * b.float()
        if add and not torch.equal(out[0], v.to(torch.bfloat16)):
            raise RuntimeError(f"bytes_pass {op} b{block}-w{warps}: wrong residual")
        if w is not None:
            v = v * w.float().repeat(k // w.numel())
        want = v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        if not torch.equal(out[1].view(torch.uint8), want.view(torch.uint8)):
            raise RuntimeError(f"bytes_pass {op} b{block}-w{warps}: wrong codes")
        t = graph_time_us(lambda *args, _b=block, _w=warps: _call(op, args, out, _b, _w), sets)
        best = min(best, (t, f"b{block}-w{warps}"))
    return best
