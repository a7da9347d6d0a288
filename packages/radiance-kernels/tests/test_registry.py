from radiance.kernels.registry import Registry, report_lines


def _small_m(query):
    return None if query["M"] <= 64 else f"M={query['M']} > 64"


def _any(query):
    return None


def test_select_first_serving_kernel_and_reason_when_none():
    reg = Registry()
    reg.register("op", "small", impl="small-impl", serves=_small_m)
    hit = reg.select("op", M=8, K=4096)
    assert hit and hit.impl == "small-impl" and hit.kernel.name == "small" and hit.reason == ""
    miss = reg.select("op", M=512, K=4096)
    assert not miss and miss.impl is None
    assert miss.reason == "small: M=512 > 64"


def test_fallthrough_order_and_replace_by_name():
    reg = Registry()
    reg.register("op", "small", impl=1, serves=_small_m)
    reg.register("op", "generic", impl=2, serves=_any)
    assert reg.select("op", M=1).impl == 1
    assert reg.select("op", M=1000).impl == 2
    reg.register("op", "small", impl=3, serves=_small_m)  # replaced, moves last
    assert [k.name for k in reg.kernels("op")] == ["generic", "small"]
    assert reg.select("op", M=1).impl == 2


def test_log_counts_repeats_and_keeps_reasons():
    reg = Registry()
    reg.register("op", "small", impl=1, serves=_small_m)
    for _ in range(3):
        reg.select("op", M=8)
    reg.select("op", M=512)
    reg.select("other", M=1)
    rows = reg.selections()
    assert rows == [
        {"op": "op", "query": {"M": 8}, "kernel": "small", "reason": "", "count": 3},
        {"op": "op", "query": {"M": 512}, "kernel": None, "reason": "small: M=512 > 64", "count": 1},
        {"op": "other", "query": {"M": 1}, "kernel": None,
         "reason": "no kernel registered for 'other'", "count": 1},
    ]


def test_unavailable_reason_and_external_record():
    reg = Registry()
    reg.mark_unavailable("op", "no GPU: the reference runs")
    assert reg.select("op", M=1).reason == "no GPU: the reference runs"
    reg.record("gemm", {"M": 4, "N": 128}, "triton_splitk")
    reg.record("gemm", {"M": 4, "N": 128}, "triton_splitk")
    assert reg.selections()[-1] == {
        "op": "gemm", "query": {"M": 4, "N": 128}, "kernel": "triton_splitk", "reason": "", "count": 2}


def test_report_lines_format():
    reg = Registry()
    reg.register("add_rms_quant", "cuda", impl=1, serves=_small_m)
    reg.select("add_rms_quant", M=8)
    reg.select("add_rms_quant", M=8)
    reg.select("add_rms_quant", M=900)
    lines = report_lines(reg.selections(), "radiance kernel selection")
    assert lines[0] == "radiance kernel selection: 1 of 2 distinct queries resolved to a kernel"
    assert "-> cuda (asked 2x)" in lines[2]
    assert "no kernel, reference runs: cuda: M=900 > 64" in lines[4]
    assert report_lines([], "x") == []
