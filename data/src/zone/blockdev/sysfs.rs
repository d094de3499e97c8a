//! The queue attributes of a zoned device that the ioctls do not give, read from sysfs.

use super::*;

/// The queue attributes of a zoned device that the ioctls do not give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct QueueLimits {
    /// `queue/max_open_zones` (0 = no limit, or an old kernel without it).
    pub(super) max_open_zones: u32,
    /// `queue/max_active_zones` (0 = no limit, or an old kernel without it).
    pub(super) max_active_zones: u32,
    /// `queue/chunk_sectors`: the zone size in sectors on a zoned device (0 = unknown).
    pub(super) chunk_sectors: u64,
}

/// The sysfs `queue` directory of the block device numbered `rdev`.
pub(super) fn sysfs_queue_dir(rdev: u64) -> PathBuf {
    let dev_dir = PathBuf::from(format!("/sys/dev/block/{}:{}", libc::major(rdev), libc::minor(rdev)));
    if dev_dir.join("partition").exists() {
        dev_dir.join("../queue")
    } else {
        dev_dir.join("queue")
    }
}

/// An optional numeric sysfs attribute: absent reads as 0.
pub(super) fn read_sysfs_number(path: &Path) -> ZoneResult<u64> {
    match std::fs::read_to_string(path) {
        Ok(text) => text.trim().parse::<u64>().map_err(|e| {
            ZoneError::io(
                format!("parse {}", path.display()),
                io::Error::new(io::ErrorKind::InvalidData, e),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(ZoneError::io(format!("read {}", path.display()), e)),
    }
}

/// Checks that `queue/zoned` names a zoned model and reads the limits.
pub(super) fn read_queue_limits(queue: &Path, device: &Path) -> ZoneResult<QueueLimits> {
    let shown = device.display();
    let zoned_path = queue.join("zoned");
    let model = std::fs::read_to_string(&zoned_path).map_err(|e| {
        ZoneError::Unsupported(format!(
            "{shown} is not a zoned block device (cannot read {}: {e})",
            zoned_path.display()
        ))
    })?;
    match model.trim() {
        "host-managed" | "host-aware" => {}
        "none" => {
            return Err(ZoneError::Unsupported(format!(
                "{shown} is not a zoned block device (queue/zoned = none)"
            )));
        }
        other => {
            return Err(ZoneError::Unsupported(format!(
                "{shown} is not a zoned block device this code knows (queue/zoned = {other})"
            )));
        }
    }
    let limit = |name: &str| -> ZoneResult<u32> {
        let path = queue.join(name);
        let value = read_sysfs_number(&path)?;
        u32::try_from(value).map_err(|e| {
            ZoneError::io(
                format!("parse {}", path.display()),
                io::Error::new(io::ErrorKind::InvalidData, e),
            )
        })
    };
    Ok(QueueLimits {
        max_open_zones: limit("max_open_zones")?,
        max_active_zones: limit("max_active_zones")?,
        chunk_sectors: read_sysfs_number(&queue.join("chunk_sectors"))?,
    })
}
