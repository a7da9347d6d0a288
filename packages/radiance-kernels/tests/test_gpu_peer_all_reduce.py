"""The peer all-reduce and its fused epilogue on the GPU, two processes (sharing one GPU through
IPC when there is only one): a small grid of the exactness check and 100 graph replays with fresh
inputs. The full grid (world sizes 2 and 4, 1000 replays) is benchmarks/peer_all_reduce_check.py,
run by scripts/gpu-suite; its results are committed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parents[1] / "benchmarks" / "peer_all_reduce_check.py"


@pytest.mark.gpu
def test_two_ranks_exact_eager_and_under_graph_replay(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(CHECK), "--world-size", "2", "--out", str(tmp_path), "--ms", "1", "64",
         "--ks", "2048", "5120", "--dtypes", "bf16", "fp16", "--replays", "100"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "ws2.json").read_text())
    assert result["ok"] and not result["problems"]
    ranks = result["ranks"]
    assert all(r["enabled"] for r in ranks)
    assert len(ranks[0]["rows"]) == 2 * 2 * 2 * 2 * 2
    assert all(r["graph"]["replays"] == 100 for r in ranks)
