"""The command line: the composition root's table, lazy parsers, install hints, exit codes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from spotstop.cli import COMMANDS, MODULE_EXTRAS, Command, build_parser, install_hint, main

from tests._support import REPO_ROOT
from tests._support.images import make_image_bytes

ROOT = REPO_ROOT
HEAVY = ("torch", "transformers", "scipy", "matplotlib", "fastapi")


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


# ---- the table -------------------------------------------------------------------------------


def test_every_command_has_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "safety guard" in out
    for name in COMMANDS:
        assert name in out
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0, name
        assert len(capsys.readouterr().out) > 200, name


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_room_adds_its_command_with_the_tables_summary(name: str) -> None:
    """The listing of `spotstop --help` comes from the table; it says what the room's parser says."""
    cmd = COMMANDS[name]
    sub = _subcommands(build_parser(name))
    own = next(a for a in sub._choices_actions if a.dest == name)
    assert own.help == cmd.summary
    assert callable(sub.choices[name].get_default("func"))


def test_every_extra_named_exists_in_pyproject() -> None:
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    named = set(MODULE_EXTRAS.values()) | {x for c in COMMANDS.values() for x in c.extras}
    assert named <= extras, named - extras
    assert "serve" not in extras, "the sidecar is part of the base install"


def test_help_imports_no_room_and_no_heavy_library():
    out = _python(
        f"""
        import json, sys
        from spotstop.cli import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        watched = {{*{HEAVY!r}, "spotstop"}}
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in watched)))
        """
    )
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert loaded and all(m == "spotstop" or m.startswith("spotstop.cli") for m in loaded), loaded


def test_the_parsers_of_every_command_import_no_heavy_library():
    """Building a room's parser is light: its handler imports the heavy work when it runs, so
    ``spotstop COMMAND --help`` works on the base install (the diagnostics packages export
    their names lazily, diagnostics/_lazy.py)."""
    names = list(COMMANDS)
    out = _python(
        f"""
        import sys
        from spotstop.cli import main
        for name in {names!r}:
            try:
                main([name, "--help"])
            except SystemExit:
                pass
        print(sorted(m for m in {HEAVY!r} if m in sys.modules))
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("package", ["spotstop.diagnostics", "spotstop.diagnostics.cues"])
def test_the_lazy_public_names_are_the_type_checking_block_and_all_resolve(package: str):
    import importlib

    from spotstop.diagnostics._lazy import exported_names

    mod = importlib.import_module(package)
    table = exported_names(mod.__file__)
    assert set(table) <= set(dir(mod))
    assert sorted(table) == sorted(mod.__all__)  # __all__ lists exactly the block's names
    for name, where in table.items():
        assert getattr(mod, name) is getattr(importlib.import_module(where), name), name
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        mod.nope  # noqa: B018


def test_the_robots_commands_import_no_extra():
    """What check, serve, policy, recalibrate and verify-bundle's runtime half import (the
    slow tests/test_base_install.py runs them where the extras are not installed at all)."""
    out = _python(
        """
        import sys
        import spotstop.calibrate, spotstop.calibrate._cli, spotstop.export.verify
        import spotstop.guard.client, spotstop.guard.serve
        print(sorted(m for m in ("torch", "transformers", "scipy", "matplotlib") if m in sys.modules))
        """
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_runtime_package_imports_without_torch():
    out = _python(
        "import sys, spotstop.guard; print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    assert out.stdout.strip() == "False False", out.stderr


def test_python_dash_m_runs_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "spotstop.cli", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0 and "COMMAND" in out.stdout


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


# ---- install hints ---------------------------------------------------------------------------


def test_install_hint_names_the_extra():
    e = ModuleNotFoundError("No module named 'scipy'", name="scipy.stats")
    assert install_hint(e) == (
        "needs the 'diag' extra (scipy is not installed): pip install 'spotstop[diag]'"
    )
    # a library the table does not know: the command's extras
    e = ModuleNotFoundError("No module named 'shapely'", name="shapely")
    assert install_hint(e, ("diag", "cues")) == (
        "needs the 'diag' and 'cues' extras (shapely is not installed): "
        "pip install 'spotstop[diag,cues]'"
    )
    # importable but broken: said so, still one line
    e = ImportError("cannot import name 'X' from 'transformers'\nmore", name="transformers")
    assert install_hint(e) == (
        "needs the 'export' extra (transformers failed to import: cannot import name 'X' "
        "from 'transformers'): pip install 'spotstop[export]'"
    )
    # our own module missing, or an unknown library of a base command: a bug, not a hint
    assert install_hint(ModuleNotFoundError("x", name="spotstop.guard._nope"), ("export",)) is None
    assert install_hint(ModuleNotFoundError("x", name="shapely")) is None
    assert install_hint(ImportError("x")) is None


def _add_boom(sub):
    p = sub.add_parser("boom", help="raises what the test puts in BOOM")
    p.set_defaults(func=_boom)


BOOM: list[BaseException] = []


def _boom(args):
    raise BOOM[0]


@pytest.fixture
def boom(monkeypatch):
    monkeypatch.setitem(
        COMMANDS, "boom", Command("tests.cli.test_commands", "_add_boom", ("export",), "x")
    )
    BOOM.clear()
    return BOOM


def test_a_missing_extra_in_a_handler_is_one_line_and_exit_2(boom, capsys):
    boom.append(ModuleNotFoundError("No module named 'torch'", name="torch"))
    assert main(["boom"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "spotstop boom: needs the 'export' extra (torch is not installed): "
        "pip install 'spotstop[export]'\n"
    )


def test_a_backend_unavailable_error_keeps_its_hint_and_exits_2(boom, capsys):
    from spotstop.guard import BackendUnavailableError

    boom.append(BackendUnavailableError("the 'tensorrt' backend needs ...; install it with: X"))
    assert main(["boom"]) == 2
    assert capsys.readouterr().err == (
        "spotstop boom: the 'tensorrt' backend needs ...; install it with: X\n"
    )


def test_our_own_missing_module_is_a_bug_with_its_traceback(boom):
    boom.append(ModuleNotFoundError("No module named 'spotstop.nope'", name="spotstop.nope"))
    with pytest.raises(ModuleNotFoundError):
        main(["boom"])


def test_guard_errors_keep_their_exit_codes(boom, capsys):
    from spotstop.guard import ConfigError, ScoringError

    boom.append(ConfigError("policy.alpha must be in (0, 1); got 1.5."))
    assert main(["boom"]) == 2
    boom[0] = ScoringError("the forward pass raised")
    assert main(["boom"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "spotstop boom: ConfigError: policy.alpha must be in (0, 1); got 1.5.",
        "spotstop boom: ScoringError: the forward pass raised",
    ]


#: Runs the CLI with ``BLOCKED`` unimportable, as on an install without that extra.
_WITHOUT = """
import sys
from importlib.abc import MetaPathFinder

class Block(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == sys.argv[1]:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Block())
from spotstop.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize(
    ("blocked", "argv", "extra"),
    [
        ("scipy", ["card", "--simulated", "--out", "{tmp}/card"], "diag"),
        ("torch", ["export", "--member", "{tmp}/m", "--out", "{tmp}/b"], "export"),
    ],
)
def test_a_missing_extra_exits_2_with_one_line(tmp_path: Path, blocked, argv, extra):
    out = _python(_WITHOUT, blocked, *(a.format(tmp=tmp_path) for a in argv))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    *progress, line = out.stderr.splitlines()
    assert line == (
        f"spotstop {argv[0]}: needs the '{extra}' extra ({blocked} is not installed): "
        f"pip install 'spotstop[{extra}]'"
    )
    if argv[0] == "card":  # nothing ran before the import: the hint is all
        assert progress == []


# ---- score (the torch reference) -------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny-qwen3_5", "tiny-lfm2_vl"])
def test_score_prints_a_finite_score_and_the_prompt_hash(
    tiny_pair: Path, tmp_path: Path, capsys, name
):
    img = tmp_path / "scene.jpg"
    img.write_bytes(make_image_bytes(3, fmt="JPEG"))
    rc = main(
        [
            "score",
            "--member",
            str(tiny_pair / name),
            str(img),
            "--request",
            "open the door",
            "--json",
            "--variant",
            "scene",
            "--variant",
            "text",
        ]
    )
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["test_pair"] is True and len(data["prompt_hash"]) == 16
    assert set(data["scores"]) == {"scene", "text"}
    assert all(abs(v) < 1e6 for v in data["scores"].values())


def test_score_takes_a_visual_token_budget(tiny_pair: Path, tmp_path: Path, capsys):
    img = tmp_path / "scene.png"
    img.write_bytes(make_image_bytes(4))
    member = str(tiny_pair / "tiny-lfm2_vl")
    argv = ["score", "--member", member, str(img), "--request", "open the door", "--json"]
    assert main([*argv, "--visual-tokens", "64"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["visual_tokens"] == 64 and data["image_size"] == [256, 256]
    assert main([*argv, "--visual-tokens", "60"]) == 2
    assert "nearest budgets that do: 49 or 64" in capsys.readouterr().err


def test_score_bad_image_is_a_usage_error(tiny_pair: Path, tmp_path: Path, capsys):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"")
    rc = main(["score", "--member", str(tiny_pair / "tiny-qwen3_5"), str(bad), "--request", "x"])
    assert rc == 2
    assert "empty" in capsys.readouterr().err.lower()


def test_score_missing_member_is_explained(tmp_path: Path, capsys):
    img = tmp_path / "scene.png"
    img.write_bytes(make_image_bytes(0))
    rc = main(["score", "--member", str(tmp_path / "nope"), str(img), "--request", "x"])
    assert rc == 1
    assert "does not exist" in capsys.readouterr().err


# ---- verify-bundle's runtime half ------------------------------------------------------------


def test_verify_bundle_runs_its_runtime_half_without_the_reference(
    bundle_copy, monkeypatch, capsys
):
    """Without torch/transformers the runtime half runs, passes, and one line names the extra."""
    from spotstop.export import verify

    bundle = bundle_copy
    monkeypatch.setattr(verify, "reference_available", lambda: False)
    assert main(["verify-bundle", str(bundle), "--scenes", "3"]) == 0
    out = capsys.readouterr().out
    assert "max|Δs|" not in out and "all finite" in out and "PASS" in out
    assert [line for line in out.splitlines() if "spotstop[export]" in line] == [
        verify.REFERENCE_HINT
    ]
    assert out.splitlines()[-1].startswith("PASS (runtime only")  # not a bare PASS
    assert main(["verify-bundle", str(bundle), "--scenes", "3", "--runtime-only", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["members"] == [] and [r["n"] for r in doc["runtime"]] == [6, 6]
    for bad in ("0", "-2"):  # a traceback, exit 1, and a message about an empty scene table
        assert main(["verify-bundle", str(bundle), "--scenes", bad]) == 2
        assert "--scenes must be at least 1" in capsys.readouterr().err


def test_verify_bundle_scores_a_scene_table_when_given_one(bundle_copy, tmp_path, capsys):
    """--scene-table: the deployment's own scenes (a world.csv) instead of generated ones; every
    row is scored (scene and request-only passes), and a bad table is exit 2 naming it."""
    pytest.importorskip("matplotlib")
    from spotstop.export.world import WorldOptions, build_world

    bundle = bundle_copy
    w = build_world(tmp_path / "w", seed=1, options=WorldOptions(rooms=1, contrasts_per_room=2))
    argv = ["verify-bundle", str(bundle), "--runtime-only", "--json", "--scene-table"]
    assert main([*argv, str(w.csv_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["runtime"][0]["n"] == 2 * len(w.cases)
    (tmp_path / "bad.csv").write_text("image,request\nnope.png,go\n")
    assert main([*argv, str(tmp_path / "bad.csv")]) == 2
    assert "--scene-table" in capsys.readouterr().err


def test_check_an_image_it_cannot_read_is_a_usage_error(bundle_copy, tmp_path, capsys, monkeypatch):
    """A file it may not read (or one gone since the check for it) was a traceback, exit 1."""
    from pathlib import Path

    img = tmp_path / "cam.png"
    img.write_bytes(make_image_bytes(0))
    real = Path.read_bytes

    def denied(self: Path) -> bytes:
        if self == img:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    args = ["check", str(img), "--request", "open the door", "--bundle", str(bundle_copy)]
    assert main([*args, "--log", str(tmp_path / "l.sqlite")]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err and "Permission denied" in err
    assert not (tmp_path / "l.sqlite").exists()
