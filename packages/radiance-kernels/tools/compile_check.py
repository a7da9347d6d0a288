#!/usr/bin/env python3
"""Build the kernel library, without running anything: CUDA for sm_90a and, when hipcc is
installed, HIP for an RDNA target (gfx1030). Exits non-zero on any compiler or linker error
or a library that does not load.

The commands are the JIT build's (``library.Toolchain``). Each .cu is compiled on its own
(``-c``) so an error names its file, then the objects are linked and the library is loaded
with ctypes (host side only: every ABI function present, the ABI version); headers are checked
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


def _build(tc: library.Toolchain, arch: str, sources: list[Path], tmp: Path) -> bool:
    """The library build's own commands: each source on its own, then the link into the shared
    library (which reads the objects, so its flags are checked too); then the library is loaded
    as the ops load it, which needs no GPU: every C function bound and the ABI version checked."""
    tmp.mkdir()
    env = dict(tc.env)
    objects = [tmp / f"{src.stem}.o" for src in sources]
    lib = tmp / library.LIB_NAME
    ok = all([_run(tc.compile_command(src, arch, obj), env=env) for src, obj in zip(sources, objects)])
    if not (ok and _run(tc.link_command(objects, arch, lib), env=env)):
        return False
    try:
        library.KernelLibrary(lib)
    except (library.BuildError, OSError, AttributeError) as exc:  # AttributeError: a missing symbol
        print(f"FAILED to load {lib.name} built for {arch}: {exc}", flush=True)
        return False
    print(f"{tc.kind} {arch}: library built and loaded, ABI version {library.ABI_VERSION}", flush=True)
    return True


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
            ok &= _build(nvcc, args.cuda_arch, sources, Path(tmp, "cuda"))
        hipcc = None if args.no_hip else library.find_hipcc()
        if hipcc is None:
            print("hipcc not found: HIP compile skipped" if not args.no_hip else "HIP compile skipped")
        else:
            ok &= _build(hipcc, args.hip_arch, sources, Path(tmp, "hip"))
    print("compile check: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
