"""Models whose torch-pipelining export is traced by pipeline() (they are not Hugging Face causal
language models): torchvision's and timm's image classifiers, Hugging Face's BERT, ViT and DeBERTa, and a
residual network with a long skip connection, each
built from its own model code with a small config (no downloads), as ``stagesplit capture``
factories and as the runs' models, for tests/exporters/test_export_traced_pipelines.py.
``model(name)`` builds one (seeded by the caller), ``batch(name, micro_batches)`` gives its inputs and
targets, ``loss`` is the cross-entropy of its logits every run and the capture use. Stochastic depth
and dropout are off: their random draws differ between a pipeline's stages and one process."""

from __future__ import annotations

import functools

import vision

__all__ = ["ENCODERS", "FAMILIES", "IMAGE_CLASSIFIERS", "MASKED_LMS", "SKIPS", "batch", "capture_spec", "loss", "model"]

#: torchvision's ResNet-18, ViT (blocks behind a permute: the boundary is not contiguous) and Swin
#: (windows: permuted layouts inside), timm's ViT and ConvNeXt (its stages end in a permuted layout)
IMAGE_CLASSIFIERS = ("tv_resnet18", "tv_vit", "tv_swin", "timm_vit", "timm_convnext")
#: Hugging Face's BERT (masked LM: its head tied to the word embedding; its attention mask expanded
#: to every layer), ViT, DeBERTa-v2 (its relative position embeddings, one module's parameter, read by
#: every layer: traced, each stage holds a copy whose gradients must be summed) and Swin (shifted
#: windows, their masks made in each block, patch merging between its stages)
ENCODERS = ("hf_bert", "hf_vit", "hf_deberta", "hf_swin")
#: the masked language models (token ids in, a token per position out)
MASKED_LMS = ("hf_bert", "hf_deberta", "hf_mpnet")
#: a residual network whose first block's output is added after the fifth (a skip connection that carries a
#: gradient: on 4 stages it skips two), BERT on 4 stages (its attention mask, made at the root, read by
#: every layer) and MPNet (its relative position bias, made at the root from a parameter, read by every layer)
SKIPS = ("skip_net", "hf_bert", "hf_mpnet")
FAMILIES = IMAGE_CLASSIFIERS + ENCODERS + ("skip_net", "hf_mpnet")
BATCH, SIDE, CLASSES, VOCAB, SEQUENCE, FEATURES = 2, 32, 10, 256, 32, 256


def _skip_net():
    import torch

    class SkipNet(torch.nn.Module):
        """Eight linear blocks; the first block's output is added to the fifth's (a long skip connection)."""

        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(FEATURES, FEATURES) for _ in range(8))
            self.head = torch.nn.Linear(FEATURES, CLASSES)

        def forward(self, x):
            first = x = torch.relu(self.blocks[0](x))
            for i in range(1, 8):
                x = torch.relu(self.blocks[i](x))
                if i == 4:
                    x = x + first
            return self.head(x)
    return SkipNet()


def _build(name: str):
    if name == "skip_net":
        return _skip_net()
    if name.startswith("hf_"):
        import transformers as tf
        if name == "hf_mpnet":
            return tf.MPNetForMaskedLM(tf.MPNetConfig(
                vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128,
                max_position_embeddings=72, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        if name == "hf_deberta":
            return tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(
                vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128,
                max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                relative_attention=True, position_buckets=16, max_relative_positions=64, pos_att_type=["p2c", "c2p"]))
        if name == "hf_bert":
            return tf.BertForMaskedLM(tf.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4,
                                                    num_attention_heads=4, intermediate_size=128,
                                                    max_position_embeddings=64, hidden_dropout_prob=0.0,
                                                    attention_probs_dropout_prob=0.0))
        if name == "hf_swin":        # patch 1: the last stage's 4 x 4 patches hold one whole window of 4
            return tf.SwinForImageClassification(tf.SwinConfig(
                image_size=SIDE, patch_size=1, embed_dim=16, depths=[1, 1, 2, 1], num_heads=[2, 2, 2, 2],
                window_size=4, num_labels=CLASSES, drop_path_rate=0.0, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0))
        return tf.ViTForImageClassification(tf.ViTConfig(image_size=SIDE, patch_size=8, hidden_size=64,
                                                         num_hidden_layers=4, num_attention_heads=4,
                                                         intermediate_size=128, num_labels=CLASSES))
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


def _logits(output):
    """A model's logits: the output itself, a Hugging Face output's ``logits``, or a traced tuple's first."""
    import torch
    if isinstance(output, torch.Tensor):
        return output
    return output.logits if hasattr(output, "logits") else output[0]


def loss(output, targets):
    """The mean cross-entropy of the logits against ``targets`` (a class per image, a token per position)."""
    import torch
    logits = _logits(output)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def model(name: str):
    """Family ``name``'s model with random weights (seeded by the caller), in training mode."""
    return _build(name).train()


def _inputs(name: str, count: int, generator, device=None):
    import torch
    if name in MASKED_LMS:
        ids = torch.randint(0, VOCAB, (count, SEQUENCE), generator=generator, device=device)
        return ids, ids
    if name == "skip_net":
        features = torch.randn(count, FEATURES, generator=generator, device=device)
        return features, torch.randint(0, CLASSES, (count,), generator=generator, device=device)
    images = torch.randn(count, 3, SIDE, SIDE, generator=generator, device=device)
    return images, torch.randint(0, CLASSES, (count,), generator=generator, device=device)


def batch(name: str, micro_batches: int, seed: int = 7) -> tuple:
    """``micro_batches`` micro-batches of ``BATCH`` samples: (inputs, targets)."""
    import torch
    return _inputs(name, BATCH * micro_batches, torch.Generator().manual_seed(seed))


def factory(name: str):
    """A capture factory: the model on the meta device, one micro-batch, and the loss (its targets made on
    the output's device: the capture's fake tensors are not on the meta device)."""
    import torch
    with torch.device("meta"):
        built = _build(name)
    if name in MASKED_LMS:
        inputs = torch.zeros(BATCH, SEQUENCE, dtype=torch.long, device="meta")
    elif name == "skip_net":
        inputs = torch.zeros(BATCH, FEATURES, device="meta")
    else:
        inputs = torch.zeros(BATCH, 3, SIDE, SIDE, device="meta")

    def captured_loss(output):
        logits = _logits(output)
        rows = logits.reshape(-1, logits.shape[-1]).shape[0]
        return loss(output, torch.zeros(rows, dtype=torch.long, device=logits.device))
    return built, (inputs,), captured_loss


for _name in FAMILIES:
    globals()[_name] = functools.partial(factory, _name)


def capture_spec(name: str) -> str:
    """The ``stagesplit capture`` factory spec of family ``name``."""
    from pathlib import Path
    return f"{Path(__file__).resolve()}:{name}"
