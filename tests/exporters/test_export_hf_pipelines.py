"""The user's path for Hugging Face decoder models (issue #30): each family built from a config
(tests/decoder_families.py) is captured with ``stagesplit capture``, solved under a schedule,
exported with ``--to torch-pipelining``, and the exported file's own program is run on 2 and 4
processes (gloo) as its comments say: ``build_pipeline`` (stages built from the model's modules),
``train_step``, ``sum_tied_gradients``, Adam and ``zero_grad`` as the export sets it. Each rank is
measured by torch's MemTracker (tests/pipeline_harness.py), and:

* no rank's peak is under-predicted by more than TOLERANCE (the direction that runs out of memory),
  nor over-predicted by more than TOLERANCE, except under the split-backward schedules (zb-h1,
  zbv, dualpipev), which the plan over-states by up to SPLIT_BACKWARD_TOLERANCE (measured: 10.3%):
  the runtime's split backward keeps less of the head and loss between B and W than the capture's
  weight stash counts, and at a V's turn the plan counts the tensors two chunks of one rank hand
  each other as kept to the step's end (docs/benchmarks.md, bench_exported.py);
* the loss equals the unpipelined model's, and every gradient on every rank equals the
  unpipelined model's (GPT-2's tied embedding included).

Every family runs 1F1B and ZBV on 2 processes and one schedule on 4; every schedule torch ships
runs on 2 and on 4 processes, with the families in turn. ``benchmarks/bench_exported.py`` runs
every family under every schedule on 2 and 4 processes (the README's table)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

TOLERANCE = 0.03
SPLIT_BACKWARD_TOLERANCE = 0.11
FAMILIES = ("gpt2", "llama", "qwen2", "mistral", "gpt_neox", "opt", "phi3")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev")


def _cases() -> list[tuple[str, str, int]]:
    two = [(f, s, 2) for f in FAMILIES for s in ("1f1b", "zbv")]
    two += [(FAMILIES[i % len(FAMILIES)], s, 2) for i, s in enumerate(SCHEDULES) if s not in ("1f1b", "zbv")]
    four = [(FAMILIES[(i + 3) % len(FAMILIES)], s, 4) for i, s in enumerate(SCHEDULES)]
    return two + four


def test_cases_cover_every_family_and_schedule_on_2_and_4_processes():
    cases = _cases()
    for P in (2, 4):
        assert {s for _, s, p in cases if p == P} == set(SCHEDULES)
        assert {f for f, _, p in cases if p == P} == set(FAMILIES)


def test_exported_pipelines_run_and_every_rank_is_within_tolerance(tmp_path):
    pytest.importorskip("transformers")
    import exported_matrix
    rows = exported_matrix.run_matrix(_cases(), tmp_path)
    failures = []
    for r in rows:
        where = f"{r.family} {r.schedule} P={r.devices} M={r.micro_batches} split {r.split}"
        assert abs(r.loss - r.reference_loss) <= 1e-5 * abs(r.reference_loss), where
        assert r.gradient_error <= 1e-4, where
        over = SPLIT_BACKWARD_TOLERANCE if r.schedule in ("zb-h1", "zbv", "dualpipev") else TOLERANCE
        if min(r.errors) < -TOLERANCE or max(r.errors) > over:
            failures.append(f"{where}: ranks {[f'{100 * e:+.2f}%' for e in r.errors]}")
    assert not failures, "\n".join(failures)
