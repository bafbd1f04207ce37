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
    from stagesplit.capturing.pytorch import capture_model
    from stagesplit.io import save_profile
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    path = tmp_path_factory.mktemp("compare") / "stack.json"
    save_profile(capture_model(model, torch.empty(8, 64, device="meta"), allocator_round=1, name="stack"), path)
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
    assert names == ["NeMo auto-configurator grid", "torchtitan llama3_8b", "pure pipeline", "pure FSDP"]
    for row in doc["compared"][1:]:
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
    assert doc["compared"][2]["layouts"]["best"]["pp"] == 4 and doc["compared"][3]["layouts"]["best"]["zero"] == 3


def test_the_printed_comparison_is_the_numbers(stack_file, capsys):
    code, out, _ = run_cli(capsys, "layouts", stack_file, *ARGS, "--compare", "--format", "json")
    doc = json.loads(out)
    code, text, _ = run_cli(capsys, "layouts", stack_file, *ARGS, "--compare")
    assert code == 0
    lines = text.splitlines()
    k = lines.index("compared layouts (the same model, cluster and global batch):")
    chosen = doc["chosen"]["best"]["step_s"]
    table = lines[k + 2:k + 7]
    assert table[0].startswith("stagesplit's choice") and table[0].endswith("1.00x      fits")
    for line, row in zip(table[1:], doc["compared"]):
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
    assert lines[k + 7].startswith("sources: NeMo auto-configurator grid: nemo/collections/llm/tools/auto_configurator")


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
