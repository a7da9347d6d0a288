"""What the plugin installed in this process, what it skipped and why, what failed."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

INSTALLED = "installed"
SKIPPED = "skipped"
FAILED = "failed"


@dataclass(frozen=True)
class Entry:
    package: str
    hook: str
    status: str
    detail: str


_lock = threading.Lock()
_entries: list[Entry] = []


def add(package: str, hook: str, status: str, detail: str) -> Entry:
    entry = Entry(package, hook, status, detail)
    with _lock:
        _entries.append(entry)
    return entry


def entries() -> list[Entry]:
    with _lock:
        return list(_entries)


def as_dicts() -> list[dict]:
    return [asdict(e) for e in entries()]


def lines(rows: list[Entry] | None = None) -> list[str]:
    """Aligned report lines for ``rows`` (default: this process's record)."""
    rows = entries() if rows is None else rows
    if not rows:
        return ["radiance install record: nothing ran in this process"]
    width = max(len(f"{e.package}.{e.hook}") for e in rows)
    out = ["radiance install record:"]
    for e in rows:
        out.append(f"  {e.package + '.' + e.hook:<{width}}  {e.status:<9}  {e.detail}")
    return out


def clear() -> None:
    with _lock:
        _entries.clear()
