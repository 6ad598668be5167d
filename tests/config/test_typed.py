"""The typed configuration (config/sections.py, model/config.py): `load` types a file once into frozen
dataclasses; every key of the file reaches its field, none is dropped and none defaulted; the per-arm
views (`model_for`, `train_for`) and a sweep point's configuration (`point`) carry the arm's and the
point's values; the model owns its configuration and imports nothing from acoustic_mlm.config."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from acoustic_mlm import config as C
from acoustic_mlm.config import checks
from acoustic_mlm.config.sections import SyntheticConfig
from acoustic_mlm.config.sweep import Point
from acoustic_mlm.model import config as MC

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.name for p in (ROOT / "config").glob("*.yaml"))
SCHEMA = checks.schema()  # generated from the dataclasses (config/schema.py)
# The sections typed from a mapping of the same name, with the dataclass that holds each.
SECTIONS = {
    "data": C.DataConfig,
    "tokenizer": C.TokenizerConfig,
    "model": C.ModelSection,
    "train": C.TrainSection,
    "figure": C.FigureConfig,
    "claims": C.ClaimThresholds,
}


def _tuples(value):
    """A value as the typed configuration holds it: the YAML's lists as tuples."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _defaulted(cls) -> set[str]:
    """The fields of a dataclass that have a default."""
    return {f.name for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING}


def _schema_keys(section: str) -> tuple[set[str], set[str]]:
    """(required, optional) keys of a section in the JSON schema."""
    node = SCHEMA["properties"][section]
    required = set(node.get("required", ()))
    return required, set(node["properties"]) - required


def _is_frozen(obj) -> bool:
    return dataclasses.is_dataclass(obj) and type(obj).__dataclass_params__.frozen


def _walk(obj, where: str):
    """(where, value) for every value inside a typed configuration, nested dataclasses and dicts included
    (the validated mapping left out: only config/ reads it)."""
    yield where, obj
    if dataclasses.is_dataclass(obj):
        for f in fields(obj):
            if f.name != "mapping":
                yield from _walk(getattr(obj, f.name), f"{where}.{f.name}")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{where}.{k}")
    elif isinstance(obj, tuple):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{where}[{i}]")


@pytest.fixture(scope="module", params=PRESETS)
def preset(request):
    """(the file's mapping, its typed Config) for each preset in config/."""
    path = ROOT / "config" / request.param
    return C.read_yaml(path), C.load(path)


# ----------------------------------------------------------------------------- load: frozen dataclasses


def test_load_returns_a_config_of_frozen_dataclasses_and_tuples(preset):
    _, cfg = preset
    assert isinstance(cfg, C.Config) and _is_frozen(cfg)
    assert isinstance(cfg.model, C.ModelSection) and not isinstance(cfg.model, C.ModelConfig)  # no arm's norm
    assert isinstance(cfg.train, C.TrainSection) and not isinstance(cfg.train, C.TrainConfig)  # no clip, no seed
    assert isinstance(cfg.data.synthetic, SyntheticConfig)
    assert all(isinstance(r, C.RunConfig) for r in cfg.runs.values())
    for section in SECTIONS:
        assert isinstance(getattr(cfg, section), SECTIONS[section]), section
    for where, value in _walk(cfg, "cfg"):
        assert not isinstance(value, (list, set)), f"{where} is a {type(value).__name__}; the typed config holds tuples"
        if dataclasses.is_dataclass(value):
            assert _is_frozen(value), f"{where} ({type(value).__name__}) is not frozen"
    for obj, name in (
        (cfg, "train"),
        (cfg.model, "dim"),
        (cfg.train, "lr"),
        (cfg.data.synthetic, "seed"),
        (next(iter(cfg.runs.values())), "clip"),
        (cfg.figure, "split"),
        (cfg.claims, "start_min"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, getattr(obj, name))


def test_from_mapping_validates_and_types_as_load_does(root):
    cfg = C.load(root / "config" / "smoke.yaml")
    from_mapping = C.from_mapping(C.read_yaml(root / "config" / "smoke.yaml"), source=cfg.source)
    assert from_mapping == cfg and from_mapping.mapping == cfg.mapping
    bad = C.read_yaml(root / "config" / "smoke.yaml")
    bad["train"]["lr"] = -1.0
    with pytest.raises(C.ConfigError, match="'train.lr'"):
        C.from_mapping(bad, "smoke.yaml")
    assert not hasattr(C, "typed") and not hasattr(C.Config, "from_validated")  # no door that types without validating


def test_make_config_builds_a_validated_config_from_the_smoke_preset(root):
    from helpers import make_config

    cfg = make_config(**{"train.steps": 30}, model={"dim": 64})
    assert isinstance(cfg, C.Config) and cfg.source == "smoke.yaml"
    assert cfg.train.steps == 30 and cfg.model.dim == 64
    assert cfg.model.layers == C.load(root / "config" / "smoke.yaml").model.layers  # the rest of the section kept
    assert make_config(cfg) is cfg and make_config(cfg, **{"train.lr": 1e-3}).train.lr == 1e-3
    with pytest.raises(C.ConfigError, match="'train.steps'"):
        make_config(**{"train.steps": 0})


# ----------------------------------------------------------------------------- every key reaches its field


@pytest.mark.parametrize("section", ["model", "train"])
def test_every_model_and_train_key_reaches_its_field(preset, section):
    """No key of the file dropped (each is a field, with the file's value), none defaulted (a field
    the file leaves out is one of the schema's optional keys)."""
    mapping, cfg = preset
    typed, cls = getattr(cfg, section), SECTIONS[section]
    names = {f.name for f in fields(cls)}
    assert set(mapping[section]) <= names, f"{section}: keys without a field: {set(mapping[section]) - names}"
    for key, value in mapping[section].items():
        assert getattr(typed, key) == _tuples(value), f"{section}.{key}"
    _, optional = _schema_keys(section)
    for name in names - set(mapping[section]):
        assert name in optional, f"{section}.{name}: a required key given a default"
        assert getattr(typed, name) == {f.name: f.default for f in fields(cls)}[name]


def test_every_other_key_reaches_its_field(preset):
    mapping, cfg = preset
    for section in ("data", "tokenizer", "figure", "claims"):
        for key, value in mapping[section].items():
            got = getattr(getattr(cfg, section), key)
            if key == "synthetic":
                assert got == SyntheticConfig(**value)
            else:
                assert got == _tuples(value), f"{section}.{key}"
    assert list(cfg.runs) == list(mapping["runs"])
    for name, arm in mapping["runs"].items():
        run = cfg.run(name)
        assert run.name == name and run.role == arm.get("role")
        for key, value in arm.items():
            assert getattr(run, key) == _tuples(value), f"runs.{name}.{key}"
    assert cfg.cpu_kernels == mapping["cpu_kernels"]
    assert (cfg.sweep is None) == (mapping.get("sweep") is None)


@pytest.mark.parametrize("section, cls", [("model", C.ModelSection), ("train", C.TrainSection)])
def test_the_sections_defaults_are_exactly_the_schemas_optional_keys(section, cls):
    required, optional = _schema_keys(section)
    assert {f.name for f in fields(cls)} == required | optional
    assert _defaulted(cls) == optional


# ----------------------------------------------------------------------------- one arm: model_for, train_for


def test_model_for_and_train_for_apply_the_arms_norm_attention_clip_and_seed(preset):
    mapping, cfg = preset
    for name, arm in mapping["runs"].items():
        m = cfg.model_for(name)
        assert type(m) is C.ModelConfig and (m.norm, m.attention) == (arm["norm"], arm["attention"])
        assert all(getattr(m, f.name) == getattr(cfg.model, f.name) for f in fields(C.ModelSection))
        t = cfg.train_for(name)
        assert type(t) is C.TrainConfig and (t.clip, t.seed) == (arm["clip"], arm["seeds"][0])
        assert all(getattr(t, f.name) == getattr(cfg.train, f.name) for f in fields(C.TrainSection))
        for seed in arm["seeds"]:
            assert (cfg.train_for(name, seed).seed, cfg.train_for(name, seed).clip) == (seed, arm["clip"])
        with pytest.raises(C.ConfigError, match=f"seed {max(arm['seeds']) + 1} is not among 'runs.{name}.seeds'"):
            cfg.train_for(name, max(arm["seeds"]) + 1)


def test_the_arms_differ_where_the_file_says(root):
    cfg = C.load(root / "config" / "smoke.yaml")
    assert [cfg.model_for(n).norm for n in cfg.runs] == ["pre", "pre", "deepnorm", "pre"]
    assert [cfg.model_for(n).attention for n in cfg.runs] == ["softmax", "softmax", "softmax", "pb_relax"]
    assert [cfg.train_for(n).clip for n in cfg.runs] == [10.0, 1.0, 1.0, 1.0]
    assert cfg.model.with_arm("post", "unfused") == dataclasses.replace(
        cfg.model_for(next(iter(cfg.runs))), norm="post", attention="unfused"
    )
    with pytest.raises(C.ConfigError, match="no run 'nope'"):
        cfg.model_for("nope")
    with pytest.raises(C.ConfigError, match="no run 'nope'"):
        cfg.train_for("nope")


# ----------------------------------------------------------------------------- a sweep point


def test_point_of_a_sweep_preset_is_the_file_with_the_points_values(root):
    cfg = C.load(root / "config" / "proxy.yaml")
    assert cfg.sweep is not None and cfg.points and cfg.run_names == list(cfg.points)
    for name, p in cfg.points.items():
        assert isinstance(p, Point) and p.name == name
        pc = cfg.point(name)
        assert isinstance(pc, C.Config) and list(pc.runs) == [name] and pc.sweep is None and pc.points == {}
        assert p.values, name  # a sweep point sets at least one model./train. key
        for key, value in p.values:
            section, field = key.split(".")
            assert getattr(getattr(pc, section), field) == value, (name, key)
            assert pc.value(key) == value, (name, key)
            view = cfg.model_for(name) if section == "model" else cfg.train_for(name)
            assert getattr(view, field) == value, (name, key)
        swept = {key.split(".")[1] for key, _ in p.values}
        for section in ("model", "train"):  # every other setting: the file's
            for f in fields(SECTIONS[section]):
                if f.name not in swept:
                    assert getattr(getattr(pc, section), f.name) == getattr(getattr(cfg, section), f.name)
        assert (pc.data, pc.tokenizer, pc.figure, pc.claims) == (cfg.data, cfg.tokenizer, cfg.figure, cfg.claims)
        arm, run = cfg.runs[p.arm], pc.run(name)
        assert (run.name, run.seeds) == (name, p.seeds) and cfg.run(name) == run
        assert (run.label, run.norm, run.attention, run.clip, run.role) == (
            arm.label,
            arm.norm,
            arm.attention,
            arm.clip,
            arm.role,
        )
        assert cfg.model_for(name) == pc.model_for(name) and cfg.train_for(name) == pc.train_for(name)
        assert (cfg.model_for(name).norm, cfg.train_for(name).clip) == (arm.norm, arm.clip)


def test_without_a_sweep_a_point_is_the_file_itself(root):
    cfg = C.load(root / "config" / "smoke.yaml")
    assert cfg.points == {} and cfg.run_names == list(cfg.runs)
    assert all(cfg.point(name) is cfg for name in cfg.runs)
    with pytest.raises(C.ConfigError, match="no run 'nope'"):
        cfg.point("nope")


# ----------------------------------------------------------------------------- the model owns its configuration


def test_model_config_has_no_defaults_but_cqt_impl():
    assert C.ModelConfig is MC.ModelConfig and C.ModelSection is MC.ModelSection  # re-exported, one class
    assert _defaulted(MC.ModelConfig) == _defaulted(MC.ModelSection) == {"cqt_impl"}
    assert {f.name: f.default for f in fields(MC.ModelConfig)}["cqt_impl"] == "nnaudio"
    assert {"norm", "attention"} <= {f.name for f in fields(MC.ModelConfig) if f.kw_only}
    assert {f.name for f in fields(MC.ModelConfig)} - {f.name for f in fields(MC.ModelSection)} == {"norm", "attention"}
    cfg = C.load(ROOT / "config" / "smoke.yaml")
    full = {f.name: getattr(cfg.model_for("prenorm_clip1"), f.name) for f in fields(MC.ModelConfig)}
    for name in ("norm", "attention", "dim", "qk_gain", "special_symbols"):
        with pytest.raises(TypeError, match=name):
            MC.ModelConfig(**{k: v for k, v in full.items() if k != name})
    assert MC.ModelConfig(**{k: v for k, v in full.items() if k != "cqt_impl"}).cqt_impl == "nnaudio"


def test_train_config_requires_every_key_but_the_optional_ones():
    _, optional = _schema_keys("train")
    assert _defaulted(C.TrainConfig) == _defaulted(C.TrainSection) == optional
    assert {"clip", "seed"} <= {f.name for f in fields(C.TrainConfig)} - _defaulted(C.TrainConfig)


def _imported_modules(path: Path, package: str) -> set[str]:
    """Every module a source file imports (relative imports resolved against `package`), with the
    submodules `from X import name` may name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(str(node.args[0].value))
    return names


def _is_config(module: str) -> bool:
    return module == "acoustic_mlm.config" or module.startswith("acoustic_mlm.config.")


def test_the_model_package_imports_nothing_from_acoustic_mlm_config(root):
    folder = root / "src" / "acoustic_mlm" / "model"
    sources = sorted(folder.rglob("*.py"))
    assert {p.name for p in sources} >= {"__init__.py", "config.py", "encoder.py", "objective.py", "cqt.py"}
    for path in sources:
        package = ".".join(("acoustic_mlm", "model", *path.relative_to(folder).parent.parts))
        bad = sorted(m for m in _imported_modules(path, package) if _is_config(m))
        assert not bad, f"{path.relative_to(root)} imports {bad}"
    # and not through another module: importing the whole model package leaves acoustic_mlm.config unloaded
    code = (
        "import sys, acoustic_mlm.model, acoustic_mlm.model.config, acoustic_mlm.model.cqt, "
        "acoustic_mlm.model.encoder, acoustic_mlm.model.objective; "
        "print(sorted(m for m in sys.modules if m.split('.')[:2] == ['acoustic_mlm', 'config']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_the_import_check_sees_every_way_of_importing_config(tmp_path):
    """The structural test's own parser: absolute, from-, relative and dynamic imports of acoustic_mlm.config."""
    cases = {
        "import acoustic_mlm.config as C": True,
        "from acoustic_mlm import config": True,
        "from acoustic_mlm.config.sections import Config": True,
        "from .. import config": True,
        "from ..config import load": True,
        "import importlib; importlib.import_module('acoustic_mlm.config')": True,
        "from .config import ModelConfig": False,  # the model's own acoustic_mlm.model.config
        "from acoustic_mlm.model.config import NORMS": False,
        "from acoustic_mlm import encodec": False,
    }
    for line, refused in cases.items():
        path = tmp_path / "m.py"
        path.write_text(line + "\n")
        found = any(_is_config(m) for m in _imported_modules(path, "acoustic_mlm.model"))
        assert found == refused, line
