"""``layouts --compare`` (plan/layout_compare.py): NeMo auto-configurator's grid and the presets by hand,
and every figure the comparison prints read back against the searches it ran: each compared row
is the layout search with its degrees fixed, its step over the chosen one's, its tokens/s per GPU."""

from __future__ import annotations

import json

import pytest

from stagesplit import api
from stagesplit.plan.layout_compare import nemo_grid, references
from stagesplit.plan.layouts import seconds
from tests.helpers import run_cli

torch = pytest.importorskip("torch")

from linear_stack import linear_stack  # noqa: E402

#: the oracles here simulate 1F1B (conftest.py's ``search_under_1f1b``)
pytestmark = pytest.mark.usefixtures("search_under_1f1b")


def test_nemo_grid_by_hand():
    # a 70B model (45 < size <= 95): TP 2, 4, 8; PP 1 to 8 dividing the 80 layers; micro-batches 1 to 8
    grid = nemo_grid(70.0, 64, 80)
    assert grid == [(tp, pp, s) for tp in (2, 4, 8) for pp in (1, 2, 4, 8) for s in (1, 2, 4, 8)]
    # a 405B model (395 < size <= 790): TP 8, PP 8 to 100 dividing 126 layers and 1,024 / 8 GPUs
    assert {(tp, pp) for tp, pp, _ in nemo_grid(405.0, 1024, 126)} == set()
    assert {pp for _, pp, _ in nemo_grid(405.0, 1024, 128)} == {8, 16, 32, 64}
    # a small model: one stage, TP 1 or 2
    assert nemo_grid(0.5, 8, 12) == [(tp, 1, s) for tp in (1, 2) for s in (1, 2, 4, 8)]


def test_presets_by_size():
    titan, pipe, fsdp = references(70.0, 64, 80, 512)
    assert (titan.name, titan.tp, titan.pp, titan.zero, titan.micro_batch_size) == (
        "torchtitan llama3_70b", 8, 1, 3, 8)
    assert (pipe.tp, pipe.pp, pipe.zero) == (1, 64, 0)           # the most stages dividing 64 GPUs, <= 80 layers
    assert references(70.0, 128, 80, 512)[1].pp == 64
    assert (fsdp.tp, fsdp.pp, fsdp.zero) == (1, 1, 3)
    assert references(8.0, 8, 32, 64)[0].name == "torchtitan llama3_8b"
    assert references(405.0, 1024, 126, 2048)[0].tp == 8


@pytest.fixture(scope="module")
def stack_file(tmp_path_factory):
    from stagesplit.io import save_profile
    path = tmp_path_factory.mktemp("compare") / "stack.json"
    save_profile(linear_stack(), path)
    return path


ARGS = ["--gpus", 8, "--global-batch", 64, "--captured-batch", 8, "--seq-len", 1, "--target", "h100-80gb"]


def test_every_compared_row_is_the_search_with_its_degrees_fixed(stack_file, capsys):
    code, out, _ = run_cli(capsys, "layouts", stack_file, *ARGS, "--compare", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    chosen = api.layouts(str(stack_file), gpus=8, global_batch=64, captured_batch=8, sequence_length=1,
                         target="h100-80gb")
    assert doc["chosen"]["best"]["step_s"] == pytest.approx(chosen.best.step_s)
    names = [r["name"] for r in doc["compared"]]
    assert names == ["NeMo auto-configurator grid", "torchtitan llama3_8b", "Megatron-LM Llama-3 8B example",
                     "NeMo llama3_8b recipe (Megatron Core)", "pure pipeline", "pure FSDP"]
    # NeMo's 8B recipe runs context parallelism 2: no rank of that degree was given
    refused = [r for r in doc["compared"] if r["layouts"] is None]
    assert [(r["name"], r["refused"]) for r in refused] == [
        ("NeMo llama3_8b recipe (Megatron Core)", "no profile of tensor-parallel degree 1 and context-parallel "
         "degree 2 was given (capture one with --cp 2)")]
    for row in doc["compared"][1:]:
        if row["layouts"] is None:
            continue
        best = row["layouts"]["best"]
        again = api.layouts(str(stack_file), gpus=8, global_batch=64, captured_batch=8, sequence_length=1,
                            target="h100-80gb", tp=best["tp"], pp=best["pp"], dp=best["dp"], zero=best["zero"],
                            micro_batch_size=best["micro_batch_size"])
        assert row["step_s"] == pytest.approx(again.best.step_s)
        assert row["step_s"] >= chosen.best.step_s * (1 - 1e-9)        # the search's choice is never slower
    # NeMo's row: the fastest of its grid (TP 1 and 2 for a model this small; TP 2 has no profile here)
    grid = [api.layouts(str(stack_file), gpus=8, global_batch=64, captured_batch=8, sequence_length=1,
                        target="h100-80gb", tp=1, pp=1, dp=8, zero=1, micro_batch_size=s) for s in (1, 2, 4, 8)]
    steps = [g.best.step_s for g in grid if g.best is not None]
    assert doc["compared"][0]["step_s"] == pytest.approx(min(steps)) and doc["compared"][0]["tried"] == 8
    assert doc["compared"][4]["layouts"]["best"]["pp"] == 4 and doc["compared"][5]["layouts"]["best"]["zero"] == 3
    # Megatron-LM's 8B example: TP 1, CP 1, PP 1, the distributed optimizer (ZeRO 1), micro-batches of 1
    megatron = doc["compared"][2]["layouts"]["best"]
    assert (megatron["tp"], megatron["cp"], megatron["pp"], megatron["dp"], megatron["zero"],
            megatron["micro_batch_size"], megatron["micro_batches"]) == (1, 1, 1, 8, 1, 1, 8)


def test_the_printed_comparison_is_the_numbers(stack_file, capsys):
    code, out, _ = run_cli(capsys, "layouts", stack_file, *ARGS, "--compare", "--format", "json")
    doc = json.loads(out)
    code, text, _ = run_cli(capsys, "layouts", stack_file, *ARGS, "--compare")
    assert code == 0
    lines = text.splitlines()
    k = lines.index("compared layouts (the same model, cluster and global batch):")
    chosen = doc["chosen"]["best"]["step_s"]
    n = len(doc["compared"])
    table = lines[k + 2:k + 3 + n]
    assert table[0].startswith("stagesplit's choice") and table[0].endswith("1.00x      fits")
    for line, row in zip(table[1:], doc["compared"], strict=True):
        if row["layouts"] is None:           # not laid out: the reason instead of the figures
            assert line.startswith(row["name"]) and line.endswith(f"not laid out: {row['refused']}")
            continue
        lp = row["layouts"]
        best = lp["best"]
        assert line.startswith(row["name"] + (f" (best of {row['tried']})" if row["tried"] > 1 else ""))
        describe = (f"TP {best['tp']} x PP {best['pp']} x DP {best['dp']}, ZeRO {best['zero']}, "
                    f"{best['micro_batches']} micro-batches of {best['micro_batch_size']}")
        cells = [c for c in line.split("  ") if c.strip()]
        assert [c.strip() for c in cells[1:]] == [describe, seconds(row["step_s"]),
                                                  f"{lp['tokens_per_s_per_gpu']:,.0f}",
                                                  f"{row['step_s'] / chosen:.2f}x", "fits"]
        assert lp["tokens_per_s_per_gpu"] == pytest.approx(64 * 1 / row["step_s"] / 8)
    assert lines[k + 3 + n].startswith("sources: NeMo auto-configurator grid: "
                                       "nemo/collections/llm/tools/auto_configurator")


def test_a_preset_that_cannot_be_laid_out_says_why(stack_file):
    """torchtitan's 70B preset is TP 8: with no profile of that degree its row says so; NeMo's grid
    keeps its fastest point that was laid out (its TP 2 points have no profile either)."""
    from dataclasses import replace

    from stagesplit.plan.layout_compare import Compared, _fixed, _price
    from stagesplit.reporting.layouts import comparison_text
    cmp = api.layout_comparison(str(stack_file), gpus=8, global_batch=64, captured_batch=8, sequence_length=1,
                                target="h100-80gb")
    req = cmp.chosen.request
    got = _price(lambda *a: None, [1], _fixed(req, 8, 1, 3, 8, 1.0), None)
    assert got == "no profile of tensor-parallel degree 8 was given"
    text = comparison_text(replace(cmp, rows=(Compared("torchtitan llama3_70b", "src", None, got),)))
    assert text.splitlines()[3].endswith("not laid out: no profile of tensor-parallel degree 8 was given")
    assert cmp.rows[0].plan is not None and cmp.rows[0].plan.best.layout.tp == 1


def test_a_layout_that_does_not_fit_names_its_rank(stack_file, tmp_path):
    """A compared layout with no fitting split says so with its first memory row's reason."""
    from stagesplit.plan.layout_compare import Compared, Comparison
    from stagesplit.reporting.layouts import comparison_text
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("kind: gpu\ntiles: 1\nbytes_per_tile: 200000\nflops_per_s: 1e14\nlink_bytes_per_s: 1e11\n"
                    "node: {gpus_per_node: 8, intra_bytes_per_s: 1e11, intra_latency_s: 0.000003, "
                    "inter_bytes_per_s: 1e10, inter_latency_s: 0.000005}\n")
    lp = api.layouts(str(stack_file), gpus=1, global_batch=8, micro_batch_size=8, target=str(tiny),
                     runtime_reserve="off")
    assert lp.best is None
    memory = next(r for r in lp.rows if r.status == "memory")
    text = comparison_text(Comparison(lp, (Compared("pure FSDP", "one stage", lp),)))
    lines = text.splitlines()
    assert lines[2].startswith("stagesplit's choice") and lines[2].endswith(f"does not fit: {memory.reason}")
    assert lines[3].startswith("pure FSDP") and memory.layout.describe() in lines[3]
    assert lines[3].endswith(f"does not fit: {memory.reason}")


def test_a_layout_the_time_limit_stopped_is_unknown_not_a_layout_that_does_not_fit(stack_file):
    """A compared layout whose search the time limit stopped before a split was found (as the 70B
    sample's torchtitan preset under a 40 s limit) may fit:
    its row says unknown and how many of its combinations were stopped, never "does not fit". Where
    one of its combinations does not fit and another was stopped, it is unknown still."""
    from dataclasses import replace

    from stagesplit.plan.layout_compare import Compared, Comparison
    from stagesplit.reporting.layouts import comparison_text
    lp = api.layouts(str(stack_file), gpus=8, global_batch=64, captured_batch=8, sequence_length=1,
                     target="h100-80gb", tp=1, pp=1, zero=3)
    assert lp.best is not None and len(lp.rows) >= 2
    stopped = replace(lp, best=None, rows=(replace(lp.rows[0], status="unknown", reason="the time limit was "
                                                   "reached before it was searched", step_s=None),))
    mixed = replace(lp, best=None, rows=(replace(lp.rows[0], status="memory", reason="memory: rank 0 needs 9 GiB of 8 GiB",
                                                 step_s=None),
                                         replace(lp.rows[1], status="unknown", step_s=None)))
    text = comparison_text(Comparison(lp, (Compared("torchtitan llama3_70b", "src", stopped),
                                           Compared("pure FSDP", "one stage", mixed))))
    lines = text.splitlines()
    assert lines[3].startswith("torchtitan llama3_70b") and lp.rows[0].layout.describe() in lines[3]
    assert lines[3].endswith("unknown: the time limit stopped 1 of its 1 combination(s) before a split was found")
    assert lines[4].endswith("unknown: the time limit stopped 1 of its 2 combination(s) before a split was found")
    assert "does not fit" not in text


def test_megatron_presets_by_hand():
    """Megatron's published Llama configurations, as their files give them (plan/layout_compare.py
    cites each with its commit), and applied to a cluster: the data-parallel ranks the GPUs left
    over TP x CP x PP, ZeRO 1 (the distributed optimizer), interleaved 1F1B with the virtual stages
    as chunks per device."""
    from dataclasses import replace

    from stagesplit.io.topology import node_of
    from stagesplit.plan.layout_compare import _fixed, _price, megatron_presets
    from stagesplit.plan.layouts import Layout, LayoutRequest, enumerate_layouts

    def degrees(r):
        return r.tp, r.cp, r.pp, r.vp, r.zero, r.micro_batch_size, r.sequence_parallel
    example, recipe = megatron_presets(8.0)
    assert degrees(example) == (1, 1, 1, None, 1, 1, True)
    assert example.source.startswith("NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh @ ")
    assert degrees(recipe) == (1, 2, 1, None, 1, 1, False)
    (nemo70,) = megatron_presets(70.0)
    assert degrees(nemo70) == (4, 2, 4, 5, 1, 1, True)
    assert nemo70.source.startswith("NVIDIA/NeMo nemo/collections/llm/recipes/llama3_70b.py @ ")
    (nemo405,) = megatron_presets(405.0)
    assert degrees(nemo405) == (8, 4, 9, 2, 1, 1, True)
    # Llama-3-70B on 64 H100s, global batch 512: TP 4 x CP 2 x PP 4 leaves DP 2; 512 / (1 x 2) = 256
    # micro-batches of one sequence; 5 chunks per device (20 virtual stages of 4 layers each for 80 layers)
    req = LayoutRequest(gpus=64, global_batch=512, target=api.target("h100-80gb"), node=node_of("h100-80gb"))
    fixed = _fixed(req, nemo70.tp, nemo70.pp, nemo70.zero, nemo70.micro_batch_size, 1.0, nemo70.cp, nemo70.vp)
    assert (fixed.tp, fixed.cp, fixed.pp, fixed.dp, fixed.ep, fixed.zero, fixed.micro_batch_size, fixed.schedule,
            fixed.chunks_per_rank) == (4, 2, 4, 2, 1, 1, 1, "interleaved-1f1b", 5)
    assert enumerate_layouts(fixed, [1, 4, (4, 2)], 80) == [Layout(4, 4, 2, 1, 256, cp=2, micro_batch_size=1)]
    # with no rank of TP 4 x CP 2 given, the row says so; 405B's TP 8 x CP 4 x PP 9 = 288 does not divide
    # 1,024 GPUs (its recipe runs 72 nodes of 8: DP 2)
    assert _price(lambda *a: None, [1, 4], fixed, None) == (
        "no profile of tensor-parallel degree 4 and context-parallel degree 2 was given (capture one with `cp=2`)")
    big = LayoutRequest(gpus=1024, global_batch=2048, target=api.target("h100-80gb"), node=node_of("h100-80gb"))
    fixed = _fixed(big, nemo405.tp, nemo405.pp, nemo405.zero, 1, 1.0, nemo405.cp, nemo405.vp)
    assert _price(lambda *a: None, [(8, 4)], fixed, None) == "TP 8 x CP 4 x PP 9 = 288 does not divide 1,024 GPUs"
    fixed = _fixed(replace(big, gpus=576), nemo405.tp, nemo405.pp, nemo405.zero, 1, 1.0, nemo405.cp, nemo405.vp)
    assert (fixed.dp, fixed.chunks_per_rank, fixed.schedule) == (2, 2, "interleaved-1f1b")
    # no pipeline: no virtual stages (the request's schedule kept)
    fixed = _fixed(req, 8, 1, 1, 1, 1.0, 1, 4)
    assert (fixed.dp, fixed.schedule, fixed.chunks_per_rank) == (8, "1f1b", None)


def test_virtual_stages_are_priced_as_interleaved_1f1b(stack_file):
    """A preset's virtual stages: the stack on 8 GPUs as PP 2 x DP 4 with 2 chunks per device is the
    search's row of that layout under interleaved 1F1B (4 chunks of one layer), its pipeline step
    the one ``solve --schedule interleaved-1f1b --chunks-per-rank 2`` gives that layout."""
    from stagesplit.api import _layout_inputs
    from stagesplit.io.topology import node_of
    from stagesplit.plan.layout_compare import _fixed, _price
    rank, degrees, req, deadline, _ = _layout_inputs(
        str(stack_file), 8, global_batch=64, target="h100-80gb", gpus_per_node=None, tp_profiles=None,
        micro_batch_size=None, sequence_length=1, tp=None, pp=None, dp=None, zero=None, reshard_after_forward=True,
        schedule="1f1b", time_limit=60.0, events=None, captured_batch=8)
    got = _price(rank, degrees, _fixed(req, 1, 2, 1, 8, 30.0, 1, 2), deadline)
    best = got.best
    assert (best.layout.pp, best.layout.dp, best.layout.zero, best.layout.micro_batches) == (2, 4, 1, 2)
    assert (best.schedule, best.chunks_per_rank, len(got.plan.stages)) == ("interleaved-1f1b", 2, 4)
    link = node_of("h100-80gb").link(2, 4)
    alone = api.solve(str(stack_file), devices=2, target="h100-80gb", schedule="interleaved-1f1b", chunks_per_rank=2,
                      micro_batches=2, dp=4, zero=1, exact=True, communication=True,
                      link_bandwidth=link.bytes_per_s)
    assert best.pipeline_s == pytest.approx(alone.schedule.step_time, rel=1e-12)


def test_a_compared_layout_without_virtual_stages_runs_the_lists_first_schedule(stack_file):
    """Under a schedule list (the search's default: 1F1B and interleaved 1F1B) a compared layout is priced
    as it runs: without virtual stages under the list's first schedule alone (pure pipeline: 1F1B, not
    the best of the list), with them under interleaved 1F1B at that many chunks."""
    from stagesplit.api import _layout_inputs
    from stagesplit.plan.layout_compare import _fixed, _price
    rank, degrees, req, deadline, _ = _layout_inputs(
        str(stack_file), 8, global_batch=64, target="h100-80gb", gpus_per_node=None, tp_profiles=None,
        micro_batch_size=None, sequence_length=1, tp=None, pp=None, dp=None, zero=None, reshard_after_forward=True,
        schedule="1f1b,interleaved-1f1b", time_limit=60.0, events=None, captured_batch=8)
    plain = _fixed(req, 1, 4, 1, 8, 30.0)
    assert plain.schedule == "1f1b" and plain.chunks_per_rank is None
    got = _price(rank, degrees, plain, deadline)
    assert got.rows and all(r.layout.schedule in ("", "1f1b") for r in got.rows)
    assert got.best.schedule == "1f1b"
    looped = _fixed(req, 1, 2, 1, 8, 30.0, 1, 2)
    assert (looped.schedule, looped.chunks_per_rank) == ("interleaved-1f1b", 2)


def test_the_gathered_logits_note_by_hand():
    """The note names the rows of frameworks that keep the logits split (torchtitan, Megatron, NeMo) and
    priced a degree whose profile gathers them, and only those degrees; pure pipeline and pure FSDP are
    nobody's framework; nothing to say where no such row priced such a degree. The parameter is named as
    the library names it (the command line writes it as its flag: the test below)."""
    from stagesplit.plan.layout_compare import gathered_note
    tried = [("NeMo auto-configurator grid", [2, 4, 8]), ("torchtitan llama3_70b", [8]),
             ("NeMo llama3_70b recipe (Megatron Core)", [4]), ("pure pipeline", [1]), ("pure FSDP", [1])]
    assert gathered_note(tried, [8]) == (
        "NeMo auto-configurator grid, torchtitan llama3_70b: priced with the head's logits gathered on every rank "
        "(the tensor-parallel profile of degree 8 was captured so, as the model's plan declares); their frameworks "
        "keep the logits split over the vocabulary: capture with `loss_parallel` to price them as they run")
    assert gathered_note(tried, [2, 4]).startswith(
        "NeMo auto-configurator grid, NeMo llama3_70b recipe (Megatron Core): priced with the head's logits gathered "
        "on every rank (the tensor-parallel profiles of degrees 2, 4 were captured so,")
    assert gathered_note(tried, []) == ""
    assert gathered_note([("pure FSDP", [2])], [2]) == ""


@pytest.mark.parametrize("loss_parallel", [False, True], ids=["gathered", "loss-parallel"])
def test_a_comparison_says_where_it_priced_gathered_logits(tmp_path, capsys, loss_parallel):
    """A Hugging Face Llama captured at degrees 1 and 2: its declared plan gathers the head's logits, so
    NeMo's grid (TP 1 and 2 for a model this small) priced degree 2 so, and the comparison says it in a
    note, printed and in the JSON; captured with ``--loss-parallel``, nothing to say."""
    pytest.importorskip("transformers")
    import tp_harness
    from stagesplit.capturing.pytorch import capture_degrees
    from stagesplit.io import save_profile
    variants = capture_degrees(tp_harness.build("llama", "meta"), tp_harness.inputs("llama", "meta"),
                               degrees=[1, 2], loss_parallel=loss_parallel, target="h100-80gb")
    path = tmp_path / "llama.stagesplit"
    save_profile(variants, path)
    args = ["--gpus", 8, "--global-batch", 16, "--target", "h100-80gb", "--time-limit", 20, "--compare"]
    code, out, _ = run_cli(capsys, "layouts", path, *args, "--format", "json")
    assert code == 0
    doc = json.loads(out)
    nemo = doc["compared"][0]
    assert nemo["name"] == "NeMo auto-configurator grid" and nemo["tried"] == 8      # TP 1, 2 x micro-batches 1..8
    expected = [] if loss_parallel else [
        "NeMo auto-configurator grid: priced with the head's logits gathered on every rank (the tensor-parallel "
        "profile of degree 2 was captured so, as the model's plan declares); their frameworks keep the logits "
        "split over the vocabulary: capture with --loss-parallel to price them as they run"]
    assert doc["notes"] == expected
    code, text, _ = run_cli(capsys, "layouts", path, *args)
    assert [line for line in text.splitlines() if line.startswith("note: ")] == [f"note: {n}" for n in expected]
