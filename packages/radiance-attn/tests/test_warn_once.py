import logging
import threading

from radiance.attn import warn_once as wo


def test_each_reason_is_logged_once_and_the_count_is_bounded(caplog):
    seen, lock = set(), threading.Lock()
    with caplog.at_level(logging.WARNING, logger=wo.logger.name):
        for i in range(wo.MAX_REASONS + 5):
            wo.warn_once(seen, lock, f"reason {i}")
            wo.warn_once(seen, lock, f"reason {i}")
    messages = [r.getMessage() for r in caplog.records if r.name == wo.logger.name]
    assert messages[:2] == ["radiance-attn: reason 0", "radiance-attn: reason 1"]
    assert len(messages) == wo.MAX_REASONS
    assert messages[-1] == f"radiance-attn: reason {wo.MAX_REASONS - 1} (further reasons are not logged)"
    assert len(seen) == wo.MAX_REASONS
