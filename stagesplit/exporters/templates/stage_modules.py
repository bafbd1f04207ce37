# The pipeline stages of a Hugging Face causal language model, built from its own modules (not traced).
#
# This file is inlined, as it is, into the torch-pipelining export of a plan whose layers are the blocks of
# one stack (``model.layers.0``, ``model.layers.1``, ...): it imports only torch, and its names begin with
# ``_`` except ``ModelStage``, ``model_stages`` and ``stage_loss``. Why not torch's tracer (``pipeline()``):
# a traced decoder computes the rotary tables and the causal mask once, at its root, and sends them from
# stage 0 to every later stage; torch refuses those skip connections beyond 2 stages ("Backward of skip
# connections not supported yet") and adjacent-only schedules (interleaved, ZBV) refuse them at any size,
# and gloo refuses the stride-0 mask some families send ("input tensor has to be contiguous"). Here each
# stage holds its blocks (the embeddings on the first, the final norm, head and loss on the last) and runs
# the model's own code for everything around them, so that only the hidden state crosses a stage boundary.
#
# How: the decoder (the module that holds the block stack) runs its own ``forward`` on every stage, with the
# stack replaced by one of the same length whose positions outside this stage pass the hidden state on (so
# that each block is called with what the decoder gives its own position: a sliding-window layer's mask).
# On the first stage it embeds the token ids as the model does; on the others it is handed a zero
# ``inputs_embeds`` of the hidden state's shape that holds no memory (one scalar, expanded) and the stage's
# first block is fed the received hidden state instead (a family that adds position embeddings or scales
# the embeddings makes one hidden state's bytes of it).
# The decoder computes what it computes once per step at its root (positions, rotary cos/sin, the mask or
# SDPA's ``is_causal``) on each stage. The decoder's own modules that hold parameters are sorted by
# one call before the blocks run (embeddings, before them) and after (final norm, after): a stage holds the
# former only if it is the first, the latter only if it is the last; elsewhere they are stand-ins that hold
# nothing. The head and the loss are the model's own ``forward`` around a stand-in for its decoder: with the
# model's own loss, run by the schedule's ``loss_fn`` (``stage_loss``) on the last stage's output, the final
# hidden state (torch keeps that output until the micro-batch's backward, as the model's own head keeps it
# for its weight gradient); with the user's loss, the head runs in the stage, whose output is the logits.
import torch

__all__ = ["ModelStage", "model_stages", "stage_loss"]


class _Hidden(tuple):
    """The decoder's output as the model's head reads it: ``out[0]`` or ``out.last_hidden_state``; every
    other field (cache, attentions) is None."""

    def __getattr__(self, name):
        if name == "last_hidden_state":
            return self[0]
        return None


class _Decoded(torch.nn.Module):
    """Stands in for the model's decoder around the head: returns the ``inputs_embeds`` it is handed (the
    last stage's final hidden state) as the decoder's output."""

    def forward(self, *args, inputs_embeds=None, **kwargs):
        return _Hidden((inputs_embeds,))


class _Nothing(torch.nn.Module):
    """Stands in for a module this stage does not hold: returns a scalar zero (an embedding added to the
    stand-in ``inputs_embeds``), or its first argument where it stood after the blocks."""

    def __init__(self, passthrough):
        super().__init__()
        self.passthrough = passthrough

    def forward(self, *args, **kwargs):
        if self.passthrough and args:
            return args[0]
        return torch.zeros(())


class _Flow:
    """What the positions of one stage's stack share during a forward: the hidden state received from the
    previous stage (fed to the stage's first block instead of what the decoder hands it), the hidden state
    after the stage's last block, and whether the blocks return tuples."""

    def __init__(self, tuples):
        self.received = None
        self.result = None
        self.tuples = tuples


class _Position(torch.nn.Module):
    """One position of the decoder's stack as this stage runs it: this stage's block there (the stage's own,
    wrapped as the export wraps it), or a stand-in that passes the hidden state on. The decoder calls every
    position, so each block gets what the decoder gives that position (the mask and rotary tables of its
    layer type: Gemma's and GPT-OSS's sliding-window layers, Qwen's, Llama 4's chunked ones); an attribute
    the decoder reads off a layer is the original layer's."""

    def __init__(self, flow, original, block=None, first=False):
        super().__init__()
        object.__setattr__(self, "_flow", flow)
        object.__setattr__(self, "_original", original)
        object.__setattr__(self, "_block", block)     # not registered: the stage module registers its blocks
        object.__setattr__(self, "_first", first)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_original"], name)

    def forward(self, hidden, *args, **kwargs):
        flow = self._flow
        if self._block is None:        # not this stage's: the hidden state on, as a block returns it
            return (hidden,) if flow.tuples else hidden
        if self._first and flow.received is not None:
            hidden, flow.received = flow.received, None
        out = self._block(hidden, *args, **kwargs)
        flow.result = out[0] if isinstance(out, tuple) else out
        return out


class _Marker(torch.nn.Module):
    """The stack's first block during ``_sides``'s call: marks where the blocks run and notes whether a block
    returns a tuple (what the decoder reads ``outputs[0]`` of) or the hidden state itself."""

    def __init__(self, calls, block):
        super().__init__()
        self.calls = calls
        self.block = block

    def forward(self, hidden, *args, **kwargs):
        out = self.block(hidden, *args, **kwargs)
        self.calls.append(isinstance(out, tuple))
        return out


def _shell(module, replace):
    """A shallow copy of ``module`` with some children replaced; ``module`` itself is left as it was."""
    shell = object.__new__(type(module))
    shell.__dict__ = dict(module.__dict__)
    shell._modules = {**module._modules, **replace}
    return shell


def _find_stack(model, blocks):
    """(the decoder, the stack's name in it, the path from the model to the decoder)."""
    path, _, name = blocks.rpartition(".")
    decoder = model.get_submodule(path) if path else model
    stack = getattr(decoder, name, None)
    if not isinstance(stack, torch.nn.ModuleList) or not path:
        raise ValueError(f"{blocks!r} is not a stack of blocks (torch.nn.ModuleList) inside the model")
    if not hasattr(model, "get_output_embeddings") or not hasattr(model, "config"):
        raise ValueError("model_stages builds the stages of Hugging Face causal language models (a model with "
                         "get_output_embeddings() and a config); for another model, export with --traced")
    return decoder, name, path.split(".")


def _sides(decoder, stack_name, example_ids):
    """The decoder's children that hold parameters, sorted by one call of its forward on ``example_ids``'s
    first sequence (with the first block alone in the stack; the whole sequence, which a sequence-parallel
    plan shards over its ranks): called before the blocks, after them, never; and whether a block returns a
    tuple."""
    calls = []
    handles = []
    for name, child in decoder.named_children():
        if name != stack_name and any(True for _ in child.parameters()):
            handles.append(child.register_forward_pre_hook(lambda _m, _a, name=name: calls.append(name)))
    first = getattr(decoder, stack_name)[0]
    shell = _shell(decoder, {stack_name: torch.nn.ModuleList([_Marker(calls, first)])})
    try:
        with torch.no_grad():
            shell(input_ids=example_ids[:1], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    turn = next(i for i, call in enumerate(calls) if isinstance(call, bool))
    return calls[:turn], [name for name in calls[turn + 1:] if not isinstance(name, bool)], calls[turn]


class ModelStage(torch.nn.Module):
    """One pipeline stage of a causal language model: blocks ``start`` to ``stop - 1`` of its stack, with the
    embeddings if ``start`` is 0, the final norm and head if ``stop`` is the stack's length. Its parameters
    are the model's own (not copies). Input: the token ids (first stage) or the hidden state; output: the
    hidden state (the last stage's after the final norm, which ``stage_loss`` turns into the loss)."""

    def __init__(self, model, blocks, start, stop, sides, wrap=None, sequence_shards=1):
        super().__init__()
        self.sequence_shards = sequence_shards   # sequence parallelism: the received stream is 1/N of the sequence
        decoder, stack_name, path = _find_stack(model, blocks)
        stack = getattr(decoder, stack_name)
        self.is_first, self.is_last = start == 0, stop == len(stack)
        self.outputs_logits = False     # stage_loss sets it where the loss is the user's, on the logits
        before, after, tuples = sides
        held = (before if self.is_first else []) + (after if self.is_last else [])
        wrap = wrap or (lambda index, block: block)
        self.blocks = torch.nn.ModuleList(wrap(i, stack[i]) for i in range(start, stop))
        own = {name: getattr(decoder, name) for name in held}
        self.decoder_parts = torch.nn.ModuleDict(own)
        self._flow = _Flow(tuples)
        positions = torch.nn.ModuleList(
            _Position(self._flow, stack[i], self.blocks[i - start] if start <= i < stop else None, i == start)
            for i in range(len(stack)))
        standins = {name: _Nothing(passthrough=name in after) for name in before + after if name not in held}
        object.__setattr__(self, "_decoder", _shell(decoder, {stack_name: positions, **standins, **own}))
        if self.is_last:
            # the model's modules around the decoder (the head), and the model with the decoder replaced
            levels = [model]
            for name in path[:-1]:
                levels.append(getattr(levels[-1], name))
            heads = [{name: child for name, child in level.named_children() if name != path[depth]}
                     for depth, level in enumerate(levels)]
            self.head = torch.nn.ModuleDict({f"{depth}_{name}": child for depth, level in enumerate(heads)
                                             for name, child in level.items()})
            stand_in = _Decoded()
            for level, name, own_children in reversed(list(zip(levels, path, heads))):
                stand_in = _shell(level, {**own_children, name: stand_in})
            object.__setattr__(self, "_model", stand_in)

    def forward(self, x):
        if self.is_first:
            out = self._decoder(input_ids=x, use_cache=False)
        else:
            self._flow.received = x
            # the decoder sizes positions, rotary tables and the mask by the whole sequence
            shape = (x.shape[0], x.shape[1] * self.sequence_shards, *x.shape[2:])
            out = self._decoder(inputs_embeds=x.new_zeros(()).expand(shape), use_cache=False)
        result, self._flow.result = self._flow.result, None
        if self.is_last:
            result = out[0]
            if self.outputs_logits:      # the user's loss on the logits: the stage's output, as the capture's
                result = self._model(inputs_embeds=result, use_cache=False).logits
        # a split backward detaches the stage's output in place, which torch refuses for a view (OPT's blocks and
        # GPT-2's decoder end in one): a copy, after which the view and what it viewed are freed
        return result.clone() if result._base is not None else result

    def loss(self, hidden, labels):
        """The model's own head on the final hidden state, then its own loss (labels: the token ids for a
        causal language model)."""
        return self._model(inputs_embeds=hidden, labels=labels, use_cache=False).loss


def model_stages(model, blocks, starts, example_ids, wrap=None, sequence_shards=1):
    """Every stage of ``model`` (a ``ModelStage`` per entry of ``starts``, the first block of each stage),
    sharing the model's modules: build them all on every rank (cheap: nothing is copied) and hand each rank
    its own. A parameter the model ties (GPT-2's embedding and head) is one tensor in two stages: on one rank
    (a V's first and last stage) its gradients add up in it, so the schedule must not scale each stage's
    gradients by the micro-batches on its own (the export's ``train_step`` does it once per tensor).
    ``sequence_shards``: the tensor-parallel ranks a sequence-parallel stream is split over (1: none)."""
    decoder, stack_name, _ = _find_stack(model, blocks)
    sides = _sides(decoder, stack_name, example_ids)
    bounds = [*starts, len(getattr(decoder, stack_name))]
    return [ModelStage(model, blocks, a, b, sides, wrap, sequence_shards) for a, b in zip(bounds, bounds[1:])]


def stage_loss(stage, loss_fn=None):
    """The schedule's ``loss_fn`` for the last stage, as a capture records the step: ``loss_fn`` None, the
    model's own loss (labels given to the model: the loss is inside it), computed with the head from the
    stage's output, the final hidden state, which the head keeps for its backward anyway; else the stage
    outputs the logits (the model's output, which the runtime keeps until the backward as it keeps a
    loss's input) and ``loss_fn(logits, targets)`` is the loss."""
    if loss_fn is None:
        return stage.loss
    stage.outputs_logits = True
    return loss_fn
