"""The torch reference backend's output layer: float32 arithmetic without a float32 copy of it.

A bf16 or fp16 member's scores must be what ``h @ W.float().T`` gives (the scoring rule in
float32, as the exported graphs compute it), while the backend turns only the rows it reads into
float32: the answers' rows at the shared first position, and the vocabulary a chunk at a time
for a continuation read. A float32 copy of the whole layer is 2 GiB for Qwen3.5-2B's 248K x 2048,
more than an 8 GB Jetson can spare beside the member.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def test_logits_in_chunks_equal_the_whole_float32_product(monkeypatch: pytest.MonkeyPatch) -> None:
    from spotstop.guard.backends import _torch

    monkeypatch.setattr(_torch, "_HEAD_CHUNK", 7)  # 50 rows: 7 full chunks and a short one
    g = torch.Generator().manual_seed(0)
    h = torch.randn(16, generator=g)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        w = torch.randn(50, 16, generator=g).to(dtype)
        got = _torch._logits(h, w)
        assert got.dtype == torch.float32 and got.shape == (50,)
        want = (h.double() @ w.double().T).float()  # the float32 rule, computed in float64
        # a dot product of 16 float32 terms of size ~4: rounding well under 1e-5
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-5)


def test_logits_keep_the_graph_for_training() -> None:
    """The trained pair learns through this rule: gradients reach the hidden state."""
    from spotstop.guard.backends._torch import _logits

    h = torch.randn(8, requires_grad=True)
    w = torch.randn(20, 8).to(torch.bfloat16)
    torch.log_softmax(_logits(h, w), dim=-1)[3].backward()
    assert h.grad is not None and torch.isfinite(h.grad).all()


def _reference_score(hidden: Any, w: Any, plan: Any, i: int, pos0: int) -> float:
    """The rule for prompt ``i`` in float64: the answers' first tokens by their logits at the
    shared position (a difference of logits), each later token by its log-softmax."""
    n_rows = len(plan.rows)

    def logp(answer: tuple[int, ...]) -> float:
        total = float(hidden[i * n_rows, pos0].double() @ w[answer[0]])
        for r, j, tok in plan.continuation_reads(answer):
            lg = hidden[i * n_rows + r, pos0 + j].double() @ w.T
            total += float(torch.log_softmax(lg, dim=-1)[tok])
        return total

    return logp(plan.unsafe_ids) - logp(plan.safe_ids)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_member_scores_follow_the_float32_rule(tiny_pair: Path, dtype: str) -> None:
    """Each tiny member's scores equal an independent computation of the rule from the same
    forward pass, in float64."""
    from spotstop.guard import load_member
    from spotstop.guard._member import Member

    reads_seen = 0
    for folder in sorted(p for p in tiny_pair.iterdir() if p.is_dir()):
        m: Any = load_member(folder, backend="torch", dtype=dtype)
        assert isinstance(m, Member)
        be, plan = m.backend, m.encoder.plan
        requests = ("open the door", "pour the water onto the wire")
        prompts = [m.encoder.prompt_ids(r, None) for r in requests]
        got = be.score(prompts, None, plan)
        with torch.inference_mode():
            hidden = be.plan_hidden_states(prompts, None, plan)
            w = be._head_weight.double()
            want = [_reference_score(hidden, w, plan, i, len(p) - 1) for i, p in enumerate(prompts)]
        reads_seen += len(plan.continuation_reads(plan.unsafe_ids))
        reads_seen += len(plan.continuation_reads(plan.safe_ids))
        # float32 arithmetic against float64: logits of size ~10 over a width of 64
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert reads_seen > 0, "no member's answers have a continuation token: the test reads nothing"


_Tensor: Any = torch.Tensor


class _OneCopyWatch(_Tensor):
    """The output layer, refusing to be turned into another dtype whole (its row count)."""

    rows = 0

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        converts = (torch.Tensor.float, torch.Tensor.to, torch.Tensor.double, torch.Tensor.half)
        if func in converts and args and getattr(args[0], "shape", (0,))[0] == cls.rows:
            raise AssertionError(f"the whole output layer ({cls.rows} rows) was converted")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_bf16_output_layer_is_never_converted_whole(
    tiny_pair: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory point of the rule: scoring reads a bf16 layer's rows in float32 without a
    float32 copy of all of it (the test would pass on numbers alone with such a copy)."""
    from spotstop.guard import load_member
    from spotstop.guard.backends import _torch

    folder = next(p for p in sorted(tiny_pair.iterdir()) if p.is_dir())
    m: Any = load_member(folder, backend="torch", dtype="bfloat16")
    be, plan = m.backend, m.encoder.plan
    prompts = [m.encoder.prompt_ids("open the door", None)]
    want = be.score(prompts, None, plan)
    monkeypatch.setattr(_OneCopyWatch, "rows", int(be._head_weight.shape[0]))
    monkeypatch.setattr(_torch, "_HEAD_CHUNK", max(1, _OneCopyWatch.rows // 3))
    monkeypatch.setattr(be, "_head_weight", be._head_weight.as_subclass(_OneCopyWatch))
    got = be.score(prompts, None, plan)
    np.testing.assert_array_equal(np.asarray(got, dtype=float), np.asarray(want, dtype=float))
    with pytest.raises(AssertionError, match="was converted"):  # the watch itself works
        be._head_weight.float()
