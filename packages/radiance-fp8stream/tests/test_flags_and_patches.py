"""Flag validation, the plugin hook's contract, and the compile-cache key patch."""

import pytest

from radiance.fp8stream import flags, vllm_patches


@pytest.mark.parametrize("name", [flags.STREAM, flags.GDN_NORM_QUANT])
@pytest.mark.parametrize("bad", ["2", "yes", "on", "true", ""])
def test_bad_flag_values_raise_clear_value_error(monkeypatch, name, bad):
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=f"{name} must be 0 or 1"):
        vllm_patches.install()


def test_defaults_stream_on_gdn_norm_off(monkeypatch):
    monkeypatch.delenv(flags.STREAM, raising=False)
    monkeypatch.delenv(flags.GDN_NORM_QUANT, raising=False)
    assert flags.validate() == (True, False)


def test_stream_off_installs_nothing(monkeypatch):
    monkeypatch.setenv(flags.STREAM, "0")
    applied, detail = vllm_patches.install()
    assert applied is False and "RADIANCE_FP8_STREAM=0" in detail


def test_install_patches_once_and_keys_the_compile_cache(monkeypatch):
    vllm = pytest.importorskip("vllm")  # noqa: F841
    import vllm.envs as envs
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    monkeypatch.setenv(flags.STREAM, "0")
    stock_key = envs.compile_factors()
    monkeypatch.setenv(flags.STREAM, "1")
    assert vllm_patches.install()[0] is True
    loader = BaseModelLoader.load_model
    factors_fn = envs.compile_factors
    assert vllm_patches.install()[0] is True  # idempotent: nothing wrapped twice
    assert BaseModelLoader.load_model is loader and envs.compile_factors is factors_fn
    on = envs.compile_factors()
    assert on[flags.STREAM] == "1" and "radiance.fp8stream.version" in on
    monkeypatch.setenv(flags.GDN_NORM_QUANT, "1")
    assert envs.compile_factors()[flags.GDN_NORM_QUANT] == "1"
    monkeypatch.setenv(flags.STREAM, "0")
    # stream off: exactly vLLM's own key, so stock caches are shared with plain vLLM
    assert envs.compile_factors() == stock_key


def test_demo_reads_the_summary_from_a_selection_log():
    from radiance.fp8stream.demo import compare_lines, summary_from

    line = "fp8 stream on M (tp=1, traced ops): 2 input, 2 mid, 2 act, 0 gdn_norm epilogues over 2 layers; 0 sites left stock"
    rows = [{"op": "block_fp8_linear", "query": {}}, {"op": "fp8stream.rewrite", "query": {"summary": line}}]
    assert summary_from(rows) == line
    assert summary_from(rows[:1]) is None
    lines = compare_lines(["a", "b"], ["a", "c"], line)
    assert lines[0] == line and "identical" in lines[1] and "DIFFERENT" in lines[2]


def test_without_a_compile_cache_key_hook_the_stream_stays_off(monkeypatch):
    pytest.importorskip("vllm")
    import vllm.envs as envs

    monkeypatch.setenv(flags.STREAM, "1")
    monkeypatch.delattr(envs, "compile_factors")
    applied, detail = vllm_patches.install()
    assert applied is False and "compile_factors is missing" in detail
