//! Multi-process tests of the metadata service: real `shingle serve` processes (managers
//! and meta nodes) over TCP, a namespace client in the test, nodes killed with SIGKILL.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

mod common;

use common::{Cluster, Spec};
use shingle_meta::ids::Ino;
use shingle_meta::namespace::{Creds, Errno, FileKind, SetAttr};
use shingle_meta::service::wire::{NsOp, OpReply};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

fn root() -> Creds {
    Creds::root()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_operations_across_processes_and_partitions() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cluster = Cluster::start(
        tmp.path(),
        Spec {
            nodes: 4,
            managers: 1,
            data: false,
            partitions: 16,
            down_after_ms: 3000,
            data_toml: "",
            zones: (16, "16MiB"),
            node_toml: "",
            manager_toml: "",
        },
    );
    let c = cluster.client().await;
    cluster.wait_ready(&c).await;
    let r = root();
    let d = c
        .mknod(&r, Ino::ROOT, b"dir", FileKind::Dir, 0o755, 0, None)
        .await
        .expect("mkdir");
    assert_eq!(d.kind, FileKind::Dir);
    assert_eq!(
        c.mknod(&r, Ino::ROOT, b"dir", FileKind::Dir, 0o755, 0, None).await,
        Err(Errno::EEXIST)
    );
    // Enough names to land in every partition.
    let mut inos = BTreeMap::new();
    for i in 0..40 {
        let name = format!("f{i:02}");
        let a = c
            .mknod(&r, d.ino, name.as_bytes(), FileKind::File, 0o644, 0, None)
            .await
            .expect("create");
        inos.insert(name, a.ino);
    }
    let parts: BTreeSet<u32> = inos.values().map(|i| i.partition().0).collect();
    assert!(parts.len() > 8, "names spread over partitions: {parts:?}");
    for (name, ino) in &inos {
        assert_eq!(c.lookup(d.ino, name.as_bytes()).await.expect("lookup").ino, *ino);
    }
    assert_eq!(c.getattr(d.ino).await.expect("getattr").size, 40);
    // Paginated readdir: every name exactly once, in order.
    let mut seen = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = c.readdir(d.ino, after.as_deref(), 7).await.expect("readdir");
        if page.is_empty() {
            break;
        }
        after = page.last().map(|e| e.name.clone());
        seen.extend(page.into_iter().map(|e| String::from_utf8(e.name).expect("utf8")));
    }
    assert_eq!(seen, inos.keys().cloned().collect::<Vec<_>>());
    // With attributes: each inode made with its name lives in the name's partition, and
    // the listing reads it with the entry.
    let plus = c.readdir_plus_as(&r, d.ino, None, 1000).await.expect("readdir plus");
    assert_eq!(plus.len(), inos.len());
    for e in &plus {
        let a = e.attr.as_ref().expect("the attributes of an inode made with its name");
        assert_eq!(*a, c.getattr(e.ino).await.expect("getattr"), "{:?}", e.name);
    }
    assert!(
        c.readdir(d.ino, None, 1000)
            .await
            .expect("readdir")
            .iter()
            .all(|e| e.attr.is_none())
    );
    // Cross-directory rename, hard link, unlink, rmdir, symlink, setattr, xattrs.
    let e = c
        .mknod(&r, Ino::ROOT, b"other", FileKind::Dir, 0o755, 0, None)
        .await
        .expect("mkdir");
    c.rename(&r, d.ino, b"f00", e.ino, b"moved", false, false)
        .await
        .expect("rename");
    assert_eq!(c.lookup(d.ino, b"f00").await, Err(Errno::ENOENT));
    assert_eq!(c.lookup(e.ino, b"moved").await.expect("lookup").ino, inos["f00"]);
    assert_eq!(
        c.rename(&r, d.ino, b"f01", e.ino, b"moved", true, false).await,
        Err(Errno::EEXIST)
    );
    let l = c.link(&r, inos["f01"], e.ino, b"hard").await.expect("link");
    assert_eq!(l.nlink, 2);
    c.unlink(&r, d.ino, b"f01").await.expect("unlink");
    assert_eq!(c.getattr(inos["f01"]).await.expect("getattr").nlink, 1);
    assert_eq!(c.rmdir(&r, Ino::ROOT, b"dir").await, Err(Errno::ENOTEMPTY));
    let s = c
        .mknod(&r, e.ino, b"sym", FileKind::Symlink, 0o777, 0, Some(b"../dir/f02"))
        .await
        .expect("symlink");
    assert_eq!(c.readlink(s.ino).await.expect("readlink"), b"../dir/f02");
    let set = SetAttr {
        perm: Some(0o600),
        uid: Some(1000),
        ..SetAttr::default()
    };
    let a = c.setattr(&r, inos["f02"], set).await.expect("setattr");
    assert_eq!((a.perm, a.uid), (0o600, 1000));
    c.setxattr(&r, inos["f02"], b"user.k", b"v", 0).await.expect("setxattr");
    assert_eq!(c.getxattr(&r, inos["f02"], b"user.k").await.expect("getxattr"), b"v");
    assert_eq!(c.getxattr(&r, inos["f02"], b"user.none").await, Err(Errno::ENODATA));
    // Permissions are the caller's: an ordinary user cannot create in a root-owned 0755 dir.
    let user = Creds {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    };
    assert_eq!(
        c.mknod(&user, d.ino, b"nope", FileKind::File, 0o644, 0, None).await,
        Err(Errno::EACCES)
    );
    // An operation retried with its id (as when its answer was lost) is answered as
    // done, not run again: no ENOENT for the unlink and rename, no EEXIST for the link.
    let (unlink, rename, link) = once_ops(d.ino, e.ino, inos["f05"]);
    let unlinked = c.op_as(&r, unlink.clone(), 0x5eed).await;
    assert!(matches!(unlinked, Ok(OpReply::DoneAt(_))), "{unlinked:?}");
    for _try in 0..2 {
        assert_eq!(
            c.op_as(&r, unlink.clone(), 0x5eed).await,
            unlinked,
            "the same time, too"
        );
        assert_eq!(c.op_as(&r, rename.clone(), 0x5eee).await, Ok(OpReply::Done));
        match c.op_as(&r, link.clone(), 0x5eef).await {
            Ok(OpReply::Attr(a)) => assert_eq!((a.ino, a.nlink), (inos["f05"], 2)),
            other => panic!("link: {other:?}"),
        }
    }
    // The same operations under new ids run again, and fail as they should.
    assert_eq!(c.op_as(&r, unlink.clone(), 0x600d).await, Err(Errno::ENOENT));
    assert_eq!(c.op_as(&r, rename.clone(), 0x600e).await, Err(Errno::ENOENT));
    assert_eq!(c.op_as(&r, link.clone(), 0x600f).await, Err(Errno::EEXIST));
    // Everything survives restarting every process.
    let mut cluster = cluster;
    cluster.local.restart_all(&cluster.spec).expect("restart every node");
    let c = cluster.client().await;
    cluster.wait_ready(&c).await;
    assert_eq!(
        c.lookup(e.ino, b"moved").await.expect("lookup after restart").ino,
        inos["f00"]
    );
    // The records of finished operations are as durable as the operations.
    assert_eq!(c.op_as(&r, unlink, 0x5eed).await, unlinked);
    assert_eq!(c.op_as(&r, rename, 0x5eee).await, Ok(OpReply::Done));
    assert!(matches!(c.op_as(&r, link, 0x5eef).await, Ok(OpReply::Attr(_))));
    assert_eq!(c.getattr(d.ino).await.expect("getattr").size, 37);
    let all = c.readdir(d.ino, None, 1000).await.expect("readdir");
    assert_eq!(all.len(), 37);
    assert_eq!(c.getattr(inos["f05"]).await.expect("getattr").nlink, 2);
    let _ = Duration::ZERO;
}

/// An unlink of `dir/f03`, a rename of `dir/f04` to `dir/f04b` and a link of `file` as
/// `other/hard5`.
fn once_ops(dir: Ino, other: Ino, file: Ino) -> (NsOp, NsOp, NsOp) {
    (
        NsOp::Unlink {
            parent: dir,
            name: b"f03".to_vec(),
            keep_secs: 0,
        },
        NsOp::Rename {
            parent: dir,
            name: b"f04".to_vec(),
            newparent: dir,
            newname: b"f04b".to_vec(),
            noreplace: false,
            exchange: false,
        },
        NsOp::Link {
            ino: file,
            newparent: other,
            newname: b"hard5".to_vec(),
        },
    )
}

/// What the workload knows about one file.
#[derive(Clone, Debug)]
enum Known {
    /// Acknowledged at this place.
    At(Ino, String),
    /// The create was not acknowledged: absent, or at this place.
    MaybeAt(Ino, String),
    /// Unlinked (acknowledged).
    Gone(Ino, String),
    /// A rename was not acknowledged: at exactly one of the two places.
    OneOf((Ino, String), (Ino, String)),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nodes_mid_workload_loses_no_acknowledged_operation() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut cluster = Cluster::start(
        tmp.path(),
        Spec {
            nodes: 5,
            managers: 3,
            data: false,
            partitions: 16,
            down_after_ms: 1500,
            data_toml: "",
            zones: (16, "16MiB"),
            node_toml: "",
            manager_toml: "",
        },
    );
    let c = cluster.client().await;
    cluster.wait_ready(&c).await;
    let r = root();
    let a = c
        .mknod(&r, Ino::ROOT, b"a", FileKind::Dir, 0o755, 0, None)
        .await
        .expect("mkdir a");
    let b = c
        .mknod(&r, Ino::ROOT, b"b", FileKind::Dir, 0o755, 0, None)
        .await
        .expect("mkdir b");
    let known = std::sync::Arc::new(parking_lot::Mutex::new(BTreeMap::<String, Known>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    // Answers a client retrying an operation whose coordinator died must not get (the
    // first try's effect seen as an error): each operation is applied exactly once.
    let wrong = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    for w in 0..4u64 {
        let (c, known, stop, wrong) = (c.clone(), known.clone(), stop.clone(), wrong.clone());
        let (a, b) = (a.ino, b.ino);
        workers.push(tokio::spawn(async move {
            let r = root();
            let mut acked = 0u32;
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let id = format!("w{w}-{i}");
                let dir = if i % 2 == 0 { a } else { b };
                match c.mknod(&r, dir, id.as_bytes(), FileKind::File, 0o644, 0, None).await {
                    Ok(_) => {
                        acked += 1;
                        known.lock().insert(id.clone(), Known::At(dir, id.clone()));
                    }
                    Err(e) => {
                        if e == Errno::EEXIST {
                            wrong.lock().push(format!("create of {id}: {e:?}"));
                        }
                        known.lock().insert(id.clone(), Known::MaybeAt(dir, id.clone()));
                        continue;
                    }
                }
                let (mut at, mut name) = (dir, id.clone());
                if i % 3 == 0 {
                    // Move it to the other directory under a new name.
                    let (to, new) = (if dir == a { b } else { a }, format!("{id}-r"));
                    let res = c.rename(&r, dir, id.as_bytes(), to, new.as_bytes(), false, false).await;
                    let k = match res {
                        Ok(()) => {
                            (at, name) = (to, new.clone());
                            Known::At(to, new)
                        }
                        Err(e) => {
                            if matches!(e, Errno::ENOENT | Errno::EEXIST) {
                                wrong.lock().push(format!("rename of {id}: {e:?}"));
                            }
                            known
                                .lock()
                                .insert(id.clone(), Known::OneOf((dir, id.clone()), (to, new)));
                            continue;
                        }
                    };
                    known.lock().insert(id.clone(), k);
                }
                if i % 4 == 0 {
                    let k = match c.unlink(&r, at, name.as_bytes()).await {
                        Ok(()) => Known::Gone(at, name),
                        Err(e) => {
                            if e == Errno::ENOENT {
                                wrong.lock().push(format!("unlink of {id}: {e:?}"));
                            }
                            Known::MaybeAt(at, name)
                        }
                    };
                    known.lock().insert(id, k);
                }
            }
            acked
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.local.nodes[4].kill(); // a meta node
    tokio::time::sleep(Duration::from_millis(2500)).await;
    cluster.local.nodes[1].kill(); // a manager and meta node
    tokio::time::sleep(Duration::from_millis(2500)).await;
    cluster.restart(4);
    cluster.restart(1);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked = 0;
    for w in workers {
        acked += w.await.expect("worker");
    }
    eprintln!("workload: {acked} acknowledged creates");
    let wrong = wrong.lock().clone();
    assert!(
        wrong.is_empty(),
        "operations applied twice (retries saw their own effect): {wrong:?}"
    );
    assert!(
        acked > 10,
        "the workload made progress through the failures: {acked} creates"
    );
    cluster.wait_ready(&c).await;
    // Operations whose coordinator was killed are finished by the partition's primary
    // from their intents (after two sweeps, a few seconds): wait until the directory
    // counts agree with the entries, i.e. recovery has converged.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let names = loop {
        let mut names: BTreeMap<(Ino, String), Ino> = BTreeMap::new();
        let mut consistent = true;
        for dir in [a.ino, b.ino] {
            let entries = c.readdir(dir, None, 100_000).await.expect("readdir");
            let size = c.getattr(dir).await.expect("getattr").size;
            if size != entries.len() as u64 {
                eprintln!("dir {dir}: size {size}, {} entries (recovery pending)", entries.len());
                consistent = false;
            }
            for e in entries {
                names.insert((dir, String::from_utf8(e.name).expect("utf8")), e.ino);
            }
        }
        if consistent {
            break names;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "directory sizes never matched their entries"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let known = known.lock().clone();
    let mut accounted = 0usize;
    for (id, k) in &known {
        let here = |p: &(Ino, String)| names.contains_key(p);
        match k {
            Known::At(d, n) => {
                assert!(here(&(*d, n.clone())), "acknowledged {id} missing at {n}");
                accounted += 1;
            }
            Known::MaybeAt(d, n) => accounted += usize::from(here(&(*d, n.clone()))),
            Known::Gone(d, n) => assert!(!here(&(*d, n.clone())), "unlinked {id} still at {n}"),
            Known::OneOf(x, y) => {
                assert!(
                    here(x) ^ here(y),
                    "rename of {id} half applied: {x:?} {} / {y:?} {}",
                    here(x),
                    here(y)
                );
                accounted += 1;
            }
        }
    }
    assert_eq!(accounted, names.len(), "no entries beyond those the workload made");
    // Inode numbers stay unique through primary changes (a promoted replica must not
    // hand out counters its old primary already used).
    let mut by_ino: BTreeMap<Ino, &(Ino, String)> = BTreeMap::new();
    for (name, ino) in &names {
        if let Some(other) = by_ino.insert(*ino, name) {
            panic!("inode {ino} is both {other:?} and {name:?}");
        }
    }
}

/// A primary killed and restarted before the managers notice takes over a second time
/// in the same map epoch. Its new reign must be told apart from its first: when both
/// were numbered (epoch, lsn from 0), the members still on the first acknowledged the
/// second's batches without applying them, and a later change of primary lost
/// acknowledged creates (seen in the netns rig: entries gone, inodes left).
/// Three metadata nodes, four partitions, whose restarts and hangs the managers do not
/// notice: Down only after 30 s of silence, and no report of refused connections marks
/// a node Down either, so the map stays.
fn unnoticed_restarts(managers: usize) -> Spec {
    Spec {
        nodes: 3,
        managers,
        data: false,
        partitions: 4,
        down_after_ms: 30_000,
        data_toml: "",
        zones: (16, "16MiB"),
        node_toml: "",
        manager_toml: "down_on_refused = false\n",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_restarted_unnoticed_starts_a_reign_its_members_follow() {
    use shingle_meta::service::wire::{Read, ReadOp, call};
    let tmp = tempfile::tempdir().expect("tmp");
    let mut cluster = Cluster::start(tmp.path(), unnoticed_restarts(3));
    let c = cluster.client().await;
    cluster.wait_ready(&c).await;
    let r = root();
    let d = c
        .mknod(&r, Ino::ROOT, b"d", FileKind::Dir, 0o755, 0, None)
        .await
        .expect("mkdir d")
        .ino;
    // Enough batches that every partition's members are well past lsn 0.
    for i in 0..60 {
        c.mknod(&r, d, format!("before-{i}").as_bytes(), FileKind::File, 0o644, 0, None)
            .await
            .expect("create before");
    }
    let epoch = c.view().map.epoch;
    let victim = c
        .view()
        .primary(shingle_meta::ids::PartitionId(1))
        .expect("partition 1 has a primary");
    cluster.restart(victim.0 as usize - 1);
    cluster.wait_ready(&c).await;
    let mut names = Vec::new();
    for i in 0..60 {
        let name = format!("after-{i}");
        c.mknod(&r, d, name.as_bytes(), FileKind::File, 0o644, 0, None)
            .await
            .expect("create after");
        names.push(name);
    }
    let v = c.view();
    assert_eq!(
        v.map.epoch, epoch,
        "the restart went unnoticed (else this does not test a second reign in one epoch)"
    );
    // Every member of each entry's partition has it: asked one by one.
    let mut missing = Vec::new();
    for name in names.iter() {
        let p = shingle_meta::placement::dentry_partition(d, name.as_bytes(), v.map.partitions);
        for m in v.members(p) {
            let addr = v.addr(m).expect("member address");
            let req = Read {
                epoch: v.map.epoch,
                op: ReadOp::Lookup {
                    parent: d,
                    name: name.as_bytes().to_vec(),
                },
            };
            // A member still catching up answers EAGAIN: ask again.
            let mut got = Err(String::new());
            for _ in 0..50 {
                got = call(c.transport(), addr, &req, Duration::from_secs(2))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                if !got.as_ref().is_err_and(|e| e.contains("EAGAIN")) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if let Err(e) = got {
                missing.push(format!("{name} (partition {}) on node {}: {e}", p.0, m.0));
            }
        }
    }
    assert!(missing.is_empty(), "members lack acknowledged entries: {missing:#?}");
}

/// Asks node `addr` directly for `name` in `dir` until it has it or `within` passes.
async fn lookup_on(
    c: &shingle_meta::meta_client::MetaClient,
    addr: std::net::SocketAddr,
    dir: Ino,
    name: &str,
    within: Duration,
) -> Result<(), String> {
    use shingle_meta::service::wire::{Read, ReadOp, call};
    let deadline = std::time::Instant::now() + within;
    loop {
        let req = Read {
            epoch: c.view().map.epoch,
            op: ReadOp::Lookup {
                parent: dir,
                name: name.as_bytes().to_vec(),
            },
        };
        let got = call(c.transport(), addr, &req, Duration::from_secs(5))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
        // A member that is down or not serving yet (EAGAIN, refused, the client's
        // reconnect backoff), or that does not have the entry: ask again until `within`.
        match got {
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            r => return r,
        }
    }
}

/// Waits until the map says node `id` is up (or down).
async fn wait_map(c: &shingle_meta::meta_client::MetaClient, id: shingle_meta::ids::NodeId, up: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while c.view().map.is_up(id) != up {
        assert!(std::time::Instant::now() < deadline, "node {} never seen up={up}", id.0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Node `id` is killed, misses the create of `name` while the map has it down, and
/// comes back: it must then have `name` (caught up). How long that took after the map
/// showed it up again.
async fn miss_a_change(
    cluster: &mut Cluster,
    c: &shingle_meta::meta_client::MetaClient,
    id: shingle_meta::ids::NodeId,
    name: &str,
) -> Duration {
    cluster.local.nodes[id.0 as usize - 1].kill();
    wait_map(c, id, false).await;
    c.mknod(&root(), Ino::ROOT, name.as_bytes(), FileKind::File, 0o644, 0, None)
        .await
        .unwrap_or_else(|e| panic!("create {name} while node {} is down: {e}", id.0));
    cluster.restart(id.0 as usize - 1);
    wait_map(c, id, true).await;
    let t = std::time::Instant::now();
    let addr = c.view().addr(id).expect("addr");
    lookup_on(c, addr, Ino::ROOT, name, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("node {} returned and caught up with {name}: {e}", id.0));
    t.elapsed()
}

/// A partition larger than a transport frame still moves: to a member that missed
/// batches (install) and to a returning primary (pull at takeover), in pieces. Before,
/// the whole copy was one frame, and a partition over the limit (64 MiB by default)
/// could never be copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_larger_than_a_frame_installs_and_is_pulled() {
    let big: Option<usize> = std::env::var("SHINGLE_BIG_PARTITION_FILES")
        .ok()
        .and_then(|v| v.parse().ok());
    let tmp = tempfile::tempdir().expect("tmp");
    let mut cluster = Cluster::start(
        tmp.path(),
        Spec {
            nodes: 3,
            managers: 3,
            data: false,
            partitions: 1,
            down_after_ms: 1500,
            data_toml: "",
            zones: (16, "16MiB"),
            // Frames of 1 MiB (the cluster's setting): the partition below is several
            // times that, so it moves in pieces as a multi-GiB one would in 64 MiB frames.
            // SHINGLE_BIG_PARTITION_FILES=N keeps the default 64 MiB frames and makes
            // the partition N × 64 KiB (1100: ~70 MiB, the figure in docs/benchmarks.md).
            node_toml: if big.is_some() {
                ""
            } else {
                "max_frame_bytes = \"1MiB\"\n"
            },
            manager_toml: "",
        },
    );
    let c = cluster.client().await;
    cluster.wait_ready(&c).await;
    // 80 files with a 64 KiB extended attribute each: about 5 MiB in partition 0.
    let files = big.unwrap_or(80);
    let mut workers = Vec::new();
    for w in 0..8usize {
        let c = c.clone();
        workers.push(tokio::spawn(async move {
            let r = root();
            for i in (w..files).step_by(8) {
                let name = format!("big-{i:04}");
                let a = c
                    .mknod(&r, Ino::ROOT, name.as_bytes(), FileKind::File, 0o644, 0, None)
                    .await
                    .expect("create");
                let value = common::pattern(i as u64, 65_536);
                c.setxattr(&r, a.ino, b"user.blob", &value, 0).await.expect("setxattr");
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let p = shingle_meta::ids::PartitionId(0);
    let v = c.view();
    let members = v.members(p);
    assert_eq!(members.len(), 3, "three members: {members:?}");
    let (primary, replica) = (members[0], members[2]);

    // A member misses a batch while it is down, so it must install the whole copy.
    let t = miss_a_change(&mut cluster, &c, replica, "while-replica-down").await;
    eprintln!("install of a partition of {files} files with 64 KiB attributes: serving after {t:?}");
    // The primary returns after changes it did not see: it pulls the best copy.
    let t = miss_a_change(&mut cluster, &c, primary, "while-primary-down").await;
    eprintln!("takeover pulling it: serving after {t:?}");
    c.mknod(&root(), Ino::ROOT, b"after", FileKind::File, 0o644, 0, None)
        .await
        .expect("the primary serves writes");
    // Every member has everything, the attributes included.
    for m in c.view().members(p) {
        let addr = c.view().addr(m).expect("addr");
        let last = format!("big-{:04}", files - 1);
        for name in ["big-0000", &last, "while-replica-down", "while-primary-down", "after"] {
            lookup_on(&c, addr, Ino::ROOT, name, Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("{name} on node {}: {e}", m.0));
        }
    }
    let a = c
        .lookup(Ino::ROOT, format!("big-{:04}", files - 1).as_bytes())
        .await
        .expect("lookup");
    let value = c.getxattr(&root(), a.ino, b"user.blob").await.expect("getxattr");
    assert_eq!(value, common::pattern(files as u64 - 1, 65_536));
}

/// A node reported unreachable is marked Down as soon as the manager leader finds its
/// address refusing connections — long before `down_after_ms` (30 s here) of heartbeat
/// silence — and a create in a partition it led goes on at once on the next primary.
/// A live node reported unreachable stays Up (the report is a hint; the leader checks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_reported_unreachable_is_down_at_once_a_live_one_stays_up() {
    use shingle_meta::ids::NodeId;
    use shingle_meta::map::NodeState;
    use std::time::Instant;
    let tmp = tempfile::tempdir().expect("tmp");
    let mut cluster = Cluster::start(
        tmp.path(),
        Spec {
            nodes: 4,
            managers: 3,
            data: false,
            partitions: 8,
            down_after_ms: 30_000,
            data_toml: "",
            zones: (16, "16MiB"),
            node_toml: "",
            manager_toml: "",
        },
    );
    let c = cluster.client().await;
    cluster.wait_ready(&c).await;
    let state =
        |c: &shingle_meta::meta_client::MetaClient, id: u64| c.maps().current().nodes.get(&NodeId(id)).map(|n| n.state);
    // A live node: reported, probed, left Up.
    c.maps().report_unreachable(NodeId(4));
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.maps().refresh(c.view().map.epoch, Duration::from_millis(300)).await;
    assert_eq!(
        state(&c, 4),
        Some(NodeState::Up),
        "a live node was marked Down on a report"
    );

    // Node 4 (not a manager) dies; a create whose partition it led is retried by the
    // client, which reports it.
    let victim = 4u64;
    let parts = c.view().map.partitions;
    let name = (0..10_000)
        .map(|i| format!("f{i}"))
        .find(|n| {
            let p = shingle_meta::placement::dentry_partition(Ino::ROOT, n.as_bytes(), parts);
            c.view().primary(p) == Some(NodeId(victim))
        })
        .expect("a name in a partition node 4 leads");
    cluster.local.nodes[victim as usize - 1].kill();
    let t = Instant::now();
    c.mknod(&root(), Ino::ROOT, name.as_bytes(), FileKind::File, 0o644, 0, None)
        .await
        .expect("create after the primary died");
    let took = t.elapsed();
    assert_eq!(state(&c, victim), Some(NodeState::Down), "the dead node is not Down");
    assert!(
        took < Duration::from_secs(10),
        "the create waited {took:?}: the report did not mark the node Down"
    );
    eprintln!("create in a partition whose primary died: {took:?}");
}

/// A coordinator whose node dies while it holds a directory's lock: the lock host frees
/// the key as soon as the partition of the coordinator's operation has a new primary
/// that redid what it left (nothing here), not after a timeout — the fallback is set to
/// ten minutes and the lease to two, far past the create's 20 s below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_of_a_dead_coordinator_go_once_its_partition_settles() {
    use shingle_meta::ids::{NodeId, PartitionId};
    use shingle_meta::service::wire::{Lock, call};
    let tmp = tempfile::tempdir().expect("tmp");
    let mut cluster = Cluster::start_with_meta(
        tmp.path(),
        Spec {
            nodes: 4,
            managers: 1,
            data: false,
            partitions: 16,
            down_after_ms: 3000,
            data_toml: "",
            zones: (16, "16MiB"),
            node_toml: "",
            manager_toml: "",
        },
        "dead_coordinator_locks_ms = 600000",
    );
    let c = cluster.client().await;
    cluster.wait_ready(&c).await;
    let r = root();
    let d = c
        .mknod(&r, Ino::ROOT, b"d", FileKind::Dir, 0o755, 0, None)
        .await
        .expect("mkdir");
    let v = c.view();
    // The lock host of d, and a victim that is neither it nor the manager (node 1).
    let host = v.primary(d.ino.partition()).expect("lock host");
    let victim = (2..=4).map(NodeId).find(|n| *n != host).expect("a victim");
    let anchor = (0..16)
        .map(PartitionId)
        .find(|p| v.primary(*p) == Some(victim))
        .expect("a partition the victim is primary of");
    let lock = Lock {
        keys: vec![d.ino.0],
        owner: shingle_meta::service::locks::owner_id(victim.0, 42),
        lease_ms: 600_000,
        wait_ms: 0,
        release: false,
        anchor,
        // What a coordinator reads next, read by the host once the key is held.
        fetch: Some(shingle_meta::service::wire::Fetch {
            epoch: v.map.epoch,
            inodes: vec![d.ino],
            ..Default::default()
        }),
    };
    let host_addr = v.addr(host).expect("host address");
    let locked = call(c.transport(), host_addr, &lock, Duration::from_secs(2))
        .await
        .expect("lock");
    assert!(locked.granted, "the victim's coordinator holds d");
    let fetched = locked.fetched.expect("read once held");
    assert_eq!(
        fetched.inodes.first().and_then(|r| r.as_ref()).map(|r| r.attr.ino),
        Some(d.ino),
        "the lock's host read d"
    );
    // Held: a create in d waits for it.
    let impatient = c.clone().with_timeout(Duration::from_millis(1500));
    assert!(
        impatient
            .mknod(&r, d.ino, b"early", FileKind::File, 0o644, 0, None)
            .await
            .is_err(),
        "a create in d while the lock is held"
    );
    // The coordinator's node dies: once its partition has a new primary with nothing
    // left to redo, the key goes and the create goes through.
    cluster.local.nodes[victim.0 as usize - 1].kill();
    let started = std::time::Instant::now();
    c.mknod(&r, d.ino, b"after", FileKind::File, 0o644, 0, None)
        .await
        .expect("create once the dead coordinator's lock is freed");
    eprintln!(
        "create in the dead coordinator's directory took {:?}",
        started.elapsed()
    );
    // A node that is not Up may not take keys (its coordinations are fenced).
    let refused = call(c.transport(), host_addr, &lock, Duration::from_secs(2))
        .await
        .expect("lock");
    assert!(!refused.granted, "a Down node's coordinator takes no lock");
    assert_eq!(refused.fetched, None, "nothing is read for a lock not granted");
}

/// Writers of one directory share its partition's batches (decision 0033) and lose
/// nothing by it: 64 creates at once into one directory (every one of them adds to the
/// directory's counts in one partition), then 64 unlinks at once. Every name is there,
/// then none is, the directory's counts say so at each step, and the nodes' metrics
/// show batches that carried more than one write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_of_one_directory_share_its_batches_and_lose_nothing() {
    const N: usize = 64;
    let tmp = tempfile::tempdir().expect("tmp");
    let base = common::free_run(3);
    let cluster = Cluster::start_with_metrics(
        tmp.path(),
        Spec {
            data: false,
            ..Spec::small(3)
        },
        base,
    );
    let c = cluster.client().await;
    cluster.wait_ready(&c).await;
    let r = root();
    let d = c
        .mknod(&r, Ino::ROOT, b"shared", FileKind::Dir, 0o755, 0, None)
        .await
        .expect("mkdir");
    let names: Vec<String> = (0..N).map(|i| format!("f{i:03}")).collect();
    let made = futures_util::future::join_all(
        names
            .iter()
            .map(|n| c.mknod(&r, d.ino, n.as_bytes(), FileKind::File, 0o644, 0, None)),
    )
    .await;
    let inos: BTreeSet<Ino> = made.into_iter().map(|a| a.expect("create").ino).collect();
    assert_eq!(inos.len(), N, "every create made an inode of its own");
    let listed = c.readdir(d.ino, None, 1000).await.expect("readdir");
    let listed: Vec<String> = listed
        .into_iter()
        .map(|e| String::from_utf8(e.name).expect("utf8"))
        .collect();
    assert_eq!(listed, names, "every name, once");
    assert_eq!(c.getattr(d.ino).await.expect("getattr").size, N as u64);
    let gone = futures_util::future::join_all(names.iter().map(|n| c.unlink(&r, d.ino, n.as_bytes()))).await;
    assert!(gone.iter().all(Result::is_ok), "unlinks: {gone:?}");
    assert!(c.readdir(d.ino, None, 1000).await.expect("readdir").is_empty());
    assert_eq!(c.getattr(d.ino).await.expect("getattr").size, 0);
    c.rmdir(&r, Ino::ROOT, b"shared")
        .await
        .expect("rmdir of the emptied directory");

    let (mut batches, mut writes) = (0u64, 0u64);
    for id in 1..=3u16 {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], base + id));
        let (status, body) = common::http_get(addr, "/metrics").expect("scrape");
        assert_eq!(status, 200);
        let value = |name: &str| -> u64 {
            body.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {name} on node {id}")) as u64
        };
        batches += value("shingle_meta_batches_total");
        writes += value("shingle_meta_batch_writes_total");
    }
    eprintln!("{writes} writes in {batches} batches");
    assert!(
        writes > batches,
        "no batch carried two writes ({writes} writes, {batches} batches)"
    );
}

/// An operation that reaches a partition's primary while it is still taking over
/// waits there for the copy to serve, instead of bouncing `EAGAIN` back into the
/// client's doubling back-off (a create once waited 515 ms of back-off for a takeover
/// of ~320 ms). The primary restarts unnoticed (as in the test above: it must take
/// over again in a new reign) while a member hangs (SIGSTOP, not dead: the map keeps
/// it Up), so the takeover cannot end; the chmod must be answered once the member runs
/// again, and the primary must count it among the operations that waited there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_at_a_primary_taking_over_waits_for_it_to_serve() {
    use shingle_meta::ids::NodeId;
    let tmp = tempfile::tempdir().expect("tmp");
    let base = common::free_run(3);
    let mut cluster = Cluster::start_with_metrics(
        tmp.path(),
        // The restart and the hanging member go unnoticed: the map stays.
        unnoticed_restarts(1),
        base,
    );
    let c = cluster.client().await;
    cluster.wait_ready(&c).await;
    let r = root();
    let f = c
        .mknod(&r, Ino::ROOT, b"f", FileKind::File, 0o644, 0, None)
        .await
        .expect("create f")
        .ino;
    let p = f.partition();
    let epoch = c.view().map.epoch;
    let members = c.view().members(p);
    assert_eq!(members.len(), 3, "every node holds {p:?}: {members:?}");
    let (primary, hangs) = (members[0], members[1]);
    let node = |n: NodeId| n.0 as usize - 1;
    cluster.local.nodes[node(primary)].kill();
    cluster.local.nodes[node(hangs)].freeze().expect("SIGSTOP");
    let hanging = cluster.local.nodes[node(hangs)].pid().expect("pid");

    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let chmod = {
        let (c, r, answered) = (c.clone(), r.clone(), answered.clone());
        tokio::spawn(async move {
            let set = SetAttr {
                perm: Some(0o600),
                ..SetAttr::default()
            };
            let got = c.setattr(&r, f, set).await;
            answered.store(true, std::sync::atomic::Ordering::SeqCst);
            got
        })
    };
    // The member runs again after long enough for the chmod to reach the restarted
    // primary while its takeover waits for it.
    let thaw = {
        let answered = answered.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(3));
            let early = answered.load(std::sync::atomic::Ordering::SeqCst);
            (early, shingle::local::signal(hanging, "-CONT").is_ok())
        })
    };
    // A restarted node is started once it caught up: after the thaw.
    tokio::task::block_in_place(|| cluster.restart(node(primary)));
    let (early, thawed) = thaw.join().expect("thaw thread");
    assert!(thawed, "SIGCONT");
    assert!(!early, "the chmod was answered before the takeover could end");
    let attr = tokio::time::timeout(Duration::from_secs(30), chmod)
        .await
        .expect("the chmod is answered once the takeover ends")
        .expect("join")
        .expect("chmod");
    assert_eq!(attr.perm & 0o7777, 0o600);
    assert_eq!(
        c.view().map.epoch,
        epoch,
        "the map stayed (else this tests a new primary)"
    );

    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], base + primary.0 as u16));
    let (status, body) = common::http_get(addr, "/metrics").expect("scrape");
    assert_eq!(status, 200);
    let waits = body
        .lines()
        .find_map(|l| {
            l.strip_prefix("shingle_meta_op_serve_waits_total ")?
                .parse::<f64>()
                .ok()
        })
        .expect("shingle_meta_op_serve_waits_total on the primary");
    assert!(
        waits >= 1.0,
        "the chmod did not wait at the primary for its takeover ({waits})"
    );
}
