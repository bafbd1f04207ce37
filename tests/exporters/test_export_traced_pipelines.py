"""The user's path for traced pipelines: models that are not Hugging Face causal language models
(tests/traced_families.py: torchvision's and timm's image classifiers, Hugging Face's BERT, ViT, DeBERTa and
Swin)
are captured with ``stagesplit capture``, solved under 1F1B, exported with ``--to torch-pipelining``
(pipeline() traces them), and the exported file's own program is run on gloo processes as its
comments say (tests/pipeline_harness.py's ``run_exported``, MemTracker per rank): the image
classifiers on 4, the encoders on 2, and on 4 (and under interleaved 1F1B) models with a tensor that
skips stages, which the exported ``relay_skips`` passes through the stages between (torch's runtimes
refuse such a split beyond two stages). Each run's loss equals the unpipelined model's, every gradient
on every rank equals the unpipelined model's, and no rank's peak is off the plan's by more than
TOLERANCE (BERT's relayed run excepted, measured, in RELAYED_TOLERANCE).

Bugs these runs found, all in the exported program (``contiguous_boundaries``, ``tie_within_stages``,
``relay_skips``, ``tied_groups``):
* torch made each traced stage's receive buffer with the strides it traced, and gloo refuses a tensor
  that is not contiguous: torchvision's ViT, timm's ConvNeXt (a permute before the boundary) and both
  Hugging Face encoders (an expanded attention mask) failed at the first step ("input tensor has to
  be contiguous");
* pipeline() gave BERT's first stage the tied head's weight beside its word embedding, a second copy
  with a gradient and optimizer state of its own: the plan was 12.5% under that rank's peak;
* a tensor that skips a stage (BERT's mask on 4 stages) was refused by torch's runtimes;
* DeBERTa's relative position embeddings, read by every layer, are a parameter each traced stage holds a
  copy of: only parameters tied under several names had their copies' gradients summed, so each rank
  kept its own stage's part of that gradient (84% off the whole model's).

TOLERANCE is 5%, not the decoders' 3%: where a boundary tensor was not contiguous, its contiguous copy
is made on the stage before and sent from there, one per micro-batch in flight, which the capture of
the model does not hold; on these small models (hidden 64, 32 x 32 images) that copy leaves the plan of
torchvision's ViT's first rank 4.7% under its measured peak (BERT's 3.1%), and the ranks whose
boundaries are contiguous come within 1%."""

from __future__ import annotations

import contextlib
import functools
import io
import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow

TOLERANCE = 0.05
#: the largest gradient error relative to the gradient's largest entry: float32's rounding (the ranks
#: run one thread each, the reference several, and sum the micro-batches' backward passes in another
#: order); ResNet's batch norms over two 1 x 1 images make its first convolution's gradient the small
#: sum of large terms (entries to 2,200): measured 3e-4 to 7e-4
GRADIENT_TOLERANCE = {"tv_resnet18": 2e-3}


def _cli(*args) -> None:
    from stagesplit.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    assert code == 0, f"stagesplit {' '.join(map(str, args))}: exit {code}: {err.getvalue().strip()}"


def _reference(family: str, micro_batches: int) -> tuple[float, dict[str, np.ndarray]]:
    import torch

    import traced_families as families
    torch.manual_seed(0)
    model = families.model(family)
    inputs, targets = families.batch(family, micro_batches)
    total = sum(families.loss(model(x), y) for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)))
    total = total / micro_batches
    total.backward()
    return float(total.detach()), {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()
                                  if p.grad is not None}


def _check(tmp_path, names, devices: int, schedule: str = "1f1b", tolerance: dict[str, float] | None = None,
           skipping: tuple[str, ...] = ()) -> None:
    """Capture, solve (``schedule``; a looped one with 2 chunks per rank), export and run each family on
    ``devices`` processes: loss and gradients equal, every rank within its tolerance; the families in
    ``skipping``: the plan records a tensor the split sends past a stage (the relay is exercised)."""
    import pipeline_harness as harness
    import traced_families as families
    micro_batches = 2 * devices
    chunks = 2 if schedule in ("interleaved-1f1b", "zbv") else 1
    cases, plans = [], []
    for family in names:
        profile, plan, code = (tmp_path / f"{family}{suffix}" for suffix in (".stagesplit", ".json", ".py"))
        if not profile.exists():
            _cli("capture", families.capture_spec(family), "-o", profile)
        _cli("solve", profile, "--devices", devices, "--schedule", schedule, "--micro-batches", micro_batches,
             *(["--chunks-per-rank", chunks] if chunks > 1 else []), "--out", plan)
        _cli("export", plan, "--to", "torch-pipelining", "-o", code)
        doc = json.loads(plan.read_text())
        assert len(doc["stages"]) == devices * chunks, (family, doc["split"])
        if family in skipping:
            stage_of = {layer: k for k, stage in enumerate(doc["stages"]) for layer in range(stage["first_layer"],
                                                                                           stage["last_layer"] + 1)}
            assert any(stage_of[w["last_layer"]] - stage_of[w["first_layer"]] >= 2 for w in doc["wide_tensors"]), \
                (family, doc["split"], doc["wide_tensors"])
        plans.append(doc)
        cases.append(harness.ExportedCase(code.read_text(), functools.partial(families.model, family),
                                          functools.partial(families.batch, family, micro_batches), families.loss))
    for family, doc, ranks in zip(names, plans, harness.run_exported(cases, devices)):
        want_loss, want_grads = _reference(family, micro_batches)
        loss = float(np.mean([v for r in ranks for v in r.losses]))
        assert loss == pytest.approx(want_loss, rel=1e-5), family
        seen = set()
        for r in ranks:
            for name, grad in r.grads.items():
                want = want_grads[name]
                bound = GRADIENT_TOLERANCE.get(family, 1e-4) * max(np.abs(want).max(), 1e-12)
                assert np.abs(grad - want).max() <= bound, (family, name)
                seen.add(name)
        assert seen == set(want_grads), (family, set(want_grads) - seen)
        predicted = [int(r["peak_bytes"]) for r in doc["schedule"]["ranks"]]
        measured = [r.peak_bytes for r in ranks]
        errors = [(p - m) / m for p, m in zip(predicted, measured)]
        bound = (tolerance or {}).get(family, TOLERANCE)
        assert max(map(abs, errors)) <= bound, (family, doc["split"], [f"{e:+.1%}" for e in errors])


def test_traced_image_classifiers_train_the_whole_model_on_4_processes(tmp_path):
    pytest.importorskip("torch")
    import traced_families as families
    try:
        families.model("timm_vit")
        families.model("tv_vit")
    except ImportError as exc:          # the README's test command installs both (.venv/vision)
        pytest.fail(f"torchvision and timm are part of the test set-up: {exc}")
    _check(tmp_path, families.IMAGE_CLASSIFIERS, 4)


def test_traced_hugging_face_encoders_train_the_whole_model_on_2_processes(tmp_path):
    pytest.importorskip("transformers")
    import traced_families as families
    _check(tmp_path, families.ENCODERS, 2)


#: the relayed runs' bounds where the plan is further off than TOLERANCE, measured: BERT's and MPNet's
#: traced programs build the full attention mask, which the eager capture skips (transformers makes the mask
#: only under torch.export, not in an eager run whose inputs need none), and on CPU torch's attention with a
#: mask materialises the attention weights in the backward: BERT -8.0%, -12.0%, -13.4% and -1.2% on 4
#: processes here (-5.2% to -6.8% at hidden 256, 8 layers, 128 tokens), MPNet -7.2%, -8.0%, -10.6% and
#: -5.2% (-13.2% to -26.6% before its relayed position bias was priced on the stages between)
RELAYED_TOLERANCE = {"hf_bert": 0.15, "hf_mpnet": 0.15}


def test_traced_skip_connections_are_relayed_and_train_the_whole_model_on_4_processes(tmp_path):
    """A tensor that skips stages (the skip network's first block's output, added after the fifth, and its
    gradient; BERT's attention mask, read by every layer) goes through the stages between
    (``relay_skips``): torch refused such a split beyond two stages ("Backward of skip connections not
    supported yet"), and the export refused it. Both run on 4 processes, the whole model's loss and
    gradients."""
    pytest.importorskip("transformers")
    import traced_families as families
    # BERT's mask is made only by the traced program (RELAYED_TOLERANCE): its plan records no such tensor, and
    # its run fails at the first step without the relay
    _check(tmp_path, families.SKIPS, 4, tolerance=RELAYED_TOLERANCE, skipping=("skip_net",))


def test_traced_skip_connections_are_relayed_under_a_looped_schedule(tmp_path):
    """The same relay where two of the stages between are on one rank (interleaved 1F1B, 2 chunks per rank
    on 2 processes: the runtime hands the relayed tensor to the rank's next chunk without a send). The
    network's parameters are most of each rank's bytes: with a rank's optimizer temporaries priced as the
    sum of its chunks' (not the largest: solver/schedule_memory.py), the plan was 10.6% over each rank."""
    pytest.importorskip("transformers")
    _check(tmp_path, ("skip_net",), 2, schedule="interleaved-1f1b", skipping=("skip_net",))
