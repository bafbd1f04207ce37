"""torchvision and timm image classifiers built from their own model code with small configs (no
downloads), as ``stagesplit capture`` factories and as the runs' models: for the user's path of a
traced pipeline (tests/exporters/test_export_vision_pipelines.py). ``model(name)`` builds one
(seeded by the caller), ``batch(name, micro_batches)`` gives images and labels, ``loss`` is the
cross-entropy every run and the capture use."""

from __future__ import annotations

import functools

import vision

__all__ = ["FAMILIES", "batch", "capture_spec", "loss", "model"]

#: each family: torchvision's ResNet-18, ViT (blocks behind a permute: the boundary is not
#: contiguous) and Swin (windows: permuted layouts inside), timm's ViT and ConvNeXt (its stages end
#: in a permuted layout); stochastic depth off (its random draws differ between a pipeline's stages
#: and one process)
FAMILIES = ("tv_resnet18", "tv_vit", "tv_swin", "timm_vit", "timm_convnext")
BATCH, SIDE, CLASSES = 2, 32, 10


def _build(name: str):
    vision.torchvision_model_code()
    if name.startswith("tv_"):
        import torchvision.models as models
        if name == "tv_resnet18":
            return models.resnet18(num_classes=CLASSES)
        if name == "tv_swin":
            return models.SwinTransformer(patch_size=[2, 2], embed_dim=32, depths=[2, 2, 2, 2], num_heads=[2, 2, 2, 2],
                                          window_size=[4, 4], num_classes=CLASSES, stochastic_depth_prob=0.0)
        return models.VisionTransformer(image_size=SIDE, patch_size=8, num_layers=6, num_heads=4, hidden_dim=64,
                                        mlp_dim=128, num_classes=CLASSES)
    import timm
    if name == "timm_vit":
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=SIDE, patch_size=8, depth=6,
                                 num_classes=CLASSES)
    return timm.create_model("convnext_atto", pretrained=False, num_classes=CLASSES)


def loss(output, labels):
    import torch
    return torch.nn.functional.cross_entropy(output, labels)


def model(name: str):
    """Family ``name``'s model with random weights (seeded by the caller), in training mode."""
    return _build(name).train()


def batch(name: str, micro_batches: int, seed: int = 7) -> tuple:
    """``micro_batches`` micro-batches of ``BATCH`` images, and their labels."""
    import torch
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(BATCH * micro_batches, 3, SIDE, SIDE, generator=g)
    return images, torch.randint(0, CLASSES, (BATCH * micro_batches,), generator=g)


def factory(name: str):
    """A capture factory: the model on the meta device, one micro-batch, and the loss (labels made on
    the output's device: the capture's fake tensors are not on the meta device)."""
    import torch
    with torch.device("meta"):
        built = _build(name)
    images = torch.zeros(BATCH, 3, SIDE, SIDE, device="meta")
    return built, (images,), lambda out: loss(out, torch.zeros(out.shape[0], dtype=torch.long, device=out.device))


for _name in FAMILIES:
    globals()[_name] = functools.partial(factory, _name)


def capture_spec(name: str) -> str:
    """The ``stagesplit capture`` factory spec of family ``name``."""
    from pathlib import Path
    return f"{Path(__file__).resolve()}:{name}"
