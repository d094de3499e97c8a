//! `shingle sim`: the deterministic simulator of metadata replication
//! ([`shingle_meta::sim`]) from the command line — replay a seed a test printed, run
//! a long batch of seeds, or measure the protocol at a scale this machine cannot run
//! as processes (messages per operation, copies moved by a join, balance, time to
//! full redundancy after a mass failure).

use anyhow::{Result, bail};
use shingle_meta::sim::{self, Bug, Config, Report};
use std::time::Instant;

/// Arguments of `shingle sim`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How many seeds to run (seed, seed+1, ...).
    #[arg(long, default_value_t = 1)]
    pub seeds: u64,
    /// Metadata nodes.
    #[arg(long, default_value_t = 7)]
    pub nodes: u32,
    /// Metadata partitions.
    #[arg(long, default_value_t = 16)]
    pub partitions: u32,
    /// Client operations per seed.
    #[arg(long, default_value_t = 400)]
    pub ops: u64,
    /// Concurrent clients writing names and allocating numbers.
    #[arg(long, default_value_t = 8)]
    pub clients: u32,
    /// Concurrent clients running namespace operations (create, mkdir, link, unlink,
    /// rmdir, rename) in directories of their own, checked against a model.
    #[arg(long, default_value_t = 0)]
    pub ns_clients: u32,
    /// At most this many nodes crashed or cut off at once.
    #[arg(long, default_value_t = 2)]
    pub max_down: usize,
    /// Nodes that join during a run.
    #[arg(long, default_value_t = 0)]
    pub joins: u32,
    /// No crashes, cuts, failed writes or lost messages.
    #[arg(long)]
    pub no_faults: bool,
    /// Kill this percentage of the nodes at once and time the repair.
    #[arg(long, default_value_t = 0)]
    pub mass_failure: u32,
    /// Nodes learn every map epoch in order (what a map history in the managers would
    /// give; the metadata service does not have it yet).
    #[arg(long)]
    pub map_history: bool,
    /// Nodes fetch a newer map at one heartbeat in five (they stay behind each other
    /// for longer).
    #[arg(long)]
    pub slow_maps: bool,
    /// Clients that only read, from any member of the map they have, each read checked
    /// to see every name acknowledged before it.
    #[arg(long, default_value_t = 2)]
    pub readers: u32,
    /// Put a protocol bug back: promoted-keeps-serving, takeover-without-all-members,
    /// forget-done, done-before-finished, serve-after-failed-batch, drive-across-reigns,
    /// move-without-holders, ack-past-dropped-holder.
    #[arg(long)]
    pub bug: Option<String>,
}

/// Runs the seeds; fails on the first broken invariant, printing how to replay it.
pub fn run(a: SimArgs) -> Result<()> {
    let bug = match a.bug.as_deref() {
        None => None,
        Some(name) => match Bug::parse(name) {
            Some(b) => Some(b),
            None => bail!("unknown bug {name:?}"),
        },
    };
    let start = Instant::now();
    let mut total = Report::default();
    for seed in a.seed..a.seed.saturating_add(a.seeds.max(1)) {
        let cfg = Config {
            seed,
            nodes: a.nodes,
            partitions: a.partitions,
            ops: a.ops,
            clients: a.clients,
            ns_clients: a.ns_clients,
            faults: !a.no_faults,
            max_down: a.max_down,
            joins: a.joins,
            mass_failure_pct: a.mass_failure,
            map_history: a.map_history,
            slow_maps: a.slow_maps,
            readers: a.readers,
            bug,
        };
        match sim::run(&cfg) {
            Ok(r) => add(&mut total, &r),
            Err(f) => {
                println!("{f}");
                bail!("seed {seed} broke an invariant");
            }
        }
    }
    print(&a, &total, start.elapsed().as_secs_f64());
    Ok(())
}

fn add(t: &mut Report, r: &Report) {
    t.acked += r.acked;
    t.reads += r.reads;
    t.gave_up += r.gave_up;
    t.ns_ops += r.ns_ops;
    t.intents_redone += r.intents_redone;
    for (k, v) in &r.messages {
        *t.messages.entry(k).or_default() += v;
    }
    t.dropped += r.dropped;
    t.bootstrap_messages += r.bootstrap_messages;
    t.longest_op_ms = t.longest_op_ms.max(r.longest_op_ms);
    t.virtual_ms += r.virtual_ms;
    t.events += r.events;
    t.faults += r.faults;
    t.installs += r.installs;
    t.takeovers += r.takeovers;
    t.joined += r.joined;
    t.moved_by_joins += r.moved_by_joins;
    t.balance = (t.balance.0.max(r.balance.0), r.balance.1);
    t.repair_ms = match (t.repair_ms, r.repair_ms) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
}

fn print(a: &SimArgs, t: &Report, secs: f64) {
    println!(
        "{} seed(s) from {}: {} nodes, {} partitions, {} ops each; {:.1} s wall, {:.1} s virtual, {} events",
        a.seeds.max(1),
        a.seed,
        a.nodes,
        a.partitions,
        a.ops,
        secs,
        t.virtual_ms as f64 / 1000.0,
        t.events
    );
    println!(
        "operations: {} acknowledged ({} namespace operations), {} given up, {} reads checked; longest {} ms (virtual, retries included); intents redone {}",
        t.acked, t.ns_ops, t.gave_up, t.reads, t.longest_op_ms, t.intents_redone
    );
    let per_op = |n: u64| n as f64 / t.acked.max(1) as f64;
    let kinds: Vec<String> = t
        .messages
        .iter()
        .map(|(k, v)| format!("{k} {:.2}", per_op(*v)))
        .collect();
    println!(
        "messages per acknowledged operation: {:.2} ({}); {} lost",
        per_op(t.total_messages()),
        kinds.join(", "),
        t.dropped
    );
    println!(
        "forming the cluster: {} messages ({:.1} per partition); faults {}; takeovers {}; copies installed {}",
        t.bootstrap_messages,
        t.bootstrap_messages as f64 / f64::from(a.partitions) / a.seeds.max(1) as f64,
        t.faults,
        t.takeovers,
        t.installs
    );
    if t.joined > 0 {
        let per_join = t.moved_by_joins as f64 / t.joined as f64;
        println!(
            "joins: {}; partitions moved per join {:.1} of {} ({:.2} %; 1/N of the copies would be {:.2} %)",
            t.joined,
            per_join,
            a.partitions,
            100.0 * per_join / f64::from(a.partitions),
            100.0 * 3.0 / f64::from(a.nodes + 1),
        );
    }
    println!(
        "balance (last seed): copies per node max {} mean {:.1} (max/mean {:.2})",
        t.balance.0,
        t.balance.1,
        t.balance.0 as f64 / t.balance.1.max(1e-9)
    );
    if let Some(ms) = t.repair_ms {
        println!(
            "full redundancy again {ms} ms (virtual) after {} % of the nodes died",
            a.mass_failure
        );
    }
}
