"""The Triton kernels compile, without a GPU, for NVIDIA sm90 and AMD gfx942 (Triton's own
offline compiler: ptxas / LLD ship with it). Running them is the GPU test's job."""

import re

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from radiance.gemm import triton_block_fp8 as T  # noqa: E402

INTS = ("M", "N", "K")
STRIDES = ("s_am", "s_ak", "s_bn", "s_bk", "s_sam", "s_sag", "s_sbn", "s_sbg", "s_cm", "s_cn")


def _sig(fp8, splitk):
    sig = {"a_ptr": f"*{fp8}", "b_ptr": f"*{fp8}", "sa_ptr": "*fp32", "sb_ptr": "*fp32",
           "c_ptr": "*bf16"}
    if splitk:
        sig.update({"part_ptr": "*fp32", "count_ptr": "*i32"})
    for name in INTS + (("groups_per_split", "n_splits") if splitk else ()) + STRIDES:
        sig[name] = "i32"
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K") + (("FIXUP",) if splitk else ("GROUP_M",)):
        sig[name] = "constexpr"
    return sig


TARGETS = [(GPUTarget("cuda", 90, 32), "fp8e4nv", "ptx"), (GPUTarget("hip", "gfx942", 64), "fp8e4b8", "amdgcn")]


@pytest.mark.parametrize("target,fp8,asm", TARGETS, ids=["sm90", "gfx942"])
@pytest.mark.parametrize("fixup", [0, 1, 2])
def test_splitk_compiles(target, fp8, asm, fixup):
    src = ASTSource(T._splitk_kernel, _sig(fp8, True),
                    constexprs={"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "FIXUP": fixup})
    code = triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 3}).asm[asm]
    if fixup == 1 and asm == "ptx":
        # the in-kernel fixup: an acq_rel GPU-scope counter and L1-bypassing loads of partials
        assert re.search(r"atom\.global\.gpu\.acq_rel\.add", code)
        assert "ld.global.cg" in code
    if asm == "amdgcn":
        assert "v_mfma" in code  # fp8 dot on the matrix cores, not a scalar fallback
        assert ("global_atomic_add" in code) == (fixup == 1)


@pytest.mark.parametrize("target,fp8,asm", TARGETS, ids=["sm90", "gfx942"])
def test_generic_compiles(target, fp8, asm):
    src = ASTSource(T._generic_kernel, _sig(fp8, False),
                    constexprs={"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8})
    code = triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 3}).asm[asm]
    assert code


def test_split_geometry():
    assert T.splitk_geometry(2048, 4096, 64, 8) == (32, 4, 8)
    assert T.splitk_geometry(2048, 384, 64, 8) == (32, 1, 3)  # never more splits than K groups
    assert T.auto_split(2048, 4096, 64, 132) == 8
    assert T.auto_split(25600, 5120, 64, 132) == 1
    assert T.generic_block_m(1) == 16 and T.generic_block_m(33) == 64 and T.generic_block_m(4096) == 128
