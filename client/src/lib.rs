//! # shingle-client
//!
//! The client side of Shingle, used by `shingle mount`, `shingle dev` and the CLI tools.
//!
//! - [`fs`]: the client library: path resolution and namespace calls through the
//!   metadata client, file data as erasure-coded stripes (parallel shard reads, parity
//!   decode when a shard fails, readahead of whole stripes, write buffering to full
//!   stripes, commit on flush/fsync/close), bounded memory per open file.
//! - [`fuse`]: the FUSE adapter (fuser): every request runs as its own task.
//!
//! It talks to servers only through `shingle-transport` (via the meta and data
//! client helpers); it knows nothing of zones or Raft.

pub mod fs;
pub mod fuse;

pub use fs::{Client, ClientConfig, OpenFile, StatFs};
pub use fuse::{MountConfig, ShingleFs};
pub use fuser::BackgroundSession;

use std::path::Path;

/// Mounts `client` at `mountpoint`; the mount lives as long as the returned session
/// (dropping it unmounts).
pub fn mount(
    client: Client,
    rt: tokio::runtime::Handle,
    mountpoint: &Path,
    cfg: &MountConfig,
) -> std::io::Result<fuser::BackgroundSession> {
    use fuser::{Config, MountOption, SessionACL};
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("shingle".into()),
        MountOption::Subtype("shingle".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    if cfg.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(cfg.threads.max(1));
    config.clone_fd = cfg.threads > 1;
    let fs = ShingleFs::new(client, rt, cfg);
    fuser::spawn_mount(fs, mountpoint, &config)
}
