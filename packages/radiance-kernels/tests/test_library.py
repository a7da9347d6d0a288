"""The JIT library: cache key, trust checks, lock, failure handling, strict mode.

These compile a tiny CUDA source with the real nvcc (skipped where there is none). Loading the
result needs no GPU: the static CUDA runtime reaches for the driver only on the first CUDA
call, and these tests call only the host-side ABI functions.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from radiance.kernels import library, ops, reference, registry

NVCC = library.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc")
ARCH = "90a"

GOOD = textwrap.dedent("""
    #include <cuda_runtime.h>
    #include <stdint.h>
    __global__ void touch(float* p) { if (p) p[threadIdx.x] = 1.0f; }
    extern "C" {
    int radiance_abi_version(void) { return ABI; }
    const char* radiance_error_string(int code) { return code ? "tiny failure" : "ok"; }
    int radiance_add_rms_quant(const void*, int64_t, const void*, const void*, int, void*, float*,
        void*, int64_t, int64_t, float, int, int, int, int, void*) { return 0; }
    int radiance_silu_mul_quant(const void*, int64_t, void*, float*, int64_t, int64_t, int, int,
        int, void*) { return 0; }
    int radiance_gdn_norm_quant(const void*, int64_t, const void*, int64_t, const void*, int,
        void*, float*, int64_t, int64_t, int64_t, float, int, int, int, void*) { return 0; }
    int radiance_ipc_handle_bytes(void) { return 64; }
    int radiance_peer_region_alloc(int64_t, void**, void*) { return 0; }
    int radiance_peer_region_open(const void*, void**) { return 0; }
    int radiance_peer_region_close(void*) { return 0; }
    int radiance_peer_region_free(void*) { return 0; }
    int radiance_peer_set_create(int, int, void* const*, int64_t, void**) { return 0; }
    int radiance_peer_set_destroy(void*) { return 0; }
    int radiance_peer_set_handshake(const void*, int64_t, int*, void*) { return 0; }
    int radiance_all_reduce(const void*, const void*, void*, int64_t, int, void*) { return 0; }
    int radiance_ar_add_rms_quant(const void*, const void*, const void*, const void*, int, void*,
        float*, void*, int64_t, int64_t, float, int, int, int, int, void*) { return 0; }
    int radiance_set_launch_config(int, int, int, int, int) { return 0; }
    int radiance_get_launch_config(int, int64_t, int64_t K, int, int* vpt, int* tpr, int* rpb,
        int* split) {
      *vpt = K > 24576 ? 0 : 2; *tpr = K > 24576 ? 0 : 64; *rpb = 1; *split = 1;
      return K > 24576 ? 1 : 0;
    }
    int radiance_block_fp8_mm_supported(void) { return 0; }
    int radiance_block_fp8_mm(const void*, int64_t, const float*, int64_t, int64_t, const void*,
        int64_t, const float*, int64_t, int64_t, void*, int64_t, int, int64_t, int64_t, int64_t,
        float*, int*, int, int, int, int, int, int, int, void*) { return 0; }
    int radiance_block_fp8_mm_tma(const void*, int64_t, const float*, int64_t, int64_t,
        const void*, int64_t, const float*, int64_t, int64_t, void*, int64_t, int, int64_t,
        int64_t, int64_t, float*, int*, int, int, int, int, void*) { return 0; }
    int radiance_split_kv_supported(void) { return 0; }
    int radiance_split_kv_smem(int, int, int, int, int, int) { return 0; }
    int radiance_split_kv_partial(void) { return 0; }
    int radiance_split_kv_warpgroup_supported(void) { return 0; }
    int radiance_split_kv_warpgroup_smem(int, int, int, int) { return 0; }
    int radiance_split_kv_warpgroup(void) { return 0; }
    }
""")


def _write(dir_: Path, text: str, abi: int = library.ABI_VERSION, name: str = "tiny.cu") -> Path:
    dir_.mkdir(parents=True, exist_ok=True)
    (dir_ / name).write_text(text.replace("return ABI;", f"return {abi};"))
    (dir_ / "portable.h").write_text("// header hashed with the sources\n")
    return dir_


@pytest.fixture
def counted(monkeypatch):
    """Count real compiler runs."""
    calls = []
    real = library._compile

    def compile_(spec, out):
        calls.append(spec.key)
        real(spec, out)

    monkeypatch.setattr(library, "_compile", compile_)
    return calls


def _spec(csrc: Path):
    return library.make_spec(NVCC, ARCH, library.source_files(csrc))


@needs_nvcc
def test_build_caches_privately_and_loads(tmp_path, counted):
    spec = _spec(_write(tmp_path / "src", GOOD))
    cache = tmp_path / "cache"
    lib = library.build(spec, cache)
    assert counted == [spec.key]
    assert stat.S_IMODE((cache / "kernels").stat().st_mode) == 0o700
    assert stat.S_IMODE(lib.parent.stat().st_mode) == 0o700
    record = json.loads((lib.parent / "build.json").read_text())
    assert record["source_hash"] == spec.src_hash and record["arch"] == ARCH
    assert record["compiler_version"] == NVCC.version
    assert library.build(spec, cache) == lib and len(counted) == 1  # cache hit
    loaded = library.KernelLibrary(lib)
    assert loaded.error_string(3) == "tiny failure"
    assert loaded.add_rms_quant(None, 0, None, None, 0, None, None, None, 0, 0, 1e-6,
                                0, 0, 0, 0, None) == 0
    assert loaded.launch_config(0, 8, 4096, 0) == "vpt2 tpr64 rpb1 split1"
    # A shape the heuristic rejects (the tiny source: K > 24576) says so instead of "vpt0 ...".
    assert loaded.launch_config(0, 8, 32768, 0) == (
        "no config: the heuristic has none for op 0 at M=8 K=32768 group=0 (tiny failure)")


@needs_nvcc
def test_key_changes_with_sources_arch_and_compiler(tmp_path):
    base = _spec(_write(tmp_path / "a", GOOD))
    header_changed = _write(tmp_path / "b", GOOD)
    (header_changed / "portable.h").write_text("// another header\n")
    assert library.make_spec(NVCC, ARCH, library.source_files(header_changed)).key != base.key
    assert library.make_spec(NVCC, "89", base.sources).key != base.key
    other = library.Toolchain(NVCC.kind, NVCC.path, NVCC.version + " patched", NVCC.flags)
    assert library.make_spec(other, ARCH, base.sources).key != base.key


@needs_nvcc
def test_extra_flags_reach_every_command_and_the_cache_key(tmp_path, monkeypatch):
    src = _write(tmp_path / "a", GOOD)
    plain = library.make_spec(library.find_nvcc(), ARCH, library.source_files(src))
    monkeypatch.setenv(library.EXTRA_FLAGS_ENV, "-lineinfo '-DRADIANCE_SOME_VARIANT=1'")
    nvcc = library.find_nvcc()
    assert nvcc.flags[-2:] == ("-lineinfo", "-DRADIANCE_SOME_VARIANT=1")
    spec = library.make_spec(nvcc, ARCH, library.source_files(src))
    assert spec.key != plain.key
    for cmd in (nvcc.compile_command(src / "tiny.cu", ARCH, tmp_path / "o"),
                nvcc.link_command([tmp_path / "o"], ARCH, tmp_path / "lib.so")):
        assert "-lineinfo" in cmd and "-DRADIANCE_SOME_VARIANT=1" in cmd
    lib = library.build(spec, tmp_path / "cache")  # a real compile with the flags
    assert json.loads((lib.parent / "build.json").read_text())["flags"][-2:] == list(nvcc.flags[-2:])


@needs_nvcc
def test_recorded_hash_mismatch_or_tampered_library_is_rebuilt(tmp_path, counted):
    spec = _spec(_write(tmp_path / "src", GOOD))
    lib = library.build(spec, tmp_path / "cache")
    meta = lib.parent / "build.json"
    record = json.loads(meta.read_text())
    meta.write_text(json.dumps(dict(record, source_hash="0" * 64)))
    assert library.build(spec, tmp_path / "cache") == lib and len(counted) == 2
    assert json.loads(meta.read_text())["source_hash"] == spec.src_hash
    with open(lib, "ab") as f:
        f.write(b"\0")
    library.build(spec, tmp_path / "cache")
    assert len(counted) == 3
    assert library._cached_ok(lib, meta, spec) is None


@needs_nvcc
@pytest.mark.skipif(os.getuid() != 0, reason="changing a file's owner needs root")
def test_foreign_owned_library_is_rebuilt_not_loaded(tmp_path, counted):
    spec = _spec(_write(tmp_path / "src", GOOD))
    lib = library.build(spec, tmp_path / "cache")
    os.chown(lib, 4242, 4242)
    assert "owned by uid 4242" in library._cached_ok(lib, lib.parent / "build.json", spec)
    library.build(spec, tmp_path / "cache")
    assert len(counted) == 2 and lib.stat().st_uid == os.getuid()


@pytest.mark.skipif(os.getuid() != 0, reason="changing a directory's owner needs root")
def test_foreign_owned_cache_dir_is_refused(tmp_path):
    foreign = tmp_path / "cache" / "kernels"
    foreign.mkdir(parents=True)
    os.chown(foreign, 4242, 4242)
    spec = library.BuildSpec(library.Toolchain("nvcc", "nvcc", "v"), ARCH, (Path("x.cu"),), "h")
    with pytest.raises(library.BuildError, match="owned by uid 4242"):
        library.build(spec, tmp_path / "cache")


@needs_nvcc
def test_parallel_builders_compile_once(tmp_path):
    src = _write(tmp_path / "src", GOOD)
    marker = tmp_path / "compiles.txt"
    child = textwrap.dedent(f"""
        from pathlib import Path
        from radiance.kernels import library
        real = library._compile
        def compile_(spec, out):
            with open({str(marker)!r}, "a") as f:
                f.write("compiled\\n")
            real(spec, out)
        library._compile = compile_
        spec = library.make_spec(library.find_nvcc(), {ARCH!r}, library.source_files(Path({str(src)!r})))
        print(library.build(spec, Path({str(tmp_path / "cache")!r})))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1
    assert marker.read_text().count("compiled") == 1


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """Make first use run on this machine: a GPU claimed present, sm_90a, a chosen csrc."""
    monkeypatch.setenv("RADIANCE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(library, "device_arch", lambda index=0: ("cuda", ARCH))
    library._reset_for_tests()
    ops._reset_decisions_for_tests()
    yield lambda csrc: monkeypatch.setattr(library, "CSRC_DIR", csrc)
    library._reset_for_tests()
    ops._reset_decisions_for_tests()
    for op in ops.EPILOGUE_OPS:  # put the registered kernels back (registering clears the mark)
        registry.register(op, ops.KERNEL_NAME, library.get, ops._serves)


@needs_nvcc
def test_first_use_builds_and_loads(fake_gpu, tmp_path):
    fake_gpu(_write(tmp_path / "src", GOOD))
    lib = library.get()
    assert isinstance(lib, library.KernelLibrary) and library.get() is lib
    assert library.why_not() is None
    assert lib.path.is_relative_to(tmp_path / "cache")


@needs_nvcc
def test_wrong_abi_version_is_unavailable(fake_gpu, tmp_path):
    fake_gpu(_write(tmp_path / "src", GOOD, abi=1))
    assert library.get() is None
    assert f"ABI version 1, expected {library.ABI_VERSION}" in library.why_not()


def test_the_source_reports_the_abi_version_the_loader_expects():
    """abi.cu's radiance_abi_version is the loader's ABI_VERSION: bumping one without the other
    makes every fresh build unloadable, which only a GPU run would otherwise show."""
    import re

    text = (library.CSRC_DIR / "abi.cu").read_text()
    found = re.findall(r"int radiance_abi_version\(void\)\s*\{\s*return\s+(\d+)\s*;", text)
    assert found == [str(library.ABI_VERSION)]


BAD = "__global__ void broken( { }\n"


@needs_nvcc
def test_build_failure_logs_once_marks_unavailable_and_reference_runs(fake_gpu, tmp_path, caplog, monkeypatch):
    fake_gpu(_write(tmp_path / "src", BAD, name="broken.cu"))
    with caplog.at_level(logging.WARNING, logger="vllm.radiance.kernels"):
        assert library.get() is None
        assert library.get() is None
        reason = library.why_not()
    warnings = [r for r in caplog.records if "radiance kernels unavailable" in r.getMessage()]
    assert len(warnings) == 1
    assert "nvcc failed" in warnings[0].getMessage() and "broken.cu" in warnings[0].getMessage()
    assert reason.startswith(f"kernel build failed for {ARCH}:") and "error" in reason
    assert registry.REGISTRY._unavailable["add_rms_quant"] == reason
    sel = registry.select("gdn_norm_quant", device="cuda", device_index=0, dtype="bfloat16",
                          K=4096, group=128, fp8="float8_e4m3fn")
    assert not sel and reason in sel.reason
    # An op call decided as on the GPU (CPU tensors would take the reference for their device
    # alone, whatever the build did) runs the reference, bit for bit.
    decide = ops._kernel
    monkeypatch.setattr(ops, "_kernel", lambda op, device, *rest: decide(op, torch.device("cuda", 0), *rest))
    g = torch.Generator().manual_seed(0)
    y, res = (torch.randn(4, 4096, generator=g).to(torch.bfloat16) for _ in range(2))
    w = torch.randn(4096, generator=g).to(torch.bfloat16)
    got = ops.add_rms_quant(y, res, w, 1e-6, group=128)
    want = reference.add_rms_quant(y, res, w, 1e-6, group=128)
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert any(r["op"] == "add_rms_quant" and r["query"]["device"] == "cuda" and r["kernel"] is None
               and reason in r["reason"] for r in registry.selections())


@needs_nvcc
def test_strict_raises_on_build_failure(fake_gpu, tmp_path, monkeypatch):
    fake_gpu(_write(tmp_path / "src", BAD, name="broken.cu"))
    monkeypatch.setenv("RADIANCE_STRICT", "1")
    with pytest.raises(library.BuildError, match="nvcc failed"):
        library.get()
    with pytest.raises(library.BuildError):
        library.get()


def test_missing_compiler_says_how_to_get_one(fake_gpu, tmp_path, monkeypatch):
    fake_gpu(_write(tmp_path / "src", GOOD))
    monkeypatch.setattr(library, "find_nvcc", lambda: None)
    assert library.get() is None
    assert "install radiance-kernels[cuda]" in library.why_not()


def test_pip_toolkit_layout_gets_its_library_dir(tmp_path):
    root = tmp_path / "nvidia" / "cu13"
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "lib" / "libcudart_static.a").write_bytes(b"")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("")
    assert library._nvcc_flags(nvcc) == (f"-L{root / 'lib'}",)
    (root / "lib64").mkdir()
    assert library._nvcc_flags(nvcc) == ()


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIANCE_CACHE_DIR", str(tmp_path / "x"))
    assert library.cache_root() == tmp_path / "x"
    monkeypatch.delenv("RADIANCE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert library.cache_root() == tmp_path / "xdg" / "radiance"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert library.cache_root() == Path.home() / ".cache" / "radiance"


# --------------------------------------------------------------------------- prebuilt (wheel)


@pytest.fixture
def prebuilt(fake_gpu, tmp_path, monkeypatch):
    """A tiny library built ahead of time into a prebuilt tree the loader looks in."""
    src = _write(tmp_path / "src", GOOD)
    fake_gpu(src)
    root = tmp_path / "prebuilt"
    monkeypatch.setattr(library, "PREBUILT_DIR", root)
    out_dir = library.build_prebuilt(library.make_spec(NVCC, ARCH, library.source_files(src)), root)
    return src, out_dir


@needs_nvcc
def test_prebuilt_library_serves_without_a_compiler(prebuilt, tmp_path, monkeypatch):
    src, out_dir = prebuilt
    assert out_dir == tmp_path / "prebuilt" / f"cuda-{ARCH}"
    monkeypatch.setattr(library, "find_nvcc", lambda: None)
    lib = library.get()
    assert isinstance(lib, library.KernelLibrary) and lib.path == out_dir / library.LIB_NAME
    assert library.why_not() is None
    assert not (tmp_path / "cache" / "kernels").exists()  # nothing compiled, nothing cached


@needs_nvcc
@pytest.mark.parametrize("change", ["sources", "library", "abi", "arch", "switched_off", "extra_flags"])
def test_prebuilt_library_that_cannot_serve_falls_through_to_the_jit_build(prebuilt, tmp_path, monkeypatch,
                                                                             change):
    src, out_dir = prebuilt
    meta = out_dir / "build.json"
    record = json.loads(meta.read_text())
    why = {"sources": "other sources", "library": "digest", "abi": "ABI", "arch": "ABI",
           "switched_off": "RADIANCE_KERNELS_PREBUILT=0", "extra_flags": library.EXTRA_FLAGS_ENV}[change]
    if change == "sources":  # the installed sources changed after the wheel was built
        (src / "portable.h").write_text("// edited after the build\n")
    elif change == "library":
        with open(out_dir / library.LIB_NAME, "ab") as f:
            f.write(b"\0")
    elif change == "abi":
        meta.write_text(json.dumps(dict(record, abi_version=library.ABI_VERSION - 1)))
    elif change == "arch":
        meta.write_text(json.dumps(dict(record, arch="89")))
    elif change == "extra_flags":  # the prebuilt library was built without them
        monkeypatch.setenv(library.EXTRA_FLAGS_ENV, "-DRADIANCE_SOME_VARIANT=1")
    else:
        monkeypatch.setenv("RADIANCE_KERNELS_PREBUILT", "0")
    path, reason = library.prebuilt_library("cuda", ARCH)
    assert path is None and why in reason
    lib = library.get()
    assert lib is not None and lib.path.is_relative_to(tmp_path / "cache")  # built here instead


def test_no_prebuilt_for_another_arch(tmp_path):
    path, reason = library.prebuilt_library("cuda", "100a", root=tmp_path)
    assert path is None and reason == "none shipped for cuda 100a"


HATCHLING = subprocess.run([sys.executable, "-c", "import hatchling"], capture_output=True).returncode == 0


def _wheel(tmp_path: Path, archs: str | None) -> Path:
    """Build this package's wheel from a copy whose csrc is the tiny source."""
    pkg = Path(__file__).resolve().parents[1]
    tree = tmp_path / f"pkg-{archs}"
    for name in ("pyproject.toml", "hatch_build.py", "README.md"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes((pkg / name).read_bytes())
    shutil.copytree(pkg / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    _write(tree / "src" / "radiance" / "kernels" / "csrc", GOOD)
    env = {k: v for k, v in os.environ.items() if k != "RADIANCE_KERNELS_AOT_ARCHS"}
    if archs:
        env["RADIANCE_KERNELS_AOT_ARCHS"] = archs
    out = tmp_path / f"dist-{archs}"
    proc = subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return wheel


@needs_nvcc
@pytest.mark.skipif(not HATCHLING, reason="needs hatchling")
def test_wheel_carries_the_prebuilt_library_it_was_asked_for(tmp_path, monkeypatch):
    import zipfile

    wheel = _wheel(tmp_path, ARCH)
    assert wheel.name.endswith(".whl") and "-py3-none-" in wheel.name and "-any.whl" not in wheel.name
    root = tmp_path / "installed"
    zipfile.ZipFile(wheel).extractall(root)
    kernels = root / "radiance" / "kernels"
    shipped = kernels / "prebuilt" / f"cuda-{ARCH}"
    assert sorted(p.name for p in shipped.iterdir()) == ["build.json", library.LIB_NAME]
    (wheel_meta,) = root.glob("*.dist-info/WHEEL")
    assert "Root-Is-Purelib: false" in wheel_meta.read_text()  # a binary: platlib
    # As installed: the wheel's own sources match the record, and the library loads.
    monkeypatch.setattr(library, "CSRC_DIR", kernels / "csrc")
    path, reason = library.prebuilt_library("cuda", ARCH, root=kernels / "prebuilt")
    assert path == shipped / library.LIB_NAME, reason
    assert library.KernelLibrary(path).error_string(1) == "tiny failure"

    plain = _wheel(tmp_path, None)  # nothing asked for: a pure-Python wheel, no prebuilt tree
    assert plain.name.endswith("-py3-none-any.whl")
    assert not any("prebuilt" in n for n in zipfile.ZipFile(plain).namelist())


@needs_nvcc
@pytest.mark.skipif(not HATCHLING, reason="needs hatchling")
def test_wheel_build_fails_for_an_arch_that_does_not_build(tmp_path):
    with pytest.raises(AssertionError, match="nvcc failed"):
        _wheel(tmp_path, "bogus")


def test_hipcc_is_told_the_language_when_compiling_not_when_linking(tmp_path):
    tc = library.Toolchain("hipcc", "hipcc", "v", (), (("HIP_PLATFORM", "amd"),))
    compile_ = tc.compile_command(Path("k.cu"), "gfx942", Path("k.o"))
    assert compile_[compile_.index("-x"):compile_.index("-x") + 3] == ["-x", "hip", "k.cu"]
    assert "--offload-arch=gfx942" in compile_
    link = tc.link_command([Path("a.o"), Path("b.o")], "gfx942", Path("lib.so"))
    assert "-x" not in link and "--offload-arch=gfx942" in link and "-shared" in link


def test_hipcc_version_is_its_own_under_the_build_environment(tmp_path):
    fake = tmp_path / "hipcc"
    fake.write_text(textwrap.dedent("""\
        #!/bin/sh
        if [ "$HIP_PLATFORM" = amd ]; then
          printf 'HIP version: 6.2.1\\nAMD clang version 18.0.0\\nTarget: x86_64\\nInstalledDir: /x\\n'
          echo 'Traceback: no /sys/class/kfd' >&2
        else
          printf 'nvcc: NVIDIA (R) Cuda compiler driver\\nCuda compilation tools, release 13.0\\n'
        fi
    """))
    fake.chmod(0o755)
    assert library._version(str(fake), (("HIP_PLATFORM", "amd"),)) == "HIP version: 6.2.1 | AMD clang version 18.0.0"
    assert "Cuda" in library._version(str(fake))
