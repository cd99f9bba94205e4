"""A bundle whose manifest was edited, or whose member files do not belong together, is refused
when it loads, with a message saying what: not loaded to decide with another policy's
statistics, nor loaded to fail closed on every check with no retry that could mend it."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from spotstop.guard import BundleError, Guard, MemberLoadError, load_bundle
from spotstop.guard._bundle import bundle_content_id
from spotstop.guard._member import load_bundle_member

from tests._support.guard import make_scene

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


def _set(path: str, value: object):  # type: ignore[no-untyped-def]
    def change(doc: dict) -> None:
        *parents, last = path.split(".")
        for p in parents:
            doc = doc[int(p)] if p.isdigit() else doc[p]  # type: ignore[index]
        doc[last] = value

    return change


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (_set("files", None), "files must map each file's path to its sha256"),
        (_set("files", ["a"]), "files must map each file's path to its sha256"),
        (_set("prompt", "hi"), "prompt must hold text"),
        (_set("prompt.text", 5), "prompt must hold text"),
        (_set("members", []), "members must be a non-empty list"),
        (_set("members", ["x"]), r"members\[0\] must be a mapping"),
        (_set("members.0.template", "x"), r"members\[0\]\.template must hold"),
        (_set("members.1.name", "tiny-qwen3_5"), "members must have distinct names"),
    ],
)
def test_a_damaged_manifest_is_refused_by_what_is_wrong(bundle_copy: Path, change, why) -> None:  # type: ignore[no-untyped-def]
    """These crashed with AttributeError, TypeError or a misleading prompt-hash message."""
    _edit(bundle_copy, change)
    for verify in (True, False):
        with pytest.raises(BundleError, match=why):
            load_bundle(bundle_copy, verify=verify)


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda d: d.pop("n_image_tokens"), "key 'n_image_tokens' is missing"),
        (lambda d: d.pop("decoder"), "key 'decoder' is missing"),
        (lambda d: d["decoder"].update(files={}), "decoder.files must map lengths"),
        (lambda d: d["decoder"].update(buckets=[]), "decoder.buckets must be a list"),
        (lambda d: d["decoder"].pop("fixed_length"), "decoder must hold files"),
        (lambda d: d.update(first_ids="66"), "first_ids must be a list"),
        (lambda d: d.update(hidden_size="64"), "hidden_size must be an integer"),
    ],
)
def test_a_damaged_member_description_is_refused_at_load(bundle_copy: Path, edit, why) -> None:  # type: ignore[no-untyped-def]
    """A KeyError at load, or a member that loaded and failed every score (StopIteration)."""
    meta = bundle_copy / "members" / "tiny-qwen3_5" / "spotstop_onnx.yaml"
    doc = yaml.safe_load(meta.read_text())
    edit(doc)
    meta.write_text(yaml.safe_dump(doc, sort_keys=False))
    b = load_bundle(bundle_copy, verify=False)
    with pytest.raises(MemberLoadError, match=why):
        load_bundle_member(b, b.members[0])
    meta.write_text("format: [unclosed\n")
    with pytest.raises(MemberLoadError, match="is not valid YAML"):
        load_bundle_member(b, b.members[0])


# -- a bundle runs only what it holds, checked --------------------------------------------------

QWEN = "members/tiny-qwen3_5"


@pytest.mark.parametrize("where", ["absolute", "parent", "unlisted inside", "not text"])
def test_a_member_folder_the_manifest_does_not_list_is_refused(
    bundle_copy: Path, tmp_path: Path, where: str
) -> None:
    """The member's path was in neither the sha256 list nor the id: pointed at a folder outside
    the bundle (or one added inside it), the guard loaded its graphs unchecked and decided with
    them under the bundle's id and policy (a SAFE from other weights)."""
    elsewhere = {
        "absolute": tmp_path / "elsewhere" / "tiny-qwen3_5",
        "parent": bundle_copy.parent / "elsewhere" / "tiny-qwen3_5",
        "unlisted inside": bundle_copy / "members" / "other",
    }
    if where in elsewhere:
        shutil.copytree(bundle_copy / QWEN, elsewhere[where])
    value = {
        "absolute": str(elsewhere["absolute"]),
        "parent": "../elsewhere/tiny-qwen3_5",
        "unlisted inside": "members/other",
        "not text": 5,
    }[where]
    _edit(bundle_copy, _set("members.0.path", value))
    why = {
        "absolute": "must be a folder inside the bundle",
        "parent": "must be a folder inside the bundle",
        "unlisted inside": r"is not a member folder whose files the manifest lists "
        r"\(members/other/config\.json",
        "not text": "path must be the member's folder as text",
    }[where]
    for verify in (True, False):
        with pytest.raises(BundleError, match=rf"manifest\.members\[0\]\.{why}|{why}"):
            load_bundle(bundle_copy, verify=verify)
    with pytest.raises(BundleError, match=why):
        Guard(bundle_copy, log=tmp_path / "l.sqlite")


def test_members_swapped_by_their_paths_are_refused(bundle_copy: Path, tmp_path: Path) -> None:
    """Two members of one architecture (same template, same grid: the prompt hash cannot tell
    them apart) whose paths were swapped in the manifest loaded under the same id and policy,
    each name scoring with the other's graphs (its fusion statistics applied to the other's
    scores). A listed member's folder must now be members/NAME, as the export writes it."""
    from spotstop.guard._bundle import pair_prompt_hash

    lfm = "members/tiny-lfm2_vl"
    shutil.copytree(bundle_copy / lfm, bundle_copy / "members" / "lfm-b")

    def second_member(doc: dict) -> None:  # what the export writes for a pair of one arch
        entry = next(e for e in doc["members"] if e["path"] == lfm)
        doc["members"].append({**entry, "name": "lfm-b", "path": "members/lfm-b"})
        doc["files"].update(
            {
                k.replace(lfm, "members/lfm-b", 1): v
                for k, v in doc["files"].items()
                if k.startswith(lfm + "/")
            }
        )
        doc["prompt_hash"] = pair_prompt_hash({e["name"]: e["prompt_hash"] for e in doc["members"]})
        content = bundle_content_id(doc["prompt_hash"], doc["files"], doc["members"])
        doc["bundle_id"] = f"bundle-{content}"

    _edit(bundle_copy, second_member)
    assert [m.name for m in load_bundle(bundle_copy).members][-1] == "lfm-b"

    def swap(doc: dict) -> None:
        a = next(e for e in doc["members"] if e["path"] == lfm)
        b = doc["members"][-1]
        a["path"], b["path"] = b["path"], a["path"]

    _edit(bundle_copy, swap)
    for verify in (True, False):
        with pytest.raises(
            BundleError, match=r"path 'members/lfm-b' is not 'members/tiny-lfm2_vl'"
        ):
            load_bundle(bundle_copy, verify=verify)
    with pytest.raises(BundleError, match="is not 'members/tiny-lfm2_vl'"):
        Guard(bundle_copy, log=tmp_path / "l.sqlite")


@pytest.mark.parametrize("link", ["file", "member folder"])
def test_links_out_of_the_bundle_are_refused_at_load(
    bundle_copy: Path, tmp_path: Path, link: str
) -> None:
    """A listed file reached through a link outside the bundle passed the sha256 check: a
    linked weights file then failed every check with onnxruntime's "External data path escapes
    model directory" (the guard said it was ready), a linked member folder ran from outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    if link == "file":
        f = bundle_copy / DECODER
        moved = outside / (f.name + ".data")
        shutil.move(f.with_name(f.name + ".data"), moved)
        f.with_name(f.name + ".data").symlink_to(moved)
    else:
        shutil.move(bundle_copy / QWEN, outside / "q")
        (bundle_copy / QWEN).symlink_to(outside / "q")
    with pytest.raises(BundleError, match=r"reaches outside itself through links.*cp -rL"):
        load_bundle(bundle_copy)
    with pytest.raises(BundleError, match="reaches outside itself through links"):
        Guard(bundle_copy, log=tmp_path / "l.sqlite")


def test_a_graph_changed_after_the_bundle_was_verified_is_not_run(
    bundle_copy: Path, tmp_path: Path
) -> None:
    """Sessions opened on demand open the graphs at every check (and before the decoder was
    opened at load, it was opened at the first check): files changed after load (an export
    replacing the bundle while the guard ran) were run unchecked. They now fail closed, and the
    guard scores again once the files are back."""
    data = bundle_copy / (DECODER + ".data")
    good = data.read_bytes()
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", retry_load_s=None) as g:
        backend = g.members["tiny-qwen3_5"].backend
        backend.resident = False  # sessions opened for every check (sessions: on-demand)
        backend.release()
        data.write_bytes(good + b"\0")  # other bytes under the same name
        d = g.check(make_scene(0))
        assert d.fail_closed and d.label == "UNSAFE"
        assert "changed after it was verified" in (d.fail_reason or "")
        assert "decoder.onnx.data: sha256 differs" in (d.fail_reason or "")
        data.write_bytes(good)
        assert not g.check(make_scene(0)).fail_closed  # mended: scored again


def test_a_weights_file_written_in_place_under_open_sessions_is_not_run(
    bundle_copy: Path, tmp_path: Path
) -> None:
    """onnxruntime maps a graph's external weights into memory: written in place (``cp`` over
    the bundle) under a resident session, they changed the scores with no check. The file is
    now noticed before the next run: the scene fails closed, naming the file, and is scored as
    before once the bytes are back. A file replaced by a rename leaves the session the inode it
    verified, and it scores on."""
    data = bundle_copy / (DECODER + ".data")
    good = data.read_bytes()
    half = np.frombuffer(good[: len(good) // 4 * 4], np.float32) * np.float32(0.5)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", retry_load_s=None) as g:
        assert g.members["tiny-qwen3_5"].backend.resident
        before = g.check(make_scene(0))
        assert not before.fail_closed
        with open(data, "r+b") as f:  # in place: the inode the session maps
            f.write(half.tobytes())
        d = g.check(make_scene(0))
        assert d.fail_closed and d.label == "UNSAFE"
        assert "changed after it was verified" in (d.fail_reason or "")
        assert "decoder.onnx.data: sha256 differs" in (d.fail_reason or "")
        with open(data, "r+b") as f:
            f.write(good)
        again = g.check(make_scene(0))
        assert not again.fail_closed and again.policy_score == before.policy_score
        moved = data.with_name("moved")
        os.replace(data, moved)  # the session keeps its inode; the path holds a copy
        data.write_bytes(good)
        assert g.check(make_scene(0)).policy_score == before.policy_score


def test_a_member_file_read_where_it_is_there_must_be_listed(bundle_copy: Path) -> None:
    """``preprocessor_config.json`` (the image mean and std) is read only where a member's folder
    holds it, and the export copies it only where the source has one: put into a bundle
    exported without it, it changed the scores of a verified load under the same id and
    policy. It is now refused at load, and before a member is loaded again."""
    rel = "members/tiny-lfm2_vl/preprocessor_config.json"
    pre = bundle_copy / rel
    text = pre.read_text()
    pre.unlink()

    def exported_without(doc: dict) -> None:  # what the export writes for such a source
        del doc["files"][rel]
        content = bundle_content_id(doc["prompt_hash"], doc["files"], doc["members"])
        doc["bundle_id"] = f"bundle-{content}"

    _edit(bundle_copy, exported_without)
    b = load_bundle(bundle_copy)
    lfm = next(m for m in b.members if m.name == "tiny-lfm2_vl")
    before = load_bundle_member(b, lfm).score([make_scene(0)])[0].score
    pre.write_text(text.replace('"image_mean"', '"image_mean_was"'))  # another mean and std
    with pytest.raises(BundleError, match=rf"{rel}: not in the manifest"):
        load_bundle(bundle_copy)
    with pytest.raises(BundleError, match=rf"changed after it was verified.*{rel}"):
        load_bundle_member(b, lfm)
    pre.unlink()
    assert load_bundle_member(b, lfm).score([make_scene(0)])[0].score == before


def test_a_member_loaded_again_is_checked_again(bundle_copy: Path) -> None:
    """A member that failed to load is loaded again in the background from the same verified
    manifest: its files are checked again first (they were not)."""
    b = load_bundle(bundle_copy)
    data = bundle_copy / (DECODER + ".data")
    data.write_bytes(data.read_bytes() + b"\0")
    with pytest.raises(BundleError, match="changed after it was verified"):
        load_bundle_member(b, b.members[0])
    unverified = load_bundle(bundle_copy, verify=False)  # nothing promised, nothing checked
    assert load_bundle_member(unverified, unverified.members[0]).name == "tiny-qwen3_5"


def test_a_decoder_this_onnxruntime_cannot_run_is_refused_at_load(bundle_copy: Path) -> None:
    """The decoder's session opened at the first check: a graph with an operator this
    onnxruntime lacks loaded, the guard said it was ready, and every check failed closed with
    onnxruntime's "is not a registered function/op" and nothing to do."""
    onnx = pytest.importorskip("onnx")
    path = bundle_copy / DECODER
    model = onnx.load(str(path), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "Add")
    node.op_type, node.domain = "SpotstopFutureOp", "com.microsoft"
    onnx.save(model, str(path))
    b = load_bundle(bundle_copy, verify=False)  # as if exported so: the sha256 list agrees
    with pytest.raises(
        MemberLoadError,
        match=r"decoder\.onnx.*SpotstopFutureOp.*this onnxruntime \(.*\) lacks an operator.*"
        r"--graph-form standard",
    ):
        load_bundle_member(b, b.members[0])
