"""Write the committed tiny ONNX bundle that the torch-free runtime tests run on.

``tests/_support/tiny_bundle/`` is the tiny TEST pair (``spotstop tiny --seed 0``: seeded random
weights, its decisions mean nothing) exported at fp32 with one length bucket (256, the
smallest that holds the scoring prompt; ``spotstop export --precision fp32 --buckets 256 --trt
off``), plus a ``policy.yaml`` fitted the way ``spotstop demo`` fits its bundle (a situation
policy over the frozen cut of an unlabelled pool of 8 toy-world scenes). It is about 5.5 MB;
the guard serves it with onnxruntime alone, so the robot's runtime tests (check, serve, the
log, the policy) run on the base install without torch.

Regenerate it (needs the export extra: torch, transformers, onnx) from the repository's root::

    python -m tests._support.make_bundle            # writes tests/_support/tiny_bundle/
    python -m tests._support.make_bundle --out DIR  # somewhere else

``tests/guard/test_committed_bundle.py`` checks that the committed bundle is whole and that it
declares what the current exporter declares, so an exporter change that the bundle does not
follow fails there: run this script and commit the result.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

#: where the committed bundle lives
BUNDLE_DIR = Path(__file__).resolve().parent / "tiny_bundle"
#: the export's settings (the smallest that the runtime tests need)
PRECISION = "fp32"
BUCKETS = "256"
SEED = 0
POOL_SIZE = 8
#: where the tiny pair is built for the export: a fixed folder, because the export records its
#: path (``source`` in the manifest and the members' spotstop_onnx.yaml, and in the graphs), so
#: that the same versions of torch and transformers write the same bytes again
PAIR_DIR = Path(tempfile.gettempdir()) / "spotstop-tiny-bundle" / "tiny"
#: the manifest's ``created``, fixed so that regenerating it changes no byte that matters
CREATED = "2026-01-01T00:00:00+00:00"


def export_args(members: list[Path], out: Path) -> list[str]:
    """``spotstop export``'s arguments for the committed bundle."""
    args = ["export", "--out", str(out), "--precision", PRECISION, "--buckets", BUCKETS]
    for m in members:
        args += ["--member", str(m)]
    return [*args, "--trt", "off"]


def normalize_manifest(bundle: Path) -> None:
    """Give the manifest a fixed creation time (the bundle id does not depend on it)."""
    path = bundle / "manifest.yaml"
    text = path.read_text(encoding="utf-8")
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    manifest = yaml.safe_load(text)
    manifest["created"] = CREATED
    path.write_text(
        header + yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True), encoding="utf-8"
    )


def fit_policy(bundle: Path) -> None:
    """The demo's policy: a situation policy over the frozen cut of an unlabelled pool of
    toy-world scenes (as ``spotstop.cli._demo.make_demo_bundle`` fits it)."""
    from spotstop.calibrate._pool import fit_pool_policy
    from spotstop.cli._demo import _OFFSETS
    from spotstop.export.world import WorldOptions, case_scene, world_cases
    from spotstop.guard.policies import dump_policy

    opts = WorldOptions(rooms=max(1, POOL_SIZE // 4), contrasts_per_room=2, offsets=_OFFSETS)
    pool = [case_scene(c, opts, situation=False) for c in world_cases(SEED + 1000, opts)]
    fit = fit_pool_policy(
        bundle, pool[:POOL_SIZE], kind="situation", settings={"window": 8, "min_refs": 3}
    )
    fitted_on = {
        **dict(fit.fitted_on),
        "what": "unlabelled pool of toy-world scenes (`spotstop world`, TEST pair)",
        "seed": SEED + 1000,
    }
    dump_policy(replace(fit, fitted_on=fitted_on), bundle / "policy.yaml")


def make_bundle(out: Path = BUNDLE_DIR) -> Path:
    """Build the tiny pair in a temporary folder, export it to ``out`` (replaced), fit its
    policy; returns ``out``."""
    from spotstop.cli import main
    from spotstop.export.tiny import TINY_MEMBERS, build_tiny_pair

    if PAIR_DIR.exists():
        shutil.rmtree(PAIR_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        pair = PAIR_DIR
        build_tiny_pair(pair, seed=SEED)
        staged = Path(tmp) / "bundle"
        if main(export_args([pair / m for m in TINY_MEMBERS], staged)) != 0:
            raise SystemExit("spotstop export failed")
        normalize_manifest(staged)
        fit_policy(staged)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(staged, out)
    shutil.rmtree(PAIR_DIR.parent)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=BUNDLE_DIR, help="bundle folder (replaced)")
    args = ap.parse_args()
    out = make_bundle(args.out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{out}: {size / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
