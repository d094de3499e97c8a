//! The node configuration file (`shingle serve --config node.toml`), with validation
//! and clear errors. Unknown keys are errors, so a typo never silently means a default.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A byte size: an integer, or a string with a unit ("256MiB", "4KiB", "1G").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Str(s) => parse_size(&s).map(ByteSize).map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

/// Parses "123", "4KiB", "256MiB", "1GiB", "2T" (binary units; the "iB"/"B" suffix is optional).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 4096, 64KiB, 256MiB)"))?;
    let mult: u64 = match unit.trim().trim_end_matches("iB").trim_end_matches('B') {
        "" => 1,
        "K" | "k" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        other => return Err(format!("unknown size unit '{other}' in '{s}' (use K, M, G, T)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size '{s}' is too large"))
}

/// A whole node configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Identity and network.
    pub node: NodeSection,
    /// The data role (omit for a node without data).
    pub data: Option<DataSection>,
    /// The manager role (a member of the Raft group holding the cluster map).
    pub manager: Option<ManagerSection>,
    /// The meta role (holds namespace partitions).
    pub meta: Option<MetaSection>,
    /// Log format and level (`SHINGLE_LOG` and `--log-format` override them).
    pub log: Option<LogSection>,
    /// RDMA for remote reads (`SHINGLE_RDMA*` variables override it; default auto).
    pub rdma: Option<crate::fabric::RdmaSettings>,
    /// OpenTelemetry traces over OTLP (`OTEL_*` variables override it; default off).
    pub trace: Option<crate::telemetry::TraceSection>,
    /// Prometheus metrics (`SHINGLE_METRICS_LISTEN` overrides it; default off).
    pub metrics: Option<MetricsSection>,
}

impl NodeConfig {
    /// A node with only its `[node]` table.
    pub fn new(node: NodeSection) -> NodeConfig {
        NodeConfig {
            node,
            data: None,
            manager: None,
            meta: None,
            log: None,
            rdma: None,
            trace: None,
            metrics: None,
        }
    }

    /// The config as the TOML `shingle serve --config` reads.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).context("write a node config")
    }

    /// [`NodeConfig::to_toml`] with extra `key = value` lines added to some of its tables
    /// (a table named that is made if missing; the extra lines win over the config's).
    pub fn to_toml_with(&self, extra: &[(&str, &str)]) -> Result<String> {
        let mut doc: toml::Table = toml::Table::try_from(self).context("write a node config")?;
        for (table, lines) in extra {
            let add: toml::Table = toml::from_str(lines).with_context(|| format!("extra [{table}] lines: {lines}"))?;
            if add.is_empty() {
                continue;
            }
            let t = doc
                .entry(table.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let toml::Value::Table(t) = t else {
                bail!("[{table}] is not a table");
            };
            t.extend(add);
        }
        toml::to_string(&doc).context("write a node config")
    }

    /// Writes the config to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_toml()?).with_context(|| format!("write {}", path.display()))
    }
}

impl NodeSection {
    /// `[node]` listening on `listen` with the secret in `secret_file`, defaults for
    /// the rest (a standalone node: no id, no cluster file).
    pub fn new(listen: SocketAddr, secret_file: &Path) -> NodeSection {
        NodeSection {
            listen,
            secret_file: secret_file.to_path_buf(),
            max_frame_bytes: default_frame(),
            id: None,
            cluster_file: None,
            domain: None,
            advertise: None,
        }
    }
}

impl DataSection {
    /// `[data]` in `dir` on an emulated zoned device of `zones` zones of `zone_size`
    /// bytes, defaults for the rest.
    pub fn emulated(dir: &Path, zones: u32, zone_size: u64) -> DataSection {
        DataSection {
            dir: dir.to_path_buf(),
            device: None,
            zones,
            zone_size: ByteSize(zone_size),
            block_size: default_block(),
            stage_cache: default_stage(),
            reserved_zones: default_reserved(),
            gc_when_free_below: default_gc_free(),
            sweep_interval_ms: default_sweep_interval(),
            scrub_interval_ms: default_scrub_interval(),
        }
    }
}

impl MetaSection {
    /// `[meta]` in `dir`, defaults for the rest.
    pub fn new(dir: &Path) -> MetaSection {
        MetaSection {
            dir: dir.to_path_buf(),
            rebuild_rate: default_rebuild_rate(),
            repair_interval_ms: default_repair_interval(),
            purge_interval_ms: default_purge_interval(),
            dead_coordinator_locks_ms: default_dead_coordinator_locks(),
        }
    }
}

impl ManagerSection {
    /// `[manager]` in `dir`, defaults for the rest.
    pub fn new(dir: &Path) -> ManagerSection {
        ManagerSection {
            dir: dir.to_path_buf(),
            down_after_ms: default_down_after(),
            down_phi: default_down_phi(),
            heartbeat_pause_ms: default_pause(),
            out_after_ms: default_out_after(),
            down_on_refused: default_true(),
        }
    }
}

/// `[metrics]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// Address of the `/metrics` endpoint (HTTP), e.g. `127.0.0.1:9464`.
    pub listen: SocketAddr,
    /// Allow an address other hosts can reach (the endpoint has no authentication;
    /// restrict who can reach the port). Default false: loopback addresses only.
    #[serde(default)]
    pub expose: bool,
}

/// `[log]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `text` (default) or `json` (one object per line).
    #[serde(default)]
    pub format: crate::logging::LogFormat,
    /// Level filter, e.g. `info` or `warn,shingle_meta=debug` (default `warn,openraft=error`).
    pub level: Option<String>,
}

/// `[manager]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagerSection {
    /// Directory of the Raft log and map.
    pub dir: PathBuf,
    /// Mark a node Down after this long without heartbeats, at the latest.
    #[serde(default = "default_down_after")]
    pub down_after_ms: u64,
    /// Phi-accrual suspicion of a node's heartbeat silence that marks it Down earlier.
    #[serde(default = "default_down_phi")]
    pub down_phi: f64,
    /// Silence tolerated beyond a node's usual heartbeat interval before φ rises.
    #[serde(default = "default_pause")]
    pub heartbeat_pause_ms: u64,
    /// Mark a Down node Out (rebuild its data elsewhere) after this long; 0: never.
    #[serde(default = "default_out_after")]
    pub out_after_ms: u64,
    /// A node reported unreachable whose address refuses connections (the leader
    /// checks) is marked Down at once, not after `down_after_ms` of silence.
    #[serde(default = "default_true")]
    pub down_on_refused: bool,
}

fn default_true() -> bool {
    true
}

fn default_down_after() -> u64 {
    4000
}

fn default_down_phi() -> f64 {
    8.0
}

fn default_pause() -> u64 {
    1000
}

fn default_out_after() -> u64 {
    600_000
}

/// `[meta]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaSection {
    /// Directory of the partition store.
    pub dir: PathBuf,
    /// Rebuild bandwidth of this node's repair scan (shards lost with a node).
    #[serde(default = "default_rebuild_rate")]
    pub rebuild_rate: ByteSize,
    /// Pause between repair passes (a map change starts one sooner).
    #[serde(default = "default_repair_interval")]
    pub repair_interval_ms: u64,
    /// Pause between passes that purge removed files' data (the partitions this node
    /// is primary of).
    #[serde(default = "default_purge_interval")]
    pub purge_interval_ms: u64,
    /// How long after a coordinator's node is marked Down its directory locks are freed
    /// when the partition of its operation cannot be seen settled (they normally go as
    /// soon as its new primary has redone what the coordinator left).
    #[serde(default = "default_dead_coordinator_locks")]
    pub dead_coordinator_locks_ms: u64,
}

fn default_dead_coordinator_locks() -> u64 {
    10_000
}

fn default_purge_interval() -> u64 {
    1_000
}

fn default_rebuild_rate() -> ByteSize {
    ByteSize(200 << 20)
}

fn default_repair_interval() -> u64 {
    10_000
}

/// The cluster file written by `shingle format`: what every node of a cluster shares.
#[derive(Clone, Debug, serde::Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// Random id; nodes refuse maps of another cluster.
    pub cluster_id: String,
    /// Metadata partitions (fixed).
    pub partitions: u32,
    /// Data placement groups (fixed).
    pub pgs: u32,
    /// Metadata replicas.
    pub replication: u8,
    /// Nodes per placement group (widest stripe k+m).
    pub pg_width: u8,
    /// Default erasure coding of new files: data shards.
    pub ec_k: u8,
    /// Default erasure coding of new files: parity shards.
    pub ec_m: u8,
    /// Writes need k + 1 shards on distinct nodes (no two shards of a stripe on one
    /// node, even with nodes down in a small cluster): stricter, and writes fail with
    /// EIO where the default would go on. Absent: false.
    #[serde(default)]
    pub distinct_homes: bool,
    /// The managers (Raft members): id and address.
    pub managers: Vec<ManagerEntry>,
}

/// A manager in the cluster file.
#[derive(Clone, Debug, serde::Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ManagerEntry {
    /// Node id.
    pub id: u64,
    /// Address.
    pub addr: SocketAddr,
}

impl ClusterFile {
    /// The map a cluster starts from: its geometry, no nodes yet.
    pub fn initial_map(&self) -> shingle_meta::map::ClusterMap {
        shingle_meta::map::ClusterMap::new(
            self.cluster_id.clone(),
            self.partitions,
            self.pgs,
            self.replication,
            self.pg_width,
        )
    }

    /// Reads and checks a cluster file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read cluster file {}", path.display()))?;
        let c: ClusterFile = toml::from_str(&text).with_context(|| format!("parse cluster file {}", path.display()))?;
        c.validate()
            .with_context(|| format!("invalid cluster file {}", path.display()))?;
        Ok(c)
    }

    /// Checks the numbers.
    pub fn validate(&self) -> Result<()> {
        if self.partitions == 0 || self.partitions > 1 << 20 {
            bail!("partitions must be between 1 and 1048576, got {}", self.partitions);
        }
        if self.pgs == 0 {
            bail!("pgs must be at least 1");
        }
        if self.replication == 0 {
            bail!("replication must be at least 1");
        }
        if self.ec_k == 0 || self.ec_m == 0 || u32::from(self.ec_k) + u32::from(self.ec_m) > 32 {
            bail!(
                "ec(k,m) needs k >= 1, m >= 1, k + m <= 32, got ec({},{})",
                self.ec_k,
                self.ec_m
            );
        }
        if u32::from(self.pg_width) < u32::from(self.ec_k) + u32::from(self.ec_m) {
            bail!(
                "pg_width ({}) must be at least k + m ({})",
                self.pg_width,
                self.ec_k + self.ec_m
            );
        }
        if self.managers.is_empty() {
            bail!("at least one manager is needed");
        }
        Ok(())
    }

    /// The manager addresses.
    pub fn manager_addrs(&self) -> Vec<SocketAddr> {
        self.managers.iter().map(|m| m.addr).collect()
    }
}

/// `[node]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// Address to listen on ("127.0.0.1:0" picks a free port, printed at start).
    pub listen: SocketAddr,
    /// File holding the cluster secret (mode 0600).
    pub secret_file: PathBuf,
    /// Largest frame payload.
    #[serde(default = "default_frame")]
    pub max_frame_bytes: ByteSize,
    /// Node id, unique in the cluster (required with a cluster file).
    pub id: Option<u64>,
    /// The cluster this node belongs to (written by `shingle format`); without it the node
    /// runs standalone (data role only, for tests and tools).
    pub cluster_file: Option<PathBuf>,
    /// Failure domain (host, rack); replicas go to distinct domains. Default: the node id.
    pub domain: Option<String>,
    /// Address other nodes use to reach this one (default: `listen`).
    pub advertise: Option<SocketAddr>,
}

fn default_frame() -> ByteSize {
    ByteSize(64 << 20)
}

/// `[data]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// Directory for the chunk index and, without `device`, the emulated zoned device.
    pub dir: PathBuf,
    /// A real zoned block device (host-managed SMR, ZNS, null_blk zoned) instead of emulation.
    pub device: Option<PathBuf>,
    /// Emulated device: number of zones.
    #[serde(default = "default_zones")]
    pub zones: u32,
    /// Emulated device: bytes per zone.
    #[serde(default = "default_zone_size")]
    pub zone_size: ByteSize,
    /// Emulated device: logical block size.
    #[serde(default = "default_block")]
    pub block_size: ByteSize,
    /// Memory for staging shards for remote reads.
    #[serde(default = "default_stage")]
    pub stage_cache: ByteSize,
    /// Empty zones kept for GC.
    #[serde(default = "default_reserved")]
    pub reserved_zones: u32,
    /// Run GC when fewer zones than this are free.
    #[serde(default = "default_gc_free")]
    pub gc_when_free_below: u32,
    /// Pause between sweeps for shards of dead inodes; an inode must be found dead at
    /// two sweeps this far apart before its shards are deleted.
    #[serde(default = "default_sweep_interval")]
    pub sweep_interval_ms: u64,
    /// Pause between scrubs of this node's chunks (every chunk re-read and verified;
    /// corrupt shards a layout names are rebuilt from their stripe).
    #[serde(default = "default_scrub_interval")]
    pub scrub_interval_ms: u64,
}

fn default_scrub_interval() -> u64 {
    86_400_000
}

fn default_sweep_interval() -> u64 {
    600_000
}

fn default_zones() -> u32 {
    64
}
fn default_zone_size() -> ByteSize {
    ByteSize(256 << 20)
}
fn default_block() -> ByteSize {
    ByteSize(4096)
}
fn default_stage() -> ByteSize {
    ByteSize(256 << 20)
}
fn default_reserved() -> u32 {
    1
}
fn default_gc_free() -> u32 {
    4
}

impl NodeConfig {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read config {}", path.display()))?;
        let cfg: NodeConfig = toml::from_str(&text).with_context(|| format!("parse config {}", path.display()))?;
        cfg.validate()
            .with_context(|| format!("invalid config {}", path.display()))?;
        Ok(cfg)
    }

    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<()> {
        if let Some(r) = &self.rdma {
            r.validate()?;
        }
        if let Some(t) = &self.trace {
            t.validate()?;
        }
        let clustered = self.node.cluster_file.is_some();
        self.node.validate()?;
        if let Some(level) = self.log.as_ref().and_then(|l| l.level.as_deref()) {
            crate::logging::parse_filter(level).context("log.level")?;
        }
        if !clustered && (self.manager.is_some() || self.meta.is_some()) {
            bail!("[manager] and [meta] need node.cluster_file (run `shingle format` first)");
        }
        if let Some(m) = &self.manager {
            m.validate()?;
        }
        if let Some(m) = &self.meta {
            m.validate()?;
        }
        if let Some(d) = &self.data {
            d.validate()?;
        }
        Ok(())
    }
}

impl NodeSection {
    fn validate(&self) -> Result<()> {
        let f = self.max_frame_bytes.0;
        if !(4096..=1 << 30).contains(&f) {
            bail!("node.max_frame_bytes must be between 4KiB and 1GiB, got {f}");
        }
        let clustered = self.cluster_file.is_some();
        if clustered && self.id.is_none_or(|i| i == 0) {
            bail!("node.id (a positive integer) is required with node.cluster_file");
        }
        if let Some(a) = self.advertise
            && (a.ip().is_unspecified() || a.port() == 0)
        {
            bail!("node.advertise must be an address other nodes can reach (a real IP and port), got {a}");
        }
        if clustered && self.listen.ip().is_unspecified() && self.advertise.is_none() {
            bail!(
                "node.listen is {} (every interface): set node.advertise to the address other nodes use to reach this one",
                self.listen
            );
        }
        Ok(())
    }
}

impl ManagerSection {
    fn validate(&self) -> Result<()> {
        if !(self.down_phi > 0.0 && self.down_phi.is_finite()) {
            bail!("manager.down_phi must be a positive number, got {}", self.down_phi);
        }
        if self.down_after_ms < 500 {
            bail!("manager.down_after_ms must be at least 500, got {}", self.down_after_ms);
        }
        if self.out_after_ms != 0 && self.out_after_ms < self.down_after_ms {
            bail!(
                "manager.out_after_ms ({}) must be 0 (never) or at least down_after_ms ({})",
                self.out_after_ms,
                self.down_after_ms
            );
        }
        Ok(())
    }
}

impl MetaSection {
    fn validate(&self) -> Result<()> {
        if self.rebuild_rate.0 == 0 {
            bail!("meta.rebuild_rate must be more than 0 (it is a bandwidth limit; 0 would stall rebuilds)");
        }
        if self.purge_interval_ms < 100 {
            bail!(
                "meta.purge_interval_ms must be at least 100, got {}",
                self.purge_interval_ms
            );
        }
        if self.repair_interval_ms < 100 {
            bail!(
                "meta.repair_interval_ms must be at least 100, got {}",
                self.repair_interval_ms
            );
        }
        Ok(())
    }
}

impl DataSection {
    fn validate(&self) -> Result<()> {
        if self.scrub_interval_ms < 1_000 {
            bail!(
                "data.scrub_interval_ms must be at least 1000, got {}",
                self.scrub_interval_ms
            );
        }
        if self.sweep_interval_ms < 1_000 {
            bail!(
                "data.sweep_interval_ms must be at least 1000, got {}",
                self.sweep_interval_ms
            );
        }
        let bs = self.block_size.0;
        if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
            bail!("data.block_size must be a power of two between 512 and 65536, got {bs}");
        }
        if self.zone_size.0 < 16 * bs || self.zone_size.0 % bs != 0 {
            bail!(
                "data.zone_size must be a multiple of block_size and at least 16 blocks, got {}",
                self.zone_size.0
            );
        }
        if self.zones < self.reserved_zones + 2 {
            bail!(
                "data.zones ({}) must exceed data.reserved_zones ({}) by at least 2",
                self.zones,
                self.reserved_zones
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_and_reject_nonsense() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn config_parses_validates_and_rejects_unknown_keys() {
        let ok = r#"
            [node]
            listen = "127.0.0.1:0"
            secret_file = "/tmp/s"
            [data]
            dir = "/tmp/d"
            zones = 8
            zone_size = "1MiB"
        "#;
        let c: NodeConfig = toml::from_str(ok).expect("parse");
        c.validate().expect("valid");
        assert_eq!(c.data.as_ref().expect("data").zone_size, ByteSize(1 << 20));
        let typo = ok.replace("zones = 8", "zonez = 8");
        assert!(toml::from_str::<NodeConfig>(&typo).is_err());
        let bad: NodeConfig = toml::from_str(&ok.replace("\"1MiB\"", "\"1000\"")).expect("parse");
        assert!(bad.validate().is_err());
    }

    /// The keys a section accepts, from serde's "unknown field" error (it lists them all).
    fn accepted_keys<T: serde::de::DeserializeOwned + std::fmt::Debug>() -> Vec<String> {
        let e = toml::from_str::<T>("__probe = 1")
            .expect_err("probe key accepted")
            .to_string();
        let list = e
            .split("expected")
            .nth(1)
            .unwrap_or_else(|| panic!("no key list in: {e}"));
        list.split('`').skip(1).step_by(2).map(str::to_string).collect()
    }

    #[test]
    fn reference_doc_examples_parse_and_validate() {
        let doc = include_str!("../../docs/config-reference.md");
        let mut nodes = 0;
        let mut clusters = 0;
        for block in doc.split("```toml\n").skip(1) {
            let text = block.split("\n```").next().expect("closed block");
            if text.contains("cluster_id") {
                let c: ClusterFile = toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
                c.validate().unwrap_or_else(|e| panic!("{e:#}\n{text}"));
                clusters += 1;
            } else {
                let c: NodeConfig = toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
                c.validate().unwrap_or_else(|e| panic!("{e:#}\n{text}"));
                if nodes == 0 {
                    // The complete example sets every role and table.
                    assert!(
                        c.manager.is_some()
                            && c.meta.is_some()
                            && c.data.is_some()
                            && c.log.is_some()
                            && c.rdma.is_some()
                            && c.trace.is_some()
                            && c.metrics.is_some()
                    );
                }
                nodes += 1;
            }
        }
        assert!(
            nodes >= 1 && clusters >= 1,
            "examples missing: {nodes} node, {clusters} cluster"
        );
        // Every table and key the code accepts has its row in the reference.
        for table in accepted_keys::<NodeConfig>() {
            assert!(doc.contains(&format!("## `[{table}]`")), "no section for [{table}]");
        }
        let sections = [
            ("node", accepted_keys::<NodeSection>()),
            ("manager", accepted_keys::<ManagerSection>()),
            ("meta", accepted_keys::<MetaSection>()),
            ("data", accepted_keys::<DataSection>()),
            ("log", accepted_keys::<LogSection>()),
            ("rdma", accepted_keys::<crate::fabric::RdmaSettings>()),
            ("trace", accepted_keys::<crate::telemetry::TraceSection>()),
            ("metrics", accepted_keys::<MetricsSection>()),
        ];
        for (table, keys) in sections {
            assert!(!keys.is_empty(), "{table}: {keys:?}");
            for k in keys {
                assert!(
                    doc.contains(&format!("| `{table}.{k}` |")),
                    "{table}.{k} is not documented"
                );
            }
        }
        for k in accepted_keys::<ClusterFile>() {
            assert!(
                doc.contains(&format!("| `{k}`")),
                "cluster file key {k} is not documented"
            );
        }
        // The node configs shown in the operations guide are valid too.
        let ops = include_str!("../../docs/operations.md");
        for block in ops.split("```toml\n").skip(1) {
            let text = block.split("\n```").next().expect("closed block");
            let c: NodeConfig = toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            c.validate().unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        }
    }

    #[test]
    fn wildcard_listen_needs_advertise_and_meta_limits_hold() {
        let base = "[node]\nid = 1\nlisten = \"0.0.0.0:7100\"\nsecret_file = \"/s\"\ncluster_file = \"/c\"\n";
        let c: NodeConfig = toml::from_str(base).expect("parse");
        assert!(format!("{:#}", c.validate().expect_err("no advertise")).contains("node.advertise"));
        let ok: NodeConfig = toml::from_str(&format!("{base}advertise = \"10.0.0.1:7100\"\n")).expect("parse");
        ok.validate().expect("valid");
        let zero: NodeConfig = toml::from_str(&format!("{base}advertise = \"0.0.0.0:7100\"\n")).expect("parse");
        assert!(zero.validate().is_err());
        let with = |meta: &str| -> NodeConfig {
            toml::from_str(&format!(
                "{base}advertise = \"10.0.0.1:7100\"\n[meta]\ndir = \"/m\"\n{meta}"
            ))
            .expect("parse")
        };
        assert!(with("rebuild_rate = 0\n").validate().is_err());
        assert!(with("repair_interval_ms = 0\n").validate().is_err());
        with("rebuild_rate = \"10MiB\"\nrepair_interval_ms = 100\n")
            .validate()
            .expect("valid");
    }
}
