"""A bundle whose manifest was edited, or whose member files do not belong together, is refused
when it loads, with a message saying what: not loaded to decide with another policy's
statistics, nor loaded to fail closed on every check with no retry that could mend it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml
from spotstop.guard import BundleError, Guard, MemberLoadError, load_bundle
from spotstop.guard._bundle import bundle_content_id
from spotstop.guard._member import load_bundle_member

DECODER = "members/tiny-qwen3_5/onnx/decoder.onnx"


def _edit(bundle: Path, change) -> None:  # type: ignore[no-untyped-def]
    path = bundle / "manifest.yaml"
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_the_committed_bundles_id_names_its_content(committed_bundle: Path) -> None:
    doc = yaml.safe_load((committed_bundle / "manifest.yaml").read_text())
    content = bundle_content_id(doc["prompt_hash"], doc["files"], doc["members"])
    assert doc["bundle_id"] == f"bundle-{content}"
    assert load_bundle(committed_bundle).bundle_id == doc["bundle_id"]


@pytest.mark.parametrize("how", ["entry dropped", "sha256 replaced", "grid edited"])
def test_an_edited_manifest_is_refused_by_its_id(bundle_copy: Path, tmp_path: Path, how: str):
    """Changed weights whose manifest entry was dropped or given the new sha256 loaded with the
    policy fitted for the old ones (the id was read as written, never derived)."""
    f = bundle_copy / DECODER
    if how != "grid edited":
        f.write_bytes(f.read_bytes() + b"\0")  # other weights (a byte more will do)

    def change(doc: dict) -> None:
        if how == "entry dropped":
            del doc["files"][DECODER]
        elif how == "sha256 replaced":
            doc["files"][DECODER] = hashlib.sha256(f.read_bytes()).hexdigest()
        else:
            doc["members"][0]["image_size"] = [128, 128]

    _edit(bundle_copy, change)
    with pytest.raises(BundleError, match="does not name the bundle's content"):
        load_bundle(bundle_copy)
    with pytest.raises(BundleError, match="does not name the bundle's content"):
        Guard(bundle_copy, log=tmp_path / "l.sqlite")


def test_graphs_for_another_grid_or_tokenizer_are_refused_at_load(bundle_copy: Path) -> None:
    """Unverified (``verify=False``), an edited grid or another member's tokenizer loaded, then
    failed every score (an onnxruntime shape error; "re-export with this prompt")."""
    _edit(bundle_copy, lambda doc: doc["members"][0].update(image_size=[128, 128]))
    b = load_bundle(bundle_copy, verify=False)
    assert b.members[0].name == "tiny-qwen3_5"
    with pytest.raises(
        MemberLoadError, match="16 visual tokens, but its graphs were exported for 4"
    ):
        load_bundle_member(b, b.members[0])
    _edit(bundle_copy, lambda doc: doc["members"][0].update(image_size=[64, 64]))
    b = load_bundle(bundle_copy, verify=False)
    assert load_bundle_member(b, b.members[0]).geometry.n_image_tokens == 4  # as exported
    members = bundle_copy / "members"
    shutil.copy(
        members / "tiny-lfm2_vl" / "tokenizer.json", members / "tiny-qwen3_5" / "tokenizer.json"
    )
    b = load_bundle(bundle_copy, verify=False)
    with pytest.raises(
        MemberLoadError, match=r"answer first tokens.*is its tokenizer\.json its own"
    ):
        load_bundle_member(b, b.members[0])
