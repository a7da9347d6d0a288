"""Wheel build hook: compile the kernel library ahead of time for the arches a wheel will serve.

    RADIANCE_KERNELS_AOT_ARCHS=90a,100a pip wheel packages/radiance-kernels   # NVIDIA (nvcc)
    RADIANCE_KERNELS_AOT_ARCHS=gfx942 pip wheel packages/radiance-kernels     # ROCm (hipcc)

Each arch (``library.device_arch``'s spelling: ``90a`` for Hopper, ``89``, ``100a``, a gfx name)
is built with the compiler the JIT build would use (``CUDA_HOME``/``PATH``/..., ``ROCM_PATH``/...)
into ``radiance/kernels/prebuilt/<vendor>-<arch>/`` with its ``build.json``; the wheel is then
tagged for this platform (the library does not depend on the Python version). Unset, the wheel
is pure Python and every GPU builds on first use. A requested arch that does not build fails
the wheel build: a wheel never claims prebuilt kernels it lacks.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ARCHS_ENV = "RADIANCE_KERNELS_AOT_ARCHS"


def requested_archs() -> list[str]:
    return [a.strip() for a in os.environ.get(ARCHS_ENV, "").split(",") if a.strip()]


class PrebuiltKernelsHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        archs = requested_archs()
        if self.target_name != "wheel" or version != "standard" or not archs:
            return
        sys.path.insert(0, str(Path(self.root) / "src"))  # this tree's build code, not an installed one
        from radiance.kernels import library

        self._tmp = Path(tempfile.mkdtemp(prefix="radiance-prebuilt-"))
        for arch in archs:
            toolchain = library.find_hipcc() if arch.startswith("gfx") else library.find_nvcc()
            if toolchain is None:
                raise library.BuildError(f"{ARCHS_ENV} asks for {arch}, but no "
                                         f"{'hipcc' if arch.startswith('gfx') else 'nvcc'} was found")
            out_dir = library.build_prebuilt(library.make_spec(toolchain, arch), self._tmp)
            self.app.display_info(f"radiance-kernels: prebuilt {out_dir.name} with {toolchain.version}")
            for f in sorted(out_dir.iterdir()):
                build_data["force_include"][str(f)] = f"radiance/kernels/prebuilt/{out_dir.name}/{f.name}"
        build_data["pure_python"] = False
        build_data["tag"] = "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
