"""The kernel registry: which implementation serves a query, and a log of every question asked.

Each kernel registers the op it implements and a ``serves(query)`` check that returns ``None``
when it can serve the query, or a short reason when it cannot. ``select(op, **query)`` asks
every candidate of the op in registration order and returns the first that serves, or no
kernel with the reasons collected. Every query is recorded (repeats counted, not duplicated),
and ``selections()`` returns that log for the report the plugin prints after warm-up: the
queries that found nothing, and why, are the most useful lines of that report.

Selections are made at install or load time, never on the per-step hot path, so the lock and
the dict lookups here cost nothing that matters.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ServesFn = Callable[[Mapping[str, Any]], "str | None"]


@dataclass(frozen=True)
class Kernel:
    """One registered implementation of an op."""

    op: str
    name: str
    impl: Any
    serves: ServesFn
    describe: str = ""


@dataclass(frozen=True)
class Selection:
    """The answer to one query: a kernel, or None and the reason nothing served."""

    op: str
    query: Mapping[str, Any]
    kernel: Kernel | None
    reason: str

    @property
    def impl(self) -> Any:
        return None if self.kernel is None else self.kernel.impl

    def __bool__(self) -> bool:
        return self.kernel is not None


@dataclass
class _LogEntry:
    op: str
    query: dict[str, Any]
    kernel: str | None
    reason: str
    count: int = field(default=1)


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kernels: dict[str, list[Kernel]] = {}
        self._log: dict[tuple, _LogEntry] = {}
        self._unavailable: dict[str, str] = {}

    def register(
        self, op: str, name: str, impl: Any, serves: ServesFn, describe: str = ""
    ) -> Kernel:
        """Add (or replace, by name) an implementation of ``op``."""
        kernel = Kernel(op=op, name=name, impl=impl, serves=serves, describe=describe)
        with self._lock:
            cands = [k for k in self._kernels.setdefault(op, []) if k.name != name]
            cands.append(kernel)
            self._kernels[op] = cands
            self._unavailable.pop(op, None)
        return kernel

    def mark_unavailable(self, op: str, reason: str) -> None:
        """Say why an op has no kernel at all (no GPU, build failed, ...)."""
        with self._lock:
            self._unavailable[op] = reason

    def kernels(self, op: str | None = None) -> list[Kernel]:
        with self._lock:
            if op is not None:
                return list(self._kernels.get(op, ()))
            return [k for ks in self._kernels.values() for k in ks]

    def select(self, op: str, **query: Any) -> Selection:
        with self._lock:
            cands = list(self._kernels.get(op, ()))
            unavailable = self._unavailable.get(op)
        kernel: Kernel | None = None
        reasons: list[str] = []
        for cand in cands:
            why = cand.serves(query)
            if why is None:
                kernel = cand
                break
            reasons.append(f"{cand.name}: {why}")
        if kernel is not None:
            reason = ""
        elif reasons:
            reason = "; ".join(reasons)
        elif unavailable:
            reason = unavailable
        else:
            reason = f"no kernel registered for {op!r}"
        self._record(op, query, kernel, reason)
        return Selection(op=op, query=dict(query), kernel=kernel, reason=reason)

    def record(self, op: str, query: Mapping[str, Any], kernel: str | None, reason: str = "") -> None:
        """Log a decision made outside ``select`` (a dispatch table, a config policy)."""
        self._record(op, dict(query), None, reason, kernel_name=kernel)

    def _record(self, op, query, kernel, reason, kernel_name=None) -> None:
        name = kernel.name if kernel is not None else kernel_name
        key = (op, tuple(sorted((k, repr(v)) for k, v in query.items())), name, reason)
        with self._lock:
            entry = self._log.get(key)
            if entry is None:
                self._log[key] = _LogEntry(op, dict(query), name, reason)
            else:
                entry.count += 1

    def selections(self) -> list[dict[str, Any]]:
        """The log: one dict per distinct (op, query, answer), in the order first asked."""
        with self._lock:
            return [
                {"op": e.op, "query": dict(e.query), "kernel": e.kernel, "reason": e.reason, "count": e.count}
                for e in self._log.values()
            ]

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()


def report_lines(rows: list[dict[str, Any]], title: str) -> list[str]:
    """Format a selection log as aligned report lines (empty when there is nothing to say)."""
    if not rows:
        return []
    hit = sum(1 for r in rows if r["kernel"])
    out = [f"{title}: {hit} of {len(rows)} distinct queries resolved to a kernel"]
    width = max(len(r["op"]) for r in rows)
    for r in rows:
        query = " ".join(f"{k}={v}" for k, v in r["query"].items())
        times = f" (asked {r['count']}x)" if r["count"] > 1 else ""
        out.append(f"  {r['op']:<{width}}  {query}")
        if r["kernel"]:
            out.append(f"  {'':<{width}}  -> {r['kernel']}{times}")
        else:
            out.append(f"  {'':<{width}}  -> no kernel, reference runs: {r['reason']}{times}")
    return out


REGISTRY = Registry()
register = REGISTRY.register
select = REGISTRY.select
selections = REGISTRY.selections
record = REGISTRY.record
mark_unavailable = REGISTRY.mark_unavailable
kernels = REGISTRY.kernels
