//! Shingle's Prometheus metrics: one registry per process, the metric families every
//! crate records into, and the `/metrics` endpoint that serves them (OpenMetrics text).
//!
//! Recording is a lock-free atomic add (counters, gauges, histogram buckets) after a
//! read-locked lookup of the label set; label values are `&'static str`, so recording
//! allocates nothing. Values that already live elsewhere (a store's zone counters, the
//! Raft state, repair progress) are not mirrored on every change: a process registers
//! a hook with [`on_scrape`] that copies them into gauges when Prometheus scrapes.
//!
//! Names follow Prometheus conventions: `shingle_` prefix, base units (seconds, bytes),
//! `_total` on counters (added by the encoder). The families, their labels and what an
//! operator reads from them are listed in `docs/operations.md#metrics`; the Grafana
//! dashboard in `deploy/grafana/shingle.json` plots them.

pub mod http;

use parking_lot::{Mutex, RwLock};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::sync::LazyLock;
use std::sync::atomic::AtomicI64;

/// The label of RPC metrics: the message kind's name (`Lookup`, `WriteShard`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    /// The RPC's name, or its number (`0x0201`) when this process never named it.
    pub kind: &'static str,
}

/// An RPC's kind and the class of its answer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindCode {
    /// The RPC's name.
    pub kind: &'static str,
    /// `ok`, or the error class (`Application`, `DeadlineExceeded`, ...).
    pub code: &'static str,
}

/// An RPC's kind and the fabric it went over.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindFabric {
    /// The RPC's name.
    pub kind: &'static str,
    /// `tcp` or `rdma`.
    pub fabric: &'static str,
}

/// The fabric bytes went over.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Fabric {
    /// `tcp` or `rdma`.
    pub fabric: &'static str,
}

/// A filesystem operation as the kernel asked for it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Op {
    /// `read`, `write`, `lookup`, `getattr`, ...
    pub op: &'static str,
}

/// A state or kind of a gauge (`free`, `total`; `live`, `written`, `capacity`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct State {
    /// The state.
    pub state: &'static str,
}

/// Every metric family of a Shingle process. A labelled family appears in the
/// exposition once it has a series (a mount exports no zones); plain counters and
/// gauges always appear.
pub struct Metrics {
    /// Requests handled, by kind and answer.
    pub rpc_server_requests: Family<KindCode, Counter>,
    /// Time to handle a request, by kind: from dispatch to the handler's answer (time
    /// waiting for a connection's in-flight slot is not included).
    pub rpc_server_seconds: Family<Kind, Histogram>,
    /// Requests being handled now.
    pub rpc_server_inflight: Gauge,
    /// Calls made, by kind and fabric: the caller's latency (network included).
    pub rpc_client_seconds: Family<KindFabric, Histogram>,
    /// Calls that failed (transport errors and error answers), by kind.
    pub rpc_client_errors: Family<Kind, Counter>,
    /// Calls in flight from this process.
    pub rpc_client_inflight: Gauge,
    /// Bytes this process read from peers' regions (shards), by fabric.
    pub remote_read_bytes: Family<Fabric, Counter>,
    /// Bytes this node served to remote reads over TCP (RDMA READs bypass its CPU).
    pub remote_read_served_bytes: Counter,
    /// Filesystem operations through the mount, by operation: latency.
    pub fs_op_seconds: Family<Op, Histogram>,
    /// Filesystem operations that returned an error, by operation.
    pub fs_op_errors: Family<Op, Counter>,
    /// Bytes read through the mount.
    pub fs_read_bytes: Counter,
    /// Bytes written through the mount.
    pub fs_write_bytes: Counter,
    /// Stripe reads that needed parity (a shard missing, failed or slow).
    pub degraded_reads: Counter,
    /// Extra shard reads sent because a shard was slow (hedged requests).
    pub hedged_requests: Counter,
    /// Zones of this node's device, `total` and `free` (empty, writable).
    pub zones: Family<State, Gauge>,
    /// Bytes of this node's device: `capacity`, `written` (not yet reset), `live`.
    pub store_bytes: Family<State, Gauge>,
    /// Chunks (shards) indexed on this node.
    pub chunks: Gauge,
    /// Record bytes written for users since the store opened.
    pub store_user_written_bytes: Counter,
    /// Bytes garbage collection moved (copied forward) since the store opened.
    pub gc_moved_bytes: Counter,
    /// Zones garbage collection reset since the store opened.
    pub gc_zones_reset: Counter,
    /// Checkpoints of the chunk index (durable index commits) since the store opened.
    pub chunk_index_checkpoints: Counter,
    /// Records replayed into the chunk index from the zones when the store opened.
    pub chunk_index_replayed: Gauge,
    /// This meta node's repair scan: shards to rebuild in the current pass.
    pub repair_shards_todo: Gauge,
    /// Shards rebuilt in the current pass.
    pub repair_shards_done: Gauge,
    /// Shards to move (rebalance) in the current pass.
    pub repair_moves_todo: Gauge,
    /// Shards moved in the current pass.
    pub repair_moves_done: Gauge,
    /// Stripes with fewer than K readable shards at the last pass.
    pub repair_unreadable_stripes: Gauge,
    /// Stripes with two or more shards on one node at the last pass (written while
    /// their group had too few live nodes; repair spreads them first).
    pub repair_shared_stripes: Gauge,
    /// 1 while a repair pass runs.
    pub repair_running: Gauge,
    /// Removed files whose data waits for its purge (partitions this node is primary of).
    pub purges_pending: Gauge,
    /// Group commits of the metadata store (a log frame and its fdatasync, or a
    /// checkpoint: a redb transaction with its fsync): time.
    pub meta_store_commit_seconds: Histogram,
    /// Checkpoints of the metadata store's log (redb committed durably, the log
    /// started again).
    pub meta_store_checkpoints: Counter,
    /// Partition writes (a batch's records, or an install) persisted by group commits.
    pub meta_store_writes: Counter,
    /// Batches this node led as a partition's primary (each persisted here and
    /// replicated to the other members).
    pub meta_batches: Counter,
    /// Callers' writes those batches carried: writes to one partition that arrive
    /// while its batch is out share the next one.
    pub meta_batch_writes: Counter,
    /// Client operations that reached a partition's primary while its copy was still
    /// taking over and waited there for it to serve.
    pub meta_op_serve_waits: Counter,
    /// Map epochs a meta node learned of together and adopted one by one from the
    /// managers' history (its copies that stayed members kept serving).
    pub meta_map_epochs_stepped: Counter,
    /// Maps a meta node adopted without the one before (history not available): its
    /// copies stopped serving until they caught up.
    pub meta_map_epochs_skipped: Counter,
    /// Nodes a primary asked to confirm a map that dropped them from a partition before
    /// it acknowledged (read fencing after moves and restarts).
    pub meta_fence_calls: Counter,
    /// Repair passes finished since start.
    pub repair_passes: Counter,
    /// This manager's Raft term.
    pub raft_term: Gauge,
    /// 1 when this manager leads the Raft group.
    pub raft_leader: Gauge,
    /// Index of the last Raft entry applied to this manager's map.
    pub raft_applied_index: Gauge,
    /// Epoch of the cluster map this process holds.
    pub map_epoch: Gauge,
    /// Always 1; the `version` label says which build runs.
    pub build_info: Family<Version, Gauge>,
}

/// The build of a process.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Version {
    /// The crate version.
    pub version: &'static str,
}

fn latency() -> Histogram {
    // 50 µs .. 105 s, doubling.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 22))
}

impl Metrics {
    fn new() -> (Metrics, Registry) {
        let m = Metrics {
            rpc_server_requests: Family::default(),
            rpc_server_seconds: Family::new_with_constructor(latency),
            rpc_server_inflight: Gauge::default(),
            rpc_client_seconds: Family::new_with_constructor(latency),
            rpc_client_errors: Family::default(),
            rpc_client_inflight: Gauge::default(),
            remote_read_bytes: Family::default(),
            remote_read_served_bytes: Counter::default(),
            fs_op_seconds: Family::new_with_constructor(latency),
            fs_op_errors: Family::default(),
            fs_read_bytes: Counter::default(),
            fs_write_bytes: Counter::default(),
            degraded_reads: Counter::default(),
            hedged_requests: Counter::default(),
            zones: Family::default(),
            store_bytes: Family::default(),
            chunks: Gauge::default(),
            store_user_written_bytes: Counter::default(),
            gc_moved_bytes: Counter::default(),
            chunk_index_checkpoints: Counter::default(),
            chunk_index_replayed: Gauge::default(),
            gc_zones_reset: Counter::default(),
            repair_shards_todo: Gauge::default(),
            repair_shards_done: Gauge::default(),
            repair_moves_todo: Gauge::default(),
            repair_moves_done: Gauge::default(),
            repair_unreadable_stripes: Gauge::default(),
            repair_shared_stripes: Gauge::default(),
            repair_running: Gauge::default(),
            purges_pending: Gauge::default(),
            meta_store_commit_seconds: latency(),
            meta_store_writes: Counter::default(),
            meta_batches: Counter::default(),
            meta_batch_writes: Counter::default(),
            meta_op_serve_waits: Counter::default(),
            meta_store_checkpoints: Counter::default(),
            meta_map_epochs_stepped: Counter::default(),
            meta_map_epochs_skipped: Counter::default(),
            meta_fence_calls: Counter::default(),
            repair_passes: Counter::default(),
            raft_term: Gauge::default(),
            raft_leader: Gauge::default(),
            raft_applied_index: Gauge::default(),
            map_epoch: Gauge::default(),
            build_info: Family::default(),
        };
        let mut r = Registry::with_prefix("shingle");
        m.register_transport(&mut r);
        m.register_client(&mut r);
        m.register_data(&mut r);
        m.register_meta(&mut r);
        m.register_repair(&mut r);
        m.register_cluster(&mut r);
        m.build_info
            .get_or_create(&Version {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        (m, r)
    }

    /// Registers the transport's metrics: RPCs served and made, remote reads (every process).
    fn register_transport(&self, r: &mut Registry) {
        let s = Unit::Seconds;
        let b = Unit::Bytes;
        r.register(
            "rpc_server_requests",
            "Requests handled, by kind and answer",
            self.rpc_server_requests.clone(),
        );
        r.register_with_unit(
            "rpc_server",
            "Time to handle a request, by kind (dispatch to answer)",
            s.clone(),
            self.rpc_server_seconds.clone(),
        );
        r.register(
            "rpc_server_inflight",
            "Requests being handled now",
            self.rpc_server_inflight.clone(),
        );
        r.register_with_unit(
            "rpc_client",
            "Latency of calls made, by kind and fabric",
            s.clone(),
            self.rpc_client_seconds.clone(),
        );
        r.register(
            "rpc_client_errors",
            "Calls that failed, by kind",
            self.rpc_client_errors.clone(),
        );
        r.register(
            "rpc_client_inflight",
            "Calls in flight from this process",
            self.rpc_client_inflight.clone(),
        );
        r.register_with_unit(
            "remote_read",
            "Bytes read from peers' regions, by fabric",
            b.clone(),
            self.remote_read_bytes.clone(),
        );
        r.register_with_unit(
            "remote_read_served",
            "Bytes served to remote reads over TCP",
            b.clone(),
            self.remote_read_served_bytes.clone(),
        );
    }

    /// Registers a client's filesystem operations (the mount, the Python package).
    fn register_client(&self, r: &mut Registry) {
        let s = Unit::Seconds;
        let b = Unit::Bytes;
        r.register_with_unit(
            "fs_op",
            "Latency of filesystem operations through the mount",
            s,
            self.fs_op_seconds.clone(),
        );
        r.register(
            "fs_op_errors",
            "Filesystem operations that returned an error",
            self.fs_op_errors.clone(),
        );
        r.register_with_unit(
            "fs_read",
            "Bytes read through the mount",
            b.clone(),
            self.fs_read_bytes.clone(),
        );
        r.register_with_unit(
            "fs_write",
            "Bytes written through the mount",
            b.clone(),
            self.fs_write_bytes.clone(),
        );
        r.register(
            "degraded_reads",
            "Stripe reads that needed parity",
            self.degraded_reads.clone(),
        );
        r.register(
            "hedged_requests",
            "Extra shard reads sent because a shard was slow",
            self.hedged_requests.clone(),
        );
    }

    /// Registers a data node's zoned store and its garbage collection.
    fn register_data(&self, r: &mut Registry) {
        let b = Unit::Bytes;
        r.register("zones", "Zones of this node's device (total, free)", self.zones.clone());
        r.register_with_unit(
            "store",
            "Bytes of this node's device (capacity, written, live)",
            b.clone(),
            self.store_bytes.clone(),
        );
        r.register("chunks", "Chunks indexed on this node", self.chunks.clone());
        r.register_with_unit(
            "store_user_written",
            "Record bytes written for users since open",
            b.clone(),
            self.store_user_written_bytes.clone(),
        );
        r.register_with_unit(
            "gc_moved",
            "Bytes garbage collection moved since open",
            b,
            self.gc_moved_bytes.clone(),
        );
        r.register(
            "gc_zones_reset",
            "Zones garbage collection reset since open",
            self.gc_zones_reset.clone(),
        );
        r.register(
            "chunk_index_checkpoints",
            "Durable commits of the chunk index since open (puts wait for none)",
            self.chunk_index_checkpoints.clone(),
        );
        r.register(
            "chunk_index_replayed",
            "Records replayed into the chunk index from the zones at open (after a crash)",
            self.chunk_index_replayed.clone(),
        );
    }

    /// Registers a meta node's repair progress.
    fn register_repair(&self, r: &mut Registry) {
        r.register(
            "repair_shards_todo",
            "Shards to rebuild in the current repair pass",
            self.repair_shards_todo.clone(),
        );
        r.register(
            "repair_shards_done",
            "Shards rebuilt in the current repair pass",
            self.repair_shards_done.clone(),
        );
        r.register(
            "repair_moves_todo",
            "Shards to move in the current repair pass",
            self.repair_moves_todo.clone(),
        );
        r.register(
            "repair_moves_done",
            "Shards moved in the current repair pass",
            self.repair_moves_done.clone(),
        );
        r.register(
            "repair_unreadable_stripes",
            "Stripes with fewer than K readable shards",
            self.repair_unreadable_stripes.clone(),
        );
        r.register(
            "repair_shared_stripes",
            "Stripes with two or more shards on one node (reduced redundancy)",
            self.repair_shared_stripes.clone(),
        );
        r.register(
            "repair_running",
            "1 while a repair pass runs",
            self.repair_running.clone(),
        );
        r.register(
            "repair_passes",
            "Repair passes finished since start",
            self.repair_passes.clone(),
        );
    }

    /// Registers a meta node's store, batches, maps, read fences and purges.
    fn register_meta(&self, r: &mut Registry) {
        r.register_with_unit(
            "meta_store_commit",
            "Group commits of the metadata store (a log frame and its fdatasync, or a checkpoint)",
            Unit::Seconds,
            self.meta_store_commit_seconds.clone(),
        );
        r.register(
            "meta_store_writes",
            "Partition writes persisted by the metadata store's group commits",
            self.meta_store_writes.clone(),
        );
        r.register(
            "meta_batches",
            "Batches this node led as a partition's primary",
            self.meta_batches.clone(),
        );
        r.register(
            "meta_batch_writes",
            "Callers' writes carried by the batches this node led (several share one when they arrive together)",
            self.meta_batch_writes.clone(),
        );
        r.register(
            "meta_op_serve_waits",
            "Client operations that waited at a partition's new primary for its takeover to end",
            self.meta_op_serve_waits.clone(),
        );
        r.register(
            "meta_store_checkpoints",
            "Checkpoints of the metadata store's log (redb committed with fsync, the log started again)",
            self.meta_store_checkpoints.clone(),
        );
        r.register(
            "meta_map_epochs_stepped",
            "Map epochs learned together and adopted one by one from the managers' history",
            self.meta_map_epochs_stepped.clone(),
        );
        r.register(
            "meta_map_epochs_skipped",
            "Maps adopted without the one before (copies stop serving until caught up)",
            self.meta_map_epochs_skipped.clone(),
        );
        r.register(
            "meta_fence_calls",
            "Nodes asked to confirm a map that dropped them before a primary acknowledged",
            self.meta_fence_calls.clone(),
        );
        r.register(
            "purges_pending",
            "Removed files whose data waits for its purge (held open, or a data node unreachable)",
            self.purges_pending.clone(),
        );
    }

    /// Registers the manager's Raft state, the map epoch and the build.
    fn register_cluster(&self, r: &mut Registry) {
        r.register("raft_term", "This manager's Raft term", self.raft_term.clone());
        r.register("raft_leader", "1 when this manager leads", self.raft_leader.clone());
        r.register(
            "raft_applied_index",
            "Last Raft entry applied to the map",
            self.raft_applied_index.clone(),
        );
        r.register(
            "map_epoch",
            "Epoch of the cluster map this process holds",
            self.map_epoch.clone(),
        );
        r.register("build_info", "The build that runs (always 1)", self.build_info.clone());
    }
}

struct Global {
    metrics: Metrics,
    registry: Registry,
}

static GLOBAL: LazyLock<Global> = LazyLock::new(|| {
    let (metrics, registry) = Metrics::new();
    Global { metrics, registry }
});

type Hook = Box<dyn Fn(&Metrics) + Send + Sync>;
static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

/// The metrics of this process.
pub fn get() -> &'static Metrics {
    &GLOBAL.metrics
}

/// Runs `hook` before every scrape (to copy state kept elsewhere into gauges).
pub fn on_scrape(hook: impl Fn(&Metrics) + Send + Sync + 'static) {
    HOOKS.lock().push(Box::new(hook));
}

/// The exposition of every metric (OpenMetrics text), after running the scrape hooks.
pub fn render() -> String {
    let g = &*GLOBAL;
    for h in HOOKS.lock().iter() {
        h(&g.metrics);
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &g.registry);
    out
}

/// Raises `counter` to `value` (a monotonic count kept elsewhere, copied at scrape).
pub fn counter_to(counter: &Counter, value: u64) {
    let now = counter.get();
    if value > now {
        counter.inc_by(value - now);
    }
}

/// Sets a gauge from an unsigned count (saturating).
pub fn set(gauge: &Gauge<i64, AtomicI64>, value: u64) {
    gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
}

/// Names of message kinds, learned from the typed RPCs this process registers or calls.
static KIND_NAMES: LazyLock<RwLock<HashMap<u16, &'static str>>> = LazyLock::new(Default::default);

/// Names message kind `kind` (the first name given wins).
pub fn name_kind(kind: u16, name: &'static str) {
    if KIND_NAMES.read().contains_key(&kind) {
        return;
    }
    KIND_NAMES.write().entry(kind).or_insert(name);
}

/// The name of message kind `kind`: its RPC's name, else its number (`0x0201`),
/// formatted once per kind.
pub fn kind_name(kind: u16) -> &'static str {
    if let Some(n) = KIND_NAMES.read().get(&kind) {
        return n;
    }
    let mut names = KIND_NAMES.write();
    // At most 65536 kinds, each named once: the leak is bounded.
    names
        .entry(kind)
        .or_insert_with(|| Box::leak(format!("{kind:#06x}").into_boxed_str()))
}

/// The short name of a type (`shingle_meta::service::wire::Lookup` → `Lookup`).
pub fn short_type_name<T: ?Sized>() -> &'static str {
    let full = std::any::type_name::<T>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

/// Counts a gauge up for as long as it lives (in-flight requests).
pub struct InFlight(&'static Gauge<i64, AtomicI64>);

impl InFlight {
    /// Adds one to `g` until dropped.
    pub fn new(g: &'static Gauge<i64, AtomicI64>) -> InFlight {
        g.inc();
        InFlight(g)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_every_family_with_units_and_types() {
        get().fs_op_seconds.get_or_create(&Op { op: "read" }).observe(0.003);
        get()
            .remote_read_bytes
            .get_or_create(&Fabric { fabric: "tcp" })
            .inc_by(4096);
        on_scrape(|m| set(&m.chunks, 42));
        let text = render();
        for line in [
            "# TYPE shingle_fs_op_seconds histogram",
            "shingle_fs_op_seconds_count{op=\"read\"} 1",
            "# TYPE shingle_remote_read_bytes counter",
            "shingle_remote_read_bytes_total{fabric=\"tcp\"} 4096",
            "shingle_chunks 42",
            "# TYPE shingle_rpc_server_inflight gauge",
            "shingle_build_info{version=\"",
            "# EOF",
        ] {
            assert!(text.contains(line), "no `{line}` in:\n{text}");
        }
    }

    /// Every series the Grafana dashboard queries is one this process exports.
    #[test]
    fn the_dashboard_queries_only_metrics_that_exist() {
        // Families are exported once they have a series: give each one.
        let m = get();
        let (kind, code, fabric, op, state) = ("T", "ok", "tcp", "read", "free");
        m.rpc_server_requests.get_or_create(&KindCode { kind, code }).inc();
        m.rpc_server_seconds.get_or_create(&Kind { kind }).observe(0.1);
        m.rpc_client_seconds
            .get_or_create(&KindFabric { kind, fabric })
            .observe(0.1);
        m.rpc_client_errors.get_or_create(&Kind { kind }).inc();
        m.remote_read_bytes.get_or_create(&Fabric { fabric }).inc();
        m.fs_op_seconds.get_or_create(&Op { op }).observe(0.1);
        m.fs_op_errors.get_or_create(&Op { op }).inc();
        m.zones.get_or_create(&State { state }).set(1);
        m.store_bytes.get_or_create(&State { state }).set(1);
        let text = render();
        let types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../deploy/grafana/shingle.json")).expect("dashboard is JSON");
        let mut exprs = Vec::new();
        for p in dashboard["panels"].as_array().expect("panels") {
            for t in p["targets"].as_array().into_iter().flatten() {
                exprs.push(t["expr"].as_str().expect("expr").to_string());
            }
        }
        assert!(exprs.len() >= 20, "{} queries", exprs.len());
        let mut used = 0;
        for e in &exprs {
            for token in e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if !token.starts_with("shingle_") {
                    continue;
                }
                used += 1;
                let base = ["_bucket", "_count", "_sum", "_total"]
                    .iter()
                    .find_map(|s| token.strip_suffix(s).filter(|b| types.contains(b)))
                    .unwrap_or(token);
                assert!(
                    types.contains(&base),
                    "the dashboard queries `{token}`, which is not exported (in `{e}`)"
                );
            }
        }
        assert!(used >= 20);
    }

    #[test]
    fn kinds_are_named_once_and_unnamed_ones_by_number() {
        name_kind(0x7777, "Example");
        name_kind(0x7777, "Other");
        assert_eq!(kind_name(0x7777), "Example");
        assert_eq!(kind_name(0x7778), "0x7778");
        assert!(std::ptr::eq(kind_name(0x7778), kind_name(0x7778)));
        struct Lookup;
        assert_eq!(short_type_name::<Lookup>(), "Lookup");
        assert_eq!(short_type_name::<Vec<u8>>(), "Vec");
    }

    #[test]
    fn counters_follow_values_kept_elsewhere() {
        let c = Counter::<u64, std::sync::atomic::AtomicU64>::default();
        counter_to(&c, 10);
        counter_to(&c, 7);
        counter_to(&c, 12);
        assert_eq!(c.get(), 12);
    }
}
