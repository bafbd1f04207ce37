"""Synthetic single-device profiles with realistic magnitudes, for samples, demos and benchmarks.

Every generated profile says ``synthetic: true``. A model is a list of blocks (one per layer
name), each a chain of operations. The generator lays out a training step the way a compiled
IPU program does: the forward pass block by block, the loss, then the backward pass in reverse
with each weight update right after its gradient. Each operation runs a few programs that
alternate exchange and compute, one liveness step each. Tensors are split into lowered
variables of about ``piece_bytes`` spread over the operation's tiles:

* weights (with gradient and optimizer state, ``bytes_per_param`` per parameter) are always live;
* an operation's output is live from its forward step until its consumer has run and, when it
  is saved for the backward pass, until its gradient operation has run (a stashed activation);
* output gradients flow backwards between gradient operations; temporaries live during one
  operation; weight gradients from the gradient operation to the update right after it.

Programs carry per-tile vertex code (by vertex type), vertex state, exchange code, control code
and compile-time cycle estimates. The profile also carries ground truth computed independently
of the cost model, including small categories the model does not cover (constants, vector list
descriptors) so that diagnostics have something to explain.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..common.fileio import atomic_output
from ..errors import StagesplitError
from .builder import ProfileBuilder
from .compact import profile_columns, write_columns
from .compactformat import INT, CompactWriter, Spill
from .profile import GroundTruth, Profile, ProfileInfo, Target

__all__ = ["BlockSpec", "FAMILIES", "OpSpec", "STEP_BLOCK_CELLS", "SynthModel", "SynthOptions", "bert", "cnn",
           "code_per_tile", "gpt", "ground_truth", "synthesize", "write_synthetic"]

# vertex types per operation kind, with a code size in bytes (same on every tile)
VERTEX_TYPES: dict[str, list[tuple[str, int]]] = {
    "matmul": [("poplin::ConvPartial1x1Out<half,float,true,false>", 2704),
               ("poplin::ReduceAdd<float,half,false,false>", 604)],
    "conv": [("poplin::ConvPartialnx1<half,float,true,false,8>", 3372),
             ("poplin::ReduceAdd<float,half,false,false>", 604)],
    "depthwise": [("poplin::ConvPartialHorizontalMac<half,float,true>", 1986)],
    "gather": [("popops::MultiSlice<half>", 718), ("popops::MultiUpdateAdd<half,false>", 1244)],
    "softmax": [("popnn::NonLinearity2D<half,popnn::NonLinearityType::SOFTMAX_STABLE>", 1132),
                ("popops::Reduce<popops::ReduceMax,half,half,false,0>", 932)],
    "norm": [("popnn::BatchNormEstimates<half,float>", 1460), ("popops::ScaledAdd2D<half,half,true>", 486)],
    "elementwise": [("popops::BinaryOp2D<popops::expr::BinaryOpType::ADD,half>", 412),
                    ("popnn::NonLinearity2D<half,popnn::NonLinearityType::GELU>", 874)],
    "loss": [("popnn::SoftmaxCrossEntropy<half>", 1310)],
    "update": [("popops::ScaledAdd2D<float,half,true>", 526)],
}


@dataclass(frozen=True)
class OpSpec:
    """One forward operation of a block."""

    name: str
    kind: str
    out_bytes: int
    weight_bytes: int = 0
    temp_bytes: int = 0
    flops: float = 0.0
    tiles: int = 256
    saved: bool = True
    tied_to: str | None = None          # reuse the weight of the op with this full name


@dataclass(frozen=True)
class BlockSpec:
    op_prefix: str                       # operation names: f"{op_prefix}/{op.name}"
    tensor_prefix: str                   # tensor names: f"{tensor_prefix}.{op.name}.weight"
    ops: tuple[OpSpec, ...]


@dataclass(frozen=True)
class SynthOptions:
    piece_bytes: int = 16384             # lowered variables are pieces of about this size
    programs_per_op: int = 4             # forward programs per operation (backward: twice as many)
    seed: int = 0
    flops_per_tile_cycle: float = 32.0   # sustained half-precision FLOP per tile per cycle
    exchange_bytes_per_cycle: float = 4.0
    shared_bytes_per_tile: int = 768     # stream buffers, seeds: variables no operation uses


@dataclass
class SynthModel:
    name: str
    description: str
    blocks: list[BlockSpec]
    options: SynthOptions = field(default_factory=SynthOptions)


# ----------------------------------------------------------------------------------------------
# Model families

def bert(layers: int = 12, hidden: int = 768, seq: int = 128, batch: int = 8, vocab: int = 30522, heads: int = 12,
         bytes_per_param: int = 8, tiles: int = 1472, numbered_embeddings: bool = False,
         options: SynthOptions | None = None) -> SynthModel:
    """A BERT-like encoder: embeddings, ``layers`` encoder layers, the masked-LM head and loss.

    With ``numbered_embeddings`` the embeddings and head are layers of their own
    (``layer0``/``layer{layers+1}``); otherwise they join the first and last encoder layer by
    the first-/last-layer rules, as in PopLiner."""
    act = batch * seq * hidden * 2
    attn = batch * heads * seq * seq * 2
    p = bytes_per_param
    wide = min(tiles, 1216)

    def mm(name, w_in, w_out, out=None, t=wide):
        return OpSpec(name, "matmul", out or act, weight_bytes=(w_in * w_out + w_out) * p,
                      temp_bytes=act // 4, flops=2.0 * batch * seq * w_in * w_out, tiles=t)

    emb_name = "bert/layer0/embeddings" if numbered_embeddings else "bert/embeddings"
    blocks = [BlockSpec(emb_name, "bert.embeddings", (
        OpSpec("word_embeddings/Gather", "gather", act, weight_bytes=vocab * hidden * p, temp_bytes=act // 8,
               flops=batch * seq * hidden, tiles=tiles),
        OpSpec("position_embeddings/Add", "elementwise", act, weight_bytes=512 * hidden * p,
               flops=batch * seq * hidden, tiles=368),
        OpSpec("LayerNorm", "norm", act, weight_bytes=2 * hidden * p, flops=8.0 * batch * seq * hidden, tiles=736),
    ))]
    for i in range(layers):
        n = i + 1 if numbered_embeddings else i
        blocks.append(BlockSpec(f"bert/encoder/layer{n}", f"bert.encoder.layer.{n}", (
            mm("attention/self/query", hidden, hidden),
            mm("attention/self/key", hidden, hidden),
            mm("attention/self/value", hidden, hidden),
            OpSpec("attention/self/scores/MatMul", "matmul", attn, temp_bytes=attn // 4,
                   flops=2.0 * batch * seq * seq * hidden, tiles=tiles),
            OpSpec("attention/self/Softmax", "softmax", attn, temp_bytes=attn // 2,
                   flops=5.0 * batch * heads * seq * seq, tiles=tiles),
            OpSpec("attention/self/context/MatMul", "matmul", act, temp_bytes=act // 2,
                   flops=2.0 * batch * seq * seq * hidden, tiles=wide),
            mm("attention/output/dense", hidden, hidden),
            OpSpec("attention/output/LayerNorm", "norm", act, weight_bytes=2 * hidden * p,
                   flops=8.0 * batch * seq * hidden, tiles=736),
            mm("intermediate/dense", hidden, 4 * hidden, out=4 * act, t=tiles),
            OpSpec("intermediate/Gelu", "elementwise", 4 * act, flops=8.0 * batch * seq * 4 * hidden, tiles=tiles),
            mm("output/dense", 4 * hidden, hidden, t=tiles),
            OpSpec("output/LayerNorm", "norm", act, weight_bytes=2 * hidden * p, flops=8.0 * batch * seq * hidden,
                   tiles=736),
        )))
    head_name = f"bert/layer{layers + 1}/cls/predictions" if numbered_embeddings else "cls/predictions"
    logits = batch * seq * vocab * 2 // 8          # masked positions only
    blocks.append(BlockSpec(head_name, "cls.predictions", (
        mm("transform/dense", hidden, hidden),
        OpSpec("transform/LayerNorm", "norm", act, weight_bytes=2 * hidden * p, flops=8.0 * batch * seq * hidden,
               tiles=736),
        OpSpec("decoder/MatMul", "matmul", logits, temp_bytes=logits // 2, flops=2.0 * batch * seq // 8 * hidden * vocab,
               tiles=tiles, tied_to=f"{emb_name}/word_embeddings/Gather"),
        OpSpec("loss/SoftmaxCrossEntropy", "loss", batch * seq * 4, temp_bytes=logits,
               flops=6.0 * batch * seq // 8 * vocab, tiles=tiles, saved=False),
    )))
    size = "base" if layers == 12 and hidden == 768 else ("large" if hidden == 1024 else f"{layers}x{hidden}")
    return SynthModel(f"bert-{size}", f"BERT-{size}-like encoder training step (synthetic): embeddings, "
                      f"{layers} encoder layers, masked-LM head; hidden {hidden}, sequence {seq}, micro-batch {batch}",
                      blocks, options or SynthOptions())


def gpt(layers: int = 16, hidden: int = 1024, seq: int = 512, batch: int = 2, vocab: int = 50257, heads: int = 16,
        bytes_per_param: int = 8, tiles: int = 1472, options: SynthOptions | None = None) -> SynthModel:
    """A GPT-like decoder: token/position embeddings, ``layers`` blocks ``h.N``, tied LM head."""
    act = batch * seq * hidden * 2
    attn = batch * heads * seq * seq * 2
    p = bytes_per_param

    def mm(name, w_in, w_out, out=None, t=tiles):
        return OpSpec(name, "matmul", out or act, weight_bytes=(w_in * w_out + w_out) * p, temp_bytes=act // 4,
                      flops=2.0 * batch * seq * w_in * w_out, tiles=t)

    blocks = [BlockSpec("transformer/wte", "transformer.wte", (
        OpSpec("Gather", "gather", act, weight_bytes=vocab * hidden * p, flops=batch * seq * hidden, tiles=tiles),
        OpSpec("wpe/Add", "elementwise", act, weight_bytes=2048 * hidden * p, flops=batch * seq * hidden, tiles=368),
    ))]
    for i in range(layers):
        blocks.append(BlockSpec(f"transformer/h.{i}", f"transformer.h.{i}", (
            OpSpec("ln_1", "norm", act, weight_bytes=2 * hidden * p, flops=8.0 * batch * seq * hidden, tiles=736),
            mm("attn/c_attn", hidden, 3 * hidden, out=3 * act),
            OpSpec("attn/scores", "matmul", attn, temp_bytes=attn // 4, flops=2.0 * batch * seq * seq * hidden,
                   tiles=tiles),
            OpSpec("attn/softmax", "softmax", attn, temp_bytes=attn // 2, flops=5.0 * batch * heads * seq * seq,
                   tiles=tiles),
            OpSpec("attn/context", "matmul", act, temp_bytes=act // 2, flops=2.0 * batch * seq * seq * hidden,
                   tiles=tiles),
            mm("attn/c_proj", hidden, hidden),
            OpSpec("ln_2", "norm", act, weight_bytes=2 * hidden * p, flops=8.0 * batch * seq * hidden, tiles=736),
            mm("mlp/c_fc", hidden, 4 * hidden, out=4 * act),
            OpSpec("mlp/gelu", "elementwise", 4 * act, flops=8.0 * batch * seq * 4 * hidden, tiles=tiles),
            mm("mlp/c_proj", 4 * hidden, hidden),
        )))
    logits = batch * seq * vocab * 2
    blocks.append(BlockSpec("lm_head", "lm_head", (
        OpSpec("ln_f", "norm", act, weight_bytes=2 * hidden * p, flops=8.0 * batch * seq * hidden, tiles=736),
        OpSpec("MatMul", "matmul", logits, temp_bytes=logits // 4, flops=2.0 * batch * seq * hidden * vocab,
               tiles=tiles, tied_to="transformer/wte/Gather"),
        OpSpec("loss/CrossEntropy", "loss", batch * seq * 4, temp_bytes=logits // 2, flops=6.0 * batch * seq * vocab,
               tiles=tiles, saved=False),
    )))
    return SynthModel(f"gpt-{layers}x{hidden}", f"GPT-like decoder training step (synthetic): {layers} blocks, "
                      f"hidden {hidden}, sequence {seq}, micro-batch {batch}, tied LM head", blocks,
                      options or SynthOptions())


# (stage, repeats, expansion, output channels, stride, kernel): an EfficientNet-B3-like schedule
_CNN_STAGES = [(1, 2, 1, 24, 1, 3), (2, 3, 6, 32, 2, 3), (3, 3, 6, 48, 2, 5), (4, 5, 6, 96, 2, 3),
               (5, 5, 6, 136, 1, 5), (6, 6, 6, 232, 2, 5), (7, 2, 6, 384, 1, 3)]


def cnn(image: int = 300, batch: int = 6, bytes_per_param: int = 8, tiles: int = 1472,
        options: SynthOptions | None = None) -> SynthModel:
    """An EfficientNet-like CNN with very uneven layers: early blocks hold huge activations and
    little weight, late blocks the reverse."""
    p = bytes_per_param
    res = image // 2
    channels = 40
    blocks = [BlockSpec("stem", "stem", (
        OpSpec("conv", "conv", batch * res * res * channels * 2, weight_bytes=27 * channels * p,
               temp_bytes=batch * res * res * channels, flops=2.0 * batch * res * res * 27 * channels, tiles=tiles),
        OpSpec("bn", "norm", batch * res * res * channels * 2, weight_bytes=4 * channels * p,
               flops=8.0 * batch * res * res * channels, tiles=tiles),
    ))]
    index = 0
    for _, repeats, expand, out_ch, stride, kernel in _CNN_STAGES:
        for r in range(repeats):
            s = stride if r == 0 else 1
            in_res, out_res = res, res // s
            mid = channels * expand
            act_in = batch * in_res * in_res * mid * 2
            act_out = batch * out_res * out_res * mid * 2
            ops = []
            if expand > 1:
                ops.append(OpSpec("conv_pw", "conv", act_in, weight_bytes=channels * mid * p, temp_bytes=act_in // 4,
                                  flops=2.0 * batch * in_res * in_res * channels * mid, tiles=tiles))
                ops.append(OpSpec("bn1", "norm", act_in, weight_bytes=4 * mid * p, flops=8.0 * act_in / 2, tiles=tiles))
            ops.append(OpSpec("conv_dw", "depthwise", act_out, weight_bytes=kernel * kernel * mid * p,
                              temp_bytes=act_out // 4, flops=2.0 * batch * out_res * out_res * kernel * kernel * mid,
                              tiles=tiles))
            ops.append(OpSpec("bn2", "norm", act_out, weight_bytes=4 * mid * p, flops=8.0 * act_out / 2, tiles=tiles))
            squeeze = max(1, channels // 4)
            ops.append(OpSpec("se", "matmul", act_out, weight_bytes=2 * mid * squeeze * p,
                              flops=4.0 * batch * mid * squeeze + act_out, tiles=368))
            ops.append(OpSpec("conv_pwl", "conv", batch * out_res * out_res * out_ch * 2,
                              weight_bytes=mid * out_ch * p, temp_bytes=act_out // 8,
                              flops=2.0 * batch * out_res * out_res * mid * out_ch, tiles=tiles))
            ops.append(OpSpec("bn3", "norm", batch * out_res * out_res * out_ch * 2, weight_bytes=4 * out_ch * p,
                              flops=4.0 * batch * out_res * out_res * out_ch, tiles=tiles))
            blocks.append(BlockSpec(f"blocks_{index}", f"blocks.{index}", tuple(ops)))
            channels, res = out_ch, out_res
            index += 1
    head_ch = 1536
    blocks.append(BlockSpec("head", "head", (
        OpSpec("conv_head", "conv", batch * res * res * head_ch * 2, weight_bytes=channels * head_ch * p,
               flops=2.0 * batch * res * res * channels * head_ch, tiles=tiles),
        OpSpec("pool", "elementwise", batch * head_ch * 2, flops=batch * res * res * head_ch, tiles=368),
        OpSpec("classifier", "matmul", batch * 1000 * 2, weight_bytes=head_ch * 1000 * p,
               flops=2.0 * batch * head_ch * 1000, tiles=736),
        OpSpec("loss", "loss", batch * 4, temp_bytes=batch * 1000 * 4, flops=6.0 * batch * 1000, tiles=64, saved=False),
    )))
    return SynthModel("cnn-efficientnet", f"EfficientNet-like CNN training step (synthetic): stem, {index} MBConv "
                      f"blocks with very uneven memory, head; image {image}, micro-batch {batch}", blocks,
                      options or SynthOptions())


FAMILIES = {
    "bert-base": lambda **kw: bert(**kw),
    "bert-large": lambda **kw: bert(layers=24, hidden=1024, heads=16, numbered_embeddings=True, **kw),
    "gpt": lambda **kw: gpt(**kw),
    "cnn": lambda **kw: cnn(**kw),
}


# ----------------------------------------------------------------------------------------------
# Generation

@dataclass
class _Tensor:
    var_ids: np.ndarray
    name: str


class _Generator:
    """Lays out one training step of ``model`` on ``target``. Per-program costs (the bulk of a
    large profile: tens of millions of rows) go to ``costs``: the profile builder by default,
    or temporary files (``_SpilledCosts``) when the profile is streamed to disk."""

    def __init__(self, model: SynthModel, target: Target, costs: _SpilledCosts | None = None):
        self.model = model
        self.opt = model.options
        self.target = target
        self.T = target.tiles
        self.rng = np.random.default_rng(self.opt.seed)
        self.spilled = costs

    def spread(self, nbytes: int, tile0: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Split ``nbytes`` into pieces on ``width`` tiles from ``tile0`` (wrapping)."""
        width = max(1, min(width, self.T))
        pieces = int(max(1, min(width * 4, nbytes // self.opt.piece_bytes)))
        sizes = np.full(pieces, nbytes // pieces, np.int64)
        sizes[: nbytes - sizes.sum()] += 1
        tiles = (tile0 + (np.arange(pieces) * width) // pieces) % self.T
        return sizes, tiles

    def run(self) -> Profile:
        m = self.model
        ppo = self.opt.programs_per_op
        # --- the schedule: (kind, block, op) per operation instance, in program order ------------
        chain = [(bi, oi) for bi, blk in enumerate(m.blocks) for oi in range(len(blk.ops))]
        fwd_steps = {}
        grad_steps = {}
        update_steps = {}
        step = 0
        prologue = (step, step)
        step += 1
        for bo in chain:
            fwd_steps[bo] = (step, step + ppo - 1)
            step += ppo
        for bo in reversed(chain):
            op = m.blocks[bo[0]].ops[bo[1]]
            if op.saved or op.weight_bytes:
                grad_steps[bo] = (step, step + 2 * ppo - 1)
                step += 2 * ppo
                if op.weight_bytes:
                    update_steps[bo] = (step, step)
                    step += 1
        epilogue = (step, step)
        step += 1
        nsteps = step
        names = []
        for bo in chain:
            blk, op = m.blocks[bo[0]], m.blocks[bo[0]].ops[bo[1]]
            names += [f"{blk.op_prefix}/{op.name}/{'Exchange' if k % 2 == 0 else 'Compute'}{k // 2}" for k in range(ppo)]
        info = ProfileInfo(name=m.name, source="synthetic", description=m.description, synthetic=True,
                           compute_source="compile-time cycle estimates (synthetic)")
        b = ProfileBuilder(self.target, nsteps, "cycles", info)
        self.b: ProfileBuilder | None = b
        add_costs = b.program_costs if self.spilled is None else self.spilled.sink(b)
        step_names = ["host/StreamCopyBegin"] + names
        for bo in reversed(chain):
            blk, op = m.blocks[bo[0]], m.blocks[bo[0]].ops[bo[1]]
            if bo in grad_steps:
                step_names += [f"{blk.op_prefix}/{op.name}/Grad/{'Exchange' if k % 2 == 0 else 'Compute'}{k // 2}"
                               for k in range(2 * ppo)]
            if bo in update_steps:
                step_names.append(f"{blk.op_prefix}/{op.name}/Update")
        step_names.append("optimizer/StepCounter")
        b.steps = step_names
        assert len(step_names) == nsteps

        offsets = {bo: int(self.rng.integers(0, self.T)) for bo in chain}
        full = {bo: f"{m.blocks[bo[0]].op_prefix}/{m.blocks[bo[0]].ops[bo[1]].name}" for bo in chain}
        by_full = {v: k for k, v in full.items()}

        def tensor(nbytes, bo, name, live, scale_tiles=1.0):
            op = m.blocks[bo[0]].ops[bo[1]]
            sizes, tiles = self.spread(int(nbytes), offsets[bo], int(op.tiles * scale_tiles))
            if live == "always":
                cls = np.full(len(sizes), -1)
                always = np.ones(len(sizes), bool)
            else:
                cls = np.full(len(sizes), b.liveness_class([live]))
                always = np.zeros(len(sizes), bool)
            ids = b.variables(sizes, tiles, cls, always_live=always, name=np.full(len(sizes), b.name_id(name)))
            return _Tensor(ids, name)

        # --- variables -------------------------------------------------------------------------
        # A tensor goes live at the program step that writes it and dies after the step that
        # last reads it, so most steps start or end something (as in a compiled program).
        def inside(first, last, span):
            return int(first + self.rng.integers(0, max(1, last - first - span + 2)))

        # keyed by (block, op); .get(None) (no previous op, no tied weight) gives None
        weights: dict[Any, Any] = {}
        outputs: dict[Any, Any] = {}
        temps: dict[Any, Any] = {}
        grads: dict[Any, Any] = {}
        wgrads: dict[Any, Any] = {}
        gtemps: dict[Any, Any] = {}
        for n, bo in enumerate(chain):
            blk, op = m.blocks[bo[0]], m.blocks[bo[0]].ops[bo[1]]
            f0, f1 = fwd_steps[bo]
            tname = f"{blk.tensor_prefix}.{op.name.replace('/', '.')}"
            if op.weight_bytes:
                weights[bo] = tensor(op.weight_bytes, bo, f"{tname}.weight", "always")
            consumer = chain[n + 1] if n + 1 < len(chain) else None
            end = fwd_steps[consumer][0] + 1 if consumer else f1
            if op.saved and bo in grad_steps:
                end = max(end, grad_steps[bo][0] + 1)
            outputs[bo] = tensor(op.out_bytes, bo, f"{blk.op_prefix}/{op.name}/output", (f1, end + 1))
            if op.temp_bytes:
                t0 = inside(f0, f1, 2)
                temps[bo] = tensor(op.temp_bytes, bo, f"{blk.op_prefix}/{op.name}/workspace", (t0, min(t0 + 2, f1 + 1)))
        grad_chain = [bo for bo in reversed(chain) if bo in grad_steps]
        for n, bo in enumerate(grad_chain):
            blk, op = m.blocks[bo[0]], m.blocks[bo[0]].ops[bo[1]]
            g0, g1 = grad_steps[bo]
            nxt = grad_chain[n + 1] if n + 1 < len(grad_chain) else None
            end = grad_steps[nxt][0] + 1 if nxt else g1
            grads[bo] = tensor(op.out_bytes, bo, f"{blk.op_prefix}/{op.name}/input_grad", (g1, end + 1))
            if op.weight_bytes:
                u = update_steps[bo][0]
                wgrads[bo] = tensor(op.weight_bytes // 4, bo, f"{blk.op_prefix}/{op.name}/weight_grad", (g1, u + 1))
            t0 = inside(g0, g1, 3)
            gtemps[bo] = tensor(max(op.temp_bytes, op.out_bytes // 4), bo, f"{blk.op_prefix}/{op.name}/grad_workspace",
                                (t0, min(t0 + 3, g1 + 1)))
        # shared: stream buffers and seeds on every tile that no operation uses, plus a counter
        shared_sizes = np.full(self.T, self.opt.shared_bytes_per_tile, np.int64)
        b.variables(shared_sizes, np.arange(self.T), np.full(self.T, -1), always_live=np.ones(self.T, bool),
                    name=np.full(self.T, b.name_id("host/stream_buffers")))
        counter = b.variables(np.full(self.T, 16, np.int64), np.arange(self.T), np.full(self.T, -1),
                              always_live=np.ones(self.T, bool), name=np.full(self.T, b.name_id("optimizer/step")))

        # --- programs and operations ------------------------------------------------------------
        def programs_for(bo, first, count, kind, flops, out_bytes):
            op = m.blocks[bo[0]].ops[bo[1]]
            width = max(1, min(op.tiles, self.T))
            tiles = (offsets[bo] + np.arange(width)) % self.T
            per_tile_out = out_bytes / width
            progs = []
            for k in range(count):
                name = b.steps[first + k]
                if k % 2 == 0:
                    p = b.program(name, "DoExchange",
                                  cycles=per_tile_out / self.opt.exchange_bytes_per_cycle + 50, vertices=0)
                    ex = (per_tile_out / 96 + 24 + 8 * ((tiles * 13 + p) % 4)).astype(np.int64)
                    add_costs("exchange_code", p, tiles, ex)
                else:
                    vpt = 6
                    p = b.program(name, "OnTileExecute",
                                  cycles=flops / max(1, count // 2) / (width * self.opt.flops_per_tile_cycle) + 120,
                                  vertices=vpt * width)
                    for vtype, size in VERTEX_TYPES[kind]:
                        add_costs("vertex_code", p, tiles, size, vertex_type=vtype)
                    add_costs("vertex_state", p, tiles, vpt * 8 + 8 * ((tiles * 5 + p) % 6))
                add_costs("control_code", p, tiles, 12 + 4 * ((tiles * 7 + p) % 6))
                progs.append(p)
            return progs

        debug = 0

        def vars_of(*tensors):
            return np.concatenate([t.var_ids for t in tensors if t is not None]) if tensors else np.zeros(0, np.int64)

        b.operation("host/StreamCopy", prologue[0], prologue[1], vars=np.zeros(0, np.int64),
                    programs=[b.program("host/StreamCopyBegin", "StreamCopyBegin", cycles=200.0)], debug_id=debug)
        for n, bo in enumerate(chain):
            blk, op = m.blocks[bo[0]], m.blocks[bo[0]].ops[bo[1]]
            f0, f1 = fwd_steps[bo]
            prev = chain[n - 1] if n > 0 else None
            w = weights.get(bo) if op.tied_to is None else weights.get(by_full.get(op.tied_to))
            inputs = ([outputs[prev].name] if prev else ["input"]) + ([w.name] if w is not None else [])
            debug += 1
            b.operation(full[bo], f0, f1, vars=vars_of(w, outputs[bo], temps.get(bo), outputs.get(prev)),
                        programs=programs_for(bo, f0, ppo, op.kind, op.flops, op.out_bytes), inputs=inputs,
                        debug_id=debug)
        for n, bo in enumerate(grad_chain):
            blk, op = m.blocks[bo[0]], m.blocks[bo[0]].ops[bo[1]]
            g0, g1 = grad_steps[bo]
            prev = grad_chain[n - 1] if n > 0 else None
            w = weights.get(bo) if op.tied_to is None else weights.get(by_full.get(op.tied_to))
            saved = outputs[bo] if op.saved else None
            debug += 1
            b.operation(f"{full[bo]}/Grad", g0, g1,
                        vars=vars_of(w, saved, grads[bo], grads.get(prev), wgrads.get(bo), gtemps[bo]),
                        programs=programs_for(bo, g0, 2 * ppo, op.kind, 2 * op.flops, op.out_bytes),
                        inputs=[t.name for t in (saved, grads.get(prev), w) if t is not None], debug_id=debug)
            if bo in update_steps:
                u = update_steps[bo][0]
                debug += 1
                width = max(1, min(op.tiles, self.T))
                tiles = (offsets[bo] + np.arange(width)) % self.T
                p = b.program(b.steps[u], "OnTileExecute", cycles=op.weight_bytes / (width * 8.0) + 80,
                              vertices=2 * width)
                for vtype, size in VERTEX_TYPES["update"]:
                    add_costs("vertex_code", p, tiles, size, vertex_type=vtype)
                add_costs("vertex_state", p, tiles, 64)
                add_costs("control_code", p, tiles, 48)
                b.operation(f"{full[bo]}/Update", u, u, vars=vars_of(w if op.tied_to is None else None, wgrads[bo]),
                            programs=[p], inputs=[wgrads[bo].name] + ([w.name] if w is not None else []),
                            debug_id=debug)
        debug += 1
        p = b.program("optimizer/StepCounter", "OnTileExecute", cycles=40.0, vertices=self.T)
        add_costs("control_code", p, np.arange(self.T), 32)
        b.operation("optimizer/StepCounter", epilogue[0], epilogue[1], vars=counter, programs=[p], debug_id=debug)
        profile = b.build()
        # the builder's copies of the cost rows are not needed any more: both references dropped
        self.b = b = None  # type: ignore[assignment]  # (b is not used after this)
        if self.spilled is not None:
            self.spilled.check(profile)
        code = None if self.spilled is None else self.spilled.code_per_tile(len(profile.programs.vertex_types))
        profile.ground_truth = ground_truth(profile, self.rng, code=code)
        return profile


#: not-always-live bytes per (tile, step) are computed for blocks of tiles of about this many cells
STEP_BLOCK_CELLS = 1 << 22
_CATEGORY_NAMES = {"vertex_state": "vertex_instance_state", "exchange_code": "internal_exchange_code",
                   "control_code": "control_code"}


def code_per_tile(profile: Profile) -> dict[str, np.ndarray]:
    """Per tile: vertex code (each vertex type's code once per tile, the largest where programs
    differ) and the sum of each other code category, named as ground truth names them."""
    p = profile
    T = p.target.tiles
    pr = p.programs
    vc = pr.vertex_code
    ntypes = max(len(pr.vertex_types), 1)
    cell = vc.tile.astype(np.int64) * ntypes + vc.vertex_type
    key = np.unique(cell)
    size = np.zeros(len(key), np.int64)
    np.maximum.at(size, np.searchsorted(key, cell), vc.bytes)
    code = {"vertex_code": np.bincount(key // ntypes, weights=size, minlength=T).astype(np.int64)}
    for cat, costs in pr.categories().items():
        code[_CATEGORY_NAMES[cat]] = np.bincount(costs.tile, weights=costs.bytes, minlength=T).astype(np.int64)
    return code


def _steps_by_tile(p: Profile, tiles: np.ndarray) -> np.ndarray:
    """Not-always-live bytes at every step on each of ``tiles`` (one row per tile)."""
    S = p.num_steps
    v = p.variables
    iv = p.liveness.intervals
    on = np.zeros(p.target.tiles, bool)
    on[tiles] = True
    idx = np.flatnonzero(~v.always_live & (v.live_class >= 0) & on[v.tile])
    cls = v.live_class[idx]
    lengths = iv.lengths()[cls]
    rows = np.repeat(idx, lengths)
    first = np.repeat(iv.offsets[cls], lengths)
    within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    intervals = iv.values.reshape(-1, 2)[first + within]
    row_of_tile = np.full(p.target.tiles, -1, np.int64)
    row_of_tile[tiles] = np.arange(len(tiles))
    diff = np.zeros((len(tiles), S + 1), np.int64)
    np.add.at(diff, (row_of_tile[v.tile[rows]], intervals[:, 0]), v.bytes[rows])
    np.add.at(diff, (row_of_tile[v.tile[rows]], intervals[:, 1]), -v.bytes[rows])
    return np.cumsum(diff, axis=1)[:, :S]


def ground_truth(profile: Profile, rng: np.random.Generator | None = None, trace_tiles: int = 8,
                 code: dict[str, np.ndarray] | None = None) -> GroundTruth:
    """Per-tile memory as the profile's own totals would report it, computed directly from the
    variables and programs (not through the cost model), plus small unmodelled categories.
    ``code``: ``code_per_tile``'s result where the profile does not hold its program costs.
    The per-step figures are computed a block of tiles at a time (a profile of thousands of
    steps on 1,472 tiles would otherwise need gigabytes at once)."""
    rng = rng or np.random.default_rng(0)
    p = profile
    T, S = p.target.tiles, p.num_steps
    v = p.variables
    al = v.always_live
    always = np.bincount(v.tile[al], weights=v.bytes[al], minlength=T).astype(np.int64)
    peak = np.zeros(T, np.int64)
    if S:
        block = max(1, STEP_BLOCK_CELLS // (S + 1))
        for start in range(0, T, block):
            peak[start:start + block] = _steps_by_tile(p, np.arange(start, min(T, start + block))).max(axis=1)
    categories = dict(code if code is not None else code_per_tile(p))
    categories["constant"] = rng.integers(64, 512, T).astype(np.int64)
    categories["vector_list_descriptor"] = rng.integers(0, 256, T).astype(np.int64)
    total = always + peak + sum(categories.values())
    top = np.argsort(-total, kind="stable")[:trace_tiles]
    step_bytes = _steps_by_tile(p, top) if len(top) else np.zeros((0, S), np.int64)
    return GroundTruth(always_live=always, not_always_live=peak, categories=categories,
                       step_tiles=top.astype(np.int64), step_bytes=step_bytes)


class _SpilledCosts:
    """Per-program cost rows written to temporary files as the generator makes them (one file
    per column of each category), with the per-tile sums ground truth needs kept as they go."""

    CATEGORIES = {"vertex_code": ("program", "tile", "type", "bytes"), "vertex_state": ("program", "tile", "bytes"),
                  "exchange_code": ("program", "tile", "bytes"), "control_code": ("program", "tile", "bytes")}

    def __init__(self, tiles: int):
        self.T = tiles
        self.columns = {f"{cat}_{part}": Spill(INT) for cat, parts in self.CATEGORIES.items() for part in parts}
        self.sums = {cat: np.zeros(tiles, np.int64) for cat in ("vertex_state", "exchange_code", "control_code")}
        self.type_code: dict[int, np.ndarray] = {}          # vertex type -> its largest code per tile

    def sink(self, builder: ProfileBuilder):
        """``ProfileBuilder.program_costs``'s signature, spilling instead of holding the rows."""
        def add(category: str, program: int, tiles: np.ndarray, nbytes, vertex_type: str | None = None) -> None:
            tiles = np.asarray(tiles, np.int64)
            nbytes = np.broadcast_to(np.asarray(nbytes, np.int64), tiles.shape)
            self.columns[f"{category}_program"].extend(np.full(len(tiles), program, np.int64))
            self.columns[f"{category}_tile"].extend(tiles)
            if category == "vertex_code":
                assert vertex_type is not None              # vertex code names its vertex type
                t = builder.vertex_type(vertex_type)
                self.columns["vertex_code_type"].extend(np.full(len(tiles), t, np.int64))
                sizes = self.type_code.get(t)
                if sizes is None:
                    sizes = self.type_code[t] = np.zeros(self.T, np.int64)
                np.maximum.at(sizes, tiles, nbytes)
            else:
                np.add.at(self.sums[category], tiles, nbytes)
            self.columns[f"{category}_bytes"].extend(nbytes)
        return add

    def code_per_tile(self, ntypes: int) -> dict[str, np.ndarray]:
        """What ``code_per_tile`` gives for the profile with these rows."""
        vertex_code = np.zeros(self.T, np.int64)
        for t in range(ntypes):
            vertex_code += self.type_code.get(t, 0)
        return {"vertex_code": vertex_code, **{_CATEGORY_NAMES[cat]: sums for cat, sums in self.sums.items()}}

    def check(self, profile: Profile) -> None:
        """The rows refer to the profile's programs, tiles and vertex types, with bytes >= 0 (what
        ``Profile.validate`` checks of rows the profile holds)."""
        limits = {"program": len(profile.programs) - 1, "tile": self.T - 1,
                  "type": len(profile.programs.vertex_types) - 1, "bytes": None}
        for name, spill in self.columns.items():
            low, high = spill.range()
            most = limits[name.rsplit("_", 1)[1]]
            if low is not None and (low < 0 or (most is not None and high > most)):
                raise AssertionError(f"synthetic {name} values {low}..{high} outside 0..{most}")

    def close(self) -> None:
        for spill in self.columns.values():
            spill.close()


def synthesize(family: str, target: Target, seed: int = 0, piece_bytes: int | None = None,
               programs_per_op: int | None = None, **params) -> Profile:
    """Generate a synthetic profile of one of ``FAMILIES`` on ``target``."""
    return _Generator(_model(family, target, seed, piece_bytes, programs_per_op, params), target).run()


def _model(family: str, target: Target, seed: int, piece_bytes: int | None, programs_per_op: int | None,
           params: dict) -> SynthModel:
    if family not in FAMILIES:
        raise KeyError(family)
    for parameter, value in (("seed", seed), ("piece_bytes", piece_bytes), ("programs_per_op", programs_per_op),
                             ("layers", params.get("layers"))):
        least = 0 if parameter == "seed" else 1
        if value is not None and value < least:
            raise StagesplitError(f"invalid `{parameter}` {value}: expected an integer >= {least}")
    model = FAMILIES[family](tiles=target.tiles, **params)
    opt = replace(model.options, seed=seed)
    if piece_bytes is not None:
        opt = replace(opt, piece_bytes=piece_bytes)
    if programs_per_op is not None:
        opt = replace(opt, programs_per_op=programs_per_op)
    model.options = opt
    return model


def write_synthetic(path: str | Path, family: str, target: Target, seed: int = 0, piece_bytes: int | None = None,
                    programs_per_op: int | None = None, **params) -> Profile:
    """Generate a synthetic profile as ``synthesize`` does and write it to ``path`` in the
    compact form, streaming its per-program costs through temporary files into the compact
    writer: the file has the same bytes as ``write_compact(synthesize(...))`` while memory stays
    bounded by the variables and operations. Returns the profile without its per-program costs
    (for a summary)."""
    model = _model(family, target, seed, piece_bytes, programs_per_op, params)
    costs = _SpilledCosts(target.tiles)
    try:
        profile = _Generator(model, target, costs).run()
        with atomic_output(Path(path)) as handle:
            writer = CompactWriter(handle)
            write_columns(writer, profile_columns(profile, costs=costs.columns))
            writer.close()
    finally:
        costs.close()
    return profile
