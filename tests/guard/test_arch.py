"""numpy/Pillow preprocessing equals the Hugging Face image processors; image geometry."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image
from spotstop.guard._arch import ARCHS, get_arch
from spotstop.guard._errors import ConfigError

from tests._support import TESTS_DIR

QWEN_CFG = {"model_type": "qwen3_5", "vision_config": {"patch_size": 16, "spatial_merge_size": 2}}
LFM_CFG = {"model_type": "lfm2_vl", "downsample_factor": 2, "vision_config": {"patch_size": 16}}
#: a minimal config.json per registered architecture (a new one without fails here)
CFGS = {"qwen3_5": QWEN_CFG, "lfm2_vl": LFM_CFG}
PRE = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def _img(h: int, w: int, seed: int = 0) -> Image.Image:
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return Image.fromarray(arr)


def test_qwen_preprocessing_equals_hf_image_processor():
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    arch = get_arch("qwen3_5")
    g = arch.geometry(QWEN_CFG, PRE, (64, 96))
    img = _img(64, 96)
    ours = arch.preprocess(img, g)
    hf = Qwen2VLImageProcessorPil(
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        min_pixels=32 * 32,
        max_pixels=4096 * 32 * 32,
    )(images=[img], return_tensors="np")
    np.testing.assert_array_equal(ours["image_grid_thw"], hf["image_grid_thw"])
    np.testing.assert_allclose(ours["pixel_values"], hf["pixel_values"], atol=1e-6)
    assert g.n_image_tokens == (64 // 32) * (96 // 32)


def test_lfm_preprocessing_equals_an_independent_patch_loop():
    arch = get_arch("lfm2_vl")
    g = arch.geometry(LFM_CFG, PRE, (64, 96))
    img = _img(64, 96, 1)
    ours = arch.preprocess(img, g)
    x = (np.asarray(img, dtype=np.float64) / 255 - 0.5) / 0.5
    want = []
    for r in range(64 // 16):
        for c in range(96 // 16):
            want.append(x[r * 16 : (r + 1) * 16, c * 16 : (c + 1) * 16, :].reshape(-1))
    np.testing.assert_allclose(ours["pixel_values"][0], np.stack(want), atol=1e-6)
    assert ours["spatial_shapes"].tolist() == [[4, 6]]
    assert ours["pixel_attention_mask"].sum() == 24
    assert g.n_image_tokens == 2 * 3


def test_lfm_preprocessing_equals_hf_image_processor_when_torchvision_present():
    pytest.importorskip("torchvision")
    from transformers import Lfm2VlImageProcessor

    arch = get_arch("lfm2_vl")
    g = arch.geometry(LFM_CFG, PRE, (64, 96))
    img = _img(64, 96, 2)
    hf = Lfm2VlImageProcessor(
        do_image_splitting=False,
        min_image_tokens=4,
        max_image_tokens=64,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )(images=[[img]], return_tensors="np")
    ours = arch.preprocess(img, g)
    n = int(hf["pixel_attention_mask"][0].sum())
    np.testing.assert_allclose(ours["pixel_values"][0], hf["pixel_values"][0][:n], atol=1e-6)


def test_resize_to_the_grid_happens_first():
    arch = get_arch("qwen3_5")
    g = arch.geometry(QWEN_CFG, PRE, (64, 64))
    out = arch.preprocess(_img(300, 500), g)
    assert out["pixel_values"].shape == (16, 3 * 2 * 16 * 16)


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_geometry_refuses_sizes_off_the_grid(name):
    cfg = CFGS[name]
    with pytest.raises(ConfigError, match="multiples of"):
        ARCHS[name].geometry(cfg, PRE, (65, 64))
    # the paper's low-resolution rule (seed 000, Table S31): Qwen3.5 256, LFM2-VL 64 tokens
    want = {"qwen3_5": 256, "lfm2_vl": 64}[name]
    assert ARCHS[name].geometry(cfg, PRE, None).n_image_tokens == want


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_text_inputs_are_token_aligned_integers(name):
    ids = np.array([[5, 7, 7, 9], [7, 1, 0, 0]], dtype=np.int64)
    for with_image in (True, False):
        for key, v in ARCHS[name].text_inputs(ids, 7, with_image).items():
            assert v.shape == ids.shape and v.dtype.kind == "i", (key, v)


def test_qwen_marks_image_tokens_for_its_positions():
    arch = get_arch("qwen3_5")
    ids = np.array([[5, 7, 7, 9]], dtype=np.int64)
    assert arch.text_inputs(ids, 7, True)["mm_token_type_ids"].tolist() == [[0, 1, 1, 0]]
    assert not arch.text_inputs(ids, 7, False)["mm_token_type_ids"].any()
    assert get_arch("lfm2_vl").text_inputs(ids, 7, True) == {}


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_token_grid_counts_the_visual_tokens(name):
    g = ARCHS[name].geometry(CFGS[name], PRE, (64, 96))
    rows, cols = g.token_grid
    assert (rows, cols) == (2, 3) and rows * cols == g.n_image_tokens


def test_unknown_architecture_lists_the_supported_ones():
    with pytest.raises(ConfigError, match="supported"):
        get_arch("llava")


# -- per-member visual-token budgets ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tokens", "size"),
    [
        ("qwen3_5", 256, (512, 512)),
        ("qwen3_5", 1024, (1024, 1024)),
        ("qwen3_5", 64, (256, 256)),
        ("lfm2_vl", 64, (256, 256)),
        ("lfm2_vl", 36, (192, 192)),
        ("lfm2_vl", 256, (512, 512)),
    ],
)
def test_a_budget_is_the_square_grid_of_that_many_tokens(name, tokens, size):
    arch = ARCHS[name]
    assert arch.grid_for_tokens(CFGS[name], tokens) == size
    assert arch.geometry(CFGS[name], PRE, size).n_image_tokens == tokens


def test_a_budget_may_take_an_aspect():
    assert get_arch("qwen3_5").grid_for_tokens(QWEN_CFG, 192, 4 / 3) == (384, 512)
    assert get_arch("lfm2_vl").grid_for_tokens(LFM_CFG, 48, 4 / 3) == (192, 256)


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_a_budget_without_a_square_grid_names_the_nearest_ones(name):
    with pytest.raises(ConfigError, match=r"nearest budgets that do: 196 or 225"):
        ARCHS[name].grid_for_tokens(CFGS[name], 200)
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ConfigError, match="positive integer"):
            ARCHS[name].grid_for_tokens(CFGS[name], bad)


def test_the_default_budgets_are_the_papers_low_resolution_rule():
    assert get_arch("qwen3_5").default_visual_tokens == 256
    assert get_arch("lfm2_vl").default_visual_tokens == 64  # without tiling
    assert get_arch("lfm2_vl").geometry(LFM_CFG, PRE).token_grid == (8, 8)


# -- parity with the Hugging Face image processors (golden arrays, no torch needed) -----------

GOLDEN = TESTS_DIR / "golden" / "processor_golden.npz"
#: the real members' config.json as far as the image grid goes (patch 16, merge 2)
GOLDEN_CFGS = {"qwen3_5": QWEN_CFG, "lfm2_vl": LFM_CFG}


def _golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as z:
        return {k: z[k] for k in z.files}


def _png(a: np.ndarray) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(a.tobytes())))


def _golden_levels(g: dict[str, np.ndarray], key: str) -> np.ndarray:
    return _png(g[f"{key}/pixel_levels_png"]).reshape(g[f"{key}/pixel_shape"])


def _levels(x: np.ndarray) -> np.ndarray:
    """Normalized pixels (mean = std = 0.5) → the 8-bit level each encodes (as int16)."""
    lv = np.rint((x.astype(np.float64) * 0.5 + 0.5) * 255)
    np.testing.assert_allclose((lv / 255 - 0.5) / 0.5, x, atol=1e-6)  # every value on a level
    return lv.astype(np.int16)


def _golden_cases() -> list[str]:
    return json.loads(str(_golden()["meta"]))["cases"]


def _ours(case: str, g: dict[str, np.ndarray]):
    budget = int(g[f"{case}/budget"])
    arch = get_arch("qwen3_5" if case.startswith("qwen") else "lfm2_vl")
    grid = tuple(int(v) for v in g[f"{case}/grid"])
    aspect = grid[1] / grid[0]
    size = arch.grid_for_tokens(GOLDEN_CFGS[arch.model_type], budget, aspect)
    geom = arch.geometry(GOLDEN_CFGS[arch.model_type], PRE, size)
    img = Image.fromarray(_png(g[f"{case}/image_png"]))
    return arch, budget, size, geom, arch.preprocess(img, geom)


def test_the_golden_file_covers_both_architectures_and_the_default_budgets():
    g = _golden()
    meta = json.loads(str(g["meta"]))
    assert meta["transformers"] and meta["torchvision"]  # made by the real processors
    got = {(c.split("_")[0], int(g[f"{c}/budget"])) for c in meta["cases"]}
    assert {("qwen", 256), ("lfm", 64), ("lfm", 256)} <= got
    assert GOLDEN.stat().st_size < 600 * 1024


@pytest.mark.parametrize("case", _golden_cases())
def test_preprocessing_equals_the_hf_processor_at_the_budget(case):
    """spotstop's numpy/Pillow preprocessing at a budget gives the grid, the token count and
    the pixels of the Hugging Face image processor configured for that budget
    (``tests/golden/make_processor_golden.py`` wrote them with transformers and torchvision).

    Qwen3.5's Pillow backend and LFM2-VL's torchvision backend (its only one) give the same
    pixels within 1e-6. Qwen3.5's torchvision backend (the default where torchvision is
    installed) resizes with its own bicubic kernel: within 2 of 256 levels, on at most 0.5 %
    of the values (0.02 % in the committed cases).
    """
    g = _golden()
    arch, budget, size, geom, ours = _ours(case, g)
    assert size == tuple(int(v) for v in g[f"{case}/grid"])
    assert geom.n_image_tokens == budget
    if arch.model_type == "qwen3_5":
        thw = g[f"{case}/pil/image_grid_thw"]
        np.testing.assert_array_equal(ours["image_grid_thw"], thw)
        assert int(thw[0, 1] // 2 * (thw[0, 2] // 2)) == budget
        pil = _golden_levels(g, f"{case}/pil")
        want = (pil.astype(np.float32) / 255 - 0.5) / 0.5
        np.testing.assert_allclose(ours["pixel_values"], want, atol=1e-6)
        tv = pil.astype(np.int16) + g[f"{case}/torchvision/pixel_levels_minus_pil"]
        got = _levels(ours["pixel_values"])
        diff = np.abs(got - tv)
        assert diff.max() <= 2 and (diff > 0).mean() <= 0.005, (case, (diff > 0).mean())
    else:
        key = f"{case}/torchvision"
        np.testing.assert_array_equal(ours["spatial_shapes"], g[f"{key}/spatial_shapes"])
        n = int(g[f"{key}/pixel_attention_mask"][0].sum())
        assert ours["pixel_values"].shape[1] == ours["pixel_attention_mask"].sum() == n
        assert n == budget * 4  # 2x2 patches per visual token
        want = (_golden_levels(g, key).astype(np.float32) / 255 - 0.5) / 0.5
        np.testing.assert_allclose(ours["pixel_values"], want, atol=1e-6)


@pytest.mark.parametrize(
    ("hints", "words"),
    [
        ("test_pair: 'false'\n", "test_pair must be true or false; got 'false'"),
        ("image_sise: [64, 64]\n", "image_sise is not a known key. Did you mean 'image_size'?"),
        ("test_pair: true\ntest_pair: false\n", "test_pair appears twice"),
        (
            "test_pair: true\ntest_pair_kind: toy\n",
            "test_pair_kind must be one of ['random', 'tiny', 'trained']; got 'toy'",
        ),
        ("- image_size\n", "must be a mapping"),
    ],
)
def test_a_member_folders_hints_are_checked_by_key(tmp_path, hints, words):
    """spotstop_member.yaml was read unchecked: a misspelt key fell back to a default, and a
    quoted 'false' marked a folder as a TEST pair."""
    import shutil

    from spotstop.guard._hf import MEMBER_HINTS, resolve_member

    folder = tmp_path / "member"
    shutil.copytree(TESTS_DIR / "_support" / "tiny_bundle" / "members" / "tiny-qwen3_5", folder)
    assert resolve_member(folder).hints == {"test_pair": True, "image_size": [64, 64]}
    (folder / MEMBER_HINTS).write_text(hints, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"spotstop_member\.yaml") as err:
        resolve_member(folder)
    assert words in str(err.value)
