"""bench/RESULTS.md: each benchmark script owns one marked section and rewrites only it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_section"]


def write_section(path: Path, key: str, text: str) -> None:
    """Put ``text`` between ``<!-- key:begin -->`` and ``<!-- key:end -->`` in ``path``
    (replacing what was there; appended when the markers are absent; the file is created)."""
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    section = f"{begin}\n{text.rstrip()}\n{end}"
    body = path.read_text(encoding="utf-8") if path.is_file() else "# Benchmark results\n"
    if begin in body and end in body:
        head, rest = body.split(begin, 1)
        body = head + section + rest.split(end, 1)[1]
    else:
        body = body.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(body, encoding="utf-8")
