import logging

import pytest

from radiance.plugin import entry, record


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    entry._reset()
    monkeypatch.delenv("RADIANCE_DISABLE", raising=False)
    yield
    entry._reset()


calls = []


def hook_ok():
    calls.append("ok")
    return True, "did the thing"


def hook_skip():
    calls.append("skip")
    return False, "nothing to do here"


def hook_boom():
    calls.append("boom")
    raise RuntimeError("kernel table is corrupt")


ORDER = (
    ("alpha", "first", f"{__name__}:hook_ok"),
    ("beta", "second", f"{__name__}:hook_boom"),
    ("gamma", "third", f"{__name__}:hook_skip"),
    ("delta", "fourth", f"{__name__}:no_such_function"),
)


def test_hooks_run_in_order_isolated_and_recorded(monkeypatch, caplog):
    monkeypatch.setattr(entry, "INSTALL_ORDER", ORDER)
    calls.clear()
    with caplog.at_level(logging.INFO, logger="vllm.radiance.plugin"):
        entry.register()
    assert calls == ["ok", "boom", "skip"]
    got = [(e.package, e.hook, e.status, e.detail) for e in record.entries()]
    assert got[:3] == [
        ("alpha", "first", record.INSTALLED, "did the thing"),
        ("beta", "second", record.FAILED, "RuntimeError: kernel table is corrupt"),
        ("gamma", "third", record.SKIPPED, "nothing to do here"),
    ]
    assert got[3][:3] == ("delta", "fourth", record.FAILED)
    assert "AttributeError" in got[3][3]
    failed = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert failed[0] == "radiance-beta second failed, left stock: RuntimeError: kernel table is corrupt"
    assert len(failed) == 2


def test_register_is_reentrant(monkeypatch):
    monkeypatch.setattr(entry, "INSTALL_ORDER", ORDER[:1])
    calls.clear()
    entry.register()
    entry.register()
    assert calls == ["ok"]
    assert len(record.entries()) == 1


def test_disable_flag_skips_with_reason(monkeypatch, caplog):
    monkeypatch.setattr(entry, "INSTALL_ORDER", ORDER[:1] + ORDER[2:3])
    monkeypatch.setenv("RADIANCE_DISABLE", " gamma, other ")
    calls.clear()
    with caplog.at_level(logging.WARNING, logger="vllm.radiance.plugin"):
        entry.register()
    assert calls == ["ok"]
    assert record.entries()[1] == record.Entry("gamma", "third", record.SKIPPED, "disabled by RADIANCE_DISABLE")
    # a name that is no package (a typo) disables nothing, and says so
    assert [r.getMessage() for r in caplog.records] == [
        "RADIANCE_DISABLE names no radiance package: other (known: alpha, gamma); "
        "those names disable nothing"]


def test_record_lines_align():
    record.add("gemm", "block_fp8_linear", record.INSTALLED, "first in the block-FP8 kernel list")
    record.add("attn", "attention_configs", record.SKIPPED, "no supported attention kernel")
    lines = record.lines()
    assert lines[0] == "radiance install record:"
    assert lines[1].split() [:2] == ["gemm.block_fp8_linear", "installed"]
    assert lines[1].index("installed") == lines[2].index("skipped")


def test_entry_point_is_declared():
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "radiance"]
    assert len(eps) == 1 and eps[0].value == "radiance.plugin.entry:register"
    assert eps[0].load() is entry.register


def test_real_install_order_names_importable_modules():
    import importlib

    assert [p for p, _, _ in entry.INSTALL_ORDER] == ["gemm", "fp8stream", "attn", "plugin"]
    for _, _, target in entry.INSTALL_ORDER:
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func))


def test_flag_table_defaults_are_the_packages_own():
    from radiance.attn import vllm_patches as attn_patches
    from radiance.fp8stream import flags as stream_flags
    from radiance.plugin.flags import FLAGS

    table = {flag.name: flag.default for flag in FLAGS}
    for name, default in stream_flags.DEFAULTS.items():
        assert table[name] == default, name
    assert table["RADIANCE_ATTN_SCRATCH_MIB"] == str(attn_patches.DEFAULT_SCRATCH_MIB)
