"""Build the kernel sources for the GPU at hand into one shared library, cache it, load it.

Every ``csrc/*.cu`` is compiled on first use into a single shared library with a plain C ABI
(raw pointers, sizes, a stream) and loaded with ctypes: no torch C++ ABI, so one build serves
every torch version. NVIDIA: nvcc, ``-gencode`` for the device's compute capability (``sm_90a``
on Hopper, where the arch-specific features need the ``a`` target). ROCm: hipcc with
``--offload-arch`` set to the device's gfx name.

Cache: ``$RADIANCE_CACHE_DIR`` or ``$XDG_CACHE_HOME/radiance`` or ``~/.cache/radiance``, one
directory per (source hash, arch, compiler version, flags), created private (0700). A file lock
makes concurrent test workers and tensor-parallel ranks build once. A cached library is loaded
only when it and its record are owned by the current user and the record's source hash and
library digest match; anything else is rebuilt, never loaded.

A wheel built with ``RADIANCE_KERNELS_AOT_ARCHS`` set (``hatch_build.py``) carries libraries
built ahead of time under ``prebuilt/<vendor>-<arch>/``; on a GPU of one of those arches the
library is loaded from there, with no compiler, when its record names these exact sources and
this ABI and its digest matches (``RADIANCE_KERNELS_PREBUILT=0`` skips them). Anything else
falls through to the JIT build.

``RADIANCE_KERNELS_EXTRA_FLAGS`` (shell words) is appended to every compile and link command,
for instance ``-lineinfo`` for a profiler's source view, or a ``-D`` that turns on a kernel
variant; the flags are part of the cache key, and a prebuilt library is not used while it is set.

A failed build is logged once with the compiler's message, the ops fall back to the reference
and the registry says why; ``RADIANCE_STRICT=1`` raises instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from radiance.kernels import registry

logger = logging.getLogger("vllm.radiance.kernels")

ABI_VERSION = 12  # 2: the peer all-reduce exports; 3: the block-FP8 decode GEMM; 4: its wgmma kernel;
# 5: its TMA kernel; 6: the decode GEMMs' overlap_next launch argument; 7: their l2_prefetch one;
# 8: the split-KV attention partial pass; 9: its keys_per_warp argument; 10: its warpgroup-MMA form;
# 11: radiance_set_split_row_sum; 12: without it again
LIB_NAME = "libradiance_kernels.so"
OPS = ("add_rms_quant", "silu_mul_quant", "gdn_norm_quant", "ar_add_rms_quant", "block_fp8_mm")
CSRC_DIR = Path(__file__).resolve().parent / "csrc"
PREBUILT_DIR = Path(__file__).resolve().parent / "prebuilt"
_SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp")
_COMMON_FLAGS = ("-O3", "-std=c++17")

# The pip-installed CUDA 13 toolkit (the ``[cuda]`` extra): every wheel unpacks into one
# CUDA_HOME-like tree, nvidia/cu13/{bin,include,lib,nvvm}.
_PIP_NVCC = ("nvidia-cuda-nvcc", "nvidia/cu13/bin/nvcc")


class BuildError(RuntimeError):
    """The compiler failed, or no compiler was found; the message says which and why."""


def strict() -> bool:
    return os.environ.get("RADIANCE_STRICT", "0") not in ("", "0")


def cache_root() -> Path:
    env = os.environ.get("RADIANCE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "radiance"


def _private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) 0700; refuse a directory another user owns."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid():
        raise BuildError(f"cache directory {path} is owned by uid {st.st_uid}, not this user")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def source_files(csrc: Path | None = None) -> list[Path]:
    """Every file the build reads (sources and headers), in a stable order."""
    csrc = CSRC_DIR if csrc is None else csrc
    if not csrc.is_dir():
        return []
    return sorted(p for p in csrc.iterdir() if p.is_file() and p.suffix in _SOURCE_SUFFIXES)


def source_hash(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- toolchain


@dataclass(frozen=True)
class Toolchain:
    """A compiler and the arch-independent flags it needs."""

    kind: str  # "nvcc" or "hipcc"
    path: str
    version: str
    flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    @property
    def vendor(self) -> str:
        """The ``device_arch`` vendor this compiler builds for."""
        return "cuda" if self.kind == "nvcc" else "hip"

    def arch_flags(self, arch: str) -> list[str]:
        if self.kind == "nvcc":
            return [f"-gencode=arch=compute_{arch},code=sm_{arch}"]
        return [f"--offload-arch={arch}"]

    def _base(self, arch: str) -> list[str]:
        pic = ["-Xcompiler", "-fPIC"] if self.kind == "nvcc" else ["-fPIC"]
        return [self.path, *self.arch_flags(arch), *_COMMON_FLAGS, *pic, *self.flags]

    def compile_command(self, source: Path, arch: str, obj: Path) -> list[str]:
        # hipcc takes a .cu for CUDA unless told the language; the link step must not be told
        # (it would read the objects as HIP source).
        lang = ["-x", "hip"] if self.kind == "hipcc" else []
        return [*self._base(arch), "-c", *lang, str(source), "-o", str(obj)]

    def link_command(self, objects: Sequence[Path], arch: str, out: Path) -> list[str]:
        return [*self._base(arch), "-shared", *map(str, objects), "-o", str(out)]


def _version(path: str, env: tuple[tuple[str, str], ...] = ()) -> str:
    """The compiler's identity for the cache key: nvcc's last two lines (release, build); for
    hipcc its HIP and clang version lines. Run with the build's environment, so hipcc reports
    the platform it builds for (on a machine that also has nvcc it would print nvcc's), and read
    from stdout (hipcc may also print a GPU probe's failure on stderr)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, **dict(env)))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = [ln.strip() for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    if any(ln.startswith("HIP version") for ln in lines):
        lines = [ln for ln in lines if "version" in ln.lower()]
    return " | ".join(lines[-2:]) if lines else "unknown"


def _pip_nvcc() -> Path | None:
    from importlib import metadata

    dist, rel = _PIP_NVCC
    try:
        path = Path(metadata.distribution(dist).locate_file(rel))
    except metadata.PackageNotFoundError:
        return None
    return path if path.is_file() else None


def _nvcc_candidates() -> list[Path]:
    cands: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            cands.append(Path(os.environ[var]) / "bin" / "nvcc")
    which = shutil.which("nvcc")
    if which:
        cands.append(Path(which))
    pip = _pip_nvcc()
    if pip is not None:
        cands.append(pip)
    cands.append(Path("/usr/local/cuda/bin/nvcc"))
    return cands


def _nvcc_flags(nvcc: Path) -> tuple[str, ...]:
    # nvcc.profile looks for the static runtime in <root>/lib64; the pip wheels put it in
    # <root>/lib, so point the linker there when that is the layout.
    root = nvcc.resolve().parent.parent
    if not (root / "lib64").is_dir() and (root / "lib" / "libcudart_static.a").is_file():
        return (f"-L{root / 'lib'}",)
    return ()


EXTRA_FLAGS_ENV = "RADIANCE_KERNELS_EXTRA_FLAGS"


def extra_flags() -> tuple[str, ...]:
    """The user's extra compiler flags (``RADIANCE_KERNELS_EXTRA_FLAGS``, shell words)."""
    return tuple(shlex.split(os.environ.get(EXTRA_FLAGS_ENV, "")))


def find_nvcc() -> Toolchain | None:
    for cand in _nvcc_candidates():
        if cand.is_file() and os.access(cand, os.X_OK):
            return Toolchain("nvcc", str(cand), _version(str(cand)), _nvcc_flags(cand) + extra_flags())
    return None


def find_hipcc() -> Toolchain | None:
    cands = []
    for var in ("ROCM_PATH", "HIP_PATH"):
        if os.environ.get(var):
            cands.append(Path(os.environ[var]) / "bin" / "hipcc")
    which = shutil.which("hipcc")
    if which:
        cands.append(Path(which))
    cands.append(Path("/opt/rocm/bin/hipcc"))
    for cand in cands:
        if cand.is_file() and os.access(cand, os.X_OK):
            env = (("HIP_PLATFORM", "amd"),)
            return Toolchain("hipcc", str(cand), _version(str(cand), env), extra_flags(), env)
    return None


def device_arch(device_index: int = 0) -> tuple[str, str]:
    """(vendor, arch) of a visible GPU: ("cuda", "90a") / ("cuda", "89") / ("hip", "gfx942")."""
    import torch

    if torch.version.hip is not None:
        name = torch.cuda.get_device_properties(device_index).gcnArchName
        return "hip", name.split(":")[0]
    major, minor = torch.cuda.get_device_capability(device_index)
    # sm_90a: Hopper's arch-specific target (wgmma, setmaxnreg); plain sm_XY elsewhere.
    return "cuda", f"{major}{minor}{'a' if (major, minor) == (9, 0) else ''}"


# --------------------------------------------------------------------------- build + cache


@dataclass(frozen=True)
class BuildSpec:
    toolchain: Toolchain
    arch: str
    sources: tuple[Path, ...]
    src_hash: str = field(default="")

    @property
    def key(self) -> str:
        h = hashlib.sha256()
        for part in (self.src_hash, self.arch, self.toolchain.kind, self.toolchain.version,
                     " ".join(self.toolchain.flags), str(ABI_VERSION)):
            h.update(part.encode() + b"\0")
        return f"{self.toolchain.kind}-{self.arch}-{h.hexdigest()[:20]}"


def make_spec(toolchain: Toolchain, arch: str, sources: Sequence[Path] | None = None) -> BuildSpec:
    files = source_files() if sources is None else list(sources)
    return BuildSpec(toolchain, arch, tuple(files), source_hash(files))


def _cached_ok(lib: Path, meta: Path, spec: BuildSpec) -> str | None:
    """None when the cached library may be loaded, else why it must be rebuilt."""
    if not lib.is_file() or not meta.is_file():
        return "not built yet"
    uid = os.getuid()
    for p in (lib, meta):
        owner = p.stat().st_uid
        if owner != uid:
            return f"{p.name} is owned by uid {owner}, not this user"
    try:
        record = json.loads(meta.read_text())
    except (OSError, ValueError) as exc:
        return f"unreadable build record ({exc})"
    if record.get("source_hash") != spec.src_hash:
        return "recorded source hash does not match the sources"
    if record.get("lib_sha256") != _file_digest(lib):
        return "library digest does not match its build record"
    return None


def _record(spec: BuildSpec, lib: Path) -> dict:
    """What ``build.json`` says of a library: checked before it is ever loaded."""
    return {
        "source_hash": spec.src_hash,
        "lib_sha256": _file_digest(lib),
        "arch": spec.arch,
        "compiler": spec.toolchain.path,
        "compiler_version": spec.toolchain.version,
        "flags": list(spec.toolchain.flags),
        "sources": [p.name for p in spec.sources],
        "abi_version": ABI_VERSION,
    }


def _run(cmd: list[str], spec: BuildSpec) -> None:
    env = dict(os.environ, **dict(spec.toolchain.env))
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{spec.toolchain.kind} could not run: {exc}") from exc
    if res.returncode != 0:
        msg = (res.stderr or res.stdout).strip()
        raise BuildError(f"{spec.toolchain.kind} failed (exit {res.returncode}):\n{msg}")


def _compile(spec: BuildSpec, out: Path) -> None:
    # Each source is a separate translation unit holding dozens of template instantiations;
    # compiling them side by side, then linking, takes the build from the sum of the files'
    # times to about the slowest one's on a machine with a core per file.
    from concurrent.futures import ThreadPoolExecutor

    sources = [p for p in spec.sources if p.suffix == ".cu"]
    tc = spec.toolchain
    with tempfile.TemporaryDirectory(prefix="radiance-build-") as tmp:
        objects = [Path(tmp) / f"{p.stem}.o" for p in sources]
        cmds = [tc.compile_command(src, spec.arch, obj) for src, obj in zip(sources, objects)]
        logger.info("building radiance kernels (%d sources in parallel): %s",
                    len(cmds), " ".join(cmds[0]))
        workers = max(1, min(len(cmds), os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for fut in [pool.submit(_run, cmd, spec) for cmd in cmds]:
                fut.result()
        _run(tc.link_command(objects, spec.arch, out), spec)


def _replace_foreign(path: Path) -> None:
    """Remove a file we will not trust so the new build can take its name."""
    if path.exists() or path.is_symlink():
        path.unlink()


def build(spec: BuildSpec, cache: Path | None = None) -> Path:
    """Return the path of a trusted library for ``spec``, compiling it when needed."""
    from filelock import FileLock

    if not any(p.suffix == ".cu" for p in spec.sources):
        raise BuildError(f"no kernel sources (*.cu) in {CSRC_DIR}")
    base = _private_dir((cache or cache_root()) / "kernels")
    out_dir = base / spec.key
    lib, meta = out_dir / LIB_NAME, out_dir / "build.json"
    with FileLock(str(base / f"{spec.key}.lock"), timeout=1800):
        out_dir.mkdir(mode=0o700, exist_ok=True)
        why = _cached_ok(lib, meta, spec)
        if why is None:
            return lib
        if why != "not built yet":
            logger.warning("rebuilding radiance kernels in %s: %s", out_dir, why)
        _private_dir(out_dir)
        fd, tmp_name = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out_dir)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            _compile(spec, tmp)
            _replace_foreign(lib)
            os.replace(tmp, lib)
        finally:
            if tmp.exists():
                tmp.unlink()
        tmp_meta = out_dir / ".build.json.tmp"
        tmp_meta.write_text(json.dumps(_record(spec, lib), indent=1))
        _replace_foreign(meta)
        os.replace(tmp_meta, meta)
    return lib


# --------------------------------------------------------------------------- ahead of time


def build_prebuilt(spec: BuildSpec, root: Path) -> Path:
    """Compile ``spec`` into ``root/<vendor>-<arch>/`` with its ``build.json`` (the wheel build
    hook's step; the directory goes into the wheel as ``radiance/kernels/prebuilt/``)."""
    if not any(p.suffix == ".cu" for p in spec.sources):
        raise BuildError("no kernel sources (*.cu) to build")
    out_dir = root / f"{spec.toolchain.vendor}-{spec.arch}"
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / LIB_NAME
    _compile(spec, lib)
    (out_dir / "build.json").write_text(json.dumps(_record(spec, lib), indent=1))
    return out_dir


def prebuilt_arches(root: Path | None = None) -> list[str]:
    """The ``<vendor>-<arch>`` libraries this install carries prebuilt (usable or not)."""
    root = PREBUILT_DIR if root is None else root
    return sorted(d.name for d in root.iterdir() if (d / LIB_NAME).is_file()) if root.is_dir() else []


def prebuilt_library(vendor: str, arch: str, root: Path | None = None) -> tuple[Path | None, str]:
    """(the shipped library for this GPU, "") or (None, why it cannot serve). It serves only
    when its record names these sources, this arch and ABI, and its digest matches: a wheel
    whose sources were changed after the build, or a damaged file, falls through to the JIT."""
    if os.environ.get("RADIANCE_KERNELS_PREBUILT", "1") == "0":
        return None, "RADIANCE_KERNELS_PREBUILT=0"
    if extra_flags():
        return None, f"{EXTRA_FLAGS_ENV} is set (the prebuilt library was built without those flags)"
    out_dir = (PREBUILT_DIR if root is None else root) / f"{vendor}-{arch}"
    lib, meta = out_dir / LIB_NAME, out_dir / "build.json"
    if not lib.is_file() or not meta.is_file():
        return None, f"none shipped for {vendor} {arch}"
    try:
        record = json.loads(meta.read_text())
    except (OSError, ValueError) as exc:
        return None, f"unreadable build record ({exc})"
    if record.get("abi_version") != ABI_VERSION or record.get("arch") != arch:
        return None, (f"built for ABI {record.get('abi_version')} / {record.get('arch')}, "
                      f"not {ABI_VERSION} / {arch}")
    if record.get("source_hash") != source_hash(source_files()):
        return None, "built from other sources than the installed ones"
    if record.get("lib_sha256") != _file_digest(lib):
        return None, "library digest does not match its build record"
    return lib, ""


# --------------------------------------------------------------------------- the C ABI


class KernelLibrary:
    """The loaded library with its C functions typed."""

    def __init__(self, path: Path):
        self.path = path
        self._lib = lib = ctypes.CDLL(str(path))
        c_int, c_i64, c_vp, c_f = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
        lib.radiance_abi_version.argtypes = []
        lib.radiance_abi_version.restype = c_int
        lib.radiance_error_string.argtypes = [c_int]
        lib.radiance_error_string.restype = ctypes.c_char_p
        version = lib.radiance_abi_version()
        if version != ABI_VERSION:
            raise BuildError(f"{path} has ABI version {version}, expected {ABI_VERSION}")
        self.add_rms_quant = lib.radiance_add_rms_quant
        self.add_rms_quant.argtypes = [c_vp, c_i64, c_vp, c_vp, c_int, c_vp, c_vp, c_vp,
                                       c_i64, c_i64, c_f, c_int, c_int, c_int, c_int, c_vp]
        self.add_rms_quant.restype = c_int
        self.silu_mul_quant = lib.radiance_silu_mul_quant
        self.silu_mul_quant.argtypes = [c_vp, c_i64, c_vp, c_vp, c_i64, c_i64,
                                        c_int, c_int, c_int, c_vp]
        self.silu_mul_quant.restype = c_int
        self.gdn_norm_quant = lib.radiance_gdn_norm_quant
        self.gdn_norm_quant.argtypes = [c_vp, c_i64, c_vp, c_i64, c_vp, c_int, c_vp, c_vp,
                                        c_i64, c_i64, c_i64, c_f, c_int, c_int, c_int, c_vp]
        self.gdn_norm_quant.restype = c_int
        # The peer-mapped all-reduce (all_reduce.cu, ar_add_rms_quant.cu).
        c_vpp = ctypes.POINTER(c_vp)
        lib.radiance_ipc_handle_bytes.argtypes = []
        lib.radiance_ipc_handle_bytes.restype = c_int
        self.ipc_handle_bytes = lib.radiance_ipc_handle_bytes()
        self.peer_region_alloc = lib.radiance_peer_region_alloc
        self.peer_region_alloc.argtypes = [c_i64, c_vpp, c_vp]
        self.peer_region_open = lib.radiance_peer_region_open
        self.peer_region_open.argtypes = [c_vp, c_vpp]
        self.peer_region_close = lib.radiance_peer_region_close
        self.peer_region_close.argtypes = [c_vp]
        self.peer_region_free = lib.radiance_peer_region_free
        self.peer_region_free.argtypes = [c_vp]
        self.peer_set_create = lib.radiance_peer_set_create
        self.peer_set_create.argtypes = [c_int, c_int, c_vpp, c_i64, c_vpp]
        self.peer_set_destroy = lib.radiance_peer_set_destroy
        self.peer_set_destroy.argtypes = [c_vp]
        self.peer_set_handshake = lib.radiance_peer_set_handshake
        self.peer_set_handshake.argtypes = [c_vp, c_i64, ctypes.POINTER(c_int), c_vp]
        self.all_reduce = lib.radiance_all_reduce
        self.all_reduce.argtypes = [c_vp, c_vp, c_vp, c_i64, c_int, c_vp]
        self.ar_add_rms_quant = lib.radiance_ar_add_rms_quant
        self.ar_add_rms_quant.argtypes = [c_vp, c_vp, c_vp, c_vp, c_int, c_vp, c_vp, c_vp,
                                          c_i64, c_i64, c_f, c_int, c_int, c_int, c_int, c_vp]
        # The block-FP8 decode GEMM (block_fp8_mm.cu).
        lib.radiance_block_fp8_mm_supported.argtypes = []
        lib.radiance_block_fp8_mm_supported.restype = c_int
        self.block_fp8_mm_supported = lib.radiance_block_fp8_mm_supported
        self.block_fp8_mm = lib.radiance_block_fp8_mm
        self.block_fp8_mm.argtypes = [c_vp, c_i64, c_vp, c_i64, c_i64, c_vp, c_i64, c_vp, c_i64,
                                      c_i64, c_vp, c_i64, c_int, c_i64, c_i64, c_i64, c_vp, c_vp,
                                      c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_vp]
        self.block_fp8_mm_tma = lib.radiance_block_fp8_mm_tma  # block_fp8_mm_tma.cu
        self.block_fp8_mm_tma.argtypes = self.block_fp8_mm.argtypes[:18] + [c_int] * 4 + [c_vp]
        # The split-KV attention partial pass (split_kv_attention.cu).
        lib.radiance_split_kv_supported.argtypes = []
        lib.radiance_split_kv_supported.restype = c_int
        self.split_kv_supported = lib.radiance_split_kv_supported
        lib.radiance_split_kv_smem.argtypes = [c_int] * 6
        lib.radiance_split_kv_smem.restype = c_int
        self.split_kv_smem = lib.radiance_split_kv_smem
        self.split_kv_partial = lib.radiance_split_kv_partial
        self.split_kv_partial.argtypes = ([c_vp, c_i64, c_i64] + [c_vp, c_i64, c_i64, c_i64] * 2
                                          + [c_vp, c_i64, c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_f]
                                          + [c_int] * 13 + [c_vp])
        # Its warpgroup-MMA form (split_kv_warpgroup.cu): the same arguments, n_tiles for the warp shape.
        lib.radiance_split_kv_warpgroup_supported.argtypes = []
        lib.radiance_split_kv_warpgroup_supported.restype = c_int
        self.split_kv_warpgroup_supported = lib.radiance_split_kv_warpgroup_supported
        lib.radiance_split_kv_warpgroup_smem.argtypes = [c_int] * 4
        lib.radiance_split_kv_warpgroup_smem.restype = c_int
        self.split_kv_warpgroup_smem = lib.radiance_split_kv_warpgroup_smem
        self.split_kv_warpgroup = lib.radiance_split_kv_warpgroup
        self.split_kv_warpgroup.argtypes = self.split_kv_partial.argtypes[:30] + [c_int, c_int, c_vp]
        # Benchmark and test only: pins an op's launch layout (vpt 0 restores the heuristic).
        self.set_launch_config = lib.radiance_set_launch_config
        self.set_launch_config.argtypes = [c_int] * 5
        self._get_launch_config = lib.radiance_get_launch_config
        self._get_launch_config.argtypes = [c_int, c_i64, c_i64, c_int] + [ctypes.POINTER(c_int)] * 4
        self._get_launch_config.restype = c_int
        for fn in (self.set_launch_config, self.block_fp8_mm, self.block_fp8_mm_tma, self.split_kv_partial,
                   self.split_kv_warpgroup,
                   self.peer_region_alloc, self.peer_region_open, self.peer_region_close,
                   self.peer_region_free, self.peer_set_create, self.peer_set_destroy,
                   self.peer_set_handshake, self.all_reduce, self.ar_add_rms_quant):
            fn.restype = c_int

    def launch_config(self, op: int, m: int, k: int, group: int) -> str:
        """Benchmark only: the layout the launch heuristic picks for epilogue op `op` (0
        add_rms_quant, 1 silu_mul_quant, 2 gdn_norm_quant) at (M, K, grouping), or a "no config"
        line where it has none (no kernel launches there)."""
        cfg = [ctypes.c_int() for _ in range(4)]
        code = self._get_launch_config(op, m, k, group, *map(ctypes.byref, cfg))
        if code != 0:
            return (f"no config: the heuristic has none for op {op} at M={m} K={k} group={group} "
                    f"({self.error_string(code)})")
        return "vpt{} tpr{} rpb{} split{}".format(*(c.value for c in cfg))

    def error_string(self, code: int) -> str:
        raw = self._lib.radiance_error_string(code)
        return raw.decode(errors="replace") if raw else f"error {code}"


# --------------------------------------------------------------------------- first use

_lock = threading.Lock()
_loaded: dict[str, KernelLibrary] = {}
_failed: dict[str, str] = {}


def _first_line(msg: str) -> str:
    for line in msg.splitlines():
        if "error" in line.lower():
            return line.strip()
    return msg.splitlines()[0].strip() if msg else "unknown error"


def _fail(arch_key: str, reason: str, detail: str) -> None:
    """Log once, tell the registry, or raise under RADIANCE_STRICT=1."""
    if arch_key not in _failed:
        _failed[arch_key] = reason
        logger.warning("radiance kernels unavailable, the reference runs instead: %s", detail)
        for op in OPS:
            registry.mark_unavailable(op, reason)
    if strict():
        raise BuildError(detail)


def get(device_index: int = 0) -> KernelLibrary | None:
    """The library for a visible GPU, built on first use; None (reason in ``why_not``) if none."""
    import torch

    if not torch.cuda.is_available():
        return None
    vendor, arch = device_arch(device_index)
    arch_key = f"{vendor}:{arch}"
    lib = _loaded.get(arch_key)
    if lib is not None or arch_key in _failed:
        if lib is None and strict():
            raise BuildError(_failed[arch_key])
        return lib
    with _lock:
        if arch_key in _loaded:
            return _loaded[arch_key]
        if arch_key in _failed:
            if strict():
                raise BuildError(_failed[arch_key])
            return None
        shipped, why = prebuilt_library(vendor, arch)
        if shipped is not None:
            try:
                lib = KernelLibrary(shipped)
            except (BuildError, OSError) as exc:
                logger.warning("radiance's prebuilt kernels for %s do not load (%s); building them", arch, exc)
            else:
                _loaded[arch_key] = lib
                logger.info("radiance kernels loaded for %s from the prebuilt %s", arch, shipped)
                return lib
        elif not why.startswith("none shipped"):
            logger.info("radiance's prebuilt kernels for %s not used: %s", arch, why)
        toolchain = find_hipcc() if vendor == "hip" else find_nvcc()
        if toolchain is None:
            hint = ("hipcc not found (set ROCM_PATH)" if vendor == "hip" else
                    "nvcc not found (install radiance-kernels[cuda] or set CUDA_HOME)")
            _fail(arch_key, hint, hint)
            return None
        try:
            path = build(make_spec(toolchain, arch))
            lib = KernelLibrary(path)
        except (BuildError, OSError) as exc:
            _fail(arch_key, f"kernel build failed for {arch}: {_first_line(str(exc))}", str(exc))
            return None
        _loaded[arch_key] = lib
        logger.info("radiance kernels loaded for %s from %s", arch, path)
        return lib


def why_not(device_index: int = 0) -> str | None:
    """Why no library serves this process's GPU (None when one does)."""
    import torch

    if not torch.cuda.is_available():
        return "no GPU (torch.cuda.is_available() is False): the reference runs"
    if get(device_index) is not None:
        return None
    vendor, arch = device_arch(device_index)
    return _failed.get(f"{vendor}:{arch}", "unknown")


def _reset_for_tests() -> None:
    with _lock:
        _loaded.clear()
        _failed.clear()
