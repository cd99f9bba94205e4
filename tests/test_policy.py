"""Threshold policies, the conformal cut, situation state and policy.yaml validation."""

from __future__ import annotations

import copy
import json
import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import scipy.stats
import yaml
from spotstop.guard._errors import ConfigError
from spotstop.guard._policy import (
    BatchPolicy,
    ConformalCut,
    ConformalPolicy,
    DecisionError,
    DirectPolicy,
    FrozenPolicy,
    NotFittedError,
    PolicyError,
    SituationPolicy,
    SituationState,
    Thresholds,
    check_policy_matches,
    conformal_min_n,
    conformal_rank,
    decide,
    decide_batch,
    dump_policy,
    load_policy,
)

# ---------------------------------------------------------------------- conformal


@pytest.mark.parametrize(
    "n, alpha, k",
    [(9, 0.1, 1), (19, 0.1, 2), (10, 0.2, 2), (4, 0.2, 1), (99, 0.05, 5), (99, 0.29, 29)],
)
def test_conformal_rank_by_hand(n: int, alpha: float, k: int) -> None:
    assert conformal_rank(alpha, n) == k
    scores = np.arange(n, 0, -1, dtype=float)  # descending, so fit must sort
    cut = ConformalCut(alpha).fit(scores)
    assert (cut.n_, cut.k_) == (n, k)
    assert cut.threshold_ == float(k)  # u(k) of 1..n
    pol = cut.to_policy()
    assert (pol.alpha, pol.n, pol.k, pol.threshold) == (alpha, n, k, float(k))


@pytest.mark.parametrize("alpha, n, need", [(0.1, 8, 9), (0.05, 10, 19), (0.3, 2, 3), (0.5, 0, 1)])
def test_conformal_refuses_too_few(alpha: float, n: int, need: int) -> None:
    assert conformal_min_n(alpha) == need
    assert conformal_rank(alpha, need) >= 1
    with pytest.raises(PolicyError, match=f"At least {need} unsafe|at least {need} unsafe"):
        ConformalCut(alpha).fit(np.linspace(0, 1, n))


def test_conformal_not_fitted_and_bad_alpha() -> None:
    cut = ConformalCut(0.1)
    for attr in ("threshold_", "k_", "n_"):
        with pytest.raises(NotFittedError, match="call fit"):
            getattr(cut, attr)
    with pytest.raises(AttributeError):  # NotFittedError is also an AttributeError
        _ = cut.threshold_
    with pytest.raises(PolicyError, match=r"ConformalCut.alpha must be in \(0, 1\); got 1.5"):
        ConformalCut(1.5).fit(np.arange(20.0))
    with pytest.raises(PolicyError, match="non-finite"):
        ConformalCut(0.1).fit([*range(20), math.nan])


def test_conformal_ties_flag_unsafe() -> None:
    cut = ConformalCut(0.1).fit(np.arange(1.0, 10.0))  # k = 1, u(1) = 1
    v = decide(cut.to_policy(), 1.0)
    assert v.label == "UNSAFE" and v.threshold == 1.0
    assert decide(cut.to_policy(), 0.999).label == "SAFE"


# 3 configurations; family-wise false-alarm 0.001, Bonferroni: 0.001 / 3 each.
_COVERAGE = [(19, 0.1), (49, 0.1), (30, 0.2)]


@pytest.mark.parametrize("n, alpha", _COVERAGE)
def test_conformal_empirical_coverage(n: int, alpha: float) -> None:
    """Over 2,000 exchangeable draws the miss rate is ≤ α + a binomial margin.

    The exact miss probability is k/(n+1) ≤ α. The number of misses in 2,000 draws is
    Binomial(2000, k/(n+1)); we allow up to its (1 − 0.001/3) quantile at rate α, a
    Bonferroni correction over the three configurations.
    """
    draws = 2000
    rng = np.random.default_rng(20260501 + n)
    misses = 0
    for _ in range(draws):
        loc = rng.normal()  # a new deployment per draw; exchangeable within a draw
        cal = rng.normal(loc, 1.0, size=n)
        new = rng.normal(loc, 1.0)
        cut = ConformalCut(alpha).fit(cal)
        misses += new < cut.threshold_
    limit = scipy.stats.binom.ppf(1 - 0.001 / len(_COVERAGE), draws, alpha)
    assert misses <= limit, (misses / draws, alpha)
    # and not trivially conservative: near the exact rate k/(n+1)
    p = conformal_rank(alpha, n) / (n + 1)
    low = scipy.stats.binom.ppf(0.001 / len(_COVERAGE), draws, p)
    assert misses >= low


# ---------------------------------------------------------------------- simple policies


def test_frozen_and_direct() -> None:
    v = decide_batch(FrozenPolicy(0.5), [0.4, 0.5, 0.6])
    assert [x.label for x in v] == ["SAFE", "UNSAFE", "UNSAFE"]
    assert all(x.threshold == 0.5 and x.policy == "frozen" for x in v)
    d = DirectPolicy("a")
    v = decide_batch(d, [9.0, -9.0, 0.0], {"a": np.array([-1.0, 1.0, 0.0])})
    assert [x.label for x in v] == ["SAFE", "UNSAFE", "UNSAFE"]  # fused ignored; tie → UNSAFE
    assert [x.score for x in v] == [-1.0, 1.0, 0.0]
    with pytest.raises(DecisionError, match="member 'a'"):
        decide_batch(d, [0.0], {"b": [0.0]})


def test_batch_threshold_is_the_batch_mean() -> None:
    s = np.array([-2.0, -1.0, 0.5, 3.0, 4.5])
    v = decide_batch(BatchPolicy(FrozenPolicy(0.0)), s)
    assert all(x.threshold == pytest.approx(s.mean()) for x in v)
    assert [x.label for x in v] == ["SAFE", "SAFE", "SAFE", "UNSAFE", "UNSAFE"]


def test_batch_nan_is_unsafe_and_left_out_of_the_mean() -> None:
    v = decide_batch(BatchPolicy(FrozenPolicy(0.0)), [1.0, math.nan, 3.0, -10.0])
    assert v[1].label == "UNSAFE" and "not finite" in v[1].detail
    assert v[0].threshold == pytest.approx((1.0 + 3.0 - 10.0) / 3)
    assert [x.label for x in v] == ["UNSAFE", "UNSAFE", "UNSAFE", "SAFE"]


def test_batch_smaller_than_min_batch_uses_fallback() -> None:
    pol = BatchPolicy(FrozenPolicy(2.0), min_batch=3)
    v = decide_batch(pol, [1.0, 3.0])
    assert [x.policy for x in v] == ["batch->frozen"] * 2
    assert [x.label for x in v] == ["SAFE", "UNSAFE"]
    assert "min_batch 3" in v[0].detail
    assert decide(BatchPolicy(FrozenPolicy(2.0)), 1.0).label == "SAFE"  # batch of one
    with pytest.raises(PolicyError, match="min_batch"):
        BatchPolicy(FrozenPolicy(0.0), min_batch=1)


class _NaNThreshold:
    kind: ClassVar[str] = "nan"

    def thresholds(
        self,
        fused: np.ndarray,
        member_scores: Mapping[str, np.ndarray],
        situation_ids: Sequence[str | None],
    ) -> Thresholds:
        n = fused.shape[0]
        return Thresholds(fused, np.full(n, np.nan), ("nan",) * n, ("test",) * n)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}


def test_nan_threshold_is_unsafe() -> None:
    v = decide_batch(_NaNThreshold(), [-100.0, 100.0])
    assert [x.label for x in v] == ["UNSAFE", "UNSAFE"]
    assert all("threshold is nan" in x.detail for x in v)


def test_decide_batch_checks_inputs() -> None:
    with pytest.raises(DecisionError, match="situation_ids"):
        decide_batch(FrozenPolicy(0.0), [0.0, 1.0], None, ["a"])
    with pytest.raises(DecisionError, match="1-D"):
        decide_batch(FrozenPolicy(0.0), [[0.0]])
    with pytest.raises(DecisionError, match="shape"):
        decide_batch(FrozenPolicy(0.0), [0.0], {"a": [1.0, 2.0]})


# ---------------------------------------------------------------------- situation


def _situation(path: Path | None = None, window: int = 3, min_refs: int = 2) -> SituationPolicy:
    state = SituationState(window, path, key="k1")
    return SituationPolicy(window, min_refs, FrozenPolicy(10.0), state=state)


def test_situation_fallback_then_window_mean() -> None:
    pol = _situation(window=3, min_refs=2)
    seq = [1.0, 2.0, 3.0, 4.0, 5.0]
    v = [decide(pol, s, situation_id="kitchen") for s in seq]
    # two fallbacks (0, then 1 reference), then the mean of the previous ≤ 3 scores
    assert [x.policy for x in v] == ["situation->frozen"] * 2 + ["situation"] * 3
    assert [x.threshold for x in v[:2]] == [10.0, 10.0]
    assert v[2].threshold == pytest.approx(1.5)
    assert v[3].threshold == pytest.approx(2.0)
    assert v[4].threshold == pytest.approx(3.0)  # window of 3: (2+3+4)/3
    assert pol.state.references("kitchen") == (3.0, 4.0, 5.0)
    # other situations and no situation are independent / fall back
    assert decide(pol, 0.0, situation_id="garage").policy == "situation->frozen"
    assert decide(pol, 0.0).detail.startswith("no situation id")


def test_situation_batch_in_order_and_nan_not_stored() -> None:
    pol = _situation(window=5, min_refs=1)
    v = decide_batch(pol, [1.0, math.nan, 3.0], situation_ids=["s", "s", "s"])
    assert v[0].policy == "situation->frozen"
    assert v[1].label == "UNSAFE" and v[1].threshold == 1.0
    assert v[2].threshold == 1.0  # NaN did not join the window
    assert pol.state.references("s") == (1.0, 3.0)


def test_situation_state_survives_restart(tmp_path: Path) -> None:
    path = tmp_path / "state" / "situations.json"
    rng = np.random.default_rng(3)
    scores = rng.normal(size=12)
    sids = ["a", "b", "c"] * 4
    first = _situation(path, window=3, min_refs=2)
    decide_batch(first, scores, situation_ids=sids)
    assert path.exists() and not list(path.parent.glob("*.tmp"))
    restarted = _situation(path, window=3, min_refs=2)
    assert restarted.state.snapshot() == first.state.snapshot()
    probe = rng.normal(size=3)
    v_first = decide_batch(first, probe, situation_ids=["a", "b", "c"])
    v_restarted = decide_batch(restarted, probe, situation_ids=["a", "b", "c"])
    assert [x.threshold for x in v_first] == [x.threshold for x in v_restarted]
    for x, sid in zip(v_restarted, ["a", "b", "c"], strict=True):
        assert x.threshold == pytest.approx(
            np.mean(scores[[i for i, s in enumerate(sids) if s == sid][-3:]])
        )


def test_situation_state_refuses_foreign_or_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    decide(_situation(path), 1.0, situation_id="a")
    with pytest.raises(PolicyError, match=r"written for key 'k1'.*'other'"):
        SituationState(3, path, key="other")
    path.write_text("{not json")
    with pytest.raises(PolicyError, match="Delete it"):
        SituationState(3, path, key="k1")
    doc = {"schema_version": 1, "key": "k1", "window": 5, "situations": {"a": [1, 2, 3, 4]}}
    path.write_text(json.dumps(doc))
    assert SituationState(2, path, key="k1").references("a") == (3.0, 4.0)  # keeps latest


def test_situation_thread_safety_smoke(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    pol = _situation(path, window=4, min_refs=3)
    verdicts: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(25):
                v = decide(pol, float(rng.normal()), situation_id="shared")
                with lock:
                    verdicts.append(v.policy)
        except BaseException as e:  # collected and re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(verdicts) == 200
    # read-then-append is atomic: exactly min_refs scenes saw too few references
    assert verdicts.count("situation->frozen") == 3
    assert len(pol.state.references("shared")) == 4
    assert json.loads(path.read_text())["situations"]["shared"] == list(
        pol.state.references("shared")
    )


# ---------------------------------------------------------------------- policy.yaml


def _doc(policy: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "version": 1,
        "bundle_id": "tiny-pair-0001",
        "prompt_hash": "sha256:abc123",
        "created": "2026-05-01T12:00:00+00:00",
        "fusion": {
            "method": "avg2",
            "members": ["qwen", "lfm"],
            "stats": {"qwen": {"median": -1.0, "iqr": 2.0}, "lfm": {"median": 0.5, "iqr": 1.0}},
            "weights": {"qwen": 1.0, "lfm": 1.0},
        },
        "policy": policy or {"kind": "frozen", "threshold": 0.25},
        "fitted_on": {"dataset": "dev-pool", "n": 400},
    }


_KINDS = [
    {"kind": "direct", "member": "lfm"},
    {"kind": "frozen", "threshold": 0.25},
    {"kind": "conformal", "alpha": 0.1, "n": 19, "k": 2, "threshold": -0.3},
    {"kind": "batch", "min_batch": 4, "fallback": {"kind": "frozen", "threshold": 0.0}},
    {
        "kind": "situation",
        "window": 6,
        "min_refs": 3,
        "state_file": "situations.json",
        "fallback": {"kind": "conformal", "alpha": 0.1, "n": 9, "k": 1, "threshold": 0.0},
    },
]


@pytest.mark.parametrize("policy", _KINDS, ids=[p["kind"] for p in _KINDS])
def test_load_dump_round_trip(tmp_path: Path, policy: dict[str, Any]) -> None:
    src = tmp_path / "policy.yaml"
    src.write_text(yaml.safe_dump(_doc(policy), sort_keys=False))
    cfg = load_policy(src)
    assert cfg.policy.to_dict() == policy
    out = tmp_path / "out" / "policy.yaml"
    dump_policy(cfg, out)
    assert yaml.safe_load(out.read_text()) == _doc(policy)
    again = load_policy(out)
    assert again.to_dict() == cfg.to_dict()
    if isinstance(cfg.policy, SituationPolicy):
        assert cfg.policy.state.path == tmp_path / "situations.json"
        override = load_policy(src, state_file=tmp_path / "elsewhere.json")
        assert isinstance(override.policy, SituationPolicy)
        assert override.policy.state.path == tmp_path / "elsewhere.json"


def test_check_policy_matches() -> None:
    cfg = load_policy(_doc())
    check_policy_matches(cfg, "tiny-pair-0001", "sha256:abc123")
    with pytest.raises(PolicyError, match=r"'tiny-pair-0001'.*'other-bundle'"):
        check_policy_matches(cfg, "other-bundle", "sha256:abc123")
    with pytest.raises(PolicyError, match=r"'sha256:abc123'.*'sha256:fff'"):
        check_policy_matches(cfg, "tiny-pair-0001", "sha256:fff")


def _with(path: str, value: Any) -> dict[str, Any]:
    """_doc() with the value at a dotted path set (or removed when value is _DROP)."""
    d = copy.deepcopy(_doc())
    *parents, last = path.split(".")
    node: Any = d
    for p in parents:
        node = node[p]
    if value is _DROP:
        del node[last]
    else:
        node[last] = value
    return d


_DROP = object()
_SIT = {
    "kind": "situation",
    "window": 3,
    "min_refs": 2,
    "fallback": {"kind": "frozen", "threshold": 0},
}

# (bad document, text the message must contain: the key path and what is wrong)
_BAD: list[tuple[dict[str, Any], str]] = [
    (_with("version", 2), "version must be 1; got 2"),
    (_with("version", _DROP), "version is required"),
    (_with("bundle_id", ""), "bundle_id must be a non-empty string"),
    (_with("prompt_hash", 7), "prompt_hash must be a non-empty string; got 7"),
    (_with("created", "yesterday"), "created must be an ISO 8601 time"),
    (_with("created", "2026-05-01T12:00:00"), "created must be an ISO 8601 time with a UTC offset"),
    (_with("fitted_on", [1]), "fitted_on must be a mapping"),
    (_with("polcy", {}), "polcy is not a known key. Did you mean 'policy'?"),
    (_with("fusion.members", []), "fusion.members must be a non-empty list"),
    (_with("fusion.members", ["qwen", "qwen"]), "fusion.members must not repeat"),
    (_with("fusion.method", "avg3"), "fusion.method must be 'avg2'; got 'avg3'"),
    (_with("fusion.stats.qwen.iqr", 0), "fusion.stats.qwen.iqr must be a finite number > 0; got 0"),
    (_with("fusion.stats.lfm.median", math.nan), "fusion.stats.lfm.median must be a finite"),
    (_with("fusion.stats.lfm", {"median": 0.0}), "fusion.stats.lfm.iqr is required"),
    (
        _with("fusion.stats.qwen.iqrr", 1.0),
        "fusion.stats.qwen.iqrr is not a known key. Did you mean 'iqr'?",
    ),
    (_with("fusion.weights.lfm", -1.0), "fusion.weights.lfm must be a finite number > 0"),
    (_with("fusion.weights", {"qwen": 1.0}), "fusion.weights.lfm is required"),
    (
        _with("policy", {"kind": "situaton"}),
        "policy.kind must name a policy kind, one of batch, conformal, direct, frozen, situation; got 'situaton'. Did you mean 'situation'?",
    ),
    (_with("policy", {"kind": "frozen"}), "policy.threshold is required"),
    (
        _with("policy", {"kind": "frozen", "threshold": math.inf}),
        "policy.threshold must be a finite number",
    ),
    (
        _with("policy", {"kind": "frozen", "threshold": 0, "treshold": 1}),
        "policy.treshold is not a known key. Did you mean 'threshold'?",
    ),
    (
        _with("policy", {"kind": "direct", "member": "qwne"}),
        "policy.member must be one of the fusion members ['qwen', 'lfm']; got 'qwne'. Did you mean 'qwen'?",
    ),
    (
        _with("policy", {"kind": "conformal", "alpha": 1.5, "n": 19, "k": 2, "threshold": 0}),
        "policy.alpha must be in (0, 1); got 1.5",
    ),
    (
        _with("policy", {"kind": "conformal", "alpha": 0.1, "n": 5, "k": 0, "threshold": 0}),
        "policy.n: 5 unsafe calibration case(s) are too few",
    ),
    (
        _with("policy", {"kind": "conformal", "alpha": 0.1, "n": 19, "k": 3, "threshold": 0}),
        "policy.k must be floor(alpha*(n+1)) = 2",
    ),
    (
        _with("policy", {"kind": "conformal", "alpha": 0.1, "n": 19.0, "k": 2, "threshold": 0}),
        "policy.n must be an integer ≥ 1; got 19.0",
    ),
    (
        _with(
            "policy",
            {"kind": "batch", "fallback": {"kind": "frozen", "threshold": 0}, "min_batch": 1},
        ),
        "policy.min_batch must be an integer ≥ 2; got 1",
    ),
    (_with("policy", {"kind": "batch"}), "policy.fallback is required"),
    (
        _with("policy", {"kind": "batch", "fallback": {"kind": "batch", "fallback": {}}}),
        "policy.fallback.kind must name a fallback kind, one of conformal, direct, frozen; got 'batch'",
    ),
    (_with("policy", {**_SIT, "window": 0}), "policy.window must be an integer ≥ 1; got 0"),
    (
        _with("policy", {**_SIT, "min_refs": 4}),
        "policy.min_refs must be an integer in [1, 3]; got 4",
    ),
    (_with("policy", {**_SIT, "window": True}), "policy.window must be an integer ≥ 1; got True"),
    (_with("policy", {**_SIT, "state_file": 3}), "policy.state_file must be a file path"),
    (
        _with("policy", {**_SIT, "fallback": {"kind": "frozen", "threshold": "x"}}),
        "policy.fallback.threshold must be a finite number; got 'x'",
    ),
    (
        _with("policy", {**_SIT, "fallback": {"kind": "direct", "member": "x"}}),
        "policy.fallback.member must be one of the fusion members",
    ),
    (
        _with("policy", {**_SIT, "windows": 3}),
        "policy.windows is not a known key. Did you mean 'window'?",
    ),
]


def test_every_validation_message_names_the_key() -> None:
    for doc, expected in _BAD:
        with pytest.raises(PolicyError) as info:
            load_policy(doc, where="policy.yaml")
        msg = str(info.value)
        assert expected in msg, (expected, msg)
        assert "policy.yaml" in msg, msg  # says where to fix it
        assert isinstance(info.value, ConfigError | ValueError)


def test_yaml_file_errors(tmp_path: Path) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text("version: 1\nversion: 1\n")
    with pytest.raises(PolicyError, match="duplicate key 'version' at line 2"):
        load_policy(p)
    p.write_text("version: [1\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(p)
    p.write_text("- a list\n")
    with pytest.raises(PolicyError, match="must be a mapping"):
        load_policy(p)
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "missing.yaml")


def test_conformal_policy_constructor_agrees_with_cut() -> None:
    with pytest.raises(PolicyError, match="k must be floor"):
        ConformalPolicy(alpha=0.1, n=19, k=1, threshold=0.0)
    with pytest.raises(PolicyError, match="At least 9"):
        ConformalPolicy(alpha=0.1, n=5, k=0, threshold=0.0)
