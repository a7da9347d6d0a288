"""What ``radiance demo`` shows for the stream: the rewrite summary from a generation's log.

``install(model)`` records its one-line summary in the kernel registry's selection log (op
``fp8stream.rewrite``), which a generation run brings back from the process that loaded the
model (``run_vllm_generate(...)["selections"]`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the
engine core and its worker run in the child that reports).
"""

from __future__ import annotations

OP = "fp8stream.rewrite"


def summary_from(selections: list[dict]) -> str | None:
    """The stream's summary line in a selection log, or None when the stream did not run."""
    for row in selections:
        if row.get("op") == OP:
            return row.get("query", {}).get("summary")
    return None


def compare_lines(on_texts: list[str], off_texts: list[str], summary: str | None) -> list[str]:
    """Demo lines: the summary, then each prompt's text with the stream on and off."""
    lines = [summary or "fp8 stream: no rewrite recorded (stream off or no decoder core)"]
    for i, (on, off) in enumerate(zip(on_texts, off_texts)):
        verdict = "identical" if on == off else "DIFFERENT"
        lines.append(f"  prompt {i}: stream on/off {verdict}: {on!r}")
        if on != off:
            lines.append(f"  {'':9} stream off:             {off!r}")
    return lines
