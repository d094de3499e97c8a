//! Client keys (issue 16 part 1), on six real `shingle serve` processes and real FUSE
//! mounts: `shingle client grant` writes a key a mount uses instead of the cluster
//! secret; a read-write key's root acts as nobody (65534); a read-only key mounts
//! read-only and its nodes refuse its changes even when the kernel is bypassed; no
//! client key may send what only the cluster's nodes send; a tenant key acts as one
//! uid and gid whatever its host asserts, and it writes or deletes shards only of
//! files it may write (shard capabilities); a key confined to a directory sees and
//! changes nothing else, and mounts it as its root; a revoked key is refused
//! by every node while other keys go on working.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

mod common;

use bytes::{Bytes, BytesMut};
use common::{Cluster, SecondMount, Spec, pattern, tool};
use shingle_data::shard::{ShardReadError, read_shard};
use shingle_data::wire::{
    DeleteShard, DeleteShardRequest, Scrub, ScrubRequest, ShardId, StageShard, StageShardRequest, WriteShard,
    WriteShardRequest,
};
use shingle_meta::agent::{MapWatch, WatchConfig};
use shingle_meta::ids::Ino;
use shingle_meta::manager::rpc::{Propose, ProposeRequest};
use shingle_meta::meta_client::MetaClient;
use shingle_meta::namespace::{Creds, Errno, FileKind};
use shingle_transport::{CallOptions, ClusterSecret, Code, PeerClient, RemoteRead, RpcChannel, TransportConfig};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

fn grant(root: &Path, name: &str, extra: &[&str]) -> std::path::PathBuf {
    let key = root.join(format!("{name}.key"));
    let mut args = vec!["client", "grant", name, "--out", key.to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    let out = tool(root, &args);
    assert!(
        out.status.success(),
        "grant {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("granted {name}#1")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let mode = std::fs::metadata(&key).expect("key file").mode() & 0o777;
    assert_eq!(mode, 0o600, "the key file is private");
    key
}

/// A namespace client that connects with `key`.
async fn client_with(cluster: &Cluster, key: &Path) -> (PeerClient, MetaClient) {
    let tcp = PeerClient::new(TransportConfig::default(), ClusterSecret::from_file(key).expect("key"));
    let wc = WatchConfig {
        managers: cluster.local.managers.clone(),
        node: None,
        interval: Duration::from_millis(500),
        touch_timeout: Duration::from_secs(5),
    };
    let maps = MapWatch::start(tcp.clone(), wc, Duration::from_secs(30), |_| {})
        .await
        .expect("a client key reads the map");
    (tcp.clone(), MetaClient::new(tcp, maps))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_keys_do_what_their_grant_says_and_stop_when_revoked() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("cluster");
    let cluster = Cluster::start(&root, Spec::small(6));
    let admin = cluster.client().await;
    cluster.wait_ready(&admin).await;
    let shared = admin
        .mknod(&Creds::root(), Ino::ROOT, b"shared", FileKind::Dir, 0o777, 0, None)
        .await
        .expect("mkdir /shared");

    let writer_key = grant(&root, "writer", &[]);
    let reader_key = grant(&root, "reader", &["--read-only"]);
    let refused = tool(
        &root,
        &[
            "client",
            "grant",
            "writer",
            "--out",
            writer_key.to_str().expect("utf-8"),
        ],
    );
    assert!(!refused.status.success(), "a key file is never overwritten");

    // Read-write, root squashed: root's new file belongs to nobody.
    let writer = SecondMount::with_key(&root, &writer_key, &tmp.path().join("w"), &[]);
    let data = pattern(7, 3 << 20);
    let file = writer.mount.join("shared/f.bin");
    std::fs::write(&file, &data).expect("write through the writer's mount");
    let meta = std::fs::metadata(&file).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "root is squashed");
    let e = std::fs::write(writer.mount.join("at-root"), b"x").expect_err("nobody may not write /");
    assert_eq!(e.raw_os_error(), Some(libc_eacces()), "{e}");

    // A tenant: every uid of its host acts as 2000:3000. Its files are its own, and
    // the squashed writer's file is not.
    let tenant_key = grant(&root, "tenant", &["--act-as", "2000:3000"]);
    let tenant = SecondMount::with_key(&root, &tenant_key, &tmp.path().join("t"), &[]);
    let mine = tenant.mount.join("shared/tenant.txt");
    std::fs::write(&mine, b"mine").expect("the tenant writes its own file");
    let meta = std::fs::metadata(&mine).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (2000, 3000), "everyone acts as the tenant");
    let e = std::fs::write(tenant.mount.join("shared/f.bin"), b"x").expect_err("not the tenant's file");
    assert_eq!(e.raw_os_error(), Some(libc_eacces()), "{e}");
    drop(tenant);
    lookups_and_listings_are_checked_for_the_key(&cluster, &admin, &tenant_key, shared.ino).await;
    shards_need_a_capability_for_their_file(&cluster, &admin, &tenant_key, shared.ino).await;

    // Read-only: the mount is read-only, and the nodes refuse changes anyway.
    let reader = SecondMount::with_key(&root, &reader_key, &tmp.path().join("r"), &[]);
    assert!(std::fs::read(reader.mount.join("shared/f.bin")).expect("read") == data);
    kept_groups_never_refuse_what_current_ones_allow(&admin, &reader.mount, shared.ino).await;
    let e = std::fs::write(reader.mount.join("shared/g"), b"x").expect_err("read-only");
    assert_eq!(e.raw_os_error(), Some(30), "EROFS: {e}");
    let (reader_tcp, reader_meta) = client_with(&cluster, &reader_key).await;
    let e = reader_meta
        .mknod(&Creds::root(), shared.ino, b"g", FileKind::File, 0o644, 0, None)
        .await
        .expect_err("the nodes refuse a read-only key's change");
    assert_eq!(e, Errno::EROFS);
    assert!(
        reader_meta
            .lookup_as(&Creds::root(), shared.ino, b"f.bin")
            .await
            .is_ok(),
        "reads work"
    );

    // What only nodes and admins send: a proposal to the managers, a scrub.
    let manager = cluster.local.managers[0];
    let (writer_tcp, _) = client_with(&cluster, &writer_key).await;
    for tcp in [&reader_tcp, &writer_tcp] {
        let r = tcp
            .call::<Propose>(
                manager,
                &ProposeRequest {
                    command_json: r#"{"RevokeClient":{"name":"reader"}}"#.into(),
                    forwarded: false,
                },
                CallOptions::default(),
            )
            .await;
        assert_eq!(
            r.expect_err("refused").status().map(|s| s.code),
            Some(Code::PermissionDenied)
        );
        let r = tcp
            .call::<Scrub>(manager, &ScrubRequest {}, CallOptions::default())
            .await;
        assert_eq!(
            r.expect_err("refused").status().map(|s| s.code),
            Some(Code::PermissionDenied)
        );
    }

    a_subtree_key_sees_only_its_directory(&root, &cluster, &admin, &writer, shared.ino, tmp.path()).await;

    // Revoked: every node refuses the writer within a heartbeat or two; the reader
    // goes on.
    let out = tool(&root, &["client", "revoke", "writer"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut i = 0;
    loop {
        i += 1;
        match std::fs::write(writer.mount.join(format!("shared/after-{i}")), b"x") {
            Err(e) if e.raw_os_error() == Some(libc_eacces()) => break,
            r => assert!(Instant::now() < deadline, "a revoked key still writes: {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(std::fs::read(reader.mount.join("shared/f.bin")).expect("reader still reads") == data);
    let list = tool(&root, &["client", "list"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(
        text.contains("revoked") && text.contains("read-only, root squashed"),
        "{text}"
    );
}

/// Names are the nodes' to guard too: a tenant (every uid acts as 2000:3000) asking
/// the nodes directly cannot look up or list in root's 0700 directory, whatever
/// credentials it sends, and a plain lookup or listing (which carries none) is
/// refused to any client key.
async fn lookups_and_listings_are_checked_for_the_key(cluster: &Cluster, admin: &MetaClient, key: &Path, shared: Ino) {
    let c = Creds::root();
    let private = admin
        .mknod(&c, shared, b"hr", FileKind::Dir, 0o700, 0, None)
        .await
        .expect("mkdir /shared/hr");
    admin
        .mknod(&c, private.ino, b"payroll.csv", FileKind::File, 0o644, 0, None)
        .await
        .expect("a name worth hiding");
    let (_, tenant) = client_with(cluster, key).await;
    let names = tenant.lookup_as(&c, shared, b"hr").await.expect("/shared is 0777");
    assert_eq!(names.ino, private.ino);
    assert_eq!(
        tenant.lookup_as(&c, private.ino, b"payroll.csv").await.err(),
        Some(Errno::EACCES),
        "no search permission on root's 0700 directory"
    );
    assert_eq!(
        tenant.readdir_as(&c, private.ino, None, 100).await.err(),
        Some(Errno::EACCES),
        "no read permission on it"
    );
    assert_eq!(tenant.lookup(shared, b"hr").await.err(), Some(Errno::EACCES));
    assert_eq!(tenant.readdir(shared, None, 100).await.err(), Some(Errno::EACCES));
    let listed = tenant.readdir_as(&c, shared, None, 100).await.expect("list /shared");
    assert!(listed.iter().any(|e| e.name == b"hr"), "{listed:?}");
    // Attributes come with a listing only where the key may also search the directory
    // (as `ls -l` of a directory one may read but not search shows none).
    let plus = tenant
        .readdir_plus_as(&c, shared, None, 100)
        .await
        .expect("list /shared");
    assert!(plus.iter().any(|e| e.name == b"hr" && e.attr.is_some()), "{plus:?}");
    let readable = admin
        .mknod(&c, shared, b"readable", FileKind::Dir, 0o744, 0, None)
        .await
        .expect("mkdir /shared/readable");
    admin
        .mknod(&c, readable.ino, b"inside", FileKind::File, 0o644, 0, None)
        .await
        .expect("a file in it");
    let plus = tenant
        .readdir_plus_as(&c, readable.ino, None, 100)
        .await
        .expect("0744: readable");
    assert_eq!(plus.len(), 1);
    assert!(plus[0].name == b"inside" && plus[0].attr.is_none(), "{plus:?}");
    let own = admin
        .readdir_plus_as(&c, readable.ino, None, 100)
        .await
        .expect("the secret lists");
    assert!(own[0].attr.is_some(), "the cluster secret's listing carries attributes");
}

/// A key confined to /shared/proj (`--path`, root kept): its mount shows that
/// directory as its root, and works there as any mount does; asked directly, every
/// node refuses it (EACCES) whatever names an inode outside — the root, a sibling's
/// file, a rename or link out, a listing of the root — and no capability for a file
/// outside comes with a head. What is moved out leaves its reach.
async fn a_subtree_key_sees_only_its_directory(
    root: &Path,
    cluster: &Cluster,
    admin: &MetaClient,
    writer: &SecondMount,
    shared: Ino,
    tmp: &Path,
) {
    let c = Creds::root();
    let proj = admin
        .mknod(&c, shared, b"proj", FileKind::Dir, 0o777, 0, None)
        .await
        .expect("mkdir /shared/proj");
    let data = pattern(11, (1 << 20) + 5);
    std::fs::create_dir(writer.mount.join("shared/proj/sub")).expect("mkdir proj/sub");
    std::fs::write(writer.mount.join("shared/proj/sub/in.bin"), &data).expect("write proj/sub/in.bin");
    let key = grant(root, "proj", &["--path", "/shared/./proj/", "--no-root-squash"]);
    let list = String::from_utf8_lossy(&tool(root, &["client", "list"]).stdout).into_owned();
    assert!(list.contains("confined to /shared/proj"), "{list}");
    let bad = tool(
        root,
        &[
            "client",
            "grant",
            "nope",
            "--out",
            "/nonexistent/k",
            "--path",
            "/shared/f.bin",
        ],
    );
    assert!(!bad.status.success(), "a file is no subtree");

    let m = SecondMount::with_key(root, &key, &tmp.join("p"), &[]);
    let mut names: Vec<String> = std::fs::read_dir(&m.mount)
        .expect("list the mount's root")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["sub"], "the mount's root is /shared/proj");
    assert!(std::fs::read(m.mount.join("sub/in.bin")).expect("read") == data);
    std::fs::write(m.mount.join("sub/new.txt"), b"new").expect("write inside");
    std::fs::rename(m.mount.join("sub/new.txt"), m.mount.join("moved.txt")).expect("rename inside");
    std::fs::create_dir(m.mount.join("d")).expect("mkdir inside");
    let moved = admin.resolve(b"/shared/proj/moved.txt").await.expect("seen from /");
    assert_eq!(moved.size, 3);

    let (_, meta) = client_with(cluster, &key).await;
    let f_bin = admin.lookup(shared, b"f.bin").await.expect("f.bin").ino;
    let sub = admin.lookup(proj.ino, b"sub").await.expect("sub").ino;
    let eacces = |what: &str, r: Result<(), Errno>| assert_eq!(r, Err(Errno::EACCES), "{what}");
    eacces("getattr /", meta.getattr(Ino::ROOT).await.map(drop));
    eacces(
        "lookup /shared",
        meta.lookup_as(&c, Ino::ROOT, b"shared").await.map(drop),
    );
    eacces("lookup a sibling", meta.lookup_as(&c, shared, b"f.bin").await.map(drop));
    eacces("getattr a sibling", meta.getattr(f_bin).await.map(drop));
    eacces("head a sibling", meta.head_as(&c, f_bin).await.map(drop));
    eacces("list /", meta.readdir_as(&c, Ino::ROOT, None, 100).await.map(drop));
    eacces("alive", meta.alive(f_bin).await.map(drop));
    eacces(
        "create outside",
        meta.mknod(&c, shared, b"x", FileKind::File, 0o644, 0, None)
            .await
            .map(drop),
    );
    eacces(
        "rename out",
        meta.rename(&c, proj.ino, b"moved.txt", shared, b"out.txt", false, false)
            .await,
    );
    eacces("link in", meta.link(&c, f_bin, proj.ino, b"stolen").await.map(drop));
    eacces(
        "chmod outside",
        meta.setattr(
            &c,
            f_bin,
            shingle_meta::namespace::SetAttr {
                perm: Some(0o777),
                ..Default::default()
            },
        )
        .await
        .map(drop),
    );
    eacces("rmdir the subtree", meta.rmdir(&c, shared, b"proj").await);
    assert_eq!(
        meta.getattr(Ino(f_bin.0 + (1 << 40))).await.err(),
        Some(Errno::ENOENT),
        "no such inode: as for anyone"
    );
    assert!(meta.getattr(proj.ino).await.is_ok() && meta.getattr(moved.ino).await.is_ok());
    let in_bin = meta.lookup_as(&c, sub, b"in.bin").await.expect("lookup inside").ino;
    meta.head_as(&c, in_bin).await.expect("head inside");
    assert!(
        meta.take_cap(in_bin).is_some(),
        "a file inside comes with a read capability"
    );
    assert!(meta.take_cap(f_bin).is_none(), "none for the sibling refused above");

    // Moved out by the admin: a file at once, a directory once the nodes' cached
    // parents (HOME_TTL, 1 s) have expired.
    admin
        .rename(&c, sub, b"in.bin", shared, b"was-in.bin", false, false)
        .await
        .expect("move the file out");
    admin
        .rename(&c, proj.ino, b"sub", shared, b"was-sub", false, false)
        .await
        .expect("move the directory out");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (file, dir) = (meta.getattr(in_bin).await, meta.getattr(sub).await);
        if file == Err(Errno::EACCES) && dir == Err(Errno::EACCES) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still reachable after a move out: {file:?} {dir:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!m.mount.join("sub").exists(), "the mount no longer shows it");

    // A file it removes while open stays readable and stat-able until closed.
    use std::io::Read;
    let mut open = std::fs::File::open(m.mount.join("moved.txt")).expect("open");
    std::fs::remove_file(m.mount.join("moved.txt")).expect("remove while open");
    std::thread::sleep(Duration::from_millis(1100)); // past the kernel's attribute cache
    assert_eq!(open.metadata().expect("fstat after removal").len(), 3);
    let mut back = String::new();
    open.read_to_string(&mut back).expect("read after removal");
    assert_eq!(back, "new");
}

/// Below the mount, the tenant's key asks the nodes directly. Reserving versions of
/// the squashed writer's f.bin (which would bring a shard capability for it) is
/// refused; writing or deleting f.bin's shards needs a capability for f.bin, and the
/// tenant's capability for its own file does not stand in for one. Its own file's
/// shards it may write.
async fn shards_need_a_capability_for_their_file(cluster: &Cluster, admin: &MetaClient, key: &Path, shared: Ino) {
    let (tcp, meta) = client_with(cluster, key).await;
    let theirs = admin.lookup(shared, b"f.bin").await.expect("f.bin");
    let mine = admin.lookup(shared, b"tenant.txt").await.expect("tenant.txt");
    let rec = admin.head(theirs.ino).await.expect("f.bin's layout");
    let layout = rec.layout.expect("f.bin has data");
    let e = meta
        .reserve_versions(&Creds::root(), theirs.ino, layout.without_stripes(), 4)
        .await
        .expect_err("versions of a file the tenant may not write");
    assert_eq!(e, Errno::EACCES);
    assert!(meta.take_cap(theirs.ino).is_none());
    let first = meta
        .reserve_versions(&Creds::root(), mine.ino, layout.without_stripes(), 4)
        .await
        .expect("versions of its own file");
    let own_cap = Bytes::from(meta.take_cap(mine.ino).expect("a capability with them"));
    let (version, stored) = layout
        .stripes
        .get(&0)
        .map(|s| (s.version, s.nodes.clone()))
        .expect("stripe 0");
    let node = cluster.local.nodes[0].addr;
    let data = Bytes::from(vec![9u8; 4096]);
    let write = |ino: Ino, version: u64, cap: Bytes| WriteShardRequest {
        id: Some(ShardId {
            ino: ino.0,
            stripe: 0,
            shard: 0,
        }),
        version,
        crc: crc32c::crc32c(&data),
        data: data.clone(),
        cap,
    };
    for cap in [Bytes::new(), own_cap.clone(), Bytes::from(vec![7u8; 48])] {
        let r = tcp
            .call::<WriteShard>(node, &write(theirs.ino, version, cap.clone()), CallOptions::default())
            .await;
        assert_eq!(
            r.expect_err("a shard of f.bin").status().map(|s| s.code),
            Some(Code::PermissionDenied)
        );
        for (i, n) in stored.iter().enumerate() {
            let Some(addr) = n.and_then(|n| admin.view().addr(n)) else {
                continue;
            };
            let del = DeleteShardRequest {
                id: Some(ShardId {
                    ino: theirs.ino.0,
                    stripe: 0,
                    shard: i as u32,
                }),
                version,
                cap: cap.clone(),
            };
            let r = tcp.call::<DeleteShard>(addr, &del, CallOptions::default()).await;
            assert_eq!(
                r.expect_err("deleting f.bin's shard").status().map(|s| s.code),
                Some(Code::PermissionDenied)
            );
        }
    }
    tcp.call::<WriteShard>(node, &write(mine.ino, first, own_cap.clone()), CallOptions::default())
        .await
        .expect("a shard of its own file, with its capability");

    // Reads: staging a shard needs a capability too. Root's private file brings the
    // tenant none; f.bin (0644) brings a read one, which stages its shards and cannot
    // write them.
    let private = admin
        .mknod(&Creds::root(), shared, b"private", FileKind::File, 0o600, 0, None)
        .await
        .expect("root's private file");
    meta.head_as(&Creds::root(), private.ino).await.expect("its attributes");
    assert!(meta.take_cap(private.ino).is_none(), "no capability to read it");
    meta.head_as(&Creds::root(), theirs.ino).await.expect("f.bin");
    let read_cap = Bytes::from(meta.take_cap(theirs.ino).expect("f.bin is readable by others"));
    let (holder, _) = stored
        .iter()
        .enumerate()
        .find(|(_, n)| n.is_some())
        .expect("a shard stored");
    let addr = stored[holder].and_then(|n| admin.view().addr(n)).expect("its node");
    let id = ShardId {
        ino: theirs.ino.0,
        stripe: 0,
        shard: holder as u32,
    };
    for cap in [Bytes::new(), own_cap.clone()] {
        let r = read_shard(&tcp, addr, id, version, &cap).await;
        let refused = matches!(&r, Err(ShardReadError::Transport(e)) if e.status().map(|s| s.code) == Some(Code::PermissionDenied));
        assert!(refused, "staging f.bin's shard without its capability: {r:?}");
    }
    read_shard(&tcp, addr, id, version, &read_cap)
        .await
        .expect("f.bin's shard, with its read capability");
    // Its staged region's key alone, or with another file's capability, reads nothing
    // over TCP: a client key shows the file's capability with the read too.
    let stage = StageShardRequest {
        id: Some(id),
        version,
        cap: read_cap.clone(),
        ..Default::default()
    };
    let staged = tcp
        .call::<StageShard>(addr, &stage, CallOptions::default())
        .await
        .expect("stage f.bin's shard");
    let len = u32::try_from(staged.region_len).expect("a shard's length");
    for cap in [Bytes::new(), own_cap] {
        let (r, _) = tcp.read_capped(addr, staged.key(), cap, 0, len, BytesMut::new()).await;
        assert_eq!(
            r.expect_err("a staged region without f.bin's capability")
                .status()
                .map(|s| s.code),
            Some(Code::PermissionDenied)
        );
    }
    let (r, buf) = tcp
        .read_capped(addr, staged.key(), read_cap.clone(), 0, len, BytesMut::new())
        .await;
    r.expect("the staged region, with f.bin's capability");
    assert_eq!(crc32c::crc32c(&buf), staged.crc);
    let r = tcp
        .call::<WriteShard>(
            node,
            &write(theirs.ino, version + 1_000, read_cap),
            CallOptions::default(),
        )
        .await;
    assert_eq!(
        r.expect_err("a read capability writes nothing")
            .status()
            .map(|s| s.code),
        Some(Code::PermissionDenied)
    );
}

/// With a key, the nodes check reads with the caller's groups, which the mount keeps
/// for its TTL per process, uid and gid (`client::groups`). A process that adds a group
/// (`setgroups`, keeping its uid and gid, as test suites switch users) and then looks
/// into a directory only that group may search must get in: the kernel lets it, and
/// the nodes' refusal under the kept groups is asked again with fresh ones. Perl (in
/// every Debian) sets groups mid-process: `$)` is setgroups, `$>` the euid.
async fn kept_groups_never_refuse_what_current_ones_allow(admin: &MetaClient, mount: &Path, shared: Ino) {
    let root = Creds::root();
    let g = admin
        .mknod(&root, shared, b"grp", FileKind::Dir, 0o710, 0, None)
        .await
        .expect("mkdir /shared/grp");
    let set = |gid| shingle_meta::namespace::SetAttr {
        gid: Some(gid),
        ..Default::default()
    };
    admin.setattr(&root, g.ino, set(4242)).await.expect("chgrp grp");
    let f = admin
        .mknod(&root, g.ino, b"file", FileKind::File, 0o640, 0, None)
        .await
        .expect("create grp/file");
    admin.setattr(&root, f.ino, set(4242)).await.expect("chgrp grp/file");
    let script = r#"
        my $d = $ARGV[0];
        $) = "4000 4000"; $> = 4000;
        die "probe exists\n" if -e "$d/probe";
        -e "$d/grp/file" and die "grp/file seen without group 4242\n";
        $> = 0; $) = "4000 4000 4242"; $> = 4000;
        -e "$d/grp/file" or die "grp/file as a member of 4242: $!\n";
    "#;
    let out = std::process::Command::new("perl")
        .args(["-e", script])
        .arg(mount.join("shared"))
        .output()
        .expect("perl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn libc_eacces() -> i32 {
    Errno::EACCES.code()
}
