import logging

from radiance.kernels import registry
from radiance.plugin import record, report


def test_install_wraps_each_worker_class_once():
    import vllm.v1.worker.cpu_worker as cpu_worker
    import vllm.v1.worker.gpu_worker as gpu_worker

    applied, detail = report.install()
    first = cpu_worker.CPUWorker.__dict__["compile_or_warm_up_model"]
    applied2, _ = report.install()
    assert applied and applied2 and "CPUWorker" in detail and "Worker" in detail
    assert cpu_worker.CPUWorker.__dict__["compile_or_warm_up_model"] is first
    assert getattr(gpu_worker.Worker.compile_or_warm_up_model, "_radiance_report_wrapped", False)


class _FakeWorkerBase:
    def compile_or_warm_up_model(self):
        return "warm"


def test_wrapped_warm_up_prints_once_on_rank_zero(monkeypatch, caplog):
    monkeypatch.setattr(report, "_printed", type(report._printed)())
    record.clear()
    record.add("gemm", "block_fp8_linear", record.INSTALLED, "x")
    registry.REGISTRY.clear_log()
    registry.select("radiance_test_op", M=8)

    warm = report._wrap(_FakeWorkerBase.compile_or_warm_up_model)
    rank1 = type("W", (), {"rank": 1})()
    rank0 = type("W", (), {"rank": 0})()
    with caplog.at_level(logging.INFO, logger="vllm.radiance.plugin"):
        assert warm(rank1) == "warm"
        assert not caplog.records
        assert warm(rank0) == "warm"
        n = len(caplog.records)
        warm(rank0)
    assert len(caplog.records) == n
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "gemm.block_fp8_linear  installed  x" in text
    assert "radiance_test_op" in text and "no kernel registered for 'radiance_test_op'" in text
    record.clear()
    registry.REGISTRY.clear_log()
