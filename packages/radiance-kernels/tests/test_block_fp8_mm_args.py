"""The decode block-FP8 GEMM's argument checks, which run before anything launches (CPU)."""

import pytest
import torch

from radiance.kernels.block_fp8_mm import block_fp8_mm_tma, check_args, splits_launched

F8 = torch.float8_e4m3fn


def _args(m=4, n=256, k=512, **over):
    args = {"a": torch.zeros(m, k, dtype=F8), "b": torch.zeros(n, k, dtype=F8),
            "sa": torch.ones(m, k // 128), "sb": torch.ones(-(-n // 128), k // 128),
            "out_dtype": torch.bfloat16, "split": 1, "warps": 4, "stages": 4, "counters": None}
    args.update(over)
    return args


@pytest.mark.parametrize("over,exc,match", [
    ({"a": torch.zeros(4, 512, dtype=torch.float16)}, TypeError, "a must be a float8_e4m3fn"),
    ({"b": torch.zeros(256, 512, dtype=torch.float8_e5m2)}, TypeError, "b must be a float8_e4m3fn"),
    ({"a": torch.zeros(4, 512, 1, dtype=F8)}, ValueError, "2-D"),
    ({"a": torch.zeros(512, 4, dtype=F8).t()}, ValueError, "contiguous last dim"),
    ({"b": torch.zeros(256, 384, dtype=F8)}, ValueError, "K mismatch"),
    ({"b": torch.zeros(1, 512, dtype=F8).expand(256, 512)}, ValueError, "b row stride 0 < K=512"),
    ({"a": torch.zeros(17, 512, dtype=F8), "sa": torch.ones(17, 4)}, ValueError, "out of range"),
    ({"a": torch.zeros(0, 512, dtype=F8), "sa": torch.ones(0, 4)}, ValueError, "out of range"),
    ({"b": torch.zeros(200, 512, dtype=F8)}, ValueError, "multiple of 16"),
    ({"a": torch.zeros(4, 320, dtype=F8), "b": torch.zeros(256, 320, dtype=F8)}, ValueError, "K=320"),
    ({"sa": torch.ones(4, 3)}, ValueError, r"sa must be \[4, 4\]"),
    ({"sa": torch.ones(4, 4, dtype=torch.float16)}, TypeError, "sa must be a float32"),
    ({"sb": torch.ones(1, 4)}, ValueError, r"sb must be \[2, 4\]"),
    ({"out_dtype": torch.float8_e4m3fn}, TypeError, "out_dtype"),
    ({"split": 0}, ValueError, "split"),
    ({"warps": 6}, ValueError, "warps"),
    ({"stages": 1}, ValueError, "stages"),
    ({"warps": 8, "stages": 3}, ValueError, "stages"),
    ({"row_warps": 3}, ValueError, "row_warps"),
    ({"warps": 4, "row_warps": 8}, ValueError, "row_warps"),
    ({"b": torch.zeros(2064, 512, dtype=F8), "sb": torch.ones(17, 4), "row_warps": 2}, ValueError,
     "N/16=129"),
    ({"warps": 4, "row_warps": 2, "wgmma": 1}, ValueError, "row_warps == warps"),
    ({"warps": 8, "row_warps": 8, "stages": 4, "wgmma": 1}, ValueError, "stages 2/3 for 8 warps x 1"),
    ({"warps": 4, "row_warps": 4, "stages": 6, "wgmma": 1}, ValueError, "wgmma=1 warps=4"),
    ({"warps": 8, "row_warps": 8, "stages": 3, "wgmma": 2}, ValueError, "wgmma=2 warps=8"),
    ({"warps": 4, "row_warps": 4, "stages": 4, "wgmma": 3}, ValueError, "wgmma=3"),
    ({}, ValueError, "one CUDA device"),
    ({"warps": 8, "row_warps": 8, "stages": 3, "wgmma": 1}, ValueError, "one CUDA device"),
    ({"warps": 8, "row_warps": 8, "stages": 2, "wgmma": 2}, ValueError, "one CUDA device"),
])
def test_bad_arguments_raise_clearly(over, exc, match):
    with pytest.raises(exc, match=match):
        check_args(**_args(**over))


@pytest.mark.parametrize("over,match", [
    ({"b": torch.zeros(336, 512, dtype=F8), "sb": torch.ones(3, 4)}, "N=336 must be a multiple of 64"),
    ({"stages": 5}, "stages 4/6/8/12"),
    ({"split": 0}, "split >= 1"),
    ({}, "one CUDA device"),
])
def test_tma_kernel_bad_arguments_raise_clearly(over, match):
    args = {k: v for k, v in _args(**over).items() if k not in ("warps",)}
    with pytest.raises(ValueError, match=match):
        block_fp8_mm_tma(**args)


def test_misaligned_rows_are_refused():
    a = torch.zeros(4, 520, dtype=F8)[:, :512]  # row stride 520: not a 16-byte multiple
    with pytest.raises(ValueError, match="16-byte"):
        check_args(**_args(a=a))


@pytest.mark.parametrize("k,split,want", [(4096, 1, 1), (4096, 2, 2), (4096, 8, 8), (1920, 8, 8),
                                          (1920, 4, 4), (1920, 2, 2), (1920, 64, 15), (256, 8, 2),
                                          (1920, 7, 5)])
def test_split_never_leaves_an_empty_k_range(k, split, want):
    got = splits_launched(k, split)
    groups = k // 128
    per = -(-groups // got)
    assert got == want
    assert (got - 1) * per < groups  # the last range holds at least one group
