"""The ``spotstop recalibrate`` and ``spotstop policy`` commands (parsers live in guard/cli.py)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["policy_command", "recalibrate_command"]

_RELOAD_HINT = (
    "A running guard keeps its policy until it reloads: Guard.reload_policy(), or for the "
    "sidecar POST /v1/policy/reload or SIGHUP."
)


def _load_quiet(path: Path) -> Any:
    """Load a policy without reading or writing any live situation state file."""
    from spotstop.guard._policy import load_policy

    with tempfile.TemporaryDirectory() as tmp:
        return load_policy(path, state_file=Path(tmp) / "state.json")


def recalibrate_command(args: argparse.Namespace) -> int:
    """Fit, write a new version, report; see ``spotstop recalibrate --help``."""
    from spotstop.calibrate._diff import diff_policies
    from spotstop.calibrate._logdata import read_log_for_bundle
    from spotstop.calibrate._recalibrate import Recalibrator
    from spotstop.calibrate._versions import activate_policy_version, write_policy_version
    from spotstop.guard._bundle import load_bundle

    bundle = load_bundle(args.bundle, verify=False)
    current = _load_quiet(bundle.policy_path) if bundle.policy_path.is_file() else None
    data = read_log_for_bundle(
        args.log, bundle, labels=args.labels, since=args.since, until=args.until
    )
    rec = Recalibrator(
        args.policy,
        alpha=args.alpha,
        delta=args.delta,
        guarantee=args.guarantee,
        refit_fusion=not args.keep_fusion,
        window=args.window,
        min_refs=args.min_refs,
        min_batch=args.min_batch,
        recommend=not args.no_recommend,
        n_resamples=args.resamples,
        rng=args.seed,
    ).fit(data, current)
    cfg = rec.to_config()
    report: dict[str, Any] = {"summary": rec.summary()}
    version = None
    if not args.dry_run:
        version = write_policy_version(bundle.path, cfg, situation_refs=rec.situation_refs_)
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
            "recommendation": None
            if rec.recommendation_ is None
            else rec.recommendation_.to_dict(),
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
            from spotstop.guard._bundle import load_bundle

            return load_bundle(bundle, verify=False).policy_path, "active"
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
        requests += Path(args.requests).read_text(encoding="utf-8").splitlines()
    scenes = pool_scenes(args.pool, requests)
    cfg = fit_pool_policy(
        args.bundle,
        scenes,
        kind=args.kind,
        window=args.window,
        min_refs=args.min_refs,
        device=args.device,
        progress=True,
    )
    v = write_policy_version(args.bundle, cfg)
    print(f"fitted on {len(scenes)} unlabelled scenes: {cfg.fusion.to_dict()['stats']}")
    print(f"frozen cut t0 = {cfg.fitted_on['frozen_t0']:+.4f}; wrote {v.path}")
    first = not (Path(args.bundle) / "policy.yaml").is_file()
    if args.activate or first:
        activate_policy_version(args.bundle, v.number)
        print(f"activated {v.name} as {Path(args.bundle) / 'policy.yaml'}. {_RELOAD_HINT}")
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
        v = activate_policy_version(args.bundle, args.policy_version)
        print(f"activated {v.name} ({v.kind}): {Path(args.bundle) / 'policy.yaml'}. {_RELOAD_HINT}")
        return 0
    # diff
    from spotstop.calibrate._diff import diff_policies
    from spotstop.calibrate._logdata import read_log

    pa, na = _resolve(args.a, args.bundle)
    pb, nb = _resolve(args.b, args.bundle)
    a, b = _load_quiet(pa), _load_quiet(pb)
    data = None
    if args.log is not None:
        data = read_log(
            args.log,
            bundle_id=b.bundle_id,
            prompt_hash=b.prompt_hash,
            members=list(b.fusion.members),
            labels=args.labels,
            since=args.since,
            until=args.until,
        )
    diff = diff_policies(a, b, data, names=(na, nb), batch_size=args.batch_size)
    if args.json:
        print(json.dumps(diff.to_dict(), indent=2, default=str))
    else:
        print(diff)
        if data is None:
            print("  (pass --log LOG for the predicted effect on logged decisions)")
    return 0
