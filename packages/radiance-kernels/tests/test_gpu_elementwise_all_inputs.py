"""Pieces of the epilogue kernels' element math against torch, on every 16-bit input.

``silu_mul_quant`` computes silu(x) = x / (1 + exp(-x)) in fp32 from a 16-bit input (the gate),
with the division written out for inputs up to 80 in magnitude (``silu_f32`` in
epilogue_common.cuh). The input set is finite, so this test checks the function on all of it: a
probe built from the same header (tests/probes/elementwise_probe.cu) against ``F.silu`` on the
fp32 value, which is what ATen's silu computes before rounding (the reference chain rounds it
afterwards). The kernel takes the fast path only when all 8 values of a vector are in range, so
the inputs run twice: in bit-pattern order (mixed vectors take the plain division) and
partitioned so that every in-range value goes through the fast path and every other value
through the division.

``gdn_norm_quant`` gates with ``silu_fast_f32`` instead (the hardware's approximate exp2 and
reciprocal), which is not torch's bits; on every 16-bit input it must carry torch's sign and
special values and lie within ``FAST_SILU_ULPS`` bit patterns of torch's silu wherever that is
at least 2^-119 in magnitude (below, where the reciprocal may be flushed, within 2^-119 of it).

``silu_mul_quant`` and ``add_rms_quant`` (weight in the activation dtype) end with a product of
two 16-bit values rounded to the activation dtype, which they compute with one paired 16-bit
multiply (``rad_mul_act2`` in portability.h) instead of torch's fp32 multiply and cast. It is
checked on every pair of 16-bit inputs, 2^32 per dtype: bit for bit, except bf16 products under
2^-126, where fp32's subnormal rounding comes first on torch's path; there the two must agree in
sign and be at most 2^-126 (such values quantize to a zero of their sign either way).

The group-128 quant divides each value by its group's scale with one multiply and two FMAs
(``div_by_scale``), from a reciprocal written out as nvcc expands an IEEE one
(``rcp_moderate``). The reciprocal is checked against ``torch.reciprocal`` for every fp32
mantissa at exponents across the range it serves; the division against torch's fp32 division
for every bf16 value that can occur under a scale (|x| <= 448 * scale), signed zeros included, at
scales across the range: in its FP8 code everywhere, and bit for bit wherever the quotient is at
least 2^-10 (every quotient whose code can be nonzero: e4m3fn's smallest step is 2^-9). Below
that x is tiny against its group's largest value, and the correction step's residual can fall
under fp32's normal range and lose its exactness; such a quotient may differ in its last bits
and still quantizes to a zero of x's sign.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from radiance.kernels import library

PROBE = Path(__file__).parent / "probes" / "elementwise_probe.cu"
FAST_RANGE = 80.0  # silu_f32's bound on |x| for the written-out division
# silu_fast_f32's bound against torch's silu, in fp32 bit patterns: the exponent argument's
# rounding grows to ~45 where it nears 127, plus the approximations' few (epilogue_common.cuh);
# measured on the H200 and an H100: 54
FAST_SILU_ULPS = 64


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    toolchain = library.find_nvcc()
    if toolchain is None:
        pytest.skip("nvcc not found")
    vendor, arch = library.device_arch()
    if vendor != "cuda":
        pytest.skip("the probe is built with nvcc")
    out = tmp_path_factory.mktemp("probe") / "elementwise_probe.so"
    cmd = [*toolchain.link_command([PROBE], arch, out), "-I", str(library.CSRC_DIR)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lib = ctypes.CDLL(str(out))
    lib.silu_probe.restype = ctypes.c_int
    lib.silu_probe.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                               ctypes.c_int]
    lib.div_probe.restype = ctypes.c_int
    lib.div_probe.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float]
    lib.rcp_probe.restype = ctypes.c_int
    lib.rcp_probe.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.mul_act2_probe.restype = ctypes.c_int
    lib.mul_act2_probe.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int]
    return lib


def _padded(bits: torch.Tensor, fill: int) -> torch.Tensor:
    pad = (-bits.numel()) % 8
    return torch.cat([bits, torch.full((pad,), fill, dtype=bits.dtype, device=bits.device)])


def _silu(lib, bits: torch.Tensor, dtype: torch.dtype, fast: bool = False) -> torch.Tensor:
    out = torch.empty(bits.numel(), dtype=torch.int32, device=bits.device)
    rc = lib.silu_probe(bits.data_ptr(), out.data_ptr(), bits.numel(), int(dtype == torch.bfloat16),
                        int(fast))
    torch.cuda.synchronize()
    assert rc == 0
    return out.view(torch.float32)


def _every() -> torch.Tensor:
    """Every 16-bit pattern, as int16 on the GPU."""
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32, device="cuda").to(torch.int16)


def _assert_same(got: torch.Tensor, want: torch.Tensor, bits: torch.Tensor,
                 dtype: torch.dtype) -> None:
    both_nan = torch.isnan(got) & torch.isnan(want)
    differ = (got.view(torch.int32) != want.view(torch.int32)) & ~both_nan
    if differ.any():
        i = differ.nonzero()[:8, 0]
        pytest.fail(f"{int(differ.sum())} inputs differ, e.g. x={bits.view(dtype)[i].tolist()} "
                    f"got={got[i].tolist()} want={want[i].tolist()}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_silu_matches_torch_on_every_input(probe, dtype):
    every = _every()
    _assert_same(_silu(probe, every, dtype), F.silu(every.view(dtype).float()), every, dtype)

    values = every.view(dtype).float()
    in_range = values.abs() <= FAST_RANGE  # False for NaN
    one = int(torch.tensor(1.0, dtype=dtype).view(torch.int16))
    inf = int(torch.tensor(float("inf"), dtype=dtype).view(torch.int16))
    fast = _padded(every[in_range], one)
    slow = _padded(every[~in_range], inf)
    assert fast.numel() > 30000 and slow.numel() > 1000  # both paths really exercised
    for bits in (fast, slow):
        _assert_same(_silu(probe, bits, dtype), F.silu(bits.view(dtype).float()), bits, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fast_silu_within_its_bound_of_torch_on_every_input(probe, dtype):
    every = _every()
    x = every.view(dtype).float()
    got, want = _silu(probe, every, dtype, fast=True), F.silu(x)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    got, want, x = got[~nan], want[~nan], x[~nan]
    assert torch.equal(torch.signbit(got), torch.signbit(want))
    special = torch.isinf(want) | (want == 0)
    assert torch.equal(got[special], want[special])  # +-inf, and zeros of the same sign
    tiny = (want.abs() < 2.0**-119) & ~special  # where the reciprocal may be flushed
    assert bool(tiny.any())
    assert float((got[tiny] - want[tiny]).abs().max()) < 2.0**-119
    # same sign: the distance in bit patterns is the difference of the magnitudes' patterns
    normal = ~special & ~tiny
    gap = ((got.view(torch.int32) & 0x7FFFFFFF) - (want.view(torch.int32) & 0x7FFFFFFF)).abs()[normal]
    small = x[normal].abs() <= 16
    print(f"\nsilu_fast_f32 vs torch's silu over {int(normal.sum())} {dtype} inputs: at most "
          f"{int(gap.max())} bit patterns apart ({int(gap[small].max())} for |x| <= 16), "
          f"{float((gap == 0).float().mean()):.3f} identical, mean {float(gap.float().mean()):.2f}")
    assert int(gap.max()) <= FAST_SILU_ULPS


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [1.0 / (448 * 512), 3.1e-5, 0.0123, 1.0 / 448, 0.7, 93.0, 2.5e4])
def test_group_quant_division_matches_torch(probe, scale):
    every = _every()
    x = every.view(torch.bfloat16).float()
    s = torch.tensor(scale, dtype=torch.float32).item()  # the fp32 scale
    bits = every[x.abs() <= 448 * s]  # False for NaN
    assert bool((bits == int(torch.tensor(-0.0, dtype=torch.bfloat16).view(torch.int16))).any())
    got = torch.empty(bits.numel(), dtype=torch.int32, device="cuda")
    assert probe.div_probe(bits.data_ptr(), got.data_ptr(), bits.numel(), s) == 0
    torch.cuda.synchronize()
    x = bits.view(torch.bfloat16).float()
    want = x / torch.full_like(x, s)  # elementwise IEEE division, as the reference's x / scale
    got = got.view(torch.float32)
    coded = want.abs() >= 2.0**-10
    assert int(coded.sum()) > 4000
    _assert_same(got[coded], want[coded], bits[coded], torch.bfloat16)
    fp8 = torch.float8_e4m3fn
    codes = lambda q: q.clamp(-448.0, 448.0).to(fp8).view(torch.uint8)
    assert torch.equal(codes(got), codes(want))


@pytest.mark.gpu
@pytest.mark.parametrize("exponent", [-100, -61, -18, -8, -1, 0, 7, 52, 99])
def test_scale_reciprocal_matches_torch_for_every_mantissa(probe, exponent):
    mantissas = torch.arange(1 << 23, dtype=torch.int32, device="cuda")
    s = (mantissas | ((exponent + 127) << 23)).view(torch.float32)
    got = torch.empty_like(mantissas)
    assert probe.rcp_probe(s.data_ptr(), got.data_ptr(), s.numel()) == 0
    torch.cuda.synchronize()
    want = torch.reciprocal(s)
    differ = got != want.view(torch.int32)
    assert not bool(differ.any()), s[differ][:8].tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_paired_product_matches_torch_on_every_pair(probe, dtype):
    every = _every()
    chunk = 1024  # b values per pass: 2^26 pairs
    tiny = 2.0**-126
    for start in range(0, every.numel(), chunk):
        a = every.repeat(chunk)
        b = every[start:start + chunk].repeat_interleave(every.numel())
        got = torch.empty_like(a)
        assert probe.mul_act2_probe(a.data_ptr(), b.data_ptr(), got.data_ptr(), a.numel() // 2,
                                    int(dtype == torch.bfloat16)) == 0
        torch.cuda.synchronize()
        want = a.view(dtype) * b.view(dtype)  # torch: fp32 product, one cast
        got_v, want_v = got.view(dtype).float(), want.float()
        exact = (got == want.view(torch.int16)) | (torch.isnan(got_v) & torch.isnan(want_v))
        if dtype == torch.bfloat16:
            # under fp32's normal range: both tiny (or zero) and of the same sign
            exempt = (want_v.abs() <= tiny) & (got_v.abs() <= tiny) & (
                torch.signbit(got_v) == torch.signbit(want_v))
            exact |= exempt
        if not bool(exact.all()):
            i = (~exact).nonzero()[:8, 0]
            pytest.fail(f"{int((~exact).sum())} pairs differ, e.g. a={a.view(dtype)[i].tolist()} "
                        f"b={b.view(dtype)[i].tolist()} got={got_v[i].tolist()} want={want_v[i].tolist()}")
