#!/usr/bin/env python3
"""Where an embedded store's write-ahead log goes: its frames counted by the B-tree they belong to.

    scripts/wal_frames.py DATA_DIR

DATA_DIR holds redrive.db and redrive.db-wal, taken from a server killed with -9 while it
worked (a clean stop checkpoints and truncates the log). Give it a large `max_wal_bytes` so
the writer does not rewind the log during the run; SQLite still starts the log over whenever
the background checkpointer has copied all of it, so what is counted is the log's last
generation: the frames written since that restart, a sample of the workload at that moment.

Prints the frames, the commits among them, frames per commit, and the share of the frames per
B-tree (tables and indexes, interior pages apart), by the page numbers of the database as
SQLite's `dbstat` sees it after reading the log (a page freed and reused by another B-tree
counts for the one it belongs to at the end). Works on copies: DATA_DIR is not changed.
Used in docs/PERFORMANCE.md ("The writer's CPU per cycle, 2026-12-07").
"""

import collections
import shutil
import sqlite3
import struct
import sys
import tempfile
from pathlib import Path

USAGE = "usage: scripts/wal_frames.py DATA_DIR"


def frames_of(wal: bytes):
    """(page size, [(page number, commit size or 0)]) of the log's current generation."""
    if len(wal) < 32:
        return 0, []
    _magic, _version, page_size, _ckpt, salt1, salt2, _c1, _c2 = struct.unpack(">8I", wal[:32])
    size = 24 + page_size
    frames = []
    off = 32
    while off + size <= len(wal):
        page, commit, s1, s2 = struct.unpack(">4I", wal[off : off + 16])
        if (s1, s2) != (salt1, salt2):
            break  # a frame of an earlier generation: the current one ends here
        frames.append((page, commit))
        off += size
    return page_size, frames


def main() -> int:
    if len(sys.argv) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    data = Path(sys.argv[1])
    db, wal = data / "redrive.db", data / "redrive.db-wal"
    if not db.exists() or not wal.exists():
        print(f"{data}: no redrive.db with a redrive.db-wal beside it", file=sys.stderr)
        return 2
    page_size, frames = frames_of(wal.read_bytes())
    if not frames:
        print("the log is empty: kill the server while it writes, with a large max_wal_bytes")
        return 1
    commits = sum(1 for _, c in frames if c)
    print(f"page size {page_size}, frames {len(frames)}, commits {commits}, "
          f"frames per commit {len(frames) / max(commits, 1):.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "redrive.db"
        shutil.copy(db, copy)
        shutil.copy(wal, Path(tmp) / "redrive.db-wal")
        conn = sqlite3.connect(copy)
        owner = {
            page: name + (" (interior)" if kind == "internal" else "")
            for name, page, kind in conn.execute("SELECT name, pageno, pagetype FROM dbstat")
        }
        conn.close()
    counts = collections.Counter(owner.get(page, "free or other") for page, _ in frames)
    for name, n in counts.most_common():
        print(f"{n:9d} {100 * n / len(frames):5.1f} %  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
