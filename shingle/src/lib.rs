//! # shingle (library part)
//!
//! Everything the `shingle` binary runs, as a library so the integration tests start
//! the same local clusters (`local`) and read the same configs (`config`) as
//! `shingle dev` and the benchmarks: a node (`serve`), the local dev cluster and
//! mount (`dev`, `local`), the tools (`cli`, `check`), the background daemons of a
//! node (`daemons`), the benchmarks (`bench`), and logs, traces and RDMA settings
//! (`logging`, `telemetry`, `fabric`). `banner` holds the lines the binary prints
//! when it is ready, which whoever starts it waits for.

pub mod access;
pub mod bench;
pub mod check;
pub mod cli;
pub mod config;
pub mod daemons;
pub mod dev;
pub mod fabric;
pub mod keys;
pub mod local;
pub mod logging;
pub mod progress;
pub mod serve;
pub mod sim;
pub mod telemetry;

/// The lines the binary prints on standard output when it is ready, each followed by a
/// value: what whoever starts it (`shingle dev`, the benchmarks, the integration
/// tests, `scripts/with-dev-mount.sh`) waits for.
pub mod banner {
    /// `shingle serve`, once its port is bound: the node's address follows.
    pub const LISTENING: &str = "shingle: node listening on ";
    /// `shingle dev`, once the FUSE mount answers: the mount point follows.
    pub const MOUNTED: &str = "shingle: mounted at ";
    /// `shingle dev --metrics-port`, before it mounts: the mount's metrics URL follows.
    pub const METRICS: &str = "shingle: metrics at ";
}
