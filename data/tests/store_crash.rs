//! The chunk store killed with SIGKILL while it writes: a child process (this test
//! binary run again) puts chunks and deletes some, printing each acknowledged one; the
//! test kills it and opens the store. Every acknowledged put is there (most of them
//! only in the zones, replayed: puts do not wait for the index), and no acknowledged
//! delete came back.

use shingle_data::chunk::ChunkKey;
use shingle_data::store::{ChunkStore, StoreOptions};
use shingle_data::zone::Geometry;
use shingle_data::zone::file::FileZonedDevice;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

const CHILD: &str = "SHINGLE_CHUNK_STORE_CRASH_CHILD";

fn geometry() -> Geometry {
    Geometry {
        zone_count: 64,
        zone_capacity: 256 * 1024,
        block_size: 4096,
        max_open_zones: 0,
    }
}

fn key(i: u64) -> ChunkKey {
    ChunkKey {
        ino: 1000 + i / 6,
        stripe: i % 5,
        shard: (i % 6) as u16,
    }
}

fn payload(i: u64) -> Vec<u8> {
    let len = 3000 + (i as usize * 7919) % 20_000;
    (0..len).map(|j| (j as u64 * 31 + i * 17) as u8).collect()
}

fn open(dir: &Path) -> ChunkStore<FileZonedDevice> {
    let dev = FileZonedDevice::open_or_create(&dir.join("dev"), geometry()).expect("device");
    ChunkStore::open(dev, &dir.join("index.redb"), StoreOptions::default()).expect("store")
}

/// The child: puts chunk after chunk from two threads, and every 40th deletes one put
/// earlier; prints `p I` / `d I` once each is acknowledged. Runs until killed.
fn child(dir: &str) {
    let store = std::sync::Arc::new(open(Path::new(dir)));
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (store, next) = (store.clone(), next.clone());
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let p = payload(i);
                    store.put(key(i), 1, &p, crc32c::crc32c(&p)).expect("put");
                    println!("p {i}");
                    if i % 40 == 39 {
                        store.delete(&key(i - 20)).expect("delete");
                        println!("d {}", i - 20);
                    }
                    // Stop short of filling the device: the parent kills us first.
                    if i > 600 {
                        std::thread::park();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

#[test]
fn acknowledged_puts_and_deletes_survive_sigkill() {
    if let Ok(dir) = std::env::var(CHILD) {
        child(&dir);
        return;
    }
    for (round, stop_after) in [(0, 90u64), (1, 233), (2, 455)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = Command::new(std::env::current_exe().expect("exe"))
            .args([
                "--exact",
                "acknowledged_puts_and_deletes_survive_sigkill",
                "--nocapture",
            ])
            .env(CHILD, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let out = c.stdout.take().expect("stdout");
        let (mut put, mut deleted) = (BTreeSet::new(), BTreeSet::new());
        for line in BufReader::new(out).lines() {
            let line = line.expect("read");
            match line.split_once(' ') {
                Some(("p", i)) => {
                    put.insert(i.parse::<u64>().expect("number"));
                }
                Some(("d", i)) => {
                    deleted.insert(i.parse::<u64>().expect("number"));
                }
                _ => continue,
            }
            if put.len() as u64 >= stop_after {
                break;
            }
        }
        c.kill().expect("SIGKILL");
        let _ = c.wait();
        let s = open(dir.path());
        assert!(
            s.stats().replayed > 0,
            "round {round}: nothing replayed (the puts waited for the index after all?)"
        );
        for i in &put {
            let found = s.get_version(&key(*i), 1);
            if deleted.contains(i) {
                assert!(
                    found.is_err(),
                    "round {round}: chunk {i} deleted before the kill came back"
                );
            } else {
                let (_, p) = found.unwrap_or_else(|e| panic!("round {round}: acknowledged chunk {i} lost: {e}"));
                assert_eq!(&p[..], &payload(*i)[..], "round {round}: chunk {i}");
            }
        }
    }
}
