"""The first policy of a bundle, fitted on an unlabelled pool of scenes.

A freshly exported bundle has no ``policy.yaml`` and a guard cannot run without one, so the
decision log that ``recalibrate`` needs cannot exist yet. This closes that loop: score an
unlabelled pool of the deployment's own camera frames (no labels needed) with the bundle's
members, fit the frozen reference statistics (median/IQR per member) and the frozen cut t₀
(seed 000, Supp. Algorithm 1), and write the result as a policy version.

The pool is the frames the guard would score: each is checked with the guard's own image check
(:func:`~spotstop.guard.decode_image` with the guard's ``min_image_side`` and
``min_image_contrast``) before anything is scored, and a pool that holds a frame the guard
refuses (a thumbnail, a corrupt file, a frame that shows nothing) is
refused, naming every such file: fitted on frames the guard never scores, the reference
statistics would set the scale on other inputs. Files in hidden folders (``.thumbnails``) or
hidden themselves (``._frame.jpg``) are not frames of the pool.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.calibrate._frozen import fit_frozen
from spotstop.calibrate._logdata import CalibrationError
from spotstop.calibrate._recalibrate import check_kind_settings, situation_prior_record
from spotstop.guard import DecodedImage, ImageRefused, Scene, load_bundle, load_bundle_member
from spotstop.guard._image import (
    DEFAULT_MIN_CONTRAST,
    DEFAULT_MIN_SIDE,
    check_min_contrast,
    check_min_side,
    check_visible_content,
    decode_image,
)
from spotstop.guard.policies import (
    PolicyConfig,
    PolicyError,
    TextInScene,
    load_policy,
    policy_class,
    policy_kinds,
)
from spotstop.guard.validate import is_blank

__all__ = ["IMAGE_SUFFIXES", "check_pool_images", "fit_pool_policy", "pool_scenes"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


#: how many refused files a message names one by one (the rest are counted)
_NAMED = 20


def check_pool_images(
    scenes: Sequence[Scene],
    *,
    min_side: int = DEFAULT_MIN_SIDE,
    min_contrast: float = DEFAULT_MIN_CONTRAST,
) -> None:
    """Refuse a pool that holds an image the guard refuses (its own check: decode, format,
    size limits, ``min_side``, ``min_contrast``), naming each such file and why; nothing is
    scored before."""
    min_contrast = check_min_contrast(min_contrast)
    bad: list[str] = []
    for i, s in enumerate(scenes):
        img = s.image
        try:
            if img is None:
                raise ImageRefused("the scene has no image", kind="empty")
            if isinstance(img, DecodedImage):
                check_min_side(img.width, img.height, min_side)
                check_visible_content(img, min_contrast)
            else:
                decode_image(img, min_side=min_side, min_contrast=min_contrast)
        except ImageRefused as e:
            name = os.fspath(img) if isinstance(img, str | os.PathLike) else f"scene {i}"
            bad.append(f"{name}: {e}")
    if bad:
        shown = "\n  ".join(bad[:_NAMED])
        more = f"\n  ... and {len(bad) - _NAMED} more" if len(bad) > _NAMED else ""
        raise CalibrationError(
            f"{len(bad)} of the {len(scenes)} pool images would be refused by the guard "
            f"(min_image_side {min_side}, min_image_contrast {min_contrast:g}); a pool must be "
            "frames the guard scores. Remove or "
            f"replace them:\n  {shown}{more}"
        )


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def pool_scenes(
    images: str | os.PathLike[str],
    requests: Sequence[str],
    *,
    min_n: int = 8,
    min_side: int = DEFAULT_MIN_SIDE,
    min_contrast: float = DEFAULT_MIN_CONTRAST,
) -> list[Scene]:
    """Scenes from every image under ``images`` (sorted; hidden files and folders left out),
    requests assigned in turn; every image checked as the guard checks it
    (:func:`check_pool_images`, ``min_side`` and ``min_contrast`` the guard's
    ``min_image_side`` and ``min_image_contrast``)."""
    root = Path(images)
    if not root.is_dir():
        raise CalibrationError(f"pool folder {root} does not exist or is not a folder.")
    files = sorted(
        p
        for p in root.rglob("*")
        if p.suffix.lower() in IMAGE_SUFFIXES and not _hidden(p, root) and p.is_file()
    )
    if len(files) < min_n:
        raise CalibrationError(
            f"the pool {root} holds {len(files)} JPEG/PNG/WebP images; at least {min_n} are "
            "needed (more is better: a few hundred frames of the deployment)."
        )
    reqs = [r for r in (x.strip() for x in requests) if not is_blank(r)]  # the guard's rule
    if not reqs:
        raise CalibrationError("no request text for the pool; pass --request or --requests FILE.")
    scenes = [Scene(f, reqs[i % len(reqs)]) for i, f in enumerate(files)]
    check_pool_images(scenes, min_side=min_side, min_contrast=min_contrast)
    return scenes


def fit_pool_policy(
    bundle_dir: str | os.PathLike[str],
    scenes: Sequence[Scene],
    *,
    kind: str = "frozen",
    settings: Mapping[str, Any] | None = None,
    device: str = "cpu",
    progress: bool = False,
    min_side: int = DEFAULT_MIN_SIDE,
    min_contrast: float = DEFAULT_MIN_CONTRAST,
) -> PolicyConfig:
    """Score ``scenes`` with the bundle's members and fit a label-free policy on them.

    kind: any registered kind fitted without labels (``policy_kinds(label_free=True)``: e.g.
    ``frozen``, ``situation``, ``batch``); its fallback is the frozen cut t0.
    settings: the kind's settings by name (``window``, ``min_refs``, ``min_batch``,
    ``weights``, ``member``); absent ones take the kind's defaults.
    ``text_in_scene`` is the policy in force's (an operator's setting, not fitted).
    Scenes that fail to decode or score are an error (the pool must be clean: it sets the
    scale every later scene is judged on): an image the guard would refuse (``min_side``,
    ``min_contrast``: the guard's ``min_image_side``, ``min_image_contrast``) is refused
    before anything is scored, naming its file.
    """
    allowed = policy_kinds(label_free=True)
    if kind not in allowed:
        raise CalibrationError(
            f"an unlabelled pool fits the kinds {', '.join(allowed)}; got {kind!r}. Kinds that "
            "need labelled cases (conformal) are fitted from the log: use `spotstop recalibrate`."
        )
    inner = (settings or {}).get("cut")  # a cascade's cut: it, too, must fit without labels
    if isinstance(inner, str) and inner in policy_kinds() and inner not in allowed:
        raise CalibrationError(
            f"an unlabelled pool cannot fit the {kind}'s cut {inner!r}: it needs labelled "
            f"cases. Fit it from the log: `spotstop recalibrate LOG --policy {kind} --cut "
            f"{inner}`, or choose a cut fitted without labels "
            f"({', '.join(k for k in ('frozen', 'situation') if k in allowed)})."
        )
    check_kind_settings(settings)  # before the pool is scored
    # each bad frame named, before scoring
    check_pool_images(scenes, min_side=min_side, min_contrast=min_contrast)
    cls = policy_class(kind)
    bundle = load_bundle(bundle_dir)
    in_scene = _text_in_scene_in_force(bundle.policy_path)  # before the pool is scored
    scores: dict[str, Any] = {}
    members: Any = bundle.members
    if progress:
        from tqdm import tqdm

        members = tqdm(members, desc="scoring the pool", unit="member")
    tokens = []
    for bm in members:
        m = load_bundle_member(bundle, bm, device=device)
        tokens.append(m.geometry.n_image_tokens)
        scores[bm.name] = np.array([r.score for r in m.score(list(scenes))])
    fit = fit_frozen(scores)
    ctx = fit.context(scores, situation_id=[s.situation_id for s in scenes], settings=settings)
    policy = cls.fit(ctx)
    return PolicyConfig(
        bundle_id=bundle.bundle_id,
        prompt_hash=bundle.prompt_hash,
        fusion=fit.fusion,
        policy=policy,
        fitted_on={
            "what": "unlabelled pool (frozen reference statistics and cut t0)",
            "n": fit.n,
            "frozen_t0": fit.policy.threshold,
            # each member's visual-token budget (also part of the bundle id the policy is for)
            "visual_tokens": {
                bm.name: int(n) for bm, n in zip(bundle.members, tokens, strict=True)
            },
            "situation_prior": situation_prior_record(policy, ctx),
            "tool": f"spotstop {version('spotstop')} policy init",
        },
        created=datetime.now(UTC),
        state_seed=policy.seed_from_fit(ctx) if policy.stateful else None,
        text_in_scene=in_scene,
    )


def _text_in_scene_in_force(path: Path) -> TextInScene:
    """The policy in force's ``text_in_scene`` (an operator's setting, not fitted: a new
    policy keeps reading the scene as the one it replaces), or the default without one."""
    if not path.is_file():
        return TextInScene()
    try:
        return load_policy(path).text_in_scene
    except PolicyError as e:
        raise CalibrationError(
            f"the policy in force cannot be read ({e}), so its text_in_scene setting cannot be "
            f"carried over to the new policy. Fix {path}, or move it away if the new policy "
            "should start without one, then run `spotstop policy init` again."
        ) from e
