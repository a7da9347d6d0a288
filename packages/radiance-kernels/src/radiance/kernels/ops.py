"""The public epilogue ops: validate, pick the GPU kernel or the reference, run.

Same signatures and results as ``radiance.kernels.reference`` (the specification). Bad input
raises ``TypeError``/``ValueError`` here, before anything is launched. The kernel-or-reference
decision is asked of the registry once per shape class (op, dtypes, K, group, device) and kept
in a dict, so a call costs the checks, one dict lookup and the ctypes call.
"""

from __future__ import annotations

import math

import torch

from radiance.kernels import library, reference, registry

ACT_DTYPES = (torch.bfloat16, torch.float16)
WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
DTYPE_CODE = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
FP8_CODE = {torch.float8_e4m3fn: 0, torch.float8_e4m3fnuz: 1}
KERNEL_NAME = "radiance_jit"
# The single-GPU epilogues; the all-reduce-fused one is registered by peer_all_reduce.
EPILOGUE_OPS = ("add_rms_quant", "silu_mul_quant", "gdn_norm_quant")
# Widest row the kernels serve: a row lives in registers, at most 8 16-byte vectors per thread
# of a 384-thread row (24576 bf16/fp16 elements); beyond it the reference runs.
MAX_K = 24576

_decisions: dict[tuple, object] = {}


# --------------------------------------------------------------------------- validation


def _tensor(name: str, t, dtypes) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} dtype must be one of {allowed}, got {t.dtype}")


def _matrix(name: str, t: torch.Tensor, contiguous: bool = False) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [M, K], got shape {tuple(t.shape)}")
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have a contiguous last dim, got strides {t.stride()}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    if t.shape[0] > 1 and t.stride(0) < t.shape[1]:
        raise ValueError(f"{name} rows overlap: row stride {t.stride(0)} < width {t.shape[1]}")


def _width(name: str, k: int, group: int) -> None:
    if k < 8 or k % 8:
        raise ValueError(f"{name}={k} must be a positive multiple of 8")
    if group and k % group:
        raise ValueError(f"{name}={k} must be a multiple of the quant group {group}")


def _common(group, fp8_dtype, eps=None) -> None:
    if isinstance(group, bool) or not isinstance(group, int) or group not in reference.GROUP_SIZES:
        raise ValueError(f"group must be 0 (per token) or 128, got {group!r}")
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype must be torch.float8_e4m3fn or torch.float8_e4m3fnuz, got {fp8_dtype}")
    if eps is not None:
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise TypeError(f"eps must be a float, got {type(eps).__name__}")
        if not math.isfinite(eps) or eps < 0:
            raise ValueError(f"eps must be finite and >= 0, got {eps}")


def _same_device(**tensors) -> torch.device:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")
    return first


def _weight(weight, size: int, what: str) -> None:
    _tensor("weight", weight, WEIGHT_DTYPES)
    if weight.dim() != 1 or weight.numel() != size:
        raise ValueError(f"weight must be 1-D of size {size} ({what}), got shape {tuple(weight.shape)}")
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous")


# --------------------------------------------------------------------------- kernel choice


def _serves(query) -> str | None:
    """Whether the JIT-built library serves ``query``; the reason when it does not."""
    if query["device"] != "cuda":
        return f"tensors on {query['device']}: the kernels run on CUDA/ROCm GPUs only"
    if query["dtype"] not in ("bfloat16", "float16"):
        return f"activation dtype {query['dtype']}"
    if query["group"] not in reference.GROUP_SIZES:
        return f"group {query['group']}"
    k = query["K"]
    if k % 8 or k > MAX_K or (query["group"] and k % query["group"]):
        return f"K={k} (needs a multiple of 8 and of the group, at most {MAX_K})"
    head_dim = query.get("head_dim")
    if head_dim is not None and not (8 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0):
        return f"head_dim={head_dim} (the kernel takes powers of two from 8 to 256)"
    return library.why_not(query["device_index"])


def _vector_aligned(*tensors) -> bool:
    """The kernels move 16-byte vectors: every row must start 16-byte aligned. Shapes decide the
    kernel once per class; this is the per-call part (a view may start anywhere), and a call
    that fails it runs the reference instead of being refused by the kernel."""
    return all(t is None or (t.data_ptr() % 16 == 0 and (t.dim() < 2 or t.stride(0) % 8 == 0))
               for t in tensors)


for _op in EPILOGUE_OPS:
    registry.register(_op, KERNEL_NAME, impl=library.get, serves=_serves,
                      describe="HIP/CUDA kernel from the JIT-built radiance library")


def _kernel(op: str, device: torch.device, dtype: torch.dtype, k: int, group: int, fp8, extra=()):
    """The loaded library if it serves this shape class, else None (asked once per class)."""
    key = (op, device, dtype, k, group, fp8, *extra)
    try:
        return _decisions[key]
    except KeyError:
        pass
    index = device.index if device.index is not None else (
        torch.cuda.current_device() if device.type == "cuda" else -1)
    query = {"device": device.type, "device_index": index,
             "dtype": str(dtype).removeprefix("torch."), "K": k, "group": group,
             "fp8": str(fp8).removeprefix("torch.")}
    for name, value in extra:
        query[name] = value
    sel = registry.select(op, **query)
    lib = library.get(index) if sel else None
    _decisions[key] = lib
    return lib


def check_code(lib, code: int, op: str) -> None:
    if code != 0:
        raise RuntimeError(f"radiance {op} kernel failed: {lib.error_string(code)} (code {code})")


def stream_of(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


# --------------------------------------------------------------------------- ops


def check_add_rms_quant_args(y, residual, weight, eps, group, fp8_dtype) -> torch.device:
    """add_rms_quant's argument checks (also the fused all-reduce's); returns the device."""
    _tensor("y", y, ACT_DTYPES)
    _matrix("y", y)
    k = y.shape[1]
    if residual is not None:
        _tensor("residual", residual, ACT_DTYPES)
        if residual.dtype != y.dtype:
            raise TypeError(f"residual dtype {residual.dtype} differs from y dtype {y.dtype}")
        if residual.shape != y.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} differs from y shape {tuple(y.shape)}")
        _matrix("residual", residual, contiguous=True)
    _weight(weight, k, "K")
    _common(group, fp8_dtype, eps)
    _width("K", k, group)
    return _same_device(y=y, residual=residual, weight=weight)


def add_rms_quant(
    y: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    gemma: bool = False,
    group: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Residual add + RMSNorm (+ Gemma's ``1 + w``) + dynamic FP8 quant; see the reference.

    ``y`` may be row-strided; ``residual`` (``None`` for the first layer, then ``residual_out``
    is ``y`` itself) must be contiguous with ``y``'s shape and dtype.
    """
    device = check_add_rms_quant_args(y, residual, weight, eps, group, fp8_dtype)
    m, k = y.shape

    lib = _kernel("add_rms_quant", device, y.dtype, k, group, fp8_dtype)
    if lib is None or m == 0 or not _vector_aligned(y, residual, weight):
        return reference.add_rms_quant(y, residual, weight, eps, gemma=gemma, group=group,
                                       fp8_dtype=fp8_dtype)
    q = torch.empty((m, k), dtype=fp8_dtype, device=device)
    scale = torch.empty((m, k // group) if group else (m,), dtype=torch.float32, device=device)
    residual_out = y if residual is None else torch.empty((m, k), dtype=y.dtype, device=device)
    code = lib.add_rms_quant(
        y.data_ptr(), y.stride(0), None if residual is None else residual.data_ptr(),
        weight.data_ptr(), DTYPE_CODE[weight.dtype], q.data_ptr(), scale.data_ptr(),
        None if residual is None else residual_out.data_ptr(), m, k, float(eps), int(bool(gemma)),
        group, DTYPE_CODE[y.dtype], FP8_CODE[fp8_dtype], stream_of(device))
    check_code(lib, code, "add_rms_quant")
    return q, scale, residual_out


def silu_mul_quant(
    gu: torch.Tensor, *, group: int = 0, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(gate) * up`` + dynamic FP8 quant for ``gu = [M, 2N]`` (gate first); see the reference.

    ``gu`` may be row-strided.
    """
    _tensor("gu", gu, ACT_DTYPES)
    _matrix("gu", gu)
    m, width = gu.shape
    if width % 2:
        raise ValueError(f"gu width {width} must be even ([gate | up])")
    n = width // 2
    _common(group, fp8_dtype)
    _width("N", n, group)
    device = gu.device

    lib = _kernel("silu_mul_quant", device, gu.dtype, n, group, fp8_dtype)
    if lib is None or m == 0 or not _vector_aligned(gu):
        return reference.silu_mul_quant(gu, group=group, fp8_dtype=fp8_dtype)
    q = torch.empty((m, n), dtype=fp8_dtype, device=device)
    scale = torch.empty((m, n // group) if group else (m,), dtype=torch.float32, device=device)
    code = lib.silu_mul_quant(gu.data_ptr(), gu.stride(0), q.data_ptr(), scale.data_ptr(), m, n,
                              group, DTYPE_CODE[gu.dtype], FP8_CODE[fp8_dtype], stream_of(device))
    check_code(lib, code, "silu_mul_quant")
    return q, scale


def gdn_norm_quant(
    x: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    group: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head gated RMSNorm (head dim ``weight.numel()``) + dynamic FP8 quant over the row.

    ``x`` and ``z`` are ``[M, N]``, either may be row-strided; see the reference.
    """
    _tensor("x", x, ACT_DTYPES)
    _matrix("x", x)
    m, n = x.shape
    _tensor("z", z, ACT_DTYPES)
    if z.dtype != x.dtype:
        raise TypeError(f"z dtype {z.dtype} differs from x dtype {x.dtype}")
    if z.shape != x.shape:
        raise ValueError(f"z shape {tuple(z.shape)} differs from x shape {tuple(x.shape)}")
    _matrix("z", z)
    _tensor("weight", weight, WEIGHT_DTYPES)
    if weight.dim() != 1 or weight.numel() == 0:
        raise ValueError(f"weight must be 1-D of size head_dim, got shape {tuple(weight.shape)}")
    head_dim = weight.numel()
    if n % head_dim:
        raise ValueError(f"N={n} must be a multiple of head_dim={head_dim} (the weight size)")
    _weight(weight, head_dim, "head_dim")
    _common(group, fp8_dtype, eps)
    _width("N", n, group)
    device = _same_device(x=x, z=z, weight=weight)

    lib = _kernel("gdn_norm_quant", device, x.dtype, n, group, fp8_dtype, (("head_dim", head_dim),))
    if lib is None or m == 0 or not _vector_aligned(x, z, weight):
        return reference.gdn_norm_quant(x, z, weight, eps, group=group, fp8_dtype=fp8_dtype)
    q = torch.empty((m, n), dtype=fp8_dtype, device=device)
    scale = torch.empty((m, n // group) if group else (m,), dtype=torch.float32, device=device)
    code = lib.gdn_norm_quant(
        x.data_ptr(), x.stride(0), z.data_ptr(), z.stride(0), weight.data_ptr(),
        DTYPE_CODE[weight.dtype], q.data_ptr(), scale.data_ptr(), m, n, head_dim, float(eps),
        group, DTYPE_CODE[x.dtype], FP8_CODE[fp8_dtype], stream_of(device))
    check_code(lib, code, "gdn_norm_quant")
    return q, scale


def available(device_index: int = 0) -> bool:
    """Whether the GPU kernels serve this process (builds them on first call on a GPU)."""
    return library.why_not(device_index) is None


def unavailable_reason(device_index: int = 0) -> str | None:
    """Why the reference runs instead of the kernels (None when the kernels serve)."""
    return library.why_not(device_index)


def _reset_decisions_for_tests() -> None:
    _decisions.clear()
