"""The report printed once per serve: what the plugin installed, and the kernel-selection log.

Selections happen at import, load, compile and first-forward time, scattered across packages,
before anyone reads the log. The worker's warm-up (``compile_or_warm_up_model``) is its last
init step: when it returns, the model is loaded, compiled and its graphs captured, so every
selection a serve will make has been made. That is when rank 0 prints the report, once per
process. The queries that found no kernel are printed with their reason: they are the lines
that explain why a model runs a fallback.

This module holds the plugin package's one change to vLLM:
  What:  wraps ``compile_or_warm_up_model`` on each worker class that defines its own.
  Why:   vLLM gives plugins no hook after warm-up, the first moment the selections are complete.
  Remove-when: vLLM offers plugins a post-warm-up (or engine-ready) callback.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading

from radiance.kernels import registry
from radiance.plugin import record

logger = logging.getLogger("vllm.radiance.plugin")

# Worker classes whose warm-up may be the one that runs. vLLM's CPU worker overrides the GPU
# worker's method without calling it, so each class that defines its own is wrapped.
WORKER_CLASSES: tuple[tuple[str, str], ...] = (
    ("vllm.v1.worker.gpu_worker", "Worker"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker"),
    ("vllm.v1.worker.xpu_worker", "XPUWorker"),
)

_WRAPPED = "_radiance_report_wrapped"
_printed = threading.Event()


def report_lines() -> list[str]:
    lines = record.lines()
    sel = registry.report_lines(registry.selections(), "radiance kernel selection")
    return lines + (sel or ["radiance kernel selection: no kernel was asked for"])


def print_report() -> None:
    """Log the report once per process."""
    if _printed.is_set():
        return
    _printed.set()
    for line in report_lines():
        logger.info("%s", line)


def _wrap(method):
    @functools.wraps(method)
    def compile_or_warm_up_model(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        try:
            if getattr(self, "rank", 0) == 0:
                print_report()
        except Exception as exc:  # noqa: BLE001 - a log line must never fail a serve
            logger.warning("radiance report failed: %s: %s", type(exc).__name__, exc)
        return result

    setattr(compile_or_warm_up_model, _WRAPPED, True)
    return compile_or_warm_up_model


def install() -> tuple[bool, str]:
    """Wrap each worker class's own warm-up so rank 0 prints the report after it."""
    wrapped = []
    not_imported = []
    for module_name, class_name in WORKER_CLASSES:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except Exception as exc:  # noqa: BLE001 - a platform's worker module may not import here
            # Usual for another platform's worker, so only at debug; it is the reason if none imports.
            not_imported.append(f"{module_name}: {type(exc).__name__}: {exc}")
            logger.debug("radiance report: %s.%s not importable: %s: %s", module_name, class_name,
                         type(exc).__name__, exc)
            continue
        method = cls.__dict__.get("compile_or_warm_up_model")
        if method is None:
            continue
        if not getattr(method, _WRAPPED, False):
            setattr(cls, "compile_or_warm_up_model", _wrap(method))
        wrapped.append(class_name)
    if not wrapped:
        why = "no vLLM worker class with compile_or_warm_up_model found"
        return False, why + (f" (not importable: {'; '.join(not_imported)})" if not_imported else "")
    return True, "after warm-up on " + ", ".join(wrapped)
