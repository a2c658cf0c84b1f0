"""Which GPUs MXNet 1.9.1 can run on, checked before training starts.

MXNet 1.9.1's CUDA wheels (mxnet-cu110 … mxnet-cu117) carry machine code (SASS) for compute
capability 5.0, 6.0, 7.0, 8.0 and 8.6 only, and no PTX a newer driver could compile: SASS for
X.y runs on X.z with z ≥ y, so every 5.x–8.x card works and nothing newer (Hopper H100/H200 is
9.0, Blackwell 10.0/12.0) can run a single kernel. Such a card fails deep in the first forward
pass with a CUDA error; a one-operation probe on each requested GPU turns that (and a CPU-only
wheel, or a device that is not there) into a message naming the card and what to install.
"""
from __future__ import annotations

import dataclasses

from ..errors import TrainError, short_reason

WHEEL_ARCHS = ((5, 0), (6, 0), (7, 0), (8, 0), (8, 6))  # SASS in every mxnet-cu11x 1.9.1 wheel
WHEELS = "mxnet-cu110 … mxnet-cu117 (version 1.9.1)"
_NO_KERNEL = ("no kernel image is available", "invalid device function")  # CUDA's words for it


@dataclasses.dataclass(frozen=True)
class GpuProbe:
    """What one GPU said to the probe."""

    cuda_build: bool  # the installed mxnet is a CUDA wheel, not the CPU-only one
    visible: int  # GPUs that wheel sees
    capability: tuple[int, int] | None = None  # e.g. (9, 0); None: unknown
    error: str | None = None  # the one-operation probe's error; None when it ran


def runs_on(capability: tuple[int, int]) -> bool:
    """Whether the wheels' SASS runs on a card of this compute capability (same major, minor ≥)."""
    return any(major == capability[0] and minor <= capability[1] for major, minor in WHEEL_ARCHS)


def probe_gpu(device: int) -> GpuProbe:
    """Run one elementwise operation on GPU ``device`` and read its compute capability."""
    import mxnet as mx

    if not mx.runtime.Features().is_enabled("CUDA"):
        return GpuProbe(cuda_build=False, visible=0)
    visible = mx.context.num_gpus()
    if device >= visible:
        return GpuProbe(cuda_build=True, visible=visible)
    try:
        cc = mx.util.get_cuda_compute_capability(mx.gpu(device))
        capability = (cc // 10, cc % 10)
    except (OSError, RuntimeError):  # no libcuda to ask: the probe below still decides
        capability = None
    try:
        (mx.nd.ones((1,), ctx=mx.gpu(device)) + 1).asnumpy()
        error = None
    except mx.base.MXNetError as e:
        error = short_reason(e, 300)
    return GpuProbe(cuda_build=True, visible=visible, capability=capability, error=error)


def refusal(ctx: str, device: int, p: GpuProbe) -> str | None:
    """Why ``train.ctx`` cannot use GPU ``device``, as one paragraph; None when it can."""
    card = (f"compute capability {p.capability[0]}.{p.capability[1]}" if p.capability
            else "an unknown compute capability")
    supported = (f"MXNet 1.9.1's CUDA wheels, {WHEELS}, hold machine code for compute capability "
                 f"{', '.join(f'{a}.{b}' for a, b in WHEEL_ARCHS)} only and no PTX, so they run on 5.x to 8.x "
                 f"cards (Maxwell to Ada) and on nothing newer (Hopper H100/H200 is 9.0)")
    if not p.cuda_build:
        return (f"train.ctx '{ctx}' asks for GPU {device}, but the installed mxnet is the CPU-only wheel. "
                f"{supported}: on such a card install the one matching your CUDA, e.g. `pip uninstall mxnet && "
                f"pip install mxnet-cu117==1.9.1` for CUDA 11.7; otherwise use ctx: cpu.")
    if device >= p.visible:
        return (f"train.ctx '{ctx}' asks for GPU {device}, but MXNet sees {p.visible} GPU(s) (check nvidia-smi "
                f"and CUDA_VISIBLE_DEVICES). Use " + (f"gpu:0 to gpu:{p.visible - 1}" if p.visible else "")
                + (" or " if p.visible else "") + "ctx: cpu.")
    if p.error is None:
        return None
    if any(s in p.error for s in _NO_KERNEL) or (p.capability is not None and not runs_on(p.capability)):
        return (f"train.ctx '{ctx}': GPU {device} has {card}, and no MXNet kernel can run on it: {supported}. "
                f"Use ctx: cpu, or a card of compute capability 5.0 to 8.9. (The probe said: {p.error}.)")
    return (f"train.ctx '{ctx}': a one-operation test on GPU {device} ({card}) failed: {p.error}. Check the "
            f"driver (nvidia-smi) and that the mxnet-cuXXX wheel matches the installed CUDA, or use ctx: cpu.")


def check_gpus(ctx: str, devices: list[int]) -> None:
    """Refuse ``train.ctx`` before training when a GPU it names cannot run MXNet's kernels."""
    for device in devices:
        why = refusal(ctx, device, probe_gpu(device))
        if why is not None:
            raise TrainError(why)
