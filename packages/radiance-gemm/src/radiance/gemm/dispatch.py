"""Which provider serves a layer at which M, decided once per layer at load time.

``plan(...)`` turns (platform, arch, N, K, block, dtype) into a *route*: a flat tuple of ints,
``ROUTE_WIDTH`` per entry, ``(m_max, provider index, *launch params)``, entries in increasing
``m_max``, the last one open-ended. It consults, in order: RADIANCE_GEMM_PROVIDER (force one),
RADIANCE_GEMM_EXCLUDE, RADIANCE_PRESHUFFLE, the measured per-arch table in ``tables/<arch>.json``
(nearest measured shape; RADIANCE_GEMM_WGMMA=0 swaps its points on a warpgroup-MMA kernel,
cuda_decode's wgmma configs and cuda_tma, for cuda_decode's mma.sync kernel), and a built-in
default. Every decision is written to the radiance
registry then, so the selection report lists which provider serves which (N, K, M range).

``run_route`` is the per-call part: plain comparisons of M against the route's bounds, no
lookups, no state. On a GPU it runs inside the ``radiance_gemm::block_fp8_mm`` custom op, which is
opaque to torch.compile, so the M branch is taken at run time for every batch size rather than
traced once for the first one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from functools import cache
from importlib import resources

import torch

from radiance.gemm.providers import (
    M_ANY,
    PARAMS,
    PROVIDER_INDEX,
    PROVIDERS,
    format_params,
    parse_config,
)

logger = logging.getLogger("vllm.radiance.gemm")

ROUTE_WIDTH = 2 + PARAMS
OP = "block_fp8_linear"


def _env_list(name: str) -> list[str]:
    return [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]


def preshuffle_enabled() -> bool:
    """RADIANCE_PRESHUFFLE (default 0): route 128x128-block layers on ROCm to AITER's preshuffle
    GEMM, which shuffles their weights at load. Off until it is measured on the target card."""
    return os.environ.get("RADIANCE_PRESHUFFLE", "0") == "1"


def wgmma_enabled() -> bool:
    """RADIANCE_GEMM_WGMMA (default 1): 0 serves the table's points routed to a warpgroup-MMA
    kernel (cuda_decode's wgmma configs, cuda_tma) with cuda_decode's mma.sync kernel instead
    (its default config). Warpgroup-MMA sums carry Hopper's fp8 tensor-core rounding (14
    significant bits a 32-product step): below a bf16 output's rounding, not below an fp16
    output's."""
    return os.environ.get("RADIANCE_GEMM_WGMMA", "1") != "0"


def _without_wgmma(name: str, cfg: str) -> tuple[str, str]:
    """``(name, cfg)`` unless it selects a warpgroup-MMA kernel; then cuda_decode's default."""
    if name == "cuda_tma" or (name == "cuda_decode" and any(
            re.fullmatch(r"wg[1-9]\d*", f) for f in cfg.split("-"))):
        return "cuda_decode", PROVIDERS[PROVIDER_INDEX["cuda_decode"]].default_config
    return name, cfg


_TABLE_ERRORS: dict[str, str] = {}  # arch -> why its table exists but could not be read


@cache
def load_table(arch: str) -> dict | None:
    """The committed dispatch table for ``arch`` (tables/<arch>.json), or None: when there is none,
    and when it cannot be read, which is logged (once, the result is cached) and kept in
    ``_TABLE_ERRORS`` for the selection report; the built-in default serves either way."""
    path = resources.files("radiance.gemm").joinpath("tables", f"{arch}.json")
    try:
        text = path.read_text()
    except FileNotFoundError:
        _TABLE_ERRORS.pop(arch, None)
        return None
    except OSError as exc:
        _TABLE_ERRORS[arch] = f"{path}: {type(exc).__name__}: {exc}"
        logger.warning("radiance-gemm: dispatch table %s unreadable (%s: %s); serving the built-in "
                       "default routes", path, type(exc).__name__, exc)
        return None
    _TABLE_ERRORS.pop(arch, None)
    table = json.loads(text)
    if table.get("arch") != arch or "shapes" not in table:
        raise ValueError(f"dispatch table for {arch} is malformed (needs 'arch' and 'shapes')")
    return table


def _nearest_shape(shapes: dict, n: int, k: int) -> str:
    def distance(key: str) -> float:
        tn, tk = (int(v) for v in key.split("x"))
        return abs(math.log(tn * tk / (n * k))) + 0.5 * abs(math.log((tn / tk) / (n / k)))

    return min(shapes, key=distance)


def _default_plan(platform: str, arch: str, usable: set[str]) -> list[tuple[int, str, str]]:
    """Before measurement: split-K for decode sizes, PyTorch's cuBLASLt GEMM above on sm90,
    the Triton GEMM elsewhere."""
    if platform == "cpu":
        return [(M_ANY, "cpu_reference", "")]
    plan = []
    if "triton_splitk" in usable:
        plan.append((16, "triton_splitk", ""))
    big = "torch_blockwise" if "torch_blockwise" in usable else "triton_generic"
    plan.append((M_ANY, big, ""))
    return plan


def _above_measured(rows: list[tuple[int, str, str]],
                    default: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """Extend measured rows to every M: the last row's provider takes all larger M when it can
    serve any M; an M-limited one (split-K: 16 rows) keeps its bound, and the default plan's
    large-M provider serves above it."""
    last_m, name, cfg = rows[-1]
    if PROVIDERS[PROVIDER_INDEX[name]].m_max >= M_ANY:
        return rows[:-1] + [(M_ANY, name, cfg)]
    bound = min(last_m, PROVIDERS[PROVIDER_INDEX[name]].m_max)
    return rows[:-1] + [(bound, name, cfg), default[-1]]


def _usable(platform, arch, n, k, block, dtype, reasons: dict[str, str]) -> set[str]:
    excluded = set(_env_list("RADIANCE_GEMM_EXCLUDE"))
    unknown = sorted(excluded - set(PROVIDER_INDEX))
    if unknown:
        raise ValueError(f"RADIANCE_GEMM_EXCLUDE names unknown providers {unknown}; "
                         f"known: {sorted(PROVIDER_INDEX)}")
    usable = set()
    for p in PROVIDERS:
        why = p.serves(platform, arch, n, k, block, dtype)
        if why is None and p.name in excluded:
            why = "excluded by RADIANCE_GEMM_EXCLUDE"
        if why is None and p.wants_shuffled and not preshuffle_enabled():
            why = "wants a shuffled weight and RADIANCE_PRESHUFFLE is not 1"
        if why is None:
            usable.add(p.name)
        else:
            reasons[p.name] = why
    return usable


def plan(platform: str, arch: str, n: int, k: int, block: tuple[int, int] = (128, 128),
         dtype: torch.dtype = torch.float8_e4m3fn, sms: int = 1) -> tuple[int, ...]:
    """The route for one layer; see the module doc. Records every decision in the registry."""
    from radiance.kernels import registry

    reasons: dict[str, str] = {}
    usable = _usable(platform, arch, n, k, block, dtype, reasons)
    base = {"platform": platform, "arch": arch, "N": n, "K": k}
    entries: list[tuple[int, str, str]] | None = None
    source = "default"

    forced = os.environ.get("RADIANCE_GEMM_PROVIDER", "").strip()
    forced_below = 0  # a forced provider with an M limit serves M up to it; the route goes on above
    if forced:
        if forced not in PROVIDER_INDEX:
            raise ValueError(f"RADIANCE_GEMM_PROVIDER={forced!r} is not one of {sorted(PROVIDER_INDEX)}")
        if forced in usable:
            m_max = PROVIDERS[PROVIDER_INDEX[forced]].m_max
            if m_max >= M_ANY:
                entries, source = [(M_ANY, forced, "")], "RADIANCE_GEMM_PROVIDER"
            else:
                forced_below = m_max
                usable.discard("aiter_preshuffle")  # larger M must read the same plain weight
        else:
            registry.record(OP, dict(base, M="all"), None,
                            f"RADIANCE_GEMM_PROVIDER={forced} cannot serve: {reasons.get(forced)}")

    if entries is None and "aiter_preshuffle" in usable:
        # A shuffled weight can only be read by the shuffled-layout kernel, so such a layer
        # routes every M to it.
        entries, source = [(M_ANY, "aiter_preshuffle", "")], "RADIANCE_PRESHUFFLE"
    if entries is None:
        usable.discard("aiter_preshuffle")

    if entries is None:
        table = load_table(arch) if platform != "cpu" else None
        if table is not None:
            key = _nearest_shape(table["shapes"], n, k)
            wgmma = wgmma_enabled()
            rows = [(int(m), *((name, cfg) if wgmma else _without_wgmma(name, cfg)))
                    for m, name, cfg in table["shapes"][key]]
            # A row whose provider cannot run here is dropped: the next row up serves its M too.
            kept = [row for row in rows if row[1] in usable]
            missing = sorted({name for _, name, _ in rows if name not in usable})
            if kept:
                entries = _above_measured(kept, _default_plan(platform, arch, usable))
                source = f"table {arch} (measured {key})"
                if not wgmma:
                    source += ", wgmma kernel off (RADIANCE_GEMM_WGMMA=0)"
                if missing:
                    source += f" without unusable {', '.join(missing)}"
            else:
                source = f"default (table {arch} wants unusable {', '.join(missing)})"
        elif platform != "cpu" and arch in _TABLE_ERRORS:
            source = f"default (table {arch} unreadable: {_TABLE_ERRORS[arch]})"
    if entries is None:
        entries = _default_plan(platform, arch, usable)
    if not all(name in usable for _, name, _ in entries):
        bad = [name for _, name, _ in entries if name not in usable]
        raise RuntimeError(f"no usable block-FP8 provider for {base}: "
                           + "; ".join(f"{b}: {reasons.get(b)}" for b in bad))
    if forced_below:
        entries = [(forced_below, forced, "")] + [e for e in entries if e[0] > forced_below]
        source = f"RADIANCE_GEMM_PROVIDER up to M={forced_below}; above: {source}"

    route: list[int] = []
    lo = 1
    for m_max, name, cfg in entries:
        params = parse_config(name, cfg or PROVIDERS[PROVIDER_INDEX[name]].default_config,
                              n, k, sms, block)
        if route and route[-ROUTE_WIDTH + 1:] == [PROVIDER_INDEX[name], *params]:
            route[-ROUTE_WIDTH] = m_max  # same provider and config: widen the previous entry
        else:
            route.extend([m_max, PROVIDER_INDEX[name], *params])
    for i in range(0, len(route), ROUTE_WIDTH):
        name = PROVIDERS[route[i + 1]].name
        label = f"{name}[{format_params(name, tuple(route[i + 2:i + ROUTE_WIDTH]))}]".replace("[]", "")
        hi = route[i]
        registry.record(OP, dict(base, M=f"{lo}-{'inf' if hi >= M_ANY else hi}"), label, source)
        lo = hi + 1
    return tuple(route)


def wants_shuffled(route: tuple[int, ...]) -> bool:
    return any(PROVIDERS[route[i + 1]].wants_shuffled for i in range(0, len(route), ROUTE_WIDTH))


def describe(route: tuple[int, ...]) -> str:
    parts, lo = [], 1
    for i in range(0, len(route), ROUTE_WIDTH):
        name = PROVIDERS[route[i + 1]].name
        hi = route[i]
        cfg = format_params(name, tuple(route[i + 2:i + ROUTE_WIDTH]))
        parts.append(f"M {lo}-{'inf' if hi >= M_ANY else hi}: {name}" + (f"[{cfg}]" if cfg else ""))
        lo = hi + 1
    return ", ".join(parts)


def run_route(route, a, b, sa, sb, out_dtype, counters):
    m = a.shape[0]
    if m == 0:  # an empty batch: nothing to launch (the decode kernel refuses M = 0)
        return a.new_empty((0, b.shape[0]), dtype=out_dtype)
    for i in range(0, len(route), ROUTE_WIDTH):
        if m <= route[i]:
            return PROVIDERS[route[i + 1]].run(a, b, sa, sb, out_dtype,
                                               tuple(route[i + 2:i + ROUTE_WIDTH]), counters)
    raise AssertionError("route has no open-ended last entry")


@torch.library.custom_op("radiance_gemm::block_fp8_mm", mutates_args=())
def block_fp8_mm_op(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                    counters: torch.Tensor, route: list[int], out_dtype: torch.dtype) -> torch.Tensor:
    # ``counters`` is the split-K fixup scratch: zero on entry and on exit of every launch, so
    # the op is functionally pure even though kernels touch it.
    return run_route(route, a, b, sa, sb, out_dtype, counters)


@block_fp8_mm_op.register_fake
def _(a, b, sa, sb, counters, route, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)
