"""The small model the layout tests price by hand: ``layers`` Linear(width, width) in a row,
captured by ``stagesplit``'s PyTorch capture on a micro-batch of ``batch`` rows (allocations
unrounded, so that every byte is the hand computation's)."""

from __future__ import annotations


def linear_stack(layers: int = 4, width: int = 64, batch: int = 8, seed: int = 0):
    import torch

    from stagesplit.capturing.pytorch import capture_model
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    return capture_model(model, torch.empty(batch, width, device="meta"), allocator_round=1, name="stack")
