"""One registry entry per member architecture: every part in one place per room.

An architecture is its module in ``guard/archs/`` (the runtime spec: the robot imports no
``export/``) and its module of the same name in ``export/archs/`` (export config, cost model,
int4 roles, recorded real members), joined in one :class:`~spotstop.export.archs.Architecture`.
These tests fail when a registered architecture lacks a part, when an architecture module is not
registered (or registered in one room only), and when a module outside the architecture modules
names a model type: the registries are the only places that branch on an architecture.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from spotstop.export.archs import ARCHITECTURES, REAL_PAIR, REAL_SETTINGS, get_architecture
from spotstop.export.archs._cost_model import ArchCost
from spotstop.export.archs._export_config import ExportConfig, MemberRecipe
from spotstop.export.configs import EXPORT_CONFIGS
from spotstop.export.cost import COST_MODELS
from spotstop.export.cost_data import PAPER_TFLOPS
from spotstop.export.mixed import MixedRoles, roles_of
from spotstop.guard.archs import ARCHS, ArchSpec

ROOT = Path(__file__).resolve().parents[1]
#: the folders whose modules may not name a model type (tests may: they are test data)
SCANNED = ("guard", "calibrate", "diagnostics", "export", "jetson", "cli")


def test_both_rooms_register_the_same_architectures() -> None:
    assert list(ARCHS) == list(ARCHITECTURES), "register every architecture in both rooms"
    assert list(EXPORT_CONFIGS) == list(COST_MODELS) == list(ARCHITECTURES)


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_every_registered_architecture_has_every_part(model_type: str) -> None:
    a = get_architecture(model_type)
    assert a.model_type == model_type
    # the runtime spec (guard/archs/), the one the robot uses
    assert isinstance(a.runtime, ArchSpec) and a.runtime is ARCHS[model_type]
    # the export config with a tiny TEST member's recipe and tolerances for every precision
    assert issubclass(a.export_config, ExportConfig)
    assert a.export_config is EXPORT_CONFIGS[model_type]
    assert isinstance(a.export_config.member_recipe, MemberRecipe)
    assert a.export_config.model_type == model_type
    # the cost model
    assert isinstance(a.cost, ArchCost) and a.cost is COST_MODELS[model_type]
    assert a.cost.layer_types, "the cost model names the decoder layer types it counts"
    # the int4 mixed-precision roles
    assert isinstance(a.mixed_roles, MixedRoles) and roles_of(model_type) is a.mixed_roles
    assert a.mixed_roles.vision and a.mixed_roles.value and a.mixed_roles.down
    # the recorded real members, where there are any: costed at every paper setting
    for m in a.recorded:
        assert m.config["model_type"] == model_type
        assert REAL_PAIR[m.name] == dict(m.config)
        assert set(m.settings) == set(PAPER_TFLOPS)
        assert all(REAL_SETTINGS[s][m.name] == list(p) for s, p in m.settings.items())
        assert a.cost.params(m.config).total > 0
        assert set(a.cost.checked_layers(m.config["text_config"])) <= a.cost.layer_types


def test_an_entry_refuses_parts_of_another_architecture() -> None:
    from dataclasses import replace

    a, b = (ARCHITECTURES[t] for t in list(ARCHITECTURES)[:2])
    with pytest.raises(ValueError, match=r"parts of another model_type: \{'cost'"):
        replace(a, cost=b.cost)
    with pytest.raises(ValueError, match="no member architecture 'llava' is registered"):
        get_architecture("llava")


@pytest.mark.parametrize("room", ["guard", "export"])
def test_every_architecture_module_is_registered(room: str) -> None:
    """``<room>/archs/<model_type>.py``: one per registered architecture, each registered."""
    folder = ROOT / room / "archs"
    modules = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    assert modules == sorted(ARCHITECTURES), f"{room}/archs/: register every module"
    for name in modules:
        mod = importlib.import_module(f"spotstop.{room}.archs.{name}")
        if room == "guard":
            assert mod.SPEC is ARCHS[name]
        else:
            assert mod.ARCH is ARCHITECTURES[name]


def _model_types(value: Any) -> Iterator[str]:
    """Every ``model_type`` value in a nested config (the text and vision towers' too)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k == "model_type" and isinstance(v, str):
                yield v
            yield from _model_types(v)


def _named_model_types() -> set[str]:
    named = set(ARCHITECTURES)
    for a in ARCHITECTURES.values():
        named |= set(_model_types(a.export_config.member_recipe.tiny_config))
        for m in a.recorded:
            named |= set(_model_types(m.config))
    return named


def _literal_hits() -> dict[str, list[str]]:
    """Path → the model-type string literals it holds, outside the architecture modules."""
    named = _named_model_types()
    arch_modules = {f"{room}/archs/{t}.py" for room in ("guard", "export") for t in ARCHITECTURES}
    hits: dict[str, list[str]] = {}
    for room in SCANNED:
        for path in sorted((ROOT / room).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in arch_modules:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            found = [
                f"{node.lineno}: {node.value!r}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and node.value in named
            ]
            if found:
                hits[rel] = found
    return hits


def test_no_module_outside_the_architecture_modules_names_a_model_type() -> None:
    """No ``if model_type == "qwen3_5"`` and no per-architecture table anywhere else: a model
    type string appears only in its two modules."""
    assert {"qwen3_5", "lfm2_vl", "lfm2"} <= _named_model_types()
    hits = _literal_hits()
    assert not hits, (
        "model types named outside guard/archs/<type>.py and export/archs/<type>.py; move the "
        f"architecture's knowledge into its modules: {hits}"
    )


def test_the_scan_sees_a_model_type_literal(tmp_path: Path) -> None:
    code = 'if cfg.model_type == "qwen3_5":\n    x = {"lfm2_vl": 1}\ny = f"tiny-{t}"\n'
    tree = ast.parse(code)
    named = _named_model_types()
    got = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in named]
    assert sorted(got) == ["lfm2_vl", "qwen3_5"]


def test_fp16_islands_come_from_the_export_configs() -> None:
    """export/fp16.py keeps every architecture's norms float32, and each architecture's own
    float32 modules (its export config's ``fp32_modules``: Qwen3.5's Gated-DeltaNet)."""
    from spotstop.export.fp16 import _fp32_modules

    pattern = _fp32_modules()
    for cfg in EXPORT_CONFIGS.values():
        assert all(pattern.search(f"Arch{m}") for m in cfg.fp32_modules)
    assert pattern.search("Qwen3_5GatedDeltaNet") and pattern.search("Lfm2RMSNorm")
    assert not pattern.search("Qwen3_5Attention") and not pattern.search("Lfm2ShortConv")
