"""The user's path for Hugging Face decoder models (issue #30): each family built from a config
(tests/decoder_families.py) is captured with ``stagesplit capture``, solved under a schedule,
exported with ``--to torch-pipelining``, and the exported file's own program is run on 2 and 4
processes (gloo) as its comments say: ``build_pipeline`` (stages built from the model's modules),
``train_step``, ``sum_tied_gradients``, Adam and ``zero_grad`` as the export sets it. Each rank is
measured by torch's MemTracker (tests/pipeline_harness.py), and:

* no rank's peak is under-predicted or over-predicted by more than TOLERANCE, under every schedule;
* the loss equals the unpipelined model's, and every gradient on every rank equals the
  unpipelined model's (GPT-2's tied embedding included; the mixture-of-experts families run in
  bfloat16, torch's grouped expert product, so to bfloat16's precision).

Every family runs 1F1B and ZBV on 2 processes and one schedule on 4; every schedule torch ships
runs on 2 and on 4 processes, with the families in turn; the mixture-of-experts families (Mixtral, Qwen2-MoE,
DeepSeek-V3, GPT-OSS) run on 2; Llama runs
1F1B on 8 processes, and Qwen2 interleaved 1F1B with 4 chunks per rank. ``benchmarks/bench_exported.py``
runs every family under every schedule on 2 and 4 processes (the README's table)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

TOLERANCE = 0.03
FAMILIES = ("gpt2", "llama", "qwen2", "mistral", "gpt_neox", "opt", "phi3")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev")


def _cases() -> list[tuple]:
    two = [(f, s, 2) for f in FAMILIES for s in ("1f1b", "zbv")]
    two += [(FAMILIES[i % len(FAMILIES)], s, 2) for i, s in enumerate(SCHEDULES) if s not in ("1f1b", "zbv")]
    four = [(FAMILIES[(i + 3) % len(FAMILIES)], s, 4) for i, s in enumerate(SCHEDULES)]
    # Mixtral's looped-bfs on 4: a bfloat16 block's hidden state, which no backward reads, was under-stated
    # (-3.3%) until the stash counted what the forward cache holds (docs/benchmarks.md)
    more = [("mixtral", "1f1b", 2), ("qwen2_moe", "zbv", 2), ("llama", "1f1b", 8), ("qwen2", "interleaved-1f1b", 2, 4),
            ("mixtral", "looped-bfs", 4),
            # ZBV on 4 (the split backward): Qwen2-MoE's routing, freed as B ends, was counted as kept for W
            # (+4.0%), and OPT's last chunk's B counted the gradients W reads on top of the loss's start (+3.1%)
            ("qwen2_moe", "zbv", 4), ("opt", "zbv", 4),
            # decoders that call their blocks differently (tests/decoder_families.py's DECODER_VARIANTS): blocks that
            # return tuples, and layers given their own masks or rotary tables by position
            ("falcon", "1f1b", 4), ("gpt_neo", "zbv", 2), ("gemma3", "interleaved-1f1b", 4), ("qwen2_sliding", "1f1b", 4),
            ("bloom", "1f1b", 2),
            # latent attention and a dense block before the experts (DeepSeek-V3); attention sinks and sliding
            # and full attention in turn (GPT-OSS)
            ("deepseek_v3", "zbv", 2), ("gpt_oss", "1f1b", 2)]
    return two + four + more


def test_cases_cover_every_family_and_schedule_on_2_and_4_processes():
    pytest.importorskip("transformers")
    import decoder_families as families
    cases = _cases()
    for P in (2, 4):
        assert {s for _, s, p, *_ in cases if p == P} == set(SCHEDULES)
        assert {f for f, _, p, *_ in cases if p == P} >= set(FAMILIES)
    assert {f for f, *_ in cases} >= {*families.MOE_FAMILIES, *families.DECODER_VARIANTS}
    assert max(p for _, _, p, *_ in cases) == 8 and max(c[3] for c in cases if len(c) == 4) == 4


def test_exported_pipelines_run_and_every_rank_is_within_tolerance(tmp_path):
    pytest.importorskip("transformers")
    import decoder_families as families
    import exported_matrix
    rows = exported_matrix.run_matrix(_cases(), tmp_path)
    failures = []
    for r in rows:
        where = f"{r.family} {r.schedule} P={r.devices} M={r.micro_batches} split {r.split}"
        bfloat16 = r.family in families.MOE_FAMILIES
        assert abs(r.loss - r.reference_loss) <= (1e-3 if bfloat16 else 1e-5) * abs(r.reference_loss), where
        assert r.gradient_error <= (3e-2 if bfloat16 else 1e-4), where
        if max(map(abs, r.errors)) > TOLERANCE:
            failures.append(f"{where}: ranks {[f'{100 * e:+.2f}%' for e in r.errors]}")
    assert not failures, "\n".join(failures)


#: the precisions' cases: a master-weights capture (Megatron's --bf16: bfloat16 parameters, float32 main_grad and
#: masters) of Llama under 1F1B and of GPT-2 (tied embedding: its copies' float32 gradients summed) under ZBV's
#: split backward; an amp capture (float32 parameters under bfloat16 autocast, around each forward) of Qwen2 under
#: 1F1B and of GPT-2 under ZBV
PRECISION_CASES = (("llama+master", "1f1b", 2), ("gpt2+master", "zbv", 2), ("qwen2+amp", "1f1b", 2),
                   ("gpt2+amp", "zbv", 2))


def test_exported_precisions_run_as_priced(tmp_path):
    """The export sets the capture's precision (PARAMETER_DTYPE, MASTER_WEIGHTS with master_weights and
    copy_masters, AUTOCAST_DTYPE), and the program it writes, run as its comments say on 2 processes, is within
    TOLERANCE of the plan on every rank; its loss and gradients are the float32 model's to bfloat16's precision."""
    pytest.importorskip("transformers")
    import exported_matrix
    rows = exported_matrix.run_matrix(PRECISION_CASES, tmp_path)
    codes = {r.family: (tmp_path / f"{r.family}-{r.schedule}-{r.devices}-{exported_matrix.SCHEDULES[r.schedule]}.py")
             .read_text() for r in rows}
    assert "MASTER_WEIGHTS = True" in codes["llama+master"] and "PARAMETER_DTYPE = torch.bfloat16" in \
        codes["llama+master"] and "AUTOCAST_DTYPE" not in codes["llama+master"]
    assert "AUTOCAST_DTYPE = torch.bfloat16" in codes["qwen2+amp"] and "MASTER_WEIGHTS" not in codes["qwen2+amp"]
    failures = []
    for r in rows:
        where = f"{r.family} {r.schedule} P={r.devices} M={r.micro_batches} split {r.split}"
        assert abs(r.loss - r.reference_loss) <= 2e-2 * abs(r.reference_loss), where
        assert r.gradient_error <= 1e-1, where
        if max(map(abs, r.errors)) > TOLERANCE:
            failures.append(f"{where}: ranks {[f'{100 * e:+.2f}%' for e in r.errors]}")
    assert not failures, "\n".join(failures)
