"""Export the example GPT (examples/gpt.py) to ONNX for ``stagesplit import``.

    python examples/make_gpt_onnx.py -o gpt.onnx
    stagesplit import gpt.onnx -o gpt-onnx.stagesplit --batch 4
    stagesplit solve gpt-onnx.stagesplit --devices 4 --schedule 1f1b

With the pinned torch, ``torch.onnx.export`` uses its new exporter by default, which needs the
``onnxscript`` package; ``dynamo=False`` selects the TorchScript exporter, which needs only torch
and onnx (torch warns that it is deprecated; the file it writes is what stagesplit reads). The
batch dimension is left symbolic (``batch``): bind it with ``stagesplit import --batch N``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from anywhere in a checkout


def export_gpt(output: str | Path, layers: int = 8) -> Path:
    """Write the example GPT with ``layers`` blocks as an ONNX model at ``output``."""
    import torch

    from examples.gpt import GPTConfig, build_real

    model, idx = build_real(GPTConfig(layers=layers))
    model.eval()
    output = Path(output)
    with warnings.catch_warnings():            # the TorchScript exporter's deprecation and tracer notes
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (idx,), str(output), dynamo=False, opset_version=17, input_names=["idx"],
                          output_names=["logits"], dynamic_axes={"idx": {0: "batch"}})
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="gpt.onnx", help="the ONNX file to write (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=8, help="transformer blocks (default: %(default)s)")
    args = parser.parse_args(argv)
    path = export_gpt(args.output, args.layers)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
