//! Multi-process tests of the chunk service: six real `shingle serve` data nodes on
//! loopback, erasure-coded stripes written and read over TCP with the remote-read
//! verb, nodes killed with SIGKILL, shards corrupted on disk and repaired, a full
//! device refusing writes with ENOSPC.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

mod common;

use bytes::Bytes;
use common::{corrupt_first_record, spawn};
use shingle::config::{DataSection, NodeConfig, NodeSection, parse_size};
use shingle_data::ec::EcPolicy;
use shingle_data::shard::{read_shard, write_shard};
use shingle_data::stripe::{StripeAt, WriteRule, read_stripe, write_stripe};
use shingle_data::wire::{
    DeleteShard, DeleteShardRequest, RepairShard, RepairShardRequest, Scrub, ScrubRequest, ShardId, ShardSource, Stat,
    StatRequest, errno,
};
use shingle_transport::{CallOptions, ClusterSecret, Health, PeerClient, RpcChannel, TransportConfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

struct Node {
    child: Option<Child>,
    config: PathBuf,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Node {
    fn start(root: &Path, name: &str, secret: &Path, zones: u32, zone_size: &str, listen: &str) -> Node {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("node dir");
        let config = dir.join("node.toml");
        let listen = listen.parse().expect("listen address");
        let zone_size = parse_size(zone_size).expect("zone size");
        let mut cfg = NodeConfig::new(NodeSection::new(listen, secret));
        cfg.data = Some(DataSection::emulated(&dir.join("data"), zones, zone_size));
        cfg.write(&config).expect("write config");
        let (child, addr) = spawn(&config);
        Node {
            child: Some(child),
            config,
            addr,
            dir,
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    fn restart(&mut self) {
        self.kill();
        // Same port: rewrite the config with the address the node had.
        let text = std::fs::read_to_string(&self.config).expect("config");
        let mut cfg: NodeConfig = toml::from_str(&text).expect("parse config");
        cfg.node.listen = self.addr;
        cfg.write(&self.config).expect("rewrite config");
        let (child, addr) = spawn(&self.config);
        assert_eq!(addr, self.addr);
        self.child = Some(child);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn secret_file(root: &Path) -> (PathBuf, ClusterSecret) {
    let p = root.join("secret");
    let status = Command::new(env!("CARGO_BIN_EXE_shingle"))
        .arg("keygen")
        .arg(&p)
        .output()
        .expect("keygen");
    assert!(status.status.success(), "keygen failed: {status:?}");
    let s = ClusterSecret::from_file(&p).expect("read secret");
    (p, s)
}

fn content(seed: u64, len: usize) -> Bytes {
    (0..len)
        .map(|i| (i as u64 * 2_654_435_761 + seed * 97) as u8)
        .collect::<Vec<u8>>()
        .into()
}

fn client(secret: ClusterSecret) -> PeerClient {
    PeerClient::new(
        TransportConfig {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_millis(500),
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(200),
            ..TransportConfig::default()
        },
        secret,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_nodes_erasure_coded_reads_survive_kills_and_corruption() {
    let root = tempfile::tempdir().expect("tempdir");
    let (secret_path, secret) = secret_file(root.path());
    let mut nodes: Vec<Node> = (0..6)
        .map(|i| Node::start(root.path(), &format!("n{i}"), &secret_path, 16, "4MiB", "127.0.0.1:0"))
        .collect();
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    let c = client(secret);
    let policy = EcPolicy::new(4, 2, 64 * 1024).expect("policy");
    let full = policy.stripe_data_bytes() as usize;
    let health: Arc<Health> = Arc::default();
    let lens = [full, full, 1, 3, full - 1, 65_537, 200_000, full / 2 + 7];

    for (s, len) in lens.iter().enumerate() {
        let placed = write_stripe(
            &c,
            &health,
            policy,
            &addrs,
            &[],
            &[],
            WriteRule {
                tolerate: 2,
                share_nodes: false,
            },
            StripeAt::new(42, s as u64, 1),
            content(s as u64, *len),
        )
        .await
        .expect("write stripe");
        assert!(placed.iter().all(Option::is_some));
    }
    let read_all = |c: PeerClient, addrs: Vec<SocketAddr>, health: Arc<Health>| async move {
        let mut degraded = 0;
        let addrs: Vec<Option<SocketAddr>> = addrs.into_iter().map(Some).collect();
        for (s, len) in lens.iter().enumerate() {
            let r = read_stripe(&c, &health, policy, &addrs, StripeAt::new(42, s as u64, 1), *len)
                .await
                .expect("read stripe");
            assert_eq!(r.data, content(s as u64, *len), "stripe {s} differs");
            degraded += usize::from(!r.failed.is_empty());
        }
        degraded
    };
    assert_eq!(
        read_all(c.clone(), addrs.clone(), health.clone()).await,
        0,
        "healthy reads were degraded"
    );

    // Two data nodes die: every stripe still reads, from parity.
    nodes[1].kill();
    nodes[3].kill();
    assert!(
        read_all(c.clone(), addrs.clone(), health.clone()).await > 0,
        "reads with two nodes down were not degraded"
    );

    // Writes with two of six down and no spare: the default rule puts their shards on
    // live nodes, two on some, and acknowledges a stripe that survives one more loss;
    // the strict rule (distinct nodes) refuses. One side knows the nodes are down (the
    // map), the other finds out (its health has not seen them fail yet).
    let strict = WriteRule {
        tolerate: 1,
        share_nodes: false,
    };
    let shared = WriteRule {
        tolerate: 1,
        share_nodes: true,
    };
    // A short stripe (one data shard, empty ones need no node) spreads the same way.
    let cases = [
        (vec![addrs[1], addrs[3]], 100u64, full),
        (vec![], 101, full),
        (vec![addrs[1], addrs[3]], 102, 1000),
        (vec![], 103, 1000),
    ];
    for (down, s, len) in cases {
        let fresh: Arc<Health> = Arc::default();
        // Version 1 under the strict rule, version 2 under the default one.
        let write = |rule: WriteRule, version: u64| {
            write_stripe(
                &c,
                &fresh,
                policy,
                &addrs,
                &[],
                &down,
                rule,
                StripeAt::new(42, s, version),
                content(s, len),
            )
        };
        let r = write(strict, 1).await;
        if len == full {
            let e = r.expect_err("four distinct nodes cannot hold 4+2 with one to spare");
            assert!(e.to_string().contains("shard writes failed"), "{e}");
        } else {
            // Its three stored shards have nodes of their own: fine under either rule.
            r.expect("short stripe under the strict rule");
        }
        let placed = write(shared, 2).await.expect("shared write");
        let stored = if len == full { 6 } else { 3 };
        let held: Vec<SocketAddr> = [0, 1, 2, 3, 4, 5]
            .into_iter()
            .filter(|i| *i >= 4 || *i < stored - 2)
            .filter_map(|i| placed[i])
            .collect();
        assert_eq!(held.len(), stored, "every shard stored: {placed:?}");
        assert!(!held.contains(&addrs[1]) && !held.contains(&addrs[3]), "{placed:?}");
        let most = |held: &[SocketAddr]| held.iter().map(|a| held.iter().filter(|h| *h == a).count()).max();
        assert!(most(&held) <= Some(2), "at most two shards on a node: {placed:?}");
        if len < full {
            assert_eq!(most(&held), Some(1), "three shards have three nodes: {placed:?}");
        }
        // Readable from where the shards went, also with the busiest node lost.
        let r = read_stripe(&c, &fresh, policy, &placed, StripeAt::new(42, s, 2), len)
            .await
            .expect("read shared stripe");
        assert_eq!(r.data, content(s, len));
        let busiest = *held
            .iter()
            .max_by_key(|a| held.iter().filter(|h| h == a).count())
            .expect("a node");
        let without: Vec<Option<SocketAddr>> = placed.iter().map(|p| p.filter(|a| *a != busiest)).collect();
        let r = read_stripe(&c, &fresh, policy, &without, StripeAt::new(42, s, 2), len)
            .await
            .expect("read shared stripe without its busiest node");
        assert_eq!(r.data, content(s, len));
    }

    // A third node down under 4+2: a clear error, promptly.
    nodes[0].kill();
    let t = std::time::Instant::now();
    let some: Vec<Option<SocketAddr>> = addrs.iter().copied().map(Some).collect();
    let e = read_stripe(&c, &health, policy, &some, StripeAt::new(42, 0, 1), full)
        .await
        .expect_err("three shards missing");
    assert!(e.to_string().contains("need"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "error took {:?}", t.elapsed());

    // They come back with their data.
    for i in [0, 1, 3] {
        nodes[i].restart();
        reachable(&c, addrs[i]).await;
    }
    // A client that saw them fail avoids them for a cool-down; a fresh one reads them.
    assert_eq!(read_all(c.clone(), addrs.clone(), Arc::default()).await, 0);

    // Corrupt shard 2 of stripe 0 on disk (node 2, stopped), then read: served from parity.
    nodes[2].kill();
    corrupt_first_record(&nodes[2].dir.join("data").join("zones"));
    nodes[2].restart();
    reachable(&c, addrs[2]).await;
    let r = read_stripe(&c, &Arc::default(), policy, &some, StripeAt::new(42, 0, 1), full)
        .await
        .expect("degraded read");
    assert_eq!(r.data, content(0, full));
    assert_eq!(r.failed.len(), 1, "{:?}", r.failed);
    assert_eq!(r.failed[0].0, 2);
    let scrub = c
        .call::<Scrub>(addrs[2], &ScrubRequest {}, CallOptions::default())
        .await
        .expect("scrub");
    assert_eq!(
        scrub.corrupt,
        vec![ShardId {
            ino: 42,
            stripe: 0,
            shard: 2
        }]
    );

    // Repair it from the other nodes, then it reads directly again.
    let sources = (0..6)
        .filter(|i| *i != 2)
        .map(|i| ShardSource {
            addr: addrs[i].to_string(),
            shard: i as u32,
        })
        .collect();
    let repair = RepairShardRequest {
        id: Some(ShardId {
            ino: 42,
            stripe: 0,
            shard: 2,
        }),
        version: 1,
        k: 4,
        m: 2,
        unit: policy.unit,
        stripe_len: full as u64,
        sources,
        if_missing: false,
    };
    let rr = c
        .call::<RepairShard>(addrs[2], &repair, CallOptions::default())
        .await
        .expect("repair");
    assert_eq!(rr.bytes, policy.unit as u64);
    let scrub = c
        .call::<Scrub>(addrs[2], &ScrubRequest {}, CallOptions::default())
        .await
        .expect("scrub");
    assert!(scrub.corrupt.is_empty());
    let shard = read_shard(
        &c,
        addrs[2],
        ShardId {
            ino: 42,
            stripe: 0,
            shard: 2,
        },
        1,
        &Bytes::new(),
    )
    .await
    .expect("shard");
    let want = content(0, full);
    assert_eq!(&shard[..], &want[2 * policy.unit as usize..3 * policy.unit as usize]);
    // A client that saw them fail avoids them for a cool-down; a fresh one reads them.
    assert_eq!(read_all(c.clone(), addrs.clone(), Arc::default()).await, 0);

    // Deletes are durable across a restart.
    for i in 0..6 {
        let id = ShardId {
            ino: 42,
            stripe: 7,
            shard: i,
        };
        let d = c.call::<DeleteShard>(
            addrs[i as usize],
            &DeleteShardRequest {
                id: Some(id),
                version: 0,
                cap: Bytes::new(),
            },
            CallOptions::default(),
        );
        // A short stripe's empty data shards are never stored.
        let stored = i >= 4 || (i as usize) < policy.data_shards_used(lens[7]);
        assert_eq!(d.await.expect("delete").existed, stored, "shard {i}");
    }
    nodes[4].restart();
    reachable(&c, addrs[4]).await;
    let e = read_shard(
        &c,
        addrs[4],
        ShardId {
            ino: 42,
            stripe: 7,
            shard: 4,
        },
        0,
        &Bytes::new(),
    )
    .await
    .expect_err("deleted");
    assert_eq!(e.errno(), Some(errno::ENOENT));
}

/// Waits until the client reaches `addr` again (its reconnect backoff has passed).
async fn reachable(c: &PeerClient, addr: SocketAddr) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while c.ping(addr).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "{addr} unreachable after restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Flips a payload byte of the first record in the first non-empty zone file.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_node_refuses_with_enospc_and_keeps_its_data() {
    let root = tempfile::tempdir().expect("tempdir");
    let (secret_path, secret) = secret_file(root.path());
    let node = Node::start(root.path(), "small", &secret_path, 4, "1MiB", "127.0.0.1:0");
    let c = client(secret);
    let mut written = Vec::new();
    for i in 0..100u64 {
        let id = ShardId {
            ino: 7,
            stripe: i,
            shard: 0,
        };
        match write_shard(&c, node.addr, id, 1, content(i, 300_000), Bytes::new()).await {
            Ok(_) => written.push(i),
            Err(e) => {
                let s = e.status().expect("an error reply");
                assert_eq!(s.app_code, errno::ENOSPC, "{e}");
                break;
            }
        }
    }
    assert!(!written.is_empty() && written.len() < 100, "wrote {}", written.len());
    for i in written {
        let got = read_shard(
            &c,
            node.addr,
            ShardId {
                ino: 7,
                stripe: i,
                shard: 0,
            },
            1,
            &Bytes::new(),
        )
        .await
        .expect("read back");
        assert_eq!(got, content(i, 300_000));
    }
    let st = c
        .call::<Stat>(node.addr, &StatRequest {}, CallOptions::default())
        .await
        .expect("stat");
    assert_eq!(st.zones_total, 4);
}
