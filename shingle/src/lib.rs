//! # shingle (library part)
//!
//! What the `shingle` binary promises to whoever starts it: the lines it prints on
//! standard output when it is ready. `shingle dev`, the benchmarks, the integration
//! tests and `scripts/with-dev-mount.sh` wait for these, so each is written once, here.

/// The lines the binary prints on standard output, each followed by a value.
pub mod banner {
    /// `shingle serve`, once its port is bound: the node's address follows.
    pub const LISTENING: &str = "shingle: node listening on ";
    /// `shingle dev`, once the FUSE mount answers: the mount point follows.
    pub const MOUNTED: &str = "shingle: mounted at ";
    /// `shingle dev --metrics-port`, before it mounts: the mount's metrics URL follows.
    pub const METRICS: &str = "shingle: metrics at ";
}
