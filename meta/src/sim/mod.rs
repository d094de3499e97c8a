//! A deterministic simulator of metadata replication: many nodes, one thread, virtual
//! time, one seed.
//!
//! Every node holds real partition copies ([`crate::service::replica::Replica`]) and takes every replication
//! decision with the same pure functions the metadata service runs
//! ([`crate::service::protocol`]): which copies keep serving when a map arrives, how a
//! replica follows its primary's batches, how a copy is installed, how a new primary
//! tallies its members and which reign it starts. Maps come from a real [`crate::map::ClusterMap`]
//! and its placement. Around them the simulator plays what `node.rs` does with the
//! network and the disk — the same steps in the same order, each partition's steps
//! serialised by its write lock — over a world that fails:
//!
//! - a network that drops, delays (so reorders) and duplicates messages, and cuts nodes
//!   off and heals them;
//! - nodes that crash (pending disk writes are lost: torn) and restart from what their
//!   disk holds, disks whose writes fail;
//! - a manager that marks silent nodes Down and returning nodes Up, its maps reaching
//!   nodes at their next heartbeat (so a node can skip epochs);
//! - clients that write names and allocate inode numbers, retrying through failures,
//!   and clients that read from any member of their own (possibly stale) map, as
//!   `on_read` serves;
//! - with [`Config::ns_clients`], clients running namespace operations (create, mkdir,
//!   link, unlink, rmdir, rename) in directories of their own, coordinated by the
//!   service's own engine ([`crate::service::coordinator`]): locks, reads, one batch or
//!   an intent per plan, the fence, the sweep that redoes intents left behind. Each
//!   answer is checked against the client's model (a retry must return the first
//!   result), and once healed every directory against its model, link counts included.
//!
//! Checked all along: every read sees every name acknowledged before it was issued;
//! every acknowledged mutation is in the copy of every primary that acknowledges later (and, once the world heals, in every member's copy, all copies
//! equal); one node acknowledges per partition and map epoch, and per reign; no inode
//! number is handed out twice. A violation stops the run with its seed, the virtual time
//! and the tail of the event log; [`Config::replay`] prints the command that replays it.

mod world;

pub use world::run;

use std::fmt;

/// A protocol bug the simulator can put back on purpose, to show it finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// A copy promoted to primary keeps serving without starting a reign of its own
    /// (the bug `keeps_serving`'s `promoted` rule fixed): it continues its old primary's
    /// numbering, and a batch the old primary persisted but never got acknowledged is
    /// taken for a different one.
    PromotedKeepsServing,
    /// A new primary decides from the members that answered, not waiting for all of
    /// them when none was complete: it can start from a copy missing acknowledged
    /// batches.
    TakeoverWithoutAllMembers,
    /// Coordinators ignore operation ids: a retry of an operation whose answer was lost
    /// runs again (a retried unlink answers ENOENT, a retried link EEXIST).
    ForgetDone,
    /// A retry that finds its operation recorded as done is answered at once, even
    /// while the intent that recorded it is still pending (a link answers the old link
    /// count).
    DoneBeforeFinished,
    /// A primary serves a copy its members do not all hold: it keeps serving after a
    /// batch that did not reach one, and serves after a takeover before they installed
    /// its copy. What it holds beyond them is read as durable (a retry finds its
    /// operation done in a batch the next primary never had).
    ServeAfterFailedBatch,
    /// A coordinator goes on driving its intent after losing the partition and getting
    /// it back, though another primary may have redone and finished it meanwhile (its
    /// steps apply twice: a link count off by one).
    DriveAcrossReigns,
    /// A partition whose placement moved leaves its earlier replicas at once (no
    /// [`crate::map::PartitionMove`]): with two of its replicas Down, a join can drop
    /// the only up-to-date copy, and the new replicas start from what the Down ones
    /// held.
    MoveWithoutHolders,
    /// A primary acknowledges batches as soon as it adopted a map that dropped a holder
    /// (no [`crate::service::read_fence::ReadFence`]): the dropped copy serves reads
    /// until its node adopts that map too, and misses what was acknowledged since.
    AckPastDroppedHolder,
    /// An rmdir or a rename trusts the counts of the directories it holds exclusively
    /// without asking whether an operation still owes them (no [`Quiet`] question):
    /// after a lock host took its partition over, or a coordinator's counts failed and
    /// its locks went after their lease, it removes a directory that still has an entry.
    ///
    /// [`Quiet`]: crate::service::wire::Quiet
    SkipQuiet,
}

impl Bug {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Bug::PromotedKeepsServing => "promoted-keeps-serving",
            Bug::TakeoverWithoutAllMembers => "takeover-without-all-members",
            Bug::ForgetDone => "forget-done",
            Bug::DoneBeforeFinished => "done-before-finished",
            Bug::ServeAfterFailedBatch => "serve-after-failed-batch",
            Bug::DriveAcrossReigns => "drive-across-reigns",
            Bug::MoveWithoutHolders => "move-without-holders",
            Bug::AckPastDroppedHolder => "ack-past-dropped-holder",
            Bug::SkipQuiet => "skip-quiet",
        }
    }

    /// Parses [`Bug::name`].
    pub fn parse(s: &str) -> Option<Bug> {
        [
            Bug::PromotedKeepsServing,
            Bug::TakeoverWithoutAllMembers,
            Bug::ForgetDone,
            Bug::DoneBeforeFinished,
            Bug::ServeAfterFailedBatch,
            Bug::DriveAcrossReigns,
            Bug::MoveWithoutHolders,
            Bug::AckPastDroppedHolder,
            Bug::SkipQuiet,
        ]
        .into_iter()
        .find(|b| b.name() == s)
    }
}

/// One simulation.
#[derive(Clone, Debug)]
pub struct Config {
    /// The seed: the same seed and settings replay the same run.
    pub seed: u64,
    /// Metadata nodes at the start.
    pub nodes: u32,
    /// Metadata partitions.
    pub partitions: u32,
    /// Client operations to finish (acknowledged or given up).
    pub ops: u64,
    /// Clients writing names and allocating numbers, each with one operation in flight.
    pub clients: u32,
    /// Clients running namespace operations (create, mkdir, link, unlink, rmdir,
    /// rename) in two directories of their own, each with one operation in flight.
    pub ns_clients: u32,
    /// Inject faults (crashes, cuts, failed writes, lossy network).
    pub faults: bool,
    /// At most this many nodes crashed or cut off at once.
    pub max_down: usize,
    /// Nodes that join during the run.
    pub joins: u32,
    /// Kill this fraction (percent) of the nodes at once after a quarter of the
    /// operations (never all three copies of a partition), and measure the time until
    /// every partition is fully replicated again (the dead are marked Down after 1 s,
    /// Out after 8 s, and their partitions re-placed).
    pub mass_failure_pct: u32,
    /// Nodes learn every map epoch in order, also those published while they were
    /// not looking (the metadata service does not yet: a node that skips an epoch
    /// stops serving its copies; this measures what a map history would change).
    pub map_history: bool,
    /// A node fetches a newer map at one heartbeat in five, not at each (the managers'
    /// answers are late or lost): nodes stay behind each other for longer.
    pub slow_maps: bool,
    /// Clients that only read, from any member of the map they have (fetching another
    /// only when a read fails), each read checked to see every name acknowledged before
    /// it was issued.
    pub readers: u32,
    /// A bug put back on purpose.
    pub bug: Option<Bug>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 1,
            nodes: 7,
            partitions: 16,
            ops: 400,
            clients: 8,
            ns_clients: 0,
            faults: true,
            max_down: 2,
            joins: 1,
            mass_failure_pct: 0,
            map_history: false,
            slow_maps: false,
            readers: 2,
            bug: None,
        }
    }
}

impl Config {
    /// The command that replays this run.
    pub fn replay(&self) -> String {
        let mut s = format!(
            "shingle sim --seed {} --nodes {} --partitions {} --ops {} --clients {} --ns-clients {} --max-down {} --joins {}",
            self.seed, self.nodes, self.partitions, self.ops, self.clients, self.ns_clients, self.max_down, self.joins
        );
        if !self.faults {
            s.push_str(" --no-faults");
        }
        if self.mass_failure_pct > 0 {
            s.push_str(&format!(" --mass-failure {}", self.mass_failure_pct));
        }
        if self.map_history {
            s.push_str(" --map-history");
        }
        if self.slow_maps {
            s.push_str(" --slow-maps");
        }
        s.push_str(&format!(" --readers {}", self.readers));
        if let Some(b) = self.bug {
            s.push_str(&format!(" --bug {}", b.name()));
        }
        s
    }
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Operations acknowledged to clients.
    pub acked: u64,
    /// Namespace operations acknowledged (included in `acked`).
    pub ns_ops: u64,
    /// Intents a primary redid for a coordinator that left them.
    pub intents_redone: u64,
    /// Reads answered (not counted in `acked`), each checked against the names
    /// acknowledged before it was issued.
    pub reads: u64,
    /// Operations a client gave up on (the partition had no serving primary for long).
    pub gave_up: u64,
    /// Messages sent while the cluster formed (first takeovers and installs).
    pub bootstrap_messages: u64,
    /// Messages sent after it formed, by kind.
    pub messages: std::collections::BTreeMap<&'static str, u64>,
    /// Messages lost by the network.
    pub dropped: u64,
    /// The longest time an operation took (virtual ms), retries included.
    pub longest_op_ms: u64,
    /// Virtual time the run took (ms).
    pub virtual_ms: u64,
    /// Events processed.
    pub events: u64,
    /// Crashes, cuts and joins injected.
    pub faults: u64,
    /// Partition copies installed (whole copies sent).
    pub installs: u64,
    /// Takeovers that began a reign.
    pub takeovers: u64,
    /// Nodes that joined.
    pub joined: u64,
    /// Partitions whose placement changed when those nodes joined.
    pub moved_by_joins: u64,
    /// Copies held per node at the end: (max, mean).
    pub balance: (u64, f64),
    /// After the mass failure: virtual ms until every partition had all members serving.
    pub repair_ms: Option<u64>,
}

impl Report {
    /// Messages of every kind.
    pub fn total_messages(&self) -> u64 {
        self.messages.values().sum()
    }
}

/// A broken invariant.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The run.
    pub config: Config,
    /// Virtual time (ms).
    pub at_ms: u64,
    /// What broke.
    pub what: String,
    /// The last events before it.
    pub log: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {} at {} ms: {}", self.config.seed, self.at_ms, self.what)?;
        writeln!(f, "replay: {}", self.config.replay())?;
        writeln!(f, "last events:")?;
        for l in &self.log {
            writeln!(f, "  {l}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

/// A small deterministic generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5368_696e_676c_6521)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `per_mille`/1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}
