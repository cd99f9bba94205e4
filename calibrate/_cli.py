"""The ``spotstop recalibrate`` and ``spotstop policy`` commands: parsers and handlers.

The parsers take the policy kinds from the registry (``spotstop.guard.policies``), so a new
kind appears here without a change to this file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_policy_parser", "add_recalibrate_parser", "policy_command", "recalibrate_command"]

_JOURNAL_HELP = (
    "the guard's journal (its --journal), read with the log: fail-closed amendments waiting "
    "there are applied, decisions the log lacks counted (default: the log's default journal; "
    "the dead letter beside the log is always read)"
)
_RELOAD_HINT = (
    "A running guard keeps its policy until it reloads: Guard.reload_policy(), or for the "
    "sidecar POST /v1/policy/reload or SIGHUP."
)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The policy kinds' settings given on the command line (None: not given)."""
    return {
        name: getattr(args, name, None)
        for name in (
            "window",
            "min_refs",
            "prior_weight",
            "min_batch",
            "weights",
            "member",
            "first",
            "share",
            "cut",
        )
    }


def recalibrate_command(args: argparse.Namespace) -> int:
    """Fit, write a new version, report; see ``spotstop recalibrate --help``."""
    from spotstop.calibrate._diff import diff_policies
    from spotstop.calibrate._logdata import read_log_for_bundle
    from spotstop.calibrate._recalibrate import Recalibrator
    from spotstop.calibrate._versions import activate_policy_version, write_policy_version
    from spotstop.guard import load_bundle
    from spotstop.guard.policies import load_policy

    bundle = load_bundle(args.bundle, verify=False)
    current = load_policy(bundle.policy_path) if bundle.policy_path.is_file() else None
    data = read_log_for_bundle(
        args.log,
        bundle,
        labels=args.labels,
        since=args.since,
        until=args.until,
        journal=args.journal,
    )
    rec = Recalibrator(
        args.policy,
        alpha=args.alpha,
        delta=args.delta,
        guarantee=args.guarantee,
        refit_fusion=not args.keep_fusion,
        settings=_settings(args),
    ).fit(data, current)
    cfg = rec.to_config()
    report: dict[str, Any] = {"summary": rec.summary()}
    version = None
    if not args.dry_run:
        version = write_policy_version(bundle.path, cfg)
        report["version"] = {"name": version.name, "path": str(version.path)}
    diff = None
    if current is not None:
        diff = diff_policies(current, cfg, data, names=("active", "new"))
    if args.activate and version is not None:
        activate_policy_version(bundle.path, version.number)
        report["activated"] = version.name
    if args.json:
        out = {
            "policy": cfg.to_dict(),
            "version": report.get("version"),
            "activated": report.get("activated"),
            "diff": None if diff is None else diff.to_dict(),
            "pending": data.pending.to_dict(),
        }
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(report["summary"])
    if diff is not None:
        print(diff)
    if version is None:
        print("dry run: nothing written.")
    else:
        print(f"wrote {version.path} ({version.name}); the active policy is unchanged.")
        if args.activate:
            print(f"activated {version.name}: {bundle.policy_path} now holds it. {_RELOAD_HINT}")
        else:
            print(
                f"to make it active: spotstop policy activate {bundle.path} {version.name}, "
                f"then reload. {_RELOAD_HINT}"
            )
    return 0


def _resolve(spec: str, bundle: Path | None) -> tuple[Path, str]:
    from spotstop.calibrate._versions import resolve_policy_version

    p = Path(spec)
    if bundle is not None and not p.is_file():
        if spec == "active":
            from spotstop.calibrate._logdata import CalibrationError
            from spotstop.guard import load_bundle

            active = load_bundle(bundle, verify=False).policy_path
            if not active.is_file():
                raise CalibrationError(
                    f"bundle {bundle} has no active policy ({active} does not exist); fit one "
                    "with `spotstop policy init` or activate a version with `spotstop policy "
                    "activate`."
                )
            return active, "active"
        v = resolve_policy_version(bundle, spec)
        return v.path, v.name
    if not p.is_file():
        from spotstop.calibrate._logdata import CalibrationError

        raise CalibrationError(
            f"policy {spec!r} is not a file; pass a policy.yaml path, or --bundle DIR with a "
            "version name (v0002) or 'active'."
        )
    return p, str(p)


def _policy_init(args: argparse.Namespace) -> int:
    from spotstop.calibrate._pool import fit_pool_policy, pool_scenes
    from spotstop.calibrate._versions import activate_policy_version, write_policy_version

    requests = list(args.request or [])
    if args.requests is not None:
        from spotstop.calibrate._logdata import CalibrationError
        from spotstop.guard.validate import CSV_ENCODING

        try:
            # (utf-8-sig: a byte-order mark from "UTF-8 with BOM" is not the first request's)
            requests += Path(args.requests).read_text(encoding=CSV_ENCODING).splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise CalibrationError(
                f"--requests {args.requests}: cannot read it ({e}); pass a UTF-8 text file "
                "with one request per line."
            ) from e
    from spotstop.guard._image import DEFAULT_MIN_CONTRAST, DEFAULT_MIN_SIDE, check_min_contrast

    contrast = DEFAULT_MIN_CONTRAST if args.min_image_contrast is None else args.min_image_contrast
    contrast = check_min_contrast(contrast, "--min-image-contrast")
    min_side = DEFAULT_MIN_SIDE if args.min_image_side is None else args.min_image_side
    if min_side < 1:
        from spotstop.calibrate._logdata import CalibrationError

        raise CalibrationError(
            f"--min-image-side must be a positive number of pixels; got {min_side}."
        )
    scenes = pool_scenes(args.pool, requests, min_side=min_side, min_contrast=contrast)
    cfg = fit_pool_policy(
        args.bundle,
        scenes,
        kind=args.kind,
        settings=_settings(args),
        device=args.device,
        progress=True,
        min_side=min_side,
        min_contrast=contrast,
    )
    from spotstop.guard import load_bundle

    active = load_bundle(args.bundle, verify=False).policy_path  # the manifest names it
    first = not active.is_file()
    v = write_policy_version(args.bundle, cfg)
    print(f"fitted on {len(scenes)} unlabelled scenes: {cfg.fusion.to_dict()['stats']}")
    budgets = ", ".join(f"{k} {n}" for k, n in cfg.fitted_on["visual_tokens"].items())
    print(f"visual tokens per member (part of bundle {cfg.bundle_id}): {budgets}")
    print(f"frozen cut t0 = {cfg.fitted_on['frozen_t0']:+.4f}; wrote {v.path}")
    if cfg.text_in_scene.detect:
        print(f"text in the scene: kept from the policy in force ({cfg.text_in_scene.to_dict()})")
    if args.activate or first:
        activate_policy_version(args.bundle, v.number)
        print(f"activated {v.name} as {active}. {_RELOAD_HINT}")
    else:
        print(f"not active yet: `spotstop policy activate {args.bundle} {v.name}`.")
    return 0


def policy_command(args: argparse.Namespace) -> int:
    """``spotstop policy diff|list|activate``."""
    from spotstop.calibrate._versions import activate_policy_version, list_policy_versions

    if args.policy_command == "init":
        return _policy_init(args)
    if args.policy_command == "list":
        versions = list_policy_versions(args.bundle)
        if not versions:
            print(f"{args.bundle}: no stored policy versions (policies/ is empty).")
            return 0
        for v in versions:
            print(v)
        if not any(v.active for v in versions):
            print("(policy.yaml matches no stored version)")
        return 0
    if args.policy_command == "activate":
        from spotstop.guard import load_bundle

        v = activate_policy_version(args.bundle, args.policy_version)
        active = load_bundle(args.bundle, verify=False).policy_path
        print(f"activated {v.name} ({v.kind}): {active}. {_RELOAD_HINT}")
        return 0
    # diff
    from spotstop.calibrate._diff import diff_policies
    from spotstop.calibrate._logdata import read_calibration_log

    pa, na = _resolve(args.a, args.bundle)
    pb, nb = _resolve(args.b, args.bundle)
    from spotstop.guard.policies import load_policy

    a, b = load_policy(pa), load_policy(pb)
    data = None
    if args.log is not None:
        data = read_calibration_log(
            args.log,
            bundle_id=b.bundle_id,
            prompt_hash=b.prompt_hash,
            members=list(b.fusion.members),
            labels=args.labels,
            since=args.since,
            until=args.until,
            journal=args.journal,
        )
    diff = diff_policies(a, b, data, names=(na, nb), batch_size=args.batch_size)
    if data is not None and data.pending:
        print(
            "spotstop policy diff: warning: the log does not say every answer the robot got: "
            + data.pending.message(),
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(diff.to_dict(), indent=2, default=str))
    else:
        print(diff)
        if data is None:
            print("  (pass --log LOG for the predicted effect on logged decisions)")
    return 0


def add_recalibrate_parser(sub: Any) -> None:
    """``spotstop recalibrate``: its parser, with the kinds from the policy registry."""
    from spotstop.guard.policies import POLICY_KINDS, policy_class

    p = sub.add_parser(
        "recalibrate",
        help="refit the policy from the decision log and write a new policy version",
        description=(
            "Refit from LOG (the guard's decision log) for --bundle: fusion statistics "
            "(median/IQR per member) and the frozen cut t0 on usable decisions (labels unused), "
            "fused scores recomputed from the logged member scores with the new fusion, the "
            "conformal cut on labelled unsafe decisions (one per situation) with both "
            "guarantees reported, and for a stateful kind its starting state. Writes "
            "<bundle>/policies/policy-vNNNN.yaml (never overwrites) and prints what changed on the "
            "logged data. The active policy.yaml changes only with --activate (or `spotstop "
            "policy activate`). Which kind fits the deployment: `spotstop card LOG`."
        ),
    )
    p.add_argument("log", type=Path, help="the decision log (SQLite), e.g. BUNDLE/decisions.sqlite")
    p.add_argument("--bundle", type=Path, required=True, help="bundle folder")
    p.add_argument(
        "--policy",
        required=True,
        choices=list(POLICY_KINDS),
        help="the policy kind to write: "
        + "; ".join(f"{k}: {policy_class(k).summary}" for k in POLICY_KINDS),
    )
    p.add_argument("--labels", type=Path, default=None, help="labels file (CSV/JSONL)")
    p.add_argument("--journal", type=Path, default=None, help=_JOURNAL_HELP)
    p.add_argument("--alpha", type=float, default=0.1, help="allowed miss rate (default 0.1)")
    p.add_argument(
        "--delta",
        type=float,
        default=0.1,
        help="PAC: allowed share of calibrations with miss rate > alpha (default 0.1)",
    )
    p.add_argument(
        "--guarantee",
        choices=["pac", "marginal"],
        default="pac",
        help="the conformal cut's guarantee (default pac; both are reported)",
    )
    p.add_argument("--since", default=None, help="first decision time (ISO date/time, UTC)")
    p.add_argument("--until", default=None, help="end of the window, exclusive (ISO, UTC)")
    _add_kind_settings(p)
    p.add_argument("--keep-fusion", action="store_true", help="keep the current fusion statistics")
    p.add_argument("--activate", action="store_true", help="make the new version active")
    p.add_argument("--dry-run", action="store_true", help="fit and report; write nothing")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=recalibrate_command)


def _add_kind_settings(p: Any) -> None:
    p.add_argument("--window", type=int, default=None, help="situation: window N (current or 8)")
    p.add_argument(
        "--min-refs", type=int, default=None, help="situation: references k (current or 3)"
    )
    p.add_argument(
        "--prior-weight",
        type=float,
        default=None,
        help="situation: κ pseudo-references at the frozen cut t0 that a situation's mean is "
        "shrunk towards, so that a new situation's first scenes move the cut little (0: the "
        "paper's plain mean; default: fitted from the scores by situation, the log's or the "
        "pool's, at most the window, at every fit: unlike --window it is not carried over "
        "from the current policy; see docs/policies.md)",
    )
    p.add_argument(
        "--min-batch", type=int, default=None, help="batch kinds: min_batch (current or 2)"
    )
    p.add_argument(
        "--weights",
        choices=["equal", "reliance"],
        default=None,
        help="batch: member weights refitted per batch (default equal; reliance runs the "
        "request-only pass)",
    )
    p.add_argument("--member", default=None, help="direct: the member whose own answer decides")
    p.add_argument(
        "--first",
        default=None,
        help="cascade: the member that scores every scene (current or the fusion's first)",
    )
    p.add_argument(
        "--share",
        type=float,
        default=None,
        help="cascade: share of scenes the second member scores; the band is set on the pool "
        "to give it (current or 0.9, the paper's point)",
    )
    p.add_argument(
        "--cut",
        choices=["frozen", "conformal", "situation"],
        default=None,
        help="cascade: the cut it composes with (current or frozen)",
    )


def add_policy_parser(sub: Any) -> None:
    """``spotstop policy init|list|diff|activate``."""
    from spotstop.guard.policies import policy_class, policy_kinds

    p = sub.add_parser(
        "policy",
        help="fit a first policy (init), list, diff and activate policy versions",
        description=(
            "Policy versions live in <bundle>/policies/policy-vNNNN.yaml; <bundle>/policy.yaml "
            "is the active one (a byte copy of one version). A running guard keeps its policy "
            "until Guard.reload_policy() (sidecar: POST /v1/policy/reload or SIGHUP)."
        ),
    )
    ps = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    d = ps.add_parser("diff", help="what changed from A to B and its effect on the logged data")
    d.add_argument("a", help="policy file, or with --bundle a version (v0002) or 'active'")
    d.add_argument("b", help="policy file, or with --bundle a version (v0003) or 'active'")
    d.add_argument("--bundle", type=Path, default=None, help="bundle folder, to name versions")
    d.add_argument("--log", type=Path, default=None, help="decision log for the predicted effect")
    d.add_argument("--labels", type=Path, default=None, help="labels file (CSV/JSONL)")
    d.add_argument("--journal", type=Path, default=None, help=_JOURNAL_HELP)
    d.add_argument(
        "--since",
        default=None,
        help="first decision time (ISO, UTC); a stateful policy's replay runs the decisions "
        "before it first, to fill its state",
    )
    d.add_argument("--until", default=None, help="end of the window, exclusive (ISO, UTC)")
    d.add_argument("--batch-size", type=int, default=None, help="replay batches of N decisions")
    d.add_argument("--json", action="store_true", help="print JSON")
    i = ps.add_parser(
        "init",
        help="fit a first policy on an unlabelled pool of camera frames",
        description=(
            "Score every JPEG/PNG/WebP under --pool with the bundle's members, fit the frozen "
            "reference statistics (median/IQR per member) and the frozen cut t0 on them (no "
            "labels), and write a policy version; it becomes policy.yaml when the bundle has "
            "none yet, or with --activate. Use frames of the deployment itself."
        ),
    )
    i.add_argument("bundle", type=Path, help="bundle folder")
    i.add_argument("--pool", type=Path, required=True, help="folder of unlabelled camera frames")
    i.add_argument(
        "--request",
        action="append",
        help="request text for the pool (repeatable; assigned in turn)",
    )
    i.add_argument("--requests", type=Path, default=None, help="file with one request per line")
    label_free = policy_kinds(label_free=True)
    i.add_argument(
        "--kind",
        choices=list(label_free),
        default="frozen",
        help="policy kind, any fitted without labels: "
        + "; ".join(f"{k}: {policy_class(k).summary}" for k in label_free)
        + " (their fallback is the frozen cut t0)",
    )
    _add_kind_settings(i)
    i.add_argument("--device", default="cpu", help="device for the members' backend")
    i.add_argument(
        "--min-image-side",
        type=int,
        default=None,
        help="the guard's min_image_side: a pool frame smaller than this is refused, as the "
        "guard refuses it (default 32)",
    )
    i.add_argument(
        "--min-image-contrast",
        type=float,
        default=None,
        metavar="LEVELS",
        help="the guard's min_image_contrast: a pool frame that shows nothing (a covered lens, "
        "a blank fill) is refused, as the guard refuses it (default 8; 0: off)",
    )
    i.add_argument("--activate", action="store_true", help="make it the active policy.yaml")
    ls = ps.add_parser("list", help="the stored versions (* = active)")
    ls.add_argument("bundle", type=Path, help="bundle folder")
    a = ps.add_parser("activate", help="make a stored version the active policy.yaml")
    a.add_argument("bundle", type=Path, help="bundle folder")
    a.add_argument("policy_version", metavar="VERSION", help="version number or name, e.g. v0002")
    p.set_defaults(func=policy_command)
