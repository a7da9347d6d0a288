"""The prebuilt path on a real GPU: a library shipped under ``prebuilt/<vendor>-<arch>/`` serves
the ops with no compiler to be found, and gives the JIT-built library's bits.

The prebuilt tree is the JIT cache's own directory for this GPU (a library and the same
``build.json`` the wheel's build hook writes), so no second compile is needed."""

from __future__ import annotations

import shutil

import pytest
import torch

from test_gpu_exactness import _assert_ok, make_inputs, run_case


@pytest.mark.gpu
def test_prebuilt_library_serves_the_ops(tmp_path, monkeypatch):
    from radiance.kernels import library, ops, registry

    jit = library.get()
    assert jit is not None, library.why_not()
    args, kw = make_inputs("add_rms_quant", 8, 4096, torch.bfloat16, residual=True, seed=11)
    want = ops.add_rms_quant(*args, **kw, group=128)

    vendor, arch = library.device_arch()
    shutil.copytree(jit.path.parent, tmp_path / "prebuilt" / f"{vendor}-{arch}",
                    ignore=shutil.ignore_patterns("*.lock", ".build-*"))
    monkeypatch.setattr(library, "PREBUILT_DIR", tmp_path / "prebuilt")
    monkeypatch.setenv("RADIANCE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(library, "find_nvcc", lambda: None)
    monkeypatch.setattr(library, "find_hipcc", lambda: None)
    library._reset_for_tests()
    ops._reset_decisions_for_tests()
    try:
        lib = library.get()
        assert lib is not None, library.why_not()
        assert lib.path == tmp_path / "prebuilt" / f"{vendor}-{arch}" / library.LIB_NAME
        got = ops.add_rms_quant(*args, **kw, group=128)
        for g, w in zip(got, want):
            assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))
        _assert_ok(run_case("gdn_norm_quant", 64, 4096, torch.float16, 0, seed=12), "prebuilt gdn")
        assert not (tmp_path / "empty-cache" / "kernels").exists()
    finally:
        library._reset_for_tests()
        ops._reset_decisions_for_tests()
        for op in ops.EPILOGUE_OPS:
            registry.register(op, ops.KERNEL_NAME, library.get, ops._serves)
