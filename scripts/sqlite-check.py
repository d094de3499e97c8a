#!/usr/bin/env python3
"""SQLite on a mounted filesystem, as users run it on a shared mount: WAL mode and the
rollback journal, synchronous=FULL, transactions of 50 rows with a checkpoint now and
then; every row read back and PRAGMA integrity_check at the end, again after a reopen.

    python3 scripts/sqlite-check.py DIR [TRANSACTIONS]

Exits non-zero (with the SQLite error) on any failure."""
import os
import sqlite3
import sys
import tempfile


def run(directory: str, mode: str, txns: int) -> None:
    path = os.path.join(directory, f"check-{mode}.db")
    for suffix in ("", "-wal", "-shm", "-journal"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA journal_mode={mode}")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, txn INTEGER, body BLOB)")
    db.commit()
    n = 0
    for t in range(txns):
        with db:
            for _ in range(50):
                db.execute("INSERT INTO t (id, txn, body) VALUES (?, ?, ?)", (n, t, os.urandom(16) + bytes([n % 251]) * 600))
                n += 1
            if t % 7 == 3:
                db.execute("DELETE FROM t WHERE id % 13 = ?", (t % 13,))
        if mode == "wal" and t % 20 == 19:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for conn in (db, sqlite3.connect(path)):
        ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if ok != "ok":
            raise SystemExit(f"sqlite {mode}: integrity_check: {ok}")
        rows = conn.execute("SELECT id, body FROM t").fetchall()
        for rid, body in rows:
            if body[16:] != bytes([rid % 251]) * 600:
                raise SystemExit(f"sqlite {mode}: row {rid} holds the wrong bytes")
        conn.close()
    print(f"sqlite {mode}: {txns} transactions, {len(rows)} rows, integrity ok")


def main() -> None:
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    txns = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    work = tempfile.mkdtemp(prefix="sqlite.", dir=directory)
    for mode in ("wal", "delete"):
        run(work, mode, txns)


if __name__ == "__main__":
    try:
        main()
    except sqlite3.Error as e:
        raise SystemExit(f"sqlite: {e}")
