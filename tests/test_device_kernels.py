"""CUDA's hidden conversions: format-conversion device kernels read from the profiler's event
tree below each recorded op. No GPU here: the tree is synthetic, shaped like torch's
(``experimental_event_tree``: name, children, start_time_ns, duration_time_ns, a device's
kernels below the runtime call that launched them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from auditor._recording import _profile
from auditor._recording._profile import CONVERSION_KERNELS, HIDDEN_COLUMNS, conversion_kernel, join
from auditor._recording._torch import MODE_RECORD


@dataclass
class Event:
    name: str
    start_time_ns: int
    duration_time_ns: int
    children: list = field(default_factory=list)
    device_type: str = "CPU"
    parent: object = None
    extra_fields: object = field(default_factory=lambda: SimpleNamespace(inputs=[]))

    @property
    def end_time_ns(self) -> int:
        return self.start_time_ns + self.duration_time_ns

    def __post_init__(self):
        for c in self.children:
            c.parent = self


def _kernel(name, start, dur):
    return Event("cudaLaunchKernel", start, 5, [Event(name, start + 10, dur, device_type="CUDA")])


def _tree():
    conv = Event("aten::convolution", 1000, 900, [
        Event("aten::_convolution", 1010, 880, [
            Event("aten::cudnn_convolution", 1020, 860, [
                _kernel("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>",
                        1030, 120),
                _kernel("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc", 1100, 400),
                _kernel("void cudnn::ops::nhwcToNchwKernel<float, float, float, true, false>", 1600, 90),
            ])])])
    relu = Event("aten::relu", 2000, 100, [Event("aten::clamp_min", 2010, 80, [
        _kernel("void at::native::vectorized_elementwise_kernel<4, ...>", 2020, 30)])])
    bwd = Event("aten::convolution_backward", 3000, 500, [
        _kernel("void convertTensor_kernel<float, float, float, (cudnnKernelDataType_t)0>", 3010, 70),
        _kernel("cudnn_transpose_readWrite_kernel", 3100, 20)])
    return [Event(MODE_RECORD, start - 5, dur + 10, [op]) for start, dur, op in
            ((1000, 900, conv), (2000, 100, relu), (3000, 500, bwd))]


def test_conversion_kernels_are_named_with_their_sources():
    assert all(src for _, _, src in CONVERSION_KERNELS.values())
    assert conversion_kernel("void cudnn::ops::nchwToNhwcKernel<float>")[:2] == ("contiguous", "channels_last")
    assert conversion_kernel("void cudnn::ops::nhwcToNchwKernel<half>")[:2] == ("channels_last", "contiguous")
    assert conversion_kernel("sm80_xmma_fprop_implicit_gemm_nhwc") is None
    assert conversion_kernel("aten::transpose") is None


def test_device_conversions_are_attributed_to_their_ops_with_their_times():
    funcs = [torch.ops.aten.convolution.default, torch.ops.aten.relu.default,
             torch.ops.aten.convolution_backward.default]
    timing = join(funcs, [], SimpleNamespace(experimental_event_tree=_tree))
    assert timing.time_ns == [900, 100, 500]
    rows = [dict(zip(HIDDEN_COLUMNS, r)) for r in timing.hidden]
    assert [(r["seq"], r["kind"], r["from_format"], r["to_format"], r["time_us"]) for r in rows] == [
        (0, "format", "contiguous", "channels_last", 0.12),
        (0, "format", "channels_last", "contiguous", 0.09),
        (2, "format", "other", "other", 0.07),
        (2, "format", "other", "other", 0.02),
    ]
    assert rows[0]["via"].startswith("_convolution > cudnn_convolution > cudaLaunchKernel > void cudnn::ops::nchwToNhwc")
    assert rows[0]["start_us"] == (1040 - 1000) / 1e3  # from the first op's start
    assert all(r["arg"] == "(internal)" for r in rows)


def test_the_profiler_records_cuda_only_where_a_gpu_is_here(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _profile.device_activities() == _profile._CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert len(_profile.device_activities()) == 2
