"""Data of the cost model (``spotstop cost``): devices and the paper's per-case cost.

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
    The real members' recorded configs and the paper's resolution settings of each are their
    architecture's (``export/archs/<model_type>.py``: ``RecordedMember``); the registry
    (``spotstop.export.archs``) lists them as ``REAL_PAIR`` and ``REAL_SETTINGS``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEVICES", "PAPER_TFLOPS"]

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
