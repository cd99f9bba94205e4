"""Prometheus metrics of one sidecar (a registry per app, so two apps never collide).

==========================================  ======================================================
``spotstop_decisions_total``                decisions returned, by ``label`` and ``policy``
``spotstop_fail_closed_total``              fail-closed decisions, by ``reason`` kind (see
                                            :func:`reason_kind`)
``spotstop_stage_seconds``                  histogram per ``stage``: ``parse`` (body → fields, in
                                            the sidecar), ``queue_wait`` (body in → model thread),
                                            ``image_decode`` (on the model thread), the guard's
                                            stages (``decode``, ``score_<member>_<variant>``,
                                            ``decide``, ``log``, ``total``)
``spotstop_http_request_seconds``           histogram per ``route`` and ``status``
``spotstop_queue_depth``                    scenes admitted to the model queue (running + waiting)
``spotstop_queue_capacity``                 the queue's bound (``queue_size``)
``spotstop_queue_rejected_total``           503s without a decision, by ``reason`` (``queue_full``,
                                            ``deadline_exceeded_in_queue``)
``spotstop_decisions_not_logged_total``     scenes answered 503 ``decision_not_logged`` (the log
                                            could not be written within the deadline)
``spotstop_uploads_aborted_total``          bodies that never arrived whole, by ``reason``:
                                            ``upload_timeout`` (408) or ``client_disconnect``
``spotstop_input_refused_total``            4xx answers, by ``code`` (e.g. ``image_truncated``,
                                            ``image_blank``: a frame that shows nothing)
``spotstop_policy_reloads_total``           reloads by ``trigger`` (http, sighup) and ``result``
``spotstop_ready``                          1 when /readyz answers 200
``spotstop_bundle_info``                    1, labelled with ``bundle_id`` and ``policy``
``spotstop_log_writable``                   1 when the decision log takes writes (and the free
                                            space is above the floor)
``spotstop_log_fault``                      1 for the ``kind`` of the log's current fault
                                            (``disk_full``, ``read_only``, ``locked``, ...)
``spotstop_log_write_failures_total``       failed log write attempts, by ``kind``
``spotstop_log_rows_pending``               decisions waiting in memory for the log
``spotstop_log_rows_journal``               decisions waiting in the journal
``spotstop_log_amendments_pending``         fail-closed amendments waiting in memory
``spotstop_log_journal_fault``              1 when the journal cannot be read or written
``spotstop_log_rows_spilled_total``         decisions spilled from memory to the journal
``spotstop_log_rows_imported_total``        decisions imported from the journal into the log
``spotstop_log_rows_archived_total``        decisions retention moved to Parquet archives
``spotstop_log_rows_set_aside_total``       decisions the log can never store (a text with no
                                            UTF-8 encoding, a NaN in the policy's document),
                                            written to the dead letter beside the log instead
``spotstop_log_free_bytes``                 free bytes on the log's file system
``spotstop_log_over_budget``                1 when retention left the log over its budget
==========================================  ======================================================

The ``spotstop_log_*`` values are read from the guard's :class:`LogStatus` when scraped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from spotstop.guard._log_options import LogStatus
from spotstop.guard._log_schema import FAULT_KINDS
from spotstop.guard._record import Decision

__all__ = ["SidecarMetrics", "reason_kind"]

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


def reason_kind(reason: str | None) -> str:
    """A bounded label for a ``Decision.fail_reason`` (free text from the guard).

    ``input``, ``member_unavailable``, ``deadline``, ``scoring``, ``non_finite``,
    ``member_error``, ``fusion``, ``policy``, ``log`` or ``other``.
    """
    if not reason:
        return "other"
    r = reason.lower()
    if r.startswith("input"):
        return "input"
    if r.startswith("deadline exceeded"):
        return "deadline"
    if r.startswith("scoring"):
        return "scoring"
    if r.startswith("member "):
        if "unavailable" in r:
            return "member_unavailable"
        if "non-finite" in r:
            return "non_finite"
        return "member_error"
    for prefix, kind in (("fusion", "fusion"), ("policy", "policy"), ("decision log", "log")):
        if r.startswith(prefix):
            return kind
    return "other"


class SidecarMetrics:
    """The sidecar's collectors, registered in ``registry`` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        self.decisions = Counter(
            "spotstop_decisions", "Decisions returned.", ["label", "policy"], registry=r
        )
        self.fail_closed = Counter(
            "spotstop_fail_closed",
            "Fail-closed UNSAFE decisions, by reason kind.",
            ["reason"],
            registry=r,
        )
        self.stage = Histogram(
            "spotstop_stage_seconds",
            "Latency of each stage of a check.",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.http = Histogram(
            "spotstop_http_request_seconds",
            "HTTP request latency.",
            ["route", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "spotstop_queue_depth", "Scenes in the model queue (running + waiting).", registry=r
        )
        self.queue_capacity = Gauge(
            "spotstop_queue_capacity", "Most scenes the model queue admits.", registry=r
        )
        self.queue_rejected = Counter(
            "spotstop_queue_rejected",
            "Requests answered 503 without a decision.",
            ["reason"],
            registry=r,
        )
        self.not_logged = Counter(
            "spotstop_decisions_not_logged",
            "Scenes answered 503: their decision could not be logged within the deadline.",
            registry=r,
        )
        self.uploads_aborted = Counter(
            "spotstop_uploads_aborted",
            "Request bodies that never arrived whole (upload timeout, client disconnect).",
            ["reason"],
            registry=r,
        )
        self.input_refused = Counter(
            "spotstop_input_refused", "Requests answered 4xx, by error code.", ["code"], registry=r
        )
        self.reloads = Counter(
            "spotstop_policy_reloads", "Policy reloads.", ["trigger", "result"], registry=r
        )
        self.ready = Gauge("spotstop_ready", "1 when the sidecar is ready.", registry=r)
        self.bundle_info = Gauge(
            "spotstop_bundle_info",
            "The bundle and policy in force.",
            ["bundle_id", "policy"],
            registry=r,
        )

    def observe_decisions(self, decisions: Iterable[Decision]) -> None:
        for d in decisions:
            self.decisions.labels(label=d.label, policy=d.policy).inc()
            if d.fail_closed:
                self.fail_closed.labels(reason=reason_kind(d.fail_reason)).inc()
            for key, ms in d.latency_ms.items():
                stage = key[:-3] if key.endswith("_ms") else key
                self.stage.labels(stage=stage).observe(max(0.0, ms) / 1e3)

    def watch_log(self, status: Callable[[], LogStatus]) -> None:
        """Export the decision log's status (read at every scrape)."""
        self.registry.register(_LogCollector(status))

    def set_bundle(self, bundle_id: str, policy: str) -> None:
        self.bundle_info.clear()
        self.bundle_info.labels(bundle_id=bundle_id, policy=policy).set(1)


class _LogCollector:
    """The ``spotstop_log_*`` metrics, from the guard's log status at scrape time."""

    def __init__(self, status: Callable[[], LogStatus]) -> None:
        self._status = status

    def describe(self) -> list[Metric]:
        return []  # no sample at registration time (the guard may still be loading)

    def collect(self) -> Iterator[Metric]:
        st = self._status()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, value=value)

        yield gauge("spotstop_log_writable", "1 when the decision log takes writes.", st.writable)
        fault = GaugeMetricFamily(
            "spotstop_log_fault", "1 for the kind of the log's current fault.", labels=["kind"]
        )
        for kind in FAULT_KINDS:
            fault.add_metric([kind], 1.0 if st.fault == kind else 0.0)
        yield fault
        failures = CounterMetricFamily(
            "spotstop_log_write_failures", "Failed log write attempts, by kind.", labels=["kind"]
        )
        for kind in FAULT_KINDS:
            failures.add_metric([kind], float(st.faults.get(kind, 0)))
        yield failures
        yield gauge("spotstop_log_rows_pending", "Decisions waiting in memory.", st.pending_rows)
        yield gauge(
            "spotstop_log_rows_journal", "Decisions waiting in the journal.", st.journal_rows
        )
        yield gauge(
            "spotstop_log_amendments_pending",
            "Fail-closed amendments waiting in memory.",
            st.pending_amendments,
        )
        yield gauge(
            "spotstop_log_journal_fault",
            "1 when the journal cannot be read or written.",
            st.journal_fault is not None,
        )
        yield counter(
            "spotstop_log_rows_spilled", "Decisions spilled to the journal.", st.spilled_rows
        )
        yield counter(
            "spotstop_log_rows_imported", "Decisions imported from the journal.", st.imported_rows
        )
        yield counter(
            "spotstop_log_rows_archived", "Decisions moved to archives.", st.archived_rows
        )
        yield counter(
            "spotstop_log_rows_set_aside",
            "Decisions the log cannot store, written to its dead letter.",
            st.dead_letter_rows,
        )
        if st.free_bytes is not None:
            yield gauge("spotstop_log_free_bytes", "Free bytes by the log.", st.free_bytes)
        yield gauge("spotstop_log_over_budget", "1 when over the log budget.", st.over_budget)
