//! Durable state of one manager, in one redb database (`<dir>/manager.redb`).
//!
//! Layout:
//!
//! | table        | key              | value                                              |
//! |--------------|------------------|----------------------------------------------------|
//! | `raft_log`   | log index (u64)  | JSON of the openraft `Entry` (its log id inside)   |
//! | `raft_meta`  | `node_id`        | the owner's id, little-endian u64                  |
//! |              | `vote`           | JSON `Vote`                                        |
//! |              | `committed`      | JSON `Option<LogId>`                               |
//! |              | `last_purged`    | JSON `LogId`                                       |
//! |              | `state_machine`  | JSON [`SmState`]: map, last applied id, membership |
//! |              | `snapshot_meta`  | JSON `SnapshotMeta` of the last snapshot           |
//! |              | `snapshot_data`  | its bytes (JSON [`SmState`])                       |
//!
//! Every write is one redb transaction committed with the default (immediate, fsync'd)
//! durability before the call returns, so openraft's contract holds: a vote or log entry
//! is on disk before it is acknowledged to a peer. The state machine is written once per
//! applied batch, in the same file; on restart openraft re-applies any committed entries
//! past it, so a crash between the two loses nothing. Blocking redb calls run on tokio's
//! blocking pool.

use super::types::{ManagerNode, MapResponse, TypeConfig};
use crate::map::{ClusterMap, MapHistory};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::watch;

/// File name of the database inside the manager's directory.
pub(crate) const DB_FILE: &str = "manager.redb";

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

const K_NODE_ID: &str = "node_id";
const K_FORMAT: &str = "format";
const K_VOTE: &str = "vote";
const K_COMMITTED: &str = "committed";
const K_PURGED: &str = "last_purged";
const K_SM: &str = "state_machine";
const K_SNAP_META: &str = "snapshot_meta";
const K_SNAP_DATA: &str = "snapshot_data";

type NodeId = u64;
type StResult<T> = Result<T, StorageError<NodeId>>;

/// Why the database could not be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DbError {
    /// redb failed.
    #[error("manager database: {0}")]
    Redb(String),
    /// A stored value does not decode.
    #[error("corrupt {what} in the manager database: {message}")]
    Corrupt {
        /// Which value.
        what: &'static str,
        /// Decoder message.
        message: String,
    },
    /// Written by a build with a newer on-disk format.
    #[error("{0}")]
    Format(String),
    /// The directory belongs to another manager.
    #[error("manager directory belongs to node {found}, not {expected}")]
    WrongNode {
        /// Id stored in the directory.
        found: u64,
        /// Id this process runs as.
        expected: u64,
    },
    /// The blocking task died.
    #[error("manager storage task failed: {0}")]
    Task(String),
}

macro_rules! redb_err {
    ($($t:ty),*) => {$(
        impl From<$t> for DbError {
            fn from(e: $t) -> Self { DbError::Redb(e.to_string()) }
        }
    )*};
}
redb_err!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

fn decode<T: for<'de> Deserialize<'de>>(what: &'static str, bytes: &[u8]) -> Result<T, DbError> {
    serde_json::from_slice(bytes).map_err(|e| DbError::Corrupt {
        what,
        message: e.to_string(),
    })
}

fn encode<T: Serialize>(what: &'static str, v: &T) -> Result<Vec<u8>, DbError> {
    // Serialising our own types cannot fail short of a bug; report it rather than panic.
    serde_json::to_vec(v).map_err(|e| DbError::Corrupt {
        what,
        message: format!("cannot encode: {e}"),
    })
}

/// Runs `f` against the database on the blocking pool.
async fn blocking<T, F>(db: &Arc<Database>, f: F) -> Result<T, DbError>
where
    T: Send + 'static,
    F: FnOnce(&Database) -> Result<T, DbError> + Send + 'static,
{
    let db = db.clone();
    tokio::task::spawn_blocking(move || f(&db))
        .await
        .map_err(|e| DbError::Task(e.to_string()))?
}

fn read_meta(db: &Database, key: &str) -> Result<Option<Vec<u8>>, DbError> {
    let r = db.begin_read()?;
    let t = r.open_table(META)?;
    Ok(t.get(key)?.map(|v| v.value().to_vec()))
}

fn write_meta(db: &Database, pairs: &[(&str, &[u8])]) -> Result<(), DbError> {
    let txn = db.begin_write()?;
    {
        let mut t = txn.open_table(META)?;
        for (k, v) in pairs {
            t.insert(*k, *v)?;
        }
    }
    txn.commit()?;
    Ok(())
}

/// Opens (or creates) the database in `dir` and checks that it belongs to `node_id`.
pub(crate) fn open(dir: &Path, node_id: u64) -> Result<Arc<Database>, DbError> {
    std::fs::create_dir_all(dir).map_err(|e| DbError::Redb(format!("cannot create {}: {e}", dir.display())))?;
    let db = Database::create(dir.join(DB_FILE))?;
    let txn = db.begin_write()?;
    {
        txn.open_table(LOG)?;
        let mut m = txn.open_table(META)?;
        let found = match m.get(K_FORMAT)?.map(|v| v.value().to_vec()) {
            None => None,
            Some(b) => {
                Some(
                    <[u8; 8]>::try_from(b.as_slice())
                        .map(u64::from_le_bytes)
                        .map_err(|_| DbError::Corrupt {
                            what: "format",
                            message: format!("{} bytes, expected 8", b.len()),
                        })?,
                )
            }
        };
        let what = dir.join(DB_FILE).display().to_string();
        crate::format::check(&what, found, crate::format::MANAGER_STORE_FORMAT).map_err(DbError::Format)?;
        m.insert(K_FORMAT, &crate::format::MANAGER_STORE_FORMAT.to_le_bytes()[..])?;
        let stored = m.get(K_NODE_ID)?.map(|v| v.value().to_vec());
        match stored {
            None => {
                m.insert(K_NODE_ID, &node_id.to_le_bytes()[..])?;
            }
            Some(b) => {
                let found =
                    <[u8; 8]>::try_from(b.as_slice())
                        .map(u64::from_le_bytes)
                        .map_err(|_| DbError::Corrupt {
                            what: "node id",
                            message: format!("{} bytes, expected 8", b.len()),
                        })?;
                if found != node_id {
                    return Err(DbError::WrongNode {
                        found,
                        expected: node_id,
                    });
                }
            }
        }
    }
    txn.commit()?;
    Ok(Arc::new(db))
}

/// The replicated state: the cluster map plus what openraft needs to know about it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SmState {
    /// Id of the last entry applied to `map`.
    pub last_applied: Option<LogId<NodeId>>,
    /// The last membership applied.
    pub membership: StoredMembership<NodeId, ManagerNode>,
    /// The cluster map.
    pub map: ClusterMap,
}

impl SmState {
    /// The state of a manager that has applied nothing yet.
    pub fn initial(map: ClusterMap) -> Self {
        SmState {
            last_applied: None,
            membership: StoredMembership::default(),
            map,
        }
    }
}

/// Loads the persisted state machine, if any was ever written.
pub(crate) fn load_state(db: &Database) -> Result<Option<SmState>, DbError> {
    read_meta(db, K_SM)?.map(|b| decode("state machine", &b)).transpose()
}

fn io_logs(e: &DbError) -> StorageError<NodeId> {
    StorageIOError::write_logs(e).into()
}

fn read_logs(e: &DbError) -> StorageError<NodeId> {
    StorageIOError::read_logs(e).into()
}

/// The Raft log, vote and commit point. Cheap to clone: clones share the database.
#[derive(Clone)]
pub(crate) struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    /// A log store on `db`.
    pub fn new(db: Arc<Database>) -> Self {
        LogStore { db }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StResult<Vec<Entry<TypeConfig>>> {
        let bounds: (Bound<u64>, Bound<u64>) = (range.start_bound().cloned(), range.end_bound().cloned());
        blocking(&self.db, move |db| {
            let r = db.begin_read()?;
            let t = r.open_table(LOG)?;
            let mut out = Vec::new();
            for row in t.range(bounds)? {
                let (k, v) = row?;
                let entry: Entry<TypeConfig> = decode("log entry", v.value())?;
                // The key is the entry's index; anything else means a corrupt log.
                if entry.log_id.index != k.value() {
                    return Err(DbError::Corrupt {
                        what: "log entry",
                        message: format!("entry {} stored under index {}", entry.log_id, k.value()),
                    });
                }
                out.push(entry);
            }
            Ok(out)
        })
        .await
        .map_err(|e| read_logs(&e))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StResult<LogState<TypeConfig>> {
        blocking(&self.db, |db| {
            let purged: Option<LogId<NodeId>> = read_meta(db, K_PURGED)?
                .map(|b| decode("last purged id", &b))
                .transpose()?;
            let r = db.begin_read()?;
            let t = r.open_table(LOG)?;
            let last = match t.last()? {
                Some((_, v)) => Some(decode::<Entry<TypeConfig>>("log entry", v.value())?.log_id),
                None => purged,
            };
            Ok(LogState {
                last_purged_log_id: purged,
                last_log_id: last,
            })
        })
        .await
        .map_err(|e| read_logs(&e))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StResult<()> {
        let v = encode("vote", vote).map_err(|e| StorageIOError::write_vote(&e))?;
        blocking(&self.db, move |db| write_meta(db, &[(K_VOTE, &v)]))
            .await
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> StResult<Option<Vote<NodeId>>> {
        blocking(&self.db, |db| {
            read_meta(db, K_VOTE)?.map(|b| decode("vote", &b)).transpose()
        })
        .await
        .map_err(|e| StorageIOError::read_vote(&e).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StResult<()> {
        let v = encode("committed id", &committed).map_err(|e| io_logs(&e))?;
        blocking(&self.db, move |db| write_meta(db, &[(K_COMMITTED, &v)]))
            .await
            .map_err(|e| io_logs(&e))
    }

    async fn read_committed(&mut self) -> StResult<Option<LogId<NodeId>>> {
        blocking(&self.db, |db| {
            Ok(read_meta(db, K_COMMITTED)?
                .map(|b| decode::<Option<LogId<NodeId>>>("committed id", &b))
                .transpose()?
                .flatten())
        })
        .await
        .map_err(|e| read_logs(&e))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut rows = Vec::new();
        for e in entries {
            rows.push((e.log_id.index, encode("log entry", &e).map_err(|e| io_logs(&e))?));
        }
        let res = blocking(&self.db, move |db| {
            let txn = db.begin_write()?;
            {
                let mut t = txn.open_table(LOG)?;
                for (i, v) in &rows {
                    t.insert(*i, v.as_slice())?;
                }
            }
            txn.commit()?;
            Ok(())
        })
        .await;
        match res {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(io_logs(&e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StResult<()> {
        tracing::debug!(%log_id, "manager log: truncating conflicting entries");
        blocking(&self.db, move |db| {
            let txn = db.begin_write()?;
            {
                let mut t = txn.open_table(LOG)?;
                t.retain_in(log_id.index.., |_, _| false)?;
            }
            txn.commit()?;
            Ok(())
        })
        .await
        .map_err(|e| io_logs(&e))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StResult<()> {
        tracing::debug!(%log_id, "manager log: purging applied entries");
        let v = encode("last purged id", &log_id).map_err(|e| io_logs(&e))?;
        blocking(&self.db, move |db| {
            let txn = db.begin_write()?;
            {
                let mut m = txn.open_table(META)?;
                m.insert(K_PURGED, v.as_slice())?;
                let mut t = txn.open_table(LOG)?;
                t.retain_in(..=log_id.index, |_, _| false)?;
            }
            txn.commit()?;
            Ok(())
        })
        .await
        .map_err(|e| io_logs(&e))
    }
}

/// The state machine: applies committed commands to the map and publishes every change.
pub(crate) struct StateMachine {
    db: Arc<Database>,
    state: SmState,
    map_tx: watch::Sender<ClusterMap>,
    /// Every map applied here, epoch by epoch (the recent ones), for nodes that
    /// learn of several changes at once. In memory: after a restart it starts again.
    history: Arc<parking_lot::Mutex<MapHistory>>,
}

impl StateMachine {
    /// A state machine starting from `state` (loaded or initial), recording the maps it
    /// applies in `history`.
    pub fn new(
        db: Arc<Database>,
        state: SmState,
        map_tx: watch::Sender<ClusterMap>,
        history: Arc<parking_lot::Mutex<MapHistory>>,
    ) -> Self {
        let sm = StateMachine {
            db,
            state,
            map_tx,
            history,
        };
        sm.record();
        sm
    }

    fn record(&self) {
        self.history.lock().record(Arc::new(self.state.map.clone()));
    }

    fn publish(&self) {
        let map = &self.state.map;
        self.map_tx.send_if_modified(|m| {
            if m == map {
                false
            } else {
                *m = map.clone();
                true
            }
        });
    }
}

/// Makes a snapshot id that no other snapshot of this process shares.
fn snapshot_id(last: Option<&LogId<NodeId>>) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = crate::namespace::types::now_ns();
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    match last {
        Some(l) => format!("{}-{}-{nanos}-{seq}", l.leader_id, l.index),
        None => format!("none-{nanos}-{seq}"),
    }
}

fn write_snapshot(db: &Database, meta: &[u8], data: &[u8], state: Option<&[u8]>) -> Result<(), DbError> {
    let mut pairs: Vec<(&str, &[u8])> = vec![(K_SNAP_META, meta), (K_SNAP_DATA, data)];
    if let Some(s) = state {
        pairs.push((K_SM, s));
    }
    write_meta(db, &pairs)
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> StResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, ManagerNode>)> {
        Ok((self.state.last_applied, self.state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StResult<Vec<MapResponse>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        for entry in entries {
            self.state.last_applied = Some(entry.log_id);
            let resp = match entry.payload {
                EntryPayload::Blank => MapResponse::Applied(self.state.map.epoch),
                EntryPayload::Normal(cmd) => {
                    let before = self.state.map.epoch;
                    let r = self.state.map.apply(&cmd);
                    if self.state.map.epoch != before {
                        self.record();
                    }
                    match &r {
                        Ok(epoch) => tracing::debug!(log_id = %entry.log_id, ?epoch, "cluster map command applied"),
                        Err(e) => tracing::debug!(log_id = %entry.log_id, error = %e, "cluster map command refused"),
                    }
                    MapResponse::from(r)
                }
                EntryPayload::Membership(m) => {
                    self.state.membership = StoredMembership::new(Some(entry.log_id), m);
                    MapResponse::Applied(self.state.map.epoch)
                }
            };
            out.push(resp);
        }
        let last = self.state.last_applied;
        let bytes = encode("state machine", &self.state).map_err(|e| StorageIOError::write_state_machine(&e))?;
        blocking(&self.db, move |db| write_meta(db, &[(K_SM, &bytes)]))
            .await
            .map_err(|e| -> StorageError<NodeId> {
                match last {
                    Some(l) => StorageIOError::apply(l, &e).into(),
                    None => StorageIOError::write_state_machine(&e).into(),
                }
            })?;
        self.publish();
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            state: self.state.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, ManagerNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StResult<()> {
        let data = snapshot.into_inner();
        let sig = Some(meta.signature());
        let mut state: SmState =
            decode("snapshot", &data).map_err(|e| StorageIOError::read_snapshot(sig.clone(), &e))?;
        state.last_applied = meta.last_log_id;
        state.membership = meta.last_membership.clone();
        let meta_bytes = encode("snapshot meta", meta).map_err(|e| StorageIOError::write_snapshot(sig.clone(), &e))?;
        let sm_bytes = encode("state machine", &state).map_err(|e| StorageIOError::write_snapshot(sig.clone(), &e))?;
        blocking(&self.db, move |db| {
            write_snapshot(db, &meta_bytes, &data, Some(&sm_bytes))
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(sig, &e))?;
        tracing::info!(snapshot = %meta, epoch = state.map.epoch.0, "manager installed a snapshot of the cluster map");
        self.state = state;
        self.record();
        self.publish();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StResult<Option<Snapshot<TypeConfig>>> {
        let stored = blocking(&self.db, |db| {
            let meta = read_meta(db, K_SNAP_META)?;
            let data = read_meta(db, K_SNAP_DATA)?;
            match (meta, data) {
                (Some(m), Some(d)) => Ok(Some((
                    decode::<SnapshotMeta<NodeId, ManagerNode>>("snapshot meta", &m)?,
                    d,
                ))),
                _ => Ok(None),
            }
        })
        .await
        .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(stored.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Builds a snapshot from a copy of the state taken when openraft asked for a builder.
pub(crate) struct SnapshotBuilder {
    db: Arc<Database>,
    state: SmState,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StResult<Snapshot<TypeConfig>> {
        let meta = SnapshotMeta {
            last_log_id: self.state.last_applied,
            last_membership: self.state.membership.clone(),
            snapshot_id: snapshot_id(self.state.last_applied.as_ref()),
        };
        let sig = Some(meta.signature());
        let data = encode("snapshot", &self.state).map_err(|e| StorageIOError::write_snapshot(sig.clone(), &e))?;
        let meta_bytes = encode("snapshot meta", &meta).map_err(|e| StorageIOError::write_snapshot(sig.clone(), &e))?;
        let stored = data.clone();
        blocking(&self.db, move |db| write_snapshot(db, &meta_bytes, &stored, None))
            .await
            .map_err(|e| StorageIOError::write_snapshot(sig, &e))?;
        tracing::debug!(snapshot = %meta, bytes = data.len(), "manager built a snapshot of the cluster map");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::{StoreBuilder, Suite};

    fn map() -> ClusterMap {
        ClusterMap::new("store-test", 4, 4, 1, 1)
    }

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
        async fn build(&self) -> StResult<(tempfile::TempDir, LogStore, StateMachine)> {
            let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
            let db = open(dir.path(), 0).map_err(|e| StorageIOError::write(&e))?;
            let (tx, _) = watch::channel(map());
            let sm = StateMachine::new(db.clone(), SmState::initial(map()), tx, Default::default());
            Ok((dir, LogStore::new(db), sm))
        }
    }

    /// openraft's own conformance suite for log stores and state machines.
    #[test]
    fn passes_the_openraft_storage_suite() {
        Suite::test_all(Builder).expect("openraft storage suite");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn vote_log_and_state_survive_reopening() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vote = Vote::new(3, 1);
        {
            let db = open(dir.path(), 1).expect("open");
            let mut log = LogStore::new(db.clone());
            log.save_vote(&vote).await.expect("vote");
            let entries: Vec<Entry<TypeConfig>> = (1..=5)
                .map(|i| Entry {
                    log_id: LogId::new(openraft::CommittedLeaderId::new(3, 1), i),
                    payload: EntryPayload::Blank,
                })
                .collect();
            let mut sm = StateMachine::new(
                db.clone(),
                SmState::initial(map()),
                watch::channel(map()).0,
                Default::default(),
            );
            sm.apply(entries.clone()).await.expect("apply");
            let txn = db.begin_write().expect("txn");
            {
                let mut t = txn.open_table(LOG).expect("table");
                for e in &entries {
                    t.insert(e.log_id.index, encode("log entry", e).expect("encode").as_slice())
                        .expect("insert");
                }
            }
            txn.commit().expect("commit");
            log.truncate(entries[3].log_id).await.expect("truncate");
            log.purge(entries[0].log_id).await.expect("purge");
            log.save_committed(Some(entries[2].log_id)).await.expect("committed");
        }
        let db = open(dir.path(), 1).expect("reopen");
        let mut log = LogStore::new(db.clone());
        assert_eq!(log.read_vote().await.expect("vote"), Some(vote));
        let st = log.get_log_state().await.expect("state");
        assert_eq!(st.last_purged_log_id.map(|l| l.index), Some(1));
        assert_eq!(st.last_log_id.map(|l| l.index), Some(3));
        let got = log.try_get_log_entries(0..10).await.expect("entries");
        assert_eq!(got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(log.read_committed().await.expect("committed").map(|l| l.index), Some(3));
        let state = load_state(&db).expect("load").expect("state machine was written");
        assert_eq!(state.last_applied.map(|l| l.index), Some(5));
        drop((log, db));
        assert!(matches!(
            open(dir.path(), 2),
            Err(DbError::WrongNode { found: 1, expected: 2 })
        ));
    }
}
