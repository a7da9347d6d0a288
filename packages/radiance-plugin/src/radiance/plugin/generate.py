"""Run one real vLLM offline generation in a child process and bring back what it saw.

Each run gets its own interpreter, so flags read at plugin-install time (RADIANCE_*) apply
cleanly and one engine never leaks into the next. Inside the child the engine core runs
in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) by default, so the plugin's install record and the
kernel-selection log are those of the process that loaded and ran the model. vLLM's own log
goes to the terminal (stderr) as it happens, which is the progress a user sees during the
first, slow start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class GenerationResult:
    texts: list[str]
    token_ids: list[list[int]]
    logprobs: list[list[float]] | None
    record: list[dict]
    selections: list[dict]
    stderr: str = field(default="", repr=False)


def default_llm_kwargs() -> dict[str, Any]:
    """Small-footprint engine settings for tiny local models."""
    return {"max_model_len": 512, "seed": 0}


def generate(
    model: str | Path,
    prompts: list[str],
    *,
    max_tokens: int = 16,
    logprobs: int | None = None,
    llm_kwargs: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    capture_stderr: bool = False,
    engine_in_process: bool = True,
    timeout: float = 900,
) -> GenerationResult:
    """Greedy-generate ``prompts`` with vLLM on ``model`` in a fresh child process.

    ``engine_in_process=False`` keeps vLLM's own process layout (front end, engine core and,
    with the ``mp`` executor, workers in processes of their own); the record and selections
    brought back are then only the front end's.
    """
    kwargs = default_llm_kwargs()
    kwargs.update(llm_kwargs or {})
    spec = {
        "model": str(model),
        "prompts": list(prompts),
        "max_tokens": int(max_tokens),
        "logprobs": logprobs,
        "llm_kwargs": kwargs,
    }
    child_env = dict(os.environ)
    child_env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    child_env.update(env or {})
    child_env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if engine_in_process else "1"
    with tempfile.TemporaryDirectory(prefix="radiance-gen-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        out_path = Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        proc = subprocess.run(
            [sys.executable, "-m", "radiance.plugin.generate", str(spec_path), str(out_path)],
            env=child_env,
            stderr=subprocess.PIPE if capture_stderr else None,
            text=True,
            timeout=timeout,
        )
        stderr = proc.stderr or ""
        if proc.returncode != 0 or not out_path.exists():
            tail = "\n".join(stderr.splitlines()[-40:])
            raise RuntimeError(f"vLLM generation failed (exit {proc.returncode}) for {model}\n{tail}")
        out = json.loads(out_path.read_text())
    return GenerationResult(stderr=stderr, **out)


def _child(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model"], **spec["llm_kwargs"])
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], logprobs=spec["logprobs"])
    outputs = llm.generate(spec["prompts"], params, use_tqdm=False)

    from radiance.kernels import registry
    from radiance.plugin import record

    completions = [o.outputs[0] for o in outputs]
    logprobs = None
    if spec["logprobs"] is not None:
        logprobs = [
            [step[tok].logprob for step, tok in zip(c.logprobs, c.token_ids)] for c in completions
        ]
    result = {
        "texts": [c.text for c in completions],
        "token_ids": [list(c.token_ids) for c in completions],
        "logprobs": logprobs,
        "record": record.as_dicts(),
        "selections": registry.selections(),
    }
    Path(out_path).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
