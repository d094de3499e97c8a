//! File data through the client library against six real `shingle serve` processes
//! (EC 4+2, small stripes so files span many): random writes, reads, truncates,
//! fsyncs and reopens checked against a `Vec<u8>`; two clients on one file —
//! close-to-open visibility, a reader that never sees an error while the other client
//! rewrites the file, and a lost commit race reported to the loser, not swallowed.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

mod common;

use common::{Cluster, Spec};
use shingle_client::{Client, ClientConfig};
use shingle_meta::ids::Ino;
use shingle_meta::namespace::{Creds, Errno, FileKind, SetAttr};
use std::time::Duration;

/// 4 data shards of 16 KiB: 64 KiB stripes; layouts loaded two stripes at a time, so
/// every file here is opened knowing only part of its layout.
fn config() -> ClientConfig {
    ClientConfig {
        ec: (4, 2),
        unit: 16 << 10,
        max_dirty_stripes: 2,
        cache_stripes: 4,
        commit_every: 4,
        inflight_stripes: 3,
        inflight_stripes_total: 8,
        layout_window: 2,
        distinct_homes: false,
    }
}

const SB: u64 = 64 << 10;

async fn start(root: &std::path::Path) -> (Cluster, Client, Client) {
    start_with(root, config()).await
}

async fn start_with(root: &std::path::Path, cfg: ClientConfig) -> (Cluster, Client, Client) {
    let cluster = Cluster::start(
        root,
        Spec {
            nodes: 6,
            managers: 1,
            data: true,
            partitions: 8,
            down_after_ms: 2000,
            data_toml: "",
            zones: (16, "16MiB"),
            node_toml: "",
            manager_toml: "",
        },
    );
    let a = Client::new(cluster.client().await, cfg.clone());
    cluster.wait_ready(a.meta()).await;
    let b = Client::new(cluster.client().await, cfg);
    (cluster, a, b)
}

async fn create(c: &Client, name: &str) -> Ino {
    c.meta()
        .mknod(
            &Creds::root(),
            Ino::ROOT,
            name.as_bytes(),
            FileKind::File,
            0o644,
            0,
            None,
        )
        .await
        .expect("create")
        .ino
}

use shingle_testkit::Rng;

async fn read_all(f: &shingle_client::OpenFile, len: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while (out.len() as u64) < len {
        let b = f
            .read(out.len() as u64, (len - out.len() as u64).min(1 << 20) as u32)
            .await
            .expect("read");
        if b.is_empty() {
            break;
        }
        out.extend_from_slice(&b);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_data_matches_a_byte_vector_and_two_clients_agree() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (_cluster, a, b) = start(tmp.path()).await;
    let root = Creds::root();

    // Random operations through the library, several seeds, against a Vec<u8>.
    for seed in 1..=4u64 {
        let ino = create(&a, &format!("model{seed}")).await;
        let mut f = a.open(&root, ino).await.expect("open");
        let mut rng = Rng::seeded(seed);
        let mut r: Vec<u8> = Vec::new();
        for step in 0..150 {
            match rng.below(10) {
                0..=3 => {
                    let off = rng.below(SB * 8);
                    let len = 1 + rng.below(SB * 2);
                    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_add(step as u8) | 1).collect();
                    let n = f.write(off, &data).await.expect("write");
                    assert_eq!(n as u64, len, "seed {seed} step {step}: short write");
                    if r.len() < (off + len) as usize {
                        r.resize((off + len) as usize, 0);
                    }
                    r[off as usize..(off + len) as usize].copy_from_slice(&data);
                }
                4..=5 => {
                    let off = rng.below(SB * 9);
                    let len = rng.below(SB * 2) as u32;
                    let got = f.read(off, len).await.expect("read");
                    let end = (off + u64::from(len)).min(r.len() as u64);
                    let want = if off >= end {
                        &[][..]
                    } else {
                        &r[off as usize..end as usize]
                    };
                    assert!(got[..] == *want, "seed {seed} step {step}: read {off}+{len} differs");
                }
                6 => {
                    let size = rng.below(SB * 8);
                    let set = SetAttr {
                        size: Some(size),
                        ..Default::default()
                    };
                    a.setattr(&root, ino, set).await.expect("truncate");
                    r.resize(size as usize, 0);
                }
                7 => f.flush().await.expect("fsync"),
                8 => {
                    f.flush().await.expect("close");
                    f = a.open(&root, ino).await.expect("reopen");
                }
                _ => {
                    // Another client opening after the close sees exactly this.
                    f.flush().await.expect("close");
                    let g = b.open(&root, ino).await.expect("open on b");
                    assert_eq!(g.size(), r.len() as u64, "seed {seed} step {step}: size on b");
                    assert!(
                        read_all(&g, r.len() as u64).await == r,
                        "seed {seed} step {step}: content on b"
                    );
                }
            }
            assert_eq!(f.size(), r.len() as u64, "seed {seed} step {step}: size");
        }
    }

    // A reader on b never sees an error (old or new bytes per stripe) while a rewrites
    // the whole file and commits, again and again (old versions are deleted after each
    // commit).
    let ino = create(&a, "shared").await;
    let len = SB * 4;
    let w = a.open(&root, ino).await.expect("open");
    w.write(0, &vec![1u8; len as usize]).await.expect("write");
    w.flush().await.expect("close");
    let rd = b.open(&root, ino).await.expect("reader");
    let writer = {
        let w = a.open(&root, ino).await.expect("writer");
        tokio::spawn(async move {
            for round in 2..12u8 {
                w.write(0, &vec![round; len as usize]).await.expect("rewrite");
                w.flush().await.expect("commit");
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() || reads < 20 {
        let off = (reads * 7919) % len;
        let b = rd.read(off, 4096).await.expect("a reader must never see an error");
        assert!(
            !b.is_empty() && b.iter().all(|x| *x == b[0]),
            "torn read: {:?}",
            &b[..8.min(b.len())]
        );
        reads += 1;
        if reads > 2000 {
            break;
        }
    }
    writer.await.expect("writer");
    // Close-to-open: a fresh open on b sees the last commit.
    let g = b.open(&root, ino).await.expect("reopen");
    assert!(read_all(&g, len).await.iter().all(|x| *x == 11));

    // A lost race: both clients based their write of stripe 0 on the same version; the
    // second to commit is told at fsync, and the file keeps the winner's bytes.
    let fa = a.open(&root, ino).await.expect("a");
    let fb = b.open(&root, ino).await.expect("b");
    fa.write(10, b"winner").await.expect("write a");
    fb.write(10, b"loser!").await.expect("write b");
    fa.flush().await.expect("a commits first");
    assert_eq!(fb.flush().await, Err(Errno::EIO), "the loser's fsync must fail");
    assert_eq!(fb.flush().await, Ok(()), "reported once");
    let g = b.open(&root, ino).await.expect("reopen");
    assert_eq!(&g.read(10, 6).await.expect("read")[..], b"winner");
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Two of six nodes down under the strict rule (`distinct_homes`: k + 1 = 5 shards on
/// distinct nodes), so no full stripe can be stored (the default rule would put two
/// shards on one node: decision 0017). The writes that needed them are reported once at
/// fsync (EIO), the committed content and size stay as they were (on this client and
/// for others), and once the nodes are back the same handle writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_that_cannot_be_stored_is_reported_once_and_changes_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let strict = ClientConfig {
        distinct_homes: true,
        ..config()
    };
    let (mut cluster, a, b) = start_with(tmp.path(), strict).await;
    let root = Creds::root();
    let ino = create(&a, "f").await;
    let f = a.open(&root, ino).await.expect("open");
    f.write(0, &vec![7u8; SB as usize]).await.expect("write");
    f.flush().await.expect("commit");

    cluster.local.nodes[4].kill();
    cluster.local.nodes[5].kill();
    // Stores run in the background: the write may or may not see the failure itself.
    let _ = f.write(0, &vec![9u8; 2 * SB as usize]).await;
    assert_eq!(f.flush().await, Err(Errno::EIO), "the lost stripes must fail fsync");
    assert_eq!(f.flush().await, Ok(()), "and only once");
    assert_eq!(f.size(), SB, "the size falls back to what is stored");
    assert!(f.read(0, SB as u32).await.expect("read").iter().all(|x| *x == 7));
    let g = b.open(&root, ino).await.expect("open on b");
    assert_eq!(g.size(), SB);
    assert!(
        read_all(&g, SB).await.iter().all(|x| *x == 7),
        "committed content changed"
    );

    cluster.restart(4);
    cluster.restart(5);
    cluster.wait_ready(a.meta()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        f.write(0, &vec![5u8; SB as usize]).await.ok();
        if f.flush().await.is_ok() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "writes did not recover");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let g = b.open(&root, ino).await.expect("reopen on b");
    assert!(read_all(&g, SB).await.iter().all(|x| *x == 5));
}

/// A file removed while open here still reads back whole: opened knowing only the first
/// window of its layout, it loads the rest before its name (and with its last link, its
/// stripe records) goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_removed_while_open_reads_back_whole() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (_cluster, a, _b) = start(tmp.path()).await;
    let root = Creds::root();
    let ino = create(&a, "doomed").await;
    let data: Vec<u8> = (0..SB * 7).map(|i| (i % 251) as u8).collect();
    {
        let f = a.open(&root, ino).await.expect("open");
        f.write(0, &data).await.expect("write");
        f.flush().await.expect("flush");
    }
    assert!(!a.is_open(ino), "closed: the next open reads the layout afresh");
    let f = a.open(&root, ino).await.expect("reopen");
    a.unlink(&root, Ino::ROOT, b"doomed").await.expect("unlink");
    assert_eq!(
        a.meta().getattr(ino).await.err(),
        Some(Errno::ENOENT),
        "the inode and its stripe records are gone"
    );
    assert_eq!(read_all(&f, data.len() as u64).await, data);
}
