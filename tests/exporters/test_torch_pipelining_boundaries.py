"""The exported torch-pipelining file's ``contiguous_boundaries`` (stagesplit/exporters/torch_pipelining.py):
torch's traced stages receive into buffers with the traced tensor's strides, and gloo and NCCL take
contiguous tensors only; tests/exporters/test_export_vision_pipelines.py runs the models it fixes."""

from __future__ import annotations

import pytest


def test_contiguous_boundaries_makes_each_stage_receive_a_contiguous_tensor():
    """In one process: the exported file's ``contiguous_boundaries`` before pipeline() gives the
    stage after a transposed boundary a contiguous input (torch's receive buffer takes its strides),
    and removes its hooks after; without it the traced input keeps the transpose's strides."""
    torch = pytest.importorskip("torch")
    from torch.distributed.pipelining import SplitPoint, pipeline

    class Block(torch.nn.Module):
        def __init__(self, transpose: bool):
            super().__init__()
            self.linear, self.transpose = torch.nn.Linear(6, 6), transpose

        def forward(self, x):
            y = self.linear(x)
            return y.transpose(1, 2).transpose(1, 2) if not self.transpose else y.transpose(1, 2)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = Block(True), torch.nn.Linear(5, 5)

        def forward(self, x):
            return self.second(self.first(x))

    from stagesplit.exporters.torch_pipelining import contiguous_boundaries_source
    ns: dict = {"torch": torch, "SPLIT_POINTS": ["second"]}
    exec(contiguous_boundaries_source(), ns)
    x = torch.randn(3, 5, 6)

    def received(model, hooks: bool):
        handles = ns["contiguous_boundaries"](model) if hooks else []
        try:
            pipe = pipeline(model, mb_args=(x,), split_spec={"second": SplitPoint.BEGINNING})
        finally:
            for h in handles:
                h.remove()
        stage = pipe.get_stage_module(1)
        value = next(n for n in stage.graph.nodes if n.op == "placeholder").meta["val"]
        return value, pipe
    torch.manual_seed(0)
    plain, _ = received(Net(), hooks=False)
    assert not plain.is_contiguous()
    torch.manual_seed(0)
    model = Net()
    fixed, pipe = received(model, hooks=True)
    assert fixed.is_contiguous() and tuple(fixed.shape) == (3, 6, 5)
    assert not model.second._forward_pre_hooks
    torch.manual_seed(0)
    out = pipe(x)                       # the stages run in turn in this process
    torch.testing.assert_close(out[0] if isinstance(out, tuple) else out, Net()(x))
