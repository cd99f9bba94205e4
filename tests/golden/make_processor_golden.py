"""Regenerate ``processor_golden.npz``: the Hugging Face image processors' output at each
member's visual-token budget, for ``tests/guard/test_arch.py`` to compare spotstop's numpy/Pillow
preprocessing against in CI, where neither torch nor torchvision is installed.

Run it in a throwaway environment OUTSIDE the repository, with the versions below (the ones
that wrote the committed file; the script refuses others unless ``--any-version``)::

    python3 -m venv /tmp/tvenv
    /tmp/tvenv/bin/pip install torch==2.14.1 torchvision==0.29.1 transformers==5.24.0 \\
        pillow==13.0.0 numpy==2.4.6
    /tmp/tvenv/bin/python tests/golden/make_processor_golden.py

It needs no hub access and no spotstop: the processors are loaded with
``AutoImageProcessor.from_pretrained`` from ``preprocessor_config.json`` files written here,
shaped like the real members' (Qwen3.5-2B: ``Qwen2VLImageProcessor``, patch 16, merge 2,
mean = std = 0.5; LFM2.5-VL-3B: ``Lfm2VlImageProcessor``, encoder patch 16, downsample 2,
mean = std = 0.5, bilinear), with the budget set as the processor's own token bounds: for
Qwen ``min_pixels = max_pixels = budget · 32²``, for LFM2-VL no tiling and
``min_image_tokens = max_image_tokens = budget``, so the processor's grid is the budget's.

Each case (arch, budget, source image) stores the source image (PNG bytes), the grid the
processor chose, and its outputs. Pixel values are stored as the 8-bit level each one
encodes (``(x · std + mean) · 255``, checked here to reconstruct every value within 1e-6),
as a 2-D PNG of the processor's own layout (``pixel_levels_png``, ``pixel_shape``), so the
file stays a few hundred KiB. Qwen cases are run with both of its backends: ``pil`` (the same Pillow
resize spotstop uses) and ``torchvision`` (the default where torchvision is installed; stored
as its difference from ``pil`` in levels); LFM2-VL has a torchvision backend only.
LFM2-VL's ``pixel_levels`` keep the valid patches only (the processor pads to its maximum;
``pixel_attention_mask`` says how many are valid).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

VERSIONS = {"torch": "2.14.1", "torchvision": "0.29.1", "transformers": "5.24.0"}
OUT = Path(__file__).with_name("processor_golden.npz")
MEAN = STD = 0.5
TOKEN_PIXELS = 32  # patch 16 × merge (Qwen) / downsample (LFM2-VL) 2, both members

#: name → (architecture, visual-token budget, source image (height, width), image seed)
CASES = {
    "qwen_256_square": ("qwen3_5", 256, (640, 640), 1),  # downscaled to 512x512
    "qwen_256_small": ("qwen3_5", 256, (64, 64), 2),  # upscaled to 512x512
    "qwen_192_wide": ("qwen3_5", 192, (480, 640), 3),  # 4:3 → 384x512 (12x16 tokens)
    "lfm_64_square": ("lfm2_vl", 64, (640, 640), 4),  # → 256x256 (8x8 tokens)
    "lfm_64_exact": ("lfm2_vl", 64, (256, 256), 5),  # already at the grid: no resize
    "lfm_64_small": ("lfm2_vl", 64, (64, 64), 6),  # upscaled to 256x256
    "lfm_256_square": ("lfm2_vl", 256, (768, 768), 7),  # → 512x512 (16x16 tokens)
    "lfm_48_wide": ("lfm2_vl", 48, (480, 640), 8),  # 4:3 → 192x256 (6x8 tokens)
}


def source_image(h: int, w: int, seed: int) -> np.ndarray:
    """A structured uint8 RGB image: gradients, sharp squares, a disc and coarse noise."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255 * x / max(1, w - 1)
    g = 255 * y / max(1, h - 1)
    b = 255.0 * (((x // 24) + (y // 24)) % 2)
    disc = (x - w / 3) ** 2 + (y - h / 2) ** 2 < (min(h, w) / 4) ** 2
    b[disc] = 255 - b[disc]
    img = np.stack([r, g, b], -1)
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3)).astype(np.float64)
    band = slice(h // 8, h // 4)  # a band of 8x8-pixel noise blocks: every kernel tap matters
    img[band] = coarse.repeat(8, 0).repeat(8, 1)[band, :w]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def png_bytes(img: np.ndarray) -> np.ndarray:
    """A uint8 (H, W, 3) image or 2-D array as PNG file bytes (lossless; PNG's row filters
    keep smooth pixels far smaller than the npz's deflate alone)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(img)).save(buf, format="PNG", optimize=True)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def _store_levels(out: dict[str, np.ndarray], key: str, levels: np.ndarray) -> None:
    """``key/pixel_levels_png``: the levels as a 2-D grayscale PNG; ``key/pixel_shape``."""
    out[f"{key}/pixel_shape"] = np.asarray(levels.shape, np.int64)
    out[f"{key}/pixel_levels_png"] = png_bytes(levels.reshape(-1, levels.shape[-1]))


def processor_config(arch: str, budget: int) -> dict:
    if arch == "qwen3_5":
        px = budget * TOKEN_PIXELS**2
        return {
            "image_processor_type": "Qwen2VLImageProcessor",
            "do_resize": True,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "do_convert_rgb": True,
            "image_mean": [MEAN] * 3,
            "image_std": [STD] * 3,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "size": {"shortest_edge": px, "longest_edge": px},
        }
    return {
        "image_processor_type": "Lfm2VlImageProcessor",
        "do_image_splitting": False,
        "downsample_factor": 2,
        "encoder_patch_size": 16,
        "min_image_tokens": budget,
        "max_image_tokens": budget,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [MEAN] * 3,
        "image_std": [STD] * 3,
        "resample": 2,
        "use_thumbnail": False,
        "tile_size": 512,
    }


def _levels(x: np.ndarray) -> np.ndarray:
    """The 8-bit levels of normalized pixels; refuses values that are not on a level."""
    lv = np.rint((x.astype(np.float64) * STD + MEAN) * 255)
    back = (lv / 255 - MEAN) / STD
    err = float(np.abs(back - x).max()) if x.size else 0.0
    if err > 1e-6 or lv.min() < 0 or lv.max() > 255:
        raise SystemExit(f"pixel values are not 8-bit levels (max error {err:.3g}); store floats.")
    return lv.astype(np.uint8)


def run_case(name: str, tmp: Path) -> dict[str, np.ndarray]:
    from PIL import Image
    from transformers import AutoImageProcessor

    arch, budget, (h, w), seed = CASES[name]
    src = source_image(h, w, seed)
    folder = tmp / name
    folder.mkdir()
    (folder / "preprocessor_config.json").write_text(json.dumps(processor_config(arch, budget)))
    out: dict[str, np.ndarray] = {
        f"{name}/image_png": png_bytes(src),
        f"{name}/budget": np.asarray(budget, np.int64),
    }
    backends = ("pil", "torchvision") if arch == "qwen3_5" else ("torchvision",)
    pil_levels = np.zeros(0, np.uint8)
    for backend in backends:
        proc = AutoImageProcessor.from_pretrained(str(folder), backend=backend)
        img = Image.fromarray(src)
        key = f"{name}/{backend}"
        if arch == "qwen3_5":
            r = proc(images=[img], return_tensors="np")
            thw = np.asarray(r["image_grid_thw"], np.int64)
            gh, gw = int(thw[0, 1]), int(thw[0, 2])
            out[f"{key}/image_grid_thw"] = thw
            levels = _levels(np.asarray(r["pixel_values"]))
            if backend == "pil":
                _store_levels(out, key, levels)
                pil_levels = levels
            else:  # a few levels off Pillow's resize at most: stored as the difference
                diff = levels.astype(np.int16) - pil_levels.astype(np.int16)
                out[f"{key}/pixel_levels_minus_pil"] = diff.astype(np.int8)
            grid = (gh * 16, gw * 16)
            tokens = (gh // 2) * (gw // 2)
        else:
            r = proc(images=[[img]], return_tensors="np")
            mask = np.asarray(r["pixel_attention_mask"], np.int64)
            n = int(mask[0].sum())
            shapes = np.asarray(r["spatial_shapes"], np.int64)
            out[f"{key}/pixel_attention_mask"] = mask
            out[f"{key}/spatial_shapes"] = shapes
            _store_levels(out, key, _levels(np.asarray(r["pixel_values"])[:, :n]))
            grid = (int(shapes[0, 0]) * 16, int(shapes[0, 1]) * 16)
            tokens = (int(shapes[0, 0]) // 2) * (int(shapes[0, 1]) // 2)
        if tokens != budget:
            raise SystemExit(
                f"{name} ({backend}): the processor gave {tokens} tokens, not {budget}"
            )
        out[f"{name}/grid"] = np.asarray(grid, np.int64)
        print(f"{name:<16} {backend:<11} {h}x{w} → {grid[0]}x{grid[1]} = {tokens} tokens")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--any-version", action="store_true", help="run with other library versions")
    args = ap.parse_args(argv)
    import PIL
    import torch
    import torchvision
    import transformers

    found = {
        "torch": torch.__version__.split("+")[0],
        "torchvision": torchvision.__version__.split("+")[0],
        "transformers": transformers.__version__,
    }
    if found != VERSIONS and not args.any_version:
        print(f"want {VERSIONS}, found {found}; pass --any-version to run anyway.", file=sys.stderr)
        return 2
    arrays: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CASES:
            arrays.update(run_case(name, Path(tmp)))
    meta = {**found, "pillow": PIL.__version__, "numpy": np.__version__, "cases": list(CASES)}
    arrays["meta"] = np.asarray(json.dumps(meta, sort_keys=True))
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
