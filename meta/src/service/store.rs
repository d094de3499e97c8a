//! Durable copies of a node's partitions: one redb database (`<dir>/meta.redb`) behind
//! a write-ahead log (`<dir>/meta.wal`, [`super::wal`]).
//!
//! Each batch persists the values its keys have after it, and the partition's position
//! ([`PartMeta`]). A writer thread gathers the batches of all partitions that arrive
//! while it commits (group commit, so concurrent operations share one sync) and makes
//! the group durable as one log frame with one `fdatasync`, then writes it into redb
//! without a sync; past half the log (or after a second idle) a checkpoint commits
//! redb with fsync and starts the log again. A group too large for a frame is itself
//! such a checkpoint. Nothing is acknowledged before its frame or checkpoint is on
//! disk; after a failed write or sync the store refuses every later commit (the node
//! stops serving rather than guess what reached the disk).
//! Opening replays the log's frames after the last checkpoint into redb, then rebuilds
//! every partition's in-memory copy by scanning its key range.

use super::replica::{Key, PartMeta, Replica};
use super::wal::{self, Cursor, LogOp, Place};
use crate::ids::PartitionId;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;
use tokio::sync::oneshot;

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
const PARTS: TableDefinition<u32, &[u8]> = TableDefinition::new("parts");
const FORMAT: TableDefinition<&str, u64> = TableDefinition::new("format");
/// The last log frame a durable redb commit covers, under `"applied"`.
const LOG: TableDefinition<&str, u64> = TableDefinition::new("log");
const FILE: &str = "meta.redb";
const LOG_FILE: &str = "meta.wal";
/// The log's size; a checkpoint comes once half of it is used.
pub const LOG_CAP: u64 = 32 << 20;
/// The log file grows (with zeros, synced once) by this much when a frame needs room,
/// so a frame's `fdatasync` never has to record a new size or new blocks.
const GROW: u64 = 1 << 20;
/// A writer idle this long checkpoints, so a quiet node's log is empty.
const IDLE: Duration = Duration::from_secs(1);

/// Storage failure (the node stops serving the partition rather than guess).
#[derive(Debug, thiserror::Error)]
#[error("metadata store: {0}")]
pub struct StoreError(pub String);

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

/// One partition's writes in a transaction.
#[derive(Debug, Default)]
pub struct Write {
    /// Partition.
    pub partition: u32,
    /// Drop every record of the partition first (an install).
    pub replace: bool,
    /// Keys with their new values (`None`: delete).
    pub records: Vec<(Key, Option<Vec<u8>>)>,
    /// New position.
    pub meta: PartMeta,
}

impl Write {
    /// The writes that persist `keys` of `r` after a batch.
    pub fn batch(p: PartitionId, r: &Replica, keys: &[Key]) -> Write {
        Write {
            partition: p.0,
            replace: false,
            records: keys.iter().map(|k| (k.clone(), r.value(k))).collect(),
            meta: r.meta,
        }
    }

    /// The writes that replace the whole copy.
    pub fn install(p: PartitionId, r: &Replica) -> Write {
        Write {
            partition: p.0,
            replace: true,
            records: r.all_values().into_iter().map(|(k, v)| (k, Some(v))).collect(),
            meta: r.meta,
        }
    }
}

/// Every persisted copy: position and raw records, by partition.
pub type Loaded = BTreeMap<PartitionId, (PartMeta, Vec<(Key, Vec<u8>)>)>;

type Job = (Vec<Write>, oneshot::Sender<Result<(), String>>);

/// The store: a handle to the writer thread and the database.
pub struct MetaStore {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for MetaStore {
    /// Stops the writer after the batches already queued and closes the database.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl MetaStore {
    /// Opens (or creates) the store in `dir` and loads every partition copy.
    pub fn open(dir: &Path) -> Result<(MetaStore, Loaded), StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError(format!("create {}: {e}", dir.display())))?;
        let path = dir.join(FILE);
        let db = Database::create(&path).map_err(|e| StoreError(format!("open {}: {e}", path.display())))?;
        let w = db.begin_write().map_err(err)?;
        let applied = {
            let mut f = w.open_table(FORMAT).map_err(err)?;
            let found = f.get("format").map_err(err)?.map(|v| v.value());
            crate::format::check(&path.display().to_string(), found, crate::format::META_STORE_FORMAT)
                .map_err(StoreError)?;
            f.insert("format", crate::format::META_STORE_FORMAT).map_err(err)?;
            w.open_table(RECORDS).map_err(err)?;
            w.open_table(PARTS).map_err(err)?;
            let log = w.open_table(LOG).map_err(err)?;
            log.get("applied").map_err(err)?.map_or(0, |v| v.value())
        };
        w.commit().map_err(err)?;
        let log = Log::open(dir, &db, applied)?;
        let loaded = load(&db)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("meta-store".into())
            .spawn(move || writer(db, log, rx))
            .map_err(err)?;
        Ok((
            MetaStore {
                tx: Some(tx),
                thread: Some(thread),
            },
            loaded,
        ))
    }

    /// Commits `writes` durably (one transaction, maybe shared with other callers).
    pub async fn commit(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .as_ref()
            .ok_or_else(|| StoreError("store closed".into()))?
            .send((writes, tx))
            .map_err(|_| StoreError("writer thread stopped".into()))?;
        rx.await
            .map_err(|_| StoreError("writer thread stopped".into()))?
            .map_err(StoreError)
    }
}

/// Every partition's persisted position and records.
fn load(db: &Database) -> Result<Loaded, StoreError> {
    let mut loaded = BTreeMap::new();
    let r = db.begin_read().map_err(err)?;
    let parts = r.open_table(PARTS).map_err(err)?;
    for e in parts.iter().map_err(err)? {
        let (k, v) = e.map_err(err)?;
        let meta: PartMeta =
            postcard::from_bytes(v.value()).map_err(|e| StoreError(format!("partition {} meta: {e}", k.value())))?;
        loaded.insert(PartitionId(k.value()), (meta, Vec::new()));
    }
    let recs = r.open_table(RECORDS).map_err(err)?;
    for e in recs.iter().map_err(err)? {
        let (k, v) = e.map_err(err)?;
        let (p, key) = Key::decode(k.value()).ok_or_else(|| StoreError(format!("malformed key {:?}", k.value())))?;
        match loaded.get_mut(&p) {
            Some((_, list)) => list.push((key, v.value().to_vec())),
            None => return Err(StoreError(format!("record of unknown partition {}", p.0))),
        }
    }
    Ok(loaded)
}

/// The log file and where the writer is in it.
struct Log {
    file: File,
    /// The file's length (zeros beyond the frames written).
    len: u64,
    cur: Cursor,
}

impl Log {
    /// Opens (or creates) the log in `dir` and replays its frames after `applied` into
    /// `db` with a checkpoint, so the log starts empty.
    fn open(dir: &Path, db: &Database, applied: u64) -> Result<Log, StoreError> {
        let path = dir.join(LOG_FILE);
        let io = |what: &str, e: std::io::Error| StoreError(format!("{what} {}: {e}", path.display()));
        let existed = path.exists();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io("open", e))?;
        if !existed {
            // The new file's name is durable before any frame in it is trusted.
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io("sync the directory of", e))?;
        }
        let bytes = std::fs::read(&path).map_err(|e| io("read", e))?;
        let found = wal::scan(&bytes, applied).map_err(|e| StoreError(format!("{}: {e}", path.display())))?;
        if !found.groups.is_empty() {
            let ops: Vec<LogOp> = found.groups.into_iter().flatten().collect();
            apply(db, &ops, Durability::Immediate, Some(found.last))?;
        }
        Ok(Log {
            file,
            len: bytes.len() as u64,
            cur: Cursor::new(found.last, LOG_CAP),
        })
    }

    /// Writes frame `f` at `at` and syncs it.
    fn append(&mut self, at: u64, f: &[u8]) -> std::io::Result<()> {
        let end = at + f.len() as u64;
        if end > self.len {
            let grown = end.div_ceil(GROW) * GROW;
            let zeros = vec![0u8; (grown - self.len) as usize];
            self.file.write_all_at(&zeros, self.len)?;
            self.file.sync_all()?;
            self.len = grown;
        }
        self.file.write_all_at(f, at)?;
        self.file.sync_data()
    }
}

fn writer(db: Database, mut log: Log, rx: mpsc::Receiver<Job>) {
    // After a failed write or sync nothing later is acknowledged: what reached the disk
    // is unknown until the log is read again at the next open.
    let mut broken: Option<String> = None;
    loop {
        let first = match rx.recv_timeout(IDLE) {
            Ok(j) => j,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if broken.is_none()
                    && let Some(Place::Checkpoint { applied }) = log.cur.idle()
                    && let Err(e) = checkpoint(&db, &[], applied)
                {
                    broken = Some(e.to_string());
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let mut jobs = vec![first];
        while let Ok(j) = rx.try_recv() {
            jobs.push(j);
        }
        let started = std::time::Instant::now();
        let (groups, dones): (Vec<Vec<Write>>, Vec<_>) = jobs.into_iter().unzip();
        let writes: u64 = groups.iter().map(|ws| ws.len() as u64).sum();
        let mut waiting = Some(dones);
        // The group is answered the moment it is durable: after the log frame's sync,
        // before its writes go into redb (nothing reads them from there until the next
        // open, which replays the log first).
        let mut durable = || answer(waiting.take(), started, writes, &Ok(()));
        let result = match &broken {
            Some(e) => Err(format!("an earlier write failed: {e}")),
            None => commit_all(&db, &mut log, groups.into_iter().flatten(), &mut durable).map_err(|e| e.to_string()),
        };
        if let Err(e) = &result
            && broken.is_none()
        {
            broken = Some(e.clone());
        }
        answer(waiting.take(), started, writes, &result);
    }
    // Closed: leave an empty log behind (a crash instead leaves it to the next open).
    if broken.is_none()
        && let Some(Place::Checkpoint { applied }) = log.cur.idle()
    {
        let _ = checkpoint(&db, &[], applied);
    }
}

/// Answers a group's callers (once: `dones` is taken from the caller's slot) and counts
/// the group's commit time up to that answer.
fn answer(
    dones: Option<Vec<oneshot::Sender<Result<(), String>>>>,
    started: std::time::Instant,
    writes: u64,
    result: &Result<(), String>,
) {
    let Some(dones) = dones else { return };
    let m = shingle_metrics::get();
    m.meta_store_commit_seconds.observe(started.elapsed().as_secs_f64());
    m.meta_store_writes.inc_by(writes);
    for done in dones {
        let _ = done.send(result.clone());
    }
}

/// Makes one group durable — a log frame, or a checkpoint when none fits — calling
/// `durable` as soon as it is, then leaves its writes in redb.
fn commit_all(
    db: &Database,
    log: &mut Log,
    writes: impl Iterator<Item = Write>,
    durable: &mut impl FnMut(),
) -> Result<(), StoreError> {
    let ops = log_ops(writes)?;
    let size: usize = ops.iter().map(op_size).sum();
    let f = if (size as u64) < log.cur.cap() / 2 {
        wal::frame(log.cur.next_seq(), &ops)
    } else {
        None
    };
    match log.cur.place(f.as_ref().map(|f| f.len() as u64)) {
        Place::Append { at, .. } => {
            let f = f.ok_or_else(|| StoreError("a frame was placed without one".into()))?;
            log.append(at, &f).map_err(|e| StoreError(format!("log: {e}")))?;
            durable();
            apply(db, &ops, Durability::None, None)
        }
        Place::Checkpoint { applied } => {
            checkpoint(db, &ops, applied)?;
            durable();
            Ok(())
        }
    }
}

fn checkpoint(db: &Database, ops: &[LogOp], applied: u64) -> Result<(), StoreError> {
    apply(db, ops, Durability::Immediate, Some(applied))?;
    shingle_metrics::get().meta_store_checkpoints.inc();
    Ok(())
}

fn op_size(op: &LogOp) -> usize {
    match op {
        LogOp::Clear(_) => 8,
        LogOp::Put(k, v) => 8 + k.len() + v.len(),
        LogOp::Del(k) | LogOp::Part(_, k) => 8 + k.len(),
    }
}

/// The redb writes of partition writes, in order.
fn log_ops(writes: impl Iterator<Item = Write>) -> Result<Vec<LogOp>, StoreError> {
    let mut ops = Vec::new();
    for write in writes {
        let p = PartitionId(write.partition);
        if write.replace {
            ops.push(LogOp::Clear(p.0));
        }
        for (k, v) in write.records {
            let key = k.encode(p);
            ops.push(match v {
                Some(v) => LogOp::Put(key, v),
                None => LogOp::Del(key),
            });
        }
        ops.push(LogOp::Part(p.0, postcard::to_stdvec(&write.meta).map_err(err)?));
    }
    Ok(ops)
}

/// Writes `ops` into redb in one transaction; `applied`: it is a checkpoint covering
/// the log up to that frame.
fn apply(db: &Database, ops: &[LogOp], durability: Durability, applied: Option<u64>) -> Result<(), StoreError> {
    let mut w = db.begin_write().map_err(err)?;
    w.set_durability(durability).map_err(err)?;
    {
        let mut recs = w.open_table(RECORDS).map_err(err)?;
        let mut parts = w.open_table(PARTS).map_err(err)?;
        for op in ops {
            match op {
                LogOp::Clear(p) => {
                    let lo = p.to_be_bytes();
                    let hi = (u64::from(*p) + 1).to_be_bytes();
                    // Keys of partition p are [p][...] < [p+1]; p+1 may overflow u32, so
                    // compare against the 8-byte form's low four bytes only when it does not.
                    let keys: Vec<Vec<u8>> = if *p == u32::MAX {
                        recs.range(&lo[..]..)
                            .map_err(err)?
                            .filter_map(|e| e.ok().map(|(k, _)| k.value().to_vec()))
                            .collect()
                    } else {
                        let hi = &hi[4..];
                        recs.range(&lo[..]..hi)
                            .map_err(err)?
                            .filter_map(|e| e.ok().map(|(k, _)| k.value().to_vec()))
                            .collect()
                    };
                    for k in keys {
                        recs.remove(k.as_slice()).map_err(err)?;
                    }
                }
                LogOp::Put(k, v) => {
                    recs.insert(k.as_slice(), v.as_slice()).map_err(err)?;
                }
                LogOp::Del(k) => {
                    recs.remove(k.as_slice()).map_err(err)?;
                }
                LogOp::Part(p, meta) => {
                    parts.insert(*p, meta.as_slice()).map_err(err)?;
                }
            }
        }
        if let Some(a) = applied {
            w.open_table(LOG).map_err(err)?.insert("applied", a).map_err(err)?;
        }
    }
    w.commit().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Epoch, Ino};
    use crate::namespace::{DentryVal, FileKind, Mutation};
    use crate::service::wire::PartOp;

    #[tokio::test]
    async fn batches_and_installs_survive_reopen() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = PartitionId(2);
        let mut r = Replica::initial(p, 4, 1);
        {
            let (store, loaded) = MetaStore::open(dir.path()).expect("open");
            assert!(loaded.is_empty());
            let ops = [PartOp::Apply {
                intent: 0,
                step: 0,
                m: Mutation::PutDentry {
                    parent: Ino::ROOT,
                    name: b"f".to_vec(),
                    val: DentryVal {
                        ino: Ino(3),
                        kind: FileKind::File,
                    },
                },
            }];
            let keys = r.apply(&ops);
            r.meta.lsn = 1;
            r.meta.state_epoch = Epoch(4);
            store.commit(vec![Write::batch(p, &r, &keys)]).await.expect("commit");
            // Another partition's install must not touch partition 2.
            let other = Replica::initial(PartitionId(3), 4, 1);
            store
                .commit(vec![Write::install(PartitionId(3), &other)])
                .await
                .expect("install");
        }
        let (_store, loaded) = MetaStore::open(dir.path()).expect("reopen");
        let (meta, recs) = &loaded[&p];
        assert_eq!(meta.lsn, 1);
        assert_eq!(meta.state_epoch, Epoch(4));
        assert_eq!(recs.len(), 1);
        assert!(loaded.contains_key(&PartitionId(3)));
    }

    /// Frames left in the log (a crash after their sync) are replayed at open, once; a
    /// damaged frame followed by a good one stops the open with the offset.
    #[test]
    fn frames_left_in_the_log_are_replayed_and_a_damaged_one_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        drop(MetaStore::open(dir.path()).expect("open"));
        let p = PartitionId(5);
        let mut meta = Replica::initial(p, 4, 1).meta;
        let mut log = Vec::new();
        for seq in 1..=3u64 {
            meta.lsn = seq;
            let key = Key::Inode(Ino(100 + seq)).encode(p);
            let ops = [
                LogOp::Put(key, vec![seq as u8]),
                LogOp::Part(p.0, postcard::to_stdvec(&meta).expect("meta")),
            ];
            log.extend(wal::frame(seq, &ops).expect("frame"));
        }
        let path = dir.path().join(LOG_FILE);
        let mut damaged = log.clone();
        damaged[wal::BLOCK as usize + 30] ^= 0xff;
        std::fs::write(&path, &damaged).expect("write");
        let e = MetaStore::open(dir.path()).err().expect("refused");
        assert!(e.0.contains("log damaged at offset 4096"), "{e}");
        std::fs::write(&path, &log).expect("write");
        for _ in 0..2 {
            // Replayed at the first open; the second finds them covered by its checkpoint.
            let (_store, loaded) = MetaStore::open(dir.path()).expect("reopen");
            let (m, recs) = &loaded[&p];
            assert_eq!(m.lsn, 3);
            assert_eq!(recs.len(), 3);
        }
    }

    #[test]
    fn a_store_of_a_newer_format_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        drop(MetaStore::open(dir.path()).expect("open"));
        {
            let db = Database::create(dir.path().join(FILE)).expect("db");
            let w = db.begin_write().expect("write");
            w.open_table(FORMAT)
                .expect("format")
                .insert("format", 7)
                .expect("insert");
            w.commit().expect("commit");
        }
        let e = MetaStore::open(dir.path()).err().expect("refused");
        assert!(e.0.contains("on-disk format 7; this build reads formats 1 to 3"), "{e}");
    }
}
