"""The pre-quantized input path: per-token scales as a stride-0 view, bit-equal to group scales."""

import pytest
import torch

from radiance.gemm import providers, reference


def test_per_token_scale_becomes_a_stride0_view_not_a_copy():
    s = torch.rand(9) + 0.5
    g = reference.group_scales(s, 9, 4)
    assert g.shape == (9, 4)
    assert g.stride() == (1, 0)
    assert g.data_ptr() == s.data_ptr()
    s[3] = 7.0  # a view: a change to the token scale shows in every group
    assert torch.equal(g[3], torch.full((4,), 7.0))
    g1 = reference.group_scales(s.view(9, 1), 9, 4)
    assert g1.stride() == (1, 0) and g1.data_ptr() == s.data_ptr()


def test_group_scales_passes_group_layout_through_and_rejects_others():
    s = torch.rand(5, 3)
    assert reference.group_scales(s, 5, 3) is s
    with pytest.raises(ValueError):
        reference.group_scales(torch.rand(5, 2), 5, 3)
    with pytest.raises(ValueError):
        reference.group_scales(torch.rand(4), 5, 3)
    with pytest.raises(TypeError):
        reference.group_scales(torch.rand(5, dtype=torch.float64), 5, 3)


def test_per_token_tuple_equals_equal_group_scales_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    m, n, k = 6, 256, 512
    x = torch.randn(m, k, generator=g)
    # per-token quant: one scale per row
    s_tok = (x.abs().amax(dim=1) / 448.0).float()
    q = (x / s_tok[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    wq, sw = reference.quantize_weight(torch.randn(n, k, generator=g) * 0.05)
    via_view = providers.run("cpu_reference", q, wq, s_tok, sw, torch.bfloat16)
    groups = s_tok[:, None].repeat(1, k // 128).contiguous()
    via_groups = providers.run("cpu_reference", q, wq, groups, sw, torch.bfloat16)
    assert torch.equal(via_view, via_groups)
