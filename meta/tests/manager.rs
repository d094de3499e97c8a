//! The manager role over real TCP servers on 127.0.0.1: one manager that restarts from its
//! directory, and a group of three that elects, forwards, fails over and catches up.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

use shingle_meta::ids::{Epoch, NodeId};
use shingle_meta::manager::{self, Manager, ManagerConfig, ManagerError, ManagerSlot, Role, rpc};
use shingle_meta::map::{ClusterMap, MapCommand, MapError, NodeInfo, NodeState, Roles};
use shingle_transport::{CallOptions, ClusterSecret, PeerClient, RegionTable, RpcChannel, Server, TransportConfig};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn secret() -> ClusterSecret {
    ClusterSecret::new(vec![0x5a; 32]).expect("secret")
}

fn transport() -> TransportConfig {
    TransportConfig {
        connect_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_secs(5),
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        shutdown_grace: Duration::from_secs(1),
        ..TransportConfig::default()
    }
}

fn initial_map() -> ClusterMap {
    ClusterMap::new("manager-test", 16, 8, 3, 6)
}

fn node(i: u64) -> NodeInfo {
    NodeInfo {
        id: NodeId(i),
        addr: SocketAddr::from(([10, 0, 0, 1], 7000 + i as u16)),
        roles: Roles {
            manager: false,
            meta: true,
            data: true,
        },
        domain: format!("rack{}", i % 3),
        state: NodeState::Up,
    }
}

fn register(i: u64) -> MapCommand {
    MapCommand::Register(node(i))
}

/// One manager process: its transport server, client and manager.
struct Running {
    id: u64,
    addr: SocketAddr,
    dir: PathBuf,
    server: Server,
    client: PeerClient,
    mgr: Manager,
}

/// Binds a server on `addr` (port 0 for any) with an empty slot's router, then starts the
/// manager in that slot with the bound address: the order a node on port 0 must follow.
async fn boot(id: u64, addr: SocketAddr, dir: &Path, snapshot_every_logs: u64) -> Running {
    let slot = ManagerSlot::new();
    let server = Server::bind(addr, transport(), secret(), slot.router(), Arc::new(RegionTable::new()))
        .await
        .expect("bind");
    let addr = server.local_addr();
    let config = ManagerConfig {
        heartbeat_ms: 50,
        election_timeout_min_ms: 150,
        election_timeout_max_ms: 300,
        snapshot_every_logs,
        propose_timeout_ms: 5_000,
        down_after_ms: 3_600_000,
        ..ManagerConfig::new(id, addr, dir.to_path_buf())
    };
    let client = PeerClient::new(transport(), secret());
    let mgr = Manager::start_in(&slot, config, client.clone(), initial_map())
        .await
        .expect("start manager");
    Running {
        id,
        addr,
        dir: dir.to_path_buf(),
        server,
        client,
        mgr,
    }
}

/// Stops a manager as its process would die: server first, then Raft, then connections.
async fn stop(r: Running) -> (u64, SocketAddr, PathBuf) {
    r.server.shutdown().await;
    r.mgr.shutdown().await;
    r.client.close();
    (r.id, r.addr, r.dir)
}

/// Polls `f` until it returns `Some`, for at most `WAIT`.
async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(started.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_manager_commits_and_recovers_its_map_after_restart() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let n = boot(1, any, dir.path(), 1000).await;
    assert_eq!(n.mgr.map(), initial_map(), "nothing applied yet");
    n.mgr
        .initialize(BTreeMap::from([(1, n.addr)]))
        .await
        .expect("initialize");
    assert_eq!(n.mgr.wait_for_leader(WAIT).await.expect("leader"), 1);
    let mut watch = n.mgr.watch();

    for i in 1..=3 {
        assert_eq!(n.mgr.propose(register(i)).await.expect("register"), Epoch(i));
    }
    assert_eq!(
        n.mgr.propose(register(2)).await.expect("same again"),
        Epoch(3),
        "no change, no new epoch"
    );
    let unknown = MapCommand::SetState {
        id: NodeId(9),
        state: NodeState::Down,
    };
    assert!(matches!(
        n.mgr.propose(unknown).await,
        Err(ManagerError::Refused(MapError::UnknownNode(NodeId(9))))
    ));
    let map = n.mgr.map();
    assert_eq!(map.epoch, Epoch(3));
    assert_eq!(map.nodes.len(), 3);
    assert_eq!(watch.borrow_and_update().epoch, Epoch(3), "the watch sees applied maps");

    // Client helpers from another process: a dead manager first, then the live one.
    let outsider = PeerClient::new(transport(), secret());
    let dead = SocketAddr::from(([127, 0, 0, 1], 1));
    assert_eq!(
        manager::fetch_map(&outsider, &[dead, n.addr]).await.expect("fetch"),
        map
    );
    let down = MapCommand::SetState {
        id: NodeId(2),
        state: NodeState::Down,
    };
    assert_eq!(
        manager::propose(&outsider, &[dead, n.addr], &down)
            .await
            .expect("propose via helper"),
        Epoch(4)
    );
    let remove_up = MapCommand::Remove { id: NodeId(3) };
    assert!(matches!(
        manager::propose(&outsider, &[n.addr], &remove_up).await,
        Err(ManagerError::Refused(MapError::NotOut(NodeId(3))))
    ));
    assert!(matches!(
        manager::fetch_map(&outsider, &[dead]).await,
        Err(ManagerError::Unavailable { tried: 1, .. })
    ));
    let same = outsider
        .call::<rpc::GetMap>(
            n.addr,
            &rpc::GetMapRequest {
                known_epoch: Some(4),
                history_from: None,
            },
            CallOptions::default(),
        )
        .await
        .expect("get map");
    assert_eq!((same.epoch, same.newer, same.map_json.as_str()), (4, false, ""));
    // A holder of epoch 1 is also given the maps between (2 and 3), so it can adopt
    // every epoch in turn; one that asks from an epoch never applied here gets none.
    let (newest, between) = manager::fetch_map_since(&outsider, &[n.addr], Some(Epoch(1)), Epoch(4))
        .await
        .expect("fetch since");
    assert_eq!(newest.epoch, Epoch(4));
    assert_eq!(between.iter().map(|m| m.epoch.0).collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(between[1].nodes.len(), 3, "the map of epoch 3 as it was");
    assert_eq!(between[1].nodes[&NodeId(2)].state, NodeState::Up);
    let (_, none) = manager::fetch_map_since(&outsider, &[n.addr], Some(Epoch(4)), Epoch(4))
        .await
        .expect("fetch since the newest");
    assert!(none.is_empty());

    n.mgr
        .initialize(BTreeMap::from([(1, n.addr)]))
        .await
        .expect("initialize again is a no-op");
    let m = n.mgr.metrics();
    assert_eq!((m.id, m.role, m.leader, m.epoch), (1, Role::Leader, Some(1), Epoch(4)));
    assert_eq!(m.voters, vec![1]);
    assert!(m.term >= 1 && m.last_applied_index.is_some());

    // Restart from the same directory on the same address.
    let (id, addr, path) = stop(n).await;
    let n = boot(id, addr, &path, 1000).await;
    let recovered = n.mgr.map();
    assert_eq!(recovered.epoch, Epoch(4), "acknowledged epoch recovered at start");
    assert_eq!(recovered.nodes.len(), 3);
    assert_eq!(recovered.nodes[&NodeId(2)].state, NodeState::Down);
    assert_eq!(n.mgr.wait_for_leader(WAIT).await.expect("leader again"), 1);
    assert_eq!(n.mgr.propose(register(4)).await.expect("after restart"), Epoch(5));
    n.mgr
        .initialize(BTreeMap::from([(1, n.addr)]))
        .await
        .expect("initialize after restart is a no-op");
    stop(n).await;

    // The directory refuses another member id and another cluster.
    let wrong_id = ManagerConfig::new(2, addr, path.clone());
    assert!(matches!(
        Manager::start(wrong_id, outsider.clone(), initial_map()).await,
        Err(ManagerError::Storage(_))
    ));
    let other_cluster = ClusterMap::new("another", 16, 8, 3, 6);
    assert!(matches!(
        Manager::start(ManagerConfig::new(1, addr, path), outsider.clone(), other_cluster).await,
        Err(ManagerError::WrongCluster { .. })
    ));
    outsider.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_managers_elect_forward_fail_over_and_catch_up() {
    init_tracing();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    // Snapshots every 4 entries, so the member that comes back must be sent one.
    let snapshot_every = 4;
    let mut nodes = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        nodes.push(boot(i as u64 + 1, any, d.path(), snapshot_every).await);
    }
    let members: BTreeMap<u64, SocketAddr> = nodes.iter().map(|n| (n.id, n.addr)).collect();
    let addrs: Vec<SocketAddr> = members.values().copied().collect();
    let outsider = PeerClient::new(transport(), secret());
    assert_eq!(
        manager::fetch_map(&outsider, &addrs)
            .await
            .expect("fetch before format"),
        initial_map(),
        "before initialisation every manager serves the initial map"
    );
    nodes[0].mgr.initialize(members).await.expect("initialize");
    let mut leader = 0;
    for n in &nodes {
        leader = n.mgr.wait_for_leader(WAIT).await.expect("leader known");
    }
    let leader = eventually("all three to agree on the leader", || {
        nodes.iter().all(|n| n.mgr.leader() == Some(leader)).then_some(leader)
    })
    .await;
    assert_eq!(nodes.iter().filter(|n| n.mgr.is_leader()).count(), 1);

    // Proposals through a follower are forwarded to the leader.
    let follower = nodes.iter().find(|n| n.id != leader).expect("a follower");
    assert!(!follower.mgr.is_leader());
    for i in 1..=3 {
        assert_eq!(follower.mgr.propose(register(i)).await.expect("forwarded"), Epoch(i));
    }
    assert_eq!(
        manager::propose(&outsider, &[follower.addr], &register(4))
            .await
            .expect("helper via a follower"),
        Epoch(4)
    );
    for n in &nodes {
        n.mgr.wait_for_epoch(Epoch(4), WAIT).await.expect("converged");
    }
    let map = nodes[0].mgr.map();
    assert!(nodes.iter().all(|n| n.mgr.map() == map), "same map everywhere");
    assert_eq!(map.nodes.len(), 4);

    // The leader dies: a new one is elected and proposals go on.
    let at = nodes.iter().position(|n| n.id == leader).expect("leader present");
    let killed = Instant::now();
    let (old_id, old_addr, old_dir) = stop(nodes.remove(at)).await;
    let new_leader = eventually("a new leader", || {
        let l = nodes[0].mgr.leader()?;
        (l != old_id && nodes.iter().all(|n| n.mgr.leader() == Some(l))).then_some(l)
    })
    .await;
    let elected_in = killed.elapsed();
    assert!(elected_in < Duration::from_secs(5), "election took {elected_in:?}");
    let mut epoch = 4;
    for i in 5..=14 {
        let via = &nodes[i as usize % 2];
        epoch = via.mgr.propose(register(i)).await.expect("after failover").0;
        assert_eq!(epoch, i);
    }
    for n in &nodes {
        n.mgr
            .wait_for_epoch(Epoch(epoch), WAIT)
            .await
            .expect("survivors converged");
    }
    let survivor = nodes.iter().find(|n| n.id == new_leader).expect("new leader");
    let snap = eventually("a snapshot on the new leader", || survivor.mgr.metrics().snapshot_index).await;
    assert!(snap >= snapshot_every);

    // The old leader comes back on its address and directory and catches up.
    let back = boot(old_id, old_addr, &old_dir, snapshot_every).await;
    assert_eq!(back.mgr.map().epoch, Epoch(4), "restarts from what it had applied");
    let caught_up = back.mgr.wait_for_epoch(Epoch(epoch), WAIT).await.expect("caught up");
    assert_eq!(caught_up, nodes[0].mgr.map());
    assert_eq!(back.mgr.wait_for_leader(WAIT).await.expect("follows"), new_leader);
    assert_eq!(
        back.mgr
            .propose(register(15))
            .await
            .expect("through the returned member"),
        Epoch(15)
    );
    nodes.push(back);
    for n in &nodes {
        n.mgr.wait_for_epoch(Epoch(15), WAIT).await.expect("all converged");
    }
    let map = nodes[0].mgr.map();
    assert!(nodes.iter().all(|n| n.mgr.map() == map));
    assert_eq!(
        manager::fetch_map(&outsider, &[old_addr])
            .await
            .expect("fetch from returned member"),
        map
    );
    for n in nodes {
        stop(n).await;
    }
    outsider.close();
}
