"""Bad input through the Python API: a clear error or a fail-closed scene, and nothing else
changes (no situation window moves, no row is lost, the guard restarts). Each case was a
reproduced fault: an empty situation id that made the state file unreadable, a caller-built
DecodedImage that crashed a batch after its windows had moved, a deadline that overflowed,
a close() that lost an answered decision, a policy provenance NaN that stopped the log."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from spotstop.guard import Guard, GuardError, ImageError, PolicyError, Scene, load_policy
from spotstop.guard._call import MAX_DEADLINE_S, check_deadline
from spotstop.guard._image import decode_image
from spotstop.guard._pipeline import Pipeline
from spotstop.guard.policies import PolicyConfig
from spotstop.guard.validate import is_blank, situation_id_problem

from tests._support.guard import SignReader, make_scene, set_frozen
from tests._support.images import make_image_bytes


def _rows(g: Guard) -> list:
    g.flush_pending()
    return list(g.log.records())


@pytest.mark.parametrize(
    ("sid", "why"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("kitchen\n", "holds control characters"),
        (12345, "must be text or None; got int"),
        (b"kitchen", "must be text or None; got bytes"),
        ("hall\ud800", "is not valid Unicode text: it holds the lone surrogate"),
        ("k" * 4097, "has 4097 characters, more than 4096"),
    ],
)
def test_a_bad_situation_id_fails_its_scene_and_moves_no_window(
    bundle_copy: Path, tmp_path: Path, sid: object, why: str
) -> None:
    """The scene is answered fail-closed and logged; the good scene beside it is judged; no
    window takes the bad id; the guard starts again from its state file."""
    state = tmp_path / "state"
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=state) as g:
        bad, good = g.check_batch([make_scene(0, sit=sid), make_scene(1, sit="kitchen")])  # type: ignore[arg-type]
        assert bad.label == "UNSAFE" and bad.fail_closed
        assert f"situation_id {why}" in (bad.fail_reason or ""), bad.fail_reason
        assert not good.fail_closed and good.situation_id == "kitchen"
        windows = g._active.store.state.situations  # type: ignore[attr-defined]
        assert set(windows) == {"kitchen"} and len(windows["kitchen"]) == 1
        assert len(_rows(g)) == 2
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=state) as g2:  # restarts
        assert len(g2.situation("kitchen").references) == 1


def test_the_situation_id_rule_by_hand() -> None:
    assert situation_id_problem(None) is None and situation_id_problem("room 3 / shelf") is None
    assert situation_id_problem("küche") is None  # any printable text
    for sid in ("", "\t", "a\x00b", "a\x7fb", 1.5, ["a"], "a\udc80", "x" * 4097):
        assert situation_id_problem(sid) is not None, sid
    assert situation_id_problem("x" * 4096) is None


def test_a_request_with_no_visible_character_fails_closed_like_an_empty_one(
    bundle_copy: Path, tmp_path: Path
) -> None:
    """A request of NULs, zero-width characters, bidi marks or a lone byte-order mark (an
    empty UTF-8 file read with its BOM) says nothing, as "" does: it was judged SAFE."""
    set_frozen(bundle_copy, 1e9)  # every scene that is scored is SAFE
    blank = ["\x00", "\ufeff", "\u200b\u200c\u200d", "\u202e \u2066", "\t\x00\u2060"]
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        got = g.check_batch([Scene(make_scene(0).image, r) for r in [*blank, "open the door"]])
        for r, d in zip(blank, got, strict=False):
            assert d.label == "UNSAFE" and d.fail_closed, r
            assert "request is empty" in (d.fail_reason or ""), d.fail_reason
        assert got[-1].label == "SAFE"  # a request with visible text beside them is judged
        assert [row.request for row in _rows(g)] == [*blank, "open the door"]  # as given
    assert not is_blank("\u200bopen\x00 the door") and is_blank("") and is_blank("\ufeff ")


def test_a_scene_of_the_wrong_types_is_shown_and_failed_closed_by_name(
    bundle_copy: Path, tmp_path: Path
) -> None:
    """repr() of a Scene holding a numpy frame, a PIL image or a request that is not text
    raised TypeError (os.fspath, len): a robot logging the scene it is about to check
    crashed before the guard could fail it closed and say why."""
    import numpy as np
    from PIL import Image

    frame = np.zeros((48, 64, 3), dtype=np.uint8)
    scenes = [
        Scene(frame, "open the door"),  # type: ignore[arg-type]
        Scene(Image.fromarray(frame), "open the door"),  # type: ignore[arg-type]
        Scene(make_scene(0).image, None),  # type: ignore[arg-type]
    ]
    shown = [repr(s) for s in scenes]
    assert shown[0] == "Scene(image=<ndarray>, request='open the door')"
    assert shown[1] == "Scene(image=<Image>, request='open the door')"
    assert shown[2].endswith("bytes>, request=None)")
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        got = g.check_batch(scenes)
    for d, why in zip(got, ["got ndarray", "got Image", "request must be a string"], strict=True):
        assert d.label == "UNSAFE" and d.fail_closed and why in (d.fail_reason or ""), d


def test_a_decoded_image_with_a_bad_field_is_refused_where_it_is_made() -> None:
    good = decode_image(make_image_bytes(1, fmt="JPEG"))
    for field, value in (
        ("width", float(good.width)),
        ("height", good.height + 1),  # not the image's size ("width, height")
        ("n_bytes", -1),
        ("sha256", "abc"),
        ("format", "GIF"),
        ("jpeg_quality", 0),
        ("image", b"pixels"),
    ):
        with pytest.raises(ImageError, match=rf"DecodedImage\.(\w+, )?{field}"):
            dataclasses.replace(good, **{field: value})


def test_a_row_the_log_refuses_fails_its_scene_and_keeps_the_batch(
    bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A field that cannot become a record (injected: the full row of scene 0 raises) gives
    that scene a bare fail-closed row; the batch is answered and both rows are logged."""
    real = Pipeline.record
    first = {}

    def refuse_one(self, w, o, active, batch_id, *, bare=False):  # type: ignore[no-untyped-def]
        first.setdefault("id", w.decision_id)
        if w.decision_id == first["id"] and not bare:
            raise ValueError("injected: a field the log refuses")
        return real(self, w, o, active, batch_id, bare=bare)

    monkeypatch.setattr(Pipeline, "record", refuse_one)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=tmp_path / "s") as g:
        a, b = g.check_batch([make_scene(0, sit="k"), make_scene(1, sit="k")])
        assert a.fail_closed and a.label == "UNSAFE"
        assert "record: ValueError: injected" in (a.fail_reason or ""), a.fail_reason
        assert math.isnan(a.fused_score) and not b.fail_closed
        rows = {r.decision_id: r for r in _rows(g)}
        assert set(rows) == {a.decision_id, b.decision_id}
        assert rows[a.decision_id].fail_closed and rows[a.decision_id].image_sha256 is None


def test_a_cue_text_the_log_cannot_encode_is_stored_escaped(
    bundle_copy: Path, tmp_path: Path
) -> None:
    """Text read in the scene holding a lone surrogate (half an emoji; not UTF-8) is logged
    escaped, and the decisions after it are logged too."""
    set_frozen(bundle_copy, 0.0)
    doc = yaml.safe_load((bundle_copy / "policy.yaml").read_text())
    doc["text_in_scene"] = {"detect": True}
    (bundle_copy / "policy.yaml").write_text(yaml.safe_dump(doc))
    signed = make_image_bytes(1, fmt="JPEG")
    sign = SignReader({hashlib.sha256(signed).hexdigest(): "EXIT \ud83d"})
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", text_detector=sign) as g:
        first = g.check(Scene(signed, "pick up the knife"))
        second = g.check(make_scene(2))
        rows = {r.decision_id: r for r in _rows(g)}
    assert set(rows) == {first.decision_id, second.decision_id}
    assert rows[first.decision_id].cue_text == "EXIT \\ud83d"


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, MAX_DEADLINE_S * 2, 1e300, True, "5"])
def test_a_deadline_is_seconds_in_range(bundle_copy: Path, tmp_path: Path, bad: object) -> None:
    with pytest.raises(GuardError, match=r"deadline_s must be a number of seconds in \(0, 3600\]"):
        check_deadline(bad)
    with pytest.raises(GuardError, match="deadline_s"):
        Guard(bundle_copy, log=tmp_path / "l.sqlite", deadline_s=bad)  # type: ignore[arg-type]
    with Guard(bundle_copy, log=tmp_path / "m.sqlite") as g:
        with pytest.raises(GuardError, match="deadline_s"):
            g.check(make_scene(), deadline_s=bad)  # type: ignore[arg-type]
        assert g.log.count() == 0  # refused before anything was judged
        assert not g.check(make_scene(), deadline_s=MAX_DEADLINE_S).fail_closed


def test_check_batch_takes_any_iterable_and_refuses_a_lone_scene(
    bundle_copy: Path, tmp_path: Path
) -> None:
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        out = g.check_batch(make_scene(i) for i in range(2))  # type: ignore[arg-type]
        assert len(out) == 2 and all(not d.fail_closed for d in out)
        with pytest.raises(GuardError, match=r"scenes must be a list of Scene.*check\(scene\)"):
            g.check_batch(make_scene(3))  # type: ignore[arg-type]


def test_close_waits_for_a_call_answering_without_the_lock(
    bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Call A holds the guard; call B times out waiting for it and answers fail-closed
    without the lock, slowly (injected); close() during that must not lose B's row."""
    real_score, real_records = Pipeline.score, Pipeline.records

    def slow_score(self, *a, **k):  # type: ignore[no-untyped-def]
        time.sleep(1.0)
        return real_score(self, *a, **k)

    def slow_records(self, works, *a, **k):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "B":
            time.sleep(1.5)  # B is descheduled before it commits
        return real_records(self, works, *a, **k)

    g = Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=tmp_path / "s")
    monkeypatch.setattr(Pipeline, "score", slow_score)
    monkeypatch.setattr(Pipeline, "records", slow_records)
    res: dict = {}
    a = threading.Thread(target=lambda: res.__setitem__("A", g.check(make_scene(0))), name="A")
    b = threading.Thread(
        target=lambda: res.__setitem__("B", g.check(make_scene(1), deadline_s=0.2)), name="B"
    )
    a.start()
    time.sleep(0.1)
    b.start()
    time.sleep(0.4)
    g.close()
    a.join()
    b.join()
    assert res["B"].fail_closed and "waiting for another call" in (res["B"].fail_reason or "")
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=tmp_path / "s") as g2:
        ids = {r.decision_id for r in _rows(g2)}
    assert {res["A"].decision_id, res["B"].decision_id} <= ids


def test_a_call_waiting_when_the_guard_closes_is_refused_not_judged(
    bundle_copy: Path, tmp_path: Path
) -> None:
    """A call (no deadline) that gets the guard only after close() is refused, not judged
    on closing parts; close() waits for it. Its lock is made to wait for close (injected)."""
    g = Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=tmp_path / "s")
    real = g._lock

    class LateForB:
        def acquire(self, timeout: float = -1) -> bool:
            if threading.current_thread().name == "B":
                while not g._closed:
                    time.sleep(0.01)
            return real.acquire(timeout=timeout)

        def release(self) -> None:
            real.release()

        def __enter__(self) -> None:
            real.acquire()

        def __exit__(self, *exc: object) -> None:
            real.release()

    g._lock = LateForB()  # type: ignore[assignment]
    res: dict = {}

    def second() -> None:
        try:
            res["B"] = g.check(make_scene(1))
        except GuardError as e:
            res["B"] = e

    b = threading.Thread(target=second, name="B")
    b.start()
    time.sleep(0.2)  # B has entered the call and waits for the lock
    g.close()
    b.join()
    assert isinstance(res["B"], GuardError) and "closed while the call waited" in str(res["B"])
    with pytest.raises(GuardError, match="closed"):
        g.check(make_scene(2))


def test_a_policy_whose_provenance_holds_nan_is_refused(bundle_copy: Path) -> None:
    """The log keeps the policy as JSON: a NaN in fitted_on would keep every row out of it."""
    path = bundle_copy / "policy.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["fitted_on"]["auroc"] = float("nan")
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(PolicyError, match=r"fitted_on\.auroc is nan.*Write null"):
        load_policy(path)
    doc["fitted_on"]["auroc"] = {"by_room": [0.5, float("inf")]}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(PolicyError, match=r"fitted_on\.auroc\.by_room\[1\] is inf"):
        load_policy(path)
    good = yaml.safe_load(path.read_text())
    good["fitted_on"] = {"auroc": None}
    path.write_text(yaml.safe_dump(good))
    loaded = load_policy(path)
    with pytest.raises(PolicyError, match=r"fitted_on\.n is nan"):
        PolicyConfig(
            bundle_id=loaded.bundle_id,
            prompt_hash=loaded.prompt_hash,
            fusion=loaded.fusion,
            policy=loaded.policy,
            fitted_on={"n": math.nan},
            created=datetime.now(UTC),
        )


def test_a_reload_of_the_same_policy_keeps_the_windows_of_a_call_in_flight(
    bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reload_policy() while a call is deciding (injected delay): the call's score stays in
    the live windows and the state file, as replaying the log gives them."""
    g = Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=tmp_path / "s", deadline_s=None)
    for i in range(3):
        g.check(make_scene(i, sit="kitchen"))
    real = Pipeline.decide
    started = threading.Event()

    def slow_decide(self, works, active, clock):  # type: ignore[no-untyped-def]
        started.set()
        time.sleep(0.5)
        return real(self, works, active, clock)

    monkeypatch.setattr(Pipeline, "decide", slow_decide)
    t = threading.Thread(target=lambda: g.check(make_scene(10, sit="kitchen")))
    t.start()
    started.wait()
    g.reload_policy()  # the same file: the same version
    t.join()
    monkeypatch.setattr(Pipeline, "decide", real)
    assert len(g.situation("kitchen").references) == 4
    g.close()
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=tmp_path / "s") as g2:
        assert len(g2.situation("kitchen").references) == 4  # the state file has it too
