"""Adapters that apply the policy to AITER's unified attention (ROCm).

API generations handled, chosen by what the loaded module exposes:
* selectors -- ``select_2d_config`` / ``select_3d_config`` return dicts that the wrapper splats
  into the launches; patched on every loaded alias of the module.
* the per-op lookup of AITER's newer wrapper, ``get_unified_attention_config(op, params,
  backend, arch)`` with ``op`` one of ``kv_split`` (TILE_SIZE, NUM_SEGMENTS), ``attn_3d``
  (BLOCK_M, warps, stages, waves), ``reduce`` and ``attn_2d``, and ``params`` the wrapper's
  ``_UAParams`` (the whole batch shape); it returns the config, or ``(config, is_tuned)`` in the
  versions between. Each op's result gets its part of the overlays; the geometry is read from
  ``params``. BLOCK_M is part of ``attn_3d``'s config there, and the wrapper derives BLOCK_Q and
  the grid from it, so no launch shim is needed.
* a config lookup taking the sizes as keywords (``get_config``/``_get_config``), the form
  AITER's other Triton ops use with per-arch JSON files; the geometry comes from the wrapper's
  frame.

Every overlay is keyed by arch through the policy's tables: on an arch without an ``aiter``
section nothing is installed.
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading

from radiance.attn import policy, tables
from radiance.attn.warn_once import warn_once

logger = logging.getLogger("vllm.radiance.attn")

MODULE_NAMES = ("aiter.ops.triton.unified_attention", "aiter.ops.triton.attention.unified_attention")
LOOKUP_NAMES = ("get_unified_attention_config", "get_config", "_get_config")


def _arch() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or torch.version.hip is None:
        return None
    return str(torch.cuda.get_device_properties(0).gcnArchName).split(":")[0]


def _dtype(d) -> str | None:
    try:
        from radiance.attn.triton_launch import dtype_name

        return dtype_name(d)
    except (TypeError, ImportError):
        return None


def wrapper_geometry(arch: str, head_size: int, max_seqlen_k: int, q_dtype, kv_dtype, block_size: int):
    """Geometry from AITER's ``unified_attention`` frame, or None if it is not as expected.

    The selectors get what sizes a tile, not the batch shape; the wrapper calling them has it.
    Reading it there keeps the split count and BLOCK_M consistent with the launch that follows
    in the same call, with no state across calls. Anything unexpected returns None and the
    caller keeps AITER's config.
    """
    frame = sys._getframe(1)
    try:
        for _ in range(6):
            frame = frame.f_back
            if frame is None:
                return None
            if frame.f_code.co_name == "unified_attention" and "num_seqs" in frame.f_locals:
                loc = frame.f_locals
                q = loc["q"]
                qd, kd = _dtype(q_dtype), _dtype(kv_dtype)
                if qd is None or kd is None:
                    return None
                return policy.Geometry(
                    arch=arch, head_size=int(head_size), num_query_heads=int(q.shape[1]),
                    num_kv_heads=int(loc["num_kv_heads"]), num_tokens=int(q.shape[0]),
                    num_seqs=int(loc["num_seqs"]), max_seqlen_q=int(loc["max_seqlen_q"]),
                    max_seqlen_k=int(max_seqlen_k), q_dtype=qd, kv_dtype=kd, block_size=int(block_size))
        return None
    except (KeyError, AttributeError, TypeError, ValueError, IndexError):
        return None
    finally:
        del frame


_warn_lock = threading.Lock()


class _State(threading.local):
    block_m: int | None = None
    logged: bool = False
    decision: tuple | None = None  # ((geometry, programs), policy decision) of the last 3D batch

    def __init__(self, warned: set[str]) -> None:
        # threading.local runs __init__ again in every thread with these same arguments: the
        # threads of one patched module share this set, so a reason is logged once, not per thread.
        self.warned = warned

    def warn_once(self, what: str) -> None:
        """A patched lookup that cannot apply the policy says why, once per distinct reason, and
        keeps AITER's config."""
        warn_once(self.warned, _warn_lock, f"{what}; AITER's own config kept")


def patch_selector_module(mod, arch: str, table: dict) -> bool:
    """Patch one module object of the selector API. Returns False when already patched.

    Why: AITER sizes the split for the tile its selector would have used, derives BLOCK_M from
         the GQA ratio only, and its gfx1201 tiles/warps overflow or under-fill RDNA4.
    What: ``select_3d_config``/``select_2d_config`` return the policy's overlays of AITER's own
         result; ``kernel_unified_attention_3d`` becomes a launch shim applying the BLOCK_M
         the 3D selector chose in the same call (BLOCK_Q and grid follow). The wrapper's q-block
         count is an upper bound valid for any BLOCK_Q, so widening only shrinks the grid;
         ``reduce_segments`` reads BLOCK_Q only in its q-block mode, which it does not use.
    Remove when: AITER sizes splits from the launched tile and widens BLOCK_M for verify batches.
    """
    if getattr(mod, "_radiance_attn_wrapped", False):
        return False
    o3, o2, k3 = mod.select_3d_config, mod.select_2d_config, mod.kernel_unified_attention_3d
    sig3, sig2 = inspect.signature(o3), inspect.signature(o2)
    state = _State(set())

    def select_3d_config(*a, **k):
        attn, red = o3(*a, **k)
        state.block_m = None
        try:
            b = sig3.bind(*a, **k).arguments
            if _dtype(b["q_dtype"]) is None or _dtype(b["kv_cache_dtype"]) is None:
                return attn, red  # a dtype the policy has no rule for: AITER's config by design
            geo = wrapper_geometry(arch, b["head_size"], b["max_seqlen_k"], b["q_dtype"],
                                   b["kv_cache_dtype"], b["block_size"])
            if geo is None:
                state.warn_once("select_3d_config was not called from an AITER unified_attention frame "
                                "radiance can read the batch shape from")
                return attn, red
            if int(attn.get("TILE_SIZE", 0)) % geo.block_size:
                state.warn_once(f"AITER's 3D tile {attn.get('TILE_SIZE')} is not a multiple of the KV block "
                                f"size {geo.block_size}")
                return attn, red
            attn, red, bm = policy.aiter_decode_3d(geo, attn, red, int(b["num_2d_prgms"]), table)
            state.block_m = bm
            if not geo.all_decode and not state.logged:
                state.logged = True
                logger.info("radiance-attn first verify batch (AITER 3D): BLOCK_M=%s TILE=%s splits=%s warps=%s "
                            "(seqs=%d tokens=%d kv=%d)", bm or "stock", attn.get("TILE_SIZE"),
                            attn.get("NUM_SEGMENTS_PER_SEQ"), attn.get("num_warps"), geo.num_seqs,
                            geo.num_tokens, geo.max_seqlen_k)
        except (TypeError, KeyError, ValueError) as exc:
            state.block_m = None
            state.warn_once(f"select_3d_config took or returned something unexpected ({type(exc).__name__}: {exc})")
        return attn, red

    def select_2d_config(*a, **k):
        cfg = o2(*a, **k)
        try:
            b = sig2.bind(*a, **k).arguments
            kd, qd = _dtype(b["kv_cache_dtype"]), _dtype(b["q_dtype"])
            if kd is None or qd is None or b.get("shuffled_kv_cache"):
                return cfg
            nq = int(b["num_queries_per_kv"])
            geo = policy.Geometry(arch=arch, head_size=int(b["head_size"]), num_query_heads=nq, num_kv_heads=1,
                                  num_tokens=int(b["max_seqlen_q"]), num_seqs=1, max_seqlen_q=int(b["max_seqlen_q"]),
                                  max_seqlen_k=int(b["max_seqlen_k"]), q_dtype=qd, kv_dtype=kd,
                                  block_size=int(b["block_size"]))
            return policy.aiter_prefill_2d(geo, cfg, table)
        except (TypeError, KeyError, ValueError) as exc:
            state.warn_once(f"select_2d_config took or returned something unexpected ({type(exc).__name__}: {exc})")
            return cfg

    class _Wide3D:
        """Launch shim: the BLOCK_M chosen by select_3d_config in this call, and its grid."""

        __slots__ = ()

        def __getitem__(self, grid):
            def launch(*a, **kw):
                bm, state.block_m = state.block_m, None
                if not bm or "BLOCK_M" not in kw or a:
                    return k3[grid](*a, **kw)
                bq = max(1, bm // int(kw["num_queries_per_kv"]))
                kw["BLOCK_M"], kw["BLOCK_Q"] = bm, bq
                g = (int(kw["query_ptr"].shape[0]) // bq + int(kw["num_seqs"]),) + tuple(grid[1:])
                return k3[g](**kw)

            return launch

        def __getattr__(self, name):
            return getattr(k3, name)

    mod.select_3d_config = select_3d_config
    mod.select_2d_config = select_2d_config
    mod.kernel_unified_attention_3d = _Wide3D()
    mod._radiance_attn_wrapped = True
    return True


def params_geometry(arch: str, params) -> policy.Geometry | None:
    """Geometry from the ``_UAParams`` AITER's newer wrapper hands its config lookup, or None
    where the policy does not apply (pre-shuffled KV, fp4 queries, a value head of its own size).
    A field that is not as expected raises (AttributeError, TypeError, ValueError): the patched
    lookup warns with it and keeps AITER's config."""
    if params.shuffled_kv_cache or int(getattr(params, "head_size_v", params.head_size)) != int(params.head_size):
        return None
    qd, kd = _dtype(params.q_dtype), _dtype(params.kv_cache_dtype)
    if qd is None or kd is None:
        return None
    return policy.Geometry(
        arch=arch, head_size=int(params.head_size), num_query_heads=int(params.num_query_heads),
        num_kv_heads=int(params.num_kv_heads), num_tokens=int(params.num_tokens), num_seqs=int(params.num_seqs),
        max_seqlen_q=int(params.max_seqlen_q), max_seqlen_k=int(params.max_seqlen_k), q_dtype=qd, kv_dtype=kd,
        block_size=int(params.block_size))


# What AITER's newer 3D and reduce wrappers pass beside the op's config: an overlay must leave
# them out of it (a key in both would be a duplicate keyword argument at the launch).
_PASSED_BESIDE = ("TILE_SIZE", "NUM_SEGMENTS_PER_SEQ", "BLOCK_Q")


def _config_of(res):
    return res[0] if isinstance(res, tuple) else res


def patch_params_lookup(mod, lookup_name: str, arch: str, table: dict) -> bool:
    """Patch AITER's newer per-op lookup ``(op, params, backend, arch)``. False if already patched.

    Why/Remove when: as for the selector API.
    What: ``kv_split`` gets the policy's tile and split count, ``attn_3d`` its warps, stages,
         waves and widened BLOCK_M, ``reduce`` its launch, ``attn_2d`` the prefill overlays, all
         from ``params``. AITER asks ``kv_split``, ``attn_3d`` and ``reduce`` in that order for one
         batch: the decision is made once, at ``kv_split``, and kept for the two that follow (a
         call without it first reads AITER's own split from the unpatched lookup). The Triton
         backend only: the Gluon kernels take other config keys.
    """
    if getattr(mod, "_radiance_attn_wrapped", False):
        return False
    orig = getattr(mod, lookup_name)
    sig = inspect.signature(orig)
    state = _State(set())

    def decide(geo, params, split, backend):
        """(attn overlay, reduce overlay, BLOCK_M or None) for this batch, kept per thread."""
        key = (geo, int(params.num_2d_prgms))
        if split is None and state.decision is not None and state.decision[0] == key:
            return state.decision[1]
        if split is None:
            split = _config_of(orig("kv_split", params, backend=backend))
        stock = {"TILE_SIZE": int(split["TILE_SIZE"]), "NUM_SEGMENTS_PER_SEQ": int(split["NUM_SEGMENTS"])}
        decision = policy.aiter_decode_3d(geo, stock, {}, key[1], table)
        state.decision = (key, decision)
        return decision

    def overlay(op, cfg, params, backend):
        geo = params_geometry(arch, params)
        if geo is None or backend != "triton" or not isinstance(cfg, dict):
            return cfg
        if op == "attn_2d":
            return policy.aiter_prefill_2d(geo, cfg, table)
        if op not in ("kv_split", "attn_3d", "reduce"):
            return cfg
        attn, red, bm = decide(geo, params, cfg if op == "kv_split" else None, backend)
        if op == "kv_split":
            return dict(cfg, TILE_SIZE=attn["TILE_SIZE"], NUM_SEGMENTS=attn["NUM_SEGMENTS_PER_SEQ"])
        if op == "reduce":
            return dict(cfg, **{k: v for k, v in red.items() if k not in _PASSED_BESIDE})
        out = dict(cfg, **{k: v for k, v in attn.items() if k not in _PASSED_BESIDE})
        if bm is not None:
            out["BLOCK_M"] = bm
        if not geo.all_decode and not state.logged:
            state.logged = True
            logger.info("radiance-attn first verify batch (AITER 3D): BLOCK_M=%s TILE=%s splits=%s warps=%s "
                        "(seqs=%d tokens=%d kv=%d)", bm or "stock", attn.get("TILE_SIZE"),
                        attn.get("NUM_SEGMENTS_PER_SEQ"), out.get("num_warps"), geo.num_seqs, geo.num_tokens,
                        geo.max_seqlen_k)
        return out

    def lookup(*a, **k):
        res = orig(*a, **k)
        try:
            b = sig.bind(*a, **k)
            b.apply_defaults()
            args = b.arguments
            cfg = overlay(args["op"], _config_of(res), args["params"], args.get("backend", "triton"))
            return (cfg,) + tuple(res[1:]) if isinstance(res, tuple) else cfg
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            state.warn_once(f"AITER's {lookup_name} returned or took something unexpected ({type(exc).__name__}: {exc})")
            return res

    setattr(mod, lookup_name, lookup)
    mod._radiance_attn_wrapped = True
    return True


def patch_lookup_module(mod, lookup_name: str, arch: str, table: dict) -> bool:
    """Patch a config lookup taking the sizes as keywords: overlay the policy on whatever it
    returns. AITER's newer ``(op, params, ...)`` lookup goes to ``patch_params_lookup``.

    Why/Remove when: as for the selector API.
    What: the lookup's dict (or (attn, reduce) pair) gets the same overlays; BLOCK_M/BLOCK_Q go
         into the dict when the lookup returns them, since that API carries them in the config.
    """
    orig = getattr(mod, lookup_name)
    if "params" in inspect.signature(orig).parameters:
        return patch_params_lookup(mod, lookup_name, arch, table)
    if getattr(mod, "_radiance_attn_wrapped", False):
        return False
    state = _State(set())

    def lookup(*a, **k):
        res = orig(*a, **k)
        try:
            cfgs = res if isinstance(res, tuple) else (res,)
            attn = cfgs[0]
            if not isinstance(attn, dict) or "TILE_SIZE" not in attn:
                return res
            head = k.get("head_size", k.get("HEAD_SIZE"))
            geo = wrapper_geometry(arch, head if head is not None else 0, k.get("max_seqlen_k", 0),
                                   k.get("q_dtype"), k.get("kv_cache_dtype"), k.get("block_size", 16)) if head else None
            if geo is None:
                state.warn_once(f"AITER's {lookup_name} was called without sizes radiance can read")
                return res
            if "NUM_SEGMENTS_PER_SEQ" in attn:
                red = cfgs[1] if len(cfgs) > 1 and isinstance(cfgs[1], dict) else {}
                programs = policy.q_block_count(geo.num_tokens, geo.num_seqs, max(1, policy.stock_block_m(geo.q_per_kv) // geo.q_per_kv)) * geo.num_kv_heads
                attn2, red2, bm = policy.aiter_decode_3d(geo, attn, red, programs, table)
                if bm is not None and "BLOCK_M" in attn2:
                    attn2["BLOCK_M"], attn2["BLOCK_Q"] = bm, max(1, bm // geo.q_per_kv)
                return (attn2, red2) + tuple(cfgs[2:]) if isinstance(res, tuple) else attn2
            return policy.aiter_prefill_2d(geo, attn, table)
        except (TypeError, KeyError, ValueError) as exc:
            state.warn_once(f"AITER's {lookup_name} took or returned something unexpected "
                            f"({type(exc).__name__}: {exc})")
            return res

    setattr(mod, lookup_name, lookup)
    mod._radiance_attn_wrapped = True
    return True


def install() -> tuple[bool, str]:
    """Patch every loaded alias of AITER's unified-attention module (idempotent)."""
    mods, failed = [], []
    for name in MODULE_NAMES:
        try:
            mods.append(__import__(name, fromlist=["unified_attention"]))
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                continue  # AITER absent, or this name not provided by its version
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - AITER present but broken: reported in the detail
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    why_failed = f" ({'; '.join(failed)})" if failed else ""
    if not mods:
        return False, f"AITER unified attention not importable{why_failed}"
    # AITER executes the file once per import name, giving independent module objects; a caller
    # resolves the selectors in whichever copy it imported. Importing both names above and
    # patching every loaded copy leaves no stock copy for a later import to find.
    for m in list(sys.modules.values()):
        if m is not None and getattr(m, "__name__", "").endswith("unified_attention") \
                and (hasattr(m, "select_3d_config") or any(hasattr(m, n) for n in LOOKUP_NAMES)) \
                and "aiter" in getattr(m, "__name__", "") and m not in mods:
            mods.append(m)
    arch = _arch()
    table = tables.for_arch(arch) if arch else None
    if not table or not table.get("aiter"):
        return False, f"no AITER table for arch {arch or 'unknown'}: AITER left stock"
    patched, kinds = 0, set()
    for m in mods:
        if hasattr(m, "select_3d_config") and hasattr(m, "select_2d_config") and hasattr(m, "kernel_unified_attention_3d"):
            patched += patch_selector_module(m, arch, table)
            kinds.add("selectors")
            continue
        lookup = next((n for n in LOOKUP_NAMES if callable(getattr(m, n, None))), None)
        if lookup is not None:
            patched += patch_lookup_module(m, lookup, arch, table)
            kinds.add(f"lookup {lookup}")
    if not kinds:
        return False, "AITER unified attention has neither selectors nor a config lookup (layout changed)"
    return True, (f"{arch} table on {len(mods)} module alias(es) ({', '.join(sorted(kinds))}; {patched} newly "
                  f"patched){'; not imported' + why_failed if failed else ''}")
