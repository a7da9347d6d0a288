"""Which machine the GEMM runs on, in the terms the providers declare: ("cpu" | "cuda" | "rocm",
arch). Arch is "sm90"-style on NVIDIA, the gfx name ("gfx942", "gfx1201") on AMD, "cpu" on CPU.
Read once at load time; nothing on the per-call path asks the driver."""

from __future__ import annotations

import torch


def device_platform(device: torch.device | str | None = None) -> tuple[str, str]:
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cpu":
        return "cpu", "cpu"
    if not torch.cuda.is_available():
        return "cpu", "cpu"
    index = dev.index if dev is not None and dev.index is not None else torch.cuda.current_device()
    if torch.version.hip:
        name = torch.cuda.get_device_properties(index).gcnArchName
        return "rocm", name.split(":")[0]
    major, minor = torch.cuda.get_device_capability(index)
    return "cuda", f"sm{major}{minor}"


def sm_count(device: torch.device | str | None = None) -> int:
    if not torch.cuda.is_available():
        return 1
    dev = torch.device(device) if device is not None else torch.device("cuda")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return int(torch.cuda.get_device_properties(index).multi_processor_count)
