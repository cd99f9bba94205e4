"""The shared validation helpers (``spotstop.guard.validate``): one behaviour, one place."""

from __future__ import annotations

import ast
import math
from fractions import Fraction

import numpy as np
import pytest
from spotstop.guard._errors import ConfigError
from spotstop.guard.validate import (
    as_1d_float,
    check_keys,
    check_mapping,
    check_number,
    is_int,
    is_real,
    join_key,
)

from tests._support import REPO_ROOT

ROOT = REPO_ROOT
ROOMS = ("guard", "calibrate", "diagnostics", "export", "cli")


class _MyError(ValueError):
    pass


@pytest.mark.parametrize(
    "x",
    [0, 1, -3, 2.5, math.nan, math.inf, np.int64(3), np.int8(-1), np.float32(0.5), np.float64(1)],
)
def test_is_real_accepts_python_and_numpy_numbers_nan_and_inf_included(x: object) -> None:
    assert is_real(x)


@pytest.mark.parametrize(
    "x", [True, False, np.bool_(True), "1", None, [1.0], np.array([1.0]), Fraction(1, 2), 1j]
)
def test_is_real_refuses_bools_strings_containers_and_other_number_types(x: object) -> None:
    assert not is_real(x)


@pytest.mark.parametrize("x", [0, 7, -2, np.int64(5), np.uint8(3)])
def test_is_int_accepts_python_and_numpy_integers(x: object) -> None:
    assert is_int(x)


@pytest.mark.parametrize("x", [True, np.bool_(False), 2.0, np.float64(2), "2", None])
def test_is_int_refuses_bools_floats_and_strings(x: object) -> None:
    assert not is_int(x)


def test_join_key() -> None:
    assert join_key("", "policy") == "policy"
    assert join_key("fusion.stats", "a") == "fusion.stats.a"


def test_check_mapping_names_the_section_and_the_fix() -> None:
    check_mapping({}, where="x", source="f.yaml")
    with pytest.raises(ConfigError, match=r"^the document must be a mapping .*Fix it in f\.yaml"):
        check_mapping([1], where="", source="f.yaml")
    with pytest.raises(_MyError, match=r"^fusion must be a mapping"):
        check_mapping(3, where="fusion", source="f.yaml", error=_MyError)


def test_check_keys_unknown_key_with_suggestion_then_missing_key() -> None:
    check_keys({"a": 1, "b": 2}, where="s", required=("a",), optional=("b",), source="f.yaml")
    with pytest.raises(
        ConfigError,
        match=r"^s\.wieght is not a known key\. Did you mean 'weight'\? "
        r"Allowed keys of s: a, weight\. Remove or rename it in f\.yaml\.$",
    ):
        check_keys({"wieght": 1}, where="s", required=("a",), optional=("weight",), source="f.yaml")
    with pytest.raises(_MyError, match=r"^s\.a is required but missing\. Add it in f\.yaml\.$"):
        check_keys({}, where="s", required=("a",), source="f.yaml", error=_MyError)
    with pytest.raises(ConfigError, match=r"^1 is not a known key.*Allowed keys of the top level"):
        check_keys({1: 0}, where="", optional=("a",), source="f.yaml")


def test_check_number_finite_and_positive() -> None:
    assert check_number(np.float32(2), where="k", source="f") == 2.0
    assert type(check_number(3, where="k", source="f")) is float
    for bad in (math.nan, math.inf, True, "1", None):
        with pytest.raises(ConfigError, match=r"^k must be a finite number; got .*Set it in f\.$"):
            check_number(bad, where="k", source="f")
    with pytest.raises(_MyError, match=r"^k must be a finite number > 0; got 0\."):
        check_number(0, where="k", source="f", error=_MyError, positive=True)


def test_as_1d_float_shapes_and_errors() -> None:
    out = as_1d_float([1, 2, math.nan], what="s")
    assert out.dtype == float and out.shape == (3,) and math.isnan(out[2])
    assert as_1d_float(np.arange(2), what="s", n=2).tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match=r"^s must be a 1-D array of numbers; could not convert"):
        as_1d_float(["a"], what="s")
    with pytest.raises(_MyError, match=r"^s must be a 1-D array; got shape \(1, 2\)\.$"):
        as_1d_float([[1, 2]], what="s", error=_MyError)
    with pytest.raises(ValueError, match=r"^s must have shape \(3,\), one entry per scene"):
        as_1d_float([1, 2], what="s", n=3)


_HELPERS = {
    "_is_real",
    "_is_int",
    "_check_keys",
    "_check_mapping",
    "_check_number",
    "_as_1d_float",
    "_number",
}


def test_no_room_keeps_its_own_copy_of_a_shared_helper() -> None:
    """The helpers exist once, in ``guard/validate.py``; a second definition is a copy."""
    copies = []
    for room in ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef) and node.name in _HELPERS:
                    copies.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert copies == [], "use spotstop.guard.validate instead of: " + ", ".join(copies)


def test_former_inline_checks_follow_the_shared_rule() -> None:
    """Checks that were written inline now call ``is_real``/``is_int``: ``True`` is no
    number anywhere, numpy scalars are numbers everywhere."""
    from spotstop.diagnostics._errors import DataError
    from spotstop.diagnostics._metrics import _check_cut
    from spotstop.guard._log import Retention
    from spotstop.guard._record import RecordError

    _check_cut(np.float32(0.5))
    with pytest.raises(DataError, match=r"^cut must be a number"):
        _check_cut(True)  # type: ignore[arg-type]
    assert Retention(max_bytes=np.int64(1 << 20), keep_days=np.float32(2)).max_bytes == 1 << 20
    for bad in ({"keep_days": True}, {"max_bytes": True}, {"low_water": True}):
        with pytest.raises(RecordError, match=r"^retention "):
            Retention(**bad)  # type: ignore[arg-type]


def test_load_yaml_refuses_a_key_twice_by_its_path_and_line() -> None:
    from spotstop.guard.validate import load_yaml

    assert load_yaml("a: 1\nb: [x, {c: 2}]\n", source="s") == {"a": 1, "b": ["x", {"c": 2}]}
    assert load_yaml("", source="s") is None
    for text, where in (
        ("a: 1\na: 2\n", r"a appears twice \(line 2\)"),
        ("a:\n  b: 1\n  b: 2\n", r"a\.b appears twice \(line 3\)"),
        ("a:\n- {b: 1, b: 2}\n", r"a\[0\]\.b appears twice \(line 2\)"),
    ):
        with pytest.raises(
            ValueError, match=where + r".*first one would be lost\. Merge them in s\."
        ):
            load_yaml(text, source="s", error=ValueError)
    with pytest.raises(ConfigError, match="s is not valid YAML"):
        load_yaml("a: [1\n", source="s")


def test_every_file_a_person_writes_refuses_a_key_twice(tmp_path) -> None:
    """The scoring config kept the last of two batch_size keys (and of two prompt.text keys:
    another prompt) and read `false` as every default; the serve config kept the last key."""
    from spotstop.guard._config import load_scoring_config
    from spotstop.guard.cues import load_lexicon
    from spotstop.guard.policies import load_policy
    from spotstop.guard.serve._settings import load_serve_config

    readers = {
        "scoring.yaml": (load_scoring_config, "batch_size: 64\nbatch_size: 1\n"),
        "serve.yaml": (load_serve_config, "port: 8750\nport: 8751\n"),
        "lexicon.yaml": (load_lexicon, "alarming: [hot]\nalarming: [cold]\n"),
        "policy.yaml": (load_policy, "version: 2\nversion: 2\n"),
    }
    for name, (read, text) in readers.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ConfigError, match=r"appears twice \(line 2\)"):
            read(path)
    scoring = tmp_path / "scoring.yaml"
    for text in ("false\n", "- 1\n", "member_image_size: []\n"):
        scoring.write_text(text)
        with pytest.raises(ConfigError, match=r"mapping|must map member names"):
            load_scoring_config(scoring)
    scoring.write_text("")
    assert load_scoring_config(scoring).batch_size == 8  # an empty file: the defaults


@pytest.mark.parametrize("given", ["x", "12x", "3", "axb", [1], [0, 4], "4x4x4"])
def test_a_bad_image_size_is_quoted_as_given(given: object) -> None:
    """A text that is not HxW was quoted as None (the parse's leftover), not as written."""
    from spotstop.guard._config import parse_image_size
    from spotstop.guard._errors import ConfigError

    with pytest.raises(ConfigError) as e:
        parse_image_size(given, "image_size")
    assert str(e.value).endswith(f"got {given!r}.")
    assert parse_image_size("3x4", "image_size") == (3, 4) == parse_image_size([3, 4], "x")


def test_a_scoring_config_that_is_no_text_file_is_a_config_error(tmp_path) -> None:
    """A folder or a file that is not UTF-8 gave a bare IsADirectoryError or
    UnicodeDecodeError; each is a ConfigError naming the file."""
    from spotstop.guard._config import load_scoring_config
    from spotstop.guard._errors import ConfigError

    latin = tmp_path / "latin.yaml"
    latin.write_bytes("batch_size: 8  # größe\n".encode("latin-1"))
    for path in (tmp_path, latin):
        with pytest.raises(ConfigError, match="cannot be read as UTF-8 text"):
            load_scoring_config(path)


# -- YAML as written: the YAML 1.2 core schema, one reader and one writer ----------------------

#: strings that YAML 1.1 (PyYAML's safe_load) or YAML 1.2 reads as something else when unquoted
TRICKY = [
    *("yes", "no", "on", "off", "Y", "n", "True", "NULL", "~", ""),
    *("1:30", "012", "0o17", "0x1f", "1_000", "1e5", "1.5e3", "12e4567", "+1", ".5", ".inf"),
    *("2026-05-01", "2026-05-01T12:00:00+00:00", "<<", "=", "sha256:1e5", "ü", "a: b", "- x"),
]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1:30", "1:30"),  # YAML 1.1: 90 (sexagesimal)
        ("1:30.5", "1:30.5"),  # YAML 1.1: 90.5
        ("no", "no"),  # YAML 1.1: False
        ("yes", "yes"),
        ("off", "off"),
        ("On", "On"),
        ("012", 12),  # YAML 1.1: 10 (octal)
        ("0o17", 15),
        ("0x1f", 31),
        ("-7", -7),
        ("1_000", "1_000"),  # YAML 1.1: 1000
        ("1e-3", 0.001),  # YAML 1.1: the text '1e-3'
        ("2.5", 2.5),
        ("-.inf", -math.inf),
        ("2026-05-01T12:00:00Z", "2026-05-01T12:00:00Z"),  # YAML 1.1: a datetime
        ("2026-05-01", "2026-05-01"),
        ("true", True),
        ("FALSE", False),
        ("~", None),
        ("", None),
        ("'no'", "no"),
        ('"1:30"', "1:30"),
    ],
)
def test_load_yaml_reads_plain_scalars_by_yaml_1_2(text: str, value: object) -> None:
    from spotstop.guard.validate import load_yaml

    got = load_yaml(f"key: {text}\n", source="s")["key"]
    assert got == value and type(got) is type(value)


def test_load_yaml_refuses_a_key_twice_once_read_and_a_yaml_1_1_tag() -> None:
    """``1`` and ``01`` are one key once read: the dict kept the second silently."""
    from spotstop.guard.validate import load_yaml

    assert math.isnan(load_yaml("x: .NaN\n", source="s")["x"])
    assert load_yaml("<<: {a: 1}\n", source="s") == {"<<": {"a": 1}}  # no merge keys
    assert load_yaml("a: &x {b: [1]}\nc: *x\n", source="s") == {"a": {"b": [1]}, "c": {"b": [1]}}
    with pytest.raises(ConfigError, match=r"a\[0\] holds itself through an alias .* in s\."):
        load_yaml("a: &x [*x]\n", source="s")  # was a RecursionError
    for text, where in (
        ("a:\n  1: x\n  01: y\n", r"a\.01 appears twice \(line 3\), first at line 2"),
        ("0x10: x\n16: y\n", r"16 appears twice \(line 2\), first at line 1"),
        ("true: x\nTrue: y\n", r"True appears twice \(line 2\)"),
    ):
        with pytest.raises(ConfigError, match=where + ".*Merge them in s"):
            load_yaml(text, source="s")
    for text in ("x: !!bool yes\n", "x: !!int 1:30\n", "x: !!float 1:30.5\n"):
        with pytest.raises(ConfigError, match=r"s is not valid YAML: .* is not a YAML 1\.2"):
            load_yaml(text, source="s")


def test_yaml_1_1_readings_in_the_configs_are_refused_by_key_or_kept_as_written(
    tmp_path,
) -> None:
    """YAML 1.1 read a situation policy's `window: 1:30` as 90 and `min_refs: 010` as 8 (the
    threshold of every scene of the room moved, silently), `robot_id: no` as False (refused
    as no robot id) and `detect: no`/`warmup: off` as False."""
    import yaml
    from spotstop.guard._config import load_scoring_config
    from spotstop.guard.cues import load_lexicon
    from spotstop.guard.policies import PolicyError, load_policy
    from spotstop.guard.serve import ServeSettings, SettingsError
    from spotstop.guard.serve._settings import load_serve_config

    from tests.guard.policies.test_policies import _doc

    situation = {
        "kind": "situation",
        "window": 12,
        "min_refs": 3,
        "fallback": {"kind": "frozen", "threshold": 0.25},
    }
    policy = tmp_path / "policy.yaml"
    text = yaml.safe_dump(_doc(situation), sort_keys=False)
    assert "window: 12\n" in text and "min_refs: 3\n" in text
    policy.write_text(text.replace("window: 12", "window: 1:30"))
    with pytest.raises(PolicyError, match=r"policy\.window .*got '1:30'"):
        load_policy(policy)
    policy.write_text(text.replace("min_refs: 3", "min_refs: 010"))
    assert load_policy(policy).policy.min_refs == 10  # type: ignore[attr-defined]
    policy.write_text(text + "text_in_scene: {detect: no}\n")
    with pytest.raises(PolicyError, match=r"text_in_scene\.detect must be true or false; got 'no'"):
        load_policy(policy)

    serve = tmp_path / "serve.yaml"
    serve.write_text("bundle: b\nrobot_id: no\n")
    assert ServeSettings(**load_serve_config(serve)).robot_id == "no"
    serve.write_text("bundle: b\ndeadline_s: 1:30\n")
    with pytest.raises(SettingsError, match=r"deadline_s must be a number of seconds.*got '1:30'"):
        ServeSettings(**load_serve_config(serve))

    scoring = tmp_path / "scoring.yaml"
    scoring.write_text("batch_size: 1:30\n")
    with pytest.raises(ConfigError, match=r"batch_size .*'1:30'"):
        load_scoring_config(scoring)

    lexicon = tmp_path / "lexicon.yaml"
    lexicon.write_text(
        "reassuring: [safe]\nalarming: [hot]\nnegation: {words: [no, off], window: 2}\n"
    )
    assert {"no", "off"} <= set(load_lexicon(lexicon).negation_words)


def test_dump_yaml_reads_back_equal_here_and_in_yaml_1_1() -> None:
    """PyYAML's safe_dump writes '1e5', '0o17' and '12e4567' (a digest can look so) unquoted:
    text to YAML 1.1, numbers to YAML 1.2. dump_yaml quotes what either would read otherwise."""
    import yaml
    from spotstop.guard.validate import dump_yaml, load_yaml

    data = {
        "strings": TRICKY,
        "keys": {s: i for i, s in enumerate(TRICKY)},
        "numbers": [0, -3, 10**20, 1e-5, 1e20, 0.1, -2.5, math.inf, -math.inf],
        "other": [True, False, None, [], {}],
        "nested": [{"a": ["1:30", {"b": "no"}]}],
    }
    text = dump_yaml(data)
    assert load_yaml(text, source="s") == data
    assert yaml.safe_load(text) == data
    nan = load_yaml(dump_yaml({"x": math.nan}), source="s")["x"]
    assert math.isnan(nan)
    with pytest.raises(yaml.YAMLError, match=r"ISO 8601 string"):
        dump_yaml({"created": __import__("datetime").datetime(2026, 5, 1)})


@pytest.mark.parametrize("tricky", TRICKY)
def test_every_writer_reads_back_what_it_wrote(tmp_path, tricky: str) -> None:
    """The sealed policy file and the TensorRT engine record, with a tricky string in a free
    text field; the export writers (manifest, spotstop_onnx.yaml) write through dump_yaml too
    (test_layout keeps every YAML write there)."""
    from spotstop.guard.backends._trt_record import read_engine_record, write_engine_record
    from spotstop.guard.policies import load_policy, policy_text

    from tests.guard.policies.test_policies import _doc

    doc = _doc()
    doc["fitted_on"] = {"dataset": tricky, "names": [tricky], tricky or "empty": 1}
    cfg = load_policy(doc)
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(cfg), encoding="utf-8")
    assert load_policy(path).to_dict() == cfg.to_dict()

    member = tmp_path / "member"
    (member / "onnx").mkdir(parents=True)
    (member / "onnx" / "vision.onnx").write_bytes(b"graph")
    (member / "trt").mkdir()
    (member / "trt" / "vision.plan").write_bytes(b"engine")
    kw = {"tensorrt_version": "10.3", "compute_capability": "8.7", "precision": "fp16"}
    write_engine_record(
        member,
        {"onnx/vision.onnx": "trt/vision.plan"},
        gpu=tricky,
        strongly_typed=False,
        built_by=f"spotstop {tricky}",
        **kw,
    )
    rec = read_engine_record(member)
    assert (rec["tensorrt"], rec["compute_capability"], rec["precision"]) == ("10.3", "8.7", "fp16")
    assert (rec["gpu"], rec["built_by"]) == (tricky, f"spotstop {tricky}")


def _yaml_we_ship() -> list[tuple[str, str]]:
    """Every committed YAML file, and every YAML example of the docs and the README."""
    import re

    out = [
        (str(p.relative_to(ROOT)), p.read_text(encoding="utf-8"))
        for pattern in ("guard/**/*.yaml", "tests/**/*.yaml")
        for p in sorted(ROOT.glob(pattern))
    ]
    for page in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        text = page.read_text(encoding="utf-8")
        for i, m in enumerate(re.finditer(r"```ya?ml\n(.*?)```", text, re.S)):
            out.append((f"{page.relative_to(ROOT)} example {i}", m.group(1)))
    return out


def test_nothing_we_ship_relied_on_yaml_1_1() -> None:
    """The committed bundle, lexicon and test data and the docs' examples read as YAML 1.1 read
    them, and the writers write them byte for byte as before."""
    import yaml
    from spotstop.guard.validate import dump_yaml, load_yaml

    shipped = _yaml_we_ship()
    assert any(n.endswith("tiny_bundle/manifest.yaml") for n, _ in shipped)
    assert any(n.startswith("docs/") for n, _ in shipped)
    for name, text in shipped:
        old = yaml.safe_load(text)
        assert load_yaml(text, source=name) == old, name
        assert dump_yaml(old) == yaml.safe_dump(old, sort_keys=False, allow_unicode=True), name
