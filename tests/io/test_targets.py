"""Device targets and solver settings from YAML: shipped values, loading by name and by file,
and one-line errors for bad files."""

import pytest

from helpers import ROOT, error_line
from stagesplit.errors import ProfileError, StagesplitError
from stagesplit.io.profile import Target
from stagesplit.io.targets import config_dir, known_targets, load_target, read_yaml
from stagesplit.solver.request import SolveRequest

# --------------------------------------------------------------------------------------------------
# Shipped targets (values from the vendors' reference figures)

def test_config_dir_is_the_checkouts():
    assert config_dir() == ROOT / "configs"


@pytest.mark.parametrize("name, tiles, bytes_per_tile, kind", [
    ("ipu-mk1", 1216, 262144, "ipu"),            # GC2: 1216 tiles x 256 KiB
    ("ipu-mk2", 1472, 638976, "ipu"),            # GC200: 1472 tiles x 624 KiB
    ("ipu-bow", 1472, 638976, "ipu"),            # Bow: GC200 memory
    ("a100-40gb", 1, 40 * 2**30, "gpu"),
    ("a100-80gb", 1, 80 * 2**30, "gpu"),
    ("h100-80gb", 1, 80 * 2**30, "gpu"),
    ("h200-141gb", 1, 141 * 2**30, "gpu"),
    ("b200-180gb", 1, 180 * 2**30, "gpu"),
    ("mi300x-192gb", 1, 192 * 2**30, "gpu"),
])
def test_shipped_targets(name, tiles, bytes_per_tile, kind):
    t = load_target(name)
    assert (t.name, t.tiles, t.bytes_per_tile, t.kind) == (name, tiles, bytes_per_tile, kind)
    assert t == known_targets()[name]


def test_shipped_target_details():
    targets = known_targets()
    assert list(targets) == ["ipu-mk1", "ipu-mk2", "ipu-bow", "a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb",
                             "b200-180gb", "mi300x-192gb"]
    assert targets["ipu-mk2"].device_bytes == 940_572_672            # "900 MB"
    assert targets["ipu-mk1"].device_bytes == 1216 * 256 * 1024
    assert targets["ipu-mk1"].clock_hz == 1.6e9
    assert targets["ipu-mk2"].clock_hz == 1.33e9
    assert targets["ipu-bow"].clock_hz == 1.85e9
    assert targets["a100-80gb"].flops_per_s == 312e12
    assert targets["h100-80gb"].flops_per_s == 989e12
    assert targets["h200-141gb"].flops_per_s == 989e12 and targets["h200-141gb"].memory_bytes_per_s == 4.8e12
    assert targets["b200-180gb"].flops_per_s == 2.25e15 and targets["mi300x-192gb"].flops_per_s == 1307.4e12
    assert targets["ipu-mk2"].seconds_per_unit("cycles") == 1 / 1.33e9
    assert targets["ipu-mk2"].seconds_per_unit("flops") is None
    assert targets["h100-80gb"].seconds_per_unit("flops") == 1 / 989e12
    assert targets["h100-80gb"].seconds_per_unit("cycles") is None
    assert all(t.seconds_per_unit("seconds") == 1.0 for t in targets.values())
    assert all(t.link_bytes_per_s > 0 and t.description for t in targets.values())


def test_shipped_nodes():
    """Each GPU target's node (configs/targets.yaml, sources in its comments): per GPU and direction."""
    from stagesplit.io.topology import known_nodes
    nodes = known_nodes()
    assert set(nodes) == {"a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "b200-180gb", "mi300x-192gb"}
    figures = {name: (n.gpus_per_node, n.intra.bytes_per_s, n.inter.bytes_per_s) for name, n in nodes.items()}
    assert figures["a100-80gb"] == (8, 300e9, 25e9)          # NVLink 3: 600 GB/s both ways; HDR 200 Gb/s
    assert figures["h100-80gb"] == figures["h200-141gb"] == (8, 450e9, 50e9)    # NVLink 4: 900; NDR 400 Gb/s
    assert figures["b200-180gb"] == (8, 900e9, 50e9)         # NVLink 5: 1.8 TB/s both ways
    assert figures["mi300x-192gb"] == (8, 448e9, 50e9)       # 7 Infinity Fabric links x 64 GB/s
    assert all(n.intra.latency_s == 3.4e-6 and n.inter.latency_s == 5e-6 for n in nodes.values())


@pytest.mark.parametrize("node, field", [
    ("{gpus_per_node: 0, intra_bytes_per_s: 1, intra_latency_s: 0, inter_bytes_per_s: 1, inter_latency_s: 0}",
     "node.gpus_per_node"),
    ("{gpus_per_node: 8, intra_bytes_per_s: 1, intra_latency_s: 0, inter_bytes_per_s: 1}", "node.inter_latency_s"),
    ("{gpus_per_node: 8, intra_bytes_per_s: 1, intra_latency_s: 0, inter_bytes_per_s: 1, inter_latency_s: 0, x: 1}",
     "node.x"),
    ("8", "node"),
])
def test_a_bad_node_is_one_line_naming_the_field(tmp_path, node, field):
    from stagesplit.io.topology import node_of
    path = tmp_path / "gpu.yaml"
    path.write_text(f"kind: gpu\ntiles: 1\nbytes_per_tile: 1000\nnode: {node}\n")
    load_target(str(path))                               # the target itself reads (its node is read apart)
    with pytest.raises(ProfileError) as excinfo:
        node_of(str(path))
    assert field in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_a_target_file_node():
    from stagesplit.io.topology import node_of
    with pytest.raises(StagesplitError, match="has no node topology"):
        node_of("ipu-mk2")


# --------------------------------------------------------------------------------------------------
# Targets from YAML files

def test_load_target_from_yaml_file(tmp_path):
    path = tmp_path / "my-gpu.yaml"
    path.write_text("kind: gpu\ntiles: 1\nbytes_per_tile: 25769803776\nflops_per_s: 1.5e14\n"
                    "description: a 24 GiB card\n")
    assert load_target(str(path)) == Target("my-gpu", tiles=1, bytes_per_tile=24 * 2**30, kind="gpu",
                                            flops_per_s=1.5e14, description="a 24 GiB card")


def test_load_target_yml_suffix_and_explicit_name(tmp_path):
    path = tmp_path / "t.yml"
    path.write_text("name: custom-ipu\ntiles: 4\nbytes_per_tile: 1000\nclock_hz: 1000000000\n")
    t = load_target(str(path))
    assert (t.name, t.tiles, t.bytes_per_tile, t.clock_hz, t.kind) == ("custom-ipu", 4, 1000, 1e9, "ipu")


@pytest.mark.parametrize("name", ["ipu-mk9", "IPU-MK2", "", "missing.yaml", "configs/targets.txt"])
def test_unknown_target(name):
    with pytest.raises(StagesplitError) as excinfo:
        load_target(name)
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"unknown target '{name}': expected one of ipu-mk1, ipu-mk2, ipu-bow, a100-40gb")
    assert "or the path of a YAML target file" in message


@pytest.mark.parametrize("text, field, expected", [
    ("tiles: '4'\nbytes_per_tile: 10\n", "tiles", "an integer >= 1"),
    ("tiles: 4.5\nbytes_per_tile: 10\n", "tiles", "an integer >= 1"),
    ("tiles: 0\nbytes_per_tile: 10\n", "tiles", "an integer >= 1"),
    ("tiles: true\nbytes_per_tile: 10\n", "tiles", "an integer >= 1"),
    ("bytes_per_tile: 10\n", "tiles", "an integer >= 1"),
    ("tiles: 4\nbytes_per_tile: -10\n", "bytes_per_tile", "an integer >= 1"),
    ("tiles: 4\nbytes_per_tile: 10\nclock_hz: fast\n", "clock_hz", "a number >= 0"),
    ("tiles: 4\nbytes_per_tile: 10\nflops_per_s: -1\n", "flops_per_s", "a number >= 0"),
    ("tiles: 4\nbytes_per_tile: 10\nlink_bytes_per_s: [1]\n", "link_bytes_per_s", "a number >= 0"),
    ("tiles: 4\nbytes_per_tile: 10\nkind: 3\n", "kind", "a string"),
    ("tiles: 4\nbytes_per_tile: 10\nmemory: 5\n", "memory", "one of bytes_per_tile, clock_hz"),
])
def test_bad_target_file(tmp_path, text, field, expected):
    path = tmp_path / "dev.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as excinfo:
        load_target(str(path))
    error_line(excinfo, file=path, field=field, expected=expected)


def test_target_file_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ProfileError) as excinfo:
        load_target(str(path))
    error_line(excinfo, file=path, expected="a mapping with tiles and bytes_per_tile")
    assert str(excinfo.value) == f"{path}: expected a mapping with tiles and bytes_per_tile, got [1, 2]"


def test_bad_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("tiles: 4\nbytes_per_tile: [1, 2\nkind: gpu\n")
    with pytest.raises(ProfileError) as excinfo:
        load_target(str(path))
    message = error_line(excinfo, file=path, expected="valid YAML")
    assert message.startswith(f"{path}: line ")


def test_yaml_is_read_safely(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("tiles: !!python/object/apply:os.getcwd []\nbytes_per_tile: 1\n")
    with pytest.raises(ProfileError) as excinfo:
        load_target(str(path))
    error_line(excinfo, file=path, expected="valid YAML")


def test_unreadable_yaml_file(tmp_path):
    with pytest.raises(StagesplitError) as excinfo:
        read_yaml(tmp_path / "absent.yaml")
    assert str(excinfo.value) == f"{tmp_path / 'absent.yaml'}: cannot read: No such file or directory"


# --------------------------------------------------------------------------------------------------
# Solver settings

def load_solver_settings(path=None) -> SolveRequest:
    """A settings file is a template of the one options record (devices aside)."""
    return SolveRequest.from_settings(path)


def SolverSettings(stages: str = "at-most", **fields) -> SolveRequest:      # noqa: N802 - the old record's name
    return SolveRequest(devices=1, exact=stages == "exact", **fields)


def test_shipped_solver_settings_are_the_defaults():
    assert load_solver_settings() == SolverSettings()
    s = SolverSettings()
    assert (s.objective, s.exact, s.schedule, s.micro_batches, s.headroom, s.shared, s.time_limit, s.workers,
            s.communication) == ("compute", False, "none", None, 0.0, "every", 60.0, 1, False)
    # micro_batches None: the number of devices with a schedule, else 1 (problem.resolve_micro_batches)


def test_solver_settings_file(tmp_path):
    path = tmp_path / "solver.yaml"
    path.write_text("objective: memory\nstages: exact\nschedule: 1f1b\nmicro_batches: 8\nheadroom: 0.1\n"
                    "shared: none\ntime_limit: 5\nworkers: 4\ncommunication: true\n")
    assert load_solver_settings(path) == SolverSettings(objective="memory", stages="exact", schedule="1f1b",
                                                        micro_batches=8, headroom=0.1, shared="none", time_limit=5,
                                                        workers=4, communication=True)


def test_partial_and_empty_settings_files(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("schedule: gpipe\n")
    assert load_solver_settings(path) == SolverSettings(schedule="gpipe")
    path.write_text("# nothing set\n")
    assert load_solver_settings(path) == SolverSettings()


def test_overrides_skip_none(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("objective: memory\n")
    s = SolveRequest.from_settings(path, objective=None, workers=3)
    assert s == SolverSettings(objective="memory", workers=3)


@pytest.mark.parametrize("text, field, expected", [
    ("objective: speed\n", "objective", "one of compute, memory, devices"),
    ("stages: most\n", "stages", "one of at-most, exact"),
    ("schedule: 2f2b\n", "schedule", "one of none, 1f1b, gpipe"),
    ("shared: some\n", "shared", "one of every, none"),
    ("micro_batches: 0\n", "micro_batches", "an integer >= 1"),
    ("micro_batches: 2.5\n", "micro_batches", "an integer >= 1"),
    ("micro_batches: true\n", "micro_batches", "an integer >= 1"),
    ("workers: many\n", "workers", "an integer >= 1"),
    ("time_limit: -1\n", "time_limit", "a number in (0, 1e+06]"),
    ("time_limit: soon\n", "time_limit", "a number in (0, 1e+06]"),
    ("headroom: 1.0\n", "headroom", "a number in [0, 1)"),
    ("headroom: 1.5\n", "headroom", "a number in [0, 1)"),
    ("headroom: -0.1\n", "headroom", "a number in [0, 1)"),
    ("headroom: ten percent\n", "headroom", "a number in [0, 1)"),
    ("communication: 1\n", "communication", "true or false"),
    ("communication: 'yes'\n", "communication", "true or false"),
    ("objective: memory\nsolver: cp-sat\n", "solver", "a known setting (objective, stages"),
    ("exact: 'yes'\n", "exact", "true or false"),
])
def test_bad_solver_settings(tmp_path, text, field, expected):
    path = tmp_path / "solver.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as excinfo:
        load_solver_settings(path)
    error_line(excinfo, file=path, field=field, expected=expected)


def test_solver_settings_not_a_mapping(tmp_path):
    path = tmp_path / "solver.yaml"
    path.write_text("- objective\n")
    with pytest.raises(ProfileError) as excinfo:
        load_solver_settings(path)
    assert str(excinfo.value) == f"{path}: expected a mapping of solver settings, got 'list'"


def test_solver_settings_bad_yaml(tmp_path):
    path = tmp_path / "solver.yaml"
    path.write_text("objective: compute\n  workers: 2\n")
    with pytest.raises(ProfileError) as excinfo:
        load_solver_settings(path)
    error_line(excinfo, file=path, field="line 2", expected="valid YAML")


def test_exponent_numbers_are_numbers(tmp_path):
    """YAML 1.1 would read ``1.33e9`` and ``1e2`` as strings; they are what people write."""
    target = tmp_path / "dev.yaml"
    target.write_text("tiles: 2\nbytes_per_tile: 100\nclock_hz: 1.33e9\nlink_bytes_per_s: 5E+10\n")
    t = load_target(str(target))
    assert (t.clock_hz, t.link_bytes_per_s) == (1.33e9, 5e10)
    settings = tmp_path / "solver.yaml"
    settings.write_text("time_limit: 1e2\nheadroom: 5e-2\n")
    assert load_solver_settings(settings) == SolverSettings(time_limit=100.0, headroom=0.05)
    target.write_text("tiles: 1e3\nbytes_per_tile: 100\n")          # still not an integer
    with pytest.raises(ProfileError) as excinfo:
        load_target(str(target))
    error_line(excinfo, file=target, field="tiles", expected="an integer >= 1")
