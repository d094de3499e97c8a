//! The simulated world: the event loop, the network, nodes, the manager and clients.

mod ns;

use super::{Bug, Config, Failure, Report, Rng};
use crate::ids::{Epoch, Ino, NodeId, PartitionId};
use crate::map::{ClusterMap, MapCommand, MapView, NodeInfo, NodeState};
use crate::namespace::{DentryVal, Errno, FileKind, Mutation, Need, Partition};
use crate::service::copy::CopyId;
use crate::service::protocol::{Follow, Takeover, TakeoverPlan, adopt_copy};
use crate::service::read_fence::ReadFence;
use crate::service::replica::{Key, PartMeta, Replica};
use crate::service::store::Write;
use crate::service::wire::{NsOp, OpReply, PartOp, Pulled, ReplicaAck, Replicate};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;

/// Virtual milliseconds.
type Ms = u64;

const HEARTBEAT: Ms = 100;
const DOWN_AFTER: Ms = 1_000;
const OUT_AFTER: Ms = 8_000;
const IN_TOUCH_LOST: Ms = 600;
const CATCH_UP_EVERY: u64 = 3;
const REPLICATE_TIMEOUT: Ms = 2_000;
const PULL_TIMEOUT: Ms = 2_000;
const COPY_TIMEOUT: Ms = 30_000;
const CLIENT_TIMEOUT: Ms = 3_000;
const GIVE_UP: Ms = 60_000;
const HEAL_LIMIT: Ms = 120_000;
const LOG_LINES: usize = 200;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Addr {
    Node(NodeId),
    Client(usize),
    NsClient(usize),
}

#[derive(Clone, Debug)]
enum Op {
    Put(Vec<u8>),
    Alloc,
    /// A read of the partition from any member of the client's map, with the names
    /// acknowledged before it was issued: the copy that answers must hold them all.
    Read(Vec<Vec<u8>>),
    /// A coordinator's batch (steps of a namespace operation), from node `.1`.
    Batch(Vec<PartOp>, NodeId),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fail {
    Stale,
    Again,
    Timeout,
    Disk,
    Late,
    /// The coordinator may no longer apply this batch (`coordinator::fence`).
    Fenced,
}

#[derive(Clone, Debug)]
enum Msg {
    Exec {
        epoch: Epoch,
        p: PartitionId,
        op: Op,
        deadline: Ms,
    },
    Replicate(Replicate),
    Install {
        epoch: Epoch,
        p: PartitionId,
        copy: CopyId,
        part: Box<Partition>,
    },
    SyncMe {
        epoch: Epoch,
        p: PartitionId,
        node: NodeId,
    },
    Pull {
        epoch: Epoch,
        p: PartitionId,
    },
    PullCopy {
        epoch: Epoch,
        p: PartitionId,
    },
    /// A client's namespace operation, to the primary of its anchor.
    Ns {
        epoch: Epoch,
        op: NsOp,
        id: u64,
    },
    Lock {
        keys: Vec<u64>,
        owner: u64,
        anchor: PartitionId,
        /// The locked inodes to read once held, for a caller on this map epoch
        /// (`Lock::fetch` of the service).
        read: Option<(Epoch, Vec<Ino>)>,
    },
    /// A read from a copy (any member; no epoch check, as `on_read` of node.rs): which
    /// of `names` the copy lacks.
    Read {
        p: PartitionId,
        names: Vec<Vec<u8>>,
    },
    /// Whether the node adopted `epoch` (`on_fence` of node.rs).
    Fence {
        epoch: Epoch,
    },
    /// Whether a partition's primary redid every intent left in it.
    Settled {
        epoch: Epoch,
        p: PartitionId,
    },
    /// Whether the partitions a node leads may still owe counts to `dirs`
    /// (`wire::Quiet`).
    Quiet {
        epoch: Epoch,
        dirs: Vec<Ino>,
    },
    Unlock {
        keys: Vec<u64>,
        owner: u64,
    },
    Fetch {
        epoch: Epoch,
        needs: Vec<Need>,
    },
}

impl Msg {
    fn kind(&self) -> &'static str {
        match self {
            Msg::Exec { .. } => "execute",
            Msg::Replicate(_) => "replicate",
            Msg::Install { .. } => "install",
            Msg::SyncMe { .. } => "sync-me",
            Msg::Pull { .. } => "pull",
            Msg::PullCopy { .. } => "pull-copy",
            Msg::Ns { .. } => "namespace-op",
            Msg::Lock { .. } => "lock",
            Msg::Unlock { .. } => "unlock",
            Msg::Settled { .. } => "settled",
            Msg::Quiet { .. } => "quiet",
            Msg::Fetch { .. } => "fetch",
            Msg::Read { .. } => "read",
            Msg::Fence { .. } => "fence",
        }
    }
}

#[derive(Clone, Debug)]
enum Body {
    Exec(Option<u64>),
    Ack(ReplicaAck),
    Done,
    Position(Pulled),
    Copy(CopyId, Box<Partition>),
    Ns(Result<OpReply, Errno>),
    Locked(bool),
    /// Keys granted, with the locked inodes read once they were held.
    Granted(Vec<(Ino, Option<crate::namespace::InodeRec>)>),
    Fetched(Vec<ns::Rec>),
    /// The names a read's copy lacks.
    Missing(Vec<Vec<u8>>),
    /// The partitions a node leads, and whether none of them owes counts
    /// (`wire::QuietReply`).
    Quiet(Vec<PartitionId>, bool),
    /// The epoch a fenced node adopted.
    Adopted(Epoch),
}

#[derive(Clone, Debug)]
enum Packet {
    Req { call: u64, msg: Msg },
    Rep { call: u64, res: Result<Body, Fail> },
}

enum Ev {
    Net {
        from: Addr,
        to: Addr,
        pkt: Packet,
    },
    Timeout {
        at: Addr,
        inc: u64,
        call: u64,
    },
    Disk {
        node: NodeId,
        inc: u64,
    },
    Tick {
        node: NodeId,
        inc: u64,
    },
    Manager,
    Fault,
    Restart(NodeId),
    Heal(NodeId),
    Join,
    Client(usize),
    NsClient(usize),
    Work {
        node: NodeId,
        inc: u64,
        k: u64,
        wait: ns::Wait,
    },
    LockWait(NodeId, u64, Box<ns::LockWait>),
}

/// Who waits for a reply: the caller's address and call number.
type ReplyTo = (Addr, u64);

enum Stage {
    Positions,
    Copy,
    Persist,
    /// The other members install the new reign's copy before it serves.
    Level,
}

enum Task {
    Lead {
        reply: Option<ReplyTo>,
        value: Option<u64>,
        waiting: usize,
        disk: bool,
        disk_ok: bool,
        fail: Option<Fail>,
        req: Replicate,
        /// An empty batch that checks a moving partition's replicas: once every one
        /// made it durable, the move is done.
        settles: bool,
    },
    /// Waits for the nodes a map dropped from the partition to confirm they adopted it
    /// (`ReadFence`) before leading the batch.
    Fence {
        ops: Vec<PartOp>,
        reply: Option<ReplyTo>,
        value: Option<u64>,
        deadline: Ms,
        /// The nodes whose answer it waits for.
        waits: BTreeSet<NodeId>,
    },
    /// Waits for a batch to be durable; the copy serves if the map is still at the epoch.
    Follow(ReplyTo, Epoch),
    Install(ReplyTo, Epoch),
    Send(ReplyTo),
    TakeOver {
        tally: Takeover,
        waiting: usize,
        stage: Stage,
        plan: Option<TakeoverPlan>,
        epoch: Epoch,
    },
}

enum Queued {
    Req(Addr, u64, Msg),
    Write {
        ops: Vec<PartOp>,
        reply: Option<ReplyTo>,
        value: Option<u64>,
        deadline: Ms,
    },
}

struct Slot {
    r: Replica,
    task: Option<Task>,
    queue: VecDeque<Queued>,
    syncing: bool,
}

enum Pending {
    Replicate(PartitionId, NodeId),
    Install(PartitionId),
    Pull(PartitionId, NodeId),
    PullCopy(PartitionId),
    SyncMe(PartitionId),
    /// A request of namespace work item `.0` (attempt `.1`).
    Work(u64, u32, ns::Wait),
    /// Whether the partition of dead coordinators' operations settled.
    Settled(PartitionId),
    /// A fenced node's answer (for every partition waiting for it).
    Fence(NodeId),
}

type Disk = BTreeMap<PartitionId, (PartMeta, BTreeMap<Key, Vec<u8>>)>;

struct Node {
    id: NodeId,
    inc: u64,
    alive: bool,
    cut: bool,
    cut_since: Ms,
    view: Arc<MapView>,
    in_touch: bool,
    slots: BTreeMap<PartitionId, Slot>,
    disk: Disk,
    disk_q: VecDeque<(PartitionId, Write, bool)>,
    calls: BTreeMap<u64, Pending>,
    next_call: u64,
    ticks: u64,
    caught_up_at: Epoch,
    /// Moving partitions whose replicas all made an empty batch durable, with the map
    /// epoch it was led in: told to the managers together at the next tick.
    moves_done: Vec<(PartitionId, Epoch)>,
    /// Nodes that may still serve copies this node's partitions dropped.
    fence: ReadFence,
    /// Fenced nodes asked and not answered yet: a partition that needs one of them
    /// waits for that answer instead of asking again.
    fence_asking: BTreeSet<NodeId>,
    ns: ns::NsNode,
}

struct Client {
    view: Arc<MapView>,
    op: Option<(PartitionId, Op, Ms)>,
    call: u64,
    /// Only reads, from the map it has (fetching another when a read fails).
    reader: bool,
    /// The node the current call went to.
    asked: Option<NodeId>,
}

/// Each node's partitions in one placement.
type PartitionsOf = BTreeMap<NodeId, Vec<PartitionId>>;

/// Views by epoch, with each node's partitions (the placement is computed once per map).
struct Views {
    by_epoch: BTreeMap<Epoch, (Arc<MapView>, Rc<PartitionsOf>)>,
}

impl Views {
    fn add(&mut self, v: Arc<MapView>) {
        let mut of: BTreeMap<NodeId, Vec<PartitionId>> = BTreeMap::new();
        for p in 0..v.map.partitions {
            for n in v.placement.partition(PartitionId(p)) {
                of.entry(*n).or_default().push(PartitionId(p));
            }
        }
        self.by_epoch.insert(v.map.epoch, (v, Rc::new(of)));
    }

    fn of(&self, epoch: Epoch, n: NodeId) -> Vec<PartitionId> {
        self.by_epoch
            .get(&epoch)
            .and_then(|(_, of)| of.get(&n).cloned())
            .unwrap_or_default()
    }
}

struct World {
    cfg: Config,
    rng: Rng,
    now: Ms,
    seq: u64,
    heap: BinaryHeap<Reverse<(Ms, u64)>>,
    events: BTreeMap<u64, Ev>,
    map: ClusterMap,
    view: Arc<MapView>,
    views: Views,
    nodes: BTreeMap<NodeId, Node>,
    heard: BTreeMap<NodeId, Ms>,
    clients: Vec<Client>,
    ns_clients: Vec<ns::NsClient>,
    ns_inos: BTreeSet<Ino>,
    issued: u64,
    finished: u64,
    next_name: u64,
    acked: BTreeMap<PartitionId, Vec<Vec<u8>>>,
    counters: BTreeMap<PartitionId, BTreeSet<u64>>,
    by_epoch: BTreeMap<(PartitionId, Epoch), NodeId>,
    by_reign: BTreeMap<(PartitionId, Epoch), NodeId>,
    report: Report,
    log: VecDeque<String>,
    failure: Option<String>,
    faults_on: bool,
    next_node: u32,
    victims: BTreeSet<NodeId>,
    mass_at: Option<Ms>,
}

fn addr_of(id: NodeId) -> std::net::SocketAddr {
    let b = id.0.to_be_bytes();
    std::net::SocketAddr::from(([10, b[5], b[6], b[7]], 7000))
}

fn info(id: NodeId) -> NodeInfo {
    NodeInfo::meta_only(id, addr_of(id), NodeState::Up)
}

/// Runs one simulation; `Err` when an invariant broke.
pub fn run(cfg: &Config) -> Result<Report, Failure> {
    let mut map = ClusterMap::new("sim", cfg.partitions, 1, 3, 1);
    // The nodes are there before any partition holds anything: nothing moves while
    // they register (and working out the moves of 300 registrations would cost more
    // than the rest of the run).
    for i in 1..=cfg.nodes {
        let id = NodeId(u64::from(i));
        map.nodes.insert(id, info(id));
        map.epoch = Epoch(map.epoch.0 + 1);
    }
    let mut w = World::new(cfg, map);
    for i in 1..=cfg.nodes {
        w.add_node(NodeId(u64::from(i)));
    }
    w.at(HEARTBEAT, Ev::Manager);
    // The cluster forms (every partition's first primary takes over and installs its
    // members) before clients and faults start; its messages are counted apart.
    w.settle("the cluster to form")?;
    w.report.bootstrap_messages = w.report.total_messages();
    w.report.messages.clear();
    w.start_load();
    w.main_loop()?;
    w.heal()?;
    w.final_checks()?;
    w.report.virtual_ms = w.now;
    w.report.balance = w.balance();
    Ok(w.report)
}

impl World {
    /// A world of `map`'s nodes, before any of them runs.
    fn new(cfg: &Config, map: ClusterMap) -> World {
        let view = Arc::new(MapView::new(map.clone()));
        let mut views = Views {
            by_epoch: BTreeMap::new(),
        };
        views.add(view.clone());
        World {
            rng: Rng::new(cfg.seed),
            cfg: cfg.clone(),
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            events: BTreeMap::new(),
            map,
            view: view.clone(),
            views,
            nodes: BTreeMap::new(),
            heard: BTreeMap::new(),
            clients: Vec::new(),
            ns_clients: Vec::new(),
            ns_inos: BTreeSet::new(),
            issued: 0,
            finished: 0,
            next_name: 0,
            acked: BTreeMap::new(),
            counters: BTreeMap::new(),
            by_epoch: BTreeMap::new(),
            by_reign: BTreeMap::new(),
            report: Report::default(),
            log: VecDeque::new(),
            failure: None,
            faults_on: cfg.faults,
            next_node: cfg.nodes + 1,
            victims: BTreeSet::new(),
            mass_at: None,
        }
    }

    /// Schedules the load: the clients' and namespace clients' first operations, the
    /// first fault, the joins.
    fn start_load(&mut self) {
        let view = self.view.clone();
        for c in 0..(self.cfg.clients + self.cfg.readers) as usize {
            self.clients.push(Client {
                view: view.clone(),
                op: None,
                call: 0,
                reader: c >= self.cfg.clients as usize,
                asked: None,
            });
            let at = self.rng.below(50);
            self.at(at, Ev::Client(c));
        }
        for c in 0..self.cfg.ns_clients as usize {
            self.ns_clients.push(ns::NsClient::new(view.clone()));
            let at = self.rng.below(50);
            self.at(at, Ev::NsClient(c));
        }
        if self.cfg.faults {
            let at = 500 + self.rng.below(1500);
            self.at(at, Ev::Fault);
        }
        for i in 0..u64::from(self.cfg.joins) {
            let at = 1000 + i * 2500 + self.rng.below(1000);
            self.at(at, Ev::Join);
        }
    }

    /// Copies held per live node: (max, mean).
    fn balance(&self) -> (u64, f64) {
        let counts: Vec<u64> = self
            .nodes
            .values()
            .filter(|n| n.alive)
            .map(|n| self.views.of(self.view.map.epoch, n.id).len() as u64)
            .collect();
        let max = counts.iter().copied().max().unwrap_or(0);
        let mean = counts.iter().sum::<u64>() as f64 / counts.len().max(1) as f64;
        (max, mean)
    }
}

impl World {
    // ------------------------------------------------------------ events and log

    fn at(&mut self, delay: Ms, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((self.now + delay, self.seq)));
        self.events.insert(self.seq, ev);
    }

    fn note(&mut self, line: String) {
        if self.log.len() == LOG_LINES {
            self.log.pop_front();
        }
        self.log.push_back(format!("{:>8} ms  {line}", self.now));
    }

    fn violation(&mut self, what: String) {
        if self.failure.is_none() {
            self.failure = Some(what);
        }
    }

    fn failed(&self, what: String) -> Failure {
        Failure {
            config: self.cfg.clone(),
            at_ms: self.now,
            what,
            log: self.log.iter().cloned().collect(),
        }
    }

    fn step(&mut self) -> bool {
        let Some(Reverse((t, seq))) = self.heap.pop() else {
            return false;
        };
        self.now = t;
        self.report.events += 1;
        let ev = self.events.remove(&seq).expect("every queued event is stored");
        match ev {
            Ev::Net { from, to, pkt } => self.deliver(from, to, pkt),
            Ev::Timeout { at, inc, call } => self.timeout(at, inc, call),
            Ev::Disk { node, inc } => self.disk_done(node, inc),
            Ev::Tick { node, inc } => self.tick(node, inc),
            Ev::Manager => self.manager(),
            Ev::Fault => self.fault(),
            Ev::Restart(n) => self.restart(n),
            Ev::Heal(n) => self.heal_cut(n),
            Ev::Join => self.join(),
            Ev::Client(c) => self.client_go(c),
            Ev::NsClient(c) => self.ns_client_go(c),
            Ev::Work { node, inc, k, wait } => self.ns_timer(node, inc, k, wait),
            Ev::LockWait(node, inc, w) => self.ns_lock_wait(node, inc, *w),
        }
        true
    }

    fn main_loop(&mut self) -> Result<(), Failure> {
        while self.finished < self.cfg.ops {
            if !self.step() {
                return Err(self.failed("the world stopped with operations left".into()));
            }
            if let Some(what) = self.failure.take() {
                return Err(self.failed(what));
            }
            if self.cfg.mass_failure_pct > 0 && self.mass_at.is_none() && self.finished >= self.cfg.ops / 4 {
                self.mass_failure();
            }
        }
        Ok(())
    }

    /// Stops faults, brings back crashed and cut nodes, and runs until every partition
    /// has all its members serving on the newest map.
    fn heal(&mut self) -> Result<(), Failure> {
        self.faults_on = false;
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for n in ids {
            if self.victims.contains(&n) {
                continue;
            }
            if self.nodes[&n].cut {
                self.heal_cut(n);
            }
            if !self.nodes[&n].alive {
                self.restart(n);
            }
        }
        self.settle("the world healed")
    }

    /// Runs until every partition has all members serving on the newest map (and the
    /// repair after a mass failure is timed).
    fn settle(&mut self, since: &str) -> Result<(), Failure> {
        let deadline = self.now + HEAL_LIMIT;
        let mut checked = None;
        loop {
            // Checked once per heartbeat of virtual time: it looks at every partition.
            if checked.is_none_or(|t| self.now >= t + HEARTBEAT) {
                checked = Some(self.now);
                if self.converged()
                    && self.ns_quiet().is_none()
                    && self.mass_at.is_none_or(|_| self.report.repair_ms.is_some())
                {
                    break;
                }
            }
            if self.now > deadline || !self.step() {
                return Err(self.failed(format!(
                    "not every partition had all members serving {} s after {since}: {}",
                    HEAL_LIMIT / 1000,
                    self.ns_quiet().unwrap_or_else(|| self.unconverged())
                )));
            }
            if let Some(what) = self.failure.take() {
                return Err(self.failed(what));
            }
        }
        Ok(())
    }

    fn converged(&self) -> bool {
        self.unconverged().is_empty()
    }

    /// The first partition without all members serving on the newest map, described.
    fn unconverged(&self) -> String {
        let v = &self.view;
        let up = v
            .map
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Up && n.roles.meta)
            .count();
        if let Some((p, m)) = v.map.moves.iter().next() {
            return format!("partition {} still moving off {:?}", p.0, m.holders);
        }
        for p in 0..v.map.partitions {
            let p = PartitionId(p);
            let members = v.members(p);
            if members.len() < up.min(usize::from(v.map.replication)) {
                return format!("partition {} has {} members", p.0, members.len());
            }
            for m in members {
                let n = &self.nodes[&m];
                let serving = n.slots.get(&p).is_some_and(|s| s.r.serving);
                if !n.alive || n.cut || n.view.map.epoch != v.map.epoch || !serving {
                    return format!(
                        "partition {}: member {} (alive {}, epoch {}, serving {serving})",
                        p.0, m.0, n.alive, n.view.map.epoch.0
                    );
                }
            }
        }
        String::new()
    }

    fn final_checks(&mut self) -> Result<(), Failure> {
        let v = self.view.clone();
        for p in 0..v.map.partitions {
            let p = PartitionId(p);
            let members = v.members(p);
            let first = &self.nodes[&members[0]].slots[&p].r.part;
            for m in &members[1..] {
                let other = &self.nodes[m].slots[&p].r.part;
                if other.dentries != first.dentries || other.intents != first.intents || other.inodes != first.inodes {
                    let name = |k: &(Ino, Vec<u8>)| format!("{:#x}/{}", k.0.0, String::from_utf8_lossy(&k.1));
                    let mut diff = differing(&first.inodes, &other.inodes, |i| format!("inode {:#x}", i.0));
                    diff.extend(differing(&first.dentries, &other.dentries, |k| {
                        format!("entry {}", name(k))
                    }));
                    if first.intents != other.intents {
                        diff.push(format!(
                            "intents {:x?} / {:x?}",
                            first.intents.keys().collect::<Vec<_>>(),
                            other.intents.keys().collect::<Vec<_>>()
                        ));
                    }
                    diff.truncate(4);
                    return Err(self.failed(format!(
                        "partition {}: members {} and {} hold different copies after healing: {}",
                        p.0,
                        members[0].0,
                        m.0,
                        diff.join("; ")
                    )));
                }
            }
            for name in self.acked.get(&p).into_iter().flatten() {
                for m in &members {
                    if !self.nodes[m].slots[&p]
                        .r
                        .part
                        .dentries
                        .contains_key(&(Ino::ROOT, name.clone()))
                    {
                        return Err(self.failed(format!(
                            "partition {}: acknowledged name {} is missing on member {} after healing",
                            p.0,
                            String::from_utf8_lossy(name),
                            m.0
                        )));
                    }
                }
            }
        }
        self.ns_final_checks().map_err(|what| self.failed(what))
    }

    // ------------------------------------------------------------ network

    fn send(&mut self, from: Addr, to: Addr, pkt: Packet) {
        match &pkt {
            Packet::Req { msg, .. } => *self.report.messages.entry(msg.kind()).or_default() += 1,
            Packet::Rep { .. } => *self.report.messages.entry("reply").or_default() += 1,
        }
        if let Addr::Node(n) = from
            && self.nodes.get(&n).is_none_or(|n| n.cut || !n.alive)
        {
            self.report.dropped += 1;
            return;
        }
        if self.faults_on && self.rng.chance(10) {
            self.report.dropped += 1;
            return;
        }
        // The transport is reliable and in order within a connection: a request
        // arrives at most once, and retries are the caller's own (and are simulated).
        // Replication messages may still come twice here, to show the protocol takes a
        // batch, a copy or a question twice without harm.
        let twice_ok = matches!(
            &pkt,
            Packet::Req {
                msg: Msg::Replicate(_)
                    | Msg::Install { .. }
                    | Msg::Pull { .. }
                    | Msg::PullCopy { .. }
                    | Msg::SyncMe { .. },
                ..
            }
        );
        let copies = if self.faults_on && self.rng.chance(5) && twice_ok {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = 1 + self.rng.below(3);
            if self.rng.chance(30) {
                delay += self.rng.below(60);
            }
            self.at(
                delay,
                Ev::Net {
                    from,
                    to,
                    pkt: pkt.clone(),
                },
            );
        }
    }

    fn deliver(&mut self, from: Addr, to: Addr, pkt: Packet) {
        match to {
            Addr::Client(c) => {
                if let Packet::Rep { call, res } = pkt {
                    self.client_reply(c, call, res);
                }
            }
            Addr::NsClient(c) => {
                if let Packet::Rep { call, res } = pkt {
                    self.ns_client_reply(c, call, res);
                }
            }
            Addr::Node(n) => {
                if self.nodes.get(&n).is_none_or(|n| n.cut || !n.alive) {
                    self.report.dropped += 1;
                    return;
                }
                match pkt {
                    Packet::Req { call, msg } => self.request(n, from, call, msg),
                    Packet::Rep { call, res } => self.reply(n, call, res),
                }
            }
        }
    }

    fn respond(&mut self, n: NodeId, to: ReplyTo, res: Result<Body, Fail>) {
        self.send(Addr::Node(n), to.0, Packet::Rep { call: to.1, res });
    }

    /// Sends a request from node `n`; its reply (or a timeout) comes back as `pending`.
    fn call(&mut self, n: NodeId, to: NodeId, msg: Msg, pending: Pending, timeout: Ms) {
        let node = self.nodes.get_mut(&n).expect("caller exists");
        node.next_call += 1;
        let call = node.next_call;
        node.calls.insert(call, pending);
        let inc = node.inc;
        self.send(Addr::Node(n), Addr::Node(to), Packet::Req { call, msg });
        self.at(
            timeout,
            Ev::Timeout {
                at: Addr::Node(n),
                inc,
                call,
            },
        );
    }

    fn timeout(&mut self, at: Addr, inc: u64, call: u64) {
        match at {
            Addr::Client(c) => self.client_reply(c, call, Err(Fail::Timeout)),
            Addr::NsClient(c) => self.ns_client_reply(c, call, Err(Fail::Timeout)),
            Addr::Node(n) => {
                if self.nodes.get(&n).is_some_and(|x| x.alive && x.inc == inc) {
                    self.reply(n, call, Err(Fail::Timeout));
                }
            }
        }
    }

    // ------------------------------------------------------------ disk

    fn persist(&mut self, n: NodeId, p: PartitionId, write: Write) {
        let fails = self.faults_on && self.rng.chance(2);
        let node = self.nodes.get_mut(&n).expect("writer exists");
        node.disk_q.push_back((p, write, fails));
        if node.disk_q.len() == 1 {
            let inc = node.inc;
            let d = 1 + self.rng.below(4);
            self.at(d, Ev::Disk { node: n, inc });
        }
    }

    fn disk_done(&mut self, n: NodeId, inc: u64) {
        let node = self.nodes.get_mut(&n).expect("node exists");
        if !node.alive || node.inc != inc {
            return;
        }
        let Some((p, write, fails)) = node.disk_q.pop_front() else {
            return;
        };
        if !fails {
            let (meta, recs) = node.disk.entry(p).or_default();
            if write.replace {
                recs.clear();
            }
            for (k, v) in write.records {
                match v {
                    Some(v) => recs.insert(k, v),
                    None => recs.remove(&k),
                };
            }
            *meta = write.meta;
        }
        if !node.disk_q.is_empty() {
            let d = 1 + self.rng.below(4);
            self.at(d, Ev::Disk { node: n, inc });
        }
        self.on_disk(n, p, !fails);
    }

    // ------------------------------------------------------------ nodes

    fn add_node(&mut self, id: NodeId) {
        let node = Node {
            id,
            inc: 1,
            alive: true,
            cut: false,
            cut_since: 0,
            view: self.view.clone(),
            in_touch: true,
            slots: BTreeMap::new(),
            disk: BTreeMap::new(),
            disk_q: VecDeque::new(),
            calls: BTreeMap::new(),
            next_call: 0,
            ticks: 0,
            caught_up_at: Epoch(0),
            moves_done: Vec::new(),
            fence: ReadFence::default(),
            fence_asking: BTreeSet::new(),
            ns: ns::NsNode::default(),
        };
        self.nodes.insert(id, node);
        let view = self.view.clone();
        self.nodes.get_mut(&id).expect("inserted").fence.after_gap(&view);
        self.heard.insert(id, self.now);
        let d = self.rng.below(HEARTBEAT);
        self.at(d, Ev::Tick { node: id, inc: 1 });
    }

    fn tick(&mut self, n: NodeId, inc: u64) {
        let (alive, cut, cut_since) = match self.nodes.get(&n) {
            Some(x) if x.inc == inc => (x.alive, x.cut, x.cut_since),
            _ => return,
        };
        if !alive {
            return;
        }
        self.at(HEARTBEAT, Ev::Tick { node: n, inc });
        if cut {
            let node = self.nodes.get_mut(&n).expect("exists");
            if node.in_touch && self.now.saturating_sub(cut_since) > IN_TOUCH_LOST {
                // `set_in_touch(false)` of node.rs: every copy stops serving.
                node.in_touch = false;
                for s in node.slots.values_mut() {
                    s.r.serving = false;
                }
            }
            return;
        }
        self.heard.insert(n, self.now);
        let newest = self.view.clone();
        let node = self.nodes.get_mut(&n).expect("exists");
        node.in_touch = true;
        node.ticks += 1;
        let due = node.ticks % CATCH_UP_EVERY == 0 || node.caught_up_at != newest.map.epoch;
        // With slow maps, the managers' answer reaches the node one tick in five.
        let fetched = !self.cfg.slow_maps || self.rng.below(5) == 0;
        let node = self.nodes.get_mut(&n).expect("exists");
        if node.view.map.epoch < newest.map.epoch && fetched {
            self.adopt(n, newest);
        }
        if due {
            self.catch_up(n);
        }
        self.ns_tick(n);
    }

    /// `adopt` of node.rs; with [`Config::map_history`], every epoch in between in turn.
    fn adopt(&mut self, n: NodeId, new: Arc<MapView>) {
        if self.cfg.map_history {
            let from = self.nodes[&n].view.map.epoch;
            let steps: Vec<Arc<MapView>> = self
                .views
                .by_epoch
                .range(Epoch(from.0 + 1)..=new.map.epoch)
                .map(|(_, (v, _))| v.clone())
                .collect();
            for v in steps {
                self.adopt_one(n, v);
            }
        } else {
            self.adopt_one(n, new);
        }
    }

    fn adopt_one(&mut self, n: NodeId, new: Arc<MapView>) {
        let bug = self.cfg.bug;
        let node = self.nodes.get_mut(&n).expect("exists");
        let old = node.view.clone();
        if new.map.epoch <= old.map.epoch && old.map.epoch.0 != 0 {
            return;
        }
        let consecutive = new.map.epoch.0 == old.map.epoch.0 + 1 && node.in_touch;
        let mut stopped = 0;
        for (p, s) in node.slots.iter_mut() {
            let was = old.members(*p).contains(&n);
            let is = new.members(*p).contains(&n);
            let promoted = new.primary(*p) == Some(n) && old.primary(*p) != Some(n);
            let promoted = promoted && bug != Some(Bug::PromotedKeepsServing);
            if adopt_copy(&mut s.r, new.map.epoch, was, is, consecutive, promoted) {
                stopped += 1;
            }
        }
        node.fence.adopt(&old, &new, consecutive, n);
        node.view = new.clone();
        if stopped > 0 {
            self.note(format!(
                "node {} adopts epoch {} ({} copies stop serving)",
                n.0, new.map.epoch.0, stopped
            ));
        }
    }

    fn slot_or_create(&mut self, n: NodeId, p: PartitionId) -> &mut Slot {
        let partitions = self.cfg.partitions;
        self.nodes
            .get_mut(&n)
            .expect("exists")
            .slots
            .entry(p)
            .or_insert_with(|| Slot {
                r: Replica::initial(p, partitions, 0),
                task: None,
                queue: VecDeque::new(),
                syncing: false,
            })
    }

    /// `catch_up` of node.rs (partitions handled side by side, not one after another).
    fn catch_up(&mut self, n: NodeId) {
        let v = self.nodes[&n].view.clone();
        self.nodes.get_mut(&n).expect("exists").caught_up_at = v.map.epoch;
        if v.map.epoch.0 == 0 || !v.map.is_up(n) {
            return;
        }
        for p in self.views.of(v.map.epoch, n) {
            let members = v.members(p);
            if !members.contains(&n) {
                continue;
            }
            let slot = self.slot_or_create(n, p);
            if slot.r.serving {
                continue;
            }
            if members[0] == n {
                if slot.task.is_none() {
                    self.take_over(n, p, &v, &members);
                }
            } else if !slot.syncing {
                slot.syncing = true;
                let msg = Msg::SyncMe {
                    epoch: v.map.epoch,
                    p,
                    node: n,
                };
                self.call(n, members[0], msg, Pending::SyncMe(p), COPY_TIMEOUT);
            }
        }
        self.finish_moves(n, &v);
    }

    /// `finish_moves` of node.rs: the primary of a moving partition leads an empty
    /// batch; once every replica made it durable, the managers hear the move is done.
    fn finish_moves(&mut self, n: NodeId, v: &MapView) {
        let done = std::mem::take(&mut self.nodes.get_mut(&n).expect("exists").moves_done);
        if let Some(checked_in) = done.iter().map(|(_, e)| *e).min() {
            self.publish(MapCommand::MoveDone {
                partitions: done.iter().map(|(p, _)| *p).collect(),
                checked_in,
            });
        }
        for p in v.map.moves.keys().copied() {
            if v.primary(p) != Some(n) {
                continue;
            }
            let slot = self.slot_or_create(n, p);
            if !slot.r.serving || slot.task.is_some() {
                continue;
            }
            self.lead(n, p, Vec::new(), None, None, self.now + CLIENT_TIMEOUT);
            if let Some(Task::Lead { settles, .. }) = &mut self.slot_or_create(n, p).task {
                *settles = true;
            }
        }
    }

    fn take_over(&mut self, n: NodeId, p: PartitionId, v: &MapView, members: &[NodeId]) {
        let bug = self.cfg.bug;
        let slot = self.slot_or_create(n, p);
        let (mut tally, first) = Takeover::start(v.map.epoch, &slot.r, n, v.placement.partition(p), members);
        if bug == Some(Bug::TakeoverWithoutAllMembers) {
            tally.without_waiting_for_all();
        }
        let pos = (slot.r.meta.state_epoch, slot.r.meta.lsn);
        self.note(format!(
            "node {} takes over partition {} in epoch {} at {:#x}/{}, asking {:?}",
            n.0, p.0, v.map.epoch.0, pos.0.0, pos.1, first
        ));
        let slot = self.slot_or_create(n, p);
        slot.task = Some(Task::TakeOver {
            tally,
            waiting: first.len(),
            stage: Stage::Positions,
            plan: None,
            epoch: v.map.epoch,
        });
        if first.is_empty() {
            self.takeover_asked(n, p);
            return;
        }
        for m in first {
            let msg = Msg::Pull { epoch: v.map.epoch, p };
            self.call(n, m, msg, Pending::Pull(p, m), PULL_TIMEOUT);
        }
    }

    /// Every node asked so far answered: ask the next ones ([`Takeover::next_asks`]),
    /// else decide.
    fn takeover_asked(&mut self, n: NodeId, p: PartitionId) {
        let slot = self.slot_or_create(n, p);
        let Some(Task::TakeOver {
            tally, waiting, epoch, ..
        }) = &mut slot.task
        else {
            return;
        };
        let ask = tally.next_asks();
        if ask.is_empty() {
            return self.takeover_decide(n, p);
        }
        *waiting = ask.len();
        let epoch = *epoch;
        for m in ask {
            self.call(n, m, Msg::Pull { epoch, p }, Pending::Pull(p, m), PULL_TIMEOUT);
        }
    }

    fn takeover_decide(&mut self, n: NodeId, p: PartitionId) {
        let slot = self.slot_or_create(n, p);
        let Some(Task::TakeOver { tally, epoch, .. }) = &slot.task else {
            return;
        };
        let epoch = *epoch;
        let decided = tally.decide();
        self.note(format!("node {} partition {}: takeover {decided:?}", n.0, p.0));
        let d = match decided {
            Err(_) => return self.release(n, p),
            Ok(d) => d,
        };
        let slot = self.slot_or_create(n, p);
        let Some(Task::TakeOver { stage, plan, .. }) = &mut slot.task else {
            return;
        };
        *plan = Some(d);
        if let Some(from) = d.pull {
            *stage = Stage::Copy;
            self.call(n, from, Msg::PullCopy { epoch, p }, Pending::PullCopy(p), COPY_TIMEOUT);
        } else {
            self.takeover_persist(n, p);
        }
    }

    fn takeover_persist(&mut self, n: NodeId, p: PartitionId) {
        let slot = self.slot_or_create(n, p);
        let Some(Task::TakeOver { plan, epoch, .. }) = &slot.task else {
            return;
        };
        let reign = plan.expect("decided before persisting").reign;
        let epoch = *epoch;
        if self.nodes[&n].view.map.epoch != epoch {
            return self.release(n, p);
        }
        let slot = self.slot_or_create(n, p);
        let Some(Task::TakeOver { stage, .. }) = &mut slot.task else {
            return;
        };
        *stage = Stage::Persist;
        slot.r.begin_reign(reign);
        let write = Write::install(p, &slot.r);
        self.persist(n, p, write);
    }

    /// The slot's write lock is free again: run what waited for it.
    fn release(&mut self, n: NodeId, p: PartitionId) {
        loop {
            let slot = self.slot_or_create(n, p);
            slot.task = None;
            let Some(q) = slot.queue.pop_front() else {
                return;
            };
            match q {
                Queued::Req(from, call, msg) => self.request(n, from, call, msg),
                Queued::Write {
                    ops,
                    reply,
                    value,
                    deadline,
                } => self.lead(n, p, ops, reply, value, deadline),
            }
            if self.slot_or_create(n, p).task.is_some() {
                return;
            }
        }
    }

    /// A fenced node answered (`fence_dropped_holders` of node.rs): every partition
    /// waiting for it goes on — led once it waits for nobody (which looks again), or
    /// failed if the node did not confirm.
    fn fence_answer(&mut self, n: NodeId, m: NodeId, res: Result<Body, Fail>) {
        let node = self.nodes.get_mut(&n).expect("exists");
        node.fence_asking.remove(&m);
        let ok = match res {
            Ok(Body::Adopted(e)) => {
                node.fence.confirm(m, e);
                true
            }
            _ => false,
        };
        let waiting: Vec<PartitionId> = node
            .slots
            .iter()
            .filter(|(_, s)| matches!(&s.task, Some(Task::Fence { waits, .. }) if waits.contains(&m)))
            .map(|(p, _)| *p)
            .collect();
        for p in waiting {
            let slot = self.slot_or_create(n, p);
            let Some(Task::Fence { waits, .. }) = &mut slot.task else {
                unreachable!("selected above")
            };
            waits.remove(&m);
            if ok && !waits.is_empty() {
                continue;
            }
            let Some(Task::Fence {
                ops,
                reply,
                value,
                deadline,
                ..
            }) = slot.task.take()
            else {
                unreachable!("selected above")
            };
            if !ok {
                if let Some(to) = reply {
                    self.respond(n, to, Err(Fail::Again));
                }
                self.release(n, p);
                continue;
            }
            self.lead(n, p, ops, reply, value, deadline);
            if self.slot_or_create(n, p).task.is_none() {
                self.release(n, p);
            }
        }
    }

    /// `serve_in` of node.rs: a copy that caught up serves unless the map moved on
    /// from `epoch` or the node lost touch with the managers.
    fn serve_in(&mut self, n: NodeId, p: PartitionId, epoch: Epoch) -> bool {
        let node = &self.nodes[&n];
        let ok = node.view.map.epoch == epoch && node.in_touch;
        if ok {
            self.slot_or_create(n, p).r.serving = true;
        }
        ok
    }

    /// `check_epoch` of node.rs: a newer caller makes this node fetch the newest map.
    fn check_epoch(&mut self, n: NodeId, theirs: Epoch) -> Result<(), Fail> {
        let mine = self.nodes[&n].view.map.epoch;
        if theirs < mine {
            return Err(Fail::Stale);
        }
        if theirs > mine {
            let newest = self.view.clone();
            self.adopt(n, newest);
            if self.nodes[&n].view.map.epoch < theirs {
                return Err(Fail::Stale);
            }
        }
        Ok(())
    }

    fn is_member(&self, n: NodeId, p: PartitionId) -> bool {
        self.nodes[&n].view.members(p).contains(&n)
    }

    /// `primary_slot` of node.rs.
    fn primary_check(&self, n: NodeId, p: PartitionId) -> Result<(), Fail> {
        let node = &self.nodes[&n];
        if node.view.primary(p) != Some(n) {
            return Err(Fail::Stale);
        }
        match node.slots.get(&p) {
            Some(s) if s.r.serving => Ok(()),
            _ => Err(Fail::Again),
        }
    }

    fn request(&mut self, n: NodeId, from: Addr, call: u64, msg: Msg) {
        let to = (from, call);
        let res = self.request_inner(n, to, msg);
        if let Err(e) = res {
            self.respond(n, to, Err(e));
        }
    }

    /// Handles a request; `Err` answers it at once.
    fn request_inner(&mut self, n: NodeId, to: ReplyTo, msg: Msg) -> Result<(), Fail> {
        let (p, epoch) = match msg {
            Msg::Ns { .. }
            | Msg::Lock { .. }
            | Msg::Unlock { .. }
            | Msg::Fetch { .. }
            | Msg::Settled { .. }
            | Msg::Quiet { .. } => return self.ns_request(n, to, msg),
            Msg::Read { p, names } => return self.on_read(n, to, p, names),
            Msg::Fence { epoch } => return self.on_fence(n, to, epoch),
            Msg::Exec { p, epoch, .. }
            | Msg::Install { p, epoch, .. }
            | Msg::SyncMe { p, epoch, .. }
            | Msg::Pull { p, epoch }
            | Msg::PullCopy { p, epoch } => (p, epoch),
            Msg::Replicate(ref r) => (r.partition, r.epoch),
        };
        self.check_epoch(n, epoch)?;
        // What makes a copy serve comes from a sender of this very epoch
        // (`check_epoch_exact` of node.rs).
        if matches!(msg, Msg::Replicate(_) | Msg::Install { .. }) && self.nodes[&n].view.map.epoch != epoch {
            return Err(Fail::Stale);
        }
        // The epoch this request is handled in (`check_epoch` may have moved it on).
        let epoch = self.nodes[&n].view.map.epoch;
        if let Msg::Replicate(r) = &msg {
            // The primary led it in this epoch after hearing from every node fenced then
            // (`on_replicate` of node.rs).
            self.nodes.get_mut(&n).expect("exists").fence.batch_applied(p, r.epoch);
        }
        if let Msg::Exec { op, deadline, .. } = msg {
            return self.on_exec(n, to, p, op, deadline);
        }
        if let Msg::SyncMe { .. } = msg {
            self.primary_check(n, p)?;
        } else if !self.is_member(n, p) {
            return Err(Fail::Stale);
        }
        let slot = self.slot_or_create(n, p);
        if slot.task.is_some() {
            slot.queue.push_back(Queued::Req(to.0, to.1, msg));
            return Ok(());
        }
        self.on_copy_request(n, to, p, epoch, msg)
    }

    /// `on_read` of node.rs: any copy that serves answers, whatever the caller's epoch.
    fn on_read(&mut self, n: NodeId, to: ReplyTo, p: PartitionId, names: Vec<Vec<u8>>) -> Result<(), Fail> {
        let slot = self.nodes[&n]
            .slots
            .get(&p)
            .filter(|s| s.r.serving)
            .ok_or(Fail::Again)?;
        let missing = names
            .into_iter()
            .filter(|name| !slot.r.part.dentries.contains_key(&(Ino::ROOT, name.clone())))
            .collect();
        self.respond(n, to, Ok(Body::Missing(missing)));
        Ok(())
    }

    /// `on_fence` of node.rs: adopt the caller's map if this node is behind, then say
    /// which epoch it is in.
    fn on_fence(&mut self, n: NodeId, to: ReplyTo, epoch: Epoch) -> Result<(), Fail> {
        if self.nodes[&n].view.map.epoch < epoch {
            let newest = self.view.clone();
            self.adopt(n, newest);
        }
        let mine = self.nodes[&n].view.map.epoch;
        if mine < epoch {
            return Err(Fail::Stale);
        }
        self.respond(n, to, Ok(Body::Adopted(mine)));
        Ok(())
    }

    /// A client's operation at the partition's primary: led now, or queued behind the
    /// slot's task.
    fn on_exec(&mut self, n: NodeId, to: ReplyTo, p: PartitionId, op: Op, deadline: u64) -> Result<(), Fail> {
        self.primary_check(n, p)?;
        let (ops, value) = match op {
            Op::Put(name) => (vec![put(name)], None),
            Op::Read(_) => unreachable!("reads are not executed"),
            Op::Batch(ops, from) => {
                self.ns_fence(n, from, &ops)?;
                (ops, None)
            }
            Op::Alloc => {
                let (c, raise) = self.slot_or_create(n, p).r.next_counter();
                match raise {
                    None => {
                        self.respond(n, to, Ok(Body::Exec(Some(c))));
                        return Ok(());
                    }
                    Some(hwm) => (vec![PartOp::Counter(hwm)], Some(c)),
                }
            }
        };
        let slot = self.slot_or_create(n, p);
        if slot.task.is_some() {
            slot.queue.push_back(Queued::Write {
                ops,
                reply: Some(to),
                value,
                deadline,
            });
        } else {
            self.lead(n, p, ops, Some(to), value, deadline);
        }
        Ok(())
    }

    /// A request between the copies of partition `p` (replicate, install, sync, pull),
    /// with the slot free.
    fn on_copy_request(&mut self, n: NodeId, to: ReplyTo, p: PartitionId, epoch: Epoch, msg: Msg) -> Result<(), Fail> {
        let slot = self.slot_or_create(n, p);
        match msg {
            Msg::Exec { .. }
            | Msg::Ns { .. }
            | Msg::Lock { .. }
            | Msg::Unlock { .. }
            | Msg::Fetch { .. }
            | Msg::Settled { .. }
            | Msg::Quiet { .. }
            | Msg::Read { .. }
            | Msg::Fence { .. } => {
                unreachable!("handled by request_inner")
            }
            Msg::Replicate(req) => match slot.r.follow(req.state_epoch, req.lsn, &req.ops) {
                Follow::Already => self.respond(n, to, Ok(Body::Ack(ReplicaAck::Done))),
                Follow::NeedInstall => self.respond(n, to, Ok(Body::Ack(ReplicaAck::NeedInstall))),
                Follow::Applied(keys) => {
                    let write = Write::batch(p, &slot.r, &keys);
                    slot.task = Some(Task::Follow(to, epoch));
                    self.persist(n, p, write);
                }
            },
            Msg::Install { copy, part, .. } => {
                copy.check(epoch).map_err(|_| Fail::Stale)?;
                self.note(format!(
                    "node {} installs partition {} at {:#x}/{} from {:?}",
                    n.0, p.0, copy.state_epoch.0, copy.lsn, to.0
                ));
                let slot = self.slot_or_create(n, p);
                slot.r.install(&copy, *part).map_err(|_| Fail::Stale)?;
                let write = Write::install(p, &slot.r);
                slot.task = Some(Task::Install(to, epoch));
                self.report.installs += 1;
                self.persist(n, p, write);
            }
            Msg::SyncMe { node, .. } => {
                let v = self.nodes[&n].view.clone();
                if !v.members(p).contains(&node) {
                    return Err(Fail::Stale);
                }
                let slot = self.slot_or_create(n, p);
                let msg = install_of(&slot.r, v.map.epoch);
                slot.task = Some(Task::Send(to));
                self.call(n, node, msg, Pending::Install(p), REPLICATE_TIMEOUT * 5);
            }
            Msg::Pull { .. } => {
                let mut pos = slot.r.position();
                pos.fence = self.nodes[&n].fence.knowledge(p, epoch);
                self.respond(n, to, Ok(Body::Position(pos)));
            }
            Msg::PullCopy { .. } => {
                let body = Body::Copy(slot.r.copy_id(0), Box::new(slot.r.part.clone()));
                self.respond(n, to, Ok(body));
            }
        }
        Ok(())
    }

    /// `primary_write` of node.rs, with the slot's write lock free.
    fn lead(
        &mut self,
        n: NodeId,
        p: PartitionId,
        ops: Vec<PartOp>,
        reply: Option<ReplyTo>,
        value: Option<u64>,
        deadline: Ms,
    ) {
        if let Err(e) = self.primary_check(n, p) {
            if let Some(to) = reply {
                self.respond(n, to, Err(e));
            }
            return;
        }
        if self.now >= deadline {
            if let Some(to) = reply {
                self.respond(n, to, Err(Fail::Late));
            }
            return;
        }
        let v = self.nodes[&n].view.clone();
        if self.cfg.bug != Some(Bug::AckPastDroppedHolder) {
            let need = self.nodes.get_mut(&n).expect("exists").fence.needed(p, &v, n);
            if !need.is_empty() {
                self.slot_or_create(n, p).task = Some(Task::Fence {
                    ops,
                    reply,
                    value,
                    deadline,
                    waits: need.iter().map(|(m, _)| *m).collect(),
                });
                for (m, _) in need {
                    if self.nodes.get_mut(&n).expect("exists").fence_asking.insert(m) {
                        let msg = Msg::Fence { epoch: v.map.epoch };
                        self.call(n, m, msg, Pending::Fence(m), REPLICATE_TIMEOUT);
                    }
                }
                return;
            }
        }
        let slot = self.slot_or_create(n, p);
        let (keys, lsn) = slot.r.lead(&ops);
        let req = Replicate {
            epoch: v.map.epoch,
            partition: p,
            state_epoch: slot.r.meta.state_epoch,
            lsn,
            ops,
        };
        let write = Write::batch(p, &slot.r, &keys);
        let others: Vec<NodeId> = v.members(p).into_iter().filter(|m| *m != n).collect();
        slot.task = Some(Task::Lead {
            reply,
            value,
            waiting: others.len(),
            disk: true,
            disk_ok: false,
            fail: None,
            req: req.clone(),
            settles: false,
        });
        self.persist(n, p, write);
        for m in others {
            self.call(
                n,
                m,
                Msg::Replicate(req.clone()),
                Pending::Replicate(p, m),
                REPLICATE_TIMEOUT,
            );
        }
    }

    fn lead_progress(&mut self, n: NodeId, p: PartitionId) {
        let keep_serving = self.cfg.bug == Some(Bug::ServeAfterFailedBatch);
        let now = self.nodes[&n].view.map.epoch;
        let slot = self.slot_or_create(n, p);
        let Some(Task::Lead {
            reply,
            value,
            waiting: 0,
            disk: false,
            disk_ok,
            fail,
            req,
            settles,
        }) = &slot.task
        else {
            return;
        };
        let (reply, value, disk_ok, fail, reign, epoch) = (*reply, *value, *disk_ok, *fail, req.state_epoch, req.epoch);
        let settles = *settles;
        if disk_ok && fail.is_none() {
            let ops = req.ops.clone();
            slot.r.acknowledged(&ops);
        }
        let res = if !disk_ok {
            slot.r.serving = false;
            Err(Fail::Disk)
        } else if let Some(f) = fail {
            // A member may have missed the batch: the copy stops serving until a
            // takeover has every member install it (node.rs `primary_write`).
            if !keep_serving {
                slot.r.batch_missed_a_member(epoch, now);
            }
            Err(f)
        } else {
            Ok(Body::Exec(value))
        };
        if res.is_ok() && reply.is_some() {
            let lsn = self.nodes[&n].slots[&p].r.meta.lsn;
            self.note(format!(
                "node {} acknowledges partition {} {:#x}/{lsn}",
                n.0, p.0, reign.0
            ));
            self.check_ack(n, p, epoch, reign);
        }
        if settles && res.is_ok() {
            self.nodes.get_mut(&n).expect("exists").moves_done.push((p, epoch));
        }
        if let Some(to) = reply {
            self.respond(n, to, res);
        }
        self.release(n, p);
    }

    /// A primary is about to acknowledge a batch it replicated in map epoch `epoch`: it
    /// must hold every mutation acknowledged before, and be the only one acknowledging
    /// in that epoch and reign.
    fn check_ack(&mut self, n: NodeId, p: PartitionId, epoch: Epoch, reign: Epoch) {
        if let Some(other) = self.by_epoch.insert((p, epoch), n)
            && other != n
        {
            self.violation(format!(
                "partition {}: nodes {} and {} both acknowledged writes in map epoch {}",
                p.0, other.0, n.0, epoch.0
            ));
        }
        if let Some(other) = self.by_reign.insert((p, reign), n)
            && other != n
        {
            self.violation(format!(
                "partition {}: nodes {} and {} both acknowledged writes in reign {:#x}",
                p.0, other.0, n.0, reign.0
            ));
        }
        let part = &self.nodes[&n].slots[&p].r.part;
        let missing = self
            .acked
            .get(&p)
            .into_iter()
            .flatten()
            .find(|name| !part.dentries.contains_key(&(Ino::ROOT, (*name).clone())))
            .cloned();
        if let Some(name) = missing {
            self.violation(format!(
                "partition {}: primary {} acknowledges a write but lost acknowledged name {}",
                p.0,
                n.0,
                String::from_utf8_lossy(&name)
            ));
        }
    }

    fn on_disk(&mut self, n: NodeId, p: PartitionId, ok: bool) {
        let slot = self.slot_or_create(n, p);
        match &mut slot.task {
            Some(Task::Lead { disk, disk_ok, .. }) => {
                *disk = false;
                *disk_ok = ok;
                self.lead_progress(n, p);
            }
            Some(Task::Follow(to, epoch)) => {
                let (to, epoch) = (*to, *epoch);
                if !ok {
                    slot.r.serving = false;
                }
                if ok {
                    self.serve_in(n, p, epoch);
                }
                let res = if ok {
                    Ok(Body::Ack(ReplicaAck::Done))
                } else {
                    Err(Fail::Disk)
                };
                self.respond(n, to, res);
                self.release(n, p);
            }
            Some(Task::Install(to, epoch)) => {
                let (to, epoch) = (*to, *epoch);
                if ok {
                    self.serve_in(n, p, epoch);
                }
                let res = if ok { Ok(Body::Done) } else { Err(Fail::Disk) };
                self.respond(n, to, res);
                self.release(n, p);
            }
            Some(Task::TakeOver {
                stage: Stage::Persist,
                epoch,
                ..
            }) => {
                let epoch = *epoch;
                if ok {
                    self.takeover_level(n, p, epoch);
                } else {
                    self.release(n, p);
                }
            }
            _ => {}
        }
    }

    /// Every other member installs a takeover's copy before it serves (node.rs
    /// `take_over`): what it holds beyond them is not durable until then.
    fn takeover_level(&mut self, n: NodeId, p: PartitionId, epoch: Epoch) {
        let v = self.nodes[&n].view.clone();
        let others: Vec<NodeId> = v.members(p).into_iter().filter(|m| *m != n).collect();
        if v.map.epoch != epoch || others.is_empty() || self.cfg.bug == Some(Bug::ServeAfterFailedBatch) {
            return self.takeover_serve(n, p, epoch);
        }
        let msg = install_of(&self.nodes[&n].slots[&p].r, epoch);
        let slot = self.slot_or_create(n, p);
        if let Some(Task::TakeOver { stage, waiting, .. }) = &mut slot.task {
            *stage = Stage::Level;
            *waiting = others.len();
        }
        for m in others {
            self.call(n, m, msg.clone(), Pending::Install(p), REPLICATE_TIMEOUT * 5);
        }
    }

    /// A takeover's copy is on every member: it serves (if the map is still at `epoch`).
    fn takeover_serve(&mut self, n: NodeId, p: PartitionId, epoch: Epoch) {
        let reign = self.slot_or_create(n, p).r.meta.state_epoch;
        if self.serve_in(n, p, epoch) {
            self.report.takeovers += 1;
            self.note(format!(
                "node {} serves partition {} as primary, reign {:#x}",
                n.0, p.0, reign.0
            ));
        }
        self.release(n, p);
    }

    fn reply(&mut self, n: NodeId, call: u64, res: Result<Body, Fail>) {
        let Some(pending) = self.nodes.get_mut(&n).expect("exists").calls.remove(&call) else {
            return;
        };
        match pending {
            Pending::SyncMe(p) => self.slot_or_create(n, p).syncing = false,
            Pending::Work(k, attempt, wait) => self.ns_reply(n, k, attempt, wait, res),
            Pending::Settled(p) => self.ns_settled(n, p, res),
            Pending::Fence(m) => self.fence_answer(n, m, res),
            Pending::Replicate(p, to) => self.replicate_answered(n, p, to, res),
            Pending::Install(p) => self.install_answered(n, p, res),
            Pending::Pull(p, from) => self.pull_answered(n, p, from, res),
            Pending::PullCopy(p) => {
                let slot = self.slot_or_create(n, p);
                let Some(Task::TakeOver { .. }) = &slot.task else {
                    return;
                };
                match res {
                    Ok(Body::Copy(copy, part)) if part.id == p => {
                        if slot.r.install(&copy, *part).is_ok() {
                            self.takeover_persist(n, p);
                        } else {
                            self.release(n, p);
                        }
                    }
                    _ => self.release(n, p),
                }
            }
        }
    }

    /// A replica answered a batch the slot leads: counted, or sent the whole copy when
    /// it needs one.
    fn replicate_answered(&mut self, n: NodeId, p: PartitionId, to: NodeId, res: Result<Body, Fail>) {
        let epoch = self.nodes[&n].view.map.epoch;
        let slot = self.slot_or_create(n, p);
        let Some(Task::Lead { waiting, fail, .. }) = &mut slot.task else {
            return;
        };
        match res {
            Ok(Body::Ack(ReplicaAck::NeedInstall)) => {
                // The replica is sent the whole copy (still under the lock).
                let msg = install_of(&self.nodes[&n].slots[&p].r, epoch);
                self.call(n, to, msg, Pending::Install(p), REPLICATE_TIMEOUT * 5);
            }
            Ok(_) => {
                *waiting -= 1;
                self.lead_progress(n, p);
            }
            Err(e) => {
                *waiting -= 1;
                fail.get_or_insert(if e == Fail::Stale { Fail::Stale } else { Fail::Again });
                self.lead_progress(n, p);
            }
        }
    }

    /// A member took (or did not take) a whole copy this slot sent: for a batch it
    /// leads, for a member that asked, or to level a takeover.
    fn install_answered(&mut self, n: NodeId, p: PartitionId, res: Result<Body, Fail>) {
        let slot = self.slot_or_create(n, p);
        match &mut slot.task {
            Some(Task::Lead { waiting, fail, .. }) => {
                *waiting -= 1;
                if res.is_err() {
                    fail.get_or_insert(Fail::Again);
                }
                self.lead_progress(n, p);
            }
            Some(Task::Send(to)) => {
                let to = *to;
                let r = res.map(|_| Body::Done);
                self.respond(n, to, r);
                self.release(n, p);
            }
            Some(Task::TakeOver {
                stage: Stage::Level,
                waiting,
                epoch,
                ..
            }) => {
                let epoch = *epoch;
                if res.is_err() {
                    // A member did not take it: not serving; the catch-up tries
                    // again (with the map that drops the member, if it is gone).
                    return self.release(n, p);
                }
                *waiting -= 1;
                if *waiting == 0 {
                    self.takeover_serve(n, p, epoch);
                }
            }
            _ => {}
        }
    }

    /// A member told a takeover its position: tallied; once all have, the takeover
    /// goes on.
    fn pull_answered(&mut self, n: NodeId, p: PartitionId, from: NodeId, res: Result<Body, Fail>) {
        if let (Ok(Body::Position(pos)), Some(Task::TakeOver { .. })) = (&res, &self.slot_or_create(n, p).task) {
            self.nodes.get_mut(&n).expect("exists").fence.absorb(p, &pos.fence);
        }
        let slot = self.slot_or_create(n, p);
        let Some(Task::TakeOver { tally, waiting, .. }) = &mut slot.task else {
            return;
        };
        if let Ok(Body::Position(pos)) = res {
            let _ = tally.answer(from, &pos);
        }
        *waiting -= 1;
        if *waiting == 0 {
            self.takeover_asked(n, p);
        }
    }
}

impl World {
    // ------------------------------------------------------------ manager

    fn publish(&mut self, cmd: MapCommand) {
        let before = self.map.epoch;
        if self.map.apply(&cmd).is_err() || self.map.epoch == before {
            return;
        }
        if self.cfg.bug == Some(Bug::MoveWithoutHolders) {
            self.map.moves.clear();
        }
        let v = Arc::new(MapView::new(self.map.clone()));
        self.views.add(v.clone());
        self.view = v;
        self.note(format!("map epoch {}: {cmd:?}", self.map.epoch.0));
    }

    /// The failure detector: silent nodes go Down, then Out; returning nodes come back Up.
    fn manager(&mut self) {
        self.at(HEARTBEAT, Ev::Manager);
        let states: Vec<(NodeId, NodeState)> = self.map.nodes.values().map(|n| (n.id, n.state)).collect();
        for (id, state) in states {
            let silent = self.now.saturating_sub(self.heard.get(&id).copied().unwrap_or(0));
            match state {
                NodeState::Up if silent > DOWN_AFTER => self.publish(MapCommand::SetState {
                    id,
                    state: NodeState::Down,
                }),
                NodeState::Down if silent > OUT_AFTER => self.publish(MapCommand::SetState {
                    id,
                    state: NodeState::Out,
                }),
                NodeState::Down | NodeState::Out if silent <= 2 * HEARTBEAT => {
                    self.publish(MapCommand::Register(info(id)))
                }
                _ => {}
            }
        }
        if let Some(at) = self.mass_at
            && self.report.repair_ms.is_none()
            && self.converged()
        {
            self.report.repair_ms = Some(self.now - at);
        }
    }

    // ------------------------------------------------------------ faults

    fn down_count(&self) -> usize {
        self.nodes
            .values()
            .filter(|n| (!n.alive || n.cut) && !self.victims.contains(&n.id))
            .count()
    }

    fn random_node(&mut self, pick: impl Fn(&Node) -> bool) -> Option<NodeId> {
        let ids: Vec<NodeId> = self.nodes.values().filter(|n| pick(n)).map(|n| n.id).collect();
        if ids.is_empty() {
            return None;
        }
        let i = self.rng.below(ids.len() as u64) as usize;
        Some(ids[i])
    }

    fn fault(&mut self) {
        if !self.faults_on {
            return;
        }
        let next = 300 + self.rng.below(2000);
        self.at(next, Ev::Fault);
        let room = self.down_count() < self.cfg.max_down;
        let roll = self.rng.below(100);
        let victims = self.victims.clone();
        if roll < 40 && room {
            if let Some(n) = self.random_node(|x| x.alive && !x.cut && !victims.contains(&x.id)) {
                self.crash(n);
                let back = 200 + self.rng.below(6000);
                self.at(back, Ev::Restart(n));
            }
        } else if roll < 70 && room {
            if let Some(n) = self.random_node(|x| x.alive && !x.cut) {
                self.report.faults += 1;
                let node = self.nodes.get_mut(&n).expect("exists");
                node.cut = true;
                node.cut_since = self.now;
                self.note(format!("node {} cut off", n.0));
                let back = 100 + self.rng.below(4000);
                self.at(back, Ev::Heal(n));
            }
        }
    }

    /// A new node registers: placement moves some partitions' copies to it.
    fn join(&mut self) {
        self.report.faults += 1;
        let id = NodeId(u64::from(self.next_node));
        self.next_node += 1;
        let before = self.view.clone();
        self.publish(MapCommand::Register(info(id)));
        let moved = (0..self.cfg.partitions)
            .filter(|p| before.placement.partition(PartitionId(*p)) != self.view.placement.partition(PartitionId(*p)))
            .count();
        self.report.moved_by_joins += moved as u64;
        self.report.joined += 1;
        self.note(format!("node {} joins ({moved} partitions move)", id.0));
        self.add_node(id);
    }

    fn crash(&mut self, n: NodeId) {
        self.report.faults += 1;
        let node = self.nodes.get_mut(&n).expect("exists");
        node.alive = false;
        node.inc += 1;
        node.slots.clear();
        node.calls.clear();
        node.moves_done.clear();
        node.ns = ns::NsNode::default();
        let torn = node.disk_q.len();
        node.disk_q.clear();
        self.note(format!("node {} crashes ({torn} writes lost)", n.0));
    }

    fn restart(&mut self, n: NodeId) {
        let view = self.view.clone();
        let node = self.nodes.get_mut(&n).expect("exists");
        if node.alive {
            return;
        }
        node.alive = true;
        node.cut = false;
        node.inc += 1;
        node.fence = ReadFence::default();
        node.fence.after_gap(&view);
        node.fence_asking.clear();
        node.view = view;
        node.in_touch = true;
        node.ticks = 0;
        node.caught_up_at = Epoch(0);
        for (p, (meta, recs)) in &node.disk {
            let mut r = Replica {
                part: Partition::new(*p),
                meta: *meta,
                serving: false,
                counter_shared: 0,
                complete_at: None,
            };
            for (k, v) in recs {
                r.restore(k.clone(), v)
                    .expect("the simulator writes only valid records");
            }
            r.resume_counters();
            node.slots.insert(
                *p,
                Slot {
                    r,
                    task: None,
                    queue: VecDeque::new(),
                    syncing: false,
                },
            );
        }
        let inc = node.inc;
        self.note(format!("node {} restarts", n.0));
        self.at(1, Ev::Tick { node: n, inc });
    }

    fn heal_cut(&mut self, n: NodeId) {
        let node = self.nodes.get_mut(&n).expect("exists");
        if node.cut {
            node.cut = false;
            self.note(format!("node {} reconnected", n.0));
        }
    }

    fn mass_failure(&mut self) {
        self.mass_at = Some(self.now);
        let count = (self.nodes.len() as u64 * u64::from(self.cfg.mass_failure_pct)).div_ceil(100);
        // Never every copy of a partition: three replicas survive two failures, not three.
        let r = usize::from(self.view.map.replication);
        let mut tries = 0;
        while (self.victims.len() as u64) < count && tries < 100 * count {
            tries += 1;
            let victims = self.victims.clone();
            let Some(n) = self.random_node(|x| x.alive && !victims.contains(&x.id)) else {
                break;
            };
            let wipes = self.views.of(self.view.map.epoch, n).into_iter().any(|p| {
                let placed = self.view.placement.partition(p);
                placed.len() == r && placed.iter().all(|m| *m == n || victims.contains(m))
            });
            if !wipes {
                self.victims.insert(n);
                self.crash(n);
            }
        }
        let count = self.victims.len();
        self.note(format!("{count} nodes die at once"));
    }

    // ------------------------------------------------------------ clients

    fn client_go(&mut self, c: usize) {
        if self.clients[c].op.is_none() {
            if self.issued >= self.cfg.ops {
                return;
            }
            self.issued += 1;
            let p = PartitionId(self.rng.below(u64::from(self.cfg.partitions)) as u32);
            let op = if self.clients[c].reader {
                Op::Read(self.acked.get(&p).cloned().unwrap_or_default())
            } else if self.rng.chance(200) {
                Op::Alloc
            } else {
                self.next_name += 1;
                Op::Put(format!("n{}", self.next_name).into_bytes())
            };
            self.clients[c].op = Some((p, op, self.now));
        }
        let (p, op, _) = self.clients[c].op.clone().expect("set above");
        let view = self.clients[c].view.clone();
        let (to, msg) = match op {
            Op::Read(names) => {
                // From any member of the client's map, which may be behind.
                let members = view.members(p);
                let to = (!members.is_empty()).then(|| members[self.rng.below(members.len() as u64) as usize]);
                (to, Msg::Read { p, names })
            }
            op => {
                let msg = Msg::Exec {
                    epoch: view.map.epoch,
                    p,
                    op,
                    deadline: self.now + CLIENT_TIMEOUT,
                };
                (view.primary(p), msg)
            }
        };
        let Some(to) = to else {
            self.clients[c].view = self.view.clone();
            self.at(100, Ev::Client(c));
            return;
        };
        self.clients[c].call += 1;
        self.clients[c].asked = Some(to);
        let call = self.clients[c].call;
        self.send(Addr::Client(c), Addr::Node(to), Packet::Req { call, msg });
        self.at(
            CLIENT_TIMEOUT,
            Ev::Timeout {
                at: Addr::Client(c),
                inc: 0,
                call,
            },
        );
    }

    fn client_reply(&mut self, c: usize, call: u64, res: Result<Body, Fail>) {
        let client = &mut self.clients[c];
        if client.call != call || client.op.is_none() {
            return;
        }
        client.call += 1; // later answers to this call are ignored
        let (p, op, started) = client.op.clone().expect("checked");
        if let Ok(Body::Missing(missing)) = &res {
            client.op = None;
            let asked = client.asked.map_or(0, |n| n.0);
            self.report.reads += 1;
            if let Some(name) = missing.first() {
                self.violation(format!(
                    "partition {}: a read from node {asked} misses acknowledged name {}",
                    p.0,
                    String::from_utf8_lossy(name)
                ));
            }
            self.finished += 1;
            let d = self.rng.below(5);
            self.at(d, Ev::Client(c));
            return;
        }
        match res {
            Ok(Body::Exec(value)) => {
                client.op = None;
                self.finished += 1;
                self.report.acked += 1;
                self.report.longest_op_ms = self.report.longest_op_ms.max(self.now - started);
                match (op, value) {
                    (Op::Put(name), _) => self.acked.entry(p).or_default().push(name),
                    (Op::Read(_), _) => {}
                    (Op::Alloc, Some(v)) => {
                        if !self.counters.entry(p).or_default().insert(v) {
                            self.violation(format!("partition {}: counter {v} handed out twice", p.0));
                        }
                    }
                    (Op::Alloc, None) => self.violation("an allocation answered without a number".into()),
                    (Op::Batch(..), _) => {}
                }
                let d = self.rng.below(5);
                self.at(d, Ev::Client(c));
            }
            _ => {
                client.view = self.view.clone();
                if self.now - started > GIVE_UP {
                    client.op = None;
                    self.finished += 1;
                    self.report.gave_up += 1;
                    self.at(0, Ev::Client(c));
                } else {
                    let d = 20 + self.rng.below(50);
                    self.at(d, Ev::Client(c));
                }
            }
        }
    }
}

/// The keys where two maps differ, each with both values (`None` where one lacks it),
/// for a failure message.
fn differing<K: Ord, V: PartialEq + std::fmt::Debug>(
    a: &BTreeMap<K, V>,
    b: &BTreeMap<K, V>,
    key: impl Fn(&K) -> String,
) -> Vec<String> {
    let keys: BTreeSet<&K> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("{}: {:?} / {:?}", key(k), a.get(k), b.get(k)))
        .collect()
}

fn put(name: Vec<u8>) -> PartOp {
    PartOp::Apply {
        intent: 0,
        step: 0,
        m: Mutation::PutDentry {
            parent: Ino::ROOT,
            name,
            val: DentryVal {
                ino: Ino(2),
                kind: FileKind::File,
            },
        },
    }
}

/// The whole copy, as the primary sends it (`send_copy` of node.rs).
fn install_of(r: &Replica, epoch: Epoch) -> Msg {
    Msg::Install {
        epoch,
        p: r.part.id,
        copy: r.copy_id(0),
        part: Box::new(r.part.clone()),
    }
}
