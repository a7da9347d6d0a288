"""Child process for the fp8-stream tests: one real vLLM engine, many checks, JSON out.

Usage: python fp8stream_engine_checks.py SPEC.json OUT.json

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), eager, loaded with the
stream off, so the model starts stock. Then, on the real loaded model:
  * ``layers``: every decoder layer's outputs during a generate, stock vs rewritten (each
    lowering), compared bit for bit, with the sites each layer had; and the generated tokens
    and logprobs of the same runs;
  * ``guards``: ``plan`` (which changes nothing) under each guard condition, with the skips;
  * ``twice``: installing twice returns the first summary and leaves one rewrite.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch


class _Capture:
    """Forward hooks recording each decoder layer's (hidden_states, residual) outputs."""

    def __init__(self, layers):
        self.layers = layers
        self.calls: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in layers]
        self.handles = []

    def __enter__(self):
        for i, layer in enumerate(self.layers):
            def hook(module, args, output, i=i):
                h, r = output
                self.calls[i].append((h.detach().clone(), r.detach().clone()))
            self.handles.append(layer.register_forward_hook(hook))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


def _generate(llm, prompts, max_tokens):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=1, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    logprobs = [[step[t].logprob for step, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
                for o in outs]
    return tokens, logprobs


def _layer_kind(layer) -> str:
    kind = getattr(layer, "layer_type", "attention")
    mlp = type(layer.mlp).__name__
    return f"{kind}/{mlp}"


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    log_lines: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            log_lines.append(record.getMessage())

    logging.getLogger("vllm.radiance.fp8stream").addHandler(_Keep())

    from vllm import LLM

    from radiance.fp8stream import rewrite
    from radiance.fp8stream.forwards import SiluMulQuant

    llm = LLM(model=spec["model"], enforce_eager=True, max_model_len=256, seed=0,
              enable_prefix_caching=False, **spec.get("llm_kwargs", {}))
    holder = {}
    llm.apply_model(lambda m: holder.setdefault("model", m))
    model = holder["model"]
    core = rewrite.find_core(model)
    layers = list(core.layers)
    prompts = spec["prompts"]
    result: dict = {"kinds": [_layer_kind(layer) for layer in layers]}

    with _Capture(layers) as stock:
        stock_tokens, stock_logprobs = _generate(llm, prompts, spec["max_tokens"])
    result["stock"] = {"tokens": stock_tokens, "logprobs": stock_logprobs}

    runs = {}
    for lowering in spec.get("lowerings", ["opaque", "traced"]):
        summary = rewrite.install(model, lowering=lowering, gdn_norm_quant=True)
        sites = [
            [s for s in rewrite.SITES if p is not None and getattr(p, s) is not None]
            for _, p in summary.plans
        ]
        with _Capture(layers) as cap:
            tokens, logprobs = _generate(llm, prompts, spec["max_tokens"])
        per_layer = []
        for i in range(len(layers)):
            a, b = stock.calls[i], cap.calls[i]
            same = len(a) == len(b) and all(
                torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
            per_layer.append({"calls": len(b), "identical": same, "sites": sites[i]})
        runs[lowering] = {
            "summary": str(summary), "counts": summary.counts,
            "skips": [[s.layer, s.site, s.reason] for s in summary.skips],
            "layers": per_layer, "tokens": tokens, "logprobs": logprobs,
        }
        if lowering == spec.get("twice_lowering", "opaque"):
            again = rewrite.install(model, lowering=lowering)
            forwards = [layer.__dict__.get("forward") for layer in layers]
            result["twice"] = {
                "same_summary": again is summary,
                "act_wrapped_once": all(
                    not isinstance(getattr(getattr(layer.mlp, "act_fn", None), "stock", None),
                                   SiluMulQuant)
                    for layer in layers),
                "forwards": sum(f is not None for f in forwards),
            }
        assert rewrite.uninstall(model)
        result["restored"] = all("forward" not in layer.__dict__ for layer in layers)
    result["runs"] = runs

    from fp8stream_guard_checks import run_guards  # same folder

    result["guards"] = run_guards(model, core, layers)
    result["log"] = log_lines
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(sys.argv[1], sys.argv[2])
