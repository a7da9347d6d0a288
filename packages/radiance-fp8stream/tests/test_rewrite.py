"""Whole-model guards of the rewrite that need no vLLM model (the layer guards run on real vLLM
layers in the workspace tests)."""

import logging
import sys

import torch
from torch import nn

from radiance.fp8stream import rewrite


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = nn.Linear(8, 8, dtype=torch.bfloat16)


class _Model(nn.Module):
    def __init__(self, n_layers):
        super().__init__()
        self.embed_tokens = nn.Embedding(4, 8, dtype=torch.bfloat16)
        self.layers = nn.ModuleList(_Layer() for _ in range(n_layers))


def test_without_radiance_gemm_the_model_stays_stock_with_the_import_error_once(monkeypatch, caplog):
    # None in sys.modules makes the import raise, as a missing package does.
    monkeypatch.setitem(sys.modules, "radiance.gemm", None)
    model = _Model(n_layers=3)
    with caplog.at_level(logging.INFO, logger="vllm.radiance.fp8stream"):
        summary = rewrite.install(model)
    try:
        assert summary.installed == 0 and summary.layers == 3
        assert len(summary.skips) == 1
        skip = summary.skips[0]
        assert skip.layer is None and skip.site == "all"
        assert skip.reason == ("radiance-gemm is not importable (ModuleNotFoundError: import of "
                               "radiance.gemm halted; None in sys.modules): no linear takes a "
                               "pre-quantized input")
        assert all("forward" not in layer.__dict__ for layer in model.layers)
        logged = [r.getMessage() for r in caplog.records if r.name == "vllm.radiance.fp8stream"]
        assert logged == [f"fp8 stream: all layers site all left stock: {skip.reason}", str(summary)]
    finally:
        rewrite.uninstall(model)
