"""The one-shot all-reduce over peer-mapped buffers, plain and fused with ``add_rms_quant``.

Each rank of a tensor-parallel group allocates one device region (staging for its partial sums
and the flags of the exchange), exports it through an IPC handle, and maps every peer's region;
the handles travel through the group's CPU (gloo) process group. The kernels and their protocol
are in ``csrc/peer_exchange.cuh``; the reference (rank-ordered fp32 sum, rounded once, then the
epilogue) is ``reference.all_reduce`` / ``reference.ar_add_rms_quant``.

Setup never hangs and never splits the group: every rank runs every collective step whatever
happened to it locally, so a failure anywhere (no GPU, no kernel library, an unsupported world
size, a peer region that cannot be mapped, a handshake whose peer writes never arrive) becomes
the same decision on every rank: the peer set is disabled everywhere and ``reason`` says which
rank failed and why. Once enabled, which calls take the one-kernel path is decided from shapes
and dtypes alone (``fused_reason``), so all ranks take the same branch and their call counters
stay in step.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

import torch

from radiance.kernels import library, registry
from radiance.kernels import ops as kops

logger = logging.getLogger("vllm.radiance.kernels")

OP = "ar_add_rms_quant"
KERNEL_NAME = "radiance_peer_one_shot"
WORLD_SIZES = (2, 4, 8)
# One staging half per rank: the largest partial a call may exchange. 8 MiB holds a bf16
# [512, 8192] decode batch; each rank allocates two halves (the call parity) plus 33 KiB of flags.
MESSAGE_BYTES = 8 << 20
# The fused kernel's shape limits: decode batch sizes (one-shot exchange pays off while the
# message is small; the multi-GPU crossover measurement sets the final bound), and rows of at most
# 4 vectors a thread (csrc/ar_add_rms_quant.cu).
FUSED_MAX_M = 512
FUSED_MAX_K = 16384
HANDSHAKE_TIMEOUT_MS = 10_000

registry.register(
    OP, KERNEL_NAME, impl=None,
    serves=lambda query: "decided per call by PeerAllReduce.fused_reason (recorded there)",
    describe="all-reduce over peer-mapped buffers fused with add_rms_quant")


@dataclass
class _Step:
    """One rank's outcome of one setup step, as exchanged with the group."""

    reason: str | None = None
    payload: bytes = b""


def _gather(group, step: _Step) -> list[_Step]:
    import torch.distributed as dist

    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, step, group=group)
    return out


def _first_failure(steps: list[_Step]) -> str | None:
    for rank, step in enumerate(steps):
        if step.reason is not None:
            return f"rank {rank}: {step.reason}"
    return None


def _check_aligned(**tensors: torch.Tensor) -> None:
    # Alignment is not one of fused_reason's reasons: that decision must come out the same on
    # every rank and is kept per shape class, while an address belongs to one call on one rank
    # (a peer's tensor of the same shape may start aligned). So a misaligned tensor raises here,
    # before this rank's launch, as the library would refuse it anyway; the peers' kernels of the
    # call then wait for this rank, so every rank must be given aligned tensors (fresh ones are).
    bad = [f"{name} starts {t.data_ptr() % 16} B past a 16-byte boundary"
           for name, t in tensors.items() if not kops._vector_aligned(t)]
    if bad:
        raise ValueError(f"the peer kernels move 16-byte vectors: {'; '.join(bad)}")


class PeerSetupError(RuntimeError):
    """One setup step failed on this rank; the message says which and why."""


class CudaPeerBackend:
    """The setup steps on a CUDA/ROCm GPU, through the kernel library's C ABI. Each method
    raises ``PeerSetupError`` with the runtime's message on failure."""

    def __init__(self, device: torch.device, lib=None):
        if device.type != "cuda" or not torch.cuda.is_available():
            raise PeerSetupError(f"no CUDA/ROCm GPU (device {device})")
        self.device = device
        self.lib = lib if lib is not None else library.get(device.index)
        if self.lib is None:
            raise PeerSetupError(f"kernel library unavailable: {library.why_not(device.index)}")

    def _call(self, what: str, fn, *args) -> None:
        with torch.cuda.device(self.device):
            code = fn(*args)
        if code != 0:
            raise PeerSetupError(f"{what}: {self.lib.error_string(code)}")

    def allocate(self, message_bytes: int) -> tuple[int, bytes]:
        handle = ctypes.create_string_buffer(self.lib.ipc_handle_bytes)
        base = ctypes.c_void_p()
        self._call("cannot allocate or export the peer region", self.lib.peer_region_alloc,
                   message_bytes, ctypes.byref(base), handle)
        return base.value, handle.raw

    def open(self, handle: bytes) -> int:
        base = ctypes.c_void_p()
        self._call("peer access", self.lib.peer_region_open, handle, ctypes.byref(base))
        return base.value

    def create(self, rank: int, bases: list[int], message_bytes: int) -> int:
        arr = (ctypes.c_void_p * len(bases))(*bases)
        handle = ctypes.c_void_p()
        self._call("peer set rejected", self.lib.peer_set_create, rank, len(bases), arr,
                   message_bytes, ctypes.byref(handle))
        return handle.value

    def handshake(self, peer_set: int, timeout_ms: int) -> bool:
        ok = ctypes.c_int(0)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._call("handshake failed", self.lib.peer_set_handshake, peer_set, timeout_ms,
                   ctypes.byref(ok), stream)
        return bool(ok.value)

    def _release_call(self, what: str, fn, arg: int) -> None:
        # Teardown goes on past a failure: the rest must still be released, and close() is a
        # collective the other ranks are finishing too. A failure is logged, not raised.
        code = fn(arg)
        if code != 0:
            logger.warning("radiance peer all-reduce teardown: %s failed: %s (code %d)", what,
                           self.lib.error_string(code), code)

    def destroy(self, peer_set: int) -> None:
        self._release_call("destroying the peer set", self.lib.peer_set_destroy, peer_set)

    def close(self, base: int) -> None:
        self._release_call("unmapping a peer region", self.lib.peer_region_close, base)

    def free(self, base: int) -> None:
        self._release_call("freeing this rank's region", self.lib.peer_region_free, base)


class PeerAllReduce:
    """The peer set of one process group on this process's GPU.

    ``group`` is a CPU (gloo) process group of the ranks that reduce together (vLLM: the
    tensor-parallel group's ``cpu_group``); ``device`` this rank's GPU. ``backend`` performs the
    setup steps (``CudaPeerBackend`` on ``device`` when omitted). Check ``enabled`` / ``reason``
    after construction.
    """

    def __init__(self, group, device: torch.device | str, *, message_bytes: int = MESSAGE_BYTES,
                 handshake_timeout_ms: int = HANDSHAKE_TIMEOUT_MS, backend=None):
        import torch.distributed as dist

        if message_bytes <= 0 or message_bytes % 256:
            raise ValueError(f"message_bytes must be a positive multiple of 256, got {message_bytes}")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = device
        self.message_bytes = message_bytes
        self.reason: str | None = None
        self._backend = backend
        self._own_base: int | None = None
        self._mapped: dict[int, int] = {}
        self._peer_set: int | None = None
        self._decisions: dict[tuple, str | None] = {}
        self._setup(handshake_timeout_ms)

    @property
    def enabled(self) -> bool:
        return self.reason is None

    # ------------------------------------------------------------------ setup

    def _setup(self, timeout_ms: int) -> None:
        # Every rank runs all three exchanges, whatever happened to it locally: a rank that gives
        # up early would leave the others waiting in a collective.
        step = self._step(self._allocate)
        steps = _gather(self.group, step)
        failure = _first_failure(steps)
        handles = [s.payload for s in steps]
        step = _Step() if failure else self._step(lambda: self._map_peers(handles))
        failure = failure or _first_failure(_gather(self.group, step))
        step = _Step() if failure else self._step(lambda: self._handshake(timeout_ms))
        failure = failure or _first_failure(_gather(self.group, step))
        if failure is not None:
            self._release()
            self.reason = failure
            logger.warning("radiance peer all-reduce disabled on every rank of the group: %s",
                           failure)
        else:
            logger.info("radiance peer all-reduce ready: rank %d of %d, %d MiB staging per call",
                        self.rank, self.world_size, self.message_bytes >> 20)

    @staticmethod
    def _step(fn) -> _Step:
        # Any local failure, expected or not, becomes this rank's reason in the next exchange
        # (and so the group's decision, logged) instead of an exception that would leave the
        # other ranks waiting in the collective.
        try:
            return _Step(None, fn() or b"")
        except PeerSetupError as exc:
            return _Step(str(exc))
        except Exception as exc:  # noqa: BLE001 - see above; the reason names the exception
            return _Step(f"{type(exc).__name__}: {exc}")

    def _allocate(self) -> bytes:
        if self.world_size not in WORLD_SIZES:
            raise PeerSetupError(
                f"world size {self.world_size} (the one-shot kernel serves {WORLD_SIZES})")
        if self._backend is None:
            self._backend = CudaPeerBackend(self.device)
        self._own_base, handle = self._backend.allocate(self.message_bytes)
        return handle

    def _map_peers(self, handles: list[bytes]) -> None:
        for peer, handle in enumerate(handles):
            if peer != self.rank:
                try:
                    self._mapped[peer] = self._backend.open(handle)
                except PeerSetupError as exc:
                    raise PeerSetupError(f"cannot map rank {peer}'s region ({exc})") from None

    def _handshake(self, timeout_ms: int) -> None:
        bases = [self._own_base if r == self.rank else self._mapped[r]
                 for r in range(self.world_size)]
        self._peer_set = self._backend.create(self.rank, bases, self.message_bytes)
        if not self._backend.handshake(self._peer_set, timeout_ms):
            raise PeerSetupError(
                f"handshake timed out after {timeout_ms} ms: peer writes never arrived")

    def _release(self) -> None:
        backend = self._backend
        if backend is None:
            return
        if self._peer_set is not None:
            backend.destroy(self._peer_set)
            self._peer_set = None
        for base in self._mapped.values():
            backend.close(base)
        self._mapped.clear()
        if self._own_base is not None:
            backend.free(self._own_base)
            self._own_base = None

    def close(self) -> None:
        """Unmap and free, on every rank together (a collective: peers may still be reading)."""
        import torch.distributed as dist

        if self.enabled and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dist.barrier(group=self.group)
        self._release()
        self.reason = self.reason or "closed"

    # ------------------------------------------------------------------ decisions

    def fused_reason(self, y: torch.Tensor, residual: torch.Tensor | None, group: int) -> str | None:
        """None when ``ar_add_rms_quant`` takes the one-kernel path for this call, else why not.

        Reads only shapes, dtypes, layout and the setup outcome, which are the same on every rank
        of a tensor-parallel step, so every rank takes the same branch. Recorded in the registry
        once per shape class."""
        if not self.enabled:
            return f"peer all-reduce disabled: {self.reason}"
        m, k = y.shape
        key = (m, k, y.dtype, group, residual is None, y.is_contiguous())
        try:
            return self._decisions[key]
        except KeyError:
            pass
        why = None
        if residual is None:
            why = "no residual (first layer: nothing to reduce)"
        elif y.dtype not in kops.ACT_DTYPES:
            why = f"activation dtype {y.dtype}"
        elif not y.is_contiguous():
            why = "y not contiguous"
        elif m == 0 or m > FUSED_MAX_M:
            why = f"M={m} outside 1..{FUSED_MAX_M}"
        elif k % 8 or k > FUSED_MAX_K:
            why = f"K={k} (needs a multiple of 8, at most {FUSED_MAX_K})"
        elif m * k * y.element_size() > self.message_bytes:
            why = f"message {m * k * y.element_size()} B exceeds the {self.message_bytes} B staging"
        self._decisions[key] = why
        query = {"world_size": self.world_size, "M": m, "K": k,
                 "dtype": str(y.dtype).removeprefix("torch."), "group": group}
        registry.record(OP, query, KERNEL_NAME if why is None else None, why or "")
        return why

    # ------------------------------------------------------------------ ops

    def all_reduce(self, y: torch.Tensor) -> torch.Tensor:
        """The rank-ordered sum of every rank's ``y`` (same shape on every rank), on every rank."""
        if not self.enabled:
            raise RuntimeError(f"peer all-reduce disabled: {self.reason}")
        kops._tensor("y", y, kops.ACT_DTYPES)
        if not y.is_contiguous():
            raise ValueError("y must be contiguous")
        if y.device != self.device:
            raise ValueError(f"y is on {y.device}, the peer set on {self.device}")
        n = y.numel()
        if n % 8:
            raise ValueError(f"y has {n} elements, needs a multiple of 8")
        if n * y.element_size() > self.message_bytes:
            raise ValueError(f"y is {n * y.element_size()} B, the staging holds {self.message_bytes} B")
        _check_aligned(y=y.view(-1))  # reduced as one flat vector: only where it starts matters
        out = torch.empty_like(y)
        if n == 0:
            return out
        code = self._backend.lib.all_reduce(self._peer_set, y.data_ptr(), out.data_ptr(), n,
                                    kops.DTYPE_CODE[y.dtype], kops.stream_of(y.device))
        kops.check_code(self._backend.lib, code, "all_reduce")
        return out

    def serve_ar_add_rms_quant(
        self,
        y: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        *,
        gemma: bool = False,
        group: int = 0,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``add_rms_quant(all_reduce(y), residual, ...)`` in one kernel where ``fused_reason``
        says the one-kernel path serves this call; None otherwise (the caller then reduces and
        runs the epilogue itself). The arguments are checked first either way; the 16-byte
        alignment of ``y``, ``residual`` and ``weight`` the kernel needs, where it runs."""
        device = kops.check_add_rms_quant_args(y, residual, weight, eps, group, fp8_dtype)
        if device != self.device:
            raise ValueError(f"y is on {device}, the peer set on {self.device}")
        if self.fused_reason(y, residual, group) is not None:
            return None
        # Checked only where the kernel runs: where it does not, the caller's unfused path takes
        # misaligned views, and a rank raising there would leave its peers waiting in that path.
        _check_aligned(y=y, residual=residual, weight=weight)
        m, k = y.shape
        q = torch.empty((m, k), dtype=fp8_dtype, device=device)
        scale = torch.empty((m, k // group) if group else (m,), dtype=torch.float32, device=device)
        residual_out = torch.empty((m, k), dtype=y.dtype, device=device)
        code = self._backend.lib.ar_add_rms_quant(
            self._peer_set, y.data_ptr(), residual.data_ptr(), weight.data_ptr(),
            kops.DTYPE_CODE[weight.dtype], q.data_ptr(), scale.data_ptr(), residual_out.data_ptr(),
            m, k, float(eps), int(bool(gemma)), group, kops.DTYPE_CODE[y.dtype],
            kops.FP8_CODE[fp8_dtype], kops.stream_of(device))
        kops.check_code(self._backend.lib, code, OP)
        return q, scale, residual_out

    def ar_add_rms_quant(self, y, residual, weight, eps, *, gemma=False, group=0,
                         fp8_dtype=torch.float8_e4m3fn):
        """``serve_ar_add_rms_quant`` that raises ``ValueError`` (with ``fused_reason``) where the
        one-kernel path does not serve the call."""
        out = self.serve_ar_add_rms_quant(y, residual, weight, eps, gemma=gemma, group=group,
                                          fp8_dtype=fp8_dtype)
        if out is None:
            why = self.fused_reason(y, residual, group)
            raise ValueError(f"ar_add_rms_quant one-kernel path does not serve this call: {why}")
        return out
