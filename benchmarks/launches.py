"""Where a short training step's time goes on a GPU: how long the GPU computed in it, how many kernels
the host launched, how often the host waited for the GPU. At short lengths a step is bound by
launches and host work rather than by the GPU's rate (ModernBERT-base at 1024 tokens on an H100 ran
at about 10 TFLOP/s, ours and HF's alike): these counts say which, and what to cut.

One torch.profiler step (CPU ops, CUDA runtime calls and device activity) after a warm-up step;
its wall time is not used (the profiler slows the host), the timed steps give it.
"""
from collections import Counter
from typing import NamedTuple

import torch

# host calls that wait for the device (the runtime's, as the profiler names them)
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


class StepLaunches(NamedTuple):
    busy_ms: float  # device time of the step's kernels, copies and fills
    kernels: int  # kernels launched
    to_host: int  # device -> host copies (each one a wait for the queue to drain, unless pinned and async)
    waits: int  # host calls that wait for the device (WAITS)
    top: list  # [(kernel name, calls, device ms)] by device time


def summarize(events, top: int = 5) -> StepLaunches:
    """StepLaunches of a profiler's events (FunctionEvent: name, device_type, time_range.elapsed_us())."""
    busy, kernels, to_host, waits = 0.0, Counter(), 0, 0
    spent = Counter()
    for event in events:
        if getattr(event, "is_user_annotation", False):  # a record_function range (optimizer.step's): no work
            continue
        if event.device_type == torch.autograd.DeviceType.CUDA:
            microseconds = event.time_range.elapsed_us()
            busy += microseconds
            if event.name.startswith("Memcpy DtoH"):
                to_host += 1
            elif not event.name.startswith(("Memcpy", "Memset")):
                kernels[event.name] += 1
                spent[event.name] += microseconds
        elif event.name in WAITS:
            waits += 1
    ranked = [(name, kernels[name], microseconds / 1000) for name, microseconds in spent.most_common(top)]
    return StepLaunches(busy / 1000, sum(kernels.values()), to_host, waits, ranked)


def profile_step(step, batch) -> StepLaunches:
    """StepLaunches of one call of `step(batch)`, after one unprofiled call (without a GPU: no device
    events, zeros)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    step(batch)
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        step(batch)
        if cuda:
            torch.cuda.synchronize()
    return summarize(prof.events())


def launches_table(profiles: dict, step_ms: dict) -> str:
    """Markdown: one row per contestant ({name: StepLaunches}), `step_ms` {name: timed ms per step}."""
    rows = ["| contestant | step ms (timed) | GPU busy ms | busy share | kernels launched | device -> host copies "
            "| host waits | top kernels (calls, ms) |", "|---|---|---|---|---|---|---|---|"]
    for name, launched in profiles.items():
        tops = "; ".join(f"`{kernel[:48]}` ({calls}, {ms:.2f})" for kernel, calls, ms in launched.top[:3])
        rows.append(f"| {name} | {step_ms[name]:.1f} | {launched.busy_ms:.1f} | {launched.busy_ms / step_ms[name]:.0%} "
                    f"| {launched.kernels} | {launched.to_host} | {launched.waits} | {tops} |")
    return "\n".join(rows)
