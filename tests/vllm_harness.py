"""The end-to-end tests' engine runner: radiance.plugin.generate, under the name the tests use."""

from radiance.plugin.generate import (  # noqa: F401
    DEFAULT_LLM_KWARGS,
    DEFAULT_PROMPTS,
    DEFAULT_SAMPLING,
    VllmRunError,
    run_vllm_generate,
)
