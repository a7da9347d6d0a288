"""The ``radiance`` command: ``demo`` (the main job), ``status``, and package tools."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
import time
from pathlib import Path

DEFAULT_PROMPTS = [
    "The fastest way to serve a language model is",
    "In one sentence, a GPU kernel",
]
PACKAGES = ("radiance-kernels", "radiance-gemm", "radiance-fp8stream", "radiance-attn", "radiance-plugin")


def _say(msg: str) -> None:
    print(f"[radiance] {msg}", flush=True)


def _demo(args: argparse.Namespace) -> int:
    from radiance.plugin import generate, tiny_models

    t0 = time.monotonic()
    if args.model:
        model_dir = Path(args.model)
        if not (model_dir / "config.json").is_file():
            _say(f"error: {model_dir} is not a model directory (no config.json)")
            return 2
        _say(f"model: {model_dir}")
    else:
        _say(f"building the tiny local model '{args.kind}' ({args.dtype}) if it is not cached ...")
        model_dir = tiny_models.build(args.kind, args.dtype)
        _say(f"model: {model_dir} ({tiny_models.describe(args.kind)}; {time.monotonic() - t0:.1f} s)")

    llm_kwargs = {"enforce_eager": args.eager}
    if args.model:
        llm_kwargs["dtype"] = "auto"  # the tiny models are bf16; a user's model says its own
    prompts = args.prompt or DEFAULT_PROMPTS
    sampling = {"max_tokens": args.max_tokens, "temperature": 0.0}

    def run(label: str, env: dict[str, str]) -> dict:
        _say(f"{label}: starting vLLM with radiance loaded and generating; vLLM's log follows "
             "(a first start on a CPU takes about a minute) ...")
        t1 = time.monotonic()
        # the engine core runs in this child process: its install record and selections come back
        res = generate.run_vllm_generate(
            model_dir, prompts, sampling=sampling, llm_kwargs=llm_kwargs,
            env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **env}, timeout_s=1800, stream_log=True)
        _say(f"{label}: generation done in {time.monotonic() - t1:.1f} s")
        return res

    res = run("radiance", {})
    off = None if args.no_compare else run("fp8 stream off", {"RADIANCE_FP8_STREAM": "0"})

    print()
    for prompt, out in zip(prompts, res["outputs"]):
        print(f"  prompt: {prompt!r}\n  output: {out['text']!r}\n")
    from radiance.kernels.registry import report_lines
    from radiance.plugin.record import Entry, lines

    for line in lines([Entry(**e) for e in res["record"]]):
        print(line)
    print()
    for line in report_lines(res["selections"], "radiance kernel selection") or [
        "radiance kernel selection: no kernel was asked for"
    ]:
        print(line)
    if off is not None:
        from radiance.fp8stream import demo as stream_demo

        print()
        summary = stream_demo.summary_from(res["selections"])
        for line in stream_demo.compare_lines(
            [o["text"] for o in res["outputs"]], [o["text"] for o in off["outputs"]], summary
        ):
            print(line)
    return 0


def _status(args: argparse.Namespace) -> int:
    print("radiance packages:")
    for dist in PACKAGES:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        print(f"  {dist:<20} {version}")
    try:
        import vllm

        print(f"vLLM: {vllm.__version__}")
    except Exception as exc:  # noqa: BLE001 - status reports, it does not fail
        print(f"vLLM: not importable ({type(exc).__name__}: {exc})")
    try:
        import torch

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
        print(f"torch: {torch.__version__}; GPU: {gpu}")
    except Exception as exc:  # noqa: BLE001
        print(f"torch: not importable ({exc})")
    try:
        from radiance.kernels import library

        shipped = library.prebuilt_arches()
        print("kernel libraries: " + (f"prebuilt for {', '.join(shipped)}; other GPUs build them on first use"
                                      if shipped else "none prebuilt; built for the GPU on first use"))
    except ImportError as exc:
        print(f"kernel libraries: radiance-kernels not importable ({exc})")
    from radiance.plugin.flags import FLAGS

    print("flags:")
    for flag in FLAGS:
        value = os.environ.get(flag.name)
        shown = value if value is not None else f"(default {flag.default})"
        print(f"  {flag.name:<26} {shown}")
    return 0


def _delegate(module: str, argv: list[str]) -> int:
    try:
        main = importlib.import_module(module).main
    except ImportError as exc:
        print(f"radiance: {module} is not available: {exc}", file=sys.stderr)
        return 2
    return int(main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["attn", "tune"]:
        return _delegate("radiance.attn.tune", argv[2:])

    parser = argparse.ArgumentParser(prog="radiance", description="radiance: faster vLLM decode")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="generate with real vLLM on a tiny local model, radiance on")
    demo.add_argument("--model", help="a local model directory (default: build a tiny one)")
    demo.add_argument("--kind", default="qwen3", help="tiny model kind (default: qwen3)")
    demo.add_argument("--dtype", default="fp8_block", choices=("bf16", "fp8_block"))
    demo.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    demo.add_argument("--max-tokens", type=int, default=16)
    demo.add_argument("--eager", action="store_true", help="skip vLLM's torch.compile")
    demo.add_argument("--no-compare", action="store_true",
                      help="skip the second run with the fp8 stream off")
    demo.set_defaults(func=_demo)

    status = sub.add_parser("status", help="what is installed here and which flags are set")
    status.set_defaults(func=_status)

    sub.add_parser("attn", help="attention tools: `radiance attn tune ...`")

    args = parser.parse_args(argv)
    if args.command == "attn":
        parser.error("usage: radiance attn tune [options]")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
