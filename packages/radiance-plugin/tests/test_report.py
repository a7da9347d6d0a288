import logging

from radiance.kernels import registry
from radiance.plugin import record, report


def test_install_wraps_each_worker_class_once():
    import vllm.v1.worker.cpu_worker as cpu_worker
    import vllm.v1.worker.gpu_worker as gpu_worker

    applied, detail = report.install()
    methods = [cls.__dict__["compile_or_warm_up_model"] for cls in (gpu_worker.Worker, cpu_worker.CPUWorker)]
    applied2, detail2 = report.install()
    # XPUWorker imports here but inherits the GPU worker's warm-up, already wrapped with it.
    assert applied and applied2 and detail == detail2 == "after warm-up on Worker, CPUWorker"
    for cls, method in zip((gpu_worker.Worker, cpu_worker.CPUWorker), methods):
        assert cls.__dict__["compile_or_warm_up_model"] is method, cls.__name__
        assert getattr(method, "_radiance_report_wrapped", False), cls.__name__
        assert not getattr(method.__wrapped__, "_radiance_report_wrapped", False), cls.__name__


def test_install_without_a_worker_class_says_why(monkeypatch, caplog):
    monkeypatch.setattr(report, "WORKER_CLASSES", (("radiance_no_such_worker_module", "Worker"),
                                                   ("vllm.v1.worker.gpu_worker", "NoSuchWorker")))
    with caplog.at_level(logging.DEBUG, logger="vllm.radiance.plugin"):
        applied, detail = report.install()
    assert applied is False
    assert detail == (
        "no vLLM worker class with compile_or_warm_up_model found (not importable: "
        "radiance_no_such_worker_module: ModuleNotFoundError: No module named "
        "'radiance_no_such_worker_module'; vllm.v1.worker.gpu_worker: AttributeError: module "
        "'vllm.v1.worker.gpu_worker' has no attribute 'NoSuchWorker')")
    assert [r.getMessage() for r in caplog.records if r.name == "vllm.radiance.plugin"] == [
        "radiance report: radiance_no_such_worker_module.Worker not importable: ModuleNotFoundError: "
        "No module named 'radiance_no_such_worker_module'",
        "radiance report: vllm.v1.worker.gpu_worker.NoSuchWorker not importable: AttributeError: "
        "module 'vllm.v1.worker.gpu_worker' has no attribute 'NoSuchWorker'",
    ]
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "vllm.radiance.plugin")


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
