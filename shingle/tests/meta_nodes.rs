//! Multi-process tests of the metadata service: real `shingle serve` processes (managers
//! and meta nodes) over TCP, a namespace client in the test, nodes killed with SIGKILL.

mod common;

use common::{Cluster, Spec};
use shingle_meta::ids::Ino;
use shingle_meta::namespace::{Creds, Errno, FileKind, SetAttr};
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
        },
    );
    let c = cluster.client().await;
    cluster.wait_ready(&c, 4).await;
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
    // Everything survives restarting every process.
    let mut cluster = cluster;
    for n in &mut cluster.nodes {
        n.kill();
    }
    for n in &mut cluster.nodes {
        n.child = None;
    }
    let mut handles = Vec::new();
    for n in &cluster.nodes {
        let cfg = n.config.clone();
        handles.push(std::thread::spawn(move || common::spawn(&cfg)));
    }
    for (n, h) in cluster.nodes.iter_mut().zip(handles) {
        n.child = Some(h.join().expect("join").0);
    }
    let c = cluster.client().await;
    cluster.wait_ready(&c, 4).await;
    assert_eq!(
        c.lookup(e.ino, b"moved").await.expect("lookup after restart").ino,
        inos["f00"]
    );
    assert_eq!(c.getattr(d.ino).await.expect("getattr").size, 38);
    let all = c.readdir(d.ino, None, 1000).await.expect("readdir");
    assert_eq!(all.len(), 38);
    let _ = Duration::ZERO;
}
