"""Every config the policy can emit for vLLM's Triton kernel fits gfx1201's 64 KiB of LDS.

Triton's AMD backend compiles for gfx1201 without a GPU; the shared-memory size is read from
the compiled kernel's metadata.
"""

import itertools

import pytest

from radiance.attn import lds, policy, tables

pytestmark = pytest.mark.slow


def emittable(arch="gfx1201"):
    """Distinct kernel shapes triton_launch emits over decode/verify geometries on ``arch``."""
    table = tables.for_arch(arch)
    shapes = set()
    for head, (hq, kvh), width, seqs, ctx, kv in itertools.product(
        (128, 256, 512), ((16, 2), (32, 8), (12, 2)), range(1, 10), (1, 8), (4096, 131072), ("bf16", "fp8")
    ):
        g = policy.Geometry(arch=arch, head_size=head, num_query_heads=hq, num_kv_heads=kvh, num_tokens=seqs * width,
                            num_seqs=seqs, max_seqlen_q=width, max_seqlen_k=ctx, q_dtype="bf16", kv_dtype=kv)
        launch = policy.triton_launch(g, table)
        if launch is None:
            continue
        # segment counts share one layout; compile one split and the unsplit variant per shape
        shapes.add(lds.KernelShape(head, hq, kvh, "bf16", kv, launch.block_m, launch.tile_size,
                                   launch.num_warps or 4, launch.num_stages, 16 if launch.is_3d else 1))
    return sorted(shapes, key=lambda s: (s.head_size, s.block_m, s.kv_dtype, s.num_query_heads))


def test_policy_emits_a_bounded_set():
    shapes = emittable()
    assert shapes, "the gfx1201 table emits no Triton launch"
    assert {s.block_m for s in shapes} <= {16, 32, 64}


@pytest.fixture(scope="module")
def hip_backend():
    triton = pytest.importorskip("triton")
    from triton.backends import backends

    if "amd" not in backends:
        pytest.skip("this Triton has no AMD backend")
    return triton


def _dedupe_for_compile(shapes):
    # the footprint depends on the dot operands: head, block, tile, dtypes, warps
    seen, out = set(), []
    for s in shapes:
        key = (s.head_size, s.block_m, s.tile_size, s.kv_dtype, s.num_warps, s.num_stages, s.num_segments > 1)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def test_emitted_configs_fit_gfx1201_lds(kernel_module, hip_backend):
    limit = tables.lds_bytes("gfx1201")
    too_big = []
    for s in _dedupe_for_compile(emittable()):
        used = lds.shared_bytes(kernel_module, s, "gfx1201")
        if used > limit:
            too_big.append((s, used))
    assert not too_big, too_big


def test_the_clamp_rejects_a_config_that_overflows(kernel_module, hip_backend):
    # BLOCK_M 128 x head 512: the policy's clamp refuses it, and the compiler agrees it overflows
    assert not policy.lds_fits("gfx1201", 128, 32, 512)
    s = lds.KernelShape(512, 16, 2, "bf16", "bf16", 128, 32, 8, 1, 16)
    with pytest.raises(Exception, match="(?i)shared|lds|resource|out of"):
        used = lds.shared_bytes(kernel_module, s, "gfx1201")
        if used > tables.lds_bytes("gfx1201"):
            raise RuntimeError(f"out of LDS: {used} bytes")
