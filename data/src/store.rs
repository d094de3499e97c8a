//! The chunk store: chunks appended to zones, an index that finds them, group commit,
//! and garbage collection by zone.
//!
//! ## Write path and durability
//! `put` checks the payload against the writer's crc32c, appends the record at the
//! active zone's write pointer, then waits for its *batch* to become durable. One
//! caller at a time is the syncer: it closes the current batch, syncs every zone the
//! batch touched, writes the batch's index updates to redb, applies them to the
//! in-memory index, and wakes the batch. Concurrent writers thus share one device sync
//! (group commit). Nothing is acknowledged before its record is durable; a chunk is not
//! readable before then.
//!
//! ## The zones are the log; the index is a checkpoint (decision 0025)
//! Every record names its key, version and a sequence number, so the records appended
//! since the index was last made durable can be found again: a batch of puts writes
//! its index updates to redb without a sync (one device sync per put, not two), and a
//! *checkpoint* — a durable redb commit that also records `ckpt_seq`, the first
//! sequence number it does not cover, and the tail (zone and offset) of the active zone
//! at that moment — comes after [`CHECKPOINT_CHANGES`] changes or [`CHECKPOINT_BYTES`]
//! of records, for any batch with a delete or a GC move (those must be durable before
//! they are acknowledged or a zone is reset), when the sequence lease is extended, and
//! from [`ChunkStore::checkpoint`] (the node calls it when idle). Sequence numbers are
//! handed out in append order (under the writer lock), so on open the records to
//! replay are those of the checkpoint's tail zone past its offset, and every zone
//! without index entries whose first record is numbered `ckpt_seq` or later (opened,
//! or reset and reused, after the checkpoint); the newest record of a key and version
//! wins, as in a rebuild. A record deleted before the checkpoint lies before its tail
//! and is never replayed. A put that failed (its sync) may be replayed: like any
//! unacknowledged write it may or may not be there after a crash, and nothing names
//! its version.
//!
//! ## Crash safety
//! - Data is synced before the index entry that points at it is committed, so the
//!   durable index never points at data that is not durable.
//! - GC copies live chunks out of a victim zone, commits the moved index entries
//!   (conditionally: only where the index still points at the victim), and resets the
//!   victim only when no index entry points into it any more. A crash at any step
//!   leaves the index pointing at intact data. Readers that raced with a reset see a
//!   stale location (`ReadPastWritePointer` or a key/version mismatch) and look again.
//! - Records appended but never committed are unreferenced garbage; GC reclaims them.
//!
//! ## Versions
//! A chunk is named by its key *and* its version: writing version 7 of a shard stores it
//! beside version 6, which stays readable until it is deleted by name. File layouts name
//! the version they reference, so a rewrite of a stripe never disturbs a reader of the
//! committed one, and a stored-but-uncommitted version never replaces a committed one.
//! Rewriting the same version (repair of a corrupt copy, a GC move) replaces it.
//!
//! ## Rebuilding the index
//! [`ChunkStore::rebuild_index`] scans every zone, keeps the newest record (highest
//! sequence number) per key and version, and writes a fresh index. There are no delete
//! tombstones, so a rebuild can bring back versions that were deleted while an older
//! copy still sat in an unreset zone: they are unreferenced by metadata and readers name
//! the version their layout holds, so they are never served as file data (the orphan
//! sweep removes them).

use crate::chunk::{self, CHUNK_HEADER_LEN, ChunkError, ChunkHeader, ChunkKey, MAX_CHUNK_PAYLOAD};
use crate::zone::{ZoneError, ZoneId, ZoneState, ZonedDevice};
use bytes::{Bytes, BytesMut};
use parking_lot::{Condvar, Mutex, RwLock};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::{debug, info, warn};

const CHUNKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("chunks");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The on-disk format of the chunk index (the `format` key of its `meta` table). 1: keys
/// named a chunk alone (read and rewritten on open; the key was not yet written); 2:
/// keys carry the version; 3: the index is a checkpoint, and the records appended after
/// it (found from `ckpt_seq` and the tail it names) are replayed on open — a build
/// that does not replay them would lose acknowledged writes, so it must refuse. An
/// index of a newer format is refused, not misread.
pub const INDEX_FORMAT: u64 = 3;

/// A checkpoint (durable index commit) is due after this many index changes or this
/// many record bytes since the last one: what a crash leaves to replay is bounded.
const CHECKPOINT_CHANGES: usize = 4096;
const CHECKPOINT_BYTES: u64 = 64 << 20;

/// Records the checkpoint `end` in the index's `meta` table: the first sequence number
/// it does not cover and the active zone's tail (see the module docs).
fn write_checkpoint(m: &mut redb::Table<&str, u64>, end: BatchEnd) -> StoreResult<()> {
    m.insert("ckpt_seq", end.next_seq)?;
    match end.tail {
        Some((z, off)) => {
            m.insert("ckpt_tail_zone", u64::from(z.0))?;
            m.insert("ckpt_tail_offset", off)?;
        }
        None => {
            m.remove("ckpt_tail_zone")?;
            m.remove("ckpt_tail_offset")?;
        }
    }
    Ok(())
}

/// Calls `f` with every whole, checksummed record of zone `zone` from `from` to
/// `write_pointer`, and its offset. A damaged or torn record (header or payload) is
/// reported and skipped a block at a time: records start on block boundaries, and one
/// written after a torn append starts inside the length the torn header claims.
fn scan_zone<D: ZonedDevice>(
    device: &D,
    zone: ZoneId,
    from: u64,
    write_pointer: u64,
    mut f: impl FnMut(u64, &ChunkHeader),
) -> StoreResult<()> {
    let bs = u64::from(device.geometry().block_size);
    let mut off = from;
    let mut header = [0u8; CHUNK_HEADER_LEN];
    while off + CHUNK_HEADER_LEN as u64 <= write_pointer {
        device.read(zone, off, &mut header)?;
        let h = match ChunkHeader::decode(&header) {
            Ok(h) => h,
            Err(_) => {
                off += bs;
                continue;
            }
        };
        let len = h.record_len(device.geometry().block_size);
        if off + len > write_pointer {
            break;
        }
        let mut payload = vec![0u8; h.payload_len as usize];
        device.read(zone, off + CHUNK_HEADER_LEN as u64, &mut payload)?;
        if h.verify_payload(&payload).is_ok() {
            f(off, &h);
            off += len;
        } else {
            // A torn record (its append failed halfway, and the next one was written
            // after its torn part) or a damaged one: look for the next record a block
            // further, not past the length this header claims.
            warn!(key = %h.key, zone = zone.0, offset = off, "skipping a corrupt record in a zone scan");
            off += bs;
        }
    }
    Ok(())
}

/// Adds the record `h` at `off` in `zone` to `map` unless a newer record (higher
/// sequence number) of the same key and version is there.
fn take_newest(map: &mut BTreeMap<VKey, IndexEntry>, zone: ZoneId, off: u64, h: &ChunkHeader) -> bool {
    let e = IndexEntry {
        zone: zone.0,
        offset: off,
        payload_len: h.payload_len,
        version: h.version,
        seq: h.seq,
        crc: h.payload_crc,
    };
    match map.get(&(h.key, h.version)) {
        Some(cur) if cur.seq >= h.seq => false,
        _ => {
            map.insert((h.key, h.version), e);
            true
        }
    }
}

/// The sequence number of the first record in `zone` whose header checks (the first
/// block's, unless it is damaged or torn).
fn first_seq<D: ZonedDevice>(device: &D, zone: ZoneId, write_pointer: u64) -> StoreResult<Option<u64>> {
    let bs = u64::from(device.geometry().block_size);
    let mut header = [0u8; CHUNK_HEADER_LEN];
    let mut off = 0;
    while off + CHUNK_HEADER_LEN as u64 <= write_pointer {
        device.read(zone, off, &mut header)?;
        if let Ok(h) = ChunkHeader::decode(&header) {
            return Ok(Some(h.seq));
        }
        off += bs;
    }
    Ok(None)
}

/// Replays into `map` the records appended after the checkpoint (`ckpt_seq`, `tail`):
/// the tail zone's past its offset, and every zone without index entries whose first
/// record is numbered `ckpt_seq` or later (it was opened, or reset and reused, after the
/// checkpoint; a zone whose records are all older holds only what the checkpoint knew
/// of, deleted ones included). Returns the keys it added or replaced.
fn replay<D: ZonedDevice>(
    device: &D,
    zones: &[crate::zone::ZoneInfo],
    map: &mut BTreeMap<VKey, IndexEntry>,
    ckpt_seq: u64,
    tail: Option<(ZoneId, u64)>,
    max_seq: &mut u64,
) -> StoreResult<Vec<VKey>> {
    let indexed: HashSet<u32> = map.values().map(|e| e.zone).collect();
    let mut changed = Vec::new();
    for info in zones {
        if info.write_pointer == 0 || info.state == ZoneState::Offline {
            continue;
        }
        let tail_here = tail.filter(|(z, _)| *z == info.id).map(|(_, o)| o);
        if indexed.contains(&info.id.0) && tail_here.is_none() {
            continue;
        }
        let from = match first_seq(device, info.id, info.write_pointer)? {
            Some(seq) if seq >= ckpt_seq => 0,
            _ => match tail_here {
                Some(o) => o,
                None => continue,
            },
        };
        scan_zone(device, info.id, from, info.write_pointer, |off, h| {
            *max_seq = (*max_seq).max(h.seq);
            if take_newest(map, info.id, off, h) {
                changed.push((h.key, h.version));
            }
        })?;
    }
    Ok(changed)
}

/// Refuses an index written in a format this build does not read.
/// What a batch's ops do to the index: each touched key's entry after them (`None`:
/// removed). A GC move (`only_if_at`) applies only where the index, or an earlier op
/// of the batch, still points at the old copy; a delete of every version takes those
/// the batch itself put too.
fn index_changes(idx: &Index, ops: &[Op]) -> Vec<(VKey, Option<IndexEntry>)> {
    let mut overlay: BTreeMap<VKey, Option<IndexEntry>> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Put { key, entry, only_if_at } => {
                let vk = (*key, entry.version);
                let cur = overlay.get(&vk).copied().unwrap_or_else(|| idx.map.get(&vk).copied());
                let apply = match (cur, only_if_at) {
                    (Some(cur), Some(at)) => cur.location() == *at,
                    (None, Some(_)) => false,
                    (_, None) => true,
                };
                if apply {
                    overlay.insert(vk, Some(*entry));
                }
            }
            Op::Delete { key, version } => {
                let mut gone: Vec<VKey> = match version {
                    Some(v) => vec![(*key, *v)],
                    None => idx.versions(key).map(|(vk, _)| *vk).collect(),
                };
                if version.is_none() {
                    gone.extend(overlay.range((*key, 0)..=(*key, u64::MAX)).map(|(vk, _)| *vk));
                }
                for vk in gone {
                    overlay.insert(vk, None);
                }
            }
        }
    }
    overlay.into_iter().collect()
}

/// What the index file holds when the store opens.
struct Loaded {
    map: BTreeMap<VKey, IndexEntry>,
    /// Sequence numbers handed out up to here (`seq_leased`).
    leased: u64,
    /// The last checkpoint: the first sequence number it does not cover and the active
    /// zone's tail then. An index without one (format 2) was durable at every batch:
    /// nothing to replay.
    ckpt: Option<(u64, Option<(ZoneId, u64)>)>,
    /// Keys of the first format, which named the chunk alone (one version per chunk).
    legacy: Vec<([u8; 18], IndexEntry)>,
}

/// Reads the chunk index and its checkpoint (creating the tables of a new index).
fn load_index(db: &Database) -> StoreResult<Loaded> {
    let txn = db.begin_write()?;
    txn.open_table(CHUNKS)?;
    txn.open_table(META)?;
    txn.commit()?;
    let (mut map, mut legacy) = (BTreeMap::new(), Vec::new());
    let r = db.begin_read()?;
    let t = r.open_table(CHUNKS)?;
    for item in t.iter()? {
        let (k, v) = item?;
        let e = IndexEntry::decode(v.value()).ok_or_else(|| StoreError::Index("index entry of wrong length".into()))?;
        let kb = k.value();
        let key = match kb.len() {
            VKEY_LEN => {
                let mut c = [0u8; 18];
                c.copy_from_slice(&kb[..18]);
                ChunkKey::from_bytes(&c)
            }
            18 => {
                let mut c = [0u8; 18];
                c.copy_from_slice(kb);
                legacy.push((c, e));
                ChunkKey::from_bytes(&c)
            }
            n => return Err(StoreError::Index(format!("index key of wrong length {n}"))),
        };
        map.insert((key, e.version), e);
    }
    let m = r.open_table(META)?;
    let leased = m.get("seq_leased")?.map_or(0, |v| v.value());
    let ckpt = match m.get("ckpt_seq")? {
        Some(seq) => {
            let zone = m.get("ckpt_tail_zone")?.map(|v| v.value());
            let offset = m.get("ckpt_tail_offset")?.map(|v| v.value());
            let tail = match (zone, offset) {
                (Some(z), Some(o)) => Some((
                    ZoneId(u32::try_from(z).map_err(|_| StoreError::Index(format!("checkpoint tail zone {z}")))?),
                    o,
                )),
                _ => None,
            };
            Some((seq.value(), tail))
        }
        None => None,
    };
    Ok(Loaded {
        map,
        leased,
        ckpt,
        legacy,
    })
}

/// Rewrites keys of the first index format with their version.
fn rewrite_legacy_keys(db: &Database, legacy: &[([u8; 18], IndexEntry)]) -> StoreResult<()> {
    if legacy.is_empty() {
        return Ok(());
    }
    let txn = db.begin_write()?;
    {
        let mut t = txn.open_table(CHUNKS)?;
        for (c, e) in legacy {
            t.remove(&c[..])?;
            t.insert(&vkey_bytes(&(ChunkKey::from_bytes(c), e.version))[..], &e.encode()[..])?;
        }
    }
    txn.commit()?;
    info!(chunks = legacy.len(), "chunk index keys rewritten with their versions");
    Ok(())
}

/// Each zone's live bytes and chunks from the index, and the highest sequence number
/// it holds. An entry past its zone's write pointer is kept (it reads as missing) and
/// reported; one in a zone beyond the device is a broken index.
fn account_zones(
    map: &BTreeMap<VKey, IndexEntry>,
    zones_info: &[crate::zone::ZoneInfo],
    zone_count: u32,
    block_size: u32,
) -> StoreResult<(Vec<ZoneAcct>, u64)> {
    let mut zones: Vec<ZoneAcct> = (0..zone_count).map(|_| ZoneAcct::default()).collect();
    let mut max_seq = 0;
    for (k, e) in map {
        let Some(z) = zones.get_mut(e.zone as usize) else {
            return Err(StoreError::Index(format!(
                "{} v{} indexed in zone {} beyond the device",
                k.0, k.1, e.zone
            )));
        };
        let len = chunk::record_len(e.payload_len as usize, block_size);
        z.live_bytes += len;
        z.keys.insert(*k);
        max_seq = max_seq.max(e.seq);
        let wp = zones_info.get(e.zone as usize).map_or(0, |i| i.write_pointer);
        if e.offset + len > wp {
            warn!(key = %k.0, version = k.1, zone = e.zone, "index points past the zone's write pointer; the chunk will read as missing");
        }
    }
    Ok((zones, max_seq))
}

/// The free zones (empty, nothing indexed), the zone appends resume in (the first
/// open or closed one) and its write pointer; other open or closed zones are finished.
fn zone_roles<D: ZonedDevice>(
    device: &D,
    zones_info: &[crate::zone::ZoneInfo],
    zones: &[ZoneAcct],
) -> StoreResult<(VecDeque<ZoneId>, Option<ZoneId>, u64)> {
    let (mut free, mut active, mut write_pointer) = (VecDeque::new(), None, 0);
    for info in zones_info {
        match info.state {
            ZoneState::Empty if zones[info.id.0 as usize].keys.is_empty() => free.push_back(info.id),
            ZoneState::Open | ZoneState::Closed if active.is_none() => {
                active = Some(info.id);
                write_pointer = info.write_pointer;
            }
            ZoneState::Open | ZoneState::Closed => device.finish(info.id)?,
            _ => {}
        }
    }
    Ok((free, active, write_pointer))
}

/// Writes the replayed records, the format and a checkpoint at `end` in one commit.
fn persist_opening(
    db: &Database,
    map: &BTreeMap<VKey, IndexEntry>,
    replayed: &[VKey],
    end: BatchEnd,
) -> StoreResult<()> {
    let txn = db.begin_write()?;
    {
        let mut t = txn.open_table(CHUNKS)?;
        for vk in replayed {
            if let Some(e) = map.get(vk) {
                t.insert(&vkey_bytes(vk)[..], &e.encode()[..])?;
            }
        }
        let mut m = txn.open_table(META)?;
        m.insert("format", INDEX_FORMAT)?;
        write_checkpoint(&mut m, end)?;
    }
    txn.commit()?;
    Ok(())
}

fn check_index_format(db: &Database) -> StoreResult<()> {
    let r = db.begin_read()?;
    let found = match r.open_table(META) {
        Ok(m) => m.get("format")?.map(|v| v.value()),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(e.into()),
    };
    match found {
        Some(v) if v > INDEX_FORMAT || v == 0 => Err(StoreError::Index(format!(
            "the chunk index has on-disk format {v}; this build reads formats 1 to {INDEX_FORMAT} \
             (a newer release wrote it: run that release, see docs/operations.md \"Versions\")"
        ))),
        _ => Ok(()),
    }
}

/// Sequence numbers are leased ahead in the index so that records appended but never
/// committed before a crash are never numbered again.
const SEQ_LEASE: u64 = 1 << 20;

/// Where a chunk record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Zone.
    pub zone: ZoneId,
    /// Byte offset of the record in the zone.
    pub offset: u64,
}

/// A chunk version: the index's key.
pub type VKey = (ChunkKey, u64);

/// Length of an index key: the chunk key, then the version (big-endian, so the versions
/// of one chunk sort together, oldest first).
const VKEY_LEN: usize = 26;

fn vkey_bytes((key, version): &VKey) -> [u8; VKEY_LEN] {
    let mut b = [0u8; VKEY_LEN];
    b[..18].copy_from_slice(&key.to_bytes());
    b[18..].copy_from_slice(&version.to_be_bytes());
    b
}

/// Index entry of one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Zone holding the record.
    pub zone: u32,
    /// Offset of the record in the zone.
    pub offset: u64,
    /// Payload bytes.
    pub payload_len: u32,
    /// Layout version.
    pub version: u64,
    /// Write sequence number.
    pub seq: u64,
    /// Payload crc32c.
    pub crc: u32,
}

impl IndexEntry {
    const LEN: usize = 36;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&self.zone.to_le_bytes());
        b[4..12].copy_from_slice(&self.offset.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.version.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..36].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::LEN {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        Some(IndexEntry {
            zone: u32_at(0),
            offset: u64_at(4),
            payload_len: u32_at(12),
            version: u64_at(16),
            seq: u64_at(24),
            crc: u32_at(32),
        })
    }

    fn location(&self) -> Location {
        Location {
            zone: ZoneId(self.zone),
            offset: self.offset,
        }
    }
}

/// Errors of the chunk store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No free zone left for new data (ENOSPC for the writer).
    #[error("no space left on the device")]
    NoSpace,
    /// The payload does not match the checksum the writer sent.
    #[error("{key}: payload does not match the writer's checksum")]
    BadChecksum {
        /// The chunk.
        key: ChunkKey,
    },
    /// The chunk is too large for a zone or the format.
    #[error("chunk payload of {0} bytes is too large")]
    TooLarge(usize),
    /// No such chunk.
    #[error("{0} not found")]
    NotFound(ChunkKey),
    /// The stored chunk failed verification.
    #[error("{key} is corrupt: {source}")]
    Corrupt {
        /// The chunk.
        key: ChunkKey,
        /// What was wrong.
        source: ChunkError,
    },
    /// Device error.
    #[error(transparent)]
    Zone(#[from] ZoneError),
    /// Index database error.
    #[error("chunk index: {0}")]
    Index(String),
    /// A group commit failed; the write is not durable.
    #[error("commit failed, write not durable: {0}")]
    CommitFailed(String),
}

impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> Self {
        StoreError::Index(e.to_string())
    }
}

macro_rules! redb_err {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self { StoreError::Index(e.to_string()) }
        }
    )*};
}
redb_err!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

/// Result of store operations.
pub type StoreResult<T> = Result<T, StoreError>;

/// Tunables of a store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Empty zones held back from user writes so GC can always make progress.
    pub reserved_zones: u32,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { reserved_zones: 1 }
    }
}

#[derive(Default)]
struct ZoneAcct {
    live_bytes: u64,
    keys: HashSet<VKey>,
}

struct Index {
    map: BTreeMap<VKey, IndexEntry>,
    zones: Vec<ZoneAcct>,
}

impl Index {
    /// The stored versions of `key`, oldest first.
    fn versions(&self, key: &ChunkKey) -> impl DoubleEndedIterator<Item = (&VKey, &IndexEntry)> {
        self.map.range((*key, 0)..=(*key, u64::MAX))
    }
}

enum Op {
    Put {
        key: ChunkKey,
        entry: IndexEntry,
        only_if_at: Option<Location>,
    },
    Delete {
        key: ChunkKey,
        /// This version only; `None`: every version stored when the delete applies.
        version: Option<u64>,
    },
}

struct Writer {
    active: Option<ZoneId>,
    write_pointer: u64,
    free: VecDeque<ZoneId>,
    pending: Vec<Op>,
    pending_zones: BTreeSet<ZoneId>,
    open_batch: u64,
    seq_leased: u64,
}

struct SyncState {
    synced_batch: u64,
    syncing: bool,
    failures: VecDeque<(u64, String)>,
}

/// What the syncer has written to the index since the last checkpoint.
#[derive(Default)]
struct Unchecked {
    changes: usize,
    bytes: u64,
    /// A checkpoint was asked for ([`ChunkStore::checkpoint`]).
    wanted: bool,
}

/// The end of a closed batch: the active zone and its write pointer, and the first
/// sequence number a later batch may use.
#[derive(Clone, Copy)]
struct BatchEnd {
    tail: Option<(ZoneId, u64)>,
    next_seq: u64,
}

/// Counters of a store.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StoreStats {
    /// Zones on the device.
    pub zones_total: u32,
    /// Empty zones available for writing.
    pub zones_free: u32,
    /// Chunks indexed.
    pub chunks: u64,
    /// Payload+header bytes of live records (padded).
    pub live_bytes: u64,
    /// Bytes written to zones not yet reset (live + garbage).
    pub written_bytes: u64,
    /// Usable bytes of the device.
    pub capacity_bytes: u64,
    /// Record bytes written for users since open.
    pub user_bytes_written: u64,
    /// Record bytes moved by GC since open.
    pub gc_bytes_moved: u64,
    /// Zones reset by GC since open.
    pub gc_zones_reset: u64,
    /// Group commits since open.
    pub commits: u64,
    /// Of those, checkpoints (durable index commits).
    pub checkpoints: u64,
    /// Records replayed into the index when the store was opened (appended after the
    /// last checkpoint before a crash).
    pub replayed: u64,
}

impl StoreStats {
    /// (user + GC bytes) / user bytes: the write amplification GC caused.
    pub fn write_amplification(&self) -> f64 {
        if self.user_bytes_written == 0 {
            1.0
        } else {
            (self.user_bytes_written + self.gc_bytes_moved) as f64 / self.user_bytes_written as f64
        }
    }
}

/// What one GC pass did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GcReport {
    /// Zones reset.
    pub zones_reset: Vec<ZoneId>,
    /// Chunks moved.
    pub chunks_moved: u64,
    /// Record bytes moved.
    pub bytes_moved: u64,
    /// Zones skipped because a chunk in them failed verification (scrub must repair first).
    pub zones_skipped: Vec<ZoneId>,
}

/// What a scrub pass found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScrubReport {
    /// Chunks verified.
    pub checked: u64,
    /// Chunks that failed verification.
    pub corrupt: Vec<ChunkKey>,
}

/// A chunk store on one zoned device.
pub struct ChunkStore<D: ZonedDevice> {
    device: D,
    db: Database,
    options: StoreOptions,
    block_size: u32,
    zone_capacity: u64,
    index: RwLock<Index>,
    writer: Mutex<Writer>,
    sync: Mutex<SyncState>,
    synced: Condvar,
    stats: Mutex<StoreStats>,
    gc_lock: Mutex<()>,
    next_seq: AtomicU64,
    unchecked: Mutex<Unchecked>,
}

impl<D: ZonedDevice> ChunkStore<D> {
    /// Opens (or creates) the store: loads the index from `index_path`, reconciles it
    /// with the device's zones, and resumes appending.
    pub fn open(device: D, index_path: &Path, options: StoreOptions) -> StoreResult<Self> {
        let db = if index_path.exists() {
            Database::open(index_path)?
        } else {
            Database::create(index_path)?
        };
        check_index_format(&db)?;
        let g = device.geometry();
        let Loaded {
            mut map,
            leased,
            ckpt,
            legacy,
        } = load_index(&db)?;
        rewrite_legacy_keys(&db, &legacy)?;
        let zones_info = device.report_zones()?;
        let mut replayed_seq = 0;
        let replayed = match ckpt {
            Some((seq, tail)) => replay(&device, &zones_info, &mut map, seq, tail, &mut replayed_seq)?,
            None => Vec::new(),
        };
        let (zones, max_seq) = account_zones(&map, &zones_info, g.zone_count, g.block_size)?;
        let (free, active, write_pointer) = zone_roles(&device, &zones_info, &zones)?;
        // Never below the checkpoint's: a record it covers (one deleted, or a put that
        // failed) may still lie in a zone, and must not be taken for a newer one.
        let next_seq = leased
            .max(max_seq.max(replayed_seq) + 1)
            .max(ckpt.map_or(0, |(seq, _)| seq));
        // The replayed records, the format, and a checkpoint of the store as it opens:
        // a second crash replays nothing of the first.
        let end = BatchEnd {
            tail: active.map(|z| (z, write_pointer)),
            next_seq,
        };
        persist_opening(&db, &map, &replayed, end)?;
        if !replayed.is_empty() {
            info!(
                records = replayed.len(),
                "chunk records appended after the last checkpoint replayed"
            );
        }
        info!(chunks = map.len(), free_zones = free.len(), "chunk store opened");
        let store = ChunkStore {
            block_size: g.block_size,
            zone_capacity: g.zone_capacity,
            device,
            db,
            options,
            index: RwLock::new(Index { map, zones }),
            writer: Mutex::new(Writer {
                active,
                write_pointer,
                free,
                pending: Vec::new(),
                pending_zones: BTreeSet::new(),
                open_batch: 1,
                seq_leased: next_seq,
            }),
            sync: Mutex::new(SyncState {
                synced_batch: 0,
                syncing: false,
                failures: VecDeque::new(),
            }),
            synced: Condvar::new(),
            stats: Mutex::new(StoreStats::default()),
            gc_lock: Mutex::new(()),
            next_seq: AtomicU64::new(next_seq),
            unchecked: Mutex::new(Unchecked::default()),
        };
        store.stats.lock().replayed = replayed.len() as u64;
        Ok(store)
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// Stores `payload` as version `version` of `key` and returns once it is durable.
    /// Other versions of the chunk stay as they are; the same version is replaced.
    /// `crc` is the writer's crc32c of the payload, checked before anything is written.
    pub fn put(&self, key: ChunkKey, version: u64, payload: &[u8], crc: u32) -> StoreResult<Location> {
        if payload.len() > MAX_CHUNK_PAYLOAD as usize
            || chunk::record_len(payload.len(), self.block_size) > self.zone_capacity
        {
            return Err(StoreError::TooLarge(payload.len()));
        }
        if crc32c::crc32c(payload) != crc {
            return Err(StoreError::BadChecksum { key });
        }
        let (loc, batch) = self.append(key, version, payload, crc, None, false)?;
        self.wait_durable(batch)?;
        let mut st = self.stats.lock();
        st.user_bytes_written += chunk::record_len(payload.len(), self.block_size);
        Ok(loc)
    }

    /// Appends a record and queues its index update; returns the batch to wait for.
    fn append(
        &self,
        key: ChunkKey,
        version: u64,
        payload: &[u8],
        crc: u32,
        only_if_at: Option<Location>,
        for_gc: bool,
    ) -> StoreResult<(Location, u64)> {
        let rec_len = chunk::record_len(payload.len(), self.block_size);
        // Encode the record before taking the writer lock, so concurrent writers copy
        // in parallel; only numbering (the header alone) and the append are serialised.
        let mut header = ChunkHeader {
            key,
            version,
            seq: 0,
            payload_len: payload.len() as u32,
            payload_crc: crc,
        };
        let mut record = chunk::encode_record(&header, payload, self.block_size);
        let mut w = self.writer.lock();
        let zone = self.zone_with_room(&mut w, rec_len, for_gc)?;
        let offset = w.write_pointer;
        // Numbered in append order: replay after a crash finds the records after a
        // checkpoint by their numbers (see the module docs).
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        header.seq = seq;
        record[..CHUNK_HEADER_LEN].copy_from_slice(&header.encode());
        if let Err(e) = self.device.write(zone, offset, &record) {
            // The device's write pointer is the truth after a failed write (a torn
            // write may have moved it); the torn bytes are unreferenced garbage.
            match self.device.zone_info(zone) {
                Ok(info) if info.state != ZoneState::Full && info.state != ZoneState::Offline => {
                    w.write_pointer = info.write_pointer;
                }
                _ => w.active = None,
            }
            if e.is_no_space() {
                return Err(StoreError::NoSpace);
            }
            return Err(e.into());
        }
        w.write_pointer += rec_len;
        let entry = IndexEntry {
            zone: zone.0,
            offset,
            payload_len: payload.len() as u32,
            version,
            seq,
            crc,
        };
        w.pending.push(Op::Put { key, entry, only_if_at });
        w.pending_zones.insert(zone);
        Ok((Location { zone, offset }, w.open_batch))
    }

    fn zone_with_room(&self, w: &mut Writer, rec_len: u64, for_gc: bool) -> StoreResult<ZoneId> {
        if let Some(z) = w.active {
            if w.write_pointer + rec_len <= self.zone_capacity {
                return Ok(z);
            }
            // Not enough room left: seal it. Its pending writes are synced by their batch.
            if w.write_pointer < self.zone_capacity {
                self.device.finish(z)?;
            }
            w.active = None;
        }
        let reserve = if for_gc {
            0
        } else {
            self.options.reserved_zones as usize
        };
        if w.free.len() <= reserve {
            return Err(StoreError::NoSpace);
        }
        let z = w.free.pop_front().ok_or(StoreError::NoSpace)?;
        let info = self.device.zone_info(z)?;
        if info.state != ZoneState::Empty {
            // A zone that was reset by GC but whose reset did not stick: reset again.
            self.device.reset(z)?;
        }
        w.active = Some(z);
        w.write_pointer = 0;
        Ok(z)
    }

    /// Waits until batch `batch` is durable, doing the commit if nobody else is.
    fn wait_durable(&self, batch: u64) -> StoreResult<()> {
        let mut s = self.sync.lock();
        loop {
            if s.synced_batch >= batch {
                if let Some((_, e)) = s.failures.iter().find(|(b, _)| *b == batch) {
                    return Err(StoreError::CommitFailed(e.clone()));
                }
                return Ok(());
            }
            if !s.syncing {
                s.syncing = true;
                drop(s);
                let (closed, result) = self.commit_batch();
                s = self.sync.lock();
                s.syncing = false;
                s.synced_batch = s.synced_batch.max(closed);
                if let Err(e) = result {
                    warn!(batch = closed, error = %e, "group commit failed; its writes are not acknowledged");
                    s.failures.push_back((closed, e.to_string()));
                    while s.failures.len() > 64 {
                        s.failures.pop_front();
                    }
                }
                self.synced.notify_all();
                continue;
            }
            self.synced.wait(&mut s);
        }
    }

    /// Closes the open batch and makes it durable. Only one runs at a time.
    fn commit_batch(&self) -> (u64, StoreResult<()>) {
        let (ops, zones, closed, lease, end) = {
            let mut w = self.writer.lock();
            let closed = w.open_batch;
            w.open_batch += 1;
            let next_seq = self.next_seq.load(Ordering::Relaxed);
            let lease = if next_seq + SEQ_LEASE / 2 > w.seq_leased {
                w.seq_leased = next_seq + SEQ_LEASE;
                Some(w.seq_leased)
            } else {
                None
            };
            let end = BatchEnd {
                tail: w.active.map(|z| (z, w.write_pointer)),
                next_seq,
            };
            (
                std::mem::take(&mut w.pending),
                std::mem::take(&mut w.pending_zones),
                closed,
                lease,
                end,
            )
        };
        let r = self.make_durable(ops, zones, lease, end);
        if r.is_err() && lease.is_some() {
            // The extended lease is not durable: the next batch tries again.
            self.writer.lock().seq_leased = 0;
        }
        (closed, r)
    }

    /// Makes the index durable now (a checkpoint, see the module docs) if anything was
    /// written since the last one: after it, a crash has nothing to replay. Called when
    /// the node is idle and before it stops.
    pub fn checkpoint(&self) -> StoreResult<()> {
        {
            let mut u = self.unchecked.lock();
            if u.changes == 0 && u.bytes == 0 {
                return Ok(());
            }
            u.wanted = true;
        }
        // The next batch (empty if nobody writes) carries the checkpoint.
        let batch = self.writer.lock().open_batch;
        self.wait_durable(batch)
    }

    fn make_durable(
        &self,
        ops: Vec<Op>,
        zones: BTreeSet<ZoneId>,
        lease: Option<u64>,
        end: BatchEnd,
    ) -> StoreResult<()> {
        let wanted = self.unchecked.lock().wanted;
        if ops.is_empty() && lease.is_none() && !wanted {
            return Ok(());
        }
        for z in &zones {
            self.device.sync_zone(*z)?;
        }
        // Turn the ops into index changes; only the syncer changes the index, so the
        // decisions hold until they are applied below.
        let changes = index_changes(&self.index.read(), &ops);
        // Deletes and GC moves are durable before they are acknowledged (and before a
        // zone is reset): replay would not undo them. Puts need only their records.
        let must = ops.iter().any(|op| {
            matches!(
                op,
                Op::Delete { .. }
                    | Op::Put {
                        only_if_at: Some(_),
                        ..
                    }
            )
        });
        let bytes: u64 = ops
            .iter()
            .map(|op| match op {
                Op::Put { entry, .. } => chunk::record_len(entry.payload_len as usize, self.block_size),
                Op::Delete { .. } => 0,
            })
            .sum();
        let checkpoint = {
            let u = self.unchecked.lock();
            must || wanted
                || lease.is_some()
                || u.changes + changes.len() >= CHECKPOINT_CHANGES
                || u.bytes + bytes >= CHECKPOINT_BYTES
        };
        self.write_index(&changes, lease, checkpoint.then_some(end))?;
        {
            let mut u = self.unchecked.lock();
            if checkpoint {
                *u = Unchecked::default();
            } else {
                u.changes += changes.len();
                u.bytes += bytes;
            }
        }
        self.apply_changes(changes);
        let mut st = self.stats.lock();
        st.commits += 1;
        st.checkpoints += u64::from(checkpoint);
        Ok(())
    }

    /// Commits index changes (and a lease) to the index file; with a checkpoint
    /// (`end`), durably, otherwise without a sync (the zones replay them).
    fn write_index(
        &self,
        changes: &[(VKey, Option<IndexEntry>)],
        lease: Option<u64>,
        checkpoint: Option<BatchEnd>,
    ) -> StoreResult<()> {
        let mut txn = self.db.begin_write()?;
        if checkpoint.is_none() {
            txn.set_durability(redb::Durability::None)?;
        }
        {
            let mut t = txn.open_table(CHUNKS)?;
            for (vk, entry) in changes {
                match entry {
                    Some(e) => {
                        t.insert(&vkey_bytes(vk)[..], &e.encode()[..])?;
                    }
                    None => {
                        t.remove(&vkey_bytes(vk)[..])?;
                    }
                }
            }
            let mut m = txn.open_table(META)?;
            if let Some(l) = lease {
                m.insert("seq_leased", l)?;
            }
            if let Some(end) = checkpoint {
                write_checkpoint(&mut m, end)?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Applies committed index changes to the in-memory index and zone accounts.
    fn apply_changes(&self, changes: Vec<(VKey, Option<IndexEntry>)>) {
        let mut idx = self.index.write();
        for (vk, entry) in changes {
            let old = match entry {
                Some(e) => {
                    let old = idx.map.insert(vk, e);
                    if let Some(old) = old {
                        self.unaccount(&mut idx, &vk, &old);
                    }
                    let z = &mut idx.zones[e.zone as usize];
                    z.live_bytes += chunk::record_len(e.payload_len as usize, self.block_size);
                    z.keys.insert(vk);
                    continue;
                }
                None => idx.map.remove(&vk),
            };
            if let Some(old) = old {
                self.unaccount(&mut idx, &vk, &old);
            }
        }
    }

    fn unaccount(&self, idx: &mut Index, vk: &VKey, old: &IndexEntry) {
        let z = &mut idx.zones[old.zone as usize];
        z.live_bytes = z
            .live_bytes
            .saturating_sub(chunk::record_len(old.payload_len as usize, self.block_size));
        z.keys.remove(vk);
    }

    /// The index entry of the newest stored version of `key`.
    pub fn lookup(&self, key: &ChunkKey) -> Option<IndexEntry> {
        let idx = self.index.read();
        idx.versions(key).next_back().map(|(_, e)| *e)
    }

    /// The index entry of version `version` of `key`, if stored.
    pub fn lookup_version(&self, key: &ChunkKey, version: u64) -> Option<IndexEntry> {
        let idx = self.index.read();
        idx.map.get(&(*key, version)).copied()
    }

    /// The stored versions of `key`, oldest first.
    pub fn versions(&self, key: &ChunkKey) -> Vec<u64> {
        let idx = self.index.read();
        idx.versions(key).map(|((_, v), _)| *v).collect()
    }

    /// Reads and verifies the newest version of a chunk; returns its header and payload.
    pub fn get(&self, key: &ChunkKey) -> StoreResult<(ChunkHeader, Bytes)> {
        self.get_with(key, || self.lookup(key))
    }

    /// Reads and verifies version `version` of a chunk.
    pub fn get_version(&self, key: &ChunkKey, version: u64) -> StoreResult<(ChunkHeader, Bytes)> {
        self.get_with(key, || self.lookup_version(key, version))
    }

    fn get_with(&self, key: &ChunkKey, find: impl Fn() -> Option<IndexEntry>) -> StoreResult<(ChunkHeader, Bytes)> {
        let mut last = None;
        for _ in 0..3 {
            let e = find().ok_or(StoreError::NotFound(*key))?;
            match self.read_entry(key, &e) {
                Ok(r) => return Ok(r),
                Err(err) => {
                    // A concurrent GC may have moved the chunk and reset the zone.
                    if find() == Some(e) {
                        return Err(err);
                    }
                    last = Some(err);
                }
            }
        }
        Err(last.unwrap_or(StoreError::NotFound(*key)))
    }

    fn read_entry(&self, key: &ChunkKey, e: &IndexEntry) -> StoreResult<(ChunkHeader, Bytes)> {
        let mut buf = BytesMut::zeroed(CHUNK_HEADER_LEN + e.payload_len as usize);
        self.device.read(ZoneId(e.zone), e.offset, &mut buf)?;
        chunk::decode_record(buf.freeze(), Some(*key), Some(e.version))
            .map_err(|source| StoreError::Corrupt { key: *key, source })
    }

    /// Deletes every version of a chunk durably. Returns whether any existed.
    pub fn delete(&self, key: &ChunkKey) -> StoreResult<bool> {
        self.delete_if(key, None)
    }

    /// Deletes version `version` of a chunk (in order with concurrent writes: a copy
    /// that a rebalance moved away, or a version a commit replaced), never another one.
    /// `None` deletes every version stored when the delete applies. Returns whether
    /// that version (any version, for `None`) existed before.
    pub fn delete_if(&self, key: &ChunkKey, version: Option<u64>) -> StoreResult<bool> {
        let existed = match version {
            Some(v) => self.lookup_version(key, v).is_some(),
            None => self.lookup(key).is_some(),
        };
        let batch = {
            let mut w = self.writer.lock();
            w.pending.push(Op::Delete { key: *key, version });
            w.open_batch
        };
        self.wait_durable(batch)?;
        Ok(existed)
    }

    /// Every stored chunk version of inode `ino`.
    pub fn versions_of_ino(&self, ino: u64) -> Vec<VKey> {
        let lo = (
            ChunkKey {
                ino,
                stripe: 0,
                shard: 0,
            },
            0,
        );
        let hi = (
            ChunkKey {
                ino,
                stripe: u64::MAX,
                shard: u16::MAX,
            },
            u64::MAX,
        );
        let idx = self.index.read();
        idx.map.range(lo..=hi).map(|(k, _)| *k).collect()
    }

    /// The inodes that have chunks here, in order.
    pub fn inos(&self) -> Vec<u64> {
        let idx = self.index.read();
        let mut out: Vec<u64> = Vec::new();
        let mut next = 0u64;
        // One seek per inode, not one step per chunk.
        while let Some(((k, _), _)) = idx
            .map
            .range(
                (
                    ChunkKey {
                        ino: next,
                        stripe: 0,
                        shard: 0,
                    },
                    0,
                )..,
            )
            .next()
        {
            out.push(k.ino);
            match k.ino.checked_add(1) {
                Some(n) => next = n,
                None => break,
            }
        }
        out
    }

    /// Deletes durably every version of every chunk of inodes `inos` stored when this
    /// is called (the files were removed and their purge came), all in one index
    /// commit. Returns what was deleted.
    pub fn delete_inos(&self, inos: &[u64]) -> StoreResult<Vec<VKey>> {
        let gone: Vec<VKey> = inos.iter().flat_map(|i| self.versions_of_ino(*i)).collect();
        if gone.is_empty() {
            return Ok(gone);
        }
        let batch = {
            let mut w = self.writer.lock();
            for (key, version) in &gone {
                w.pending.push(Op::Delete {
                    key: *key,
                    version: Some(*version),
                });
            }
            w.open_batch
        };
        self.wait_durable(batch)?;
        Ok(gone)
    }

    /// Every indexed chunk version (a snapshot).
    pub fn keys(&self) -> Vec<VKey> {
        self.index.read().map.keys().copied().collect()
    }

    /// Counters and space.
    pub fn stats(&self) -> StoreStats {
        let mut st = *self.stats.lock();
        let idx = self.index.read();
        let w = self.writer.lock();
        st.zones_total = idx.zones.len() as u32;
        st.zones_free = w.free.len() as u32;
        st.chunks = idx.map.len() as u64;
        st.live_bytes = idx.zones.iter().map(|z| z.live_bytes).sum();
        st.capacity_bytes = u64::from(st.zones_total) * self.zone_capacity;
        drop(w);
        drop(idx);
        st.written_bytes = self
            .device
            .report_zones()
            .map_or(0, |zs| zs.iter().map(|z| z.write_pointer).sum());
        st
    }

    /// Bytes a writer can still store (free zones above the GC reserve, plus the rest
    /// of the active zone, plus garbage GC can reclaim).
    pub fn available_bytes(&self) -> u64 {
        let st = self.stats();
        st.capacity_bytes
            .saturating_sub(st.live_bytes)
            .saturating_sub(u64::from(self.options.reserved_zones) * self.zone_capacity)
    }

    /// One GC pass: picks up to `max_zones` sealed zones whose garbage ratio is at
    /// least `min_garbage_ratio`, moves their live chunks and resets them.
    pub fn gc(&self, max_zones: usize, min_garbage_ratio: f64) -> StoreResult<GcReport> {
        let _gc = self.gc_lock.lock();
        let mut report = GcReport::default();
        let infos = self.device.report_zones()?;
        let (active, free): (Option<ZoneId>, HashSet<ZoneId>) = {
            let w = self.writer.lock();
            (w.active, w.free.iter().copied().collect())
        };
        let mut candidates: Vec<(f64, ZoneId)> = {
            let idx = self.index.read();
            infos
                .iter()
                .filter(|i| i.state == ZoneState::Full && Some(i.id) != active && !free.contains(&i.id))
                .filter(|i| i.write_pointer > 0)
                .map(|i| {
                    let live = idx.zones[i.id.0 as usize].live_bytes;
                    (
                        i.write_pointer.saturating_sub(live) as f64 / i.write_pointer as f64,
                        i.id,
                    )
                })
                .filter(|(ratio, _)| *ratio >= min_garbage_ratio)
                .collect()
        };
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (ratio, victim) in candidates.into_iter().take(max_zones) {
            debug!(zone = victim.0, garbage = ratio, "collecting zone");
            match self.collect_zone(victim, &mut report) {
                Ok(true) => report.zones_reset.push(victim),
                Ok(false) => report.zones_skipped.push(victim),
                Err(e) => return Err(e),
            }
        }
        let mut st = self.stats.lock();
        st.gc_bytes_moved += report.bytes_moved;
        st.gc_zones_reset += report.zones_reset.len() as u64;
        Ok(report)
    }

    fn collect_zone(&self, victim: ZoneId, report: &mut GcReport) -> StoreResult<bool> {
        let live: Vec<(ChunkKey, IndexEntry)> = {
            let idx = self.index.read();
            idx.zones[victim.0 as usize]
                .keys
                .iter()
                .filter_map(|vk| idx.map.get(vk).map(|e| (vk.0, *e)))
                .collect()
        };
        let mut last_batch = 0;
        for (key, e) in &live {
            let (h, payload) = match self.read_entry(key, e) {
                Ok(r) => r,
                Err(StoreError::Corrupt { source, .. }) => {
                    warn!(%key, error = %source, zone = victim.0, "not collecting zone: it holds a corrupt chunk (scrub repairs it)");
                    return Ok(false);
                }
                Err(err) => return Err(err),
            };
            let (_, batch) = self.append(*key, h.version, &payload, h.payload_crc, Some(e.location()), true)?;
            last_batch = batch;
            report.chunks_moved += 1;
            report.bytes_moved += chunk::record_len(payload.len(), self.block_size);
        }
        if last_batch > 0 {
            self.wait_durable(last_batch)?;
        }
        let still_live = !self.index.read().zones[victim.0 as usize].keys.is_empty();
        if still_live {
            warn!(
                zone = victim.0,
                "zone still referenced after moving its chunks; not resetting"
            );
            return Ok(false);
        }
        self.device.reset(victim)?;
        self.writer.lock().free.push_back(victim);
        Ok(true)
    }

    /// Re-reads and verifies every chunk version.
    pub fn scrub(&self) -> ScrubReport {
        let mut r = ScrubReport::default();
        for (key, version) in self.keys() {
            match self.get_version(&key, version) {
                Ok(_) => r.checked += 1,
                Err(StoreError::NotFound(_)) => {}
                Err(e) => {
                    warn!(%key, error = %e, "scrub found a bad chunk");
                    r.checked += 1;
                    r.corrupt.push(key);
                }
            }
        }
        r
    }

    /// Rebuilds the index at `index_path` from the records on `device` (the index is
    /// lost or damaged). Keeps the newest record (highest sequence number) of each key
    /// and version, the order the index applies rewrites of one version in.
    pub fn rebuild_index(device: &D, index_path: &Path) -> StoreResult<usize> {
        let mut newest: BTreeMap<VKey, IndexEntry> = BTreeMap::new();
        let mut max_seq = 0;
        for info in device.report_zones()? {
            scan_zone(device, info.id, 0, info.write_pointer, |off, h| {
                max_seq = max_seq.max(h.seq);
                take_newest(&mut newest, info.id, off, h);
            })?;
        }
        if index_path.exists() {
            std::fs::remove_file(index_path).map_err(|e| StoreError::Index(format!("remove old index: {e}")))?;
        }
        let db = Database::create(index_path)?;
        let txn = db.begin_write()?;
        {
            let mut t = txn.open_table(CHUNKS)?;
            for (vk, e) in &newest {
                t.insert(&vkey_bytes(vk)[..], &e.encode()[..])?;
            }
            let mut m = txn.open_table(META)?;
            m.insert("seq_leased", max_seq + SEQ_LEASE)?;
            m.insert("format", INDEX_FORMAT)?;
            // Everything on the device is in this index: nothing to replay.
            write_checkpoint(
                &mut m,
                BatchEnd {
                    tail: None,
                    next_seq: max_seq + 1,
                },
            )?;
        }
        txn.commit()?;
        info!(chunks = newest.len(), "chunk index rebuilt from zones");
        Ok(newest.len())
    }
}
