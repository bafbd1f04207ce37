"""The exported torch-pipelining file's ``contiguous_boundaries`` (stagesplit/exporters/torch_pipelining.py):
torch's traced stages receive into buffers with the traced tensor's strides, and gloo and NCCL take
contiguous tensors only; tests/exporters/test_export_traced_pipelines.py runs the models it fixes."""

from __future__ import annotations

import pytest


def test_contiguous_boundaries_makes_every_crossing_tensor_contiguous(no_thread_left):
    """In one process, a model whose first block returns a transposed tensor and an expanded one
    that the second stage reads past its first module (as a Hugging Face encoder's attention mask):
    traced by pipeline(), the second stage's inputs keep those strides; after the exported file's
    ``contiguous_boundaries`` the first stage returns contiguous copies, the second stage's inputs
    are recorded contiguous, the stages compute what the model computes, and an input of the model's
    own that is not contiguous keeps its strides."""
    torch = pytest.importorskip("torch")
    from torch.distributed.pipelining import SplitPoint, pipeline

    class First(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(6, 6)

        def forward(self, x):
            return self.linear(x).transpose(1, 2)              # (3, 6, 5), not contiguous

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second, self.third = First(), torch.nn.Linear(5, 5), torch.nn.Linear(5, 5)

        def forward(self, x):
            scale = x[:, :1, :1].expand(3, 6, 5)                # stride 0 along two dimensions
            return self.third(self.second(self.first(x)) * scale)

    from stagesplit.exporters.torch_pipelining import contiguous_boundaries_source
    ns: dict = {"torch": torch}
    exec(contiguous_boundaries_source(), ns)
    x = torch.randn(3, 5, 6)

    def second_stage_inputs(pipe):
        stage = pipe.get_stage_module(1)
        return [n.meta["val"] for n in stage.graph.nodes if n.op == "placeholder"]

    def first_stage_outputs(pipe):
        stage = pipe.get_stage_module(0)
        output = next(n for n in stage.graph.nodes if n.op == "output")
        return [n.meta["val"] for n in torch.fx.node.map_aggregate(output.args[0], lambda n: n)
                if isinstance(n, torch.fx.Node)] if isinstance(output.args[0], (tuple, list)) else \
            [output.args[0].meta["val"]]

    split = {"second": SplitPoint.BEGINNING}
    torch.manual_seed(0)
    plain = pipeline(Net(), mb_args=(x,), split_spec=split)
    assert [v.is_contiguous() for v in second_stage_inputs(plain)].count(False) == 2
    torch.manual_seed(0)
    pipe = pipeline(Net(), mb_args=(x,), split_spec=split)
    ns["contiguous_boundaries"](pipe)
    received = second_stage_inputs(pipe)
    assert len(received) == 2 and all(v.is_contiguous() for v in received)
    assert sorted(tuple(v.shape) for v in received) == [(3, 6, 5), (3, 6, 5)]
    assert all(v.is_contiguous() for v in first_stage_outputs(pipe))
    # what the first stage really returns is contiguous, and the stages run in turn compute the model's result
    sent = pipe.get_stage_module(0)(x)
    sent = sent if isinstance(sent, tuple) else (sent,)
    assert all(t.is_contiguous() for t in sent)
    call = next(n for n in pipe.split_gm.graph.nodes if n.op == "call_module" and n.target.endswith("1"))
    args = [sent[a.args[1]] if a.op == "call_function" else sent[0] for a in call.args]
    out = pipe.get_stage_module(1)(*args)
    torch.manual_seed(0)
    torch.testing.assert_close(out[0] if isinstance(out, tuple) else out, Net()(x))
    # the model's own input keeps its strides (torch checks what it is given against them)
    transposed = torch.randn(3, 6, 5).transpose(1, 2)
    torch.manual_seed(0)
    pipe = pipeline(Net(), mb_args=(transposed,), split_spec=split)
    ns["contiguous_boundaries"](pipe)
    given = next(n for n in pipe.get_stage_module(0).graph.nodes if n.op == "placeholder").meta["val"]
    assert not given.is_contiguous() and all(v.is_contiguous() for v in second_stage_inputs(pipe))
