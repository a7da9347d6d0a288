"""``install(model)``: decide per layer and per site from guards, then rewrite.

Sites (each one fused op instead of vLLM's norm + quant chain):
  input     the layer's ``input_layernorm`` (fused residual add) + quant into the attention-side
            linear; from the second layer on this is the down-stream hand-off: with tensor
            parallel > 1 the previous layer's down_proj stays un-reduced and this op reduces it.
  mid       the attention-side RowParallel's all-reduce + ``post_attention_layernorm`` + quant
            into the MLP's gate_up_proj.
  act       ``silu(gate) * up`` + quant into down_proj.
  gdn_norm  the GatedDeltaNet output norm (per-head gated RMSNorm) + quant into out_proj
            (``RADIANCE_GDN_NORM_QUANT``).

Planning reads the model and mutates nothing; only when the whole plan is made is it applied,
so a guard never leaves a half-rewritten layer. Every site that stays stock is logged with its
layer and reason, and counted in the summary.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import types
from dataclasses import dataclass, field

import torch
from torch import nn

from radiance.fp8stream import forwards
from radiance.fp8stream.epilogues import Epilogues
from radiance.fp8stream.forwards import LayerPlan, SiteQuant
from radiance.kernels import ops as kops
from radiance.kernels import reference, registry

logger = logging.getLogger("vllm.radiance.fp8stream")

SITES = ("input", "mid", "act", "gdn_norm")
MARK = "_radiance_fp8stream"
ACT_DTYPES = (torch.bfloat16, torch.float16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


class _EveryLayer:
    """Aux hidden-state taps not known yet (set by the runner after load): assume any layer."""

    def __contains__(self, index) -> bool:
        return True


EVERY_LAYER = _EveryLayer()


@dataclass(frozen=True)
class Skip:
    layer: int | None  # None: the whole model
    site: str
    reason: str

    def line(self) -> str:
        where = "all layers" if self.layer is None else f"layer {self.layer}"
        return f"fp8 stream: {where} site {self.site} left stock: {self.reason}"


@dataclass
class Summary:
    model: str = ""
    layers: int = 0
    lowering: str = ""
    tp: int = 1
    counts: dict = field(default_factory=lambda: {s: 0 for s in SITES})
    partial_handoffs: int = 0
    skips: list = field(default_factory=list)
    plans: list = field(default_factory=list, repr=False)

    @property
    def installed(self) -> int:
        return sum(self.counts.values())

    def __str__(self) -> str:
        c = self.counts
        handoff = f" ({self.partial_handoffs} take a partial down_proj)" if self.tp > 1 else ""
        how = f", {self.lowering} ops" if self.installed else ""
        return (f"fp8 stream on {self.model or 'model'} (tp={self.tp}{how}): "
                f"{c['input']} input{handoff}, {c['mid']} mid, {c['act']} act, "
                f"{c['gdn_norm']} gdn_norm epilogues over {self.layers} layers; "
                f"{len(self.skips)} sites left stock")


# ----------------------------------------------------------------------------- structure


def _module_attr(module_name: str, qualname: str):
    """A class from a vLLM model module, only if that module is already imported (a loaded
    model's module always is), so planning never imports model code it does not need."""
    mod = sys.modules.get(module_name)
    return getattr(mod, qualname, None) if mod is not None else None


def _known(pairs) -> set:
    found = set()
    for module_name, qualname in pairs:
        cls = _module_attr(module_name, qualname)
        if cls is not None:
            found.add(cls.forward)
    return found


_M = "vllm.model_executor.models."


def _layer_family(layer: nn.Module) -> str | None:
    fwd = type(layer).forward
    if fwd in _known([(_M + "qwen3_next", "Qwen3NextDecoderLayer")]):
        return "qwen3_next"
    if fwd in _known([(_M + "llama", "LlamaDecoderLayer"), (_M + "qwen3", "Qwen3DecoderLayer")]):
        return "dense"
    return None


def _attention_ok(attn: nn.Module) -> bool:
    """Attention modules whose forward only hands its input to ``qkv_proj``."""
    return type(attn).forward in _known([
        (_M + "llama", "LlamaAttention"), (_M + "qwen3", "Qwen3Attention"),
        (_M + "qwen3_next", "Qwen3NextAttention")])


def _mlp_kind(mlp: nn.Module) -> str | None:
    """'dense' for MLPs whose forward is gate_up_proj -> act_fn -> down_proj and nothing else
    reads the input; None (with MoE blocks and gated shared experts) otherwise."""
    fwd = type(mlp).forward
    dense = _known([(_M + "llama", "LlamaMLP"), (_M + "qwen2", "Qwen2MLP"),
                    (_M + "qwen2_moe", "Qwen2MoeMLP")])
    if fwd in dense and getattr(mlp, "expert_gate", None) is None:
        return "dense"
    return None


def find_core(model: nn.Module) -> nn.Module | None:
    """The decoder core: the module owning the layer list (at whatever depth wrappers put it)."""
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) and all(
            hasattr(layer, "input_layernorm") or type(layer).__name__ == "PPMissingLayer"
            for layer in layers
        ):
            return module
    return None


def _is_gemma(norm: nn.Module) -> bool | None:
    """True for GemmaRMSNorm, False for plain RMSNorm, None for anything else."""
    gemma = _module_attr("vllm.model_executor.layers.layernorm", "GemmaRMSNorm")
    plain = _module_attr("vllm.model_executor.layers.layernorm", "RMSNorm")
    if gemma is not None and isinstance(norm, gemma):
        return True
    if plain is not None and isinstance(norm, plain):
        if getattr(norm, "variance_size_override", None) is not None or not norm.has_weight:
            return None
        return False
    return None


# ----------------------------------------------------------------------------- planning


class _Planner:
    def __init__(self, *, tp, lowering, gdn_norm_quant, act_dtype, device, taps, accepts):
        self.tp = tp
        self.gdn = gdn_norm_quant
        self.act_dtype, self.device, self.taps = act_dtype, device, taps
        self.epilogues = Epilogues(lowering, tp)
        self.accepts = accepts
        self.skips: list[Skip] = []

    def skip(self, layer, site, reason) -> None:
        self.skips.append(Skip(layer, site, reason))

    def _kernel_reason(self, op: str, k: int, group: int, fp8, extra=()) -> str | None:
        """Why the GPU kernel cannot serve this site (None when it can, or on the CPU where the
        reference is the implementation)."""
        if self.device.type != "cuda":
            return None
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        query = {"device": "cuda", "device_index": index,
                 "dtype": str(self.act_dtype).removeprefix("torch."), "K": k, "group": group,
                 "fp8": str(fp8).removeprefix("torch."), **dict(extra)}
        sel = registry.select(op, **query)
        return None if sel else f"no {op} kernel for K={k} group={group}: {sel.reason}"

    def consumers(self, linears: list[tuple[str, nn.Module | None]], k: int,
                  op: str, extra=()) -> tuple[SiteQuant | None, str | None]:
        """The quantization every consumer of a site wants, or why the site stays stock."""
        groups = set()
        fp8 = set()
        for name, linear in linears:
            group = self.accepts(linear) if linear is not None else None
            if group is None:
                return None, f"consumer {name} does not take a pre-quantized input (not a radiance-gemm linear)"
            if group not in reference.GROUP_SIZES:
                return None, f"consumer {name} wants group {group}; the kernels serve 0 or 128"
            groups.add(group)
            fp8.add(linear.weight.dtype if linear.weight.dtype in FP8_DTYPES
                    else reference.platform_fp8_dtype())
        if len(groups) != 1 or len(fp8) != 1:
            return None, f"consumers want different quantizations: groups {sorted(groups)}"
        group, fp8_dtype = groups.pop(), fp8.pop()
        if k % 8 or (group and k % group):
            return None, f"width {k} is not a multiple of 8 and of the group {group}"
        why = self._kernel_reason(op, k, group, fp8_dtype, extra)
        if why:
            return None, why
        return SiteQuant(group, fp8_dtype), None

    def layer(self, i: int, layer: nn.Module) -> LayerPlan | None:
        family = _layer_family(layer)
        if family is None:
            for site in SITES:
                self.skip(i, site, f"{type(layer).__name__} is not a decoder layer the stream knows")
            return None
        if getattr(layer, "use_attn_reduce_scatter_for_moe", False):
            for site in SITES:
                self.skip(i, site, "sequence-parallel MoE (reduce-scatter/all-gather around the MLP)")
            return None
        gemma_in = _is_gemma(layer.input_layernorm)
        gemma_post = _is_gemma(layer.post_attention_layernorm)
        plan = LayerPlan(index=i, family=family, epilogues=self.epilogues)
        hidden = layer.input_layernorm.weight.numel()
        linear_attention = family == "qwen3_next" and layer.layer_type == "linear_attention"
        layer_scale = bool(getattr(layer, "layer_scale", False))

        # input site
        if gemma_in is None:
            self.skip(i, "input", "input_layernorm is not vLLM's RMSNorm/GemmaRMSNorm with a plain weight")
        elif linear_attention:
            self.skip(i, "input", "the GatedDeltaNet reads its bf16 input itself (token count, "
                      "dtype, the unquantized in_proj_ba)")
        elif not _attention_ok(layer.self_attn):
            self.skip(i, "input", f"{type(layer.self_attn).__name__}.forward is not one the stream knows")
        else:
            site, why = self.consumers([("self_attn.qkv_proj", layer.self_attn.qkv_proj)],
                                       hidden, "add_rms_quant")
            if site is not None:
                plan.input = dataclasses.replace(site, gemma=gemma_in)
            else:
                self.skip(i, "input", why)

        mlp_dense = _mlp_kind(layer.mlp) == "dense"
        # mid site
        row = layer.linear_attn.out_proj if linear_attention else layer.self_attn.o_proj
        row_name = "linear_attn.out_proj" if linear_attention else "self_attn.o_proj"
        if gemma_post is None:
            self.skip(i, "mid", "post_attention_layernorm is not vLLM's RMSNorm/GemmaRMSNorm with a plain weight")
        elif not mlp_dense:
            self.skip(i, "mid", f"MoE MLP ({type(layer.mlp).__name__}): router and experts read "
                      "the bf16 activations, no dense gate_up_proj")
        elif layer_scale:
            self.skip(i, "mid", "layer scale multiplies the attention output before the norm")
        elif getattr(row, "bias", None) is not None or getattr(row, "skip_bias_add", False):
            self.skip(i, "mid", f"{row_name} has a bias")
        elif self.tp > 1 and not getattr(row, "reduce_results", False):
            self.skip(i, "mid", f"{row_name} does not reduce its output")
        else:
            site, why = self.consumers([("mlp.gate_up_proj", layer.mlp.gate_up_proj)],
                                       hidden, "add_rms_quant")
            if site is not None:
                plan.mid = dataclasses.replace(site, gemma=gemma_post)
            else:
                self.skip(i, "mid", why)

        # act site
        act_cls = _module_attr("vllm.model_executor.layers.activation", "SiluAndMul")
        if not mlp_dense:
            self.skip(i, "act", f"MoE MLP ({type(layer.mlp).__name__}): no dense down_proj")
        elif act_cls is None or type(layer.mlp.act_fn) is not act_cls:
            self.skip(i, "act", f"activation {type(layer.mlp.act_fn).__name__} is not SiluAndMul")
        else:
            down = layer.mlp.down_proj
            site, why = self.consumers([("mlp.down_proj", down)],
                                       down.input_size_per_partition, "silu_mul_quant")
            if site is not None:
                plan.act = site
            else:
                self.skip(i, "act", why)

        # gdn_norm site
        if linear_attention:
            if not self.gdn:
                self.skip(i, "gdn_norm", "RADIANCE_GDN_NORM_QUANT is 0")
            else:
                la = layer.linear_attn
                norm = la.norm
                width = la.out_proj.input_size_per_partition
                head = norm.weight.numel()
                if (getattr(norm, "group_size", None) not in (None, head)
                        or not getattr(norm, "norm_before_gate", False)
                        or getattr(norm, "activation", None) not in ("swish", "silu")
                        or getattr(norm, "bias", None) is not None):
                    self.skip(i, "gdn_norm", "output norm is not a per-head, norm-before-gate "
                              "silu-gated RMSNorm")
                elif getattr(la.out_proj, "bias", None) is not None:
                    self.skip(i, "gdn_norm", "linear_attn.out_proj has a bias")
                elif width % head:
                    self.skip(i, "gdn_norm", f"out_proj width {width} is not a multiple of head dim {head}")
                else:
                    site, why = self.consumers([("linear_attn.out_proj", la.out_proj)],
                                               width, "gdn_norm_quant", (("head_dim", head),))
                    if site is not None:
                        plan.gdn_norm = site
                    else:
                        self.skip(i, "gdn_norm", why)
        return plan

    def handoff(self, i: int, prev: nn.Module | None, prev_plan: LayerPlan | None,
                plan: LayerPlan) -> None:
        """With tp > 1 an input site (after the first layer) must receive a partial sum: the
        previous layer's down_proj has to be one the stream can leave un-reduced."""
        if plan.input is None or prev is None or self.tp == 1:
            return
        why = None
        if prev_plan is None:
            why = f"layer {i - 1} is left stock, its output is already reduced"
        elif _mlp_kind(prev.mlp) != "dense":
            why = f"layer {i - 1} has an MoE MLP whose output is reduced inside the fused MoE"
        elif getattr(prev, "layer_scale", False):
            why = f"layer {i - 1} scales its MLP output after the reduce (layer scale)"
        elif getattr(prev.mlp.down_proj, "bias", None) is not None:
            why = f"layer {i - 1} down_proj has a bias"
        elif not getattr(prev.mlp.down_proj, "reduce_results", False):
            why = f"layer {i - 1} down_proj does not reduce its output"
        elif i in self.taps:
            why = f"an aux hidden-state tap reads layer {i - 1}'s output"
        if why is not None:
            plan.input = None
            self.skip(i, "input", why)
        else:
            prev_plan.partial_output = True


def _activation_dtype(core: nn.Module) -> torch.dtype:
    embed = getattr(core, "embed_tokens", None)
    weight = getattr(embed, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dtype in ACT_DTYPES:
        return weight.dtype
    return torch.get_default_dtype()


def _parallel() -> tuple[int, int]:
    try:
        from vllm.distributed import parallel_state
    except ImportError:
        return 1, 1
    if not parallel_state.model_parallel_is_initialized():
        return 1, 1
    return (parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pp_group().world_size)


def plan(model: nn.Module, *, lowering: str = "auto", gdn_norm_quant: bool | None = None,
         taps: tuple[int, ...] | None = None, lora: bool = False,
         device: torch.device | None = None) -> Summary:
    """Decide every site of ``model`` without changing it.

    ``taps``: aux hidden-state layer indices (default: the core's); ``lora``: vLLM wraps the
    linears for LoRA after load; ``device``: where the model runs (default: its parameters').
    """
    from radiance.fp8stream import flags

    gdn = flags.gdn_norm_quant_enabled() if gdn_norm_quant is None else gdn_norm_quant
    summary = Summary(model=type(model).__name__)
    core = find_core(model)
    if core is None:
        summary.skips.append(Skip(None, "all", "no decoder core (a module with a list of decoder layers)"))
        return summary
    tp, pp = _parallel()
    summary.tp = tp
    start = getattr(core, "start_layer", 0)
    end = getattr(core, "end_layer", len(core.layers))
    layers = list(core.layers)[start:end]
    summary.layers = len(layers)

    def skip_all(reason: str) -> Summary:
        summary.skips.append(Skip(None, "all", reason))
        return summary

    if pp > 1:
        return skip_all(f"pipeline parallel size {pp}: the layer hand-off would cross stages")
    if lora:
        return skip_all("LoRA wraps the linears after load; they would receive (q, scale) tuples")
    try:
        from radiance.gemm import accepts_prequantized
    except ImportError as exc:
        # Said once here: per site it would read as if each consumer were the wrong linear.
        return skip_all(f"radiance-gemm is not importable ({type(exc).__name__}: {exc}): no linear "
                        "takes a pre-quantized input")
    if device is None:
        param = next(iter(core.parameters()), None)
        device = param.device if param is not None else torch.device("cpu")
    act_dtype = _activation_dtype(core)
    if act_dtype not in ACT_DTYPES:
        return skip_all(f"activation dtype {act_dtype} (the epilogue ops take bf16/fp16)")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        why = kops.unavailable_reason(index)
        if why is not None:
            return skip_all(f"GPU kernels unavailable ({why}); the reference inside an opaque op "
                            "would run eagerly, far slower than the stock compiled graph")
        chosen = "opaque" if lowering == "auto" else lowering
    else:
        chosen = "traced" if lowering == "auto" else lowering
    summary.lowering = chosen
    if taps is None:
        tap_set = set(getattr(core, "aux_hidden_state_layers", ()) or ())
    else:
        tap_set = taps if isinstance(taps, _EveryLayer) else set(taps)

    planner = _Planner(tp=tp, lowering=chosen, gdn_norm_quant=gdn, act_dtype=act_dtype,
                       device=device, taps=tap_set, accepts=accepts_prequantized)
    plans: list[LayerPlan | None] = []
    for offset, layer in enumerate(layers):
        i = start + offset
        p = planner.layer(i, layer)
        if p is not None and offset > 0:
            planner.handoff(i, layers[offset - 1], plans[-1], p)
        plans.append(p)
    for p in plans:
        if p is None:
            continue
        for site in SITES:
            summary.counts[site] += getattr(p, site) is not None
        summary.partial_handoffs += p.partial_output
    summary.skips.extend(planner.skips)
    summary.plans = list(zip(layers, plans))
    return summary


# ----------------------------------------------------------------------------- applying


def _apply(layer: nn.Module, p: LayerPlan) -> None:
    saved: dict = {}
    if p.input is None and p.mid is None and p.act is None and p.gdn_norm is None and not p.partial_output:
        return
    setattr(layer, MARK, p)
    # Filled as each stock value is replaced, so uninstall() can undo a layer cut short.
    layer._radiance_fp8stream_saved = saved
    layer.forward = types.MethodType(forwards.FORWARDS[p.family], layer)
    if p.mid is not None:
        row = (layer.linear_attn.out_proj if p.family == "qwen3_next"
               and layer.layer_type == "linear_attention" else layer.self_attn.o_proj)
        if p.epilogues.tp > 1:
            saved["mid_row"] = (row, row.reduce_results)
            row.reduce_results = False
    if p.partial_output:
        down = layer.mlp.down_proj
        saved["down"] = (down, down.reduce_results)
        down.reduce_results = False
    if p.act is not None:
        layer.mlp.act_fn = forwards.SiluMulQuant(layer.mlp.act_fn, p.act, p.epilogues)
    if p.gdn_norm is not None:
        la = layer.linear_attn
        setattr(la, MARK, p)
        la._output_projection = types.MethodType(forwards.gdn_output_projection, la)


def install(model: nn.Module, *, lowering: str = "auto", gdn_norm_quant: bool | None = None,
            taps: tuple[int, ...] | None = None, lora: bool = False,
            device: torch.device | None = None) -> Summary:
    """Rewrite ``model``'s decoder layers where every guard holds; return the summary.

    Idempotent: a model already rewritten is returned its first summary untouched. Never raises
    for a guard; it logs each skipped site and one summary line.
    """
    done = getattr(model, "_radiance_fp8stream_summary", None)
    if done is not None:
        return done
    summary = plan(model, lowering=lowering, gdn_norm_quant=gdn_norm_quant, taps=taps, lora=lora,
                   device=device)
    # Recorded before the layers change: if one raises, uninstall() finds every layer touched.
    model._radiance_fp8stream_summary = summary
    for layer, p in summary.plans:
        if p is not None:
            _apply(layer, p)
    for skip in summary.skips:
        logger.info("%s", skip.line())
    logger.info("%s", summary)
    registry.record("fp8stream.rewrite", {"model": summary.model, "summary": str(summary)},
                    f"radiance.fp8stream ({summary.lowering} ops)" if summary.installed else None,
                    "" if summary.installed else "; ".join(s.reason for s in summary.skips[:1]) or "no site")
    global _last
    _last = summary
    return summary


def uninstall(model: nn.Module) -> bool:
    """Put every rewritten layer back to stock; returns whether anything was rewritten."""
    summary = getattr(model, "_radiance_fp8stream_summary", None)
    if summary is None:
        return False
    for layer, p in summary.plans:
        if p is None or not hasattr(layer, MARK):
            continue
        saved = layer.__dict__.pop("_radiance_fp8stream_saved", {})
        for key in ("mid_row", "down"):
            if key in saved:
                linear, value = saved[key]
                linear.reduce_results = value
        if isinstance(getattr(layer.mlp, "act_fn", None), forwards.SiluMulQuant):
            layer.mlp.act_fn = layer.mlp.act_fn.stock
        la = getattr(layer, "linear_attn", None)
        if la is not None and "_output_projection" in la.__dict__:
            del la.__dict__["_output_projection"]
            delattr(la, MARK)
        layer.__dict__.pop("forward", None)
        delattr(layer, MARK)
    del model._radiance_fp8stream_summary
    return True


_last: Summary | None = None


def last_summary() -> Summary | None:
    """The summary of the latest ``install`` in this process (None before any)."""
    return _last
