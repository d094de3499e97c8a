//! Namespace operations in the simulated world.
//!
//! Clients create, link, rename and remove names in two directories of their own, and
//! remove (and make again) those directories once empty, one
//! operation at a time, each with an operation id kept over its retries, and check
//! every answer against a model of their directories: a retry after a lost reply or a
//! dead coordinator must return the first result (not `EEXIST` or `ENOENT`). The nodes
//! coordinate them with the service's own engine ([`Coordination`]), as `node.rs`
//! drives it: one attempt per operation id at a time; locks at the keys' primaries
//! (waiting up to 200 ms, with leases, refused to coordinators that are not Up, freed
//! once the partition of a dead coordinator's operation has settled); reads from the
//! primaries; one batch or an intent per plan, an intent driven only within the reign
//! it began in; the answer before the directories' counts (`answer_before`), the locks
//! kept until the counts are applied or, if that failed, redone (at most a lease); the
//! fence in front of stale coordinators; and the sweep that redoes intents a
//! coordinator left.
//!
//! Once the world healed, each model must equal its directories (names, inodes, link
//! counts), no intent is left, and no inode number was handed out twice.

use super::{Addr, Body, Ev, Fail, Ms, Msg, Op, Pending, ReplyTo, World};
use crate::ids::{Epoch, Ino, NodeId, PartitionId};
use crate::namespace::{Creds, DentryVal, Errno, FileKind, InodeRec, Intent, Need, Plan, StripeRec};
use crate::service::coordinator::{
    Coordination, Next, PlanRun, adjusts_any, answer_before, batch_ops, fence, finish_ops, intent_ops, plan_run,
};
use crate::service::locks::{Hold, Holds, key_inode, owner_id, owner_node};
use crate::service::wire::{NsOp, OpReply, PartOp};
use crate::sim::Bug;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Lease of a lock.
const LOCK_LEASE: Ms = 10_000;
/// Locks of a coordinator whose node went Down are freed once the partition of its
/// operation has settled (its primary redid what the coordinator left), or this long
/// after (the service's `dead_coordinator_locks`).
const DEAD_LOCKS: Ms = 10_000;
/// How long a coordinator works on one operation before it gives up (the client
/// retries); also how long one batch of an intent is retried.
const WORK_TIMEOUT: Ms = 3_000;
/// How long a client waits for an answer before it asks again.
const NS_CLIENT_TIMEOUT: Ms = 4_000;
/// Names a client uses in each directory (few, so names collide).
const NAMES: u64 = 5;

/// A record read for a coordinator.
#[derive(Clone, Debug)]
pub(super) enum Rec {
    Inode(Option<InodeRec>),
    Dentry(Option<DentryVal>),
    Stripe(Option<StripeRec>),
}

/// How long a lock request waits for busy keys before it is refused.
const LOCK_WAIT: Ms = 200;

/// A lock request waiting for busy keys.
pub(super) struct LockWait {
    to: ReplyTo,
    keys: Vec<u64>,
    owner: u64,
    anchor: PartitionId,
    read: Option<(Epoch, Vec<Ino>)>,
    until: Ms,
}

/// A lock held at a node (the service's pure lock table, in simulated milliseconds).
type Held = Hold<Ms>;

/// How long a refused exclusive request keeps new shared holders out (`locks::WANT`).
const WANT: Ms = 50;

/// What a node is doing for namespace operations.
#[derive(Default)]
pub(super) struct NsNode {
    work: BTreeMap<u64, Work>,
    next_work: u64,
    locks: Holds<Ms>,
    /// Intents driven here (the sweep leaves them alone).
    inflight: BTreeSet<u64>,
    /// Those of them the sweep redoes: a partition is not settled while one is
    /// pending (`settled_here` of node.rs counts only intents a live coordination
    /// drives; the service's sweep does not mark its redos in flight).
    redoing: BTreeSet<u64>,
    /// Intents whose every step is applied, until their drive ends (`counted` of
    /// node.rs): a quiet question counts them as applied.
    counted: BTreeSet<u64>,
    /// When each node was last seen going Down.
    down_at: BTreeMap<NodeId, Ms>,
    /// Client operations being coordinated here, by id (`running` of node.rs).
    running: BTreeMap<u64, u64>,
    /// Drives whose finish waits for the next tick (`finishing` of node.rs: it rides on
    /// a later batch of its partition, or the flush's).
    finishing: Vec<u64>,
}

pub(super) enum Work {
    Coord(Box<CoordWork>),
    Drive(Box<DriveWork>),
    Tails(Box<TailsWork>),
}

/// An answered coordination whose intents' directory counts are still to apply
/// (`finish_op` of node.rs): its locks stay until they are, or, for those that failed,
/// until the sweep redid their intents (`await_redone`), at most a lock lease.
pub(super) struct TailsWork {
    held: Vec<(NodeId, Vec<u64>)>,
    owner: u64,
    /// Drives still applying their counts.
    left: usize,
    /// Intents `(partition, id)` whose counts failed: waiting for their redo.
    awaiting: Vec<(PartitionId, u64)>,
    /// When the wait for redos gives up.
    until: Ms,
}

pub(super) struct CoordWork {
    c: Coordination,
    client: ReplyTo,
    /// Later attempts of the same operation that arrived while this one ran.
    also: Vec<ReplyTo>,
    op: NsOp,
    id: u64,
    owner: u64,
    held: Vec<(NodeId, Vec<u64>)>,
    deadline: Ms,
    waiting: usize,
    refused: bool,
    asked: Vec<u64>,
    /// Inodes the lock hosts read once the asked keys were held.
    read: Vec<(Ino, Option<InodeRec>)>,
    plans: VecDeque<Plan>,
    reply: Option<OpReply>,
    /// Drives (work ids) of applied intents whose directory counts follow the answer.
    tails: Vec<u64>,
    /// Answers to the quiet question of the last keys taken: the partitions covered,
    /// and whether all were quiet.
    quiet: (BTreeSet<PartitionId>, bool),
    /// The plan waiting for its id: one partition's batch, or an intent.
    pending: Option<Plan>,
    pause: Ms,
    /// Counts restarts: answers to an earlier attempt are ignored.
    attempt: u32,
}

pub(super) struct DriveWork {
    coord: PartitionId,
    /// The reign of this node's copy of `coord` when the drive began: if that changes
    /// (the node lost the partition and got it back), another primary may have redone
    /// and finished the intent, and the drive stops (`execute_led` of node.rs).
    reign: crate::ids::Epoch,
    intent: Intent,
    stage: Stage,
    waiting: usize,
    deadline: Ms,
    /// The coordination that waits for the steps to be applied (then, once it
    /// answered, its [`TailsWork`], which waits for the counts).
    parent: Option<u64>,
    /// The batches that may follow the answer (`answer_before`): directories' counts.
    later: BTreeMap<PartitionId, Vec<PartOp>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The intent's record and its coordinating partition's steps.
    First,
    /// The other partitions' steps its client waits for.
    Others,
    /// Applied up to the answer: waits for its coordination to answer.
    Answered,
    /// The directories' counts, after the answer.
    Later,
    Finish,
}

/// What a work item waits for.
#[derive(Clone, Debug)]
pub(super) enum Wait {
    Lock(NodeId, Vec<u64>),
    Fetch(Vec<Need>),
    Counter(PartitionId),
    Id(PartitionId),
    Exec(PartitionId, Vec<PartOp>),
    /// Answers to a quiet question.
    Quiet,
    /// A timer: start the coordination again.
    Restart,
}

/// A client's model of its two directories.
#[derive(Clone, Debug, Default)]
struct Model {
    /// Name → (inode, kind), per directory.
    dirs: [BTreeMap<Vec<u8>, (Ino, FileKind)>; 2],
    /// Link counts of files.
    nlink: BTreeMap<Ino, u32>,
}

pub(super) struct NsClient {
    view: std::sync::Arc<crate::map::MapView>,
    /// The two directories, once made.
    dirs: [Option<Ino>; 2],
    model: Model,
    /// The operation in flight: (op, id, what the model expects, started).
    op: Option<(NsOp, u64, Expect, Ms)>,
    call: u64,
    /// Gave an operation up: its outcome is unknown, so it stops.
    lost: bool,
}

#[derive(Clone, Debug, PartialEq)]
enum Expect {
    MkDir(usize),
    Create(usize, Vec<u8>, FileKind),
    Err(Errno),
    Unlink(usize, Vec<u8>),
    Rmdir(usize, Vec<u8>),
    /// One of the client's two directories (then made again).
    RmdirOwn(usize),
    Rename(usize, Vec<u8>, usize, Vec<u8>),
    Link(Ino, usize, Vec<u8>),
}

fn root() -> Creds {
    Creds {
        uid: 0,
        gid: 0,
        groups: Vec::new(),
    }
}

/// The removal of `nm` from directory `d`: an rmdir of a directory, else an unlink.
fn ns_removal(dir: Ino, d: usize, nm: Vec<u8>, there: Option<(Ino, FileKind)>) -> (NsOp, Expect) {
    match there {
        Some((_, FileKind::Dir)) => (
            NsOp::Rmdir {
                parent: dir,
                name: nm.clone(),
            },
            Expect::Rmdir(d, nm),
        ),
        _ => (
            NsOp::Unlink {
                parent: dir,
                name: nm.clone(),
                keep_secs: 0,
            },
            if there.is_some() {
                Expect::Unlink(d, nm)
            } else {
                Expect::Err(Errno::ENOENT)
            },
        ),
    }
}

fn name(i: u64) -> Vec<u8> {
    format!("e{i}").into_bytes()
}

impl NsClient {
    pub(super) fn new(view: std::sync::Arc<crate::map::MapView>) -> Self {
        NsClient {
            view,
            dirs: [None, None],
            model: Model::default(),
            op: None,
            call: 0,
            lost: false,
        }
    }
}

impl World {
    // ------------------------------------------------------------ clients

    /// Chooses the next operation of namespace client `c` and what its model expects.
    fn ns_choose(&mut self, c: usize) -> (NsOp, Expect) {
        let me = &self.ns_clients[c];
        if let Some(i) = me.dirs.iter().position(Option::is_none) {
            let op = NsOp::Mknod {
                parent: Ino::ROOT,
                name: format!("c{c}-{i}").into_bytes(),
                kind: FileKind::Dir,
                perm: 0o755,
                rdev: 0,
                target: None,
                token: 0,
                reserve: None,
            };
            return (op, Expect::MkDir(i));
        }
        let dirs = [me.dirs[0].expect("made"), me.dirs[1].expect("made")];
        let m = me.model.clone();
        let d = self.rng.below(2) as usize;
        let nm = name(self.rng.below(NAMES));
        let there = m.dirs[d].get(&nm).copied();
        match self.rng.below(10) {
            0..=2 => self.ns_choose_create(dirs[d], d, nm, there),
            // Its own directory, once (nearly) empty: the unlinks before it answered
            // before their counts applied, and the rmdir must wait for them.
            3 | 4 if m.dirs[d].len() <= 1 && there.is_none() && self.rng.chance(500) => {
                let op = NsOp::Rmdir {
                    parent: Ino::ROOT,
                    name: format!("c{c}-{d}").into_bytes(),
                };
                let e = if m.dirs[d].is_empty() {
                    Expect::RmdirOwn(d)
                } else {
                    Expect::Err(Errno::ENOTEMPTY)
                };
                (op, e)
            }
            3 | 4 => ns_removal(dirs[d], d, nm, there),
            5 | 6 => self.ns_choose_rename(c, dirs, &m, d, nm, there),
            _ => match there {
                Some((ino, FileKind::File)) => {
                    let nd = self.rng.below(2) as usize;
                    let nn = name(self.rng.below(NAMES));
                    let op = NsOp::Link {
                        ino,
                        newparent: dirs[nd],
                        newname: nn.clone(),
                    };
                    let e = if m.dirs[nd].contains_key(&nn) {
                        Expect::Err(Errno::EEXIST)
                    } else {
                        Expect::Link(ino, nd, nn)
                    };
                    (op, e)
                }
                _ => self.ns_lookup_free(c, dirs),
            },
        }
    }

    /// A create of `nm` in directory `d` (a file, rarely a directory).
    fn ns_choose_create(&mut self, dir: Ino, d: usize, nm: Vec<u8>, there: Option<(Ino, FileKind)>) -> (NsOp, Expect) {
        let kind = if self.rng.chance(300) {
            FileKind::Dir
        } else {
            FileKind::File
        };
        let op = NsOp::Mknod {
            parent: dir,
            name: nm.clone(),
            kind,
            perm: 0o644,
            rdev: 0,
            target: None,
            token: 0,
            reserve: None,
        };
        let e = if there.is_some() {
            Expect::Err(Errno::EEXIST)
        } else {
            Expect::Create(d, nm, kind)
        };
        (op, e)
    }

    /// A rename of `nm` in directory `d` across the two directories or within one; the
    /// target is missing or of the same kind (directories here are always empty).
    fn ns_choose_rename(
        &mut self,
        c: usize,
        dirs: [Ino; 2],
        m: &Model,
        d: usize,
        nm: Vec<u8>,
        there: Option<(Ino, FileKind)>,
    ) -> (NsOp, Expect) {
        let nd = self.rng.below(2) as usize;
        let nn = name(self.rng.below(NAMES));
        let target = m.dirs[nd].get(&nn).copied();
        let op = NsOp::Rename {
            parent: dirs[d],
            name: nm.clone(),
            newparent: dirs[nd],
            newname: nn.clone(),
            noreplace: false,
            exchange: false,
        };
        let e = match (there, target) {
            (None, _) => Expect::Err(Errno::ENOENT),
            _ if (d, &nm) == (nd, &nn) => return self.ns_lookup_free(c, dirs),
            (Some((_, FileKind::File)), Some((_, FileKind::Dir))) => Expect::Err(Errno::EISDIR),
            (Some((_, FileKind::Dir)), Some((_, FileKind::File))) => Expect::Err(Errno::ENOTDIR),
            (Some((a, _)), Some((b, _))) if a == b => return self.ns_lookup_free(c, dirs),
            _ => Expect::Rename(d, nm, nd, nn),
        };
        (op, e)
    }

    /// A create of a name free in the first directory, or an unlink of a missing name.
    fn ns_lookup_free(&mut self, c: usize, dirs: [Ino; 2]) -> (NsOp, Expect) {
        let m = &self.ns_clients[c].model;
        match (0..NAMES).map(name).find(|n| !m.dirs[0].contains_key(n)) {
            Some(nm) => (
                NsOp::Mknod {
                    parent: dirs[0],
                    name: nm.clone(),
                    kind: FileKind::File,
                    perm: 0o644,
                    rdev: 0,
                    target: None,
                    token: 0,
                    reserve: None,
                },
                Expect::Create(0, nm, FileKind::File),
            ),
            None => (
                NsOp::Unlink {
                    parent: dirs[1],
                    name: b"missing".to_vec(),
                    keep_secs: 0,
                },
                Expect::Err(Errno::ENOENT),
            ),
        }
    }

    pub(super) fn ns_client_go(&mut self, c: usize) {
        let me = &self.ns_clients[c];
        if me.lost {
            return;
        }
        if me.op.is_none() {
            if self.issued >= self.cfg.ops || !self.running() {
                return;
            }
            self.issued += 1;
            let (mut op, e) = self.ns_choose(c);
            let id = self.rng.next_u64() | 1;
            if let NsOp::Mknod { token, .. } = &mut op {
                *token = id;
            }
            self.ns_clients[c].op = Some((op, id, e, self.now));
        }
        let me = &self.ns_clients[c];
        let (op, id, _, _) = me.op.clone().expect("set above");
        let view = me.view.clone();
        let anchor = op.anchor(view.map.partitions);
        let Some(primary) = view.primary(anchor) else {
            self.ns_clients[c].view = self.view.clone();
            self.at(100, Ev::NsClient(c));
            return;
        };
        self.ns_clients[c].call += 1;
        let call = self.ns_clients[c].call;
        let msg = Msg::Ns {
            epoch: view.map.epoch,
            op,
            id,
        };
        self.send(Addr::NsClient(c), Addr::Node(primary), super::Packet::Req { call, msg });
        self.at(
            NS_CLIENT_TIMEOUT,
            Ev::Timeout {
                at: Addr::NsClient(c),
                inc: 0,
                call,
            },
        );
    }

    /// Clients start operations while the run lasts (not while the world heals).
    fn running(&self) -> bool {
        self.finished < self.cfg.ops
    }

    pub(super) fn ns_client_reply(&mut self, c: usize, call: u64, res: Result<Body, Fail>) {
        let me = &mut self.ns_clients[c];
        if me.call != call || me.op.is_none() {
            return;
        }
        me.call += 1;
        let (op, _, expect, started) = me.op.clone().expect("checked");
        let got = match res {
            Ok(Body::Ns(r)) => r,
            _ => {
                me.view = self.view.clone();
                if self.now - started > super::GIVE_UP {
                    me.op = None;
                    me.lost = true;
                    self.finished += 1;
                    self.report.gave_up += 1;
                } else {
                    let d = 20 + self.rng.below(50);
                    self.at(d, Ev::NsClient(c));
                }
                return;
            }
        };
        me.op = None;
        self.finished += 1;
        self.report.acked += 1;
        self.report.ns_ops += 1;
        self.report.longest_op_ms = self.report.longest_op_ms.max(self.now - started);
        self.note(format!("namespace client {c}: {} answered {got:?}", brief(&op)));
        if let Err(what) = self.ns_check(c, &op, expect, got) {
            self.violation(format!("namespace client {c}: {what}"));
        }
        let d = self.rng.below(5);
        self.at(d, Ev::NsClient(c));
    }

    /// Checks an answer against the model and applies it there.
    fn ns_check(&mut self, c: usize, op: &NsOp, expect: Expect, got: Result<OpReply, Errno>) -> Result<(), String> {
        let bad = |got: &Result<OpReply, Errno>| format!("{op:?} answered {got:?}, expected {expect:?}");
        match (&expect, &got) {
            (Expect::Err(e), Err(g)) if e == g => Ok(()),
            (Expect::MkDir(i), Ok(OpReply::Attr(a))) => {
                self.ns_fresh_ino(a.ino)?;
                let me = &mut self.ns_clients[c];
                me.dirs[*i] = Some(a.ino);
                Ok(())
            }
            (Expect::Create(d, nm, kind), Ok(OpReply::Attr(a) | OpReply::Made(a, _))) if a.kind == *kind => {
                self.ns_fresh_ino(a.ino)?;
                let m = &mut self.ns_clients[c].model;
                m.dirs[*d].insert(nm.clone(), (a.ino, *kind));
                if *kind == FileKind::File {
                    m.nlink.insert(a.ino, 1);
                }
                Ok(())
            }
            (Expect::Unlink(d, nm) | Expect::Rmdir(d, nm), Ok(OpReply::DoneAt(_))) => {
                let m = &mut self.ns_clients[c].model;
                if let Some((ino, _)) = m.dirs[*d].remove(nm) {
                    m.drop_link(ino);
                }
                Ok(())
            }
            (Expect::RmdirOwn(d), Ok(OpReply::DoneAt(_))) => {
                self.ns_clients[c].dirs[*d] = None;
                Ok(())
            }
            (Expect::Rename(d, nm, nd, nn), Ok(OpReply::Done)) => {
                let m = &mut self.ns_clients[c].model;
                let moved = m.dirs[*d].remove(nm).expect("the model chose an existing name");
                if let Some((old, _)) = m.dirs[*nd].insert(nn.clone(), moved) {
                    m.drop_link(old);
                }
                Ok(())
            }
            (Expect::Link(ino, nd, nn), Ok(OpReply::Attr(a))) if a.ino == *ino => {
                let m = &mut self.ns_clients[c].model;
                m.dirs[*nd].insert(nn.clone(), (*ino, FileKind::File));
                *m.nlink.entry(*ino).or_insert(1) += 1;
                if a.nlink != m.nlink[ino] {
                    return Err(format!(
                        "{op:?}: link count {} after the link, expected {}",
                        a.nlink, m.nlink[ino]
                    ));
                }
                Ok(())
            }
            _ => Err(bad(&got)),
        }
    }

    /// An inode number a create handed out must be new.
    fn ns_fresh_ino(&mut self, ino: Ino) -> Result<(), String> {
        if self.ns_inos.insert(ino) {
            Ok(())
        } else {
            Err(format!("inode number {:#x} handed out twice", ino.0))
        }
    }

    /// Once healed: every model equals its directories, no intent is left, and link
    /// counts agree with the entries.
    pub(super) fn ns_final_checks(&self) -> Result<(), String> {
        let v = &self.view;
        let copy = |p: PartitionId| &self.nodes[&v.members(p)[0]].slots[&p].r.part;
        for p in 0..v.map.partitions {
            let part = copy(PartitionId(p));
            if let Some(id) = part.intents.keys().next() {
                return Err(format!("partition {p}: intent {id:#x} still pending after healing"));
            }
        }
        let inode = |ino: Ino| copy(ino.partition()).inodes.get(&ino);
        for (c, client) in self.ns_clients.iter().enumerate() {
            if client.lost {
                continue;
            }
            let mut refs: BTreeMap<Ino, u32> = BTreeMap::new();
            for (i, dir) in client.dirs.iter().enumerate() {
                let Some(dir) = *dir else { continue };
                let mut found: BTreeMap<Vec<u8>, (Ino, FileKind)> = BTreeMap::new();
                for p in 0..v.map.partitions {
                    for ((parent, nm), d) in copy(PartitionId(p)).dentries.range((dir, Vec::new())..) {
                        if *parent != dir {
                            break;
                        }
                        found.insert(nm.clone(), (d.ino, d.kind));
                    }
                }
                if found != client.model.dirs[i] {
                    return Err(format!(
                        "namespace client {c}: directory {i} holds {:?}, its model {:?}",
                        names(&found),
                        names(&client.model.dirs[i])
                    ));
                }
                let subdirs = found.values().filter(|(_, k)| *k == FileKind::Dir).count() as u32;
                let rec = inode(dir).ok_or_else(|| format!("namespace client {c}: directory {i} has no inode"))?;
                if rec.attr.nlink != 2 + subdirs {
                    return Err(format!(
                        "namespace client {c}: directory {i} has link count {} with {subdirs} subdirectories",
                        rec.attr.nlink
                    ));
                }
                // Its size counts its entries: an rmdir goes by it.
                if rec.attr.size != found.len() as u64 {
                    return Err(format!(
                        "namespace client {c}: directory {i} has size {} with {} entries",
                        rec.attr.size,
                        found.len()
                    ));
                }
                for (ino, _) in found.values() {
                    *refs.entry(*ino).or_default() += 1;
                }
            }
            for (ino, count) in refs {
                let rec =
                    inode(ino).ok_or_else(|| format!("namespace client {c}: entry to missing inode {:#x}", ino.0))?;
                let dir = rec.attr.kind == FileKind::Dir;
                let want = if dir { 2 } else { count };
                if rec.attr.nlink != want || (!dir && client.model.nlink.get(&ino) != Some(&want)) {
                    return Err(format!(
                        "namespace client {c}: inode {:#x} has link count {}, {count} entries, model {:?}",
                        ino.0,
                        rec.attr.nlink,
                        client.model.nlink.get(&ino)
                    ));
                }
            }
        }
        Ok(())
    }

    /// What namespace work is still going on (`None`: none): an intent pending, a
    /// coordinator or intent at work, a batch being replicated.
    pub(super) fn ns_quiet(&self) -> Option<String> {
        for node in self.nodes.values().filter(|n| n.alive) {
            if let Some(k) = node.ns.work.keys().next() {
                return Some(format!("node {}: namespace work {k} under way", node.id.0));
            }
            if let Some((p, _)) = node.slots.iter().find(|(_, s)| s.task.is_some()) {
                return Some(format!("node {}: partition {} busy", node.id.0, p.0));
            }
        }
        for p in 0..self.view.map.partitions {
            let p = PartitionId(p);
            if let Some(m) = self.view.members(p).first()
                && let Some(s) = self.nodes[m].slots.get(&p)
                && let Some(id) = s.r.part.intents.keys().next()
            {
                return Some(format!("partition {}: intent {id:#x} pending", p.0));
            }
        }
        None
    }

    // ------------------------------------------------------------ coordinator

    /// A request of the namespace protocol at node `n`.
    pub(super) fn ns_request(&mut self, n: NodeId, to: ReplyTo, msg: Msg) -> Result<(), Fail> {
        match msg {
            Msg::Ns { epoch, op, id } => self.on_ns_op(n, to, epoch, op, id),
            Msg::Lock {
                keys,
                owner,
                anchor,
                read,
            } => {
                let wait = LockWait {
                    to,
                    keys,
                    owner,
                    anchor,
                    read,
                    until: self.now + LOCK_WAIT,
                };
                self.try_lock(n, wait);
                Ok(())
            }
            Msg::Unlock { keys, owner } => {
                let ns = self.ns_node(n);
                ns.locks.release(&keys, owner);
                Ok(())
            }
            Msg::Fetch { epoch, needs } => {
                let out = self.fetch_here(n, epoch, &needs)?;
                self.respond(n, to, Ok(Body::Fetched(out)));
                Ok(())
            }
            Msg::Settled { epoch, p } => self.on_settled(n, to, epoch, p),
            Msg::Quiet { epoch, dirs } => self.on_quiet(n, to, epoch, dirs),
            _ => unreachable!("only namespace messages come here"),
        }
    }

    /// A client's namespace operation at its anchor's primary: joins the run of the same
    /// id, or begins coordinating it.
    fn on_ns_op(&mut self, n: NodeId, to: ReplyTo, epoch: Epoch, op: NsOp, id: u64) -> Result<(), Fail> {
        self.check_epoch(n, epoch)?;
        let parts = self.cfg.partitions;
        let anchor = op.anchor(parts);
        self.primary_check(n, anchor)?;
        let id = if self.cfg.bug == Some(Bug::ForgetDone) { 0 } else { id };
        if id != 0
            && let Some(k) = self.nodes[&n].ns.running.get(&id).copied()
            && let Some(w) = self.coord(n, k)
        {
            w.also.push(to);
            return Ok(());
        }
        let now_ns = self.now as i64 * 1_000_000;
        let k = self.new_work(n);
        let owner = owner_id(n.0, k);
        let w = CoordWork {
            c: Coordination::new(op.clone(), root(), id, now_ns, parts),
            client: to,
            also: Vec::new(),
            op,
            id,
            owner,
            held: Vec::new(),
            deadline: self.now + WORK_TIMEOUT,
            waiting: 0,
            refused: false,
            asked: Vec::new(),
            read: Vec::new(),
            plans: VecDeque::new(),
            reply: None,
            tails: Vec::new(),
            quiet: (BTreeSet::new(), true),
            pending: None,
            pause: 2,
            attempt: 0,
        };
        self.note(format!(
            "node {} coordinates {} as work {k} (id {id:#x})",
            n.0,
            brief(&w.op)
        ));
        let ns = self.ns_node(n);
        ns.work.insert(k, Work::Coord(Box::new(w)));
        if id != 0 {
            ns.running.insert(id, k);
        }
        self.coord_next(n, k);
        Ok(())
    }

    /// `on_settled`: whether every intent of `p` is being driven here (none left over).
    fn on_settled(&mut self, n: NodeId, to: ReplyTo, epoch: Epoch, p: PartitionId) -> Result<(), Fail> {
        self.check_epoch(n, epoch)?;
        let settled = self.primary_check(n, p).is_ok() && {
            let inflight = &self.nodes[&n].ns.inflight;
            self.nodes[&n].slots[&p]
                .r
                .part
                .intents
                .keys()
                .all(|id| inflight.contains(id) && !self.nodes[&n].ns.redoing.contains(id))
        };
        self.respond(n, to, Ok(Body::Locked(settled)));
        Ok(())
    }

    /// `on_quiet`: the partitions this node leads, and whether none has an uncounted
    /// intent that adjusts one of `dirs`.
    fn on_quiet(&mut self, n: NodeId, to: ReplyTo, epoch: Epoch, dirs: Vec<Ino>) -> Result<(), Fail> {
        self.check_epoch(n, epoch)?;
        if self.nodes[&n].view.map.epoch != epoch {
            return Err(Fail::Again);
        }
        let v = self.nodes[&n].view.clone();
        let ns = &self.nodes[&n].ns;
        let mut parts = Vec::new();
        let mut quiet = true;
        for (p, slot) in &self.nodes[&n].slots {
            if v.primary(*p) != Some(n) || !slot.r.serving {
                continue;
            }
            parts.push(*p);
            if slot
                .r
                .part
                .intents
                .values()
                .any(|i| !ns.counted.contains(&i.id) && adjusts_any(i, &dirs))
            {
                quiet = false;
            }
        }
        self.respond(n, to, Ok(Body::Quiet(parts, quiet)));
        Ok(())
    }

    /// Takes the keys of a lock request for its owner if they are free (or its own),
    /// else looks again a little later until the request's wait is over (the service's
    /// lock host waits up to 200 ms for busy keys before it refuses).
    fn try_lock(&mut self, n: NodeId, w: LockWait) {
        let v = self.nodes[&n].view.clone();
        let now = self.now;
        if !v.map.is_up(NodeId(owner_node(w.owner))) {
            return self.respond(n, w.to, Ok(Body::Locked(false)));
        }
        let ns = self.ns_node(n);
        if ns
            .locks
            .take(&w.keys, w.owner, w.anchor.0, now, now + LOCK_LEASE, now + WANT)
        {
            // Read under the keys just taken, as a fetch would (the caller's epoch, this
            // node the primary); otherwise the caller fetches.
            let read = w.read.as_ref().and_then(|(epoch, inos)| {
                let needs: Vec<Need> = inos.iter().map(|i| Need::Inode(*i)).collect();
                let recs = self.fetch_here(n, *epoch, &needs).ok()?;
                let inodes = recs.into_iter().map(|r| match r {
                    Rec::Inode(r) => r,
                    _ => unreachable!("inodes were asked"),
                });
                Some(inos.iter().copied().zip(inodes).collect())
            });
            let body = read.map_or(Body::Locked(true), Body::Granted);
            return self.respond(n, w.to, Ok(body));
        }
        if now >= w.until {
            return self.respond(n, w.to, Ok(Body::Locked(false)));
        }
        let inc = self.nodes[&n].inc;
        self.at(10, Ev::LockWait(n, inc, Box::new(w)));
    }

    /// What a coordinator on map `epoch` reads from node `n` (`on_fetch` of node.rs):
    /// only on this node's epoch, and from partitions it is the primary of.
    fn fetch_here(&self, n: NodeId, epoch: Epoch, needs: &[Need]) -> Result<Vec<Rec>, Fail> {
        if epoch != self.nodes[&n].view.map.epoch {
            return Err(Fail::Stale);
        }
        let parts = self.cfg.partitions;
        let mut out = Vec::with_capacity(needs.len());
        for need in needs {
            let p = match need {
                Need::Inode(ino) | Need::Stripe(ino, _) => ino.partition(),
                Need::Dentry(parent, nm) => crate::placement::dentry_partition(*parent, nm, parts),
                Need::Counter(_) | Need::Done(..) => return Err(Fail::Stale),
            };
            self.primary_check(n, p)?;
            let part = &self.nodes[&n].slots[&p].r.part;
            out.push(match need {
                Need::Inode(ino) => Rec::Inode(part.inodes.get(ino).cloned()),
                Need::Dentry(parent, nm) => Rec::Dentry(part.dentry(*parent, nm)),
                Need::Stripe(ino, s) => Rec::Stripe(part.stripes.get(&(*ino, *s)).cloned()),
                _ => unreachable!("refused above"),
            });
        }
        Ok(out)
    }

    /// A lock request waiting at node `n` looks again.
    pub(super) fn ns_lock_wait(&mut self, n: NodeId, inc: u64, w: LockWait) {
        if self.nodes.get(&n).is_some_and(|x| x.alive && x.inc == inc && !x.cut) {
            self.try_lock(n, w);
        }
    }

    /// The fence of `Execute` batches ([`fence`]).
    pub(super) fn ns_fence(&self, n: NodeId, from: NodeId, ops: &[PartOp]) -> Result<(), Fail> {
        fence(&self.nodes[&n].view, from, ops).map_err(|_| Fail::Fenced)
    }

    fn ns_node(&mut self, n: NodeId) -> &mut NsNode {
        &mut self.nodes.get_mut(&n).expect("exists").ns
    }

    fn new_work(&mut self, n: NodeId) -> u64 {
        let ns = self.ns_node(n);
        ns.next_work += 1;
        ns.next_work
    }

    fn coord(&mut self, n: NodeId, k: u64) -> Option<&mut CoordWork> {
        match self.ns_node(n).work.get_mut(&k) {
            Some(Work::Coord(w)) => Some(w),
            _ => None,
        }
    }

    fn drive(&mut self, n: NodeId, k: u64) -> Option<&mut DriveWork> {
        match self.ns_node(n).work.get_mut(&k) {
            Some(Work::Drive(w)) => Some(w),
            _ => None,
        }
    }

    /// Sends a request of work item `k`; its reply comes back to [`World::ns_reply`].
    fn work_call(&mut self, n: NodeId, to: NodeId, msg: Msg, k: u64, wait: Wait) {
        let attempt = self.coord(n, k).map_or(0, |w| w.attempt);
        self.call(n, to, msg, Pending::Work(k, attempt, wait), super::REPLICATE_TIMEOUT);
    }

    /// The next step of coordination `k`.
    fn coord_next(&mut self, n: NodeId, k: u64) {
        let v = self.nodes[&n].view.clone();
        let Some(w) = self.coord(n, k) else { return };
        match w.c.step() {
            Next::Lock(keys) => self.coord_lock(n, k, &v, keys),
            Next::Fetch(needs) => self.coord_fetch(n, k, &v, needs),
            Next::Commit(plans, reply) => {
                let what: Vec<String> = plans.iter().map(|(c, steps)| format!("{}:{:?}", c.0, steps)).collect();
                w.plans = plans.into();
                self.note(format!("node {} work {k} commits {}", n.0, what.join("; ")));
                let w = self.coord(n, k).expect("exists");
                w.reply = Some(reply);
                self.coord_plan(n, k);
            }
            Next::Fail(e) => self.coord_end(n, k, Ok(Body::Ns(Err(e)))),
        }
    }

    /// Asks each key's host (its partition's primary) for the locks coordination `k`
    /// needs, remote hosts reading the locked inodes once held.
    fn coord_lock(&mut self, n: NodeId, k: u64, v: &crate::map::MapView, keys: Vec<u64>) {
        let mut by_host: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
        for key in &keys {
            match v.primary(Ino(*key).partition()) {
                Some(h) => by_host.entry(h).or_default().push(*key),
                None => return self.coord_busy(n, k),
            }
        }
        let w = self.coord(n, k).expect("exists");
        w.waiting = by_host.len();
        w.refused = false;
        w.asked = keys;
        w.read.clear();
        let owner = w.owner;
        let anchor = w.c.anchor();
        for (host, keys) in by_host {
            // A remote host reads the locked inodes once held (`Lock::fetch`).
            let inos: Vec<Ino> = keys.iter().filter_map(|k| key_inode(*k)).collect();
            let read = (host != n && !inos.is_empty()).then_some((v.map.epoch, inos));
            let msg = Msg::Lock {
                keys: keys.clone(),
                owner,
                anchor,
                read,
            };
            self.work_call(n, host, msg, k, Wait::Lock(host, keys));
        }
    }

    /// Gets what coordination `k` needs: counters allocated, done records read here (the
    /// anchor), records fetched from their hosts; goes on at once when nothing is out.
    fn coord_fetch(&mut self, n: NodeId, k: u64, v: &crate::map::MapView, needs: Vec<Need>) {
        let parts = self.cfg.partitions;
        let mut by_host: BTreeMap<NodeId, Vec<Need>> = BTreeMap::new();
        let mut calls = 0;
        for need in needs {
            match &need {
                Need::Counter(p) => {
                    calls += 1;
                    let p = *p;
                    self.send_alloc(n, k, p, Wait::Counter(p));
                }
                Need::Done(p, op) => {
                    // The anchor: this node is its serving primary, or the client
                    // retries at the new one.
                    if self.primary_check(n, *p).is_err() {
                        return self.coord_busy(n, k);
                    }
                    let part = &self.nodes[&n].slots[p].r.part;
                    if part.done_pending(*op) && self.cfg.bug != Some(Bug::DoneBeforeFinished) {
                        return self.coord_busy(n, k);
                    }
                    let rec = part.done.get(op).copied();
                    let (p, op) = (*p, *op);
                    self.coord(n, k).expect("exists").c.provide_done(p, op, rec);
                }
                Need::Inode(ino) | Need::Stripe(ino, _) => match v.primary(ino.partition()) {
                    Some(h) => by_host.entry(h).or_default().push(need),
                    None => return self.coord_busy(n, k),
                },
                Need::Dentry(parent, nm) => match v.primary(crate::placement::dentry_partition(*parent, nm, parts)) {
                    Some(h) => by_host.entry(h).or_default().push(need),
                    None => return self.coord_busy(n, k),
                },
            }
        }
        let epoch = v.map.epoch;
        for (host, needs) in by_host {
            calls += 1;
            let msg = Msg::Fetch {
                epoch,
                needs: needs.clone(),
            };
            self.work_call(n, host, msg, k, Wait::Fetch(needs));
        }
        let w = self.coord(n, k).expect("exists");
        w.waiting += calls;
        if w.waiting == 0 {
            self.coord_next(n, k);
        }
    }

    /// Runs the next plan of coordination `k`, or answers once all are done.
    fn coord_plan(&mut self, n: NodeId, k: u64) {
        let Some(w) = self.coord(n, k) else { return };
        let Some(plan) = w.plans.pop_front() else {
            let reply = w.reply.clone().expect("set with the plans");
            return self.coord_end(n, k, Ok(Body::Ns(Ok(reply))));
        };
        match plan_run(&plan) {
            PlanRun::Batch { p, relative: false } => {
                let ops = batch_ops(plan.1, 0);
                self.send_exec(n, k, p, ops);
            }
            PlanRun::Batch { p, relative: true } => {
                w.pending = Some(plan);
                self.send_alloc(n, k, p, Wait::Id(p));
            }
            PlanRun::Intent { coord } => {
                w.pending = Some(plan);
                self.send_alloc(n, k, coord, Wait::Id(coord));
            }
        }
    }

    /// Locks refused, a record unreadable: release everything and start again later.
    fn coord_busy(&mut self, n: NodeId, k: u64) {
        let now = self.now;
        let nonce = self.rng.next_u64();
        let jitter = self.rng.below(5);
        let parts = self.cfg.partitions;
        let Some(w) = self.coord(n, k) else { return };
        if now >= w.deadline {
            return self.coord_end(n, k, Err(Fail::Again));
        }
        let held = std::mem::take(&mut w.held);
        let owner = w.owner;
        w.c = Coordination::new(w.op.clone(), root(), w.id, now as i64 * 1_000_000, parts);
        w.owner = owner_id(n.0, nonce);
        w.waiting = 0;
        w.attempt += 1;
        let pause = w.pause;
        w.pause = (w.pause * 2).min(100);
        self.unlock_all(n, held, owner);
        let inc = self.nodes[&n].inc;
        self.at(
            pause + jitter,
            Ev::Work {
                node: n,
                inc,
                k,
                wait: Wait::Restart,
            },
        );
    }

    fn unlock_all(&mut self, n: NodeId, held: Vec<(NodeId, Vec<u64>)>, owner: u64) {
        for (host, keys) in held {
            let msg = Msg::Unlock { keys, owner };
            self.send(Addr::Node(n), Addr::Node(host), super::Packet::Req { call: 0, msg });
        }
    }

    /// Coordination `k` ends: its client is answered, and its locks go — once the
    /// directory counts of its applied intents follow, if it has any (`finish_op`).
    fn coord_end(&mut self, n: NodeId, k: u64, res: Result<Body, Fail>) {
        let Some(Work::Coord(w)) = self.ns_node(n).work.remove(&k) else {
            return;
        };
        self.note(format!("node {} work {k} ends: {res:?}", n.0));
        self.ns_node(n).running.remove(&w.id);
        for to in w.also {
            self.respond(n, to, res.clone());
        }
        self.respond(n, w.client, res);
        self.release_after_tails(n, k, w.held, w.owner, w.tails);
    }

    /// The locks of coordination `k` go now, or once the counts of its `tails` drives
    /// are applied: work `k` becomes their [`TailsWork`].
    fn release_after_tails(&mut self, n: NodeId, k: u64, held: Vec<(NodeId, Vec<u64>)>, owner: u64, tails: Vec<u64>) {
        let tails: Vec<u64> = tails.into_iter().filter(|d| self.drive(n, *d).is_some()).collect();
        if tails.is_empty() {
            return self.unlock_all(n, held, owner);
        }
        let w = TailsWork {
            held,
            owner,
            left: tails.len(),
            awaiting: Vec::new(),
            until: 0,
        };
        self.ns_node(n).work.insert(k, Work::Tails(Box::new(w)));
        self.note(format!(
            "node {} work {k} answered; its drives {tails:?} apply the counts",
            n.0
        ));
        for d in tails {
            let Some(w) = self.drive(n, d) else { continue };
            w.stage = Stage::Later;
            let later = std::mem::take(&mut w.later);
            w.waiting = later.len();
            for (p, ops) in later {
                self.send_exec(n, d, p, ops);
            }
        }
    }

    /// A tail of work `k` applied its counts (`failed`: it could not; the sweep will
    /// redo its intent).
    fn tail_done(&mut self, n: NodeId, k: u64, failed: Option<(PartitionId, u64)>) {
        let now = self.now;
        let Some(Work::Tails(w)) = self.ns_node(n).work.get_mut(&k) else {
            return;
        };
        w.left -= 1;
        if let Some(f) = failed {
            w.awaiting.push(f);
            w.until = now + LOCK_LEASE;
        }
        self.tails_check(n, k);
    }

    /// Releases the locks of tails work `k` once every count is applied or redone (or
    /// the wait for the redos is over).
    fn tails_check(&mut self, n: NodeId, k: u64) {
        let now = self.now;
        let Some(Work::Tails(w)) = self.ns_node(n).work.get(&k) else {
            return;
        };
        if w.left > 0 || (!w.awaiting.is_empty() && now < w.until) {
            return;
        }
        let Some(Work::Tails(w)) = self.ns_node(n).work.remove(&k) else {
            return;
        };
        self.note(format!("node {} work {k}: counts applied, locks go", n.0));
        self.unlock_all(n, w.held, w.owner);
    }

    fn send_alloc(&mut self, n: NodeId, k: u64, p: PartitionId, wait: Wait) {
        let v = self.nodes[&n].view.clone();
        let Some(host) = v.primary(p) else {
            return self.work_retry(n, k, wait);
        };
        let msg = Msg::Exec {
            epoch: v.map.epoch,
            p,
            op: Op::Alloc,
            deadline: self.now + super::REPLICATE_TIMEOUT,
        };
        self.work_call(n, host, msg, k, wait);
    }

    fn send_exec(&mut self, n: NodeId, k: u64, p: PartitionId, ops: Vec<PartOp>) {
        if let Some(Work::Drive(w)) = self.nodes[&n].ns.work.get(&k) {
            let (coord, reign) = (w.coord, w.reign);
            let leads =
                self.primary_check(n, coord).is_ok() && self.nodes[&n].slots[&coord].r.meta.state_epoch == reign;
            if !leads && self.cfg.bug != Some(Bug::DriveAcrossReigns) {
                return self.work_failed(n, k);
            }
        }
        let v = self.nodes[&n].view.clone();
        let Some(host) = v.primary(p) else {
            return self.work_retry(n, k, Wait::Exec(p, ops));
        };
        let msg = Msg::Exec {
            epoch: v.map.epoch,
            p,
            op: Op::Batch(ops.clone(), n),
            deadline: self.now + super::REPLICATE_TIMEOUT,
        };
        self.work_call(n, host, msg, k, Wait::Exec(p, ops));
    }

    /// An allocation or a batch failed for now: ask again a little later, until the
    /// work's deadline.
    fn work_retry(&mut self, n: NodeId, k: u64, wait: Wait) {
        let deadline = match self.ns_node(n).work.get(&k) {
            Some(Work::Coord(w)) => w.deadline,
            Some(Work::Drive(w)) => w.deadline,
            Some(Work::Tails(_)) | None => return,
        };
        if self.now >= deadline {
            return self.work_failed(n, k);
        }
        let inc = self.nodes[&n].inc;
        let d = 10 + self.rng.below(40);
        self.at(d, Ev::Work { node: n, inc, k, wait });
    }

    /// A timer of work `k` fired.
    pub(super) fn ns_timer(&mut self, n: NodeId, inc: u64, k: u64, wait: Wait) {
        if self.nodes.get(&n).is_none_or(|x| !x.alive || x.inc != inc) {
            return;
        }
        match wait {
            Wait::Restart => self.coord_next(n, k),
            Wait::Counter(p) | Wait::Id(p) => self.send_alloc(n, k, p, wait),
            Wait::Exec(p, ops) => self.send_exec(n, k, p, ops),
            Wait::Lock(..) | Wait::Fetch(_) | Wait::Quiet => {}
        }
    }

    /// Work `k` cannot go on: a coordination answers its client "try again"; an intent
    /// is left to the sweep.
    fn work_failed(&mut self, n: NodeId, k: u64) {
        self.note(format!("node {} work {k} fails", n.0));
        match self.ns_node(n).work.remove(&k) {
            Some(Work::Coord(w)) => {
                self.ns_node(n).running.remove(&w.id);
                for to in w.also {
                    self.respond(n, to, Err(Fail::Again));
                }
                self.respond(n, w.client, Err(Fail::Again));
                // Intents applied by earlier plans are completed under the locks.
                self.release_after_tails(n, k, w.held, w.owner, w.tails);
            }
            Some(Work::Drive(w)) => {
                let ns = self.ns_node(n);
                ns.inflight.remove(&w.intent.id);
                ns.redoing.remove(&w.intent.id);
                ns.counted.remove(&w.intent.id);
                match (w.parent, w.stage) {
                    (Some(parent), Stage::Later) => self.tail_done(n, parent, Some((w.coord, w.intent.id))),
                    (Some(parent), _) => self.work_failed(n, parent),
                    (None, _) => {}
                }
            }
            Some(Work::Tails(w)) => self.unlock_all(n, w.held, w.owner),
            None => {}
        }
    }

    /// The partition of some dead coordinators' operations answered whether it settled:
    /// if it did, their locks go.
    pub(super) fn ns_settled(&mut self, n: NodeId, p: PartitionId, res: Result<Body, Fail>) {
        if !matches!(res, Ok(Body::Locked(true))) {
            return;
        }
        let ns = self.ns_node(n);
        let down_at = ns.down_at.clone();
        ns.locks
            .retain(|_, h| h.anchor != p.0 || down_at.get(&NodeId(owner_node(h.owner))).is_none_or(|t| h.taken > *t));
        let mut waiting = Vec::new();
        for (k, w) in &mut ns.work {
            if let Work::Tails(t) = w {
                t.awaiting.retain(|(q, _)| *q != p);
                waiting.push(*k);
            }
        }
        for k in waiting {
            self.tails_check(n, k);
        }
    }

    /// One read of coordination `k` came back: once all have, its next step.
    fn coord_read(&mut self, n: NodeId, k: u64) {
        let Some(w) = self.coord(n, k) else { return };
        w.waiting -= 1;
        if w.waiting == 0 {
            self.coord_next(n, k);
        }
    }

    /// A reply to a request of work `k`.
    pub(super) fn ns_reply(&mut self, n: NodeId, k: u64, attempt: u32, wait: Wait, res: Result<Body, Fail>) {
        if self.coord(n, k).is_some_and(|w| w.attempt != attempt) {
            return;
        }
        match (wait, res) {
            (Wait::Lock(host, keys), res) => self.lock_answered(n, k, host, keys, res),
            (Wait::Quiet, res) => self.quiet_answered(n, k, res),
            (Wait::Fetch(needs), Ok(Body::Fetched(recs))) if recs.len() == needs.len() => {
                let Some(w) = self.coord(n, k) else { return };
                for (need, rec) in needs.into_iter().zip(recs) {
                    match (need, rec) {
                        (Need::Inode(ino), Rec::Inode(r)) => w.c.provide_inode(ino, r),
                        (Need::Dentry(parent, nm), Rec::Dentry(d)) => w.c.provide_dentry(parent, nm, d),
                        (Need::Stripe(ino, s), Rec::Stripe(r)) => w.c.provide_stripe(ino, s, r),
                        _ => {}
                    }
                }
                self.coord_read(n, k);
            }
            (Wait::Counter(p), Ok(Body::Exec(Some(counter)))) => {
                let Some(w) = self.coord(n, k) else { return };
                w.c.provide_counter(p, counter);
                self.coord_read(n, k);
            }
            (Wait::Fetch(_) | Wait::Counter(_), _) => {
                if self.coord(n, k).is_some() {
                    self.coord_busy(n, k);
                }
            }
            (Wait::Id(p), Ok(Body::Exec(Some(counter)))) => self.id_answered(n, k, p, counter),
            (wait @ (Wait::Id(_) | Wait::Exec(..)), Err(Fail::Fenced)) => {
                let _ = wait;
                self.work_failed(n, k);
            }
            (Wait::Exec(..), Ok(Body::Exec(_))) => match self.ns_node(n).work.get(&k) {
                Some(Work::Coord(_)) => self.coord_plan(n, k),
                Some(Work::Drive(_)) => self.drive_applied(n, k),
                Some(Work::Tails(_)) | None => {}
            },
            (wait @ (Wait::Id(_) | Wait::Exec(..)), _) => self.work_retry(n, k, wait),
            (Wait::Restart, _) => {}
        }
    }

    /// A lock host answered: once all have, the coordination goes on (after asking
    /// whether counts are owed to the directories it changes) or backs off.
    fn lock_answered(&mut self, n: NodeId, k: u64, host: NodeId, keys: Vec<u64>, res: Result<Body, Fail>) {
        let Some(w) = self.coord(n, k) else { return };
        w.waiting = w.waiting.saturating_sub(1);
        // Keys whose answer was lost may be held all the same: released too.
        match res {
            Ok(Body::Locked(true)) => {}
            Ok(Body::Granted(read)) => w.read.extend(read),
            _ => w.refused = true,
        }
        w.held.push((host, keys));
        if w.waiting > 0 {
            return;
        }
        if w.refused {
            return self.coord_busy(n, k);
        }
        let asked = std::mem::take(&mut w.asked);
        w.c.locked(&asked);
        for (ino, rec) in std::mem::take(&mut w.read) {
            w.c.provide_inode(ino, rec);
        }
        let dirs = w.c.quiet_dirs(&asked);
        if dirs.is_empty() || self.cfg.bug == Some(Bug::SkipQuiet) {
            return self.coord_next(n, k);
        }
        // Ask every Up node whether counts are still owed to them.
        let v = self.nodes[&n].view.clone();
        let up: Vec<NodeId> = v
            .map
            .nodes
            .values()
            .filter(|x| x.roles.meta && v.map.is_up(x.id))
            .map(|x| x.id)
            .collect();
        let w = self.coord(n, k).expect("exists");
        w.quiet = (BTreeSet::new(), true);
        w.waiting = up.len();
        for to in up {
            let msg = Msg::Quiet {
                epoch: v.map.epoch,
                dirs: dirs.clone(),
            };
            self.work_call(n, to, msg, k, Wait::Quiet);
        }
    }

    /// A node answered whether counts are owed: once all have, the coordination goes on
    /// if every partition was covered and quiet, else backs off.
    fn quiet_answered(&mut self, n: NodeId, k: u64, res: Result<Body, Fail>) {
        let parts = self.cfg.partitions as usize;
        let Some(w) = self.coord(n, k) else { return };
        w.waiting = w.waiting.saturating_sub(1);
        match res {
            Ok(Body::Quiet(covered, quiet)) => {
                w.quiet.0.extend(covered);
                w.quiet.1 &= quiet;
            }
            _ => w.quiet.1 = false,
        }
        if w.waiting > 0 {
            return;
        }
        if w.quiet.1 && w.quiet.0.len() == parts {
            self.coord_next(n, k);
        } else {
            self.coord_busy(n, k);
        }
    }

    /// An intent id (or a new inode's number) arrived: the pending plan runs as one
    /// batch or as an intent.
    fn id_answered(&mut self, n: NodeId, k: u64, p: PartitionId, counter: u64) {
        let Some(w) = self.coord(n, k) else { return };
        let plan = w.pending.take().expect("an id is asked for a pending plan");
        let Some(id) = Ino::new(p, counter).map(|i| i.0) else {
            return self.coord_end(n, k, Ok(Body::Ns(Err(Errno::ENOSPC))));
        };
        match plan_run(&plan) {
            PlanRun::Batch { .. } => {
                let ops = batch_ops(plan.1, id);
                self.send_exec(n, k, p, ops);
            }
            PlanRun::Intent { coord } => {
                let intent = Intent { id, steps: plan.1 };
                self.drive_start(n, coord, intent, Some(k), true);
            }
        }
    }

    /// Starts applying an intent: its record and its coordinating partition's steps
    /// first (`begin`), then the other partitions'.
    fn drive_start(&mut self, n: NodeId, coord: PartitionId, intent: Intent, parent: Option<u64>, begin: bool) {
        let k = self.new_work(n);
        let id = intent.id;
        self.note(format!(
            "node {} work {k} drives intent {id:#x} in {} (parent {parent:?}, begin {begin})",
            n.0, coord.0
        ));
        let (first, _) = intent_ops(coord, &intent, begin);
        let deadline = self.now + WORK_TIMEOUT;
        if self.primary_check(n, coord).is_err() {
            if let Some(parent) = parent {
                self.work_failed(n, parent);
            }
            return;
        }
        let reign = self.nodes[&n].slots[&coord].r.meta.state_epoch;
        let ns = self.ns_node(n);
        ns.inflight.insert(id);
        if parent.is_none() {
            ns.redoing.insert(id);
        }
        let w = DriveWork {
            coord,
            reign,
            intent,
            stage: Stage::First,
            waiting: 1,
            deadline,
            parent,
            later: BTreeMap::new(),
        };
        ns.work.insert(k, Work::Drive(Box::new(w)));
        self.send_exec(n, k, coord, first);
    }

    /// A batch of intent work `k` is applied.
    fn drive_applied(&mut self, n: NodeId, k: u64) {
        let deadline = self.now + WORK_TIMEOUT;
        let Some(w) = self.drive(n, k) else { return };
        w.waiting -= 1;
        if w.waiting > 0 {
            return;
        }
        match w.stage {
            Stage::First => {
                let (_, others) = intent_ops(w.coord, &w.intent, false);
                let (now, later) = answer_before(others);
                w.later = later;
                w.stage = Stage::Others;
                w.waiting = now.len();
                if now.is_empty() {
                    w.waiting = 1;
                    return self.drive_applied(n, k);
                }
                for (p, ops) in now {
                    self.send_exec(n, k, p, ops);
                }
            }
            Stage::Others if !w.later.is_empty() => {
                // Durable, and every name and inode in place: a new operation is
                // answered now and its coordination sends the counts once it has no
                // plan left (its locks stay until they are applied); a redo goes on.
                w.deadline = deadline;
                match w.parent {
                    Some(parent) => {
                        w.stage = Stage::Answered;
                        w.waiting = 0;
                        if let Some(c) = self.coord(n, parent) {
                            c.tails.push(k);
                        }
                        self.coord_plan(n, parent);
                    }
                    None => {
                        w.stage = Stage::Later;
                        let later = std::mem::take(&mut w.later);
                        w.waiting = later.len();
                        for (p, ops) in later {
                            self.send_exec(n, k, p, ops);
                        }
                    }
                }
            }
            Stage::Others | Stage::Later => {
                // Every step is durable: the operation is done and its client was
                // answered; finishing only drops the intent's record.
                let tails = w.stage == Stage::Later;
                w.stage = Stage::Finish;
                w.waiting = 1;
                w.deadline = deadline;
                let parent = w.parent.take();
                let id = w.intent.id;
                self.note(format!("node {} work {k}: intent {id:#x} applied", n.0));
                // Counted as applied before the locks go (`finish_op` of node.rs).
                self.ns_node(n).counted.insert(id);
                match parent {
                    Some(parent) if tails => self.tail_done(n, parent, None),
                    Some(parent) => self.coord_plan(n, parent),
                    None => {}
                }
                self.ns_node(n).finishing.push(k);
            }
            Stage::Answered => {}
            Stage::Finish => {
                let id = w.intent.id;
                let ns = self.ns_node(n);
                ns.work.remove(&k);
                ns.inflight.remove(&id);
                ns.redoing.remove(&id);
                ns.counted.remove(&id);
            }
        }
    }

    /// Each heartbeat: redo intents left by an earlier coordinator in partitions this
    /// node leads, drop locks whose partitions moved away, whose lease ran out or whose
    /// coordinator went Down a while ago.
    pub(super) fn ns_tick(&mut self, n: NodeId) {
        for k in std::mem::take(&mut self.ns_node(n).finishing) {
            let Some(Work::Drive(w)) = self.nodes[&n].ns.work.get(&k) else {
                continue;
            };
            let (coord, id) = (w.coord, w.intent.id);
            self.send_exec(n, k, coord, finish_ops(id));
        }
        let v = self.nodes[&n].view.clone();
        let anchors = self.tick_locks(n, &v);
        self.tick_tails(n, &v, anchors);
        self.tick_redo(n, &v);
    }

    /// Frees the locks of coordinators Down long enough and of partitions no longer
    /// led here: the anchors of dead coordinators' operations still holding locks.
    fn tick_locks(&mut self, n: NodeId, v: &crate::map::MapView) -> BTreeSet<PartitionId> {
        let now = self.now;
        let ns = self.ns_node(n);
        for node in v.map.nodes.values() {
            if !v.map.is_up(node.id) {
                ns.down_at.entry(node.id).or_insert(now);
            } else if let Some(t) = ns.down_at.get(&node.id).copied()
                && now >= t + DEAD_LOCKS
            {
                // Back up: only what it took before going Down is still to free, and
                // that is freed by now.
                ns.down_at.remove(&node.id);
            }
        }
        let down_at = ns.down_at.clone();
        let dead = |h: &Held| {
            down_at
                .get(&NodeId(owner_node(h.owner)))
                .filter(|t| h.taken <= **t)
                .copied()
        };
        ns.locks.expire(now);
        ns.locks.retain(|key, h| {
            let long_dead = dead(h).is_some_and(|t| now >= t + DEAD_LOCKS);
            !long_dead && v.primary(Ino(key).partition()) == Some(n)
        });
        // Ask the partitions of dead coordinators' operations whether they settled.
        ns.locks
            .holds()
            .filter(|(_, h)| dead(h).is_some())
            .map(|(_, h)| PartitionId(h.anchor))
            .collect()
    }

    /// Answered coordinations whose counts failed wait for their intents' redo: gone
    /// from this node's serving copy, or the partition settled at its primary (asked
    /// here, with the `anchors` of dead coordinators).
    fn tick_tails(&mut self, n: NodeId, v: &crate::map::MapView, anchors: BTreeSet<PartitionId>) {
        let mut asked = anchors;
        let ns = &self.nodes[&n].ns;
        let waiting: Vec<u64> = ns
            .work
            .iter()
            .filter_map(|(k, w)| match w {
                Work::Tails(t) if t.left == 0 && !t.awaiting.is_empty() => Some(*k),
                _ => None,
            })
            .collect();
        for k in waiting {
            let node = self.nodes.get_mut(&n).expect("exists");
            let slots = &node.slots;
            let Some(Work::Tails(t)) = node.ns.work.get_mut(&k) else {
                continue;
            };
            t.awaiting.retain(|(p, id)| {
                if v.primary(*p) == Some(n) && slots.get(p).is_some_and(|s| s.r.serving) {
                    return slots[p].r.part.intents.contains_key(id);
                }
                asked.insert(*p);
                true
            });
            self.tails_check(n, k);
        }
        for p in asked {
            if let Some(primary) = v.primary(p) {
                let msg = Msg::Settled { epoch: v.map.epoch, p };
                self.call(n, primary, msg, Pending::Settled(p), 500);
            }
        }
    }

    /// Redoes the intents of partitions led here that no coordination here drives.
    fn tick_redo(&mut self, n: NodeId, v: &crate::map::MapView) {
        let mut redo = Vec::new();
        for (p, slot) in &self.nodes[&n].slots {
            if !slot.r.serving || v.primary(*p) != Some(n) {
                continue;
            }
            for (id, intent) in &slot.r.part.intents {
                if !self.nodes[&n].ns.inflight.contains(id) {
                    redo.push((*p, intent.clone()));
                }
            }
        }
        for (p, intent) in redo {
            self.note(format!(
                "node {} redoes intent {:#x} of partition {}",
                n.0, intent.id, p.0
            ));
            self.report.intents_redone += 1;
            self.drive_start(n, p, intent, None, false);
        }
    }
}

impl Model {
    /// A name of `ino` went (files only: a directory's count does not depend on its names).
    fn drop_link(&mut self, ino: Ino) {
        if let Some(l) = self.nlink.get_mut(&ino) {
            *l -= 1;
            if *l == 0 {
                self.nlink.remove(&ino);
            }
        }
    }
}

fn names(m: &BTreeMap<Vec<u8>, (Ino, FileKind)>) -> Vec<String> {
    m.iter()
        .map(|(n, (i, k))| {
            format!(
                "{}={:#x}{}",
                String::from_utf8_lossy(n),
                i.0,
                if *k == FileKind::Dir { "/" } else { "" }
            )
        })
        .collect()
}

/// An operation in a log line.
fn brief(op: &NsOp) -> String {
    let n = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match op {
        NsOp::Mknod { parent, name, kind, .. } => format!("mknod {:#x}/{} {kind:?}", parent.0, n(name)),
        NsOp::Link {
            ino,
            newparent,
            newname,
        } => format!("link {:#x} to {:#x}/{}", ino.0, newparent.0, n(newname)),
        NsOp::Unlink { parent, name, .. } => format!("unlink {:#x}/{}", parent.0, n(name)),
        NsOp::Rmdir { parent, name } => format!("rmdir {:#x}/{}", parent.0, n(name)),
        NsOp::Rename {
            parent,
            name,
            newparent,
            newname,
            ..
        } => format!(
            "rename {:#x}/{} to {:#x}/{}",
            parent.0,
            n(name),
            newparent.0,
            n(newname)
        ),
        other => format!("{other:?}"),
    }
}
