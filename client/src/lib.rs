//! # shingle-client
//!
//! The client side of Shingle, used by `shingle mount`, `shingle dev` and the CLI tools.
//!
//! - [`fs`]: the client library: path resolution and namespace calls through the
//!   metadata client, file data as erasure-coded stripes (parallel shard reads, parity
//!   decode when a shard fails, readahead of whole stripes, write buffering to full
//!   stripes, commit on flush/fsync/close), bounded memory per open file.
//! - [`fuse`]: the FUSE adapter (fuser): every request runs as its own task.
//! - [`content`]: the content of one open file as a pure core (which stripe version
//!   holds each byte, what to store and commit), checked against a reference model.
//! - [`absent`]: extended attributes known to be missing for a while (the mount's
//!   answer to the kernel's `security.capability` probe before every write).
//! - [`dirattrs`]: attributes of directories with this mount's own changes applied
//!   (the mount's answer to the kernel's re-read of a directory after each change).
//! - [`groups`]: callers' supplementary groups read from /proc, kept for the
//!   attribute TTL for requests that only read (reading them was a sixth of the
//!   mount's CPU in a storm of opens).
//!
//! It talks to servers only through `shingle-transport` (via the meta and data
//! client helpers); it knows nothing of zones or Raft. The nodes' own background work
//! (repair, purge and sweep, scrub-and-heal) lives with the server (`shingle serve`).

pub mod absent;
pub mod content;
pub mod dirattrs;
pub mod fs;
pub mod fuse;
pub mod groups;

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
    if cfg.read_only {
        config.mount_options.push(MountOption::RO);
    }
    config.n_threads = Some(cfg.threads.max(1));
    config.clone_fd = cfg.threads > 1;
    let fs = ShingleFs::new(client, rt, cfg);
    let session = fuser::spawn_mount(fs, mountpoint, &config)?;
    raise_readahead(mountpoint, cfg.readahead_kb);
    Ok(session)
}

/// The kernel sizes FUSE reads by the mount's readahead window (128 KiB by default);
/// raising it lets sequential reads arrive as 1 MiB requests. Needs root; otherwise
/// reads stay smaller and everything still works.
fn raise_readahead(mountpoint: &Path, kb: u32) {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = std::fs::metadata(mountpoint) else { return };
    let dev = md.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    if let Err(e) = std::fs::write(&path, kb.to_string()) {
        tracing::info!(path, error = %e, "cannot raise the readahead window; reads use the kernel default size");
    }
}

/// The erasure-coding policy of a layout: the one conversion between the metadata's
/// [`shingle_meta::namespace::Layout`] and the data path's [`shingle_data::ec::EcPolicy`]
/// (neither crate knows the other).
pub fn ec_policy(layout: &shingle_meta::namespace::Layout) -> shingle_data::ec::EcPolicy {
    shingle_data::ec::EcPolicy {
        k: layout.k,
        m: layout.m,
        unit: layout.unit,
    }
}
