"""Scoring many scenes on Ray equals scoring them in this process.

A local Ray cluster with two CPUs is started once for the module. The tiny pair's scores on
Ray equal the local ones within the backend's score bound (other batch shapes run other
kernels); scorers without a model pin the input order, the NaN-and-warning of a member that
fails on a scene, and that an edit set renders the same pixels in a Ray worker (and fills the
same cache). Without ``--ray`` nothing imports Ray; without the extra ``--ray`` says what to
install.
"""

from __future__ import annotations

import csv
import functools
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

from spotstop.cli import main  # noqa: E402
from spotstop.diagnostics.cues._scoring import MemberSpec, score_edit_set  # noqa: E402
from spotstop.guard import ScoringError, load_member  # noqa: E402
from spotstop.guard._batch import LocalEngine, MemberRef, get_engine, score_scenes  # noqa: E402
from spotstop.guard._scene_table import SCORE_COLUMNS, read_scene_table  # noqa: E402

from tests._support import REPO_ROOT  # noqa: E402
from tests._support.cues_fakes import make_edits  # noqa: E402
from tests._support.images import make_image_bytes  # noqa: E402
from tests._support.pair import TINY_MEMBERS  # noqa: E402
from tests._support.scoring_fakes import PixelHash, RequestNumber, load_numbers  # noqa: E402
from tests._support.tolerance import score_tolerance  # noqa: E402

# third-party noise that is not ours to fix: Ray Data's own DataContext warns on creation
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")

ROOT = REPO_ROOT
N_SCENES = 12


@pytest.fixture(scope="module")
def ray_cluster() -> object:
    """A local Ray cluster with two CPUs; the workers import ``tests`` (the fake scorers)."""
    if ray.is_initialized():  # pragma: no cover - another module left one running
        ray.shutdown()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def scenes_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 scenes of different sizes and requests: ``images/*.png`` + ``scenes.csv``."""
    root = tmp_path_factory.mktemp("scenes")
    (root / "images").mkdir()
    with (root / "scenes.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["image", "request", "situation_id"])
        for i in range(N_SCENES):
            name = f"images/s{i:02d}.png"
            (root / name).write_bytes(make_image_bytes(i, (64 + 8 * i, 48 + 4 * (i % 3))))
            w.writerow([name, f"move the object to shelf {i}", f"room{i % 3}" if i % 2 else ""])
    return root / "scenes.csv"


def _ray_engine(**kw: object) -> object:
    return get_engine("ray", **{"actors": 2, "chunk_size": 3, **kw})


def test_ray_scores_of_the_tiny_pair_equal_local_scores(
    ray_cluster: object, scenes_csv: Path, tiny_pair: Path, loaded_members: dict[str, object]
) -> None:
    table = read_scene_table(scenes_csv)
    refs = [
        MemberRef(name, functools.partial(load_member, tiny_pair / name, threads=1))
        for name in TINY_MEMBERS
    ]
    local = score_scenes(table, refs, ("scene", "text"), engine=LocalEngine(chunk_size=5))
    on_ray = score_scenes(
        table, refs, ("scene", "text"), engine=_ray_engine(actors=1, chunk_size=6)
    )
    assert on_ray.engine == "ray" and on_ray.n == N_SCENES
    for name in TINY_MEMBERS:
        here, there = local.members[name], on_ray.members[name]
        assert there.prompt_hash == here.prompt_hash == loaded_members[name].prompt_hash
        assert there.test_pair and here.test_pair
        tol = score_tolerance(loaded_members[name])
        for v in ("scene", "text"):
            assert np.isfinite(there.scores[v]).all()
            np.testing.assert_allclose(there.scores[v], here.scores[v], rtol=0, atol=tol)


def test_ray_keeps_the_input_order_and_fails_a_scene_as_locally(
    ray_cluster: object, tmp_path: Path
) -> None:
    """One scene per batch on two actors: batches come back in any order, scores do not; a
    member's NaN on one scene is NaN there on both engines, with the same warning."""
    img = tmp_path / "a.png"
    img.write_bytes(make_image_bytes(0))
    rows = [f"a.png,scene {i}" if i != 7 else "a.png,scene fail" for i in range(N_SCENES)]
    (tmp_path / "s.csv").write_text("image,request\n" + "\n".join(rows) + "\n", encoding="utf-8")
    table = read_scene_table(tmp_path / "s.csv")
    ref = [MemberRef("numbers", RequestNumber)]
    want = np.array([math_nan if i == 7 else float(i) for i in range(N_SCENES)])
    got = {}
    for engine in (LocalEngine(chunk_size=1), _ray_engine(chunk_size=1)):
        with pytest.warns(RuntimeWarning, match=r"member numbers gave 2 non-finite score\(s\)"):
            res = score_scenes(table, ref, ("scene", "text"), engine=engine)
        got[engine.name] = res.members["numbers"]
    for run in got.values():
        np.testing.assert_array_equal(run.scores["scene"], want)
        np.testing.assert_array_equal(run.scores["text"], want + 0.5)
        assert run.prompt_hash == "numbers-hash"


def test_a_chunk_that_kills_its_worker_every_time_ends_the_run_with_an_error(
    ray_cluster: object, tmp_path: Path
) -> None:
    """Ray restarts a dead actor and retries its task forever by default: the run never
    ended. After a few tries it now fails, naming the scenes it has no score for."""
    from tests._support.scoring_fakes import DiesOnCrash

    img = tmp_path / "a.png"
    img.write_bytes(make_image_bytes(0))
    rows = [f"a.png,scene {i}" if i != 3 else "a.png,scene crash" for i in range(6)]
    (tmp_path / "s.csv").write_text("image,request\n" + "\n".join(rows) + "\n", encoding="utf-8")
    table = read_scene_table(tmp_path / "s.csv")
    with pytest.raises(ScoringError, match="member numbers: a Ray worker scoring it died 4 times"):
        score_scenes(
            table, [MemberRef("numbers", DiesOnCrash)], ("scene",), engine=_ray_engine(chunk_size=2)
        )


math_nan = float("nan")


def test_an_edit_set_scored_on_ray_renders_the_same_pixels_and_fills_the_same_cache(
    ray_cluster: object, tmp_path: Path
) -> None:
    edits = make_edits(tmp_path, 1, 1)
    spec = MemberSpec("pixels", "pixels-id", "pixels-hash", PixelHash)
    local = score_edit_set(edits, [spec])
    cache = tmp_path / "cache"
    on_ray = score_edit_set(
        edits, [spec], cache_dir=cache, engine=_ray_engine(actors=1, chunk_size=64)
    )
    np.testing.assert_array_equal(on_ray.scores["pixels"], local.scores["pixels"])
    assert not on_ray.timings["pixels"].cached

    def must_not_load() -> PixelHash:
        raise AssertionError("the cache written by the Ray run must be used")

    again = score_edit_set(edits, [MemberSpec("pixels", "pixels-id", "pixels-hash", must_not_load)],
                           cache_dir=cache)  # fmt: skip
    assert again.timings["pixels"].cached
    np.testing.assert_array_equal(again.scores["pixels"], local.scores["pixels"])


def _read_rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_score_cli_with_ray_writes_the_local_table(
    ray_cluster: object,
    scenes_csv: Path,
    tiny_pair: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``spotstop score CSV --ray``: the local table, row for row (the member is a stand-in
    here, loaded by the actors as ``load_member`` would be; the tiny pair's own scores are
    compared above)."""
    monkeypatch.setattr("spotstop.guard._member.load_member", load_numbers)
    member = str(tiny_pair / TINY_MEMBERS[0])
    argv = ["score", str(scenes_csv), "--member", member, "--variant", "scene", "--variant", "text"]
    assert main([*argv, "--out", str(tmp_path / "local.jsonl"), "--quiet"]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray.jsonl"), "--ray", "--chunk-size", "2"]) == 0
    err = capsys.readouterr().err
    assert f"with {TINY_MEMBERS[0]} (prompt numbers-hash) on the ray engine" in err
    local, on_ray = _read_rows(tmp_path / "local.jsonl"), _read_rows(tmp_path / "ray.jsonl")
    assert on_ray == local
    assert [(r["scene"], r["variant"]) for r in on_ray] == [
        (i, v) for i in range(N_SCENES) for v in ("scene", "text")
    ]
    assert [r["score"] for r in on_ray][:4] == [0.0, 0.5, 1.0, 1.5]
    assert [r["image"] for r in on_ray][::2] == [f"images/s{i:02d}.png" for i in range(N_SCENES)]
    assert [r["situation_id"] for r in on_ray][:4] == [None, None, "room1", "room1"]


def test_score_cli_with_ray_names_each_row_whose_request_the_member_refuses(
    ray_cluster: object,
    tiny_pair: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On Ray the member loads in the actors, which refused such a request and ended the
    whole run naming no row. The driver now checks each row with the member's encoder (the
    torch member's whole request check; ``load_encoder``, a stand-in here): the refused rows
    are named and written with the reason, the others scored, as without ``--ray``."""
    monkeypatch.setattr("spotstop.guard._member.load_member", load_numbers)
    monkeypatch.setattr(
        "spotstop.guard._member.load_encoder", lambda source, **kw: RequestNumber(Path(source).name)
    )
    (tmp_path / "img").mkdir()
    rows = ["image,request"]
    for i, req in enumerate(["go 1", "go refuse", "go 2", "go 3"]):
        (tmp_path / "img" / f"{i}.png").write_bytes(make_image_bytes(i))
        rows.append(f"img/{i}.png,{req}")
    (tmp_path / "s.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    member = str(tiny_pair / TINY_MEMBERS[0])
    argv = ["score", str(tmp_path / "s.csv"), "--member", member, "--chunk-size", "2", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "ray.jsonl"), "--ray"]) == 1
    err = capsys.readouterr().err
    assert "s.csv, scene 1 (img/1.png): not scored: request 'go refuse' is refused" in err
    assert "1 of 4 scene(s) have no score (1 refused" in err and "Traceback" not in err
    assert main([*argv, "--out", str(tmp_path / "local.jsonl")]) == 1
    on_ray, local = _read_rows(tmp_path / "ray.jsonl"), _read_rows(tmp_path / "local.jsonl")
    assert on_ray == local
    assert [r["score"] for r in on_ray] == [1.0, None, 2.0, 3.0]


def test_load_encoder_refuses_what_the_loaded_member_refuses(tiny_pair: Path) -> None:
    """The driver's check on Ray (``load_encoder``, no weights) is the torch member's own."""
    from spotstop.guard._errors import RequestError
    from spotstop.guard._member import load_encoder

    folder = tiny_pair / TINY_MEMBERS[0]
    encoder, member = load_encoder(folder), load_member(folder)
    for request in ("x" * 30000, "", "open the door <|im_end|>"):
        with pytest.raises(RequestError) as by_encoder:
            encoder.check_request(request)
        with pytest.raises(RequestError) as by_member:
            member.check_request(request)
        assert str(by_encoder.value) == str(by_member.value)
    encoder.check_request("open the door")


def test_without_the_ray_extra_ray_says_what_to_install(
    scenes_csv: Path, tiny_pair: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    for mod in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "spotstop.guard._batch_ray", raising=False)
    member = str(tiny_pair / TINY_MEMBERS[0])
    rc = main(["score", str(scenes_csv), "--member", member, "--ray", "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "spotstop score: needs the 'ray' extra (ray is not installed): pip install 'spotstop[ray]'"
    ]


def test_a_local_run_imports_no_ray(scenes_csv: Path, tmp_path: Path) -> None:
    """The local engine, the scene table, the edit set's scoring and the commands' modules run
    without Ray (a fresh process: this module has imported it)."""
    code = textwrap.dedent(
        f"""
        import sys, warnings
        from pathlib import Path
        warnings.simplefilter("ignore")
        from spotstop.cli import build_parser
        from spotstop.diagnostics.cues._scoring import MemberSpec, score_edit_set
        from spotstop.guard._batch import MemberRef, get_engine, score_scenes
        from spotstop.guard._scene_table import read_scene_table, write_scores
        from tests._support.scoring_fakes import PixelHash, RequestNumber
        from tests._support.cues_fakes import make_edits

        for name in ("score", "reliance", "select"):
            build_parser(name)
        table = read_scene_table({str(scenes_csv)!r})
        res = score_scenes(table, [MemberRef("numbers", RequestNumber)], ("scene", "text"),
                           engine=get_engine("local", chunk_size=5), progress=True)
        write_scores(table, res, {str(tmp_path / "s.csv")!r}, "csv")
        edits = make_edits(Path({str(tmp_path)!r}), 1, 1)
        score_edit_set(edits, [MemberSpec("pixels", "id", "pixels-hash", PixelHash)])
        print(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == "[]"
    rows = (tmp_path / "s.csv").read_text(encoding="utf-8").splitlines()
    assert rows[0] == ",".join(SCORE_COLUMNS) and len(rows) == 2 * N_SCENES + 1


class _Stop(Exception):
    pass


def test_reliance_and_select_pass_ray_to_the_edit_scoring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--ray ADDRESS --actors N --cpus-per-actor C`` reach the scoring of the edit set as a
    Ray engine (not connected yet), and the members get C threads."""
    from spotstop.diagnostics.cues import _candidates, _source
    from spotstop.guard._batch_ray import RayEngine

    seen: dict[str, object] = {}
    monkeypatch.setattr(_source, "read_source_set", lambda source: "source")
    monkeypatch.setattr(_candidates, "load_candidates", lambda f, **kw: seen.update(kw) or "c")

    def measure(cands: object, source: object, **kw: object) -> object:
        seen["engine"] = kw["engine"]
        raise _Stop

    monkeypatch.setattr(_candidates, "measure_reliance", measure)
    argv = ["reliance", "--bundle", "B", "--source", "S", "--out", str(tmp_path), "--ray",
            "ray://head:10001", "--actors", "3", "--cpus-per-actor", "2"]  # fmt: skip
    with pytest.raises(_Stop):
        main(argv)
    engine = seen["engine"]
    assert isinstance(engine, RayEngine)
    assert (engine.address, engine.actors, engine.cpus_per_actor) == ("ray://head:10001", 3, 2.0)
    assert engine.gpus_per_actor == 0.0
    assert seen["threads"] == 2
    with pytest.raises(_Stop):
        main([*argv[:-6], "--threads", "1", "--ray"])
    assert seen["engine"].address is None and seen["threads"] == 1  # type: ignore[attr-defined]
    with pytest.raises(_Stop):
        main(argv[:-6])
    assert seen["engine"] is None and seen["threads"] is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"actors": 0}, "actors must be a positive integer"),
        ({"actors": True}, "actors must be a positive integer"),
        ({"cpus_per_actor": 0}, "cpus_per_actor must be > 0"),
        ({"gpus_per_actor": -1}, "gpus_per_actor must be >= 0"),
        ({"chunk_size": 0}, "chunk_size must be a positive integer"),
        ({"address": 6379}, "the Ray address must be a string"),
    ],
)
def test_ray_engine_settings_are_checked(settings: dict, message: str) -> None:
    from spotstop.guard import ConfigError

    with pytest.raises(ConfigError, match=message):
        get_engine("ray", **settings)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_the_local_engine_checks_its_chunk_size_as_ray_does(bad: object) -> None:
    """-1 scored nothing and returned NaN for every scene, as if the member failed them."""
    from spotstop.guard import ConfigError

    for engine in ("local", "ray"):
        with pytest.raises(ConfigError, match="chunk_size must be a positive integer"):
            get_engine(engine, chunk_size=bad)
