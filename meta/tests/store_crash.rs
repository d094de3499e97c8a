//! The metadata store killed with SIGKILL while it commits: a child process (this test
//! binary run again) commits batches and prints each one acknowledged; the test kills
//! it and opens the store: every acknowledged batch is there, after the log's replay.

use shingle_meta::ids::{Epoch, Ino, PartitionId};
use shingle_meta::namespace::{DentryVal, FileKind, Mutation};
use shingle_meta::service::replica::{Key, Replica};
use shingle_meta::service::store::{MetaStore, Write};
use shingle_meta::service::wire::PartOp;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "SHINGLE_STORE_CRASH_CHILD";
const P: PartitionId = PartitionId(1);

fn entry(i: u64) -> PartOp {
    PartOp::Apply {
        intent: 0,
        step: 0,
        m: Mutation::PutDentry {
            parent: Ino::ROOT,
            name: format!("f{i}").into_bytes(),
            val: DentryVal {
                ino: Ino(1000 + i),
                kind: FileKind::File,
            },
        },
    }
}

/// The child: commits batches of 4 concurrent writers for ever, printing each one's
/// number once its commit returned; after the first 200 it idles past a checkpoint.
async fn child(dir: &str) {
    let (store, _) = MetaStore::open(std::path::Path::new(dir)).expect("open");
    let store = std::sync::Arc::new(store);
    let replica = std::sync::Arc::new(parking_lot::Mutex::new(Replica::initial(P, 4, 1)));
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let pause: std::sync::Arc<parking_lot::Mutex<Option<Instant>>> = Default::default();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (store, replica, next, pause) = (store.clone(), replica.clone(), next.clone(), pause.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let until = *pause.lock();
                if let Some(t) = until {
                    tokio::time::sleep_until(t.into()).await;
                }
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let w = {
                    let mut r = replica.lock();
                    let keys = r.apply(&[entry(i)]);
                    r.meta.lsn += 1;
                    r.meta.state_epoch = Epoch(4);
                    Write::batch(P, &r, &keys)
                };
                store.commit(vec![w]).await.expect("commit");
                println!("{i}");
                if i == 200 {
                    // Every writer idles past the store's idle checkpoint.
                    *pause.lock() = Some(Instant::now() + Duration::from_millis(1500));
                }
            }
        }));
    }
    // The writers never stop: the test kills this process.
    futures_util::future::join_all(tasks).await;
}

#[tokio::test]
async fn a_store_killed_mid_commit_keeps_every_acknowledged_batch() {
    if let Ok(dir) = std::env::var(CHILD) {
        child(&dir).await;
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    for round in 0..3 {
        let mut c = Command::new(std::env::current_exe().expect("exe"))
            .args([
                "--exact",
                "a_store_killed_mid_commit_keeps_every_acknowledged_batch",
                "--nocapture",
            ])
            .env(CHILD, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("child");
        let out = BufReader::new(c.stdout.take().expect("stdout"));
        let mut acked = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        // Kill it at a different point each round: before, around and after its idle
        // checkpoint.
        let kill_after = [150, 420, 900][round];
        for line in out.lines() {
            let Ok(n) = line.expect("line").trim().parse::<u64>() else {
                continue;
            };
            acked.push(n);
            if acked.len() >= kill_after || Instant::now() > deadline {
                break;
            }
        }
        c.kill().expect("SIGKILL");
        c.wait().expect("wait");
        assert!(acked.len() >= kill_after, "the child acknowledged only {}", acked.len());
        let (store, loaded) = MetaStore::open(dir.path()).expect("reopen");
        let (meta, recs) = loaded.get(&P).expect("the partition is there");
        for i in &acked {
            let k = Key::Dentry(Ino::ROOT, format!("f{i}").into_bytes());
            assert!(
                recs.iter().any(|(key, _)| *key == k),
                "round {round}: batch {i} was acknowledged and is lost ({} records, lsn {})",
                recs.len(),
                meta.lsn
            );
        }
        drop(store);
        // The next child starts over with the same names: a fresh store each round.
        std::fs::remove_dir_all(dir.path()).expect("clear");
    }
}
