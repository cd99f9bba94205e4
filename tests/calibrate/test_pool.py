"""`spotstop policy init`: the first policy of a bundle from an unlabelled pool."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from spotstop.calibrate import CalibrationError, fit_frozen
from spotstop.calibrate._pool import fit_pool_policy, pool_scenes
from spotstop.cli import main
from spotstop.export.scenes import demo_scenes
from spotstop.guard import ConfigError, Guard, Scene, load_bundle, load_policy
from spotstop.guard._member import load_bundle_member
from spotstop.guard.policies import FrozenPolicy, PolicyError, dump_policy


@pytest.fixture
def bare_bundle(committed_bundle: Path, tmp_path: Path) -> Path:
    """The committed tiny ONNX bundle without its policy.yaml (as after an export)."""
    dst = tmp_path / "b"
    shutil.copytree(committed_bundle, dst, ignore=shutil.ignore_patterns("policy.yaml", "policies"))
    return dst


@pytest.fixture
def pool_dir(tmp_path: Path) -> Path:
    d = tmp_path / "pool"
    d.mkdir()
    for i, s in enumerate(demo_scenes(10, seed=11)):
        assert isinstance(s.image, bytes)
        suffix = ".jpg" if s.image[:2] == b"\xff\xd8" else ".png"
        (d / f"frame{i:03d}{suffix}").write_bytes(s.image)
    return d


def test_policy_init_fits_the_pool_and_makes_the_bundle_servable(
    bare_bundle: Path, pool_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(FileNotFoundError, match="policy init"):
        Guard(bare_bundle, log=tmp_path / "l.sqlite")  # no policy yet
    rc = main(
        [
            "policy",
            "init",
            str(bare_bundle),
            "--pool",
            str(pool_dir),
            "--request",
            "open the door",
            "--request",
            "pick up the knife",
        ]
    )
    assert rc == 0
    assert "visual tokens per member" in capsys.readouterr().out
    assert (bare_bundle / "policy.yaml").is_file()
    assert (bare_bundle / "policies" / "policy-v0001.yaml").is_file()
    cfg = load_policy(bare_bundle / "policy.yaml")
    assert cfg.fitted_on["visual_tokens"] == {"tiny-qwen3_5": 4, "tiny-lfm2_vl": 4}
    # independent recomputation: member scores of the same scenes, numpy median/IQR, mean S
    b = load_bundle(bare_bundle)
    scenes = pool_scenes(pool_dir, ["open the door", "pick up the knife"])
    raw = {
        bm.name: np.array([r.score for r in load_bundle_member(b, bm).score(scenes)])
        for bm in b.members
    }
    z = []
    for name, s in raw.items():
        q75, q25 = np.percentile(s, [75, 25])
        assert cfg.fusion.stats[name].median == pytest.approx(np.median(s), abs=1e-9)
        assert cfg.fusion.stats[name].iqr == pytest.approx(q75 - q25, abs=1e-9)
        z.append((s - np.median(s)) / (q75 - q25))
    assert cfg.policy.threshold == pytest.approx(np.mean(np.mean(z, axis=0)), abs=1e-9)
    with Guard(bare_bundle, log=tmp_path / "l.sqlite") as g:
        d = g.check(Scene(scenes[0].image, "open the door"))
    assert not d.fail_closed and d.policy == "frozen"


def test_policy_init_situation_kind_and_refusals(bare_bundle: Path, pool_dir: Path, tmp_path: Path):
    scenes = pool_scenes(pool_dir, ["water the plant"])
    cfg = fit_pool_policy(
        bare_bundle, scenes, kind="situation", settings={"window": 5, "min_refs": 2}
    )
    assert cfg.policy.kind == "situation" and cfg.policy.fallback.kind == "frozen"
    assert (cfg.policy.window, cfg.policy.min_refs) == (5, 2)
    # how κ came about is recorded, as recalibrate records it (demo scenes carry no situation)
    prior = cfg.fitted_on["situation_prior"]
    assert prior["weight"] == cfg.policy.prior_weight == 5.0 and prior["how"].startswith("the cap")
    assert fit_pool_policy(bare_bundle, scenes).fitted_on["situation_prior"] is None
    batch = fit_pool_policy(bare_bundle, scenes, kind="batch", settings={"weights": "reliance"})
    assert batch.policy.weights == "reliance" and batch.variants_needed() == ("text",)
    with pytest.raises(CalibrationError, match="conformal"):
        fit_pool_policy(bare_bundle, scenes, kind="conformal")
    # a bad setting is refused before the pool is scored (here: before the bundle is read)
    for bad, words in (({"prior_weight": -1.0}, "prior_weight must be a finite number ≥ 0"),
                       ({"window": 0}, "window must be a positive integer")):  # fmt: skip
        with pytest.raises(PolicyError, match=words):
            fit_pool_policy(tmp_path / "no-bundle", scenes, kind="situation", settings=bad)
    for share in (1.5, 0.0, float("nan")):  # was refused by the band, after the pool's scoring
        with pytest.raises(PolicyError, match=r"share must be in \(0, 1\]"):
            fit_pool_policy(
                tmp_path / "no-bundle", scenes, kind="cascade", settings={"share": share}
            )
    few = tmp_path / "few"
    few.mkdir()
    shutil.copy(next(pool_dir.iterdir()), few / "a.jpg")
    with pytest.raises(CalibrationError, match="at least 8"):
        pool_scenes(few, ["x"])
    with pytest.raises(CalibrationError, match="request"):
        pool_scenes(pool_dir, ["  "])


def test_policy_init_keeps_the_policy_in_force_and_its_text_setting(
    bare_bundle: Path,
    committed_bundle: Path,
    pool_dir: Path,
    capsys: pytest.CaptureFixture[str],
):
    """The manifest names the policy file (here ``live.yaml``): init activates only when it
    is missing or with ``--activate`` (it looked for ``policy.yaml``, found none, and replaced
    the policy in force unasked); and the new policy keeps its ``text_in_scene``."""
    manifest = bare_bundle / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace("policy: policy.yaml", "policy: live.yaml"))
    live = bare_bundle / "live.yaml"
    doc = load_policy(committed_bundle / "policy.yaml").to_dict()
    doc["text_in_scene"] = {"detect": True, "reassuring": "fail_closed", "alarming": "log"}
    dump_policy(load_policy(doc), live)
    before = live.read_bytes()
    args = ["policy", "init", str(bare_bundle), "--pool", str(pool_dir), "--request", "x"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert live.read_bytes() == before and "not active yet" in out
    assert "text in the scene: kept from the policy in force" in out
    new = load_policy(bare_bundle / "policies" / "policy-v0002.yaml")
    assert new.text_in_scene == load_policy(live).text_in_scene
    assert main([*args, "--activate"]) == 0
    assert f"as {live}" in capsys.readouterr().out
    assert load_policy(live).fitted_on["version"] == 3
    assert not (bare_bundle / "policy.yaml").exists()
    # a policy in force that cannot be read: refused before the pool is scored
    live.write_text("version: [unclosed\n")
    with pytest.raises(CalibrationError, match="its text_in_scene setting cannot be carried"):
        fit_pool_policy(bare_bundle, pool_scenes(pool_dir, ["x"]))


def test_fit_frozen_is_the_guards_frozen_rule() -> None:
    """calibrate keeps no copy of the frozen rule: fit_frozen is FrozenPolicy.fit_pool."""
    rng = np.random.default_rng(2)
    pool = {"a": rng.normal(0, 1, 20), "b": rng.normal(3, 2, 20)}
    fit = fit_frozen(pool)
    fusion, policy = FrozenPolicy.fit_pool(pool)
    assert (fit.fusion, fit.policy, fit.n) == (fusion, policy, 20)
    with pytest.raises(ConfigError, match=r"the unlabelled pool has 3 scenes; at least 8 are"):
        fit_frozen({m: x[:3] for m, x in pool.items()})
    assert fit_frozen({m: x[:3] for m, x in pool.items()}, min_n=3).n == 3


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    image = Image.new("RGB", (width, height), (90, 120, 150))
    image.paste((230, 200, 60), (0, 0, width // 2, height))  # two halves: it shows something
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def test_a_pool_frame_the_guard_refuses_is_refused_by_name(
    bare_bundle: Path, pool_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 4x4 thumbnail (under the guard's min_image_side 32) went into the pool's median/IQR
    and t0: the policy was fitted on a frame the guard never scores. A corrupt frame aborted
    `policy init` with an ImageRefused that named no file. Both are refused before anything
    is scored, each file named."""
    tiny = pool_dir / "zz_tiny.png"
    tiny.write_bytes(_png(4, 4))
    broken = pool_dir / "zz_broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all")
    with pytest.raises(CalibrationError) as err:
        pool_scenes(pool_dir, ["open the door"])
    msg = str(err.value)
    assert "2 of the 12 pool images" in msg
    assert f"{tiny}: image is 4x4 pixels" in msg and f"{broken}: " in msg
    # the guard's own limit: a lower min_image_side keeps the thumbnail (the broken one stays out)
    broken.unlink()
    assert len(pool_scenes(pool_dir, ["open the door"], min_side=4)) == 11
    # the API refuses too, before any member is loaded or scored
    scenes = [Scene(p, "open the door") for p in sorted(pool_dir.iterdir())]
    with pytest.raises(CalibrationError, match=r"zz_tiny\.png: image is 4x4"):
        fit_pool_policy(tmp_path / "no-bundle-here", scenes)
    # the command says which file, and writes nothing
    init = ["policy", "init", str(bare_bundle), "--pool", str(pool_dir), "--request", "x"]
    rc = main(init)
    assert rc != 0 and "zz_tiny.png" in capsys.readouterr().err
    assert not (bare_bundle / "policy.yaml").exists()
    assert main([*init, "--min-image-side", "4"]) == 0


def test_the_pool_leaves_out_hidden_folders_and_files(pool_dir: Path) -> None:
    """`rglob` picked up a viewer's `.thumbnails/` and macOS `._frame.jpg` files as frames."""
    (pool_dir / ".thumbnails").mkdir()
    (pool_dir / ".thumbnails" / "frame000.png").write_bytes(_png(64, 64))
    (pool_dir / "._frame000.jpg").write_bytes(_png(64, 64))
    (pool_dir / "day2").mkdir()
    (pool_dir / "day2" / "frame100.png").write_bytes(_png(64, 64))
    got = [
        Path(str(s.image)).relative_to(pool_dir).as_posix() for s in pool_scenes(pool_dir, ["x"])
    ]
    assert len(got) == 11 and "day2/frame100.png" in got
    assert not any(part.startswith(".") for g in got for part in Path(g).parts)


def test_policy_init_reads_a_requests_file_saved_with_a_byte_order_mark(
    bare_bundle: Path, pool_dir: Path, tmp_path: Path
) -> None:
    """A requests file saved as "UTF-8 with BOM" gave its first request the mark: 4 more
    prompt tokens, and the tiny lfm member's score moved by two IQRs on the frames given that
    request, so the pool's reference statistics were fitted on requests the robot never sends.
    A line of invisible characters is no request (the guard refuses it)."""
    other = tmp_path / "other"
    shutil.copytree(bare_bundle, other)
    args = ["--request", "open the door", "--request", "pick up the knife"]
    assert main(["policy", "init", str(bare_bundle), "--pool", str(pool_dir), *args]) == 0
    requests = tmp_path / "requests.txt"
    requests.write_text("open the door\n\u200b\npick up the knife\n", encoding="utf-8-sig")
    rc = main(["policy", "init", str(other), "--pool", str(pool_dir), "--requests", str(requests)])
    assert rc == 0
    want = load_policy(bare_bundle / "policy.yaml").fusion.stats
    assert load_policy(other / "policy.yaml").fusion.stats == want
