"""A tensor-parallel-2-loadable variant of the tiny block-FP8 Qwen3 (for the tp=2 test).

The tiny Qwen3 has 2 KV heads of 64: at tp=2 each rank's K/V shard is 64 rows, half of a 128-row
weight block, which vLLM's block-FP8 loader cannot narrow. Here every KV head is stored twice
(4 KV heads, one per query head). Query head i attended KV head i // 2 before and attends the
copy i now, so the model computes the same function; the fp8 codes are copied row for row and
each 128-row block keeps its block scale, so dequantized weights are identical too.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from radiance.plugin import tiny_models

HEAD = 64


def build() -> Path:
    src = tiny_models.build("qwen3", "fp8_block")
    dst = src.parent / f"{src.name}-fp8stream-kv4"
    if (dst / "config.json").exists():
        return dst
    from safetensors.torch import load_file, save_file

    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=src.parent))
    shutil.rmtree(tmp)
    shutil.copytree(src, tmp)
    config = json.loads((src / "config.json").read_text())
    kv = config["num_key_value_heads"]
    config["num_key_value_heads"] = 2 * kv
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tensors = load_file(str(src / "model.safetensors"))
    for name in list(tensors):
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            w = tensors[name]
            heads = w.view(kv, HEAD, -1)
            tensors[name] = heads.repeat_interleave(2, dim=0).reshape(2 * kv * HEAD, -1).contiguous()
        elif name.endswith(("k_proj.weight_scale_inv", "v_proj.weight_scale_inv")):
            s = tensors[name]  # one 128-row block held both heads; now each head fills a block
            tensors[name] = s.repeat_interleave(2, dim=0).contiguous()
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    try:
        tmp.rename(dst)
    except OSError:  # another process finished the same build first
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def install_opaque(model) -> str:
    """Rewrite ``model`` with the opaque custom ops; runs inside each vLLM worker."""
    from radiance.fp8stream import rewrite

    return str(rewrite.install(model, lowering="opaque"))
