"""Writing a bundle from Hugging Face member folders (torch backend for now).

The bundle holds copies of the members, each member's chat template rendered once with
its slots (so the robot needs no jinja/transformers to build prompts), the image grid, the
answers, and the sha256 of every file. ``policy.yaml`` is written separately (it is keyed to
the bundle id and prompt hash printed here, and replaced by recalibration).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotstop.guard import ScoringConfig
from spotstop.guard._bundle import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    bundle_content_id,
    pair_prompt_hash,
    sha256_file,
)
from spotstop.guard._files import atomic_write_text
from spotstop.guard._hf import describe_test_pair, render_template, resolve_member
from spotstop.guard._member import check_budget_keys, member_visual_tokens, resolve_image_size
from spotstop.guard._prompt import prompt_hash
from spotstop.guard.validate import dump_yaml

__all__ = ["write_bundle"]

_SKIP = {".git", "__pycache__"}


def _copy_member(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n in _SKIP])


def write_bundle(
    members: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    config: ScoringConfig | None = None,
    name: str = "bundle",
    copy_members: bool = True,
    visual_tokens: Mapping[str, int] | None = None,
) -> Path:
    """Write ``out/manifest.yaml`` (and member copies); returns the bundle folder.

    ``visual_tokens``: each member's visual-token budget, keyed by member name, model_type or
    its start (``{"qwen": 256, "lfm": 64}``; ``"*"``: every member); a member without one
    keeps its configured grid, else its architecture's default budget. The manifest records
    each member's ``visual_tokens`` beside its ``image_size``, and both enter the bundle id.
    """
    cfg = config or ScoringConfig()
    root = Path(out)
    folders = [resolve_member(src) for src in members]
    named = [(f.path.name, f.model_type) for f in folders]
    check_budget_keys(visual_tokens, named)
    check_budget_keys(cfg.visual_tokens, named)
    root.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    hashes: dict[str, str] = {}
    test_pair = False
    for folder in folders:
        mname = folder.path.name
        if mname in hashes:
            raise ValueError(f"two members are named {mname!r}; member folder names must differ.")
        budget = member_visual_tokens(visual_tokens, mname, folder.model_type)
        size = resolve_image_size(folder, cfg, mname, visual_tokens=budget)
        g = folder.arch.geometry(folder.config, folder.preprocessor, size)
        template = render_template(folder, cfg.prompt)
        ph = prompt_hash(cfg.prompt, template, folder.model_type)
        hashes[mname] = ph
        test_pair = test_pair or folder.test_pair
        if copy_members:
            _copy_member(folder.path, root / "members" / mname)
            where = f"members/{mname}"
        else:
            where = str(folder.path.resolve())
        entries.append(
            {
                "name": mname,
                "path": where,
                "source": folder.source,
                "revision": folder.revision,
                "model_type": folder.model_type,
                "backend": "torch",
                "image_size": [g.height, g.width],
                "visual_tokens": g.n_image_tokens,
                "n_image_tokens": g.n_image_tokens,
                "prompt_hash": ph,
                "template": {
                    "with_image": template.with_image,
                    "without_image": template.without_image,
                },
                "test_pair": folder.test_pair,
                **({"test_pair_kind": folder.test_pair_kind} if folder.test_pair_kind else {}),
            }
        )
    files = {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("manifest.yaml", "policy.yaml") and "members" in p.parts
    }
    _write_manifest(root, entries, hashes, files, cfg, name=name, test_pair=test_pair)
    return root


def _write_manifest(
    root: Path,
    entries: list[dict[str, Any]],
    hashes: dict[str, str],
    files: dict[str, str],
    cfg: ScoringConfig,
    *,
    name: str,
    test_pair: bool,
    extra: dict[str, Any] | None = None,
) -> str:
    """Write ``root/manifest.yaml`` atomically; returns the bundle id."""
    ph = pair_prompt_hash(hashes)
    content_id = bundle_content_id(ph, files, entries)
    manifest = {
        "format": BUNDLE_FORMAT,
        "version": BUNDLE_VERSION,
        "bundle_id": f"{name}-{content_id}",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "test_pair": test_pair,
        "prompt_hash": ph,
        "prompt": {
            "text": cfg.prompt.text,
            "unsafe_answer": cfg.prompt.unsafe_answer,
            "safe_answer": cfg.prompt.safe_answer,
        },
        "members": entries,
        "policy": "policy.yaml",
        **(extra or {}),
        "files": files,
    }
    # the note says what the test members are, from the kinds the manifest records
    kinds = [e.get("test_pair_kind") for e in entries if e.get("test_pair")]
    atomic_write_text(
        root / "manifest.yaml",
        (f"# {describe_test_pair(kinds)}\n" if test_pair else "") + dump_yaml(manifest),
    )
    return str(manifest["bundle_id"])
