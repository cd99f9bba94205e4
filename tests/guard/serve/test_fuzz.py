"""Schema-driven fuzzing of the sidecar: schemathesis against /openapi.json of a live server.

Every operation gets its schema examples and generated valid (positive) and invalid
(negative) requests; the run passes when no response is a 5xx and every response matches
the documented status codes, content types, headers and body schemas (schemathesis' default
checks). Bounded (few examples per operation, derandomized, no shrinking, no deadline) to
stay in the fast test run; the members are fast stand-ins, so a generated valid image costs
no model time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from spotstop.guard._types import BUDGET_HEADER, DUE_HEADER  # noqa: E402
from spotstop.guard.serve import load_guard  # noqa: E402

from tests._support.serve import TOKEN, Live, live_server, settings_for, stand_in  # noqa: E402

MAX_EXAMPLES = 12


@pytest.fixture(scope="module", params=["open", "token"])
def fuzz_live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, runtime_bundle: Path
) -> Iterator[Live]:
    bundle = runtime_bundle
    token = TOKEN if request.param == "token" else None
    s = settings_for(bundle, tmp_path_factory.mktemp("fuzz"), warmup=False, token=token)
    with live_server(s, stand_in(load_guard(s))) as srv:
        yield srv


# Where a schema-valid body may still be refused: an image that is valid base64/binary but
# not a decodable picture (JSON Schema cannot say "a JPEG"), a request holding a tokenizer
# control token, a label for a decision id that is not in the log. These answer 422 by
# design, so schemathesis' "positive data acceptance" check does not apply to them; every
# other check (no 5xx, status codes, content types, headers, response schemas, negative
# data rejected) does.
_CONTENT_CHECKED = {"POST /v1/check", "POST /v1/check/batch", "POST /v1/labels"}


def _run(operation: Any, mode: Any, headers: dict[str, str], failures: list[str]) -> None:
    strategy = operation.as_strategy(generation_mode=mode)
    excluded = (
        [schemathesis.checks.positive_data_acceptance]
        if operation.label in _CONTENT_CHECKED
        else []
    )

    @given(case=strategy)
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        case.call_and_validate(headers=headers, excluded_checks=excluded)

    try:
        check()
    except Unsatisfiable:  # negative mode on an operation without inputs: nothing to break
        if mode == schemathesis.GenerationMode.POSITIVE:
            failures.append(f"{operation.label}: no positive case could be generated")
    except Exception as e:  # collect every operation's failures, then report them together
        failures.append(f"{operation.label}: {type(e).__name__}: {e}")


def test_api_has_no_5xx_and_matches_its_schema(fuzz_live: Live) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_live.url}/openapi.json")
    headers = {"Authorization": f"Bearer {TOKEN}"} if fuzz_live.settings.auth else {}
    # The caller's budget and due time are given, not generated: a generated budget of 5e-324
    # s, or a due time in 1970, is spent before the models are reached, and its 503 (no
    # decision; documented) is by design, not a fault. Their refusals and effect are tested
    # in tests/guard/serve/test_deadlines.py.
    headers[BUDGET_HEADER] = "60"
    headers[DUE_HEADER] = f"{time.time() + 3600:.3f}"
    failures: list[str] = []
    n_ops = 0
    for result in schema.get_all_operations():
        op = result.ok()
        n_ops += 1
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            _run(op, mode, headers, failures)
    assert n_ops == 8
    assert not failures, "\n\n".join(failures)
    with fuzz_live.client() as c:  # and it still serves
        assert c.get("/readyz").status_code == 200
        metrics = c.get("/metrics", headers=headers).text
    sent = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("spotstop_http_request_seconds_count")
    )
    assert sent >= 8 * MAX_EXAMPLES // 2  # the fuzzer really talked to the server
