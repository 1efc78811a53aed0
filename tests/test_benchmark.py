"""The speed benchmark's measuring helpers (the timings themselves are not unit-tested)."""

import gc
import weakref

import torch

from realformer_tools.experiments import benchmark


class _Softmax(torch.nn.Module):
    """softmax saves its own output for backward: the case that leaked graphs."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))
        self.outputs = []

    def forward(self, src, lengths, prev):
        y = torch.softmax(self.w * src, dim=-1)
        self.outputs.append(weakref.ref(y))
        return y.sum(), None


def test_saved_activation_bytes_counts_what_autograd_keeps_and_keeps_no_graph_alive():
    model = _Softmax()
    src = torch.randn(64, 128)
    batch = (src, None, None, None)
    nbytes = benchmark.saved_activation_bytes(model, batch)
    assert nbytes >= src.numel() * 4  # the softmax output (64 x 128 float32)
    gc.collect()
    assert model.outputs[0]() is None  # the forward's graph was freed with its output
    assert benchmark.saved_activation_bytes(model, batch) == nbytes
