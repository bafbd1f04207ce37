"""Stand-ins for the frameworks that cannot be installed here (PopTorch, PopART, TensorFlow for
IPU, optimum-graphcore) and light ones for the property test (torch, DeepSpeed), each with the
signatures and the documented rules the exports must satisfy:

- PopTorch: ``BeginBlock(layer_to_call, user_id=None, ipu_id=None)``; pipelined training needs
  gradient accumulation >= 2 x stages - 1; pipelined inference needs deviceIterations >= stages;
  ``setAvailableMemoryProportion`` takes ``{"IPU<n>": proportion}`` (PopTorch asserts each key
  starts with ``IPU`` and reads the id after it; its docs: values between 0 and 1), one per IPU
  the blocks use.
- PopART: pipelined training needs ``accumulationFactor`` >= 2 x stages - 1; pipelined inference
  needs ``popart.DataFlow`` batches per step >= stages; ``Builder.setAvailableMemoryProportion(
  nodeOutputName, availableMemoryProportion)`` takes 0 < proportion <= 1.
- TensorFlow for IPU ``pipelining_ops.pipeline``: at least 2 computational stages,
  ``gradient_accumulation_count`` required (training: >= 2 x stages - 1), one device per stage;
  a dict infeed reaches the first stage as keyword arguments; ``*_stages_poplar_options`` hold
  one ``PipelineStageOptions(convolution_options, matmul_options)`` (dicts of Poplar option
  strings) per stage; an ``availableMemoryProportion`` is in (0, 1].
- optimum-graphcore ``IPUConfig``: only its own keyword arguments; ``layers_per_ipu`` as long as
  ``ipus_per_replica``; a ``matmul_proportion`` list as long too, its elements >= 0 (optimum) and
  at most 1 (PopLibs' proportion); the model's expansion needs the counts to sum to its
  transformer layers (``IncompatibleIPUConfigError`` otherwise).
"""

from __future__ import annotations

import contextlib
import sys
import types
from dataclasses import dataclass, field


class RuleError(AssertionError):
    """A documented rule of the framework the export broke."""


def _proportion(value) -> bool:
    """An available memory proportion as PopLibs documents it: a number in (0, 1]."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


@contextlib.contextmanager
def installed(*modules: types.ModuleType):
    """``modules`` in ``sys.modules`` for the duration (the previous entries put back after)."""
    saved = {m.__name__: sys.modules.get(m.__name__) for m in modules}
    try:
        for m in modules:
            sys.modules[m.__name__] = m
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


# -- PopTorch -----------------------------------------------------------------------------------------

@dataclass
class PopTorchRecord:
    blocks: list = field(default_factory=list)          # (module path, user_id, ipu_id)
    accumulation: int | None = None
    device_iterations: int | None = None
    strategy: object = None
    memory: dict | None = None

    def check(self, training: bool) -> None:
        stages = len(self.blocks)
        if self.strategy != ("pipelined", "auto-increment"):
            raise RuleError(f"expected PipelinedExecution(AutoStage.AutoIncrement), got {self.strategy}")
        if training and (self.accumulation is None or self.accumulation < 2 * stages - 1):
            raise RuleError(f"pipelined training with {stages} stages needs gradient accumulation >= {2 * stages - 1}, "
                            f"got {self.accumulation}")
        if not training and (self.device_iterations or 1) < stages:
            raise RuleError(f"pipelined inference with {stages} stages needs deviceIterations >= {stages}, "
                            f"got {self.device_iterations}")
        if self.memory is not None:
            ipus = {f"IPU{ipu}" for _, _, ipu in self.blocks}
            if set(self.memory) != ipus or not all(_proportion(v) for v in self.memory.values()):
                raise RuleError(f"setAvailableMemoryProportion({self.memory}) for IPUs {sorted(ipus)}: one proportion "
                                "in (0, 1] per IPU")


def poptorch_module(record: PopTorchRecord) -> types.ModuleType:
    class Training:
        def gradientAccumulation(self, n):
            record.accumulation = n

    class Options:
        def __init__(self):
            self.Training = Training()

        def setExecutionStrategy(self, strategy):
            record.strategy = strategy

        def deviceIterations(self, n):
            record.device_iterations = n

        def setAvailableMemoryProportion(self, available_memory_proportion):   # noqa: N802 - PopTorch's
            for key in available_memory_proportion:                             # as PopTorch reads the keys
                assert key.startswith("IPU"), f"Invalid key: {key}"
                int(key[3:])
            record.memory = dict(available_memory_proportion)

    def BeginBlock(layer_to_call, user_id=None, ipu_id=None):   # noqa: N802 - PopTorch's name and signature
        record.blocks.append((getattr(layer_to_call, "_path", layer_to_call), user_id, ipu_id))
        return ("block", getattr(layer_to_call, "_path", layer_to_call))

    return _module("poptorch", BeginBlock=BeginBlock, Options=Options,
                   PipelinedExecution=lambda stage: ("pipelined", stage),
                   AutoStage=types.SimpleNamespace(AutoIncrement="auto-increment"))


# -- PopART ----------------------------------------------------------------------------------------------

class SessionOptions:
    _known = {"virtualGraphMode", "enablePipelining", "enableGradientAccumulation", "accumulationFactor"}

    def __setattr__(self, name, value):
        if name not in self._known:
            raise AttributeError(f"popart.SessionOptions has no option {name}")
        object.__setattr__(self, name, value)

    def check(self, stages: int, training: bool, batches_per_step: int | None) -> None:
        if getattr(self, "virtualGraphMode", None) != "manual" or not getattr(self, "enablePipelining", False):
            raise RuleError("pipelining needs virtualGraphMode Manual and enablePipelining")
        if training:
            if not getattr(self, "enableGradientAccumulation", False) or \
                    getattr(self, "accumulationFactor", 0) < 2 * stages - 1:
                raise RuleError(f"pipelined training with {stages} stages needs accumulationFactor >= {2 * stages - 1}")
        elif (batches_per_step or 1) < stages:
            raise RuleError(f"pipelined inference with {stages} stages needs batches per step >= {stages}")


def popart_module(options: list) -> types.ModuleType:
    def make():
        opts = SessionOptions()
        options.append(opts)
        return opts
    return _module("popart", SessionOptions=make, VirtualGraphMode=types.SimpleNamespace(Manual="manual"))


class FakeBuilder:
    """PopART's builder as the snippet uses it: virtualGraph and pipelineStage scopes."""

    def __init__(self):
        self.virtual_graph = None
        self.pipeline_stage = None
        self.memory_proportions: list = []       # (output, proportion, virtual graph, pipeline stage)

    def setAvailableMemoryProportion(self, nodeOutputName, availableMemoryProportion):  # noqa: N802,N803 - PopART's
        if not isinstance(nodeOutputName, str) or not _proportion(availableMemoryProportion):
            raise RuleError(f"setAvailableMemoryProportion({nodeOutputName!r}, {availableMemoryProportion!r}): "
                            "expected a tensor id and 0 < proportion <= 1")
        self.memory_proportions.append((nodeOutputName, availableMemoryProportion, self.virtual_graph,
                                        self.pipeline_stage))

    @contextlib.contextmanager
    def _scope(self, attr, value):
        old = getattr(self, attr)
        setattr(self, attr, value)
        try:
            yield
        finally:
            setattr(self, attr, old)

    def virtualGraph(self, value):  # noqa: N802 - PopART's name
        return self._scope("virtual_graph", value)

    def pipelineStage(self, value):  # noqa: N802 - PopART's name
        return self._scope("pipeline_stage", value)


# -- TensorFlow for IPU ----------------------------------------------------------------------------------

class PipelineStageOptions:
    """``pipelining_ops.PipelineStageOptions(convolution_options=None, matmul_options=None)``:
    dictionaries of Poplar option flags (strings) for a stage's convolutions and matmuls."""

    def __init__(self, convolution_options=None, matmul_options=None):
        for what, value in (("convolution_options", convolution_options), ("matmul_options", matmul_options)):
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"PipelineStageOptions.{what} must be dictionary.")
            for key, flag in (value or {}).items():
                if not isinstance(key, str) or not isinstance(flag, str):
                    raise TypeError(f"PipelineStageOptions.{what}: Poplar option flags are strings, got {key!r}: "
                                    f"{flag!r}")
                if key == "availableMemoryProportion" and not _proportion(float(flag)):
                    raise RuleError(f"{what}: availableMemoryProportion {flag!r} is not in (0, 1]")
        self.convolution_options = dict(convolution_options or {})
        self.matmul_options = dict(matmul_options or {})


def tensorflow_modules(calls: list, training: bool) -> list[types.ModuleType]:
    def pipeline(computational_stages, gradient_accumulation_count=None, gradient_accumulation_dtype=None,
                 repeat_count=1, inputs=None, infeed_queue=None, outfeed_queue=None, optimizer_function=None,
                 device_mapping=None, pipeline_schedule=None, forward_propagation_stages_poplar_options=None,
                 backward_propagation_stages_poplar_options=None, name=None, **more):
        if gradient_accumulation_count is None:
            raise ValueError("gradient_accumulation_count must be specified.")
        if len(computational_stages) < 2:
            raise ValueError("Pipeline requires at least two computational stages.")
        if device_mapping is None or len(device_mapping) != len(computational_stages):
            raise ValueError("Each stage must be mapped to an IPU")
        stages = len(computational_stages)
        if training and gradient_accumulation_count < 2 * stages - 1:
            raise RuleError(f"pipelined training with {stages} stages needs gradient_accumulation_count >= "
                            f"{2 * stages - 1}, got {gradient_accumulation_count}")
        if not training and gradient_accumulation_count < stages:
            raise RuleError(f"pipelined inference with {stages} stages needs gradient_accumulation_count >= {stages}")
        for what, given in (("forward", forward_propagation_stages_poplar_options),
                            ("backward", backward_propagation_stages_poplar_options)):
            if given is not None and (len(given) != stages or
                                      not all(isinstance(o, PipelineStageOptions) for o in given)):
                raise ValueError(f"{what}_propagation_stages_poplar_options: expected one PipelineStageOptions per "
                                 f"computational stage ({stages})")
        calls.append(dict(computational_stages=computational_stages, device_mapping=device_mapping,
                          gradient_accumulation_count=gradient_accumulation_count, inputs=inputs,
                          infeed_queue=infeed_queue, forward_options=forward_propagation_stages_poplar_options,
                          backward_options=backward_propagation_stages_poplar_options))
        return "pipeline-op"

    ipu = types.SimpleNamespace(pipelining_ops=types.SimpleNamespace(pipeline=pipeline,
                                                                     PipelineStageOptions=PipelineStageOptions))
    tf = _module("tensorflow")
    tf.python = _module("tensorflow.python", ipu=ipu)
    return [tf, tf.python]


# -- optimum-graphcore ------------------------------------------------------------------------------------

class IncompatibleIPUConfigError(ValueError):
    pass


#: IPUConfig.__init__'s keyword arguments (optimum/graphcore/ipu_configuration.py)
IPU_CONFIG_ARGUMENTS = {
    "replication_factor", "inference_replication_factor", "gradient_accumulation_steps", "layers_per_ipu",
    "inference_layers_per_ipu", "ipus_per_replica", "inference_ipus_per_replica", "optimizer_state_offchip",
    "replicated_tensor_sharding", "matmul_proportion", "inference_matmul_proportion", "enable_half_partials",
    "embedding_serialization_factor", "inference_embedding_serialization_factor",
    "serialized_embedding_splits_per_ipu", "inference_serialized_embedding_splits_per_ipu",
    "projection_serialization_factor", "inference_projection_serialization_factor",
    "serialized_projection_splits_per_ipu", "inference_serialized_projection_splits_per_ipu",
    "recompute_checkpoint_every_layer", "device_iterations", "inference_device_iterations", "output_mode", "seed",
    "auto_loss_scaling", "executable_cache_dir", "explicit_ir_inference", "parallelize_kwargs",
    "inference_parallelize_kwargs"}


class IPUConfig:
    """optimum's IPUConfig as far as the export uses it: its arguments, defaults and checks."""

    def __init__(self, **kwargs):
        unknown = set(kwargs) - IPU_CONFIG_ARGUMENTS
        if unknown:
            raise IncompatibleIPUConfigError(f"IPUConfig received unknown arguments: {sorted(unknown)}")
        self.layers_per_ipu = kwargs.get("layers_per_ipu", [-1])
        self.inference_layers_per_ipu = kwargs.get("inference_layers_per_ipu") or self.layers_per_ipu
        self.ipus_per_replica = kwargs.get("ipus_per_replica") or len(self.layers_per_ipu)
        fallback = self.ipus_per_replica
        if fallback == len(self.layers_per_ipu) or self.inference_layers_per_ipu != [-1]:
            fallback = len(self.inference_layers_per_ipu)
        self.inference_ipus_per_replica = kwargs.get("inference_ipus_per_replica") or fallback
        self.matmul_proportion = kwargs.get("matmul_proportion", 0.2)
        self.inference_matmul_proportion = kwargs.get("inference_matmul_proportion") or (
            0.2 if isinstance(self.matmul_proportion, list)
            and len(self.matmul_proportion) != self.inference_ipus_per_replica else self.matmul_proportion)
        self.gradient_accumulation_steps = kwargs.get("gradient_accumulation_steps", 1)
        for prefix in ("", "inference_"):
            ipus = getattr(self, f"{prefix}ipus_per_replica")
            proportion = getattr(self, f"{prefix}matmul_proportion")
            layers = getattr(self, f"{prefix}layers_per_ipu")
            if isinstance(proportion, list) and len(proportion) != ipus:
                raise IncompatibleIPUConfigError(f"{prefix}matmul_proportion={proportion} for {ipus} IPUs")
            values = proportion if isinstance(proportion, list) else [proportion]
            if any(isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0 for v in values):
                raise ValueError(f"`IPUConfig` attribute `{prefix}matmul_proportion` must have all elements >= 0")
            if not all(_proportion(v) for v in values):
                raise RuleError(f"{prefix}matmul_proportion={proportion}: PopLibs' proportion is in (0, 1]")
            if -1 not in layers and len(layers) != ipus:
                raise IncompatibleIPUConfigError(f"{prefix}layers_per_ipu={layers} for {ipus} IPUs")

    def layer_ipus(self, transformer_layers: int, training: bool) -> list[int]:
        """The IPU of each transformer layer, as optimum's parallelize() gets it (no wildcards)."""
        prefix = "" if training else "inference_"
        counts = getattr(self, f"{prefix}layers_per_ipu")
        if not all(isinstance(n, int) and n >= 0 for n in counts):
            raise IncompatibleIPUConfigError(f"invalid layers_per_ipu {counts}")
        if sum(counts) != transformer_layers:
            raise IncompatibleIPUConfigError(
                f"layers_per_ipu does not define the correct number of layers for the current model: {sum(counts)} "
                f"but there are {transformer_layers}")
        if training and self.ipus_per_replica > 1 and self.gradient_accumulation_steps < 2 * self.ipus_per_replica - 1:
            raise RuleError(f"pipelined training on {self.ipus_per_replica} IPUs needs gradient accumulation >= "
                            f"{2 * self.ipus_per_replica - 1}")
        return [ipu for ipu, n in enumerate(counts) for _ in range(n)]


def optimum_modules(configs: list) -> list[types.ModuleType]:
    def make(**kwargs):
        config = IPUConfig(**kwargs)
        configs.append(config)
        return config
    optimum = _module("optimum")
    optimum.graphcore = _module("optimum.graphcore", IPUConfig=make)
    return [optimum, optimum.graphcore]


# -- torch and DeepSpeed, for executing the definitions only -------------------------------------------------

def torch_modules() -> list[types.ModuleType]:
    def refuse(*args, **kwargs):
        raise RuleError("the stand-in torch runs nothing")
    pipelining = _module("torch.distributed.pipelining", pipeline=refuse, PipelineStage=refuse, ScheduleGPipe=refuse,
                         Schedule1F1B=refuse, SplitPoint=types.SimpleNamespace(BEGINNING="beginning"))
    distributed = _module("torch.distributed", pipelining=pipelining, get_rank=refuse, new_group=refuse,
                          all_reduce=refuse)
    # the stage classes of an export (stage_modules.py) derive from torch.nn.Module: a class that runs nothing
    nn = _module("torch.nn", Module=type("Module", (), {"__init__": refuse}))
    torch = _module("torch", distributed=distributed, nn=nn, zeros_like=refuse)
    return [torch, distributed, pipelining, nn]


def deepspeed_modules() -> list[types.ModuleType]:
    class PipelineModule:
        pass
    deepspeed = _module("deepspeed")
    deepspeed.pipe = _module("deepspeed.pipe", PipelineModule=PipelineModule)
    return [deepspeed, deepspeed.pipe]


def all_modules(training: bool = True) -> tuple[list[types.ModuleType], dict]:
    """Every stand-in, and where they record what the snippets did."""
    record = {"poptorch": PopTorchRecord(), "popart": [], "tf": [], "optimum": []}
    modules = [poptorch_module(record["poptorch"]), popart_module(record["popart"]),
               *tensorflow_modules(record["tf"], training), *optimum_modules(record["optimum"]), *torch_modules(),
               *deepspeed_modules()]
    return modules, record
