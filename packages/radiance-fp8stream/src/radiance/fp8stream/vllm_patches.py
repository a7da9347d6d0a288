"""Every change this package makes to vLLM, in one place. ``install()`` is the plugin's hook.

Patch 1 - rewrite the model once it is loaded
  Why:   the stream rewrites decoder layers, which exist only after vLLM's model loader built the
         model and processed its weights (the GEMM kernel's capability flag is set then), and
         must happen before the first forward, which torch.compile traces.
  What:  wraps ``load_model`` of vLLM's model loaders (the base loader and any registered loader
         that overrides it): after the original returns, ``rewrite.install(model)`` runs on the
         target model (a drafter, loaded with its own model config, is left alone); then, at
         tensor-parallel size > 1, ``fused_all_reduce.setup`` maps radiance's peer all-reduce
         buffers on the tensor-parallel group (every rank loads the model at the same point).
  Remove-when: vLLM offers a post-load model hook to plugins.

Patch 2 - key vLLM's compile cache on the stream's configuration
  Why:   the stream changes the traced graph, but vLLM's torch.compile cache key (and its AOT
         compile key) covers vLLM's env vars, its config and the forward's source location, not
         a plugin's flags: a cache built with the stream off would be loaded with it on (the
         stream silently absent), and the reverse.
  What:  wraps ``vllm.envs.compile_factors`` (the env part of both keys) to add the stream's
         flags and version while the stream is on; with it off the key is vLLM's own, so stock
         caches are shared with runs without radiance.
  Remove-when: vLLM lets plugins contribute compile-cache factors.
"""

from __future__ import annotations

import functools
import logging
import threading

from radiance.fp8stream import flags

logger = logging.getLogger("vllm.radiance.fp8stream")

_lock = threading.Lock()
_PATCHED = "_radiance_fp8stream_patched"


def _target_model_loaded(model, vllm_config, model_config) -> None:
    from radiance.fp8stream import fused_all_reduce, rewrite

    if model_config is not None and model_config is not getattr(vllm_config, "model_config", None):
        return  # a drafter or other auxiliary model: not the decoder the stream rewrites
    spec = getattr(vllm_config, "speculative_config", None)
    method = getattr(spec, "method", None) or ""
    taps = None
    tp = getattr(getattr(vllm_config, "parallel_config", None), "tensor_parallel_size", 1)
    if "eagle3" in str(method) and tp > 1:
        # The runner sets the taps after this point; any layer may be tapped.
        taps = rewrite.EVERY_LAYER
    lora = getattr(vllm_config, "lora_config", None) is not None
    fused_sites = 0
    try:
        summary = rewrite.install(model, taps=taps, lora=lora)
        fused_sites = summary.partial_handoffs + summary.counts["mid"]
    except Exception as exc:  # noqa: BLE001 - a rewrite failure must leave the serve stock
        rewrite.uninstall(model)
        logger.warning("fp8 stream: rewrite failed, model left stock: %s: %s",
                       type(exc).__name__, exc)
    # Every rank reaches this point once per load, with the same rewrite outcome (same model,
    # same config), so the peer setup's collectives line up across the tensor-parallel group.
    parallel = getattr(vllm_config, "parallel_config", None)
    fused_all_reduce.setup(fused_sites, ubatching=bool(getattr(parallel, "use_ubatching", False)))


def _wrap_load_model(cls) -> bool:
    """Whether ``cls.load_model`` is wrapped now (by this call or an earlier one)."""
    original = cls.__dict__.get("load_model")
    if original is None:
        return False
    if getattr(original, _PATCHED, False):
        return True

    @functools.wraps(original)
    def load_model(self, vllm_config, model_config, *args, **kwargs):
        model = original(self, vllm_config, model_config, *args, **kwargs)
        _target_model_loaded(model, vllm_config, model_config)
        return model

    setattr(load_model, _PATCHED, True)
    cls.load_model = load_model
    return True


def _patch_loaders() -> int:
    from vllm.model_executor import model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    classes = [BaseModelLoader, *getattr(model_loader, "_LOAD_FORMAT_TO_MODEL_LOADER", {}).values()]
    return sum(_wrap_load_model(cls) for cls in dict.fromkeys(classes))


def _patch_compile_factors() -> str | None:
    """None once ``vllm.envs.compile_factors`` carries the stream's flags, else why it cannot."""
    import vllm.envs as envs

    original = getattr(envs, "compile_factors", None)
    if not callable(original):
        return "vllm.envs.compile_factors is missing, so the compile cache could not tell runs " \
               "with the stream from runs without it"
    if getattr(original, _PATCHED, False):
        return None

    @functools.wraps(original)
    def compile_factors():
        factors = original()
        if flags.stream_enabled():
            factors.update(flags.cache_factors())
        return factors

    setattr(compile_factors, _PATCHED, True)
    envs.compile_factors = compile_factors
    return None


def install() -> tuple[bool, str]:
    """The plugin's hook: validate the flags, then patch vLLM when the stream is on."""
    stream, gdn = flags.validate()  # a bad value raises: the plugin records a failed hook
    if not stream:
        return False, f"{flags.STREAM}=0: the fp8 residual stream is off"
    with _lock:
        # The cache key first: a rewrite without it could load a graph traced with the stream off.
        why = _patch_compile_factors()
        if why is not None:
            return False, why
        if _patch_loaders() == 0:
            return False, "no vLLM model loader defines load_model: nothing to rewrite after"
    gdn_note = "on" if gdn else "off"
    return True, (f"model rewrite after load (gdn norm epilogue {gdn_note}); "
                  "compile cache keyed on the stream's flags")
