"""GPTQ: weight-only int8/int4 that compensates each weight's rounding error, in MatMulNBits form.

Round-to-nearest (export/nbits.py) rounds every weight on its own. GPTQ (Frantar et al. 2023,
"GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers",
Algorithm 1) quantizes a weight's input rows one at a time and moves each row's rounding
error onto the rows not yet quantized, weighted by the inverse Hessian ``H = 2 XᵀX`` of the
layer's inputs ``X`` on calibration data, so that ``‖X W − X Ŵ‖`` is minimised rather than
``‖W − Ŵ‖``. The result is the same operator, the same bytes and the same dequantization as
round-to-nearest (``MatMulNBits``, symmetric, implicit zero point ``2**(bits-1)``, one float32
scale per block of ``block_size`` input rows and output column): only the codes and scales
differ. A block's scale is set, as onnxruntime's kernel sets it, from the value of largest
magnitude in the block (``scale = v / -2**(bits-1)``), but from the block's weights as GPTQ has
updated them when the block starts (the paper's grouped variant).

Here the weight is in the graph's layout, ``w`` (K, N) with ``y = x @ w``; GPTQ's "columns" are
its K input rows. Options are the paper's: 1 % of the mean diagonal as dampening, lazy batches
of 128 rows, no reordering (so the blocks stay contiguous, as MatMulNBits needs).

It computes in float64 (the Hessian too, :meth:`CalibrationInputs.hessian`), where the paper's
code uses float32: each row's rounding error moves onto every row after it, so in float32 the
last-bit differences of a threaded product (another thread count, another CPU) flipped codes, and
one export of one member gave other weights on another machine (a 512 x 256 layer: 222 codes
differed between 1 and 2 torch threads). In float64 the same export writes the same bytes on any
thread count (``tests/export/test_gptq.py``). A scale is rounded to float32, as the runtime
multiplies by it, before the error it leaves is moved.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from spotstop.guard import Scene

__all__ = [
    "CALIBRATION_SCENES",
    "CALIBRATION_SEED",
    "DAMP",
    "QUANTIZERS",
    "CalibrationInputs",
    "InputRecorder",
    "calibration_set",
    "gptq_nbits",
    "nbits_quantizer_meta",
    "pack_codes",
    "weight_key",
]

#: how export_member chooses int8/int4 codes: GPTQ on calibration inputs, or round to nearest
QUANTIZERS = ("gptq", "rtn")

#: dampening added to H's diagonal, as a share of its mean diagonal (the paper's 1 %)
DAMP = 0.01
#: rows GPTQ quantizes before it moves their errors onto the later rows in one product (the
#: paper's lazy batch; the result is the same up to float rounding)
LAZY_BATCH = 128


def pack_codes(codes: np.ndarray, bits: int, block_size: int) -> np.ndarray:
    """Unsigned codes (N, K_pad) (K_pad a multiple of ``block_size``) → MatMulNBits' ``B_Q``
    (N, k_blocks, block_size * bits / 8) uint8; int4 packs two codes a byte, lower nibble first."""
    n, k_pad = codes.shape
    if k_pad % block_size:
        raise ValueError(f"{k_pad} codes per column is not a multiple of the block {block_size}.")
    c = codes.astype(np.uint8).reshape(n, k_pad // block_size, block_size)
    if bits == 8:
        return np.ascontiguousarray(c)
    if bits == 4:
        return np.ascontiguousarray(c[..., 0::2] | (c[..., 1::2] << 4))
    raise ValueError(f"bits must be 4 or 8; got {bits}.")


def _lazy_batches(k_pad: int, block_size: int) -> list[tuple[int, int]]:
    """GPTQ's lazy batches ``[i1, i2)`` over ``k_pad`` rows: about :data:`LAZY_BATCH` rows, and a
    scale block that starts inside a batch ends inside it (its scale is read from rows that
    every earlier row's error has reached), so blocks of 32 go four to a batch and a block of
    all K rows is cut into batches of 128."""
    if block_size <= LAZY_BATCH:
        step = block_size * (LAZY_BATCH // block_size)
        return [(i, min(i + step, k_pad)) for i in range(0, k_pad, step)]
    return [
        (i, min(i + LAZY_BATCH, b + block_size, k_pad))
        for b in range(0, k_pad, block_size)
        for i in range(b, min(b + block_size, k_pad), LAZY_BATCH)
    ]


def gptq_nbits(
    w: np.ndarray,
    h: np.ndarray,
    bits: int,
    block_size: int = 128,
    damp: float = DAMP,
) -> tuple[np.ndarray, np.ndarray]:
    """``w`` (K, N) and the Hessian ``h`` (K, K) of its inputs → (packed uint8 (N, k_blocks,
    blob), scales float32 (N, k_blocks)): the arrays :func:`spotstop.export.nbits.nbits_blocks`
    returns, chosen by GPTQ. ``h`` is ``XᵀX`` (any positive scale) over calibration inputs;
    an input row no calibration input reached (zero diagonal) is rounded on its own."""
    import torch

    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8; got {bits}.")
    rows, cols = w.shape
    if h.shape != (rows, rows):
        raise ValueError(f"the Hessian is {h.shape}; the weight has {rows} input rows.")
    k_blocks = (rows + block_size - 1) // block_size
    k_pad = k_blocks * block_size
    zp, top = 1 << (bits - 1), (1 << bits) - 1
    # float64 throughout (module doc): GPTQ moves every rounding error onto the rows after it,
    # so a float32 run's last-bit differences between thread counts or CPUs flipped codes
    # GPTQ's columns are the graph weight's input rows: kept as rows here (contiguous updates)
    W = torch.zeros((k_pad, cols), dtype=torch.float64)
    W[:rows] = torch.from_numpy(np.array(w, dtype=np.float64))  # (w may be read-only)
    H = torch.zeros((k_pad, k_pad), dtype=torch.float64)
    H[:rows, :rows] = torch.from_numpy(np.array(h, dtype=np.float64))
    dead = torch.diagonal(H) <= 0
    H[dead, dead] = 1.0  # unreached rows (and the padding): plain rounding, no error moved
    H += damp * torch.mean(torch.diagonal(H)) * torch.eye(k_pad, dtype=torch.float64)
    try:
        L = torch.linalg.cholesky(H)
        del H
        Hinv = torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)
        del L
    except RuntimeError as e:  # torch.linalg.LinAlgError subclasses RuntimeError
        raise ValueError(f"the Hessian is not positive definite after dampening: {e}") from e
    codes = torch.empty(k_pad, cols, dtype=torch.uint8)
    scales = torch.empty(k_blocks, cols, dtype=torch.float32)
    scale = safe = torch.ones(cols, dtype=torch.float64)
    for i1, i2 in _lazy_batches(k_pad, block_size):  # the rows after a batch in one GEMM
        W1 = W[i1:i2]  # a view: the batch's rows, updated in place
        Err1 = torch.empty_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for j in range(i2 - i1):
            i = i1 + j
            if i % block_size == 0:
                # the block's scale, from the value of largest magnitude (onnxruntime's rule),
                # as updated; float32, as the runtime multiplies by it
                blk = W[i : i + block_size]
                idx = blk.abs().argmax(dim=0, keepdim=True)
                s32 = (torch.gather(blk, 0, idx).squeeze(0) / -zp).float()
                scales[i // block_size] = s32
                scale = s32.double()
                safe = torch.where(scale == 0, torch.ones_like(scale), scale)
            x = W1[j]
            # the quotient rounded to float32 first, as onnxruntime's kernel divides
            c = torch.clamp(torch.round((x / safe).float()).double() + zp, 0, top)
            codes[i] = c.to(torch.uint8)
            err = (x - (c - zp) * scale) / Hinv1[j, j]
            W1[j:].addr_(Hinv1[j, j:], err, alpha=-1.0)  # the error onto the batch's next rows
            Err1[j] = err
        if i2 < k_pad:
            W[i2:].addmm_(Hinv[i1:i2, i2:].T, Err1, alpha=-1.0)
    codes[rows:] = 0  # the padding, as onnxruntime's kernel leaves it (never read)
    return pack_codes(codes.T.numpy(), bits, block_size), np.ascontiguousarray(scales.T.numpy())


# -- calibration inputs ----------------------------------------------------------------------

#: generated scenes (export/scenes.py) whose inputs GPTQ minimises the error on; each is
#: scored twice, with its image and request-only, as the guard scores it
CALIBRATION_SCENES = 8
#: their seed: ``spotstop verify-bundle`` scores seed 0, so it never checks on them
CALIBRATION_SEED = 1
#: scenes an export's vision-weight rule measures on (export/mixed.py's
#: ``vision_weight_check``): :func:`calibration_set` of this many (at least the calibration
#: scenes; generated ones begin with them). The largest move over 8 scenes misses the tail: on
#: the trained tiny pair, ``tiny-lfm2_vl``'s 4-bit vision graph moved 8 scenes at most 0.425
#: and 32 scenes 0.973 (bench/RESULTS.md, ``trained-world``)
CHECK_SCENES = 32

_INDEX = "index.json"


def weight_key(w_nk: np.ndarray) -> str:
    """A weight's identity across torch and ONNX: the hash of its float32 values as an
    ``(out, in)`` matrix (torch's ``nn.Linear.weight``; the graph's ``w`` is its transpose)."""
    import hashlib

    a = np.ascontiguousarray(w_nk, dtype=np.float32)
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(a.shape).encode())
    h.update(a.data)
    return h.hexdigest()


class InputRecorder:
    """Writes the input rows of every ``nn.Linear`` of a torch model to files while it runs.

    A context manager: while it is open, each Linear's input (``(..., K)``, as float32 rows) is
    appended to a file in ``folder``, nothing held in memory (a member's Hessians would be
    6 GiB at the real size). Linears that read the same tensor (q/k/v, gate/up) share one file.
    ``stride(n)`` keeps every n-th batch row only: the scoring batch repeats each prompt once
    per answer row, and the repeats add nothing. On exit the index (weight key → file) is
    written for :class:`CalibrationInputs`.
    """

    def __init__(self, model: Any, folder: str | os.PathLike[str]) -> None:
        import torch

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        self._files: dict[str, Any] = {}  # file name -> open handle
        self._rows: dict[str, int] = {}  # file name -> rows written
        self._width: dict[str, int] = {}
        self._file_of: dict[str, str] = {}  # Linear name -> file name
        self._seen: dict[tuple[Any, ...], str] = {}  # one forward's input tensors -> file
        self._stride = 1
        self._handles: list[Any] = []

    @contextlib.contextmanager
    def stride(self, n: int) -> Iterator[None]:
        """Within the block, keep every ``n``-th row of a batched (3-d) input."""
        old, self._stride = self._stride, max(1, int(n))
        try:
            yield
        finally:
            self._stride = old

    def new_pass(self) -> None:
        """Forget which tensors this forward pass has seen (call before each pass)."""
        self._seen.clear()

    def _hook(self, name: str) -> Callable[..., None]:
        def pre(_mod: Any, inputs: tuple[Any, ...]) -> None:
            x = inputs[0]
            if x.dim() == 3 and self._stride > 1:
                x = x[:: self._stride]
            # the same tensor read by several Linears: same storage, shape and contents
            # (inference tensors keep no version counter to tell a reused buffer apart)
            key = (inputs[0].data_ptr(), tuple(inputs[0].shape), float(x.sum()))
            shared = self._seen.get(key)
            if shared is not None:
                self._file_of.setdefault(name, shared)
                return
            fname = self._file_of.setdefault(name, f"x{len(self._file_of):04d}.f32")
            self._seen[key] = fname
            rows = x.detach().reshape(-1, x.shape[-1]).float().contiguous()
            f = self._files.get(fname)
            if f is None:
                f = self._files[fname] = open(self.folder / fname, "ab")  # noqa: SIM115
                self._width[fname] = int(rows.shape[1])
            f.write(rows.numpy().data)
            self._rows[fname] = self._rows.get(fname, 0) + int(rows.shape[0])

        return pre

    def __enter__(self) -> InputRecorder:
        self._handles = [m.register_forward_pre_hook(self._hook(n)) for n, m in self._linears]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        for f in self._files.values():
            f.close()
        index = {}
        for name, mod in self._linears:
            fname = self._file_of.get(name)
            if fname is None or fname not in self._rows:
                continue  # never ran in the scoring pass (e.g. an unused head)
            w = mod.weight.detach().float().numpy()
            index[weight_key(w)] = {
                "file": fname,
                "rows": self._rows[fname],
                "width": self._width[fname],
                "linear": name,
            }
        (self.folder / _INDEX).write_text(json.dumps(index, indent=1), encoding="utf-8")


class CalibrationInputs:
    """The recorded inputs of a member's Linears, by weight (see :class:`InputRecorder`)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.index: dict[str, dict[str, Any]] = json.loads(
            (self.folder / _INDEX).read_text(encoding="utf-8")
        )
        self._cache: tuple[str, np.ndarray] | None = None  # the last Hessian (q, k, v share it)
        self.used = 0
        self.missed = 0

    @property
    def tokens(self) -> int:
        """The most input rows any Linear saw (the decoder's calibration tokens)."""
        return max((int(e["rows"]) for e in self.index.values()), default=0)

    def _entry(self, w_kn: np.ndarray) -> dict[str, Any] | None:
        e = self.index.get(weight_key(np.asarray(w_kn).T))
        if e is None or int(e["width"]) != w_kn.shape[0]:
            return None
        return e

    def _rows(self, e: dict[str, Any]) -> np.ndarray:
        return np.memmap(
            self.folder / e["file"], dtype=np.float32, mode="r", shape=(e["rows"], e["width"])
        )

    def sample(self, w_kn: np.ndarray, limit: int = 2048) -> np.ndarray | None:
        """At most ``limit`` recorded input rows of the Linear whose graph weight is ``w_kn``
        (K, N), evenly strided over every scene and pass (float32, in memory); None when no
        recorded Linear has that weight. What export/int8.py measures each layer's error on."""
        e = self._entry(w_kn)
        if e is None:
            return None
        x = self._rows(e)
        step = max(1, -(-x.shape[0] // int(limit)))
        out = np.array(x[::step], dtype=np.float32)
        del x
        return out

    def absmax(self, w_kn: np.ndarray, chunk_rows: int = 4096) -> np.ndarray | None:
        """Per input channel, the largest ``|x|`` over every recorded input row of the Linear
        whose graph weight is ``w_kn`` (K,): SmoothQuant's activation statistic (export/int8.py);
        None when no recorded Linear has that weight."""
        e = self._entry(w_kn)
        if e is None:
            return None
        x = self._rows(e)
        m = np.zeros(x.shape[1], dtype=np.float32)
        for a in range(0, x.shape[0], chunk_rows):
            np.maximum(m, np.abs(np.asarray(x[a : a + chunk_rows])).max(axis=0), out=m)
        del x
        return m

    def hessian(self, w_kn: np.ndarray, chunk_rows: int = 4096) -> np.ndarray | None:
        """``XᵀX`` (float64) of the inputs of the Linear whose graph weight is ``w_kn`` (K, N);
        None when no recorded Linear has that weight."""
        e = self._entry(w_kn)
        if e is None:
            self.missed += 1
            return None
        self.used += 1
        if self._cache is not None and self._cache[0] == e["file"]:
            return self._cache[1]
        x = self._rows(e)
        h = np.zeros((e["width"], e["width"]), dtype=np.float64)
        for a in range(0, x.shape[0], chunk_rows):
            part = np.asarray(x[a : a + chunk_rows], dtype=np.float64)
            h += part.T @ part  # float64 products: the same sums on any thread count
        del x
        self._cache = (e["file"], h)
        return h


def calibration_set(
    n: int, frames: str | os.PathLike[str] | None = None
) -> tuple[list[Scene], dict[str, Any]]:
    """The scenes an export calibrates on, and what the manifest records of them.

    Without ``frames``: ``n`` generated scenes (export/scenes.py, seed
    :data:`CALIBRATION_SEED`, which ``verify-bundle`` never checks on). With ``frames``, a scene
    table (a CSV of ``image,request`` rows or a ``spotstop world`` table, as ``verify-bundle
    --scene-table`` reads it): ``n`` of its rows drawn without replacement by that seed (all of
    them when it has fewer), so the weights are fitted to the deployment's own frames; the
    manifest records the table's name, sha256, size and the rows drawn."""
    if n < 1:
        raise ValueError(f"calibration_scenes must be at least 1; got {n}.")
    if frames is None:
        from spotstop.export.scenes import demo_scenes

        return demo_scenes(n, seed=CALIBRATION_SEED), {
            "source": "generated",
            "scenes": n,
            "seed": CALIBRATION_SEED,
        }
    from spotstop.guard._scene_table import read_scene_table

    table = read_scene_table(frames)  # GuardError naming the file or row (none: no data rows)
    rng = np.random.default_rng(CALIBRATION_SEED)
    rows = sorted(int(i) for i in rng.choice(len(table), min(n, len(table)), replace=False))
    digest = hashlib.sha256(Path(table.source).read_bytes()).hexdigest()
    return table.scenes(rows), {
        "source": "frames",
        "scenes": len(rows),
        "seed": CALIBRATION_SEED,
        "table": Path(table.source).name,
        "table_sha256": digest,
        "table_rows": len(table),
        "rows": rows,
    }


def nbits_quantizer_meta(
    precision: str, calibration: CalibrationInputs | None, scenes: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``quantizer`` entry of an int8/int4 member's ``spotstop_onnx.yaml``: which method
    chose the codes and, for GPTQ, on what (``scenes``: :func:`calibration_set`'s record)
    and for how many weights."""
    from spotstop.export.precision import get_precision
    from spotstop.export.quant import _spotstop_version

    spec = get_precision(precision)
    meta: dict[str, Any] = {
        "name": "spotstop-gptq" if calibration is not None else "spotstop-rtn",
        "version": _spotstop_version(),
        "method": "gptq" if calibration is not None else "rtn",
        "block_size": spec.block_size,
        "format": f"MatMulNBits (com.microsoft), {spec.nbits}-bit, symmetric, one scale per block",
    }
    if calibration is not None:
        meta["calibration"] = {
            **scenes,
            "tokens": calibration.tokens,
            "damp": DAMP,
        }
        meta["weights"] = {"gptq": calibration.used, "round_to_nearest": calibration.missed}
    return meta
