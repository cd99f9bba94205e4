"""numpy/Pillow preprocessing equals the Hugging Face image processors; image geometry."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from spotstop.guard._arch import ARCHS, get_arch
from spotstop.guard._errors import ConfigError

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
    assert ARCHS[name].geometry(cfg, PRE, None).n_image_tokens == 256  # the paper's low-res default


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
