"""The group bootstrap's blocks of draws as Ray tasks (``group_bootstrap(ray=...)``, ``--ray``).

Imported only when ``ray=`` asks for it: it imports Ray at the top, so a missing ``ray``
extra raises its ImportError here, which the CLI turns into the install hint.  The engine
(:class:`~spotstop.diagnostics._engine.CurveEngine`, the prepared table) is put once in the
object store; every block of draws (:class:`~spotstop.diagnostics._resample.Block`: its seed
and size) is one task that runs :func:`~spotstop.diagnostics._bootstrap.block_statistics`, as
the local run does, and the blocks' statistics are joined in block order, so the draws equal
the local ones to the bit.  On a cluster every node must run the same spotstop and numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray
from numpy.typing import NDArray
from spotstop.diagnostics._bootstrap import _progress, block_statistics
from spotstop.diagnostics._engine import CurveEngine
from spotstop.diagnostics._resample import Block
from spotstop.guard._batch_ray import connect_ray

__all__ = ["ray_blocks"]


@ray.remote(num_cpus=1)
def _block_task(prep: CurveEngine, block: Block, chunk: int) -> dict[str, NDArray[np.float64]]:
    """One block of draws on a Ray worker (``prep`` comes from the object store)."""
    return block_statistics(prep, block, chunk)


def ray_blocks(
    prep: CurveEngine,
    blocks: tuple[Block, ...],
    chunk: int,
    *,
    address: str | None = None,
    progress: bool = False,
) -> list[dict[str, NDArray[np.float64]]]:
    """The statistics of every block, computed as Ray tasks, in block order.

    ``address``: what :func:`spotstop.guard._batch_ray.connect_ray` connects to (None:
    ``$RAY_ADDRESS`` or a new local Ray; a process already connected stays connected).
    """
    connect_ray(address)
    ref = ray.put(prep)
    futures = [_block_task.remote(ref, b, chunk) for b in blocks]
    bar: Any = _progress(sum(b.n_draws for b in blocks), progress, "group bootstrap (Ray)")
    if bar is not None:
        size = {f: b.n_draws for f, b in zip(futures, blocks, strict=True)}
        pending = list(futures)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            bar.update(sum(size[f] for f in done))
        bar.close()
    return list(ray.get(futures))
