import importlib.util

import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def staged_dir(tmp_path_factory):
    """vLLM's kernel staged from the installed vLLM, as the GPU harness receives it."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    from radiance.attn import kernel_source

    dest = tmp_path_factory.mktemp("staged_kernel")
    kernel_source.stage(dest)
    return dest


@pytest.fixture(scope="session")
def kernel_module(staged_dir):
    pytest.importorskip("triton")
    from radiance.attn import kernel_source

    return kernel_source.load(staged_dir)
