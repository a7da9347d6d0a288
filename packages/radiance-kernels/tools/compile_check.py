#!/usr/bin/env python3
"""Compile every kernel source, without running anything: CUDA for sm_90a and, when hipcc is
installed, HIP for an RDNA target (gfx1030). Exits non-zero on any compiler error.

Each .cu is compiled on its own (``-c``) so an error names its file; headers are checked
through the sources that include them. hipcc is run with ``HIP_PLATFORM=amd``: its NVIDIA-side
headers do not build against CUDA 13, and the kernels map straight to CUDA on NVIDIA anyway.

Usage: python tools/compile_check.py [--cuda-arch 90a] [--hip-arch gfx1030] [--no-hip | --no-cuda]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
CSRC = SRC / "radiance" / "kernels" / "csrc"
sys.path.insert(0, str(SRC))  # this checkout's package, installed or not

from radiance.kernels import library  # noqa: E402


def _run(cmd: list[str], env: dict[str, str] | None = None) -> bool:
    prefix = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    print(f"$ {prefix + ' ' if prefix else ''}{shlex.join(cmd)}", flush=True)
    res = subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    out = (res.stdout + res.stderr).strip()
    if out:
        print(out, flush=True)
    if res.returncode != 0:
        print(f"FAILED (exit {res.returncode})", flush=True)
    return res.returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda-arch", default="90a")
    ap.add_argument("--hip-arch", default="gfx1030")
    ap.add_argument("--no-hip", action="store_true", help="skip the HIP compile")
    ap.add_argument("--no-cuda", action="store_true", help="skip the CUDA compile")
    args = ap.parse_args()

    sources = sorted(CSRC.glob("*.cu"))
    if not sources:
        print(f"no kernel sources in {CSRC}")
        return 1
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        # The library's own compiler search (CUDA_HOME, PATH, the pip [cuda] toolkit, ...).
        nvcc = None if args.no_cuda else library.find_nvcc()
        if args.no_cuda:
            print("CUDA compile skipped")
        elif nvcc is None:
            print("nvcc not found (set CUDA_HOME, put nvcc on PATH or install radiance-kernels[cuda])")
            ok = False
        else:
            for src in sources:
                ok &= _run([nvcc.path, *nvcc.arch_flags(args.cuda_arch), "-O3", "-std=c++17",
                            "-Xcompiler", "-fPIC", *nvcc.flags, "-c", str(src),
                            "-o", str(Path(tmp, src.stem + ".cuda.o"))])
        hipcc = None if args.no_hip else library.find_hipcc()
        if hipcc is None:
            print("hipcc not found: HIP compile skipped" if not args.no_hip else "HIP compile skipped")
        else:
            for src in sources:
                ok &= _run([hipcc.path, *hipcc.arch_flags(args.hip_arch), "-O3", "-std=c++17",
                            "-fPIC", "-c", str(src), "-o", str(Path(tmp, src.stem + ".hip.o"))],
                           env=dict(hipcc.env))
    print("compile check: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
