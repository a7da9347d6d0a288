"""Each install guard exercised on a real loaded vLLM model (used by fp8stream_engine_checks).

Every check sets one guard condition on the real layers (or, for parallel sizes this machine
cannot run, reports them through ``rewrite._parallel``), runs ``install`` so the log lines are
the real ones, records the skips and log lines, then uninstalls and restores the layer. A check
whose site the model lacks (a model whose every MLP is MoE has no mid or act site and no dense
layer to hand a partial sum on) is left out; ``indices`` says which layers the checks used.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
from torch import nn

from radiance.fp8stream import rewrite


@contextmanager
def _logs():
    lines: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler = _Keep()
    log = logging.getLogger("vllm.radiance.fp8stream")
    log.addHandler(handler)
    try:
        yield lines
    finally:
        log.removeHandler(handler)


@contextmanager
def _parallel(tp: int, pp: int):
    saved = rewrite._parallel
    rewrite._parallel = lambda: (tp, pp)
    try:
        yield
    finally:
        rewrite._parallel = saved


@contextmanager
def _setattr(obj, name, value):
    had = name in obj.__dict__
    old = obj.__dict__.get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)


def _run(model, **kwargs) -> dict:
    with _logs() as lines:
        summary = rewrite.install(model, **kwargs)
    out = {
        "summary": str(summary), "counts": dict(summary.counts),
        "partial": summary.partial_handoffs,
        "skips": [[s.layer, s.site, s.reason] for s in summary.skips],
        "log": list(lines),
    }
    rewrite.uninstall(model)
    return out


def run_guards(model: nn.Module, core: nn.Module, layers: list[nn.Module]) -> dict:
    res: dict = {"baseline": _run(model, gdn_norm_quant=True)}
    base = rewrite.plan(model, gdn_norm_quant=True)
    plans = [p for _, p in base.plans]
    first_input = next((i for i, p in enumerate(plans) if i > 0 and p and p.input), None)
    first_mid = next((i for i, p in enumerate(plans) if p and p.mid), None)
    first_act = next((i for i, p in enumerate(plans) if p and p.act), None)
    res["indices"] = {"input": first_input, "mid": first_mid, "act": first_act}

    with _parallel(1, 2):
        res["pp"] = _run(model)
    res["lora"] = _run(model, lora=True)
    res["gpu_unavailable"] = _run(model, device=torch.device("cuda", 0))
    res["gdn_flag_off"] = _run(model, gdn_norm_quant=False)
    # an input site whose previous layer has a dense MLP takes a partial sum at tp > 1
    handoff_input = next((i for i, p in enumerate(plans) if i > 0 and p and p.input
                          and rewrite._mlp_kind(layers[i - 1].mlp) == "dense"), None)
    res["indices"]["handoff_input"] = handoff_input
    with _parallel(2, 1):
        res["tp2"] = _run(model, gdn_norm_quant=True)
        if handoff_input is not None:
            res["aux_tap"] = _run(model, taps=(handoff_input,))
    res["aux_tap_tp1"] = _run(model, taps=tuple(range(len(layers) + 1)))

    sp_index = first_mid if first_mid is not None else 0
    res["indices"]["sequence_parallel"] = sp_index
    with _setattr(layers[sp_index], "use_attn_reduce_scatter_for_moe", True):
        res["sequence_parallel"] = _run(model)
    if first_mid is not None:
        layer = layers[first_mid]
        if hasattr(layer, "layer_scale"):
            with _setattr(layer, "layer_scale", True):
                res["layer_scale"] = _run(model)
        row = (layer.linear_attn.out_proj if getattr(layer, "layer_type", "") == "linear_attention"
               else layer.self_attn.o_proj)
        row.bias = nn.Parameter(torch.zeros(row.output_size_per_partition, dtype=torch.bfloat16),
                                requires_grad=False)
        try:
            res["bias"] = _run(model)
        finally:
            row.bias = None
    if first_input is not None:
        qkv = layers[first_input].self_attn.qkv_proj
        group = qkv.radiance_fp8_input_group
        del qkv.radiance_fp8_input_group
        try:
            res["consumer_flag"] = _run(model)
        finally:
            qkv.radiance_fp8_input_group = group
    if first_act is not None:
        down = layers[first_act].mlp.down_proj
        with _setattr(down, "input_size_per_partition", down.input_size_per_partition - 64):
            res["shape"] = _run(model)
    moe = next((layer for layer in layers if rewrite._mlp_kind(layer.mlp) is None), None)
    if moe is not None and handoff_input is not None:
        # a real MoE block in front of an input site that takes a partial sum: with tp > 1 that
        # hand-off must go
        prev = layers[handoff_input - 1]
        dense_mlp = prev.mlp
        prev.mlp = moe.mlp
        try:
            with _parallel(2, 1):
                res["moe_handoff"] = _run(model)
        finally:
            prev.mlp = dense_mlp
    res["cut_short"] = _cut_short(model, core, layers, has_act=first_act is not None)
    return res


def _cut_short(model: nn.Module, core: nn.Module, layers: list[nn.Module], has_act: bool) -> dict:
    """A rewrite that raises part-way is undone whole by uninstall(). Where the model has an act
    site the failure comes while building the first activation epilogue, after that layer's
    row-parallel linears stopped reducing at tp=2; a model without one (every MLP MoE) fails
    applying its second rewritten layer, after the first one's forward was replaced."""
    from radiance.fp8stream import forwards

    rows = [(m, m.reduce_results) for m in core.modules() if hasattr(m, "reduce_results")]
    touched: list[bool] = []

    def changed() -> bool:
        return (any(m.reduce_results != stock for m, stock in rows)
                or any("forward" in layer.__dict__ for layer in layers))

    def fail(*args, **kwargs):
        touched.append(changed())
        raise RuntimeError("cut short")

    applied: list[nn.Module] = []
    real_apply = rewrite._apply

    def apply_then_fail(layer, p):
        if applied:
            fail()
        real_apply(layer, p)
        if "forward" in layer.__dict__:  # a plan with no site leaves the layer as it was
            applied.append(layer)

    raised = False
    with _parallel(2, 1):
        with (_setattr(forwards, "SiluMulQuant", fail) if has_act
              else _setattr(rewrite, "_apply", apply_then_fail)):
            try:
                rewrite.install(model, gdn_norm_quant=True)
            except RuntimeError:
                raised = True
        undone = rewrite.uninstall(model)
    return {
        "where": "activation epilogue" if has_act else "second layer",
        "raised": raised, "touched": any(touched), "undone": undone,
        "reduce_restored": all(m.reduce_results == stock for m, stock in rows),
        "forwards_restored": all("forward" not in layer.__dict__ for layer in layers),
        "marks_cleared": not any(hasattr(layer, rewrite.MARK) for layer in layers),
        "summary_cleared": not hasattr(model, "_radiance_fp8stream_summary"),
    }
