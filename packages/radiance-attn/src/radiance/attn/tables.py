"""Per-arch launch tables: where every hardware-dependent number of the policy lives.

A table is a JSON document keyed by one arch. ``aiter`` holds the overlays for AITER's
selectors, ``triton`` the rules for radiance's launch of vLLM's Triton kernel: a ``default``
rule plus ``classes`` (a ``match`` on head size / KV heads / dtypes, and the rule fitted for
it). A match value is one value, a list of values, or a range ``{"min": a, "max": b}`` (either
bound optional; ``min`` inclusive, ``max`` exclusive): the fitted sm_90 table bands its classes
by ``max_seqlen_k`` that way. Lookup is by exact arch only, so a table fitted on one GPU never
moves another's shapes.

A Triton rule: ``split`` (coef, exp, min, max[, unsplit_below, programs_exp]) for the segment count;
optional ``tile_3d`` / ``warps_3d`` / ``stages_3d`` / ``kernel_3d`` for the stock block's split
launch (absent: vLLM's own shape and kernel; ``kernel_3d: "radiance"`` runs radiance's split-KV
kernel); ``wide`` (``block_m`` choices, ``min_fill``, and per block a ``launch`` of tile, warps,
optional stages, optional ``kernel`` and optional ``split_scale`` on the split coefficient); ``max_seqs`` and
``max_query_len`` bound the batches it serves. Any launch (the ``_3d`` keys or a widened block's
entry) may also carry ``registers`` (a per-thread register cap, 24-255) and, on radiance's kernel,
``table_ahead`` and ``partial_pass`` (``policy.TritonLaunch`` says what they do).

Sources, first match wins:
1. ``RADIANCE_ATTN_TABLE=path.json`` -- serves the arch named in that file, nothing else (a
   lookup for another arch warns once that the file is ignored there).
2. ``tables/<arch without underscore>.json`` shipped in this package (gfx1201.json from the
   gfx1201 measurements; sm90.json when the tuning harness has been run on an H200).
3. ``sm_90`` only: a provisional rule (below) until a fitted sm90.json exists.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping

logger = logging.getLogger("vllm.radiance.attn")

TABLE_DIR = Path(__file__).parent / "tables"
KERNELS = ("vllm", "radiance")  # whose split-KV kernel a launch runs (policy.TritonLaunch.kernel)
PARTIAL_PASSES = ("triton", "cuda_warpgroup")  # radiance's kernel's partial pass (TritonLaunch.partial_pass)
ENV_TABLE = "RADIANCE_ATTN_TABLE"

# Per-workgroup LDS/shared-memory bytes the LDS clamp budgets against.
_LDS = {"gfx1200": 64 * 1024, "gfx1201": 64 * 1024, "gfx1100": 64 * 1024, "gfx942": 64 * 1024,
        "gfx950": 160 * 1024, "sm_90": 227 * 1024, "sm_100": 227 * 1024, "sm_80": 163 * 1024}

# PROVISIONAL sm_90 rule, used only while no fitted tables/sm90.json exists: the gfx1201 rule's
# functional form unchanged (it is a ratio of work to parallelism, not a constant of one GPU),
# applied to decode and verify batches of up to 8 sequences (the measured range). It is replaced
# by the tuning harness's fit (python -m radiance.attn.tune on an H200).
SM90_PROVISIONAL: dict[str, Any] = {
    "arch": "sm_90",
    "provisional": True,
    "source": "provisional: gfx1201 rule form, not yet fitted on sm_90",
    "triton": {
        "default": {
            "max_query_len": 16,
            "max_seqs": 8,
            "split": {"coef": 16, "exp": 1 / 3, "min": 4, "max": 128},
            "wide": {"block_m": [64], "min_fill": 0.8, "launch": {"64": {"tile": 32, "warps": 4}}},
        },
        "classes": [],
    },
}


def table_file(arch: str) -> Path:
    return TABLE_DIR / f"{arch.replace('_', '')}.json"


def validate(table: Mapping[str, Any]) -> None:
    """Raise ValueError when a table is not usable (checked at load, never mid-launch)."""
    if not isinstance(table, Mapping) or not isinstance(table.get("arch"), str):
        raise ValueError("attention table must be a JSON object with a string 'arch'")
    tri = table.get("triton")
    if tri is not None:
        for cls in tri.get("classes", []):
            for key, want in (cls.get("match") or {}).items():
                if isinstance(want, Mapping) and (not want or set(want) - {"min", "max"} or not all(
                        isinstance(v, (int, float)) and not isinstance(v, bool) for v in want.values())):
                    raise ValueError(f"table {table['arch']}: match range {key}={want!r} is not "
                                     "{'min': number, 'max': number} (either bound optional)")
        rules = [tri.get("default")] + [c.get("rule") for c in tri.get("classes", [])]
        for rule in rules:
            if rule is None:
                continue
            split = rule.get("split")
            if not split or not all(k in split for k in ("coef", "exp", "min", "max")):
                raise ValueError(f"table {table['arch']}: every triton rule needs split.coef/exp/min/max")
            if int(split["min"]) < 1 or int(split["max"]) < int(split["min"]):
                raise ValueError(f"table {table['arch']}: split bounds {split['min']}..{split['max']} invalid")
            for key in ("coef", "exp", "programs_exp"):
                value = split.get(key, 0)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
                        key == "coef" and value == 0):
                    raise ValueError(f"table {table['arch']}: split.{key} {value!r} is not a "
                                     f"{'positive' if key == 'coef' else 'non-negative'} number")
            for bm in (rule.get("wide") or {}).get("block_m", []):
                if int(bm) & (int(bm) - 1):
                    raise ValueError(f"table {table['arch']}: BLOCK_M {bm} is not a power of two")
            launches = [{k[:-3]: v for k, v in rule.items() if k.endswith("_3d")}]
            launches += list(((rule.get("wide") or {}).get("launch") or {}).values())
            for launch in launches:
                kernel = launch.get("kernel", "vllm")
                if kernel not in KERNELS:
                    raise ValueError(f"table {table['arch']}: kernel {kernel!r} is not one of {KERNELS}")
                regs = launch.get("registers")
                if regs is not None and (not isinstance(regs, int) or not 24 <= regs <= 255):
                    raise ValueError(f"table {table['arch']}: registers {regs!r} is not a count in 24..255")
                if launch.get("table_ahead") and kernel != "radiance":
                    raise ValueError(f"table {table['arch']}: table_ahead is an option of radiance's kernel only")
                partial = launch.get("partial_pass", "triton")
                if partial not in PARTIAL_PASSES:
                    raise ValueError(f"table {table['arch']}: partial_pass {partial!r} is not one of {PARTIAL_PASSES}")
                if partial != "triton" and kernel != "radiance":
                    raise ValueError(f"table {table['arch']}: partial_pass is an option of radiance's kernel only")


@functools.lru_cache(maxsize=None)
def load_file(path: str) -> dict:
    with open(path) as f:
        table = json.load(f)
    validate(table)
    return table


def for_arch(arch: str) -> dict | None:
    """The table serving ``arch``, or None (the policy then leaves everything stock)."""
    env = os.environ.get(ENV_TABLE)
    if env:
        table = load_file(env)
        if table["arch"] == arch:
            return table
        warn_other_arch(env, table["arch"], arch)
    path = table_file(arch)
    if path.is_file():
        return load_file(str(path))
    if arch == "sm_90":
        return SM90_PROVISIONAL
    return None


def shipped_source(arch: str) -> str:
    """What serves ``arch`` when no RADIANCE_ATTN_TABLE does, as a clause for reports."""
    if table_file(arch).is_file():
        return f"the shipped {table_file(arch).name} serves {arch}"
    if arch == "sm_90":
        return "the provisional sm_90 rule serves sm_90"
    return f"no table serves {arch}: its attention stays stock"


@functools.lru_cache(maxsize=None)
def warn_other_arch(path: str, table_arch: str, arch: str) -> None:
    """Say once per table and arch (a lookup runs for every new geometry) that a RADIANCE_ATTN_TABLE
    naming another arch than the GPU's is ignored, and what serves the GPU instead."""
    logger.warning("radiance-attn: %s=%s is a table for %s, ignored on %s; %s", ENV_TABLE, path,
                   table_arch, arch, shipped_source(arch))


def matches(match: Mapping[str, Any], geo) -> bool:
    """Whether ``geo`` (a policy.Geometry) meets every value of a class's ``match``."""
    for key, want in match.items():
        have = getattr(geo, key)
        if isinstance(want, Mapping):
            if ("min" in want and have < want["min"]) or ("max" in want and have >= want["max"]):
                return False
        elif isinstance(want, list):
            if have not in want:
                return False
        elif have != want:
            return False
    return True


def matching_rule(table: Mapping[str, Any], geo) -> dict | None:
    """The Triton rule whose class ``geo`` falls in: first matching class, else the default,
    whatever the batch's sequence count."""
    tri = table.get("triton")
    if not tri:
        return None
    for cls in tri.get("classes", []):
        if matches(cls.get("match", {}), geo):
            return cls["rule"]
    return tri.get("default")


def triton_rule(table: Mapping[str, Any], geo) -> dict | None:
    """The Triton-launch rule for ``geo``: first matching class, else the default; None when the
    batch has more sequences than the rule's ``max_seqs``."""
    rule = matching_rule(table, geo)
    if rule is None or geo.num_seqs > int(rule.get("max_seqs", 1 << 30)):
        return None
    return rule


def lds_bytes(arch: str) -> int:
    return _LDS.get(arch, 0)


def copy_of(table: Mapping[str, Any]) -> dict:
    return copy.deepcopy(dict(table))
