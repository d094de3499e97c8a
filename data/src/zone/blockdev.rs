//! [`BlockZonedDevice`]: a real Linux zoned block device (host-managed SMR, NVMe ZNS, null_blk
//! with `zoned=1`) driven through the zoned-block ioctls of `<linux/blkzoned.h>`.
//!
//! Owns: one exclusive (`O_EXCL`) `O_DIRECT` descriptor on the device, and an in-memory cache of
//! every sequential zone's condition and write pointer. Must never: write anywhere but at a zone's
//! write pointer, read past a write pointer, or touch a conventional zone.
//!
//! # Design
//!
//! - **Zone numbering.** Only zones with a write pointer (sequential-write-required, and
//!   sequential-write-preferred on host-aware drives) whose length equals the device zone size
//!   are exposed, numbered from 0 in LBA order. Conventional zones (`BLK_ZONE_COND_NOT_WP`,
//!   typically the first few on SMR drives) are skipped: they have no write pointer, so the
//!   [`ZonedDevice`] contract (append-only, reset to reclaim) cannot be kept on them. A smaller
//!   last zone ("runt", allowed by Linux) is skipped too, so every exposed zone has the same size.
//! - **Units.** The trait speaks bytes relative to a zone's start; the ioctls speak 512-byte
//!   sectors always, whatever the logical block size (`BLKSSZGET`).
//! - **Capacity.** From `blk_zone.capacity` when the report carries `BLK_ZONE_REP_CAPACITY`
//!   (ZNS zones may be writable only up to a capacity below their size), else the zone length.
//!   [`Geometry::zone_capacity`] is the smallest capacity of a usable zone; each
//!   [`ZoneInfo::capacity`] is that zone's own.
//! - **Conditions.** `EMPTY` → Empty; `IMP_OPEN`/`EXP_OPEN` → Open; `CLOSED` → Closed; `FULL` →
//!   Full; `READONLY`, `OFFLINE` and reserved values → Offline (unusable).
//! - **Open limit.** [`Geometry::max_open_zones`] is the smaller non-zero of sysfs
//!   `queue/max_open_zones` and `queue/max_active_zones` (0 = no limit); the device refusing an
//!   open for lack of resources (`ETOOMANYREFS`, `EOVERFLOW`) maps to [`ZoneError::TooManyOpen`].
//! - **The write-pointer cache.** The device's write pointer is the truth. It is read with
//!   `BLKREPORTZONE` at open, by every [`ZonedDevice::report_zones`], after every zone management
//!   command, and after any failed read or write. In between, successful writes advance the
//!   cached pointer, which is exact because this process is the only writer (`O_EXCL`; a writer
//!   that opens without `O_EXCL` is not excluded by Linux and would break this). One mutex per
//!   zone serialises writes and management commands on that zone, so writes to different zones
//!   run in parallel. [`ZonedDevice::zone_info`] answers from the cache: its write pointer is
//!   exact, but a zone the device closed implicitly (to open another) still shows Open until the
//!   next report. If re-reading a zone after an error fails, the zone is cached as Offline until
//!   a later `report_zones` succeeds.
//! - **Finished zones.** A device reports a full zone's write pointer at its end: where the data
//!   stopped is not kept. Within one open, [`ZonedDevice::finish`] keeps the write pointer the
//!   zone had, as the trait asks; after reopening, a finished zone reports its write pointer at
//!   its capacity, and reads up to there return whatever the device has (zeroes on most).
//! - **Management commands.** Closing a zone that is not open is a no-op (ZBC does the same;
//!   null_blk would fail it); opening a full zone fails with [`ZoneError::ZoneFull`]; finishing a
//!   full zone is a no-op; every command on an Offline zone fails with [`ZoneError::Offline`].
//! - **Direct I/O.** Writes are whole aligned blocks (checked by [`check_write`]); a caller buffer
//!   that is not aligned in memory goes through an aligned bounce buffer. Reads may be unaligned:
//!   the covering block-aligned range is read into a bounce buffer and the wanted bytes copied
//!   out. The covering range never passes the write pointer (which is block-aligned), so strict
//!   host-managed drives that refuse reads of unwritten sectors are safe. Bounce buffers are at
//!   most `BOUNCE_LIMIT_BYTES` (1 MiB); longer transfers go in pieces.
//! - **Durability.** [`ZonedDevice::sync`] is `fdatasync` on the device (a cache flush); there
//!   is no narrower per-zone flush, so `sync_zone` is the same.
//! - **`unsafe`.** Only the ioctl calls and the aligned buffer need it; each such function carries
//!   its own `#[allow(unsafe_code)]` and each `unsafe` block a `SAFETY` argument. Reads and writes
//!   use the safe `pread`/`pwrite` wrappers of `std::os::unix::fs::FileExt`.

use std::alloc::{self, Layout};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{Geometry, ZoneError, ZoneId, ZoneInfo, ZoneResult, ZoneState, ZonedDevice, check_read, check_write};

// ---------------------------------------------------------------------------------------------
// Kernel ABI: <linux/blkzoned.h>, <linux/fs.h>, <asm-generic/ioctl.h>
// ---------------------------------------------------------------------------------------------

/// Bytes per sector in every zoned-block ioctl, whatever the logical block size.
const SECTOR_BYTES: u64 = 512;

/// The `_IOC` request-number encoding (`asm-generic/ioctl.h`, or the per-architecture variants).
mod ioc {
    #[cfg(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "mips32r6",
        target_arch = "mips64r6",
        target_arch = "sparc",
        target_arch = "sparc64"
    ))]
    mod arch {
        pub const SIZE_BITS: u32 = 13;
        pub const READ: u32 = 2;
        pub const WRITE: u32 = 4;
    }
    #[cfg(not(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "mips32r6",
        target_arch = "mips64r6",
        target_arch = "sparc",
        target_arch = "sparc64"
    )))]
    mod arch {
        pub const SIZE_BITS: u32 = 14;
        pub const READ: u32 = 2;
        pub const WRITE: u32 = 1;
    }

    const NR_SHIFT: u32 = 0;
    const TYPE_SHIFT: u32 = 8;
    const SIZE_SHIFT: u32 = 16;
    const DIR_SHIFT: u32 = SIZE_SHIFT + arch::SIZE_BITS;

    /// `_IOC(dir, type, nr, size)`.
    const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
        assert!(size < (1 << arch::SIZE_BITS), "ioctl argument too large for _IOC");
        assert!(ty < 256 && nr < 256, "ioctl type and number are 8 bits each");
        (dir << DIR_SHIFT) | (ty << TYPE_SHIFT) | (nr << NR_SHIFT) | ((size as u32) << SIZE_SHIFT)
    }

    /// `_IOR(type, nr, T)`: the kernel writes a `T`.
    pub const fn ior(ty: u32, nr: u32, size: usize) -> u32 {
        ioc(arch::READ, ty, nr, size)
    }

    /// `_IOW(type, nr, T)`: the kernel reads a `T`.
    pub const fn iow(ty: u32, nr: u32, size: usize) -> u32 {
        ioc(arch::WRITE, ty, nr, size)
    }

    /// `_IOWR(type, nr, T)`: both.
    pub const fn iowr(ty: u32, nr: u32, size: usize) -> u32 {
        ioc(arch::READ | arch::WRITE, ty, nr, size)
    }
}

/// Block-layer ioctl type (`0x12`, as in `BLKSSZGET = _IO(0x12, 104)`).
const BLK_IOC_TYPE: u32 = 0x12;

/// `BLKREPORTZONE = _IOWR(0x12, 130, struct blk_zone_report)`.
const BLKREPORTZONE: u32 = ioc::iowr(BLK_IOC_TYPE, 130, size_of::<BlkZoneReport>());
/// `BLKRESETZONE = _IOW(0x12, 131, struct blk_zone_range)`.
const BLKRESETZONE: u32 = ioc::iow(BLK_IOC_TYPE, 131, size_of::<BlkZoneRange>());
/// `BLKGETZONESZ = _IOR(0x12, 132, __u32)`: zone size in sectors.
const BLKGETZONESZ: u32 = ioc::ior(BLK_IOC_TYPE, 132, size_of::<u32>());
/// `BLKGETNRZONES = _IOR(0x12, 133, __u32)`: number of zones, conventional ones included.
const BLKGETNRZONES: u32 = ioc::ior(BLK_IOC_TYPE, 133, size_of::<u32>());
/// `BLKOPENZONE = _IOW(0x12, 134, struct blk_zone_range)`.
const BLKOPENZONE: u32 = ioc::iow(BLK_IOC_TYPE, 134, size_of::<BlkZoneRange>());
/// `BLKCLOSEZONE = _IOW(0x12, 135, struct blk_zone_range)`.
const BLKCLOSEZONE: u32 = ioc::iow(BLK_IOC_TYPE, 135, size_of::<BlkZoneRange>());
/// `BLKFINISHZONE = _IOW(0x12, 136, struct blk_zone_range)`.
const BLKFINISHZONE: u32 = ioc::iow(BLK_IOC_TYPE, 136, size_of::<BlkZoneRange>());

/// `enum blk_zone_type`.
const BLK_ZONE_TYPE_CONVENTIONAL: u8 = 0x1;
const BLK_ZONE_TYPE_SEQWRITE_REQ: u8 = 0x2;
const BLK_ZONE_TYPE_SEQWRITE_PREF: u8 = 0x3;

/// `enum blk_zone_cond`.
const BLK_ZONE_COND_NOT_WP: u8 = 0x0;
const BLK_ZONE_COND_EMPTY: u8 = 0x1;
const BLK_ZONE_COND_IMP_OPEN: u8 = 0x2;
const BLK_ZONE_COND_EXP_OPEN: u8 = 0x3;
const BLK_ZONE_COND_CLOSED: u8 = 0x4;
const BLK_ZONE_COND_READONLY: u8 = 0xD;
const BLK_ZONE_COND_FULL: u8 = 0xE;
const BLK_ZONE_COND_OFFLINE: u8 = 0xF;

/// `enum blk_zone_report_flags`: the descriptors' `capacity` field is valid.
const BLK_ZONE_REP_CAPACITY: u32 = 1 << 0;

/// `struct blk_zone`: one zone descriptor; all positions in 512-byte sectors.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlkZone {
    start: u64,
    len: u64,
    wp: u64,
    zone_type: u8,
    cond: u8,
    non_seq: u8,
    reset: u8,
    resv: [u8; 4],
    capacity: u64,
    reserved: [u8; 24],
}

impl BlkZone {
    const ZERO: BlkZone = BlkZone {
        start: 0,
        len: 0,
        wp: 0,
        zone_type: 0,
        cond: 0,
        non_seq: 0,
        reset: 0,
        resv: [0; 4],
        capacity: 0,
        reserved: [0; 24],
    };
}

/// `struct blk_zone_report` without its flexible array member `zones[]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlkZoneReport {
    sector: u64,
    nr_zones: u32,
    flags: u32,
}

/// `struct blk_zone_range`: argument of the zone management ioctls.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlkZoneRange {
    sector: u64,
    nr_sectors: u64,
}

/// Zone descriptors fetched per `BLKREPORTZONE` call.
const REPORT_BATCH_ZONES: usize = 256;

/// `struct blk_zone_report` followed by room for its `zones[]`, as the ioctl wants in memory.
#[repr(C)]
struct ReportBuffer {
    header: BlkZoneReport,
    zones: [BlkZone; REPORT_BATCH_ZONES],
}

// The layout the kernel ABI fixes; checked in every build.
const _: () = assert!(size_of::<BlkZone>() == 64);
const _: () = assert!(size_of::<BlkZoneReport>() == 16);
const _: () = assert!(size_of::<BlkZoneRange>() == 16);
const _: () = assert!(std::mem::offset_of!(ReportBuffer, zones) == size_of::<BlkZoneReport>());

/// A zone management command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ZoneOp {
    Reset,
    Open,
    Close,
    Finish,
}

impl ZoneOp {
    fn request(self) -> u32 {
        match self {
            ZoneOp::Reset => BLKRESETZONE,
            ZoneOp::Open => BLKOPENZONE,
            ZoneOp::Close => BLKCLOSEZONE,
            ZoneOp::Finish => BLKFINISHZONE,
        }
    }

    fn verb(self) -> &'static str {
        match self {
            ZoneOp::Reset => "reset",
            ZoneOp::Open => "open",
            ZoneOp::Close => "close",
            ZoneOp::Finish => "finish",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing zone descriptors (pure)
// ---------------------------------------------------------------------------------------------

/// A zone descriptor, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReportedZone {
    /// No write pointer: random-write space that Shingle does not use.
    Conventional { start_sector: u64, len_sectors: u64 },
    /// A zone with a write pointer.
    Sequential(SeqZone),
}

/// A sequential zone as the device reported it; byte quantities are relative to its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SeqZone {
    start_sector: u64,
    len_sectors: u64,
    capacity: u64,
    write_pointer: u64,
    state: ZoneState,
}

impl SeqZone {
    fn info(&self, id: ZoneId) -> ZoneInfo {
        ZoneInfo {
            id,
            capacity: self.capacity,
            write_pointer: self.write_pointer,
            state: self.state,
        }
    }
}

fn sectors_to_bytes(sectors: u64) -> Result<u64, String> {
    sectors
        .checked_mul(SECTOR_BYTES)
        .ok_or_else(|| format!("{sectors} sectors overflow a byte count"))
}

impl ReportedZone {
    /// Checks one descriptor of a report whose header carried `report_flags`.
    fn parse(raw: &BlkZone, report_flags: u32) -> Result<Self, String> {
        let start_sector = raw.start;
        if raw.len == 0 {
            return Err(format!("zone at sector {start_sector} has length 0"));
        }
        if start_sector.checked_add(raw.len).is_none() {
            return Err(format!(
                "zone at sector {start_sector} of {} sectors overflows",
                raw.len
            ));
        }
        match raw.zone_type {
            BLK_ZONE_TYPE_CONVENTIONAL => {
                return Ok(ReportedZone::Conventional {
                    start_sector,
                    len_sectors: raw.len,
                });
            }
            BLK_ZONE_TYPE_SEQWRITE_REQ | BLK_ZONE_TYPE_SEQWRITE_PREF => {}
            other => return Err(format!("zone at sector {start_sector} has unknown type {other:#x}")),
        }
        let capacity_sectors = if report_flags & BLK_ZONE_REP_CAPACITY != 0 {
            raw.capacity
        } else {
            raw.len
        };
        if capacity_sectors > raw.len {
            return Err(format!(
                "zone at sector {start_sector} has capacity {capacity_sectors} sectors above its length {}",
                raw.len
            ));
        }
        let capacity = sectors_to_bytes(capacity_sectors)?;
        let state = match raw.cond {
            BLK_ZONE_COND_EMPTY => ZoneState::Empty,
            BLK_ZONE_COND_IMP_OPEN | BLK_ZONE_COND_EXP_OPEN => ZoneState::Open,
            BLK_ZONE_COND_CLOSED => ZoneState::Closed,
            BLK_ZONE_COND_FULL => ZoneState::Full,
            BLK_ZONE_COND_NOT_WP => {
                return Err(format!(
                    "sequential zone at sector {start_sector} reports no write pointer"
                ));
            }
            BLK_ZONE_COND_READONLY | BLK_ZONE_COND_OFFLINE => ZoneState::Offline,
            // Values ZBC/ZAC reserve: nothing we can use either.
            _ => ZoneState::Offline,
        };
        let write_pointer = match state {
            ZoneState::Empty | ZoneState::Offline => 0,
            // Linux reports a full zone's write pointer at its end (ZBC leaves it undefined).
            ZoneState::Full => capacity,
            ZoneState::Open | ZoneState::Closed => {
                let written = raw.wp.checked_sub(start_sector).filter(|&w| w <= capacity_sectors);
                let Some(written) = written else {
                    return Err(format!(
                        "zone at sector {start_sector} has write pointer {} outside its capacity of {capacity_sectors} sectors",
                        raw.wp
                    ));
                };
                sectors_to_bytes(written)?
            }
        };
        if capacity == 0 && state != ZoneState::Offline {
            return Err(format!("usable zone at sector {start_sector} has capacity 0"));
        }
        Ok(ReportedZone::Sequential(SeqZone {
            start_sector,
            len_sectors: raw.len,
            capacity,
            write_pointer,
            state,
        }))
    }
}

/// Keeps the sequential zones of the device's size, in order; checks them against the block size.
fn usable_zones(reported: &[ReportedZone], zone_sectors: u64, block_size: u32) -> Result<Vec<SeqZone>, String> {
    let block = u64::from(block_size);
    let mut zones = Vec::with_capacity(reported.len());
    for zone in reported {
        let ReportedZone::Sequential(seq) = zone else { continue };
        if seq.len_sectors != zone_sectors {
            continue; // A smaller last zone: skipped so that every zone has the same size.
        }
        if seq.start_sector % zone_sectors != 0 {
            return Err(format!(
                "zone at sector {} is not aligned to the zone size",
                seq.start_sector
            ));
        }
        if seq.capacity % block != 0 || seq.write_pointer % block != 0 {
            return Err(format!(
                "zone at sector {}: capacity {} or write pointer {} is not a multiple of the {block}-byte block",
                seq.start_sector, seq.capacity, seq.write_pointer
            ));
        }
        if zones
            .last()
            .is_some_and(|previous: &SeqZone| seq.start_sector <= previous.start_sector)
        {
            return Err(format!("zone report goes backwards at sector {}", seq.start_sector));
        }
        zones.push(*seq);
    }
    Ok(zones)
}

/// The smaller of two limits where 0 means "no limit".
fn min_limit(a: u32, b: u32) -> u32 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (x, y) => x.min(y),
    }
}

fn geometry_of(zones: &[SeqZone], block_size: u32, limits: &QueueLimits) -> Result<Geometry, String> {
    let zone_count = u32::try_from(zones.len()).map_err(|_| format!("{} zones do not fit a u32", zones.len()))?;
    let zone_capacity = zones
        .iter()
        .filter(|z| z.state != ZoneState::Offline)
        .map(|z| z.capacity)
        .min()
        .ok_or_else(|| "no usable sequential zone".to_string())?;
    Ok(Geometry {
        zone_count,
        zone_capacity,
        block_size,
        max_open_zones: min_limit(limits.max_open_zones, limits.max_active_zones),
    })
}

/// A fresh report of a zone, merged into what this process knows: a device forgets where the
/// data of a finished zone ends, so keep the write pointer seen when the zone became full.
fn merge_report(cached: &ZoneInfo, fresh: ZoneInfo) -> ZoneInfo {
    if fresh.state == ZoneState::Full && cached.state == ZoneState::Full && cached.write_pointer <= fresh.capacity {
        ZoneInfo {
            write_pointer: cached.write_pointer,
            ..fresh
        }
    } else {
        fresh
    }
}

/// The block-aligned range `[start, end)` that covers the byte range `[offset, offset + len)`.
fn covering_range(offset: u64, len: u64, block: u64) -> (u64, u64) {
    let start = offset - offset % block;
    let end = (offset + len).next_multiple_of(block);
    (start, end)
}

// ---------------------------------------------------------------------------------------------
// sysfs
// ---------------------------------------------------------------------------------------------

/// The queue attributes of a zoned device that the ioctls do not give.
#[derive(Clone, Debug, PartialEq, Eq)]
struct QueueLimits {
    /// `queue/max_open_zones` (0 = no limit, or an old kernel without it).
    max_open_zones: u32,
    /// `queue/max_active_zones` (0 = no limit, or an old kernel without it).
    max_active_zones: u32,
    /// `queue/chunk_sectors`: the zone size in sectors on a zoned device (0 = unknown).
    chunk_sectors: u64,
}

/// The sysfs `queue` directory of the block device numbered `rdev`.
fn sysfs_queue_dir(rdev: u64) -> PathBuf {
    let dev_dir = PathBuf::from(format!("/sys/dev/block/{}:{}", libc::major(rdev), libc::minor(rdev)));
    if dev_dir.join("partition").exists() {
        dev_dir.join("../queue")
    } else {
        dev_dir.join("queue")
    }
}

/// An optional numeric sysfs attribute: absent reads as 0.
fn read_sysfs_number(path: &Path) -> ZoneResult<u64> {
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
fn read_queue_limits(queue: &Path, device: &Path) -> ZoneResult<QueueLimits> {
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

// ---------------------------------------------------------------------------------------------
// Device I/O seam: the kernel, or a model of it in tests
// ---------------------------------------------------------------------------------------------

/// The operations on a zoned block device, one syscall each.
trait ZoneIo: Send + Sync + std::fmt::Debug {
    /// `BLKSSZGET`.
    fn logical_block_size(&self) -> io::Result<u32>;
    /// `BLKGETZONESZ`, in sectors.
    fn zone_sectors(&self) -> io::Result<u32>;
    /// `BLKGETNRZONES`.
    fn zone_count(&self) -> io::Result<u32>;
    /// `BLKREPORTZONE` from the zone containing `sector`: fills the front of `out`; returns the
    /// number of descriptors and the report flags.
    fn report(&self, sector: u64, out: &mut [BlkZone]) -> io::Result<(usize, u32)>;
    /// A zone management ioctl.
    fn zone_op(&self, op: ZoneOp, range: BlkZoneRange) -> io::Result<()>;
    /// `pwrite`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    /// `pread`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// `fdatasync`.
    fn sync(&self) -> io::Result<()>;
}

/// The real device: a descriptor opened `O_RDWR | O_DIRECT | O_EXCL | O_CLOEXEC`.
#[derive(Debug)]
struct KernelIo {
    file: File,
}

fn ioctl_result(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl KernelIo {
    /// `BLKGETZONESZ` or `BLKGETNRZONES`: the kernel stores one `__u32`.
    #[allow(unsafe_code)]
    fn get_u32(&self, request: u32) -> io::Result<u32> {
        debug_assert!(request == BLKGETZONESZ || request == BLKGETNRZONES);
        let mut value: u32 = 0;
        // SAFETY: the descriptor is open for the whole call (owned by `self.file`); both requests
        // encode a 4-byte `__u32` argument, and `value` is a live, exclusively borrowed `u32`.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), request as libc::Ioctl, &mut value as *mut u32) };
        ioctl_result(rc)?;
        Ok(value)
    }
}

impl ZoneIo for KernelIo {
    #[allow(unsafe_code)]
    fn logical_block_size(&self) -> io::Result<u32> {
        let mut size: libc::c_int = 0;
        // SAFETY: the descriptor is open for the whole call; `BLKSSZGET` stores one `int`, and
        // `size` is a live, exclusively borrowed `c_int`.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), libc::BLKSSZGET, &mut size as *mut libc::c_int) };
        ioctl_result(rc)?;
        u32::try_from(size).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    fn zone_sectors(&self) -> io::Result<u32> {
        self.get_u32(BLKGETZONESZ)
    }

    fn zone_count(&self) -> io::Result<u32> {
        self.get_u32(BLKGETNRZONES)
    }

    #[allow(unsafe_code)]
    fn report(&self, sector: u64, out: &mut [BlkZone]) -> io::Result<(usize, u32)> {
        let wanted = out.len().min(REPORT_BATCH_ZONES);
        let mut buffer = Box::new(ReportBuffer {
            header: BlkZoneReport {
                sector,
                nr_zones: wanted as u32,
                flags: 0,
            },
            zones: [BlkZone::ZERO; REPORT_BATCH_ZONES],
        });
        // SAFETY: the descriptor is open for the whole call. The kernel reads the 16-byte header
        // and writes at most `header.nr_zones` (≤ REPORT_BATCH_ZONES) 64-byte descriptors right
        // after it, all inside `buffer`, which is `repr(C)` with `zones` at offset 16 (asserted
        // at compile time) and exclusively borrowed for the call; then it rewrites the header.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                BLKREPORTZONE as libc::Ioctl,
                &mut *buffer as *mut ReportBuffer,
            )
        };
        ioctl_result(rc)?;
        let count = buffer.header.nr_zones as usize;
        if count > wanted {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("BLKREPORTZONE returned {count} zones for {wanted} slots"),
            ));
        }
        out[..count].copy_from_slice(&buffer.zones[..count]);
        Ok((count, buffer.header.flags))
    }

    #[allow(unsafe_code)]
    fn zone_op(&self, op: ZoneOp, range: BlkZoneRange) -> io::Result<()> {
        // SAFETY: the descriptor is open for the whole call; every zone management request
        // encodes a 16-byte `struct blk_zone_range` that the kernel only reads, and `range` is a
        // live `BlkZoneRange` with that layout (asserted at compile time).
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                op.request() as libc::Ioctl,
                &range as *const BlkZoneRange,
            )
        };
        ioctl_result(rc).map(|_| ())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.file.write_at(buf, offset)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// Consecutive `EINTR`s tolerated in one transfer before giving up.
const MAX_INTERRUPTS: u32 = 64;

fn write_all_at(io: &dyn ZoneIo, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    let mut interrupts = 0;
    while done < buf.len() {
        match io.write_at(&buf[done..], offset + done as u64) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "device accepted no bytes")),
            Ok(n) => {
                done += n;
                interrupts = 0;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted && interrupts < MAX_INTERRUPTS => interrupts += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_exact_at(io: &dyn ZoneIo, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    let mut interrupts = 0;
    while done < buf.len() {
        match io.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "device returned no bytes")),
            Ok(n) => {
                done += n;
                interrupts = 0;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted && interrupts < MAX_INTERRUPTS => interrupts += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Aligned bounce buffer
// ---------------------------------------------------------------------------------------------

/// A zero-initialised heap buffer whose start is aligned for `O_DIRECT`; freed on drop.
struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

impl AlignedBuf {
    /// `len` bytes aligned to `align` (a power of two).
    #[allow(unsafe_code)]
    fn zeroed(len: usize, align: usize) -> io::Result<Self> {
        let size = len.max(1).next_multiple_of(align.max(1));
        let layout = Layout::from_size_align(size, align)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("bounce buffer layout: {e}")))?;
        // SAFETY: `layout` has a non-zero size (at least 1, rounded up).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Ok(AlignedBuf { ptr, len, layout })
    }

    #[allow(unsafe_code)]
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `layout.size() >= len` bytes allocated by `zeroed`, all
        // initialised (zeroed), owned by `self` and not freed before `self` is dropped; the
        // exclusive borrow of `self` makes this the only access meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `alloc_zeroed(self.layout)` and is freed only here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// ---------------------------------------------------------------------------------------------
// The device
// ---------------------------------------------------------------------------------------------

/// Largest bounce buffer used for one piece of an unaligned transfer.
const BOUNCE_LIMIT_BYTES: usize = 1 << 20;

/// Memory alignment of bounce buffers (at least the logical block size).
const BOUNCE_ALIGN_BYTES: usize = 4096;

/// What this process knows of one zone.
#[derive(Clone, Copy, Debug)]
struct CachedZone {
    info: ZoneInfo,
    /// Bumped on every change, so a device-wide report taken while a write was in flight does
    /// not overwrite the newer write pointer that write left.
    generation: u64,
}

#[derive(Debug)]
struct ZoneSlot {
    start_sector: u64,
    len_sectors: u64,
    cache: Mutex<CachedZone>,
}

impl ZoneSlot {
    fn start_bytes(&self) -> u64 {
        self.start_sector * SECTOR_BYTES
    }

    /// The zone's cache, locked. A panic while it was held left nothing half-done (every update
    /// is a single assignment), so a poisoned lock is simply taken over.
    fn lock(&self) -> MutexGuard<'_, CachedZone> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A real zoned block device; see the module documentation for the rules it keeps.
#[derive(Debug)]
pub struct BlockZonedDevice {
    io: Box<dyn ZoneIo>,
    path: PathBuf,
    geometry: Geometry,
    limits: QueueLimits,
    /// Zone size in sectors (`BLKGETZONESZ`).
    zone_sectors: u64,
    /// Zones reported by `BLKGETNRZONES`, conventional and runt ones included.
    device_zone_count: u32,
    /// The exposed (sequential, full-size) zones, indexed by [`ZoneId`].
    zones: Vec<ZoneSlot>,
    bounce_limit_bytes: usize,
}

impl BlockZonedDevice {
    /// Opens a zoned block device for exclusive direct I/O and reads its zones.
    ///
    /// Fails with [`ZoneError::Unsupported`] when `path` is not a block device or is a block
    /// device that is not zoned, and with [`ZoneError::Io`] when the device cannot be opened
    /// (`EBUSY`: another exclusive opener or a mount holds it; `EACCES`: not privileged).
    pub fn open(path: &Path) -> ZoneResult<Self> {
        let shown = path.display();
        let meta = std::fs::metadata(path).map_err(|e| ZoneError::io(format!("inspect {shown}"), e))?;
        if !meta.file_type().is_block_device() {
            let kind = if meta.is_file() {
                "a regular file"
            } else if meta.is_dir() {
                "a directory"
            } else if meta.file_type().is_char_device() {
                "a character device"
            } else {
                "not a block device"
            };
            return Err(ZoneError::Unsupported(format!(
                "{shown} is not a zoned block device (it is {kind}, not a block device)"
            )));
        }
        let limits = read_queue_limits(&sysfs_queue_dir(meta.rdev()), path)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_EXCL)
            .open(path)
            .map_err(|e| ZoneError::io(format!("open {shown} for exclusive direct I/O"), e))?;
        Self::with_io(
            Box::new(KernelIo { file }),
            path.to_path_buf(),
            limits,
            BOUNCE_LIMIT_BYTES,
        )
    }

    /// Reads the device's shape and zones through `io`.
    fn with_io(io: Box<dyn ZoneIo>, path: PathBuf, limits: QueueLimits, bounce_limit_bytes: usize) -> ZoneResult<Self> {
        let shown = path.display();
        let block_size = io
            .logical_block_size()
            .map_err(|e| ZoneError::io(format!("get the logical block size of {shown}"), e))?;
        if block_size < SECTOR_BYTES as u32 || !block_size.is_power_of_two() {
            return Err(ZoneError::Unsupported(format!(
                "{shown} has logical block size {block_size}"
            )));
        }
        let zone_sectors = u64::from(
            io.zone_sectors()
                .map_err(|e| ZoneError::io(format!("get the zone size of {shown}"), e))?,
        );
        if zone_sectors == 0 {
            return Err(ZoneError::Unsupported(format!(
                "{shown} reports a zone size of 0 (not zoned?)"
            )));
        }
        if limits.chunk_sectors != 0 && limits.chunk_sectors != zone_sectors {
            return Err(ZoneError::Unsupported(format!(
                "{shown}: BLKGETZONESZ says {zone_sectors} sectors per zone but queue/chunk_sectors says {}",
                limits.chunk_sectors
            )));
        }
        let device_zone_count = io
            .zone_count()
            .map_err(|e| ZoneError::io(format!("count the zones of {shown}"), e))?;
        let reported = report_all(io.as_ref(), device_zone_count, &path)?;
        let seq = usable_zones(&reported, zone_sectors, block_size).map_err(|e| bad_report(&path, e))?;
        let geometry =
            geometry_of(&seq, block_size, &limits).map_err(|e| ZoneError::Unsupported(format!("{shown}: {e}")))?;
        let zones = seq
            .iter()
            .enumerate()
            .map(|(i, z)| ZoneSlot {
                start_sector: z.start_sector,
                len_sectors: z.len_sectors,
                cache: Mutex::new(CachedZone {
                    info: z.info(ZoneId(i as u32)),
                    generation: 0,
                }),
            })
            .collect();
        let bounce_limit_bytes = bounce_limit_bytes.next_multiple_of(block_size as usize);
        Ok(BlockZonedDevice {
            io,
            path,
            geometry,
            limits,
            zone_sectors,
            device_zone_count,
            zones,
            bounce_limit_bytes,
        })
    }

    /// The device path this was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `queue/max_active_zones` (open plus closed zones at once; 0 = no limit).
    pub fn max_active_zones(&self) -> u32 {
        self.limits.max_active_zones
    }

    /// Zones on the device that are not exposed (conventional zones and a smaller last zone).
    pub fn skipped_zone_count(&self) -> u32 {
        self.device_zone_count - self.geometry.zone_count
    }

    fn slot(&self, zone: ZoneId) -> ZoneResult<&ZoneSlot> {
        self.zones.get(zone.0 as usize).ok_or(ZoneError::NoSuchZone(zone))
    }

    fn io_align(&self) -> usize {
        BOUNCE_ALIGN_BYTES.max(self.geometry.block_size as usize)
    }

    /// The device's current report of one exposed zone.
    fn report_one(&self, zone: ZoneId, slot: &ZoneSlot) -> ZoneResult<ZoneInfo> {
        let context = || format!("report {zone} of {}", self.path.display());
        let mut raw = [BlkZone::ZERO; 1];
        let (count, flags) = self
            .io
            .report(slot.start_sector, &mut raw)
            .map_err(|e| ZoneError::io(context(), e))?;
        if count != 1 || raw[0].start != slot.start_sector {
            return Err(bad_report(
                &self.path,
                format!("asked for the zone at sector {}, got {count}", slot.start_sector),
            ));
        }
        match ReportedZone::parse(&raw[0], flags).map_err(|e| bad_report(&self.path, e))? {
            ReportedZone::Sequential(seq) if seq.len_sectors == slot.len_sectors => Ok(seq.info(zone)),
            other => Err(bad_report(&self.path, format!("{zone} changed shape: {other:?}"))),
        }
    }

    /// After a failed command on `zone`, reloads its state from the device; when even that
    /// fails, keeps the zone Offline until a later [`ZonedDevice::report_zones`] succeeds.
    fn refresh_after_error(&self, zone: ZoneId, slot: &ZoneSlot, cached: &mut CachedZone) {
        match self.report_one(zone, slot) {
            Ok(fresh) => cached.info = merge_report(&cached.info, fresh),
            Err(e) => {
                tracing::warn!(device = %self.path.display(), %zone, error = %e, "cannot re-read zone after an error; treating it as offline");
                cached.info.state = ZoneState::Offline;
            }
        }
        cached.generation += 1;
    }

    /// Maps a failed write or zone command; zone-resource errors become [`ZoneError::TooManyOpen`].
    fn device_error(&self, error: io::Error, context: impl FnOnce() -> String) -> ZoneError {
        match error.raw_os_error() {
            Some(libc::ETOOMANYREFS) => ZoneError::TooManyOpen(self.limits.max_open_zones),
            Some(libc::EOVERFLOW) => ZoneError::TooManyOpen(self.limits.max_active_zones),
            _ => ZoneError::io(context(), error),
        }
    }

    /// `pwrite`s `data` at device byte `device_offset`, through a bounce buffer if `data` is not
    /// aligned in memory.
    fn write_device(&self, device_offset: u64, data: &[u8]) -> io::Result<()> {
        let block = self.geometry.block_size as usize;
        if (data.as_ptr() as usize) % block == 0 {
            return write_all_at(self.io.as_ref(), data, device_offset);
        }
        let mut bounce = AlignedBuf::zeroed(data.len().min(self.bounce_limit_bytes), self.io_align())?;
        let mut done = 0u64;
        for piece in data.chunks(self.bounce_limit_bytes) {
            let staged = &mut bounce.as_mut_slice()[..piece.len()];
            staged.copy_from_slice(piece);
            write_all_at(self.io.as_ref(), staged, device_offset + done)?;
            done += piece.len() as u64;
        }
        Ok(())
    }

    /// `pread`s `buf.len()` bytes from device byte `device_offset`, reading whole aligned blocks
    /// into a bounce buffer unless the request is already aligned.
    fn read_device(&self, device_offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let block = u64::from(self.geometry.block_size);
        let len = buf.len() as u64;
        if device_offset % block == 0 && len % block == 0 && (buf.as_ptr() as usize) % block as usize == 0 {
            return read_exact_at(self.io.as_ref(), buf, device_offset);
        }
        let end = device_offset + len;
        let (covered_start, covered_end) = covering_range(device_offset, len, block);
        let limit = self.bounce_limit_bytes as u64;
        let mut bounce = AlignedBuf::zeroed((covered_end - covered_start).min(limit) as usize, self.io_align())?;
        let mut position = device_offset;
        // Each piece copies at least one byte, so this ends after at most len / limit + 2 pieces.
        while position < end {
            let piece_start = position - position % block;
            let piece_end = covered_end.min(piece_start + limit);
            let staged = &mut bounce.as_mut_slice()[..(piece_end - piece_start) as usize];
            read_exact_at(self.io.as_ref(), staged, piece_start)?;
            let copy_end = piece_end.min(end);
            buf[(position - device_offset) as usize..(copy_end - device_offset) as usize]
                .copy_from_slice(&staged[(position - piece_start) as usize..(copy_end - piece_start) as usize]);
            position = copy_end;
        }
        Ok(())
    }

    /// Runs one zone management command and reloads the zone from the device.
    fn manage(&self, zone: ZoneId, op: ZoneOp) -> ZoneResult<()> {
        let slot = self.slot(zone)?;
        let mut cached = slot.lock();
        let before = cached.info;
        if before.state == ZoneState::Offline {
            return Err(ZoneError::Offline(zone));
        }
        match (op, before.state) {
            (ZoneOp::Close, ZoneState::Empty | ZoneState::Closed | ZoneState::Full) => return Ok(()),
            (ZoneOp::Finish, ZoneState::Full) => return Ok(()),
            (ZoneOp::Open, ZoneState::Full) => {
                return Err(ZoneError::ZoneFull {
                    zone,
                    offset: before.write_pointer,
                    len: 0,
                    capacity: before.capacity,
                });
            }
            _ => {}
        }
        let range = BlkZoneRange {
            sector: slot.start_sector,
            nr_sectors: slot.len_sectors,
        };
        if let Err(e) = self.io.zone_op(op, range) {
            self.refresh_after_error(zone, slot, &mut cached);
            return Err(self.device_error(e, || format!("{} {zone} of {}", op.verb(), self.path.display())));
        }
        let fresh = match self.report_one(zone, slot) {
            Ok(fresh) => fresh,
            Err(e) => {
                self.refresh_after_error(zone, slot, &mut cached);
                return Err(e);
            }
        };
        let after = match op {
            // Full "at its current write pointer": the device itself reports the end.
            ZoneOp::Finish if fresh.state == ZoneState::Full => ZoneInfo {
                write_pointer: before.write_pointer.min(fresh.capacity),
                ..fresh
            },
            _ => fresh,
        };
        cached.info = after;
        cached.generation += 1;
        let expected = match op {
            ZoneOp::Reset => after.state == ZoneState::Empty && after.write_pointer == 0,
            ZoneOp::Finish => after.state == ZoneState::Full,
            ZoneOp::Open | ZoneOp::Close => true,
        };
        if !expected {
            return Err(bad_report(
                &self.path,
                format!("{zone} is {after:?} after {}", op.verb()),
            ));
        }
        Ok(())
    }
}

/// Reads every zone descriptor of the device, in batches.
fn report_all(io: &dyn ZoneIo, device_zone_count: u32, path: &Path) -> ZoneResult<Vec<ReportedZone>> {
    let total = device_zone_count as usize;
    let mut zones = Vec::with_capacity(total);
    let mut batch = vec![BlkZone::ZERO; REPORT_BATCH_ZONES];
    let mut sector = 0u64;
    // Each round returns at least one zone or stops, so `total + 1` rounds are always enough.
    for _ in 0..=total {
        if zones.len() >= total {
            break;
        }
        let (count, flags) = io
            .report(sector, &mut batch)
            .map_err(|e| ZoneError::io(format!("report zones of {} from sector {sector}", path.display()), e))?;
        if count == 0 {
            break;
        }
        for raw in &batch[..count] {
            zones.push(ReportedZone::parse(raw, flags).map_err(|e| bad_report(path, e))?);
        }
        let last = &batch[count - 1];
        let next = last.start + last.len; // Cannot overflow: `parse` checked it.
        if next <= sector {
            return Err(bad_report(
                path,
                format!("report from sector {sector} does not advance"),
            ));
        }
        sector = next;
    }
    if zones.len() != total {
        return Err(bad_report(
            path,
            format!("reported {} zones, BLKGETNRZONES says {total}", zones.len()),
        ));
    }
    Ok(zones)
}

/// A zone report that breaks the kernel's own rules.
fn bad_report(path: &Path, problem: impl Into<String>) -> ZoneError {
    ZoneError::io(
        format!("read the zone report of {}", path.display()),
        io::Error::new(io::ErrorKind::InvalidData, problem.into()),
    )
}

impl ZonedDevice for BlockZonedDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn report_zones(&self) -> ZoneResult<Vec<ZoneInfo>> {
        let generations: Vec<u64> = self.zones.iter().map(|slot| slot.lock().generation).collect();
        let reported = report_all(self.io.as_ref(), self.device_zone_count, &self.path)?;
        let block_size = self.geometry.block_size;
        let fresh = usable_zones(&reported, self.zone_sectors, block_size).map_err(|e| bad_report(&self.path, e))?;
        if fresh.len() != self.zones.len() {
            return Err(bad_report(
                &self.path,
                format!("{} usable zones now, {} at open", fresh.len(), self.zones.len()),
            ));
        }
        let mut infos = Vec::with_capacity(self.zones.len());
        for (i, ((slot, seen), now)) in self.zones.iter().zip(generations).zip(fresh).enumerate() {
            let zone = ZoneId(i as u32);
            if now.start_sector != slot.start_sector {
                return Err(bad_report(
                    &self.path,
                    format!("{zone} moved to sector {}", now.start_sector),
                ));
            }
            let mut cached = slot.lock();
            // A command that ran on this zone since the report started knows better than it.
            if cached.generation == seen {
                cached.info = merge_report(&cached.info, now.info(zone));
                cached.generation += 1;
            }
            infos.push(cached.info);
        }
        Ok(infos)
    }

    fn zone_info(&self, zone: ZoneId) -> ZoneResult<ZoneInfo> {
        Ok(self.slot(zone)?.lock().info)
    }

    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> ZoneResult<()> {
        let slot = self.slot(zone)?;
        let mut cached = slot.lock();
        check_write(&cached.info, self.geometry.block_size, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.write_device(slot.start_bytes() + offset, data) {
            self.refresh_after_error(zone, slot, &mut cached);
            return Err(self.device_error(e, || {
                format!(
                    "write {} bytes at {offset} in {zone} of {}",
                    data.len(),
                    self.path.display()
                )
            }));
        }
        let info = &mut cached.info;
        info.write_pointer = offset + data.len() as u64;
        info.state = if info.write_pointer == info.capacity {
            ZoneState::Full
        } else {
            ZoneState::Open
        };
        cached.generation += 1;
        Ok(())
    }

    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> ZoneResult<()> {
        let slot = self.slot(zone)?;
        let info = slot.lock().info;
        check_read(&info, offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let (_, covered_end) = covering_range(offset, buf.len() as u64, u64::from(self.geometry.block_size));
        if covered_end > info.write_pointer {
            // The write pointer is block-aligned (checked when parsed), so this cannot happen;
            // a strict drive would fail such a read.
            return Err(ZoneError::ReadPastWritePointer {
                zone,
                offset,
                len: buf.len(),
                write_pointer: info.write_pointer,
            });
        }
        // The lock is not held: data below the write pointer does not change until a reset, and
        // a caller that resets a zone while reading it gets what the device returns.
        if let Err(e) = self.read_device(slot.start_bytes() + offset, buf) {
            let mut cached = slot.lock();
            self.refresh_after_error(zone, slot, &mut cached);
            return Err(ZoneError::io(
                format!(
                    "read {} bytes at {offset} in {zone} of {}",
                    buf.len(),
                    self.path.display()
                ),
                e,
            ));
        }
        Ok(())
    }

    fn sync(&self) -> ZoneResult<()> {
        self.io
            .sync()
            .map_err(|e| ZoneError::io(format!("flush {}", self.path.display()), e))
    }

    fn reset(&self, zone: ZoneId) -> ZoneResult<()> {
        self.manage(zone, ZoneOp::Reset)
    }

    fn open(&self, zone: ZoneId) -> ZoneResult<()> {
        self.manage(zone, ZoneOp::Open)
    }

    fn close(&self, zone: ZoneId) -> ZoneResult<()> {
        self.manage(zone, ZoneOp::Close)
    }

    fn finish(&self, zone: ZoneId) -> ZoneResult<()> {
        self.manage(zone, ZoneOp::Finish)
    }
}
