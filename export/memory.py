"""What an export holds in memory: when a member is "large", and the process's peak RSS.

A member is *large* when its float32 weights exceed :data:`LARGE_BYTES` (2 GiB, protobuf's
limit for one serialized message): its graphs cannot be handed to onnxruntime as bytes, and
the real pair (Qwen3.5-2B 8.2 GiB, LFM2.5-VL-3B 11.7 GiB in float32) does not fit a 24 GB
workstation twice. export/onnx.py then exports it *streamed* (see ``export_member``): the
weights go straight from the torch model to external data files, the torch model is released
before the graphs are loaded, the precision is converted in place and onnxruntime reads the
graphs from disk.

Peak RSS is read from Linux's ``/proc/self/status`` (``VmHWM``) and reset by writing ``5`` to
``/proc/self/clear_refs`` (proc(5)), so each member's export reports its own peak. Where the
reset does not take effect (checked by reading the peak back), an export reports no peak
rather than the whole process's; elsewhere both return None/False.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

__all__ = [
    "LARGE_BYTES",
    "folder_fp32_bytes",
    "fp32_weight_bytes",
    "is_large",
    "peak_rss_bytes",
    "release_freed_memory",
    "reset_peak_rss",
]

#: Float32 weight bytes above which a member is exported streamed (protobuf's 2 GiB limit).
LARGE_BYTES = 2**31

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def fp32_weight_bytes(model: Any) -> int:
    """Bytes of a torch model's parameters and buffers at float32 (4 bytes each)."""
    n = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    return 4 * int(n)


def folder_fp32_bytes(folder: str | Path) -> int:
    """Float32 bytes of the weights in a member folder's ``*.safetensors`` files, from their
    headers (element counts; nothing is loaded)."""
    import json
    import math
    import struct

    total = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return 4 * total


def is_large(model: Any) -> bool:
    """Whether ``model`` is exported streamed (float32 weights over :data:`LARGE_BYTES`)."""
    return fp32_weight_bytes(model) > LARGE_BYTES


def release_freed_memory() -> None:
    """Collect garbage and hand the C heap's free pages back to the OS (glibc ``malloc_trim``).

    After a torch model is released, glibc keeps the freed tensors below its mmap threshold in
    its heap; the next phase of a large export would otherwise run beside them.
    """
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError):
        if name:
            ctypes.CDLL(name).malloc_trim(0)


#: How far the peak may stand above the current RSS right after a reset that took effect
#: (memory another thread freed between the reset and the reading).
_RESET_SLACK_BYTES = 16 * 2**20


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its current RSS; False where it did not take effect.

    Some kernels (sandboxes, emulated ``/proc``) accept the write to ``clear_refs`` and
    ignore it. The peak is therefore read back: a reset took effect when the peak no longer
    stands above the current RSS (by more than what a concurrent free explains). A caller
    that gets False must not report the peak as its own: it is the whole process's.
    """
    try:
        _CLEAR_REFS.write_text("5", encoding="ascii")
    except OSError:
        return False
    hwm, rss = _status_bytes("VmHWM"), _status_bytes("VmRSS")
    return hwm is not None and rss is not None and hwm <= rss + _RESET_SLACK_BYTES


def peak_rss_bytes() -> int | None:
    """This process's peak resident set size in bytes since start or the last reset."""
    return _status_bytes("VmHWM")


def _status_bytes(field: str) -> int | None:
    """One ``kB`` field of ``/proc/self/status`` in bytes; None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in _STATUS.read_text(encoding="ascii").splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return None
