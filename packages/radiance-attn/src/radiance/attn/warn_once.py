"""Warnings said once per distinct reason, for hooks that hand a call back to stock."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("vllm.radiance.attn")

# An exception's text can carry a batch's sizes, so the reasons one owner warns about are bounded;
# the last one logged says that further reasons go unlogged.
MAX_REASONS = 32


def warn_once(seen: set[str], lock: threading.Lock, message: str) -> None:
    """Log ``message`` as a warning unless ``seen`` (guarded by ``lock``) already holds it or
    is full; the warning that fills it says so."""
    if message in seen or len(seen) >= MAX_REASONS:
        return
    with lock:
        if message in seen or len(seen) >= MAX_REASONS:
            return
        seen.add(message)
        last = len(seen) == MAX_REASONS
    logger.warning("radiance-attn: %s%s", message, " (further reasons are not logged)" if last else "")
