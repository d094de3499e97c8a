//! Chunk store: durability, group commit, GC, full devices, injected faults, crashes,
//! index rebuild and corruption — against the file-emulated zoned device.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

use shingle_data::chunk::ChunkKey;
use shingle_data::store::{ChunkStore, StoreError, StoreOptions};
use shingle_data::zone::faulty::{Faults, FaultyDevice};
use shingle_data::zone::file::FileZonedDevice;
use shingle_data::zone::{Geometry, ZonedDevice};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

const ZONE: u64 = 256 * 1024;

fn geometry(zones: u32) -> Geometry {
    Geometry {
        zone_count: zones,
        zone_capacity: ZONE,
        block_size: 4096,
        max_open_zones: 0,
    }
}

fn key(i: u64) -> ChunkKey {
    ChunkKey {
        ino: 100 + i / 6,
        stripe: i % 3,
        shard: (i % 6) as u16,
    }
}

fn data(i: u64, version: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (j as u64 * 31 + i * 7 + version * 13) as u8).collect()
}

fn open(dir: &Path, zones: u32) -> ChunkStore<FileZonedDevice> {
    let dev = FileZonedDevice::open_or_create(&dir.join("dev"), geometry(zones)).expect("device");
    ChunkStore::open(dev, &dir.join("index.redb"), StoreOptions::default()).expect("store")
}

fn put<D: ZonedDevice>(s: &ChunkStore<D>, k: ChunkKey, v: u64, payload: &[u8]) -> Result<(), StoreError> {
    s.put(k, v, payload, crc32c::crc32c(payload)).map(|_| ())
}

#[test]
fn put_get_overwrite_delete_and_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = open(dir.path(), 8);
        for i in 0..20 {
            put(&s, key(i), 1, &data(i, 1, 10_000 + i as usize)).expect("put");
        }
        // A new version is stored beside the old one; both stay readable by name.
        put(&s, key(3), 2, &data(3, 2, 5000)).expect("new version");
        assert_eq!(s.versions(&key(3)), vec![1, 2]);
        assert_eq!(
            &s.get_version(&key(3), 1).expect("v1 kept").1[..],
            &data(3, 1, 10_003)[..]
        );
        assert_eq!(s.get(&key(3)).expect("newest").0.version, 2);
        // An older version written later does not hide the newest.
        put(&s, key(7), 0, &data(7, 0, 100)).expect("older version");
        assert_eq!(s.get(&key(7)).expect("newest").0.version, 1);
        assert!(s.delete_if(&key(7), Some(0)).expect("delete v0"));
        let e = s.put(key(4), 5, b"payload", 1234).expect_err("bad crc");
        assert!(matches!(e, StoreError::BadChecksum { .. }), "{e}");
        // A delete of one version keeps the others.
        s.delete_if(&key(3), Some(1)).expect("delete v1");
        assert_eq!(s.get(&key(3)).expect("v2 kept").0.version, 2);
        assert!(matches!(s.get_version(&key(3), 1), Err(StoreError::NotFound(_))));
        s.delete_if(&key(6), Some(1)).expect("delete v1");
        assert!(matches!(s.get(&key(6)), Err(StoreError::NotFound(_))));
        put(&s, key(6), 1, &data(6, 1, 10_006)).expect("put back");
        assert!(s.delete(&key(5)).expect("delete"));
        assert!(!s.delete(&key(5)).expect("delete again"));
        assert!(matches!(s.get(&key(5)), Err(StoreError::NotFound(_))));
    }
    let s = open(dir.path(), 8);
    for i in 0..20 {
        match i {
            5 => assert!(matches!(s.get(&key(5)), Err(StoreError::NotFound(_)))),
            3 => {
                let (h, p) = s.get(&key(3)).expect("get");
                assert_eq!((h.version, &p[..]), (2, &data(3, 2, 5000)[..]));
            }
            _ => {
                let (h, p) = s.get(&key(i)).expect("get");
                assert_eq!(h.version, 1);
                assert_eq!(&p[..], &data(i, 1, 10_000 + i as usize)[..]);
            }
        }
    }
    // New writes after reopen never reuse a sequence number.
    put(&s, key(99), 1, b"after reopen").expect("put");
    let seq_new = s.get(&key(99)).expect("get").0.seq;
    assert!(
        (0..20)
            .filter(|i| *i != 5)
            .all(|i| s.get(&key(i)).expect("get").0.seq < seq_new)
    );
}

#[test]
fn concurrent_writers_share_group_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Arc::new(open(dir.path(), 64));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for j in 0..25u64 {
                    let i = t * 1000 + j;
                    put(&s, key(i), 1, &data(i, 1, 20_000)).expect("put");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let st = s.stats();
    assert_eq!(st.chunks, 200);
    assert!(st.commits < 200, "no batching: {} commits for 200 puts", st.commits);
    for t in 0..8u64 {
        for j in 0..25u64 {
            let i = t * 1000 + j;
            assert_eq!(&s.get(&key(i)).expect("get").1[..], &data(i, 1, 20_000)[..]);
        }
    }
}

#[test]
fn gc_reclaims_garbage_and_keeps_every_live_chunk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 12);
    let len = 60_000; // 64 KiB records: 4 per zone
    for i in 0..24 {
        put(&s, key(i), 1, &data(i, 1, len)).expect("put");
    }
    // Make half of everything garbage: new versions of the even chunks, the old ones
    // deleted (as a commit that replaced them would have them deleted).
    for i in (0..24).step_by(2) {
        put(&s, key(i), 2, &data(i, 2, len)).expect("overwrite");
        assert!(s.delete_if(&key(i), Some(1)).expect("delete the old version"));
    }
    let before = s.stats();
    let r = s.gc(16, 0.4).expect("gc");
    assert!(!r.zones_reset.is_empty(), "nothing collected: {r:?}");
    let after = s.stats();
    assert!(after.zones_free > before.zones_free);
    assert!(after.written_bytes < before.written_bytes);
    for i in 0..24 {
        let v = if i % 2 == 0 { 2 } else { 1 };
        let (h, p) = s.get(&key(i)).expect("get after gc");
        assert_eq!(h.version, v);
        assert_eq!(&p[..], &data(i, v, len)[..]);
    }
    let wa = after.write_amplification();
    assert!(wa > 1.0 && wa < 2.0, "write amplification {wa}");
    drop(s);
    let s = open(dir.path(), 12);
    for i in 0..24 {
        let v = if i % 2 == 0 { 2 } else { 1 };
        assert_eq!(s.get(&key(i)).expect("get after reopen").0.version, v);
    }
}

#[test]
fn full_device_gives_no_space_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 4);
    let len = 100_000;
    let mut stored = Vec::new();
    let mut i = 0;
    loop {
        match put(&s, key(i), 1, &data(i, 1, len)) {
            Ok(()) => stored.push(i),
            Err(StoreError::NoSpace) => break,
            Err(e) => panic!("unexpected error: {e}"),
        }
        i += 1;
        assert!(i < 1000, "device never filled");
    }
    assert!(!stored.is_empty());
    for &i in &stored {
        assert_eq!(&s.get(&key(i)).expect("get").1[..], &data(i, 1, len)[..]);
    }
    // Free space by deleting, collect, and write again.
    for &i in stored.iter().take(stored.len() / 2 + 1) {
        s.delete(&key(i)).expect("delete");
    }
    s.gc(8, 0.3).expect("gc");
    put(&s, key(5000), 1, &data(5000, 1, len)).expect("put after gc");
}

fn faulty(dir: &Path, faults: Arc<Faults>) -> ChunkStore<FaultyDevice<FileZonedDevice>> {
    let dev = FileZonedDevice::open_or_create(&dir.join("dev"), geometry(16)).expect("device");
    ChunkStore::open(
        FaultyDevice::new(dev, faults),
        &dir.join("index.redb"),
        StoreOptions::default(),
    )
    .expect("store")
}

#[test]
fn injected_faults_fail_the_write_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Faults::none();
    let s = faulty(dir.path(), faults.clone());
    put(&s, key(1), 1, &data(1, 1, 30_000)).expect("put");

    faults.writes_until_error.store(0, Ordering::SeqCst);
    assert!(put(&s, key(2), 1, &data(2, 1, 30_000)).is_err());
    faults.heal();
    faults.tear_next_write.store(true, Ordering::SeqCst);
    assert!(
        put(&s, key(3), 1, &data(3, 1, 30_000)).is_err(),
        "torn write acknowledged"
    );
    faults.heal();
    faults.fail_sync.store(true, Ordering::SeqCst);
    assert!(
        matches!(
            put(&s, key(4), 1, &data(4, 1, 30_000)),
            Err(StoreError::CommitFailed(_))
        ),
        "unsynced write acknowledged"
    );
    faults.heal();
    faults.no_space.store(true, Ordering::SeqCst);
    assert!(matches!(
        put(&s, key(6), 1, &data(6, 1, 30_000)),
        Err(StoreError::NoSpace)
    ));
    faults.heal();
    faults.fail_reads.store(true, Ordering::SeqCst);
    assert!(s.get(&key(1)).is_err());
    faults.heal();

    put(&s, key(5), 1, &data(5, 1, 30_000)).expect("put after faults");
    for k in [2, 3, 4, 6] {
        assert!(
            matches!(s.get(&key(k)), Err(StoreError::NotFound(_))),
            "failed write {k} became visible"
        );
    }
    assert_eq!(&s.get(&key(1)).expect("get").1[..], &data(1, 1, 30_000)[..]);
    assert_eq!(&s.get(&key(5)).expect("get").1[..], &data(5, 1, 30_000)[..]);
    drop(s);
    let s = faulty(dir.path(), Faults::none());
    assert_eq!(&s.get(&key(1)).expect("get").1[..], &data(1, 1, 30_000)[..]);
    assert_eq!(&s.get(&key(5)).expect("get").1[..], &data(5, 1, 30_000)[..]);
    assert!(matches!(s.get(&key(3)), Err(StoreError::NotFound(_))));
}

#[test]
fn corruption_is_detected_and_reported_by_scrub() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 8);
    for i in 0..6 {
        put(&s, key(i), 1, &data(i, 1, 9000)).expect("put");
    }
    let e = s.lookup(&key(2)).expect("indexed");
    drop(s);
    let zf = dir.path().join("dev").join(format!("zone-{:05}", e.zone));
    let mut bytes = std::fs::read(&zf).expect("read zone");
    bytes[e.offset as usize + 64 + 500] ^= 0xff;
    std::fs::write(&zf, &bytes).expect("corrupt");
    let s = open(dir.path(), 8);
    assert!(matches!(s.get(&key(2)), Err(StoreError::Corrupt { .. })));
    let r = s.scrub();
    assert_eq!(r.corrupt, vec![key(2)]);
    assert_eq!(r.checked, 6);
    // A repaired (rewritten) chunk reads again.
    put(&s, key(2), 1, &data(2, 1, 9000)).expect("rewrite");
    assert_eq!(&s.get(&key(2)).expect("get").1[..], &data(2, 1, 9000)[..]);
    assert!(s.scrub().corrupt.is_empty());
}

#[test]
fn index_is_rebuilt_from_zones() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = open(dir.path(), 8);
        for i in 0..12 {
            put(&s, key(i), 1, &data(i, 1, 7000)).expect("put");
        }
        for i in 0..4 {
            put(&s, key(i), 3, &data(i, 3, 3000)).expect("overwrite");
        }
    }
    std::fs::remove_file(dir.path().join("index.redb")).expect("lose the index");
    let dev = FileZonedDevice::open(&dir.path().join("dev")).expect("device");
    // Every version comes back (v1 and v3 of the first four).
    let n = ChunkStore::rebuild_index(&dev, &dir.path().join("index.redb")).expect("rebuild");
    assert_eq!(n, 16);
    drop(dev);
    let s = open(dir.path(), 8);
    for i in 0..12 {
        let v = if i < 4 { 3 } else { 1 };
        let len = if i < 4 { 3000 } else { 7000 };
        let (h, p) = s.get(&key(i)).expect("get");
        assert_eq!(h.version, v);
        assert_eq!(&p[..], &data(i, v, len)[..]);
    }
}

/// Deterministic random operations with crashes, checked against a model of what was
/// acknowledged. Replay a failure with SHINGLE_SEED=<seed>.
#[test]
fn model_based_with_crashes_and_faults() {
    // SHINGLE_SEED=N runs one seed; SHINGLE_SEEDS=N runs seeds 1..=N.
    let seeds: Vec<u64> = match (std::env::var("SHINGLE_SEED"), std::env::var("SHINGLE_SEEDS")) {
        (Ok(s), _) => vec![s.parse().expect("SHINGLE_SEED is a number")],
        (_, Ok(n)) => (1..=n.parse().expect("SHINGLE_SEEDS is a number")).collect(),
        _ => (1..=40).collect(),
    };
    for seed in seeds {
        run_model(seed);
    }
}

use shingle_testkit::Rng;

fn run_model(seed: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Faults::none();
    let mut rng = Rng::seeded(seed);
    // Every stored version of each key, with its length.
    let mut model: HashMap<ChunkKey, std::collections::BTreeMap<u64, usize>> = HashMap::new();
    // Puts that failed after their record may have reached the device (a failed sync):
    // like any unacknowledged write, each may or may not be there after a crash. Not
    // before one: the index takes a record only once its batch is durable.
    let mut maybe: HashMap<(ChunkKey, u64), usize> = HashMap::new();
    // A version's bytes depend on the key and version alone, as a shard's do (a
    // rewrite of the same version, by repair or GC, stores the same bytes).
    let len_of =
        |k: ChunkKey, v: u64| 1 + ((k.ino * 31 + u64::from(k.shard) * 7 + k.stripe * 3 + v * 4099) % 40_000) as usize;
    let mut s = Some(faulty(dir.path(), faults.clone()));
    for step in 0..150 {
        let store = s.as_ref().expect("open store");
        let k = key(rng.below(30));
        match rng.below(100) {
            0..=54 => {
                // A new version, the newest again (a repair), or an older one.
                let newest = model.get(&k).and_then(|m| m.keys().next_back().copied()).unwrap_or(0);
                let v = match rng.below(4) {
                    0 => newest.max(1),
                    1 => rng.below(newest + 1),
                    _ => newest + 1,
                };
                let len = len_of(k, v);
                let inject = rng.below(10) == 0;
                if inject {
                    match rng.below(3) {
                        0 => faults.tear_next_write.store(true, Ordering::SeqCst),
                        1 => faults.fail_sync.store(true, Ordering::SeqCst),
                        _ => faults.writes_until_error.store(0, Ordering::SeqCst),
                    }
                }
                match put(store, k, v, &data(k.ino * 7 + u64::from(k.shard), v, len)) {
                    Ok(()) => {
                        assert!(!inject, "seed {seed} step {step}: a faulty write was acknowledged");
                        model.entry(k).or_default().insert(v, len);
                    }
                    Err(StoreError::NoSpace) => {
                        store.gc(4, 0.0).expect("gc");
                    }
                    Err(e) => {
                        assert!(inject, "seed {seed} step {step}: put failed without a fault: {e}");
                        if !model.get(&k).is_some_and(|m| m.contains_key(&v)) {
                            maybe.insert((k, v), len);
                        }
                    }
                }
                faults.heal();
            }
            55..=59 => {
                store.delete(&k).expect("delete");
                model.remove(&k);
                maybe.retain(|(mk, _), _| *mk != k);
            }
            60..=64 => {
                let v = model.get(&k).and_then(|m| m.keys().next().copied()).unwrap_or(1);
                let existed = store.delete_if(&k, Some(v)).expect("delete version");
                let had = model.get_mut(&k).is_some_and(|m| m.remove(&v).is_some());
                maybe.remove(&(k, v));
                assert_eq!(existed, had, "seed {seed} step {step}: {k} v{v}");
                model.retain(|_, m| !m.is_empty());
            }
            65..=74 => {
                store.gc(2, 0.3).expect("gc");
            }
            75..=84 => {
                // Crash: drop the store, tear the tail of every zone file at random.
                drop(s.take());
                for entry in std::fs::read_dir(dir.path().join("dev")).expect("dev dir") {
                    let p = entry.expect("entry").path();
                    if p.file_name().is_some_and(|n| {
                        n.to_string_lossy().starts_with("zone-") && !n.to_string_lossy().ends_with(".full")
                    }) && rng.below(3) == 0
                    {
                        let f = std::fs::OpenOptions::new().append(true).open(&p).expect("zone file");
                        let len = f.metadata().expect("meta").len();
                        // Unsynced garbage past the durable end (a torn append).
                        let extra = rng.below(6000);
                        f.set_len(len + extra).expect("tear");
                    }
                }
                let reopened = faulty(dir.path(), faults.clone());
                // Each failed put is there now or never again (its record was either
                // replayed, or lies before the checkpoint this open wrote).
                for ((mk, v), len) in maybe.drain() {
                    if reopened.lookup_version(&mk, v).is_some() {
                        model.entry(mk).or_default().insert(v, len);
                    }
                }
                s = Some(reopened);
            }
            _ => {
                // Verify everything against the model.
                for (mk, versions) in &model {
                    for (v, len) in versions {
                        let (h, p) = store
                            .get_version(mk, *v)
                            .unwrap_or_else(|e| panic!("seed {seed} step {step}: {mk} v{v} lost: {e}"));
                        assert_eq!(h.version, *v, "seed {seed} step {step}: {mk}");
                        assert_eq!(
                            &p[..],
                            &data(mk.ino * 7 + u64::from(mk.shard), *v, *len)[..],
                            "seed {seed} step {step}: {mk} v{v}"
                        );
                    }
                    let newest = versions.keys().next_back().copied();
                    assert_eq!(
                        store.lookup(mk).map(|e| e.version),
                        newest,
                        "seed {seed} step {step}: {mk}"
                    );
                }
                assert_eq!(
                    store.keys().len(),
                    model.values().map(|m| m.len()).sum::<usize>(),
                    "seed {seed} step {step}: deleted chunk versions visible"
                );
            }
        }
    }
}

/// A put costs one device sync: its index update waits for a checkpoint; a delete is
/// one. (A crash before the checkpoint replays the records: `store_crash.rs`.)
#[test]
fn puts_wait_for_no_checkpoint_and_deletes_are_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let len = |i: u64| 20_000 + (i as usize * 977) % 30_000;
    {
        let s = open(dir.path(), 8);
        let before = s.stats();
        // More than a zone (256 KiB) of records: the active zone changes on the way.
        for i in 0..12 {
            put(&s, key(i), 1, &data(i, 1, len(i))).expect("put");
        }
        assert_eq!(
            s.stats().checkpoints,
            before.checkpoints + 1,
            "only the first batch (which extends the sequence lease) checkpoints"
        );
        assert!(s.delete(&key(3)).expect("delete"), "key 3 stored");
        let after_delete = s.stats().checkpoints;
        assert!(after_delete > before.checkpoints + 1, "a delete is a checkpoint");
        for i in 12..16 {
            put(&s, key(i), 2, &data(i, 2, len(i))).expect("put");
        }
        assert_eq!(s.stats().checkpoints, after_delete, "puts after it do not checkpoint");
    }
    let s = open(dir.path(), 8);
    for i in 0..16 {
        let v = if i < 12 { 1 } else { 2 };
        match s.get_version(&key(i), v) {
            Ok((_, p)) if i != 3 => assert_eq!(&p[..], &data(i, v, len(i))[..], "key {i}"),
            Ok(_) => panic!("key 3 was deleted before the crash and came back"),
            Err(e) if i != 3 => panic!("key {i} lost: {e}"),
            Err(_) => {}
        }
    }
}

/// A purge of many removed files is one durable index commit, deletes every version of
/// every chunk of those files, and nothing of the others; it stays done after a reopen.
#[test]
fn files_purged_together_are_one_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    // key(i) belongs to inode 100 + i / 6: inodes 100..=103, six chunks each.
    {
        let s = open(dir.path(), 8);
        for i in 0..24 {
            put(&s, key(i), 1, &data(i, 1, 3_000)).expect("put");
        }
        put(&s, key(1), 2, &data(1, 2, 3_000)).expect("a second version");
        let before = s.stats().checkpoints;
        let gone = s.delete_inos(&[100, 102, 999]).expect("purge");
        assert_eq!(
            gone.len(),
            13,
            "six chunks of each file, one with two versions: {gone:?}"
        );
        assert_eq!(s.stats().checkpoints, before + 1, "one checkpoint for the whole purge");
        assert!(s.versions_of_ino(100).is_empty() && s.versions_of_ino(102).is_empty());
        assert_eq!(s.versions_of_ino(101).len(), 6);
        assert!(
            s.delete_inos(&[100]).expect("again").is_empty(),
            "a second purge finds nothing"
        );
    }
    let s = open(dir.path(), 8);
    for i in 0..24 {
        let purged = matches!(100 + i / 6, 100 | 102);
        assert_eq!(s.get(&key(i)).is_ok(), !purged, "key {i} after reopen");
    }
}

/// An index written by a newer release (a format this build does not know) is refused
/// with a message that names both formats, and the index is left as it was.
#[test]
fn an_index_of_a_newer_format_is_refused_not_misread() {
    use redb::{ReadableDatabase, TableDefinition};
    const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = open(dir.path(), 4);
        put(&s, key(1), 1, &data(1, 1, 5000)).expect("put");
    }
    let index = dir.path().join("index.redb");
    let read_format = || {
        let db = redb::Database::open(&index).expect("index");
        let r = db.begin_read().expect("read");
        r.open_table(META)
            .expect("meta")
            .get("format")
            .expect("get")
            .map(|v| v.value())
    };
    assert_eq!(
        read_format(),
        Some(shingle_data::store::INDEX_FORMAT),
        "open writes its format"
    );
    {
        let db = redb::Database::open(&index).expect("index");
        let w = db.begin_write().expect("write");
        w.open_table(META).expect("meta").insert("format", 99).expect("insert");
        w.commit().expect("commit");
    }
    let dev = FileZonedDevice::open_or_create(&dir.path().join("dev"), geometry(4)).expect("device");
    let err = ChunkStore::open(dev, &index, StoreOptions::default())
        .err()
        .expect("a newer format must be refused");
    let msg = err.to_string();
    let known = format!("formats 1 to {}", shingle_data::store::INDEX_FORMAT);
    assert!(msg.contains("format 99") && msg.contains(&known), "{msg}");
    assert_eq!(read_format(), Some(99), "the refused index is not rewritten");
}
