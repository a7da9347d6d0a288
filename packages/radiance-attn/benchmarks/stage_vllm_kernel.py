"""Copy the installed vLLM's Triton unified-attention kernel into DIR for the tuning harness.

    python benchmarks/stage_vllm_kernel.py --dest DIR

Run where vLLM is installed; carry DIR (an ignored folder, never committed) to the GPU machine
and pass it as ``--kernel-src`` to bench_unified_attention.py.
"""

import argparse
import json
import sys
from pathlib import Path

try:
    from radiance.attn import kernel_source
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from radiance.attn import kernel_source


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", required=True)
    args = ap.parse_args()
    try:
        manifest = kernel_source.stage(args.dest)
    except (kernel_source.StagingError, ImportError) as exc:
        print(f"cannot stage vLLM's kernel: {exc}")
        return 1
    print(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
