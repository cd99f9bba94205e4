"""Data of the cost model (``spotstop cost``): devices, the real pair's configs, the paper's settings.

Every figure here is a published number with its source, or says how it was derived. The cost
model itself is :mod:`spotstop.export.cost`; this module holds no logic and imports nothing.

Devices
    Peak DENSE tensor throughput (no 2:4 structured sparsity: the scoring graphs' weights are
    dense) and DRAM bandwidth. NVIDIA's Jetson datasheets give the module's INT8 TOPS with
    sparsity, GPU + DLAs together; the scoring graphs run on the GPU (TensorRT or onnxruntime's
    CUDA provider), so the Orin rows hold the GPU's share. The Orin GPU (Ampere GA10B) has the
    same tensor cores at each module's clock: 40 sparse INT8 TOPS on Orin Nano 8 GB (GPU only,
    no DLA, 1024 CUDA cores, 625 MHz) scales with cores x clock to 50 (NX 8 GB, 765 MHz; module
    70 = 50 GPU + 20 DLA), 60 (NX 16 GB, 918 MHz; module 100 = 60 + 40 DLA) and 170 (AGX Orin
    64 GB, 2048 cores, 1.3 GHz; module 275 = 170 + 105 DLA), the GPU figures the datasheets
    list. Dense = sparse / 2; FP16 dense = INT8 dense / 2 (Ampere tensor cores run FP16 at
    half the INT8 rate). L4 and H200 list dense and sparse separately.

Real pair
    The members' config values as recorded in ``jetson/memory_budget.py`` (RECORDED, from the
    members' ``config.json`` on the Hugging Face hub: Qwen/Qwen3.5-2B and LiquidAI/LFM2.5-VL-3B).
    They could NOT be re-read here (no model hub in this environment; a search of the public
    code corpus did not find either config.json), so they are unverified: run ``spotstop cost``
    on a bundle exported from the real snapshots to cost the real configs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEVICES", "PAPER_TFLOPS", "REAL_PAIR", "REAL_SETTINGS"]

#: name -> peak dense throughput (TFLOPS fp16 / TOPS int8), bandwidth (GB/s), memory, source
DEVICES: dict[str, dict[str, Any]] = {
    "Orin Nano 8GB": {
        "fp16_tflops": 10.0,
        "int8_tops": 20.0,
        "bandwidth_gbs": 68.0,
        "memory_gb": 8,
        "source": "NVIDIA Jetson Orin Nano series datasheet: 40 INT8 TOPS (sparse; GPU only, no "
        "DLA), LPDDR5 68 GB/s. Dense = 40 / 2; FP16 dense = INT8 dense / 2 (derived). "
        "JetPack 6.1's 'Super' mode (67 TOPS, 102 GB/s) is not assumed.",
    },
    "Orin NX 8GB": {
        "fp16_tflops": 12.5,
        "int8_tops": 25.0,
        "bandwidth_gbs": 102.4,
        "memory_gb": 8,
        "source": "NVIDIA Jetson Orin NX series datasheet: 70 INT8 TOPS sparse (module: 50 GPU + "
        "20 DLA), LPDDR5 102.4 GB/s. GPU dense = 50 / 2; FP16 dense = INT8 dense / 2 (derived).",
    },
    "Orin NX 16GB": {
        "fp16_tflops": 15.0,
        "int8_tops": 30.0,
        "bandwidth_gbs": 102.4,
        "memory_gb": 16,
        "source": "NVIDIA Jetson Orin NX series datasheet: 100 INT8 TOPS sparse (module: 60 GPU "
        "+ 40 DLA), LPDDR5 102.4 GB/s. GPU dense = 60 / 2; FP16 dense = INT8 dense / 2 (derived).",
    },
    "AGX Orin 64GB": {
        "fp16_tflops": 42.5,
        "int8_tops": 85.0,
        "bandwidth_gbs": 204.8,
        "memory_gb": 64,
        "source": "NVIDIA Jetson AGX Orin series datasheet: 275 INT8 TOPS sparse (module: 170 "
        "GPU + 105 DLA), LPDDR5 204.8 GB/s. GPU dense = 170 / 2; FP16 dense = INT8 dense / 2 "
        "(derived).",
    },
    "L4": {
        "fp16_tflops": 121.0,
        "int8_tops": 242.5,
        "bandwidth_gbs": 300.0,
        "memory_gb": 24,
        "source": "NVIDIA L4 datasheet: FP16 tensor 242 TFLOPS and INT8 485 TOPS with sparsity "
        "(121 / 242.5 dense), GDDR6 300 GB/s. The paper's cost GPU.",
    },
    "H200": {
        "fp16_tflops": 989.0,
        "int8_tops": 1979.0,
        "bandwidth_gbs": 4800.0,
        "memory_gb": 141,
        "source": "NVIDIA H200 SXM datasheet: FP16/BF16 tensor 1,979 TFLOPS and INT8 3,958 TOPS "
        "with sparsity (989 / 1,979 dense), HBM3e 4.8 TB/s. (H200 NVL: 835 dense FP16.)",
    },
}

#: the paper's per-case cost of the equal-weight pair (seed 000, Supp. F.4 and Table S31)
PAPER_TFLOPS: dict[str, float] = {"low": 7.4, "default": 16.8}

#: Recorded config values (see the module docstring); ``jetson/memory_budget.py`` reads them
#: from here.
REAL_PAIR: dict[str, dict[str, Any]] = {
    "Qwen3.5-2B": {
        "model_type": "qwen3_5",
        "tie_word_embeddings": True,
        "text_config": {
            "vocab_size": 248320,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 24,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 16,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 6,
            "tie_word_embeddings": True,
        },
        "vision_config": {
            "depth": 24,
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_heads": 16,
            "out_hidden_size": 2048,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 2304,
        },
    },
    "LFM2.5-VL-3B": {
        "model_type": "lfm2_vl",
        "tie_word_embeddings": True,
        "downsample_factor": 2,
        "projector_hidden_size": 2560,
        "text_config": {
            "model_type": "lfm2",
            "vocab_size": 131072,
            "hidden_size": 2048,
            "intermediate_size": 10752,
            "block_ff_dim": 10752,
            "block_auto_adjust_ff_dim": False,
            "block_multiple_of": 256,
            "block_ffn_dim_multiplier": 1.0,
            "num_hidden_layers": 30,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "layer_types": [
                "full_attention" if i in (2, 5, 8, 11, 14, 17, 21, 25) else "conv"
                for i in range(30)
            ],
        },
        "vision_config": {
            "model_type": "siglip2_vision_model",
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_hidden_layers": 27,
            "num_attention_heads": 16,
            "patch_size": 16,
            "num_patches": 256,
        },
    },
}

#: The paper's resolution settings of the pair (Supp. F.4), as vision passes per member: each
#: pass is (patch rows, patch columns) of one image or tile; ``visual_tokens`` is what the
#: decoder sees (with LFM2-VL's tile markers not counted). "low": Qwen3.5-2B at 256 visual
#: tokens (512x512), LFM2.5-VL-3B without tiling at 64 tokens (256x256; the paper's 32-64).
#: "default": Qwen3.5-2B at 1,024 visual tokens (1024x1024); LFM2.5-VL-3B with tiling, taken
#: here for a 1024x1024 image: 2x2 tiles of 512x512 (256 tokens each) plus a 512x512
#: thumbnail (256): ASSUMED, the paper does not give its images' sizes.
REAL_SETTINGS: dict[str, dict[str, list[tuple[int, int]]]] = {
    "low": {"Qwen3.5-2B": [(32, 32)], "LFM2.5-VL-3B": [(16, 16)]},
    "default": {"Qwen3.5-2B": [(64, 64)], "LFM2.5-VL-3B": [(32, 32)] * 5},
}
