"""Request and response bodies of the sidecar (pydantic models; they make /openapi.json).

Request models are strict: no type coercion (``"1"`` is not an int), unknown fields are
refused, and FastAPI validates them before a route runs; the sidecar's handler turns
pydantic's errors into its own error body (:class:`ErrorOut`), naming the field. The text
fields follow the same rules as the multipart form and the path
(:func:`~spotstop.guard.serve._parse.check_text`,
:func:`~spotstop.guard.serve._parse.check_situation_id`), raised with the sidecar's codes
(``empty_field``, ``invalid_value``). Limits that are settings of the server (text lengths,
scenes per batch, labels per call) are checked by the routes and written into
/openapi.json by the app; every other rule is stated here once.

The decision's fields are declared once, by :class:`spotstop.guard.DecisionRecord`:
:data:`DecisionOut` is built from :func:`~spotstop.guard._record.json_field_types`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model
from pydantic_core import PydanticCustomError
from spotstop.guard._record import Decision, json_field_types
from spotstop.guard.serve._errors import InputError
from spotstop.guard.serve._parse import (
    REQUEST_WHAT,
    SITUATION_ID_PATTERN,
    check_situation_id,
    check_text,
)

__all__ = [
    "BatchOut",
    "BatchRequest",
    "CheckJSON",
    "DecisionOut",
    "ErrorItem",
    "ErrorOut",
    "HealthOut",
    "LabelItem",
    "LabelsOut",
    "LabelsRequest",
    "ReadyOut",
    "ReloadOut",
    "RequestText",
    "SituationId",
    "SituationOut",
]

# A 1×1 PNG, base64: used in examples only.
_PNG_1PX = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4//8/AAX+Av4N70a4AAAAAElFTkSuQmCC"
)
_BASE64_PATTERN = r"^[A-Za-z0-9+/]*={0,2}$"

_STRICT = ConfigDict(extra="forbid", strict=True)


def _rule(check: Callable[[str], object]) -> AfterValidator:
    """A field rule of :mod:`~spotstop.guard.serve._parse` as a pydantic validator whose error
    type is the sidecar's code (``InputError.code``) and whose message is the rule's."""

    def validate(value: str) -> str:
        try:
            check(value)
        except InputError as e:
            raise PydanticCustomError(e.code, "{reason}", {"reason": e.message}) from None
        return value

    return AfterValidator(validate)


#: What the robot was asked to do: not empty nor only whitespace, control or format
#: characters (zero-width, bidi marks, a byte-order mark: the guard's rule). Its length limit
#: (``max_request_chars``) and the members' own check (control tokens) are the route's.
RequestText = Annotated[
    str,
    _rule(lambda v: check_text(v, field_name="request", what=REQUEST_WHAT, visible=True)),
    Field(
        description="What the robot was asked to do (not only whitespace, control or format "
        "characters).",
        json_schema_extra={"minLength": 1},
    ),
]

#: A situation id: not empty, no control characters (:data:`SITUATION_ID_PATTERN`). Its
#: length limit (``max_situation_chars``) is the route's.
SituationId = Annotated[
    str,
    _rule(lambda v: check_situation_id(v, "situation_id")),
    Field(json_schema_extra={"minLength": 1, "pattern": SITUATION_ID_PATTERN}),
]


class CheckJSON(BaseModel):
    """One scene as JSON: the image as standard base64 (RFC 4648, with padding)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "image_base64": _PNG_1PX,
                    "request": "pick up the knife from the counter",
                    "situation_id": "kitchen-1",
                }
            ]
        },
    )

    image_base64: str = Field(
        description="The camera frame (JPEG, PNG or WebP), standard base64 with padding.",
        min_length=1,
        # documented, checked by the server's base64 decoder (error code image_bad_base64)
        json_schema_extra={"pattern": _BASE64_PATTERN},
    )
    request: RequestText
    situation_id: SituationId | None = Field(
        default=None,
        description="Place/task the scene belongs to, for situation recentering.",
    )


class BatchRequest(BaseModel):
    """Several scenes judged in one guard call (one batch per member)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "scenes": [
                        {"image_base64": _PNG_1PX, "request": "open the window"},
                        {
                            "image_base64": _PNG_1PX,
                            "request": "move the pan onto the hot stove",
                            "situation_id": "kitchen-1",
                        },
                    ]
                }
            ]
        },
    )

    scenes: list[CheckJSON] = Field(min_length=1, description="The scenes, in order.")


_DECISION_EXAMPLE = Decision(
    decision_id="5b0e6c0f4c7e4f7c9a3d2b1a0f9e8d7c",
    batch_id="0c1d2e3f405162738495a6b7c8d9e0f1",
    situation_id="kitchen-1",
    request="pick up the knife from the counter",
    image_sha256="9c56cc51b374c3ba189210d5b6d4bf57790d351c96c47c02190ecf1e430635ab",
    width=640,
    height=480,
    n_bytes=48213,
    image_format="JPEG",
    member_scores={"Qwen3.5-2B": 1.9, "LFM2.5-VL-3B": 0.7},
    members_run={"Qwen3.5-2B": True, "LFM2.5-VL-3B": True},
    fused_score=0.84,
    policy_score=0.84,
    threshold=0.12,
    policy="situation",
    policy_kind="situation",
    deciding_kind="situation",  # the situation's own mean set the threshold, not a fallback
    policy_version="v0002+3f9a1c2b",
    fusion_key="7d2e91c04ab35f68",
    label="UNSAFE",
    fail_closed=False,
    detail="mean of 5 earlier scores of situation 'kitchen-1'",
    latency_ms={"decode_ms": 1.2, "total_ms": 61.0, "log_ms": 0.3},
    bundle_id="tiny-demo-1a2b3c4d",
    prompt_hash="9f8e7d6c5b4a",
    time=1796000000.0,
).to_json()

#: The guard's decision as JSON: one field per field of the logged record
#: (:class:`spotstop.guard.DecisionRecord`, which documents each), so the log, the Python
#: ``Decision``, this answer and the client's parser cannot drift apart.
DecisionOut: type[BaseModel] = create_model(
    "DecisionOut",
    __doc__=(
        "The guard's decision, field for field the logged record. ``label`` is SAFE only when "
        "every member scored the scene, the policy said SAFE within the deadline and the "
        "decision was logged; ``fail_closed`` marks an UNSAFE that came from a fault "
        "(``fail_reason`` says which), not from the score. Non-finite numbers are null."
    ),
    __config__=ConfigDict(json_schema_extra={"examples": [_DECISION_EXAMPLE]}),
    **{name: (tp, ...) for name, (tp, _) in json_field_types().items()},  # type: ignore[call-overload]
)


class BatchOut(BaseModel):
    """One decision per scene, in the order of the request."""

    decisions: list[DecisionOut]  # type: ignore[valid-type]  # a model built from the record


class SituationOut(BaseModel):
    """The recentering state of one situation under the current policy."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "situation_id": "kitchen-1",
                    "policy": "situation",
                    "references": [0.3, -0.1, 0.5],
                    "n_references": 3,
                    "rule": "situation",
                    "threshold": 0.123,
                    "min_refs": 3,
                    "window": 8,
                    "prior_weight": 4.5,
                    "prior_threshold": 0.05,
                }
            ]
        }
    )

    situation_id: str
    policy: str
    references: list[float | None]
    n_references: int
    rule: str
    threshold: float | None
    min_refs: int
    window: int
    prior_weight: float
    prior_threshold: float | None


class LabelItem(BaseModel):
    """A reviewer's label for one logged decision."""

    model_config = _STRICT

    decision_id: str = Field(min_length=1, max_length=128)
    label: Literal["safe", "unsafe"]
    contrast_id: str | None = Field(default=None, min_length=1, max_length=256)
    reviewer: str | None = Field(default=None, min_length=1, max_length=256)


class LabelsRequest(BaseModel):
    """Labels to attach; written all together or not at all."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "labels": [
                        {
                            "decision_id": "5b0e6c0f4c7e4f7c9a3d2b1a0f9e8d7c",
                            "label": "unsafe",
                            "contrast_id": "knife-1",
                            "reviewer": "ana",
                        }
                    ]
                }
            ]
        },
    )

    labels: list[LabelItem] = Field(min_length=1)


class LabelsOut(BaseModel):
    written: int = Field(description="How many labels were written (upserted).")


class HealthOut(BaseModel):
    status: Literal["ok"]


class ReadyOut(BaseModel):
    """Readiness: the bundle is loaded, every member loaded and the warm-up scored."""

    ready: bool
    bundle_id: str | None
    policy: str | None
    warmed_up: bool
    reasons: list[str] = Field(description="Why not ready (empty when ready).")


class ReloadOut(BaseModel):
    """The policy now in force."""

    bundle_id: str
    policy: str
    policy_version: str = Field(description="The version id every decision now records.")
    path: str
    fitted_on: dict[str, Any]


class ErrorItem(BaseModel):
    field: str | None = Field(description="Dotted path of the field at fault, or null.")
    message: str
    type: str


class ErrorOut(BaseModel):
    """Every 4xx/5xx body. ``field`` names the request field at fault (e.g. ``image``,
    ``request``, ``scenes[1].image_base64``); ``code`` is stable for programs."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "code": "image_truncated",
                    "message": "image is truncated: ... Send the complete file.",
                    "field": "image",
                    "errors": [
                        {"field": "image", "message": "image is truncated", "type": "truncated"}
                    ],
                }
            ]
        }
    )

    code: str
    message: str
    field: str | None
    errors: list[ErrorItem]
