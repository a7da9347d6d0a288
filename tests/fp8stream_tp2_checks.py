"""Child process: tensor parallel 2 (mp executor), stream installed in the workers by hand.

Usage: python fp8stream_tp2_checks.py MODEL_DIR OUT.json

Loads the model stock, generates, then rewrites the model inside each worker with the opaque
custom ops (whose ``ar_add_rms_quant`` all-reduces the partial sums through vLLM's own
all-reduce), generates again, and writes both results and the workers' summaries.
"""

import json
import sys
from pathlib import Path


def main(model_dir: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, enforce_eager=True, max_model_len=256, seed=0,
              tensor_parallel_size=2, distributed_executor_backend="mp",
              enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1, ignore_eos=True)
    prompts = ["Hello, world! How are", "The quick brown fox"]

    def run():
        outs = llm.generate(prompts, params, use_tqdm=False)
        return ([list(o.outputs[0].token_ids) for o in outs],
                [[s[t].logprob for s, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
                 for o in outs])

    stock = run()
    from fp8stream_tp2_model import install_opaque  # importable by the workers (PYTHONPATH)

    summaries = llm.apply_model(install_opaque)
    stream = run()
    Path(out_path).write_text(json.dumps({"stock": stock, "stream": stream, "summaries": summaries}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
