"""Decode rows split over 2, 4 and 8 blocks (a thread-block cluster where the blocks exchange row
partials), forced through the launch-config override for every op and grouping, against the
reference with the same criteria as the exactness grid: the split changes only the order in which
a row's sum of squares is added (cluster-rank order of the blocks' parts)."""

from __future__ import annotations

import pytest
import torch

from test_gpu_exactness import _assert_ok, assert_nonfinite_bits_match, run_case

OPS = ("add_rms_quant", "silu_mul_quant", "gdn_norm_quant")  # the library's op ids, in order


def _library():
    from radiance.kernels import library
    lib = library.get()
    assert lib is not None, library.why_not()
    return lib


@pytest.mark.gpu
@pytest.mark.parametrize("split", [2, 4, 8])
@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("op", OPS)
def test_forced_split_rows_match_reference(op, group, split):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("split rows need thread-block clusters (sm_90+)")
    lib = _library()
    op_id = OPS.index(op)
    ran = 0
    for i, (m, k) in enumerate((m, k) for m in (1, 8, 64) for k in (2048, 4096, 5120, 8192)):
        tpr = k // 8 // split
        if (k // 8) % split or tpr % 32:
            continue
        assert lib.set_launch_config(op_id, 1, tpr, 1, split) == 0, (op, k, split)
        try:
            for dtype, residual in ((torch.bfloat16, True), (torch.float16, False)):
                case = (op, m, k, split, dtype, group, residual)
                _assert_ok(run_case(op, m, k, dtype, group, residual=residual,
                                    seed=3000 + 10 * i + split), case)
                ran += 1
        finally:
            lib.set_launch_config(op_id, 0, 0, 0, 1)
    assert ran > 0


@pytest.mark.gpu
@pytest.mark.parametrize("split", [2, 4, 8])
@pytest.mark.parametrize("group", [0, 128])
def test_split_add_rms_rows_carry_nonfinite_values_to_every_block(group, split):
    """NaN and inf sit in the first block's slice of rows 0-2; every block of those rows must see
    them in the exchanged row sum, so their scales and codes come out as the reference's."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("split rows need thread-block clusters (sm_90+)")
    lib = _library()
    assert lib.set_launch_config(0, 1, 4096 // 8 // split, 1, split) == 0
    try:
        stats = run_case("add_rms_quant", 8, 4096, torch.bfloat16, group, seed=11 + split,
                         inject_nonfinite=True)
    finally:
        lib.set_launch_config(0, 0, 0, 0, 1)
    assert_nonfinite_bits_match(stats)
