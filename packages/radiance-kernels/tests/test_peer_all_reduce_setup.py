"""The peer all-reduce's setup protocol and branch decisions, with real processes in a gloo group.

The kernels need a GPU (tests/test_gpu_peer_all_reduce.py and benchmarks/peer_all_reduce_check.py
run them); what is tested here is what runs on the host: every rank reaches the same decision
whatever fails on one of them, nothing waits forever, whatever was mapped is released, and the
one-kernel branch is a function of shapes only. The failing steps are injected through the
``backend`` argument (the object that performs the GPU-side setup steps), the real backend is
used where this machine's own answer is the point (no GPU).
"""

from __future__ import annotations

import logging
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from radiance.kernels import ops as kops
from radiance.kernels import registry
from radiance.kernels.peer_all_reduce import (
    FUSED_MAX_K,
    FUSED_MAX_M,
    MESSAGE_BYTES,
    CudaPeerBackend,
    PeerAllReduce,
    PeerSetupError,
)


class Launches:
    """Stands for the kernel library's two ops: records each launch and reports success."""

    def __init__(self):
        self.launched = []

    def all_reduce(self, *args):
        self.launched.append("all_reduce")
        return 0

    def ar_add_rms_quant(self, *args):
        self.launched.append("ar_add_rms_quant")
        return 0


class ScriptedBackend:
    """Performs the setup steps on host memory, failing where the scenario says, and logs every
    call so the test can check what was released."""

    def __init__(self, rank, fail=None):
        self.rank = rank
        self.fail = fail or {}
        self.calls = []
        self.lib = Launches()
        self._next = 0x1000 * (rank + 1)

    def _maybe_fail(self, step):
        how = self.fail.get(step)
        if how == "error":
            raise PeerSetupError(f"scripted {step} failure")
        if how == "crash":
            raise RuntimeError(f"unexpected {step} crash")

    def allocate(self, message_bytes):
        self._maybe_fail("allocate")
        base = self._next
        self._next += 1
        self.calls.append(("allocate", base))
        return base, f"handle-of-{self.rank}".encode()

    def open(self, handle):
        self._maybe_fail("open")
        base = 0x9000 + int(handle.decode().rsplit("-", 1)[1])
        self.calls.append(("open", base))
        return base

    def create(self, rank, bases, message_bytes):
        self.calls.append(("create", len(bases)))
        return 0x7777

    def handshake(self, peer_set, timeout_ms):
        self._maybe_fail("handshake")
        return self.fail.get("handshake") != "timeout"

    def destroy(self, peer_set):
        self.calls.append(("destroy", peer_set))

    def close(self, base):
        self.calls.append(("close", base))

    def free(self, base):
        self.calls.append(("free", base))


# scenario name -> {rank: {step: how}}; "real" uses the GPU backend (none here: no GPU)
SCENARIOS = {
    "all_ok": {},
    "alloc_fails_on_rank1": {1: {"allocate": "error"}},
    "map_fails_on_rank1": {1: {"open": "error"}},
    "handshake_times_out_on_rank0": {0: {"handshake": "timeout"}},
    "open_crashes_on_rank0": {0: {"open": "crash"}},
}


def _decisions(comm):
    bf16 = torch.bfloat16
    cases = {
        "decode": (torch.empty(8, 4096, dtype=bf16), True, 128),
        "largest_m": (torch.empty(FUSED_MAX_M, 4096, dtype=bf16), True, 0),
        "m_too_large": (torch.empty(FUSED_MAX_M + 1, 4096, dtype=bf16), True, 0),
        "k_too_wide": (torch.empty(8, FUSED_MAX_K + 128, dtype=bf16), True, 0),
        "no_residual": (torch.empty(8, 4096, dtype=bf16), False, 0),
        "fp32": (torch.empty(8, 4096, dtype=torch.float32), True, 0),
        "strided": (torch.empty(8, 8192, dtype=bf16)[:, :4096], True, 0),
        "message_too_big": (torch.empty(FUSED_MAX_M, FUSED_MAX_K, dtype=bf16), True, 0),
    }
    return {name: comm.fused_reason(y, y if res else None, group)
            for name, (y, res, group) in cases.items()}


def _refused_call(comm):
    """A call the one-kernel path does not serve: served-or-None gives None, the public op
    raises with the reason; neither reaches the kernel library (the scripted backend has none)."""
    y = torch.randn(FUSED_MAX_M + 1, 256).to(torch.bfloat16)
    w = torch.ones(256, dtype=torch.bfloat16)
    served = comm.serve_ar_add_rms_quant(y, y, w, 1e-6, group=128)
    try:
        comm.ar_add_rms_quant(y, y, w, 1e-6, group=128)
        raised = None
    except ValueError as exc:
        raised = str(exc)
    return {"served": served, "raised": raised}


def _misaligned_calls(comm, lib):
    """Views 2 bytes past a 16-byte boundary, each in one argument, then the same calls aligned:
    what each call raised (None: it ran) and which launches reached the library."""
    bf16 = torch.bfloat16
    m, k = 8, 4096

    def odd(*shape):  # contiguous, starting one bf16 element into a fresh (aligned) buffer
        n = torch.Size(shape).numel()
        return torch.zeros(n + 8, dtype=bf16)[1:n + 1].view(shape)

    y, res, w = torch.zeros(m, k, dtype=bf16), torch.zeros(m, k, dtype=bf16), torch.ones(k, dtype=bf16)
    calls = {
        "all_reduce_y": lambda: comm.all_reduce(odd(m, k)),
        "fused_y": lambda: comm.serve_ar_add_rms_quant(odd(m, k), res, w, 1e-6),
        "fused_residual": lambda: comm.serve_ar_add_rms_quant(y, odd(m, k), w, 1e-6),
        "fused_weight": lambda: comm.serve_ar_add_rms_quant(y, res, odd(k), 1e-6),
        # not served by the one-kernel path: None, for the caller's unfused path to take
        "unfused_y": lambda: comm.serve_ar_add_rms_quant(odd(FUSED_MAX_M + 1, k), odd(FUSED_MAX_M + 1, k),
                                                         w, 1e-6),
    }
    out = {}
    for name, call in calls.items():
        try:
            out[name] = "returned None" if call() is None else "ran"
        except ValueError as exc:
            out[name] = str(exc)
    out["launched_misaligned"] = list(lib.launched)
    comm.all_reduce(y)
    comm.serve_ar_add_rms_quant(y, res, w, 1e-6)
    out["launched_aligned"] = list(lib.launched)
    return out


def _worker(rank, ws, store, out_dir, names):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=ws)
    kops.stream_of = lambda device: 0  # this process's launches go to the scripted library
    results = {}
    for name in names:
        if name == "real":
            comm = PeerAllReduce(dist.group.WORLD, "cpu")
            results[name] = {"enabled": comm.enabled, "reason": comm.reason}
            continue
        backend = ScriptedBackend(rank, SCENARIOS[name].get(rank))
        comm = PeerAllReduce(dist.group.WORLD, "cpu", backend=backend)
        res = {"enabled": comm.enabled, "reason": comm.reason, "calls": backend.calls}
        if comm.enabled:
            res["decisions"] = _decisions(comm)
            res["refused_call"] = _refused_call(comm)
            res["misaligned"] = _misaligned_calls(comm, backend.lib)
            res["records"] = [r for r in registry.selections() if r["op"] == "ar_add_rms_quant"]
            comm.close()
            res["calls_after_close"] = list(backend.calls)
        results[name] = res
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


SETUP_DEADLINE_S = 120  # a hang is a failure, not a stuck CI job


def _spawn(tmp_path, ws, names):
    ctx = mp.spawn(_worker, args=(ws, str(tmp_path / "store"), str(tmp_path), names), nprocs=ws,
                   join=False)
    deadline = time.monotonic() + SETUP_DEADLINE_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail(f"setup did not finish within {SETUP_DEADLINE_S} s: a rank hangs")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(ws)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return _spawn(tmp_path_factory.mktemp("peer2"), 2, ["real", *SCENARIOS])


def test_no_gpu_disables_every_rank_with_the_reason(two_ranks):
    for r in two_ranks:
        assert not r["real"]["enabled"]
        assert r["real"]["reason"].startswith("rank 0: no CUDA/ROCm GPU")


def test_all_ok_enables_every_rank_and_close_releases(two_ranks):
    for rank, r in enumerate(two_ranks):
        res = r["all_ok"]
        assert res["enabled"] and res["reason"] is None
        own = 0x1000 * (rank + 1)
        peer = 0x9000 + (1 - rank)
        assert res["calls"][:3] == [("allocate", own), ("open", peer), ("create", 2)]
        assert res["calls_after_close"][3:] == [("destroy", 0x7777), ("close", peer), ("free", own)]


@pytest.mark.parametrize("name, reason", [
    ("alloc_fails_on_rank1", "rank 1: scripted allocate failure"),
    ("map_fails_on_rank1", "rank 1: cannot map rank 0's region (scripted open failure)"),
    ("handshake_times_out_on_rank0", "rank 0: handshake timed out"),
    ("open_crashes_on_rank0", "rank 0: RuntimeError: unexpected open crash"),
])
def test_one_rank_failing_disables_every_rank_and_releases(two_ranks, name, reason):
    for r in two_ranks:
        res = r[name]
        assert not res["enabled"]
        assert res["reason"].startswith(reason), res["reason"]
        calls = res["calls"]
        allocated = [base for step, base in calls if step == "allocate"]
        opened = [base for step, base in calls if step == "open"]
        assert sorted(b for s, b in calls if s == "free") == sorted(allocated)
        assert sorted(b for s, b in calls if s == "close") == sorted(opened)


def test_branch_is_decided_by_shapes_and_is_the_same_on_every_rank(two_ranks):
    d0, d1 = (r["all_ok"]["decisions"] for r in two_ranks)
    assert d0 == d1
    assert d0["decode"] is None and d0["largest_m"] is None
    assert "M=513" in d0["m_too_large"]
    assert f"K={FUSED_MAX_K + 128}" in d0["k_too_wide"]
    assert "no residual" in d0["no_residual"]
    assert "float32" in d0["fp32"]
    assert "not contiguous" in d0["strided"]
    assert f"{MESSAGE_BYTES} B staging" in d0["message_too_big"]


def test_decisions_are_recorded_for_the_report(two_ranks):
    records = two_ranks[0]["all_ok"]["records"]
    served = [r for r in records if r["kernel"] == "radiance_peer_one_shot"]
    refused = [r for r in records if r["kernel"] is None]
    assert any(r["query"]["M"] == 8 and r["query"]["world_size"] == 2 for r in served)
    assert any("M=513" in r["reason"] for r in refused)


def test_unsupported_world_size_disables_every_rank(tmp_path):
    ranks = _spawn(tmp_path, 3, ["all_ok"])
    for r in ranks:
        assert not r["all_ok"]["enabled"]
        assert r["all_ok"]["reason"].startswith("rank 0: world size 3")
        assert r["all_ok"]["calls"] == []


def test_a_refused_call_returns_none_or_raises_before_any_launch(two_ranks):
    for r in two_ranks:
        refused = r["all_ok"]["refused_call"]
        assert refused["served"] is None
        assert refused["raised"] is not None and "M=513 outside 1..512" in refused["raised"]


def test_misaligned_views_raise_before_any_launch(two_ranks):
    for r in two_ranks:
        got = r["all_ok"]["misaligned"]
        for name in ("all_reduce_y", "fused_y", "fused_residual", "fused_weight"):
            arg = name.split("_")[-1]
            assert got[name] == f"the peer kernels move 16-byte vectors: {arg} starts 2 B past a 16-byte boundary"
        assert got["unfused_y"] == "returned None"
        assert got["launched_misaligned"] == []
        assert got["launched_aligned"] == ["all_reduce", "ar_add_rms_quant"]


def test_teardown_failures_are_logged_with_the_library_message(caplog):
    class FailingTeardown:
        def error_string(self, code):
            return f"scripted error {code}"

        def peer_set_destroy(self, handle):
            return 1

        def peer_region_close(self, base):
            return 0

        def peer_region_free(self, base):
            return 3

    backend = object.__new__(CudaPeerBackend)  # the teardown steps only: no GPU needed
    backend.lib = FailingTeardown()
    with caplog.at_level(logging.WARNING, logger="vllm.radiance.kernels"):
        backend.destroy(0x7777)
        backend.close(0x9000)
        backend.free(0x1000)
    assert [r.getMessage() for r in caplog.records] == [
        "radiance peer all-reduce teardown: destroying the peer set failed: scripted error 1 (code 1)",
        "radiance peer all-reduce teardown: freeing this rank's region failed: scripted error 3 (code 3)",
    ]
