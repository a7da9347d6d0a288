"""radiance's split-KV kernel on the GPU: bf16 queries, bf16 and fp8 KV, against float64."""

import itertools
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


_DTYPES = {"bf16": (torch.bfloat16, torch.bfloat16), "fp16": (torch.float16, torch.float16),
           "fp8": (torch.float8_e4m3fn, torch.bfloat16), "fp8_fp16q": (torch.float8_e4m3fn, torch.float16)}


def _check_cuda_pass(kv, head, q_heads, kv_heads, width, q_mag, seed, launch, partial_pass):
    """A CUDA partial pass followed by the same reduce, against float64: every row within the bound
    the Triton partial pass meets. ``kv``: a key of _DTYPES (KV dtype, query dtype)."""
    q, k, v, cu, lens, bt, ks, vs, k_scale, v_scale = _inputs("fp8" if kv.startswith("fp8") else "bf16", head,
                                                              q_heads, kv_heads, width, q_mag, seed)
    q_dtype = _DTYPES[kv][1]
    if q_dtype == torch.float16:
        q = (q.float() / max(q_mag, 1.0) * 100).half()  # fp16 holds up to 65504
    if kv == "fp16":
        k, v = k.half(), v.half()
    sm_scale = head**-0.5 / (q_mag if q_dtype == torch.bfloat16 else 100.0)
    tokens = q.shape[0]
    q = torch.cat([q, q[:2]])  # two rows past the batch's tokens, as in a CUDA-graph-padded batch
    units = q.shape[0] * q.shape[1] * launch.num_segments
    part = (torch.full((units * head,), float("nan"), device=q.device),
            torch.full((units,), float("nan"), device=q.device), torch.full((units,), float("nan"), device=q.device))
    out = torch.full_like(q, float("nan"))
    split_kv_kernel.launch(q, k, v, out, cu, lens, bt, width, sm_scale, k_scale, v_scale, launch, *part,
                           partial_pass=partial_pass)
    assert out[tokens:].isnan().all()  # padding rows are left as they were
    q, out = q[:tokens], out[:tokens]
    ref = reference.unified_attention(q, k, v, cu, lens, bt, sm_scale, ks, vs, dtype=torch.float64)
    assert torch.isfinite(out).all()
    err = (out.double() - ref).abs().amax(-1)
    ulps = (err / (2.0**-7 * ref.abs().amax(-1))).max().item()
    assert ulps <= 1.5, ulps


@pytest.mark.parametrize("kv", list(_DTYPES))
@pytest.mark.parametrize("head, q_heads, kv_heads", [(256, 16, 2), (128, 32, 8)])
@pytest.mark.parametrize("width, block_q, tile, stages, segments", [
    (1, 1, 32, 2, 64), (1, 1, 128, 3, 16), (1, 1, 256, 2, 8), (4, 4, 64, 2, 32), (4, 2, 128, 4, 4),
    (9, 9, 32, 3, 64), (9, 4, 64, 2, 16), (2, 2, 32, 5, 1)])
@pytest.mark.parametrize("q_mag", [1.0, 1.0e6])
@pytest.mark.parametrize("keys_per_warp", [16, 32])
def test_cuda_partial_matches_reference(kv, head, q_heads, kv_heads, width, block_q, tile, stages, segments, q_mag,
                                        keys_per_warp):
    """The CUDA partial pass (radiance-kernels' split_kv_partial) against float64."""
    from radiance.kernels import split_kv_attention

    row_tiles = -(-block_q * (q_heads // kv_heads) // 16)
    key_warps = tile // keys_per_warp
    why = split_kv_attention.launch_refusal(head, *_DTYPES[kv], row_tiles, key_warps, stages,
                                            torch.cuda.get_device_properties(0).shared_memory_per_block_optin,
                                            keys_per_warp)
    if why is not None:
        pytest.skip(f"no such launch: {why}")
    launch = policy.TritonLaunch(segments, 16 * row_tiles, block_q, tile, key_warps, stages, "t", kernel="radiance")
    _check_cuda_pass(kv, head, q_heads, kv_heads, width, q_mag, 3 * head + width + tile, launch, "cuda")


@pytest.mark.parametrize("kv", list(_DTYPES))
@pytest.mark.parametrize("head, q_heads, kv_heads", [(256, 16, 2), (128, 32, 8)])
@pytest.mark.parametrize("width, block_q, stages, segments", [
    (1, 1, 2, 64), (2, 2, 4, 1), (4, 4, 2, 32), (5, 5, 2, 16), (6, 6, 3, 16), (9, 9, 2, 64), (9, 9, 3, 8),
    (9, 4, 2, 16), (1, 1, 1, 64), (2, 2, 1, 1), (4, 4, 1, 32), (6, 6, 1, 16), (9, 9, 1, 8), (9, 4, 1, 16)])
@pytest.mark.parametrize("q_mag", [1.0, 1.0e6])
def test_warpgroup_partial_matches_reference(kv, head, q_heads, kv_heads, width, block_q, stages, segments, q_mag):
    """The warpgroup-MMA partial pass (split_kv_partial_warpgroup) against float64."""
    from radiance.kernels import split_kv_attention

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("warpgroup MMAs need sm_90")
    n_tiles = next(n for n in split_kv_attention.WARPGROUP_COLUMNS if 8 * n >= block_q * (q_heads // kv_heads))
    why = split_kv_attention.warpgroup_launch_refusal(
        head, *_DTYPES[kv], n_tiles, stages, torch.cuda.get_device_properties(0).shared_memory_per_block_optin)
    if why is not None:
        pytest.skip(f"no such launch: {why}")
    launch = policy.TritonLaunch(segments, 8 * n_tiles, block_q, 64, 4, stages, "t", kernel="radiance")
    _check_cuda_pass(kv, head, q_heads, kv_heads, width, q_mag, 5 * head + width + stages, launch, "cuda_warpgroup")


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("head, q_heads, kv_heads, width", [(256, 16, 2, 4), (256, 16, 2, 6), (256, 16, 2, 9),
                                                             (128, 32, 8, 6), (128, 32, 8, 9)])
def test_a_tables_warpgroup_launch_matches_reference(kv, head, q_heads, kv_heads, width):
    """A table naming the warpgroup pass for the widened blocks: the policy's launch (BLOCK_Q the
    width, not BLOCK_M's), the wrapper's decision that it runs here, the launch against float64."""
    from radiance.attn import triton_launch, tune

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("warpgroup MMAs need sm_90")
    rule = tune._rule(16, 1 / 3, 4, 0, 0.4, 8, 9, "rk_t64w4s2", {32: "wg_s3", 64: "wg_s2", 128: "wg_s2"})
    geo = policy.Geometry(arch="sm_90", head_size=head, num_query_heads=q_heads, num_kv_heads=kv_heads,
                          num_tokens=3 * width, num_seqs=3, max_seqlen_q=width, max_seqlen_k=5000, kv_dtype=kv,
                          num_sms=132)
    launch = policy.triton_launch(geo, {"arch": "sm_90", "triton": {"default": rule, "classes": []}})
    assert (launch.kernel, launch.partial_pass, launch.block_q) == ("radiance", "cuda_warpgroup", width)
    q, k, *_ = _inputs(kv, head, q_heads, kv_heads, width, 1.0, 0)
    assert triton_launch._warpgroup_or_triton_pass(launch, geo, q, k) == launch
    _check_cuda_pass(kv, head, q_heads, kv_heads, width, 1.0, 7 * head + width, launch, launch.partial_pass)


def test_cuda_partial_refuses_bad_input():
    """Shapes and dtypes the CUDA partial pass has no launch for raise before anything runs."""
    from radiance.kernels import split_kv_attention

    q, k, v, cu, lens, bt, _, _, k_scale, v_scale = _inputs("fp8", 256, 16, 2, 1, 1.0, 1)
    part = (torch.zeros(1 << 22, device=q.device), torch.zeros(1 << 16, device=q.device),
            torch.zeros(1 << 16, device=q.device))
    common = dict(softmax_scale=0.1, q_blocks_per_seq=1, block_q=1, num_segments=4, key_warps=2,
                  k_scale=k_scale, v_scale=v_scale)
    with pytest.raises(ValueError, match="key warps"):
        split_kv_attention.split_kv_partial(q, k, v, bt, lens, cu, *part, **dict(common, key_warps=3))
    with pytest.raises(ValueError, match="keys a warp"):
        split_kv_attention.split_kv_partial(q, k, v, bt, lens, cu, *part, **dict(common, keys_per_warp=8))
    with pytest.raises(ValueError, match="fp8 KV needs k_scale"):
        split_kv_attention.split_kv_partial(q, k, v, bt, lens, cu, *part, **dict(common, k_scale=None))
    with pytest.raises(ValueError, match="seq_lens"):
        split_kv_attention.split_kv_partial(q, k, v, bt, lens.long(), cu, *part, **common)
    with pytest.raises(ValueError, match="threads a block"):
        split_kv_attention.split_kv_partial(q, k, v, bt, lens, cu, *part, **dict(common, key_warps=8, row_tiles=2))


def test_cuda_partial_smem_arithmetic_matches_the_library():
    """The host's shared-memory arithmetic (the refusals' limit checks) is the source's own, for
    both forms of the pass."""
    from radiance.kernels import library, split_kv_attention

    lib = library.get(0)
    modes = {0: (torch.float8_e4m3fn, torch.bfloat16), 2: (torch.bfloat16, torch.bfloat16)}
    for head, mode, rows, kw, st in [(256, 0, 5, 1, 3), (256, 2, 1, 8, 2), (128, 0, 2, 4, 2), (128, 2, 3, 2, 5)]:
        kv, qd = modes[mode]
        for kpw in (16, 32):
            want = split_kv_attention.smem_bytes(head, kv, rows, kw, st, kpw)
            if split_kv_attention.launch_refusal(head, kv, qd, rows, kw, st, keys_per_warp=kpw) is not None:
                want = 0
            assert lib.split_kv_smem(head, mode, rows, kpw, kw, st) == want
    # the warpgroup form: every column count, both KV widths, shallow and deep rings; 0 for shapes
    # without an instance (3 tiles, 24 rows, is not one)
    for head, mode, n_tiles, st in itertools.product((128, 256), (0, 2), (2, 3, 4, 5, 6, 9), (1, 2, 5)):
        kv, qd = modes[mode]
        want = split_kv_attention.warpgroup_smem_bytes(head, kv, n_tiles, st)
        if split_kv_attention.warpgroup_launch_refusal(head, kv, qd, n_tiles, st) is not None:
            want = 0
        assert lib.split_kv_warpgroup_smem(head, mode, n_tiles, st) == want


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("partial_pass, width", [("triton", 1), ("triton", 4), ("cuda_warpgroup", 1),
                                                 ("cuda_warpgroup", 4)])
def test_a_launch_captured_at_one_key_replays_at_any_context(kv, partial_pass, width):
    """vLLM captures a decode or verify step into a CUDA graph from sequences of one key each and
    replays it at every context (graph_capture.py): a 128-segment launch (what the policy names
    for the longest context) captured that way, replayed at 5000, 37 and 2051 keys and padded by
    two rows, against float64; the segments past a sequence's tiles hold no keys."""
    head, q_heads, kv_heads = 256, 16, 2
    if partial_pass == "cuda_warpgroup":
        from radiance.kernels import split_kv_attention

        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("warpgroup MMAs need sm_90")
        n_tiles = next(n for n in split_kv_attention.WARPGROUP_COLUMNS if 8 * n >= width * q_heads // kv_heads)
        launch = policy.TritonLaunch(128, 8 * n_tiles, width, 64, 4, 2, "t", kernel="radiance",
                                     partial_pass=partial_pass)
    else:
        launch = policy.TritonLaunch(128, max(16, width * 8), width, 64, 4, 2, "t", kernel="radiance")
        assert split_kv_kernel.launch_refusal(launch, "bf16", kv, q_heads // kv_heads) is None
    q, k, v, cu, lens, bt, ks, vs, k_scale, v_scale = _inputs(kv, head, q_heads, kv_heads, width, 1.0, 11 + width)
    tokens = q.shape[0]
    q = torch.cat([q, q[:2]])
    units = q.shape[0] * q_heads * launch.num_segments
    part = (torch.full((units * head,), float("nan"), device=q.device),
            torch.full((units,), float("nan"), device=q.device), torch.full((units,), float("nan"), device=q.device))
    out = torch.full_like(q, float("nan"))
    real_lens = lens.clone()
    lens.fill_(width)  # the capture's sequences: their own query tokens, no context
    run = lambda: split_kv_kernel.launch(q, k, v, out, cu, lens, bt, width, head**-0.5, k_scale, v_scale,  # noqa: E731
                                         launch, *part)
    run()  # builds outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    lens.copy_(real_lens)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert out[tokens:].isnan().all()  # padding rows are left as they were
    ref = reference.unified_attention(q[:tokens], k, v, cu, lens, bt, head**-0.5, ks, vs, dtype=torch.float64)
    got = out[:tokens]
    assert torch.isfinite(got).all()
    ulps = ((got.double() - ref).abs().amax(-1) / (2.0**-7 * ref.abs().amax(-1))).max().item()
    assert ulps <= 1.5, ulps
