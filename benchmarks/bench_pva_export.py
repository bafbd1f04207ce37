"""The standalone PopVision exporter (issue 22) against ``stagesplit convert`` on the same report
of the libpva test double (a report file built from a synthetic BERT-base profile), each in a
fresh interpreter: wall time and peak RSS, and the double alone (opening the report and reading
what both read), which both pay. The two files must be byte-identical.

Note: ``convert`` reads large reports in two processes and the parent's peak RSS does not include
its child's; the exporter reads in one.

Run from the repository root:  python benchmarks/bench_pva_export.py [LAYERS] [--tiny]   (default 24)
(``--tiny``: 2 layers unless LAYERS says otherwise, in seconds.)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, TINY_FLAG, peak_rss_mb, print_table, run_measurement, tiny_mode


def measure(mode: str, pop: str, out: str) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "fake_pva"))
    import pva
    start = time.perf_counter()
    if mode == "double":
        report = pva.openReport(pop)
        comp = report.compilation
        len(comp.loweredVariables.allBriefVars)
        for program in comp.programs:
            _ = program.controlCodeByTile      # the lazy attribute's first access is what is timed
        len(pva.OperationAnalysis(report).operations)
    elif mode == "export":
        from stagesplit.io import pva_export
        pva_export.export(pop, None, out)
    else:
        from stagesplit.cli import main
        main(["convert", pop, "-o", out])
    print(json.dumps({"wall": time.perf_counter() - start, "rss": peak_rss_mb()}))


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--measure":
        measure(*sys.argv[2:])
        return
    given = [a for a in sys.argv[1:] if a != TINY_FLAG]
    layers = int(given[0]) if given else 2 if tiny_mode() else 24
    sys.path.insert(0, str(ROOT / "tests" / "fake_pva"))
    import pva

    from stagesplit.io.synth import write_synthetic
    from stagesplit.io.targets import load_target
    with tempfile.TemporaryDirectory() as tmp:
        compact = Path(tmp) / "synthetic.stagesplit"
        profile = write_synthetic(compact, "bert-base", load_target("ipu-mk2"), layers=layers)
        pop = str(pva.write_report_file(Path(tmp) / "bert" / "profile.pop", compact))
        rows = []
        for mode in ("double", "export", "convert"):
            m = run_measurement(__file__, mode, pop, str(Path(tmp) / f"{mode}.stagesplit"))
            name = {"double": "the double alone", "export": "pva_export.py", "convert": "stagesplit convert"}[mode]
            rows += [(f"{name}: wall time", f"{m['wall']:.1f} s", ""), (f"{name}: peak RSS", f"{m['rss']:,.0f} MB", "")]
        same = (Path(tmp) / "export.stagesplit").read_bytes() == (Path(tmp) / "convert.stagesplit").read_bytes()
        rows.append(("the two files byte-identical", "yes" if same else "NO", "yes"))
        print_table(f"PopVision export: bert-base {layers} layers, {len(profile.variables):,} variables, "
                    f"{len(profile.programs):,} programs", rows)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
