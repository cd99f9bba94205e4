"""The REAL pair's dimensions on this CPU: export int8/int4 bundles, verify them, time them.

Issue #13 item 4. What a user's workstation does before buying a Jetson: with seeded random
weights at the real dimensions of Qwen3.5-2B and LFM2.5-VL-3B (``jetson/memory_budget.py``'s
recorded configs; TEST WEIGHTS: the scores mean nothing, only time, memory and bytes are
measured), run the product's own commands as a user runs them:

1. ``build``   — each member folder (bf16 safetensors, the tiny pair's test tokenizer) with
   ``spotstop.export.tiny.build_random_member``; skipped when the folder is there.
2. ``export``  — ``spotstop export --member Q --member L --precision P --json`` per precision
   (int8, int4): the members are large (float32 weights over 2 GiB), so the export runs
   streamed (export/memory.py); wall time of the command, and per member the seconds and
   peak RSS the export reports. When the pair's export fails (a member beyond its
   tolerance: no bundle is written), each member is exported alone, so one that passes still
   has a bundle to verify and time; the pair's failure stays in the report.
3. ``verify``  — ``spotstop verify-bundle BUNDLE --json`` per bundle this run's export wrote:
   every member's score against its torch reference at the precision's tolerance
   (export/configs.py).
4. ``latency`` — per member, on the same generated scenes, one scene per call after a
   warm-up call: torch eager fp32 (the member folder, ``backend="torch"``) against
   onnxruntime int8 and int4 (the bundles), each in its own process, measured in this run.

Each step runs in a child process; its peak RSS is the child's (``os.wait4``). Results
accumulate in ``WORK/real_pair.json`` (a step run again replaces its own figures) and are
rendered into ``bench/RESULTS.md``, with the bundle bytes against ``jetson/memory_budget.py``'s
prediction, in sections a run rewrites only when it measured them: ``cpu-real`` (the header
and the member folders), ``cpu-real-export-PRECISION``, ``cpu-real-verify-PRECISION`` and
``cpu-real-latency``; each table names the command, date and machine that measured it. So an
int4 export run again leaves the int8 figures as they were measured, even when the store is
gone. Only figures this machine measured are written; a step that failed is written with its
error.

    python bench/real_pair.py --work /work/real                      # everything (~1 h here)
    python bench/real_pair.py --work /work/real --steps latency      # one step again

Disk: the two bf16 member folders (10 GiB), the export's float32 temporaries of one member
at a time (up to 12 GiB), and the bundles (int8 ~4.5 GiB, int4 ~3 GiB).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
from _results import write_section  # noqa: E402

STEPS = ("build", "export", "verify", "latency")


def _budget() -> Any:
    """jetson/memory_budget.py (its RECORDED real configs and byte formulas)."""
    spec = importlib.util.spec_from_file_location(
        "memory_budget", ROOT / "jetson" / "memory_budget.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(cmd: list[str], log: Path, timeout_s: float | None = None) -> dict[str, Any]:
    """Run ``cmd``; its wall time, exit status, peak RSS (its own, from wait4) and stdout."""
    t = time.perf_counter()
    with open(log, "ab") as err:
        err.write(f"\n$ {' '.join(cmd)}\n".encode())
        err.flush()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
        assert p.stdout is not None
        out = p.stdout.read()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        except ChildProcessError:  # already reaped
            status, ru = 0, None
        p.returncode = os.waitstatus_to_exitcode(status)
    return {
        "cmd": " ".join(cmd),
        "rc": p.returncode,
        "seconds": time.perf_counter() - t,
        "peak_rss_bytes": int(ru.ru_maxrss) * 1024 if ru else None,
        "stdout": out.decode("utf-8", "replace"),
    }


def _py(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


_BUILD = """
import sys, json, importlib.util
spec = importlib.util.spec_from_file_location("memory_budget", sys.argv[3])
mb = importlib.util.module_from_spec(spec); sys.modules["memory_budget"] = mb; spec.loader.exec_module(mb)
from spotstop.export.tiny import build_random_member
rec = mb.RECORDED[sys.argv[1]]
build_random_member(str(rec["model_type"]), rec, sys.argv[2], seed=0, dtype="bfloat16", device="cpu")
"""

_LATENCY = """
import json, statistics, sys, time
from spotstop.export.scenes import demo_scenes
kind, where, name, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if kind == "torch":
    from spotstop.guard import load_member
    m = load_member(where, name=name, backend="torch", dtype="float32")
else:
    from spotstop.guard._bundle import load_bundle
    from spotstop.guard._member import load_bundle_member
    b = load_bundle(where)
    m = load_bundle_member(b, next(bm for bm in b.members if bm.name == name))
scenes = demo_scenes(n, seed=7)
t = time.perf_counter(); m.score(scenes[:1]); first = time.perf_counter() - t
times, scores, tokens = [], [], []
for s in scenes:
    t = time.perf_counter()
    [r] = m.score([s])
    times.append(time.perf_counter() - t)
    scores.append(r.score); tokens.append(r.n_prompt_tokens)
print(json.dumps({"first_s": first, "times_s": times, "scores": scores, "tokens": tokens}))
"""


def _member_bytes(bundle: Path, name: str) -> int:
    """Bytes of a member's graph files in a bundle (what the device loads)."""
    d = bundle / "members" / name / "onnx"
    if not d.is_dir():
        d = next(p for p in bundle.rglob("onnx") if p.parent.name == name)
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


def _fmt_b(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def step_build(args: argparse.Namespace, res: dict[str, Any], log: Path) -> None:
    mb = _budget()
    out = res.setdefault("build", {})
    for name in mb.RECORDED:
        folder = args.work / name
        if (folder / "config.json").is_file() and not args.rebuild:
            out.setdefault(name, {"note": "folder present; not rebuilt in this run"})
            continue
        r = _run(_py(_BUILD, name, str(folder), str(ROOT / "jetson" / "memory_budget.py")), log)
        out[name] = {k: r[k] for k in ("rc", "seconds", "peak_rss_bytes")}
        out[name]["folder_bytes"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        res["build_run"] = {"run": _stamp(res)}


def _export(
    args: argparse.Namespace, prec: str, names: list[str], bundle: Path, log: Path
) -> dict[str, Any]:
    """``spotstop export`` of ``names`` at ``prec`` into ``bundle``: the command's figures and,
    when it wrote the bundle, each member's seconds, peak RSS and bytes against the budget."""
    mb = _budget()
    cmd = [sys.executable, "-m", "spotstop.cli", "export", "--precision", prec, "--json"]
    cmd += ["--buckets", str(args.bucket), "--trt", "script", "--out", str(bundle)]
    cmd += ["--name", f"real-{'pair' if len(names) > 1 else names[0]}-{prec}"]
    cmd += shlex.split(args.export_args)
    for name in names:
        cmd += ["--member", str(args.work / name)]
    r = _run(cmd, log)
    rec: dict[str, Any] = {k: r[k] for k in ("cmd", "rc", "seconds", "peak_rss_bytes")}
    rec["bundle"] = str(bundle)
    if r["rc"] != 0:
        rec["error"] = _tail(log)
    try:  # a slip here must not lose the export's own figures
        j = _last_json(r["stdout"]) if r["rc"] == 0 else {"members": []}
        rec["bundle_id"] = j.get("bundle_id")
        for m in j["members"]:
            counts = mb.count(m["name"], mb.build_config(m["name"], mb.RECORDED[m["name"]]))
            m["predicted_bytes"] = float(mb.weight_bytes(counts, prec))
            m["file_bytes"] = _member_bytes(bundle, m["name"])
        rec["members"] = j["members"]
    except Exception as ex:
        rec["error"] = f"{type(ex).__name__}: {ex}; stdout: {r['stdout'][-400:]}"
        rec["rc"] = rec["rc"] or -1
    return rec


def step_export(args: argparse.Namespace, res: dict[str, Any], log: Path) -> None:
    """One ``spotstop export`` of the pair per precision. When the pair's export fails (one
    member beyond its tolerance writes no bundle), each member is exported alone, so a member
    that passes still gets its own bundle to verify and time; the pair's failure is kept."""
    names = args.members
    out = res.setdefault("export", {})
    for prec in args.precisions:
        rec = _export(args, prec, names, args.work / f"bundle-{prec}", log)
        if rec["rc"] != 0 and len(names) > 1:
            rec["alone"] = {
                n: _export(args, prec, [n], args.work / f"bundle-{prec}-{n}", log) for n in names
            }
        rec["run"] = _stamp(res)
        out[prec] = rec


def bundles(res: dict[str, Any], prec: str) -> dict[str, str]:
    """member name → the bundle this run's export wrote it into at ``prec`` (the pair's, else
    its own); a member whose export failed is absent. Never a bundle left by an earlier run."""
    e = res.get("export", {}).get(prec, {})
    if e.get("rc") == 0:
        return {m["name"]: e["bundle"] for m in e.get("members", []) if e.get("bundle")}
    return {
        n: a["bundle"]
        for n, a in e.get("alone", {}).items()
        if a.get("rc") == 0 and a.get("members") and a.get("bundle")
    }


def step_verify(args: argparse.Namespace, res: dict[str, Any], log: Path) -> None:
    out = res.setdefault("verify", {})
    for prec in args.precisions:
        written = sorted(set(bundles(res, prec).values()))
        if not written:
            out[prec] = {
                "rc": None,
                "error": "no bundle: its export failed (see the export table)",
                "run": _stamp(res),
            }
            continue
        runs = []
        for bundle in written:
            cmd = [sys.executable, "-m", "spotstop.cli", "verify-bundle", bundle, "--json"]
            cmd += ["--scenes", str(args.verify_scenes)]
            r = _run(cmd, log)
            rec: dict[str, Any] = {k: r[k] for k in ("cmd", "rc", "seconds", "peak_rss_bytes")}
            try:
                rec["result"] = _last_json(r["stdout"])
            except json.JSONDecodeError:
                rec["error"] = _tail(log)
            runs.append(rec)
        out[prec] = {**runs[0]} if len(runs) == 1 else {"runs": runs}
        out[prec]["run"] = _stamp(res)


def step_latency(args: argparse.Namespace, res: dict[str, Any], log: Path) -> None:
    out: dict[str, Any] = {}
    for name in args.members:
        runs: list[tuple[str, str, str | None]] = [
            ("torch eager fp32", "torch", str(args.work / name))
        ]
        runs += [(f"onnxruntime {p}", "onnx", bundles(res, p).get(name)) for p in args.precisions]
        for label, kind, where in runs:
            if where is None:
                out.setdefault(name, {})[label] = {
                    "rc": None,
                    "error": "no bundle: this member's export failed validation at this precision",
                }
                continue
            r = _run(_py(_LATENCY, kind, where, name, str(args.scenes)), log)
            rec: dict[str, Any] = {"rc": r["rc"], "peak_rss_bytes": r["peak_rss_bytes"]}
            if r["rc"] == 0:
                rec.update(json.loads(r["stdout"].strip().splitlines()[-1]))
            else:
                rec["error"] = _tail(log)
            out.setdefault(name, {})[label] = rec
    res["latency"] = out
    res["latency_run"] = {"run": _stamp(res)}


def _stamp(res: dict[str, Any]) -> dict[str, Any]:
    """Which command measured a step's figures, when, and on what (its table says so)."""
    return {
        "command": res.get("argv", ""),
        "started": res.get("environment", {}).get("date", "?"),
        "environment": res.get("environment", {}),
        "members": res.get("members"),
    }


def _subset(rec: dict[str, Any]) -> list[str]:
    """The members a step ran on when its run named fewer than all (``--members``): its
    RESULTS.md section is then its own (``…-NAME``), beside the pair's; else []."""
    asked = (rec.get("run") or {}).get("members") or []
    return list(asked) if set(asked) != set(_budget().RECORDED) else []


def _key(base: str, rec: dict[str, Any]) -> str:
    return base + "".join(f"-{m}" for m in _subset(rec))


def _last_json(text: str) -> Any:
    """The JSON document a command printed last (an indented object from column 0)."""
    start = text.rfind("\n{\n")
    return json.loads(text[start + 1 :] if start >= 0 else text)


def _error_lines(text: str) -> str:
    """The lines of a failed command's log tail that say why (spotstop's own message and the
    outputs beyond tolerance), without the exporter's warnings."""
    keep = [ln.strip() for ln in text.splitlines() if "spotstop" in ln or "max|Δ|" in ln]
    return "; ".join(keep) if keep else text.strip().replace("\n", " ")[-300:]


def _tail(log: Path, n: int = 600) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-n:]


def _environment() -> dict[str, Any]:
    import importlib.metadata as md

    def v(d: str) -> str:
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            return "absent"

    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "versions": {d: v(d) for d in ("torch", "transformers", "onnx", "onnxruntime")},
    }


def _run_line(res: dict[str, Any], rec: dict[str, Any]) -> str:
    """ "Measured by COMMAND (date); machine and versions": the run a table's figures came from
    (its step's ``run`` stamp; a record from before the stamps: the store's commands)."""
    run = rec.get("run")
    if run:
        env = run.get("environment", {})
        what = f"`python bench/real_pair.py {run['command']}` ({run['started']})"
    else:
        env = res.get("environment", {})
        what = ", ".join(
            f"`python bench/real_pair.py {c}`"
            + (f" ({res['started'][c]})" if c in res.get("started", {}) else "")
            for c in res.get("commands") or [res.get("argv", "")]
        )
    return (
        f"Measured by {what}; {env.get('cores', '?')} cores, {env.get('ram_gib', '?')} GiB RAM"
        + "".join(f", {k} {v}" for k, v in env.get("versions", {}).items())
        + "."
    )


def _export_rows(prec: str, e: dict[str, Any], what: str) -> list[str]:
    """An export command's rows: each member it wrote, then the whole command."""
    rows = [
        f"| {prec} | {m['name']} | {_quantizer(m)} | {m['seconds']:.0f} s | {_fmt_b(m['peak_rss_bytes'])} | "
        f"{'yes' if m['streamed'] else 'no'} | {_fmt_b(m['file_bytes'])} | "
        f"{_fmt_b(m['predicted_bytes'])} | {m['file_bytes'] / m['predicted_bytes']:.3f} |"
        for m in e["members"]
    ]
    rows.append(
        f"| {prec} | **{what}** (whole command) | | **{e['seconds'] / 60:.1f} min** | "
        f"{_fmt_b(e['peak_rss_bytes'])} | | | | |"
    )
    return rows


def sections(res: dict[str, Any]) -> list[tuple[str, str]]:
    """The RESULTS.md sections this store's figures fill, as (marker key, text): the header
    and member folders (``cpu-real``), then one section per precision for the export and the
    verify step, and the latency table. A run writes only the sections it measured, so a later
    run of one precision leaves another precision's figures as they were measured."""
    out: list[tuple[str, str]] = []
    lines = [
        "## The real pair's dimensions on a CPU workstation (issue #13, item 4)",
        "",
        "Seeded random weights at the real dimensions (TEST WEIGHTS: the scores mean nothing);",
        "each table says which `bench/real_pair.py` command measured it, when, and on what.",
        "",
    ]
    build = res.get("build", {})
    if build:
        lines += [
            "### Member folders (bf16 safetensors)",
            "",
            "| member | built in | peak RSS | folder |",
            "|---|---|---|---|",
        ]
        for name, b in build.items():
            if "seconds" in b:
                lines.append(
                    f"| {name} | {b['seconds']:.0f} s | {_fmt_b(b['peak_rss_bytes'])} | {_fmt_b(b['folder_bytes'])} |"
                )
            else:
                lines.append(f"| {name} | {b.get('note', '')} | | |")
        lines += ["", _run_line(res, res.get("build_run", {})), ""]
    out.append(("cpu-real", "\n".join(lines)))

    for prec, e in res.get("export", {}).items():
        who = " and ".join(_subset(e)) + " alone" if _subset(e) else "both members"
        lines = [
            f"### `spotstop export` at {prec} ({who}, one command)",
            "",
            "| precision | member | quantizer | export | peak RSS | streamed | graph files | memory_budget.py predicts | files / predicted |",
            "|---|---|---|---|---|---|---|---|---|",
        ]

        ran = " and ".join(_subset(e)) + " alone" if _subset(e) else "the pair"
        if e.get("rc") == 0:
            lines += _export_rows(prec, e, ran)
        else:
            lines.append(
                f"| {prec} | {ran}: FAILED (exit {e.get('rc')}) | | {e.get('seconds', 0) / 60:.1f} min | | | | | |"
            )
            for name, a in e.get("alone", {}).items():
                if a.get("rc") == 0:
                    lines += _export_rows(prec, a, f"{name} alone")
                else:
                    lines.append(
                        f"| {prec} | {name} alone: FAILED (exit {a.get('rc')}) | | {a.get('seconds', 0) / 60:.1f} min | | | | | |"
                    )
        lines.append("")
        errs = []
        if e.get("rc") != 0:
            errs.append(f"- {prec}, {ran}: {_error_lines(e.get('error', ''))}")
        for name, a in e.get("alone", {}).items():
            if a.get("rc") != 0:
                errs.append(f"- {prec}, {name} alone: {_error_lines(a.get('error', ''))}")
        lines += errs + ([""] if errs else [])
        lines.append(_run_line(res, e))
        out.append((_key(f"cpu-real-export-{prec}", e), "\n".join(lines)))

    for prec, v in res.get("verify", {}).items():
        lines = [
            f"### `spotstop verify-bundle` at {prec} (torch reference fp32 vs the bundle)",
            "",
            "| precision | member | scores | max abs Δs | tolerance | Spearman | min | decisions agree | result |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for one in v.get("runs", [v]):
            r = one.get("result")
            if not r:
                why = one.get("error", "") if one.get("rc") is None else f"exit {one.get('rc')}"
                lines.append(f"| {prec} | FAILED ({why}) | | | | | | | |")
                continue
            for m in r.get("members", []):
                lines.append(
                    f"| {prec} | {m['name']} | {m['n']} | {m['max_abs_diff']:.3f} | {m['tolerance']} | "
                    f"{m['spearman']:.3f} | {m['min_spearman']} | {m['decision_agreement']:.2f} | "
                    f"{'PASS' if m['ok'] else 'FAIL'} |"
                )
            lines.append(
                f"| {prec} | whole command | {one['seconds'] / 60:.1f} min, peak RSS {_fmt_b(one['peak_rss_bytes'])} | | | | | | "
                f"**{'PASS' if r.get('ok') else 'FAIL'}** |"
            )
        lines += ["", _run_line(res, v)]
        out.append((_key(f"cpu-real-verify-{prec}", v), "\n".join(lines)))

    lat = res.get("latency", {})
    if lat:
        lines = [
            "### Per-scene latency on this CPU (same scenes, one scene a call, after one warm-up call)",
            "",
            "| member | runtime | median | min | first call | prompt tokens | process peak RSS | torch eager / this |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, runs in lat.items():
            base = runs.get("torch eager fp32", {}).get("times_s")
            b_med = statistics.median(base) if base else None
            for label, r in runs.items():
                if r.get("rc") != 0:
                    why = r["error"] if r.get("rc") is None else "FAILED"
                    lines.append(f"| {name} | {label} | {why} | | | | | |")
                    continue
                med = statistics.median(r["times_s"])
                ratio = f"{b_med / med:.2f}x" if b_med else "n/a"
                lines.append(
                    f"| {name} | {label} | {med:.2f} s | {min(r['times_s']):.2f} s | {r['first_s']:.1f} s | "
                    f"{int(statistics.median(r['tokens']))} | {_fmt_b(r['peak_rss_bytes'])} | {ratio} |"
                )
        lines.append("")
        n = {len(r["times_s"]) for runs in lat.values() for r in runs.values() if r.get("times_s")}
        lines.append(f"Scenes timed per runtime: {sorted(n)}; one run, a noisy shared machine.")
        lines.append(
            _run_line(res, res.get("latency_run", {}))
            + " On the bundles that run's export wrote; a later export does not change this table."
        )
        out.append((_key("cpu-real-latency", res.get("latency_run", {})), "\n".join(lines)))
    return out


def render(res: dict[str, Any]) -> str:
    """All of this store's sections, as one text (what a run prints at its end)."""
    return "\n\n".join(text for _, text in sections(res)) + "\n"


def _quantizer(m: dict[str, Any]) -> str:
    """How a member's int8/int4 weights were chosen, from its ``export --json`` record (an
    export from before the record carried it rounded to nearest: the only method then)."""
    q = m.get("quantizer")
    if not q:
        return "rtn"
    w = q.get("weights")
    if q.get("method") == "gptq" and w:
        return f"gptq ({w['gptq']} of {w['gptq'] + w['round_to_nearest']} weights)"
    return str(q.get("method", "?"))


def write_results(res: dict[str, Any], path: Path = RESULTS) -> None:
    for key, text in sections(res):
        write_section(path, key, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Steps: " + ", ".join(STEPS) + ". See the module docstring for what each measures.",
    )
    ap.add_argument("--work", type=Path, required=True, help="folder for members, bundles, results")
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated steps (default: all)")
    ap.add_argument(
        "--precisions", default="int8,int4", help="bundle precisions (default int8,int4)"
    )
    ap.add_argument("--bucket", type=int, default=512, help="decoder length bucket (default 512)")
    ap.add_argument("--scenes", type=int, default=4, help="timed scenes per runtime (default 4)")
    ap.add_argument("--verify-scenes", type=int, default=6, help="verify-bundle scenes (default 6)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild member folders that exist")
    ap.add_argument(
        "--members",
        default=None,
        metavar="NAMES",
        help="comma-separated members to export and time (default: both; one alone is exported "
        "as its own bundle)",
    )
    ap.add_argument(
        "--export-args",
        default="",
        metavar="ARGS",
        help="more `spotstop export` options for the export step, as one string (e.g. "
        '"--calibration-scenes 16 --int4-int8 none"); the command in RESULTS.md shows them',
    )
    ap.add_argument("--results", type=Path, default=RESULTS, help="RESULTS.md to update")
    args = ap.parse_args(argv)
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    known = list(_budget().RECORDED)
    args.members = [m.strip() for m in (args.members or ",".join(known)).split(",") if m.strip()]
    if not args.members or set(args.members) - set(known):
        ap.error(f"--members: choose from {known}; got {args.members}")
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        ap.error(f"unknown step(s) {bad}; choose from {list(STEPS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    store = args.work / "real_pair.json"
    res: dict[str, Any] = json.loads(store.read_text()) if store.is_file() else {}
    res["environment"] = _environment()
    res["members"] = args.members
    res.setdefault("commands", [res["argv"]] if res.get("argv") else [])
    res["argv"] = " ".join(sys.argv[1:] if argv is None else argv)
    if res["argv"] not in res["commands"]:
        res["commands"].append(res["argv"])
    res.setdefault("started", {})[res["argv"]] = res["environment"]["date"]  # when each ran
    log = args.work / "real_pair.log"
    for s in steps:
        print(f"[{time.strftime('%H:%M:%S')}] {s} ...", flush=True)
        globals()[f"step_{s}"](args, res, log)
        store.write_text(json.dumps(res, indent=1), encoding="utf-8")
        write_results(res, args.results)
    print(render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
