//! Durable copies of a node's partitions, in one redb database (`<dir>/meta.redb`).
//!
//! Each batch persists the values its keys have after it, and the partition's position
//! ([`PartMeta`]), in one transaction committed with fsync; a writer thread gathers the
//! batches of all partitions that arrive while it commits (group commit), so concurrent
//! operations share one fsync. Nothing is acknowledged before its commit returns.
//! Loading rebuilds every partition's in-memory copy by scanning its key range.

use super::replica::{Key, PartMeta, Replica};
use crate::ids::PartitionId;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc;
use tokio::sync::oneshot;

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
const PARTS: TableDefinition<u32, &[u8]> = TableDefinition::new("parts");
const FORMAT: TableDefinition<&str, u64> = TableDefinition::new("format");
const FILE: &str = "meta.redb";

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
        {
            let mut f = w.open_table(FORMAT).map_err(err)?;
            let found = f.get("format").map_err(err)?.map(|v| v.value());
            crate::format::check(&path.display().to_string(), found, crate::format::META_STORE_FORMAT)
                .map_err(StoreError)?;
            f.insert("format", crate::format::META_STORE_FORMAT).map_err(err)?;
            w.open_table(RECORDS).map_err(err)?;
            w.open_table(PARTS).map_err(err)?;
        }
        w.commit().map_err(err)?;
        let mut loaded = BTreeMap::new();
        {
            let r = db.begin_read().map_err(err)?;
            let parts = r.open_table(PARTS).map_err(err)?;
            for e in parts.iter().map_err(err)? {
                let (k, v) = e.map_err(err)?;
                let meta: PartMeta = postcard::from_bytes(v.value())
                    .map_err(|e| StoreError(format!("partition {} meta: {e}", k.value())))?;
                loaded.insert(PartitionId(k.value()), (meta, Vec::new()));
            }
            let recs = r.open_table(RECORDS).map_err(err)?;
            for e in recs.iter().map_err(err)? {
                let (k, v) = e.map_err(err)?;
                let (p, key) =
                    Key::decode(k.value()).ok_or_else(|| StoreError(format!("malformed key {:?}", k.value())))?;
                match loaded.get_mut(&p) {
                    Some((_, list)) => list.push((key, v.value().to_vec())),
                    None => return Err(StoreError(format!("record of unknown partition {}", p.0))),
                }
            }
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("meta-store".into())
            .spawn(move || writer(db, rx))
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

fn writer(db: Database, rx: mpsc::Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while let Ok(j) = rx.try_recv() {
            jobs.push(j);
        }
        let started = std::time::Instant::now();
        let result = commit_all(&db, &jobs).map_err(|e| e.to_string());
        let m = shingle_metrics::get();
        m.meta_store_commit_seconds.observe(started.elapsed().as_secs_f64());
        m.meta_store_writes
            .inc_by(jobs.iter().map(|(ws, _)| ws.len() as u64).sum());
        for (_, done) in jobs {
            let _ = done.send(result.clone());
        }
    }
}

fn commit_all(db: &Database, jobs: &[Job]) -> Result<(), StoreError> {
    let w = db.begin_write().map_err(err)?;
    {
        let mut recs = w.open_table(RECORDS).map_err(err)?;
        let mut parts = w.open_table(PARTS).map_err(err)?;
        for write in jobs.iter().flat_map(|(ws, _)| ws) {
            let p = PartitionId(write.partition);
            if write.replace {
                let lo = p.0.to_be_bytes();
                let hi = (u64::from(p.0) + 1).to_be_bytes();
                // Keys of partition p are [p][...] < [p+1]; p+1 may overflow u32, so compare
                // against the 8-byte form's low four bytes only when it does not.
                let keys: Vec<Vec<u8>> = if p.0 == u32::MAX {
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
            for (k, v) in &write.records {
                let key = k.encode(p);
                match v {
                    Some(v) => {
                        recs.insert(key.as_slice(), v.as_slice()).map_err(err)?;
                    }
                    None => {
                        recs.remove(key.as_slice()).map_err(err)?;
                    }
                }
            }
            let meta = postcard::to_stdvec(&write.meta).map_err(err)?;
            parts.insert(p.0, meta.as_slice()).map_err(err)?;
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
        assert!(e.0.contains("on-disk format 7; this build reads formats 1 to 2"), "{e}");
    }
}
