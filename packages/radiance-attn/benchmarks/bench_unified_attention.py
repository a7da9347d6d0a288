"""Benchmark + tune vLLM's Triton unified attention: stock wrapper vs radiance's launch.

    python benchmarks/bench_unified_attention.py --out benchmarks/results/h200 --kernel-src DIR [--quick]

DIR comes from stage_vllm_kernel.py. Writes bench_unified_attention.{md,json,png} and the fitted
table (tables/<arch>.json) under --out; see radiance.attn.tune for what is measured.
"""

import sys
from pathlib import Path

try:
    from radiance.attn import tune
except ImportError:  # a GPU machine with the checkout but without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from radiance.attn import tune

if __name__ == "__main__":
    sys.exit(tune.main())
