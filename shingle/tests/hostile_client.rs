//! A hostile client that holds the cluster secret, against six real `shingle serve`
//! processes: first the out-of-range requests a read of every handler found (each must
//! get a clean error), then thousands of requests of every kind made by mutating valid
//! encodings (bit flips, boundary bytes, varints pushed to their maximum, truncation,
//! duplicated runs that stretch length prefixes). No request may make a handler panic
//! (a panic is answered `Internal: handler panicked`), every node stays up and answers,
//! and — for the kinds a client sends — `shingle fsck` then reads every file whole.
//!
//! The node-to-node kinds (Execute, Replicate, InstallPiece, SyncMe, the managers' Raft
//! messages) are sent next and checked only for panics and liveness: a holder of the
//! cluster secret may send them as a peer would. Then client keys (decision 0020): a
//! read-only key and a read-write key with root squashed have every node-to-node kind
//! (and the read-only key every change) refused, and the read-write key's mutated
//! requests, those on root's file included, leave that file whole. Last, a key
//! confined to a directory has every request naming an inode outside it refused.
//!
//! `SHINGLE_HOSTILE_SEED=N` replays a run; `SHINGLE_HOSTILE_ROUNDS=N` sets the requests
//! per kind (default 300). The counts are printed for docs/benchmarks.md.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

mod common;

use bytes::Bytes;
use common::{Cluster, Spec, json, tool};
use shingle_data::wire::{
    DeleteShardRequest, RepairShardRequest, ScrubRequest, ShardId, ShardSource, StageShardRequest, StatRequest,
    WriteShardRequest,
};
use shingle_meta::ids::{Epoch, Ino, NodeId, PartitionId};
use shingle_meta::manager::rpc::kinds::INSTALL_SNAPSHOT;
use shingle_meta::meta_client::MetaClient;
use shingle_meta::namespace::partition::Mutation;
use shingle_meta::namespace::{Creds, FileKind, Layout, SetAttr, StripeRec, StripeWrite};
use shingle_meta::service::copy::CopyId;
use shingle_meta::service::wire::{
    Alloc, Execute, Expect, Fence, Fetch, InstallPiece, Lock, MetaRpc, NsOp, Op, PartOp, Pull, PullPiece, Read, ReadOp,
    Replicate, Stats, SyncMe, encode,
};
use shingle_transport::frame::MsgKind;
use shingle_transport::{CallOptions, Code, Rpc, RpcChannel, TransportError};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// The test's only randomness, from one printed seed (the shared test generator,
/// counting in `usize`).
struct Rng(shingle_testkit::Rng);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next()
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }
}

/// One to four mutations of a valid encoding.
fn mutate(rng: &mut Rng, valid: &[u8]) -> Vec<u8> {
    let mut b = valid.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(b.len() + 1);
        match rng.below(6) {
            0 if !b.is_empty() => {
                let i = at.min(b.len() - 1);
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = at.min(b.len() - 1);
                b[i] = [0x00, 0xff, 0x7f, 0x80, 0x01, rng.next() as u8][rng.below(6)];
            }
            // A varint at its maximum (u64::MAX in LEB128), or one byte past it.
            2 => {
                let run = [0xff; 9].iter().copied().chain([0x01]).take(8 + rng.below(3));
                b.splice(at..at, run);
            }
            3 => b.truncate(at),
            // A repeated run: stretches what a length prefix covers.
            4 if !b.is_empty() => {
                let start = rng.below(b.len());
                let end = (start + 1 + rng.below(16)).min(b.len());
                let run: Vec<u8> = b[start..end].repeat(1 + rng.below(64));
                b.splice(at..at, run);
            }
            _ => {
                let n = rng.below(32);
                let junk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                b.splice(at..at, junk);
            }
        }
    }
    b
}

#[derive(Default, Debug)]
struct Tally {
    /// Mutations that named the other user's file, not sent.
    confined: u64,
    sent: u64,
    ok: u64,
    refused: u64,
    transport: u64,
}

/// Sends `payload` as `kind`; a panicking handler fails the test with the request.
async fn send(tcp: &shingle_transport::PeerClient, to: SocketAddr, kind: MsgKind, payload: Vec<u8>, t: &mut Tally) {
    t.sent += 1;
    let opts = CallOptions {
        timeout: Some(Duration::from_secs(3)),
    };
    match tcp.call_raw(to, kind, Bytes::from(payload.clone()), opts).await {
        Ok(_) => t.ok += 1,
        Err(TransportError::Remote { status, .. }) => {
            assert!(
                !(status.code == Code::Internal && status.message.contains("panicked")),
                "kind {:#06x} made {to} panic: {} (request {payload:02x?})",
                kind.0,
                status.message
            );
            t.refused += 1;
        }
        Err(_) => t.transport += 1,
    }
}

/// A Raft snapshot chunk at `offset`, as a leader sends one.
fn snapshot_at(offset: u64) -> Vec<u8> {
    use openraft::{SnapshotMeta, StoredMembership, Vote};
    use shingle_meta::manager::{ManagerNode, TypeConfig};
    let req: openraft::raft::InstallSnapshotRequest<TypeConfig> = openraft::raft::InstallSnapshotRequest {
        vote: Vote::new_committed(1, 1),
        meta: SnapshotMeta::<u64, ManagerNode> {
            last_log_id: None,
            last_membership: StoredMembership::default(),
            snapshot_id: "hostile".into(),
        },
        offset,
        data: vec![1],
        done: false,
    };
    serde_json::to_vec(&req).expect("json")
}

/// Whether a (mutated) request of kind `k` decodes to one that changes file `victim`
/// or its shards.
fn names_victim(k: MsgKind, req: &[u8], victim: Ino) -> bool {
    use prost::Message;
    use shingle_data::wire as ds;
    let shard = |id: Option<ShardId>| id.is_some_and(|id| id.ino == victim.0);
    if k == kind::<Op>() {
        let Ok(op) = shingle_meta::service::wire::decode::<Op>(req) else {
            return false;
        };
        return match op.op {
            NsOp::CommitWrite { ino, .. }
            | NsOp::ReserveVersions { ino, .. }
            | NsOp::RelocateShards { ino, .. }
            | NsOp::SetAttr { ino, .. }
            | NsOp::SetLayout { ino, .. }
            | NsOp::Purged { ino }
            | NsOp::HoldPurge { ino, .. }
            | NsOp::Link { ino, .. } => ino == victim,
            NsOp::Unlink { name, .. } | NsOp::Rmdir { name, .. } => name == b"f.bin",
            NsOp::Rename { name, newname, .. } => name == b"f.bin" || newname == b"f.bin",
            _ => false,
        };
    }
    match k {
        k if k == ds::WriteShard::KIND => ds::WriteShardRequest::decode(req).is_ok_and(|r| shard(r.id)),
        k if k == ds::DeleteShard::KIND => ds::DeleteShardRequest::decode(req).is_ok_and(|r| shard(r.id)),
        k if k == ds::RepairShard::KIND => ds::RepairShardRequest::decode(req).is_ok_and(|r| shard(r.id)),
        k if k == ds::DeleteFile::KIND => ds::DeleteFileRequest::decode(req).is_ok_and(|r| r.ino == victim.0),
        _ => false,
    }
}

fn kind<R: MetaRpc>() -> MsgKind {
    R::KIND
}

fn pb<M: prost::Message>(m: &M) -> Vec<u8> {
    m.encode_to_vec()
}

fn meta_enc<T: serde::Serialize>(v: &T) -> Vec<u8> {
    encode(v).expect("encode").to_vec()
}

/// Every node answers Stats (it is up and its handlers run).
async fn all_answer(c: &MetaClient, cluster: &mut Cluster) {
    for n in &mut cluster.local.nodes {
        assert!(n.alive() && !n.exited(), "node {} exited", n.id);
    }
    for (node, s) in c.stats().await {
        assert!(s.is_ok(), "node {} does not answer: {:?}", node.0, s.err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_client_can_neither_crash_nor_corrupt_a_node() {
    let seed = std::env::var("SHINGLE_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let mut r = [0u8; 8];
            getrandom::fill(&mut r).expect("random");
            u64::from_le_bytes(r) | 1
        });
    let rounds: usize = std::env::var("SHINGLE_HOSTILE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    println!("hostile client: seed {seed} (SHINGLE_HOSTILE_SEED={seed} replays), {rounds} requests per kind");
    let mut rng = Rng(shingle_testkit::Rng::seeded(seed));

    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    let mut cluster = Cluster::start(
        root,
        Spec {
            nodes: 6,
            managers: 1,
            data: true,
            partitions: 16,
            down_after_ms: 2000,
            data_toml: "",
            zones: (16, "16MiB"),
            node_toml: "",
            manager_toml: "",
        },
    );
    let ready = tool(root, &["status", "--wait", "60"]);
    assert!(ready.status.success(), "{}", String::from_utf8_lossy(&ready.stderr));
    // f.bin is another user's file: nothing may break it. scratch.bin is the hostile
    // client's own: its mutated commits go there, and may leave it unreadable (a writer
    // may store what it likes in a file it may write).
    for name in ["f.bin", "scratch.bin"] {
        let local = root.join(name);
        std::fs::write(&local, common::pattern(7, (5 << 20) + 123)).expect("write local");
        let out = tool(root, &["put", local.to_str().expect("utf-8"), &format!("/{name}")]);
        assert!(out.status.success(), "put: {}", String::from_utf8_lossy(&out.stderr));
    }

    // Two client keys for part 4, granted first so that every request below is built
    // at the map epoch they leave behind.
    let rw_key = root.join("hostile-rw.key");
    let ro_key = root.join("hostile-ro.key");
    for (name, key, extra) in [
        ("hostile-rw", &rw_key, None),
        ("hostile-ro", &ro_key, Some("--read-only")),
    ] {
        let mut args = vec!["client", "grant", name, "--out", key.to_str().expect("utf-8")];
        args.extend(extra);
        let out = tool(root, &args);
        assert!(out.status.success(), "grant: {}", String::from_utf8_lossy(&out.stderr));
    }

    let c = cluster.client().await;
    cluster.wait_ready(&c).await;
    let tcp = c.transport().clone();
    let v = c.view();
    let epoch = v.map.epoch;
    let nodes: Vec<(NodeId, SocketAddr)> = v.map.nodes.iter().map(|(id, n)| (*id, n.addr)).collect();
    let f = c.lookup(Ino::ROOT, b"f.bin").await.expect("lookup f.bin").ino;
    let scratch = c
        .lookup(Ino::ROOT, b"scratch.bin")
        .await
        .expect("lookup scratch.bin")
        .ino;
    let rec = c.get_inode(f).await.expect("inode");
    let layout = rec.layout.clone().expect("a layout");
    let scratch_rec = c.get_inode(scratch).await.expect("inode");
    let scratch_layout = scratch_rec.layout.clone().expect("a layout");
    let primary_of = |ino: Ino| {
        let n = v.primary(ino.partition()).expect("primary");
        v.map.addr(n).expect("addr")
    };
    let fp = primary_of(f);
    let root_creds = Creds::root();
    let op = |op: NsOp| Op {
        epoch,
        creds: root_creds.clone(),
        op,
        id: 0,
    };
    let policy = Layout {
        stripes: BTreeMap::new(),
        ..layout.clone()
    };

    // 1. The out-of-range requests found by reading the handlers: each gets an answer
    //    that is not a panic (most a refusal), and changes nothing.
    let mut t = Tally::default();
    let long_nodes = StripeWrite {
        stripe: 0,
        base: layout.stripes[&0].version,
        rec: StripeRec {
            version: layout.stripes[&0].version,
            len: 4096,
            nodes: vec![Some(NodeId(1)); 100_000],
        },
    };
    let targeted: Vec<(bool, SocketAddr, MsgKind, Vec<u8>)> = vec![
        (
            true,
            fp,
            kind::<Op>(),
            meta_enc(&op(NsOp::CommitWrite {
                ino: f,
                policy: policy.clone(),
                size: 1,
                stripes: vec![long_nodes],
            })),
        ),
        (
            true,
            fp,
            kind::<Op>(),
            meta_enc(&op(NsOp::RelocateShards {
                ino: f,
                stripe: 0,
                version: layout.stripes[&0].version,
                moves: vec![(u32::MAX, 1)],
            })),
        ),
        (
            true,
            fp,
            kind::<Op>(),
            meta_enc(&op(NsOp::SetAttr {
                ino: f,
                set: SetAttr {
                    size: Some(u64::MAX),
                    ..Default::default()
                },
            })),
        ),
        (
            true,
            fp,
            kind::<Op>(),
            meta_enc(&op(NsOp::ReserveVersions {
                ino: f,
                policy: Layout { k: 0, ..policy.clone() },
                count: u32::MAX,
            })),
        ),
        (
            // A create handing out every version there is, with a k = 0 policy.
            true,
            {
                let p = shingle_meta::placement::dentry_partition(Ino::ROOT, b"reserving", v.map.partitions);
                v.map.addr(v.primary(p).expect("primary")).expect("addr")
            },
            kind::<Op>(),
            meta_enc(&op(NsOp::Mknod {
                parent: Ino::ROOT,
                name: b"reserving".to_vec(),
                kind: FileKind::File,
                perm: 0o644,
                rdev: 0,
                target: None,
                token: 1,
                reserve: Some(shingle_meta::service::wire::CreateReserve {
                    policy: Layout { k: 0, ..policy.clone() },
                    count: u32::MAX,
                }),
            })),
        ),
        (
            true,
            fp,
            kind::<Fetch>(),
            meta_enc(&Fetch {
                epoch,
                inodes: vec![f; 100_000],
                dentries: vec![],
                stripes: vec![],
            }),
        ),
        (
            true,
            fp,
            kind::<Fetch>(),
            meta_enc(&Fetch {
                epoch,
                inodes: vec![],
                dentries: vec![],
                stripes: vec![(f, u64::MAX); 100_000],
            }),
        ),
        (
            false, // answered, each partition once and at most `limit` entries
            fp,
            kind::<Read>(),
            meta_enc(&Read {
                epoch,
                op: ReadOp::ReadDir {
                    dir: Ino::ROOT,
                    after: None,
                    limit: u32::MAX,
                    partitions: vec![PartitionId(0); 200_000],
                    plus: true,
                },
            }),
        ),
        (
            false, // answered, at most MAX_STRIPES_READ records
            fp,
            kind::<Read>(),
            meta_enc(&Read {
                epoch,
                op: ReadOp::Stripes {
                    ino: f,
                    from: u64::MAX,
                    limit: u32::MAX,
                },
            }),
        ),
        (
            true,
            fp,
            kind::<Lock>(),
            meta_enc(&Lock {
                keys: (0..100_000).collect(),
                owner: 1,
                lease_ms: u32::MAX,
                wait_ms: u32::MAX,
                release: false,
                anchor: PartitionId(0),
                fetch: None,
            }),
        ),
        (
            true,
            fp,
            kind::<Pull>(),
            meta_enc(&Pull {
                epoch,
                partition: PartitionId(u32::MAX),
            }),
        ),
        (
            true,
            fp,
            kind::<PullPiece>(),
            meta_enc(&PullPiece {
                epoch,
                partition: PartitionId(u32::MAX - 1),
                offset: u64::MAX,
            }),
        ),
        (
            true,
            fp,
            kind::<Alloc>(),
            meta_enc(&Alloc {
                epoch,
                partition: PartitionId(u32::MAX),
            }),
        ),
        (
            // An epoch no map will reach: a clean refusal after a short wait.
            true,
            fp,
            kind::<Fence>(),
            meta_enc(&Fence { epoch: Epoch(u64::MAX) }),
        ),
        (
            true,
            nodes[0].1,
            shingle_data::wire::RepairShard::KIND,
            pb(&RepairShardRequest {
                id: Some(ShardId {
                    ino: f.0,
                    stripe: 0,
                    shard: 0,
                }),
                version: 1,
                k: 4,
                m: 2,
                unit: 1 << 20,
                stripe_len: 4 << 20,
                sources: (0..10_000)
                    .map(|i| ShardSource {
                        addr: "127.0.0.1:1".into(),
                        shard: i,
                    })
                    .collect(),
                if_missing: false,
            }),
        ),
        (
            true,
            nodes[0].1,
            shingle_data::wire::StageShard::KIND,
            pb(&StageShardRequest {
                id: Some(ShardId {
                    ino: f.0,
                    stripe: 0,
                    shard: 0,
                }),
                version: u64::MAX,
                range_offset: u64::MAX,
                range_len: u64::MAX,
                inline: true,
                cap: Bytes::new(),
            }),
        ),
    ];
    for (must_refuse, to, k, payload) in targeted {
        let ok_before = t.ok;
        send(&tcp, to, k, payload, &mut t).await;
        assert!(
            !must_refuse || t.ok == ok_before,
            "kind {:#06x} out of range was accepted",
            k.0
        );
    }
    println!("targeted: {t:?}");
    // A snapshot chunk far past any map: refused before openraft fills the gap.
    let manager = cluster.local.managers[0];
    match tcp
        .call_raw(
            manager,
            INSTALL_SNAPSHOT,
            Bytes::from(snapshot_at(1 << 40)),
            Default::default(),
        )
        .await
    {
        Err(TransportError::Remote { status, .. }) => {
            assert!(status.message.contains("snapshot chunk past"), "{}", status.message)
        }
        other => panic!("a snapshot chunk at 1 TiB was not refused: {other:?}"),
    }
    all_answer(&c, &mut cluster).await;

    // 2. Mutations of valid requests of every kind a client sends.
    let some_node = nodes[rng.below(nodes.len())].1;
    let client_kinds: Vec<(&str, MsgKind, Vec<u8>)> = vec![
        (
            "Read/Lookup",
            kind::<Read>(),
            meta_enc(&Read {
                epoch,
                op: ReadOp::Lookup {
                    parent: Ino::ROOT,
                    name: b"f.bin".to_vec(),
                },
            }),
        ),
        (
            "Read/ReadDir",
            kind::<Read>(),
            meta_enc(&Read {
                epoch,
                op: ReadOp::ReadDir {
                    dir: Ino::ROOT,
                    after: None,
                    limit: 100,
                    partitions: (0..16).map(PartitionId).collect(),
                    plus: false,
                },
            }),
        ),
        (
            "Read/LookupAs",
            kind::<Read>(),
            meta_enc(&Read {
                epoch,
                op: ReadOp::LookupAs {
                    creds: Creds::root(),
                    parent: Ino::ROOT,
                    name: b"f.bin".to_vec(),
                },
            }),
        ),
        (
            "Read/ReadDirAs",
            kind::<Read>(),
            meta_enc(&Read {
                epoch,
                op: ReadOp::ReadDirAs {
                    creds: Creds::root(),
                    dir: Ino::ROOT,
                    after: None,
                    limit: 100,
                    partitions: (0..16).map(PartitionId).collect(),
                    plus: false,
                },
            }),
        ),
        (
            "Read/Stripes",
            kind::<Read>(),
            meta_enc(&Read {
                epoch,
                op: ReadOp::Stripes {
                    ino: f,
                    from: 0,
                    limit: 64,
                },
            }),
        ),
        (
            "Read/GetAttrSettled",
            kind::<Read>(),
            meta_enc(&Read {
                epoch,
                op: ReadOp::GetAttrSettled(Ino::ROOT),
            }),
        ),
        (
            "Read/GetXattr",
            kind::<Read>(),
            meta_enc(&Read {
                epoch,
                op: ReadOp::GetXattr {
                    creds: Creds::root(),
                    ino: f,
                    name: b"user.x".to_vec(),
                },
            }),
        ),
        (
            "Op/Mknod",
            kind::<Op>(),
            meta_enc(&op(NsOp::Mknod {
                parent: Ino::ROOT,
                name: b"hostile".to_vec(),
                kind: FileKind::File,
                perm: 0o644,
                rdev: 0,
                target: None,
                token: 0,
                reserve: None,
            })),
        ),
        (
            "Op/SetXattr",
            kind::<Op>(),
            meta_enc(&op(NsOp::SetXattr {
                ino: Ino::ROOT,
                name: b"user.h".to_vec(),
                value: vec![1; 64],
                mode: 0,
            })),
        ),
        (
            "Op/CommitWrite",
            kind::<Op>(),
            meta_enc(&op(NsOp::CommitWrite {
                ino: scratch,
                policy: policy.clone(),
                size: scratch_rec.attr.size,
                stripes: vec![StripeWrite {
                    stripe: 0,
                    base: scratch_layout.stripes[&0].version,
                    rec: scratch_layout.stripes[&0].clone(),
                }],
            })),
        ),
        (
            "Fetch",
            kind::<Fetch>(),
            meta_enc(&Fetch {
                epoch,
                inodes: vec![f, Ino::ROOT],
                dentries: vec![(Ino::ROOT, b"f.bin".to_vec())],
                stripes: vec![(f, 0), (f, 1)],
            }),
        ),
        (
            "Lock",
            kind::<Lock>(),
            meta_enc(&Lock {
                keys: vec![f.0],
                owner: 7,
                lease_ms: 10,
                wait_ms: 0,
                release: false,
                anchor: PartitionId(0),
                fetch: None,
            }),
        ),
        (
            "Pull",
            kind::<Pull>(),
            meta_enc(&Pull {
                epoch,
                partition: PartitionId(3),
            }),
        ),
        (
            "PullPiece",
            kind::<PullPiece>(),
            meta_enc(&PullPiece {
                epoch,
                partition: PartitionId(3),
                offset: 0,
            }),
        ),
        ("Fence", kind::<Fence>(), meta_enc(&Fence { epoch })),
        (
            "Expect",
            kind::<Expect>(),
            meta_enc(&Expect {
                epoch,
                intent: 1,
                step: 2,
                dir: Ino::ROOT,
                entries: i64::MAX,
                subdirs: i64::MIN,
                time: i64::MAX,
            }),
        ),
        ("Stats", kind::<Stats>(), meta_enc(&Stats)),
        (
            "StageShard",
            shingle_data::wire::StageShard::KIND,
            pb(&StageShardRequest {
                id: Some(ShardId {
                    ino: f.0,
                    stripe: 0,
                    shard: 1,
                }),
                version: layout.stripes[&0].version,
                range_offset: 0,
                range_len: 4096,
                inline: true,
                cap: Bytes::new(),
            }),
        ),
        ("Stat", shingle_data::wire::Stat::KIND, pb(&StatRequest {})),
        ("Scrub", shingle_data::wire::Scrub::KIND, pb(&ScrubRequest {})),
        (
            "RepairShard",
            shingle_data::wire::RepairShard::KIND,
            pb(&RepairShardRequest {
                id: Some(ShardId {
                    ino: 1 << 40,
                    stripe: 0,
                    shard: 0,
                }),
                version: 1,
                k: 4,
                m: 2,
                unit: 1 << 20,
                stripe_len: 4096,
                sources: vec![ShardSource {
                    addr: some_node.to_string(),
                    shard: 1,
                }],
                if_missing: true,
            }),
        ),
        (
            "WriteShard",
            shingle_data::wire::WriteShard::KIND,
            pb(&WriteShardRequest {
                id: Some(ShardId {
                    ino: 1 << 40,
                    stripe: 1,
                    shard: 2,
                }),
                version: 1,
                crc: crc32c::crc32c(&[5; 100]),
                data: Bytes::from(vec![5; 100]),
                cap: Bytes::new(),
            }),
        ),
        (
            "DeleteShard",
            shingle_data::wire::DeleteShard::KIND,
            pb(&DeleteShardRequest {
                id: Some(ShardId {
                    ino: 1 << 40,
                    stripe: 1,
                    shard: 2,
                }),
                version: 1,
                cap: Bytes::new(),
            }),
        ),
    ];
    let mut report = Vec::new();
    for (name, k, valid) in &client_kinds {
        let started = std::time::Instant::now();
        let mut t = Tally::default();
        for _ in 0..rounds {
            let (_, to) = nodes[rng.below(nodes.len())];
            let to = if k.0 < 0x0400 { to } else { [to, fp][rng.below(2)] };
            let req = mutate(&mut rng, valid);
            if names_victim(*k, &req, f) {
                // A mutation that turned the request into one on f.bin: f.bin stands
                // for other users' files, which only credentials could protect.
                t.confined += 1;
                continue;
            }
            send(&tcp, to, *k, req, &mut t).await;
        }
        report.push(format!("{name}: {t:?} in {:.1} s", started.elapsed().as_secs_f64()));
    }
    all_answer(&c, &mut cluster).await;
    // Nothing the client sent broke another file: f.bin, the one file that is not its
    // own, reads back whole. Its own may not: scratch.bin, and the files its mutated
    // creates made (named "/\u{1}\u{2}" and the like) with layouts its mutated commits
    // wrote (one seed of the test's earlier generator made two that fsck cannot read).
    let own = json(&tool(root, &["fsck", "/f.bin", "--json"]));
    assert!(
        own["ok"].as_u64() == Some(1) && own["bad"].as_array().is_some_and(|b| b.is_empty()),
        "another user's file broken by hostile requests: {own}"
    );
    let fsck = tool(root, &["fsck", "--json"]);
    let r = json(&fsck);
    let bad: Vec<&str> = r["bad"]
        .as_array()
        .expect("bad")
        .iter()
        .filter_map(|b| b["path"].as_str())
        .collect();
    assert!(!bad.contains(&"/f.bin"), "files broken by hostile requests: {r}");
    println!(
        "fsck after the client kinds: {} files, {} ok, bad {bad:?}",
        r["files"], r["ok"]
    );

    // 3. The node-to-node kinds, at the current epoch so that they reach the handlers'
    //    checks (and may change metadata: fsck is behind us): no panic, every node
    //    still up and answering.
    let p2 = v.map.addr(v.primary(PartitionId(2)).expect("primary")).expect("addr");
    let peer_kinds: Vec<(&str, MsgKind, Vec<u8>)> = vec![
        (
            "Execute",
            kind::<Execute>(),
            meta_enc(&Execute {
                epoch,
                from: shingle_meta::ids::NodeId(1),
                partition: PartitionId(2),
                ops: vec![PartOp::Apply {
                    intent: 1,
                    step: 1,
                    m: Mutation::AdjustLinks {
                        ino: Ino(1 << 44 | 5),
                        delta: i64::MAX,
                        time: 1,
                    },
                }],
            }),
        ),
        (
            "Replicate",
            kind::<Replicate>(),
            meta_enc(&Replicate {
                epoch,
                partition: PartitionId(2),
                state_epoch: Epoch(u64::MAX),
                lsn: u64::MAX,
                ops: vec![PartOp::Counter(u64::MAX)],
            }),
        ),
        (
            "InstallPiece",
            kind::<InstallPiece>(),
            meta_enc(&InstallPiece {
                epoch,
                partition: PartitionId(2),
                copy: CopyId {
                    state_epoch: Epoch(u64::MAX),
                    lsn: u64::MAX,
                    counter_hwm: u64::MAX,
                    total: 16,
                },
                offset: 0,
                data: vec![0; 16],
            }),
        ),
        (
            "SyncMe",
            kind::<SyncMe>(),
            meta_enc(&SyncMe {
                epoch,
                partition: PartitionId(2),
                node: NodeId(u64::MAX),
            }),
        ),
        ("Raft/InstallSnapshot", INSTALL_SNAPSHOT, snapshot_at(1 << 40)),
    ];
    for (name, k, valid) in &peer_kinds {
        let started = std::time::Instant::now();
        let mut t = Tally::default();
        // Once as built (maximum positions and counts), then mutated.
        send(&tcp, p2, *k, valid.clone(), &mut t).await;
        for _ in 0..rounds {
            let (_, to) = nodes[rng.below(nodes.len())];
            send(&tcp, to, *k, mutate(&mut rng, valid), &mut t).await;
        }
        report.push(format!(
            "{name} (peer): {t:?} in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }
    all_answer(&c, &mut cluster).await;

    // 4. The same requests from client keys (issue 16): a read-write key whose root is
    //    squashed to nobody, and a read-only key. Every node-to-node kind is refused to
    //    both before any handler runs, as is every change from the read-only key. The
    //    read-write key's mutated namespace requests run — including those on f.bin,
    //    which only its owner (root) may change, so nothing is skipped for them — and
    //    f.bin must still read back whole. Shard stages, writes and deletes (f.bin's
    //    among them) are sent too, and each must be refused: the key holds no shard
    //    capability (decision 0021).
    let key_client = |key: &std::path::Path| {
        shingle_transport::PeerClient::new(
            shingle_transport::TransportConfig::default(),
            shingle_transport::ClusterSecret::from_file(key).expect("key"),
        )
    };
    let (rw, ro) = (key_client(&rw_key), key_client(&ro_key));
    let denied = |r: Result<Bytes, TransportError>, what: &str| match r {
        // UnknownKind: a node without that role (Raft on a node that is no manager).
        Err(TransportError::Remote { status, .. })
            if matches!(status.code, Code::PermissionDenied | Code::UnknownKind) => {}
        other => panic!("{what} was not refused to a client key: {other:?}"),
    };
    let opts = || CallOptions {
        timeout: Some(Duration::from_secs(3)),
    };
    let mut refused = 0u64;
    // What mounts send (written out here, not taken from the code under test): reads
    // and shard staging for any live grant, changes for a write grant; everything else
    // is what nodes send each other.
    let reads = [
        "Read/Lookup",
        "Read/ReadDir",
        "Read/LookupAs",
        "Read/ReadDirAs",
        "Read/GetAttrSettled",
        "Read/Stripes",
        "Read/GetXattr",
        "StageShard",
        "Stats",
        "Stat",
    ];
    let writes = ["Op/Mknod", "Op/SetXattr", "Op/CommitWrite", "WriteShard", "DeleteShard"];
    for (name, k, valid) in peer_kinds.iter().chain(&client_kinds) {
        let keys: Vec<&shingle_transport::PeerClient> = if reads.contains(name) {
            vec![]
        } else if writes.contains(name) {
            vec![&ro]
        } else {
            vec![&rw, &ro]
        };
        for key in keys {
            for i in 0..1 + rounds / 10 {
                let (_, to) = nodes[rng.below(nodes.len())];
                let req = if i == 0 { valid.clone() } else { mutate(&mut rng, valid) };
                denied(key.call_raw(to, *k, Bytes::from(req), opts()).await, name);
                refused += 1;
            }
        }
    }
    report.push(format!(
        "client keys: {refused} node-to-node or read-only-change requests, all refused"
    ));
    for (name, k, valid) in &client_kinds {
        let started = std::time::Instant::now();
        let mut t = Tally::default();
        // File data needs a shard capability, which no mutation of these requests
        // carries: every one is refused, f.bin's included (none is skipped).
        let needs_cap = [
            shingle_data::wire::WriteShard::KIND,
            shingle_data::wire::DeleteShard::KIND,
            shingle_data::wire::StageShard::KIND,
        ]
        .contains(k);
        for _ in 0..rounds {
            let (_, to) = nodes[rng.below(nodes.len())];
            let to = if k.0 < 0x0400 { to } else { [to, fp][rng.below(2)] };
            let req = mutate(&mut rng, valid);
            if needs_cap {
                // Refused for want of a capability, or earlier as malformed; never done.
                t.sent += 1;
                match rw.call_raw(to, *k, Bytes::from(req), opts()).await {
                    Ok(_) => panic!("{name} without a shard capability was done for a client key"),
                    Err(TransportError::Remote { status, .. }) => {
                        assert!(status.code != Code::Internal, "{name}: {}", status.message);
                        t.refused += 1;
                    }
                    Err(_) => t.transport += 1,
                }
                continue;
            }
            send(&rw, to, *k, req, &mut t).await;
        }
        report.push(format!(
            "{name} (read-write key, root squashed): {t:?} in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }
    all_answer(&c, &mut cluster).await;

    // 5. A key confined to /jail (decision 0022), root kept: every valid namespace read
    //    and change above names an inode outside it (the root, f.bin, scratch.bin), and
    //    every node refuses each with EACCES before it runs; mutated, none panics a node.
    c.mknod(&Creds::root(), Ino::ROOT, b"jail", FileKind::Dir, 0o777, 0, None)
        .await
        .expect("mkdir /jail");
    let jail_key = root.join("hostile-jail.key");
    let args = [
        "client",
        "grant",
        "hostile-jail",
        "--no-root-squash",
        "--path",
        "/jail",
        "--out",
        jail_key.to_str().expect("utf-8"),
    ];
    let out = tool(root, &args);
    assert!(out.status.success(), "grant: {}", String::from_utf8_lossy(&out.stderr));
    let jailed = key_client(&jail_key);
    let mut t = Tally::default();
    let mut outside = 0u64;
    for (name, k, valid) in client_kinds
        .iter()
        .filter(|(n, ..)| n.starts_with("Read/") || n.starts_with("Op/"))
    {
        for (_, to) in &nodes {
            match jailed.call_raw(*to, *k, Bytes::from(valid.clone()), opts()).await {
                Err(TransportError::Remote { status, .. })
                    if status.code == Code::Application && status.app_code == 13 =>
                {
                    outside += 1
                }
                other => panic!("{name} outside /jail was not refused to a confined key: {other:?}"),
            }
        }
        for _ in 0..rounds / 2 {
            let (_, to) = nodes[rng.below(nodes.len())];
            send(&jailed, to, *k, mutate(&mut rng, valid), &mut t).await;
        }
    }
    report.push(format!(
        "confined key: {outside} valid requests outside its directory, all refused (EACCES); mutated: {t:?}"
    ));
    all_answer(&c, &mut cluster).await;
    let own = json(&tool(root, &["fsck", "/f.bin", "--json"]));
    assert!(
        own["ok"].as_u64() == Some(1) && own["bad"].as_array().is_some_and(|b| b.is_empty()),
        "a squashed client key broke root's file: {own}"
    );
    for line in &report {
        println!("{line}");
    }
}
