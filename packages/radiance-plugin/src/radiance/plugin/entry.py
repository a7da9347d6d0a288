"""The one vLLM entry point (group ``vllm.general_plugins``, name ``radiance``).

vLLM calls general plugins in every process it starts (the front end, the engine core, each
worker), and may call them more than once in one process, so ``register`` is re-entrant: the
first call installs, later calls return at once. vLLM itself honours ``VLLM_PLUGINS`` (a comma
list of plugin names to load): leave ``radiance`` out of it and this module is never imported.

Hooks run in a fixed order, each isolated: an exception in one is logged as one line naming the
package, recorded with its error, and the next hook still runs. Order matters where two hooks
touch the same moment of the model's life:
  1. radiance-gemm      block-FP8 linear kernel: owns weight processing at load, so it must be
                        in vLLM's kernel list before any model is built.
  2. radiance-fp8stream model rewrite after load: reads the capability flag that (1) puts on
                        the linears it owns.
  3. radiance-attn      attention launch configs: patches kernel modules, independent of 1-2.
  4. radiance-plugin    selection report: printed after warm-up, once every hook has selected.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading

from radiance.plugin import record

logger = logging.getLogger("vllm.radiance.plugin")

# (package short name, hook name, "module:function"). Each function takes no argument and
# returns (applied, detail): applied=False means it skipped on purpose, detail says why.
INSTALL_ORDER: tuple[tuple[str, str, str], ...] = (
    ("gemm", "block_fp8_linear", "radiance.gemm.vllm_patches:install"),
    ("fp8stream", "model_rewrite", "radiance.fp8stream.vllm_patches:install"),
    ("attn", "attention_configs", "radiance.attn.vllm_patches:install"),
    ("plugin", "selection_report", "radiance.plugin.report:install"),
)

_lock = threading.Lock()
_registered = False


def _disabled() -> set[str]:
    raw = os.environ.get("RADIANCE_DISABLE", "")
    names = {p.strip() for p in raw.split(",") if p.strip()}
    unknown = sorted(names - {package for package, _, _ in INSTALL_ORDER})
    if unknown:
        logger.warning("RADIANCE_DISABLE names no radiance package: %s (known: %s); those names "
                       "disable nothing", ", ".join(unknown),
                       ", ".join(package for package, _, _ in INSTALL_ORDER))
    return names


def _process_name() -> str:
    import multiprocessing

    return multiprocessing.current_process().name


def _run_hook(package: str, hook: str, target: str) -> None:
    module_name, func_name = target.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        applied, detail = func()
    except Exception as exc:  # noqa: BLE001 - a failing hook must never stop the serve
        msg = f"{type(exc).__name__}: {exc}"
        logger.warning("radiance-%s %s failed, left stock: %s", package, hook, msg)
        record.add(package, hook, record.FAILED, msg)
        return
    status = record.INSTALLED if applied else record.SKIPPED
    record.add(package, hook, status, detail)
    if applied:
        logger.info("radiance-%s %s installed: %s", package, hook, detail)
    else:
        logger.info("radiance-%s %s skipped: %s", package, hook, detail)


def register() -> None:
    """vLLM general-plugin entry point. Safe to call any number of times, in any process."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
        logger.info(
            "radiance plugin loaded (pid %d, process %s)", os.getpid(), _process_name()
        )
        disabled = _disabled()
        for package, hook, target in INSTALL_ORDER:
            if package in disabled:
                record.add(package, hook, record.SKIPPED, "disabled by RADIANCE_DISABLE")
                logger.info("radiance-%s %s skipped: disabled by RADIANCE_DISABLE", package, hook)
                continue
            _run_hook(package, hook, target)


def _reset() -> None:
    """Forget that this process registered (tests only: a real process registers once)."""
    global _registered
    with _lock:
        _registered = False
    record.clear()
