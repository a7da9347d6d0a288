"""radiance's split-KV kernel on the GPU: bf16 queries, bf16 and fp8 KV, against float64."""

from dataclasses import replace

import pytest
import torch

from radiance.attn import policy, reference, split_kv_kernel

pytestmark = pytest.mark.gpu


def _inputs(kv, head, q_heads, kv_heads, width, q_mag, seed):
    """Three sequences (5000, 37 and 2051 keys) of ``width`` query tokens over a shuffled cache."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    seqs, bs, nblk = 3, 16, 1200
    lens = torch.tensor([5000, 37, 2051], dtype=torch.int32, device=dev)
    shape = (nblk, bs, kv_heads, head)
    k = torch.randn(shape, generator=gen, device=dev)
    v = torch.randn(shape, generator=gen, device=dev)
    if kv == "fp8":
        k, v, ks, vs = (k * 40).to(torch.float8_e4m3fn), (v * 40).to(torch.float8_e4m3fn), 0.013, 0.007
        k_scale = torch.tensor([ks], device=dev).expand(seqs, kv_heads)
        v_scale = torch.tensor([vs], device=dev).expand(seqs, kv_heads)
    else:
        k, v, ks, vs, k_scale, v_scale = k.bfloat16(), v.bfloat16(), 1.0, 1.0, None, None
    T = seqs * width
    q = (torch.randn(T, q_heads, head, generator=gen, device=dev) * q_mag).bfloat16()
    cu = torch.arange(0, T + 1, width, dtype=torch.int32, device=dev)
    bt = torch.randperm(nblk, generator=gen, device=dev).to(torch.int32)[: seqs * 320].view(seqs, 320)
    return q, k, v, cu, lens, bt, ks, vs, k_scale, v_scale


def _run(launch, q, k, v, cu, lens, bt, width, sm_scale, k_scale, v_scale, v_in_registers=None):
    units = q.shape[0] * q.shape[1] * launch.num_segments
    dev = q.device
    part = (torch.full((units * q.shape[2],), float("nan"), device=dev), torch.full((units,), float("nan"), device=dev),
            torch.full((units,), float("nan"), device=dev))
    out = torch.full_like(q, float("nan"))
    assert split_kv_kernel.call_refusal(q, k, v, out, k_scale, v_scale) is None
    split_kv_kernel.launch(q, k, v, out, cu, lens, bt, width, sm_scale, k_scale, v_scale, launch, *part,
                           v_in_registers=v_in_registers)
    return out


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("head, q_heads, kv_heads", [(256, 16, 2), (128, 32, 8)])
@pytest.mark.parametrize("width, block_m, tile, warps", [(1, 16, 64, 4), (4, 32, 64, 4), (9, 128, 64, 8), (9, 16, 32, 4),
                                                         (1, 16, 32, 1), (4, 32, 32, 2), (9, 64, 128, 4)])
@pytest.mark.parametrize("q_mag", [1.0, 1.0e6])
@pytest.mark.parametrize("v_in_registers", [None, False])  # None: the inline-PTX V conversion on CUDA
def test_matches_reference(kv, head, q_heads, kv_heads, width, block_m, tile, warps, q_mag, v_in_registers):
    if kv != "fp8" and v_in_registers is False:
        pytest.skip("two-byte KV has no conversion")
    group = q_heads // kv_heads
    if block_m > 16 and block_m < width * group:
        pytest.skip("block narrower than a sequence's rows")
    q, k, v, cu, lens, bt, ks, vs, k_scale, v_scale = _inputs(kv, head, q_heads, kv_heads, width, q_mag,
                                                              head + width + block_m)
    sm_scale = head**-0.5 / q_mag
    launch = policy.TritonLaunch(64, block_m, max(1, block_m // group), tile, warps, 2, "t", kernel="radiance")
    assert split_kv_kernel.launch_refusal(launch, "bf16", kv, group) is None
    out = _run(launch, q, k, v, cu, lens, bt, width, sm_scale, k_scale, v_scale, v_in_registers)
    ref = reference.unified_attention(q, k, v, cu, lens, bt, sm_scale, ks, vs, dtype=torch.float64)
    err = (out.double() - ref).abs().amax(-1)
    ulps = (err / (2.0**-7 * ref.abs().amax(-1))).max().item()
    # bf16 output rounding is half an ulp; bf16 probabilities (bf16 KV) add up to about another
    assert ulps <= 1.5, ulps


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("head, q_heads, kv_heads", [(256, 16, 2), (128, 32, 8)])
@pytest.mark.parametrize("width, block_m, tile, warps", [(1, 16, 64, 4), (1, 16, 32, 1), (4, 32, 32, 2),
                                                         (9, 128, 64, 8)])
@pytest.mark.parametrize("stages, table_ahead, capped", [(2, True, False), (3, True, False), (2, False, True),
                                                         (2, True, True)])
def test_latency_options_change_no_bit(kv, head, q_heads, kv_heads, width, block_m, tile, warps, stages, table_ahead,
                                       capped):
    """The block table one tile ahead and a register cap move loads and spills, not arithmetic: the
    output is the same launch's without them, bit for bit (test_matches_reference checks its accuracy)."""
    group = q_heads // kv_heads
    if block_m < width * group:
        pytest.skip("block narrower than a sequence's rows")
    if (head, block_m, kv, stages) == (256, 128, "bf16", 3):
        pytest.skip("two bf16 K/V buffers of 64 x 256 beside a 128-row query block exceed the H200's shared memory")
    # the 128-row block's warpgroup dots need 158 registers a thread (ptxas); 96 elsewhere
    max_registers = (168 if block_m == 128 else 96) if capped else None
    args = _inputs(kv, head, q_heads, kv_heads, width, 1.0, 7 * head + width)
    q, k, v, cu, lens, bt, _, _, k_scale, v_scale = args
    plain = policy.TritonLaunch(64, block_m, max(1, block_m // group), tile, warps, stages, "t", kernel="radiance")
    varied = replace(plain, table_ahead=table_ahead, max_registers=max_registers)
    want = _run(plain, q, k, v, cu, lens, bt, width, head**-0.5, k_scale, v_scale)
    got = _run(varied, q, k, v, cu, lens, bt, width, head**-0.5, k_scale, v_scale)
    assert torch.isfinite(want).all() and torch.equal(got, want)
