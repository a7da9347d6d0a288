"""Run one real vLLM engine in a fresh child process and get its results back as JSON.

The demo and every end-to-end test start engines through ``run_vllm_generate``, so that:
  * engines never leak into each other (vLLM keeps process-global state: the plugin registry,
    compilation config, worker processes), flags read at plugin-install time (``RADIANCE_*``)
    apply cleanly, and the calling process never imports vLLM;
  * the engine's output comes back whole for assertions such as "the plugin installed X in the
    worker": vLLM's log handler (which the radiance loggers, children of ``vllm.``, share) writes
    to stdout by default (``VLLM_LOGGING_STREAM``); warnings and tracebacks go to stderr.
    ``res["log"]`` is both together. ``stream_log=True`` lets the output through to the
    terminal instead (the demo's progress), and ``log`` is then empty.

Usage::

    res = run_vllm_generate(
        model_dir,
        prompts=["Hello"],                       # default: one short prompt
        sampling={"max_tokens": 8, "temperature": 0.0, "logprobs": 3, "ignore_eos": True},
        llm_kwargs={"max_model_len": 256},       # merged over DEFAULT_LLM_KWARGS
        env={"RADIANCE_DISABLE": "attn", "VLLM_PLUGINS": None},  # None removes a variable
    )
    res["outputs"][0]["text"], res["outputs"][0]["token_ids"], res["outputs"][0]["logprobs"]

The result dict:
  ``outputs``: one entry per prompt: ``prompt``, ``text``, ``token_ids`` (generated ids),
      ``prompt_token_ids``, ``finish_reason``, ``logprobs`` (``None`` unless ``sampling`` asks for
      ``logprobs``: one ``{token_id: logprob}`` dict per generated token, keys as ints) and
      ``prompt_logprobs`` (likewise, from ``sampling["prompt_logprobs"]``; the first is ``None``);
  ``record`` / ``selections``: the radiance install record and kernel-selection log of the
      child process (the front end's; with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` in ``env`` the
      engine core and its worker run in that same process, so these are the serving process's);
  ``load_s`` / ``generate_s``: engine construction and generate() wall time in the child;
  ``returncode``, ``stdout``, ``stderr``, ``log`` (stdout then stderr), ``wall_s`` (the whole
      child process, interpreter start included).

With ``check=True`` (the default) a child that fails raises ``VllmRunError`` whose message holds
the tail of its log; ``check=False`` returns the dict with ``outputs=None`` instead, for callers
that expect a failure.

Defaults fit a small CPU machine: bf16, eager (no torch.compile / CUDA graphs),
``max_model_len=256``, seed 0, ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) unless the environment sets it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_PROMPTS: tuple[str, ...] = ("Hello, world! The quick brown fox",)
DEFAULT_SAMPLING: dict[str, Any] = {"max_tokens": 8, "temperature": 0.0}
DEFAULT_LLM_KWARGS: dict[str, Any] = {
    "dtype": "bfloat16",
    "enforce_eager": True,
    "max_model_len": 256,
    "seed": 0,
}
DEFAULT_ENV: dict[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "1"}
DEFAULT_TIMEOUT_S = 600


class VllmRunError(RuntimeError):
    """The vLLM child process failed; the message carries the tail of its stderr."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result


def run_vllm_generate(
    model_dir: str | os.PathLike,
    prompts: list[str] | tuple[str, ...] | None = None,
    *,
    sampling: dict[str, Any] | None = None,
    llm_kwargs: dict[str, Any] | None = None,
    env: dict[str, str | None] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    check: bool = True,
    log_tail_chars: int = 6000,
    stream_log: bool = False,
) -> dict[str, Any]:
    """Start ``vllm.LLM(model=model_dir, **llm_kwargs)`` in a subprocess, generate, return JSON.

    ``sampling`` is passed to ``vllm.SamplingParams`` as keyword arguments (greedy, 8 tokens by
    default). ``env`` overrides the inherited environment (a ``None`` value removes the variable).
    """
    prompts = list(DEFAULT_PROMPTS if prompts is None else prompts)
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise TypeError("prompts must be a non-empty list of strings")
    spec = {
        "model": str(model_dir),
        "prompts": prompts,
        "sampling": {**DEFAULT_SAMPLING, **(sampling or {})},
        "llm_kwargs": {**DEFAULT_LLM_KWARGS, **(llm_kwargs or {})},
    }
    child_env = dict(os.environ)
    for key, value in DEFAULT_ENV.items():
        child_env.setdefault(key, value)
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = str(value)

    with tempfile.TemporaryDirectory(prefix="radiance-vllm-run-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        out_path = Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "radiance.plugin.generate", str(spec_path), str(out_path)],
            env=child_env,
            capture_output=not stream_log,
            text=True,
            timeout=timeout_s,
        )
        wall = time.perf_counter() - start
        child = json.loads(out_path.read_text()) if out_path.exists() else {}
    for out in child.get("outputs") or []:
        for key in ("logprobs", "prompt_logprobs"):
            out[key] = _int_keys(out[key])

    result: dict[str, Any] = {
        "outputs": child.get("outputs"),
        "record": child.get("record", []),
        "selections": child.get("selections", []),
        "load_s": child.get("load_s"),
        "generate_s": child.get("generate_s"),
        "returncode": proc.returncode,
        "stdout": proc.stdout or "",
        "stderr": proc.stderr or "",
        "log": (proc.stdout or "") + (proc.stderr or ""),
        "wall_s": wall,
    }
    if check and (proc.returncode != 0 or result["outputs"] is None):
        tail = result["log"][-log_tail_chars:]
        raise VllmRunError(
            f"vLLM child exited with {proc.returncode} for {model_dir}; log tail:\n{tail}",
            result,
        )
    return result


def _int_keys(steps: list | None) -> list | None:
    # JSON object keys are strings; token ids are ints again on this side.
    if steps is None:
        return None
    return [None if step is None else {int(k): v for k, v in step.items()} for step in steps]


# ---------------------------------------------------------------------------------------------
# The child: runs only when this module is executed by run_vllm_generate.


def _logprob_steps(steps) -> list | None:
    if steps is None:
        return None
    return [
        None if step is None else {int(tok): float(lp.logprob) for tok, lp in step.items()}
        for step in steps
    ]


def _child(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=spec["model"], **spec["llm_kwargs"])
    t1 = time.perf_counter()
    params = SamplingParams(**spec["sampling"])
    results = llm.generate(spec["prompts"], params, use_tqdm=False)
    t2 = time.perf_counter()
    outputs = []
    for req in results:
        completion = req.outputs[0]
        outputs.append(
            {
                "prompt": req.prompt,
                "prompt_token_ids": list(req.prompt_token_ids or []),
                "text": completion.text,
                "token_ids": list(completion.token_ids),
                "finish_reason": completion.finish_reason,
                "logprobs": _logprob_steps(completion.logprobs),
                "prompt_logprobs": _logprob_steps(req.prompt_logprobs),
            }
        )
    from radiance.kernels import registry
    from radiance.plugin import record

    Path(out_path).write_text(
        json.dumps(
            {
                "outputs": outputs,
                "record": record.as_dicts(),
                "selections": registry.selections(),
                "load_s": t1 - t0,
                "generate_s": t2 - t1,
            },
            default=str,
        )
    )
    # Shut the engine down before the interpreter exits, so its worker processes go too.
    del llm
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))
