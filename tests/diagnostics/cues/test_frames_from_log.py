"""A log's stored images are read through the one opening of the log that listed them, each
once (the listing asks the log which are stored; it read every image's bytes to find out).

Each frame's ``load`` opened the log read-only again; a log of an older schema is read through
a private migrated copy, so reading the frames of such a log made one full copy of the log per
image (the shift of a 24-frame schema-4 log: 25 copies).
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics.cues import frames_from_log
from spotstop.guard import DecisionLog, DecisionRecord

from tests._support.cues_fakes import png
from tests._support.records import make_record

_SCHEMA_4 = Path(__file__).parents[2] / "data" / "demo_log_schema4.sqlite"


def _schema4_log_with_images(path: Path) -> list[bytes]:
    """The committed schema-4 log, each decision's image stored (as a guard of then did)."""
    shutil.copyfile(_SCHEMA_4, path)
    images = []
    with sqlite3.connect(path) as c:
        for i, (sha,) in enumerate(c.execute("SELECT image_sha256 FROM decisions").fetchall()):
            data = png(9000 + i, size=(16, 16))
            new = hashlib.sha256(data).hexdigest()
            c.execute("UPDATE decisions SET image_sha256 = ? WHERE image_sha256 = ?", (new, sha))
            c.execute("INSERT INTO images VALUES (?, ?, ?, ?)", (new, data, len(data), 0.0))
            images.append(data)
    c.close()
    return images


def test_the_frames_of_an_older_log_open_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "robot.sqlite"
    images = _schema4_log_with_images(path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    opened: list[Path] = []
    copies: list[Path] = []
    init, snapshot = DecisionLog.__init__, DecisionLog._copy_snapshot

    def counting_init(self: DecisionLog, p: Any, **kw: Any) -> None:
        opened.append(Path(p))
        init(self, p, **kw)

    def counting_snapshot(self: DecisionLog, conn: sqlite3.Connection) -> None:
        copies.append(self.path)
        snapshot(self, conn)

    reads: list[str] = []
    image = DecisionLog.image

    def counting_image(self: DecisionLog, sha256: str) -> bytes | None:
        reads.append(sha256)
        return image(self, sha256)

    monkeypatch.setattr(DecisionLog, "__init__", counting_init)
    monkeypatch.setattr(DecisionLog, "_copy_snapshot", counting_snapshot)
    monkeypatch.setattr(DecisionLog, "image", counting_image)
    frames = frames_from_log(path)
    assert len(frames) == len(images) == 24
    assert reads == []  # the listing asks which are stored (stored_images), reading none
    assert [load() for _, load in frames.items] == images
    assert len(reads) == len(set(reads)) == 24  # each image read once, when its frame loads
    assert opened.count(path) == 1  # not one per frame
    assert copies == [path]  # one private migrated copy for the listing and every image
    frames.close()
    with pytest.raises(DataError, match="were closed"):
        frames.items[0][1]()
    frames.close()  # closing twice is harmless
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_a_guard_writing_the_log_meanwhile_does_not_stop_the_reading(tmp_path: Path) -> None:
    """The log had no writer when the frames listed it (read in place without SQLite's
    locks); a guard that opens and writes it while the frames are read does not fail them."""
    path = tmp_path / "log.sqlite"
    images = [png(i, size=(16, 16)) for i in range(3)]

    def record(i: int, img: bytes) -> DecisionRecord:
        # decided now: a record of 2023 would have its image pruned by the 30-day retention
        return make_record(i, time=time.time(), image_sha256=hashlib.sha256(img).hexdigest())

    with DecisionLog(path, store_images=True) as log:
        for i, img in enumerate(images):
            log.append(record(i, img), img)
    new = png(3, size=(16, 16))
    with frames_from_log(path) as frames:
        read = [frames.items[0][1]()]
        with DecisionLog(path, store_images=True) as guard:
            guard.append(record(3, new), new)
            read.append(frames.items[1][1]())
        read.append(frames.items[2][1]())  # its close wrote the log's file itself
    assert read == images


def test_a_guard_writing_the_log_while_it_is_listed_does_not_stop_the_shift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`spotstop shift --log` beside a guard that writes the log while the frames are listed
    (read in place without SQLite's locks) failed: "cannot read the decision log ...: database
    disk image is malformed" (or "changed while it was read"). It reads the log again, as the
    card does, from a copy no guard changes meanwhile."""
    from spotstop.guard import _reviewed

    path = tmp_path / "log.sqlite"
    flags = {"reassuring": True, "alarming": False}
    with DecisionLog(path) as log:
        log.append_many([make_record(i, cue_flags=flags) for i in range(4)])
    real = _reviewed._read_open
    writes = []

    def guard_writes_meanwhile(opened: DecisionLog, *args: Any, **kwargs: Any) -> Any:
        with DecisionLog(path) as guard:  # `spotstop check`: open, write, close (checkpoint)
            first = 100 * (len(writes) + 1)
            guard.append_many(
                [make_record(first + i, request="r" * 2000, cue_flags=flags) for i in range(8)]
            )
        writes.append(opened._unwatched is not None)
        return real(opened, *args, **kwargs)

    monkeypatch.setattr(_reviewed, "_read_open", guard_writes_meanwhile)
    with frames_from_log(path) as frames:
        assert writes == [True, True]
        assert len(frames) == 4 + 8  # the log as the first guard left it
