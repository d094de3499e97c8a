//! Zoned devices: a row of zones, each written only at its write pointer and reclaimed
//! only by an explicit reset, as on host-managed SMR drives and ZNS SSDs.
//!
//! [`ZonedDevice`] is the one seam for storage I/O. Implementations:
//! - [`file::FileZonedDevice`]: emulation on ordinary files (the default), enforcing the
//!   same rules and recovering write pointers after a crash;
//! - [`blockdev::BlockZonedDevice`]: a real zoned block device through the Linux
//!   zoned-block ioctls (host-managed SMR, ZNS, null_blk in zoned mode);
//! - [`faulty::FaultyDevice`]: wraps any device to inject I/O errors and torn writes.
//!
//! All offsets are bytes relative to the start of a zone. Writes must be whole logical
//! blocks (`block_size`) and start exactly at the write pointer.

pub mod blockdev;
pub mod faulty;
pub mod file;

/// Index of a zone on its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ZoneId(pub u32);

impl std::fmt::Display for ZoneId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "zone {}", self.0)
    }
}

/// Zone condition, as the zoned-block interface reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneState {
    /// Write pointer at the start; nothing written.
    Empty,
    /// Written to (or explicitly opened) and accepting writes.
    Open,
    /// Partly written, not open; accepts writes (which reopen it).
    Closed,
    /// Write pointer at capacity, or finished: accepts no writes until reset.
    Full,
    /// Unusable (device-reported offline or read-only).
    Offline,
}

/// What a device reports about one zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZoneInfo {
    /// The zone.
    pub id: ZoneId,
    /// Writable bytes in the zone (may be less than the zone size on ZNS).
    pub capacity: u64,
    /// Bytes written so far: the next write must start here.
    pub write_pointer: u64,
    /// Condition.
    pub state: ZoneState,
}

/// Fixed shape of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Number of zones.
    pub zone_count: u32,
    /// Writable bytes per zone.
    pub zone_capacity: u64,
    /// Logical block size: writes are whole blocks, aligned to it.
    pub block_size: u32,
    /// Zones that may be open at once (0 = no limit).
    pub max_open_zones: u32,
}

/// Errors of zoned I/O.
#[derive(Debug, thiserror::Error)]
pub enum ZoneError {
    /// No such zone.
    #[error("{0} does not exist")]
    NoSuchZone(ZoneId),
    /// A write did not start at the write pointer.
    #[error("{zone}: write at {offset} is not at the write pointer {write_pointer}")]
    NotAtWritePointer {
        /// The zone.
        zone: ZoneId,
        /// Requested offset.
        offset: u64,
        /// Current write pointer.
        write_pointer: u64,
    },
    /// A write or read is not a whole number of aligned blocks.
    #[error("{zone}: {what} of {len} bytes at {offset} is not aligned to {block_size}-byte blocks")]
    Unaligned {
        /// The zone.
        zone: ZoneId,
        /// "write" or "read".
        what: &'static str,
        /// Offset.
        offset: u64,
        /// Length.
        len: usize,
        /// Block size.
        block_size: u32,
    },
    /// A write would go past the zone capacity, or the zone is full.
    #[error("{zone}: full (write of {len} bytes at {offset}, capacity {capacity})")]
    ZoneFull {
        /// The zone.
        zone: ZoneId,
        /// Offset.
        offset: u64,
        /// Length.
        len: usize,
        /// Capacity.
        capacity: u64,
    },
    /// A read past the write pointer (unwritten space).
    #[error("{zone}: read of {len} bytes at {offset} goes past the write pointer {write_pointer}")]
    ReadPastWritePointer {
        /// The zone.
        zone: ZoneId,
        /// Offset.
        offset: u64,
        /// Length.
        len: usize,
        /// Write pointer.
        write_pointer: u64,
    },
    /// Too many zones open.
    #[error("too many open zones (limit {0})")]
    TooManyOpen(u32),
    /// The zone is offline or read-only.
    #[error("{0} is offline")]
    Offline(ZoneId),
    /// The device does not support this (for example: not a zoned device).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// I/O error from the operating system.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl ZoneError {
    /// Wraps an OS error with a verb phrase saying what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ZoneError::Io {
            context: context.into(),
            source,
        }
    }

    /// True when the device is out of space (maps to ENOSPC for writers).
    pub fn is_no_space(&self) -> bool {
        match self {
            ZoneError::ZoneFull { .. } => true,
            ZoneError::Io { source, .. } => source.raw_os_error() == Some(libc::ENOSPC),
            _ => false,
        }
    }
}

/// Result of zoned I/O.
pub type ZoneResult<T> = Result<T, ZoneError>;

/// A zoned device. Methods are blocking; callers run them off the async runtime.
///
/// Contract (checked by the conformance tests in `tests/zone_conformance.rs` against
/// every implementation):
/// - `write` succeeds only at the write pointer, with whole aligned blocks, within
///   capacity; it advances the write pointer by the length written;
/// - after `sync` returns, everything written before it survives a crash;
/// - after a crash, `report_zones` gives write pointers at or after the last `sync` and
///   never past what was written (a torn tail is cut back to a block boundary);
/// - `reset` makes the zone empty; reads of it fail until it is written again;
/// - `finish` makes a zone full at its current write pointer.
pub trait ZonedDevice: Send + Sync {
    /// The device's shape.
    fn geometry(&self) -> Geometry;
    /// State of every zone.
    fn report_zones(&self) -> ZoneResult<Vec<ZoneInfo>>;
    /// State of one zone.
    fn zone_info(&self, zone: ZoneId) -> ZoneResult<ZoneInfo>;
    /// Writes `data` at `offset`, which must equal the write pointer.
    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> ZoneResult<()>;
    /// Reads exactly `buf.len()` bytes at `offset`, below the write pointer. Reads need
    /// not be block-aligned.
    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> ZoneResult<()>;
    /// Makes every completed write durable.
    fn sync(&self) -> ZoneResult<()>;
    /// Makes completed writes of one zone durable.
    fn sync_zone(&self, zone: ZoneId) -> ZoneResult<()> {
        let _ = zone;
        self.sync()
    }
    /// Rewinds the write pointer to zero; the zone's data is gone.
    fn reset(&self, zone: ZoneId) -> ZoneResult<()>;
    /// Explicitly opens a zone.
    fn open(&self, zone: ZoneId) -> ZoneResult<()>;
    /// Closes an open zone (keeps its data and write pointer).
    fn close(&self, zone: ZoneId) -> ZoneResult<()>;
    /// Moves a zone to full at its current write pointer.
    fn finish(&self, zone: ZoneId) -> ZoneResult<()>;
}

/// Checks alignment and bounds of a write against a zone; shared by implementations.
pub fn check_write(info: &ZoneInfo, block_size: u32, offset: u64, len: usize) -> ZoneResult<()> {
    let zone = info.id;
    if info.state == ZoneState::Offline {
        return Err(ZoneError::Offline(zone));
    }
    if offset % u64::from(block_size) != 0 || len % block_size as usize != 0 {
        return Err(ZoneError::Unaligned {
            zone,
            what: "write",
            offset,
            len,
            block_size,
        });
    }
    if info.state == ZoneState::Full || offset + len as u64 > info.capacity {
        return Err(ZoneError::ZoneFull {
            zone,
            offset,
            len,
            capacity: info.capacity,
        });
    }
    if offset != info.write_pointer {
        return Err(ZoneError::NotAtWritePointer {
            zone,
            offset,
            write_pointer: info.write_pointer,
        });
    }
    Ok(())
}

/// Checks that a read stays below the write pointer; shared by implementations.
pub fn check_read(info: &ZoneInfo, offset: u64, len: usize) -> ZoneResult<()> {
    if info.state == ZoneState::Offline {
        return Err(ZoneError::Offline(info.id));
    }
    match offset.checked_add(len as u64) {
        Some(end) if end <= info.write_pointer => Ok(()),
        _ => Err(ZoneError::ReadPastWritePointer {
            zone: info.id,
            offset,
            len,
            write_pointer: info.write_pointer,
        }),
    }
}
