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
                        "zone at sector {start_sector} has write pointer {} outside its {capacity_sectors}-sector capacity",
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

/// The ioctls that answer with one `__u32`.
#[derive(Clone, Copy, Debug)]
enum U32Query {
    /// `BLKGETZONESZ`.
    ZoneSectors,
    /// `BLKGETNRZONES`.
    ZoneCount,
}

impl KernelIo {
    #[allow(unsafe_code)]
    fn get_u32(&self, query: U32Query) -> io::Result<u32> {
        let request = match query {
            U32Query::ZoneSectors => BLKGETZONESZ,
            U32Query::ZoneCount => BLKGETNRZONES,
        };
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
        self.get_u32(U32Query::ZoneSectors)
    }

    fn zone_count(&self) -> io::Result<u32> {
        self.get_u32(U32Query::ZoneCount)
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
                tracing::warn!(
                    device = %self.path.display(),
                    %zone,
                    error = %e,
                    "cannot re-read zone after an error; treating it as offline"
                );
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    // ----- kernel ABI -----------------------------------------------------------------------

    /// Values of the macros in `<linux/blkzoned.h>` and `<linux/fs.h>` on the asm-generic
    /// layout (x86, arm, riscv, ...), as a C compiler prints them.
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
    #[test]
    fn request_numbers_match_the_kernel_header() {
        assert_eq!(BLKREPORTZONE, 0xC010_1282);
        assert_eq!(BLKRESETZONE, 0x4010_1283);
        assert_eq!(BLKGETZONESZ, 0x8004_1284);
        assert_eq!(BLKGETNRZONES, 0x8004_1285);
        assert_eq!(BLKOPENZONE, 0x4010_1286);
        assert_eq!(BLKCLOSEZONE, 0x4010_1287);
        assert_eq!(BLKFINISHZONE, 0x4010_1288);
        assert_eq!(u64::from(libc::BLKSSZGET as u32), 0x1268, "BLKSSZGET = _IO(0x12, 104)");
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
    #[test]
    fn request_numbers_decode_to_direction_type_number_and_size() {
        // (request, _IOC_DIR, _IOC_TYPE, _IOC_NR, _IOC_SIZE): READ = 2, WRITE = 1.
        let table = [
            (BLKREPORTZONE, 3, 0x12, 130, 16),
            (BLKRESETZONE, 1, 0x12, 131, 16),
            (BLKGETZONESZ, 2, 0x12, 132, 4),
            (BLKGETNRZONES, 2, 0x12, 133, 4),
            (BLKOPENZONE, 1, 0x12, 134, 16),
            (BLKCLOSEZONE, 1, 0x12, 135, 16),
            (BLKFINISHZONE, 1, 0x12, 136, 16),
        ];
        for (request, dir, ty, nr, size) in table {
            assert_eq!(request >> 30, dir, "{request:#x}");
            assert_eq!((request >> 16) & 0x3fff, size, "{request:#x}");
            assert_eq!((request >> 8) & 0xff, ty, "{request:#x}");
            assert_eq!(request & 0xff, nr, "{request:#x}");
        }
    }

    #[test]
    fn structs_have_the_kernel_layout() {
        use std::mem::{align_of, offset_of};
        assert_eq!(size_of::<BlkZone>(), 64);
        assert_eq!(align_of::<BlkZone>(), 8);
        assert_eq!(offset_of!(BlkZone, start), 0);
        assert_eq!(offset_of!(BlkZone, len), 8);
        assert_eq!(offset_of!(BlkZone, wp), 16);
        assert_eq!(offset_of!(BlkZone, zone_type), 24);
        assert_eq!(offset_of!(BlkZone, cond), 25);
        assert_eq!(offset_of!(BlkZone, non_seq), 26);
        assert_eq!(offset_of!(BlkZone, reset), 27);
        assert_eq!(offset_of!(BlkZone, resv), 28);
        assert_eq!(offset_of!(BlkZone, capacity), 32);
        assert_eq!(offset_of!(BlkZone, reserved), 40);
        assert_eq!(size_of::<BlkZoneReport>(), 16);
        assert_eq!(offset_of!(BlkZoneReport, sector), 0);
        assert_eq!(offset_of!(BlkZoneReport, nr_zones), 8);
        assert_eq!(offset_of!(BlkZoneReport, flags), 12);
        assert_eq!(size_of::<BlkZoneRange>(), 16);
        assert_eq!(offset_of!(BlkZoneRange, sector), 0);
        assert_eq!(offset_of!(BlkZoneRange, nr_sectors), 8);
        assert_eq!(offset_of!(ReportBuffer, zones), 16);
        assert_eq!(size_of::<ReportBuffer>(), 16 + 64 * REPORT_BATCH_ZONES);
    }

    // ----- parsing ----------------------------------------------------------------------------

    fn raw(start: u64, len: u64, wp: u64, zone_type: u8, cond: u8, capacity: u64) -> BlkZone {
        BlkZone {
            start,
            len,
            wp,
            zone_type,
            cond,
            capacity,
            ..BlkZone::ZERO
        }
    }

    fn seq(zone: ReportedZone) -> SeqZone {
        match zone {
            ReportedZone::Sequential(seq) => seq,
            other => panic!("expected a sequential zone, got {other:?}"),
        }
    }

    #[test]
    fn parses_each_condition() {
        let flags = BLK_ZONE_REP_CAPACITY;
        let empty = seq(ReportedZone::parse(&raw(1024, 512, 1024, 2, 1, 384), flags).expect("empty"));
        assert_eq!(
            empty,
            SeqZone {
                start_sector: 1024,
                len_sectors: 512,
                capacity: 384 * 512,
                write_pointer: 0,
                state: ZoneState::Empty
            }
        );
        assert_eq!(
            empty.info(ZoneId(7)),
            ZoneInfo {
                id: ZoneId(7),
                capacity: 384 * 512,
                write_pointer: 0,
                state: ZoneState::Empty
            }
        );
        for cond in [BLK_ZONE_COND_IMP_OPEN, BLK_ZONE_COND_EXP_OPEN] {
            let open = seq(ReportedZone::parse(&raw(1024, 512, 1024 + 16, 2, cond, 384), flags).expect("open"));
            assert_eq!((open.state, open.write_pointer), (ZoneState::Open, 16 * 512));
        }
        let closed = seq(ReportedZone::parse(&raw(1024, 512, 1024 + 8, 3, 4, 384), flags).expect("closed"));
        assert_eq!((closed.state, closed.write_pointer), (ZoneState::Closed, 8 * 512));
        // Linux reports a full zone's write pointer at the zone end, past the capacity.
        let full = seq(ReportedZone::parse(&raw(1024, 512, 1536, 2, 0xE, 384), flags).expect("full"));
        assert_eq!((full.state, full.write_pointer), (ZoneState::Full, 384 * 512));
        for cond in [BLK_ZONE_COND_READONLY, BLK_ZONE_COND_OFFLINE, 0x5, 0xC, 0xFF] {
            let dead = seq(ReportedZone::parse(&raw(1024, 512, u64::MAX, 2, cond, 0), flags).expect("offline"));
            assert_eq!(dead.state, ZoneState::Offline, "cond {cond:#x}");
        }
    }

    #[test]
    fn capacity_is_the_length_without_the_capacity_flag() {
        let zone = seq(ReportedZone::parse(&raw(0, 512, 0, 2, 1, 0), 0).expect("parse"));
        assert_eq!(zone.capacity, 512 * 512);
        let zone = seq(ReportedZone::parse(&raw(0, 512, 0, 2, 1, 100), BLK_ZONE_REP_CAPACITY).expect("parse"));
        assert_eq!(zone.capacity, 100 * 512);
    }

    #[test]
    fn conventional_zones_are_recognised() {
        let zone = ReportedZone::parse(&raw(0, 512, u64::MAX, 1, 0, 512), BLK_ZONE_REP_CAPACITY).expect("parse");
        assert_eq!(
            zone,
            ReportedZone::Conventional {
                start_sector: 0,
                len_sectors: 512
            }
        );
    }

    #[test]
    fn rejects_descriptors_that_break_the_rules() {
        let flags = BLK_ZONE_REP_CAPACITY;
        let bad = [
            raw(0, 0, 0, 2, 1, 0),                 // zero length
            raw(u64::MAX - 1, 512, 0, 2, 1, 512),  // overflowing end
            raw(0, 512, 0, 9, 1, 512),             // unknown type
            raw(0, 512, 0, 2, 1, 513),             // capacity above length
            raw(0, 512, 0, 2, 0, 512),             // sequential without a write pointer
            raw(1024, 512, 1000, 2, 2, 512),       // write pointer before the start
            raw(1024, 512, 1024 + 400, 2, 4, 384), // write pointer past the capacity
            raw(0, 512, 0, 2, 1, 0),               // usable zone with no capacity
        ];
        for zone in bad {
            assert!(ReportedZone::parse(&zone, flags).is_err(), "{zone:?} should be refused");
        }
    }

    #[test]
    fn usable_zones_skip_conventional_and_runt_zones() {
        let reported: Vec<ReportedZone> = [
            raw(0, 64, u64::MAX, 1, 0, 64),
            raw(64, 64, 64, 2, 1, 48),
            raw(128, 64, 136, 2, 2, 48),
            raw(192, 32, 192, 2, 1, 32),
        ]
        .iter()
        .map(|z| ReportedZone::parse(z, BLK_ZONE_REP_CAPACITY).expect("parse"))
        .collect();
        let zones = usable_zones(&reported, 64, 4096).expect("usable");
        assert_eq!(zones.iter().map(|z| z.start_sector).collect::<Vec<_>>(), vec![64, 128]);
        assert_eq!(zones[1].write_pointer, 4096);
    }

    #[test]
    fn usable_zones_refuse_misaligned_or_unordered_reports() {
        let parse = |z: BlkZone| ReportedZone::parse(&z, BLK_ZONE_REP_CAPACITY).expect("parse");
        // Write pointer one sector past a 4 KiB block.
        assert!(usable_zones(&[parse(raw(0, 64, 9, 2, 2, 48))], 64, 4096).is_err());
        // Capacity not a whole number of blocks.
        assert!(usable_zones(&[parse(raw(0, 64, 0, 2, 1, 47))], 64, 4096).is_err());
        // Zone start not a multiple of the zone size.
        assert!(usable_zones(&[parse(raw(32, 64, 32, 2, 1, 48))], 64, 4096).is_err());
        // Going backwards.
        assert!(
            usable_zones(
                &[parse(raw(64, 64, 64, 2, 1, 48)), parse(raw(0, 64, 0, 2, 1, 48))],
                64,
                4096
            )
            .is_err()
        );
    }

    #[test]
    fn geometry_uses_the_smallest_usable_capacity_and_tightest_limit() {
        let zone = |capacity, state| SeqZone {
            start_sector: 0,
            len_sectors: 64,
            capacity,
            write_pointer: 0,
            state,
        };
        let zones = [
            zone(8192, ZoneState::Empty),
            zone(4096, ZoneState::Closed),
            zone(0, ZoneState::Offline),
        ];
        let limits = QueueLimits {
            max_open_zones: 14,
            max_active_zones: 12,
            chunk_sectors: 64,
        };
        let geometry = geometry_of(&zones, 4096, &limits).expect("geometry");
        assert_eq!(
            geometry,
            Geometry {
                zone_count: 3,
                zone_capacity: 4096,
                block_size: 4096,
                max_open_zones: 12
            }
        );
        assert!(geometry_of(&[zone(0, ZoneState::Offline)], 4096, &limits).is_err());
        assert_eq!(
            (min_limit(0, 0), min_limit(0, 5), min_limit(7, 0), min_limit(7, 5)),
            (0, 5, 7, 5)
        );
    }

    #[test]
    fn merge_keeps_the_write_pointer_of_a_zone_seen_full() {
        let info = |write_pointer, state| ZoneInfo {
            id: ZoneId(0),
            capacity: 8192,
            write_pointer,
            state,
        };
        let finished = info(4096, ZoneState::Full);
        assert_eq!(merge_report(&finished, info(8192, ZoneState::Full)), finished);
        // Anything else: the device wins.
        assert_eq!(
            merge_report(&info(4096, ZoneState::Open), info(8192, ZoneState::Full)),
            info(8192, ZoneState::Full)
        );
        assert_eq!(
            merge_report(&finished, info(0, ZoneState::Empty)),
            info(0, ZoneState::Empty)
        );
        assert_eq!(
            merge_report(&info(0, ZoneState::Empty), info(4096, ZoneState::Open)),
            info(4096, ZoneState::Open)
        );
    }

    #[test]
    fn covering_range_rounds_out_to_blocks() {
        assert_eq!(covering_range(0, 4096, 4096), (0, 4096));
        assert_eq!(covering_range(1, 1, 4096), (0, 4096));
        assert_eq!(covering_range(4095, 2, 4096), (0, 8192));
        assert_eq!(covering_range(8192, 0, 4096), (8192, 8192));
        assert_eq!(covering_range(5000, 10_000, 512), (4608, 15_360));
    }

    #[test]
    fn aligned_buffers_are_aligned_zeroed_and_sized() {
        for (len, align) in [(1, 4096), (4096, 4096), (10_000, 4096), (0, 4096), (4096, 65_536)] {
            let mut buf = AlignedBuf::zeroed(len, align).expect("allocate");
            let slice = buf.as_mut_slice();
            assert_eq!(slice.len(), len);
            assert_eq!(slice.as_ptr() as usize % align, 0);
            assert!(slice.iter().all(|&b| b == 0));
            slice.fill(0xAB);
        }
        assert!(AlignedBuf::zeroed(4096, 3000).is_err(), "non-power-of-two alignment");
    }

    // ----- opening things that are not zoned devices -------------------------------------------

    fn assert_unsupported(result: ZoneResult<BlockZonedDevice>, needle: &str) {
        match result {
            Err(ZoneError::Unsupported(message)) => {
                assert!(message.contains("is not a zoned block device"), "{message}");
                assert!(message.contains(needle), "{message} should mention {needle}");
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }

    #[test]
    fn opening_a_regular_file_is_unsupported() {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), vec![0u8; 1 << 20]).expect("fill");
        assert_unsupported(BlockZonedDevice::open(file.path()), "regular file");
    }

    #[test]
    fn opening_a_directory_or_character_device_is_unsupported() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_unsupported(BlockZonedDevice::open(dir.path()), "directory");
        assert_unsupported(BlockZonedDevice::open(Path::new("/dev/null")), "character device");
    }

    #[test]
    fn opening_a_missing_path_is_an_io_error() {
        match BlockZonedDevice::open(Path::new("/nonexistent/shingle-zbd")) {
            Err(ZoneError::Io { context, source }) => {
                assert!(context.contains("/nonexistent/shingle-zbd"), "{context}");
                assert_eq!(source.kind(), io::ErrorKind::NotFound);
            }
            other => panic!("expected Io, got {other:?}"),
        }
    }

    const NEEDS_A_DISK: &str = "this test needs a non-zoned block device in /dev (a disk or a loop device)";

    /// The first block device in /dev whose `queue/zoned` is `none`.
    fn non_zoned_block_device() -> Option<PathBuf> {
        std::fs::read_dir("/sys/block").ok()?.flatten().find_map(|entry| {
            let zoned = std::fs::read_to_string(entry.path().join("queue/zoned")).ok()?;
            let dev = Path::new("/dev").join(entry.file_name());
            let is_block = std::fs::metadata(&dev).ok()?.file_type().is_block_device();
            (zoned.trim() == "none" && is_block).then_some(dev)
        })
    }

    /// A non-zoned disk is refused from sysfs alone, before it is opened (loop devices,
    /// virtio disks).
    #[test]
    fn opening_a_non_zoned_block_device_is_unsupported() {
        let dev = non_zoned_block_device().expect(NEEDS_A_DISK);
        assert_unsupported(BlockZonedDevice::open(&dev), "queue/zoned = none");
    }

    /// The kernel answers the size queries on any block device (0 zones of 0 sectors when it is
    /// not zoned), which checks those request numbers against the running kernel: a wrong size
    /// or number fails (EINVAL from the loop driver, ENOTTY elsewhere). Read-only and without
    /// O_EXCL, so harmless to a disk in use.
    #[test]
    fn the_running_kernel_accepts_the_size_queries() {
        let dev = non_zoned_block_device().expect(NEEDS_A_DISK);
        let file = File::open(&dev).unwrap_or_else(|e| panic!("cannot open {}: {e}", dev.display()));
        let kernel = KernelIo { file };
        assert_eq!(kernel.zone_sectors().expect("BLKGETZONESZ"), 0, "{}", dev.display());
        assert_eq!(kernel.zone_count().expect("BLKGETNRZONES"), 0, "{}", dev.display());
        let block = kernel.logical_block_size().expect("BLKSSZGET");
        assert!(block >= 512 && block.is_power_of_two(), "{block}");
        // The zone commands exist but refuse a device that is not zoned.
        let mut zones = [BlkZone::ZERO; 4];
        let refused = kernel
            .report(0, &mut zones)
            .expect_err("BLKREPORTZONE on a non-zoned device");
        assert_eq!(refused.raw_os_error(), Some(libc::ENOTTY), "{refused}");
    }

    #[test]
    fn queue_limits_are_read_from_sysfs_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let queue = dir.path();
        std::fs::write(queue.join("zoned"), "host-managed\n").expect("write");
        std::fs::write(queue.join("max_open_zones"), "14\n").expect("write");
        std::fs::write(queue.join("chunk_sectors"), "524288\n").expect("write");
        let limits = read_queue_limits(queue, Path::new("/dev/fake")).expect("limits");
        assert_eq!(
            limits,
            QueueLimits {
                max_open_zones: 14,
                max_active_zones: 0,
                chunk_sectors: 524_288
            }
        );
        std::fs::write(queue.join("zoned"), "none\n").expect("write");
        match read_queue_limits(queue, Path::new("/dev/fake")) {
            Err(ZoneError::Unsupported(m)) => {
                assert_eq!(m, "/dev/fake is not a zoned block device (queue/zoned = none)")
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
        std::fs::write(queue.join("zoned"), "host-aware\n").expect("write");
        std::fs::write(queue.join("max_active_zones"), "lots\n").expect("write");
        assert!(matches!(
            read_queue_limits(queue, Path::new("/dev/fake")),
            Err(ZoneError::Io { .. })
        ));
    }

    // ----- the device logic against a model of a zoned block device ---------------------------

    /// A zoned block device in memory that behaves like null_blk in zoned mode, and is as strict
    /// as `O_DIRECT` and a host-managed drive: unaligned transfers fail with `EINVAL`, reads past
    /// the write pointer and writes off it with `EIO`.
    #[derive(Debug)]
    struct FakeZbd {
        block_size: u32,
        zone_sectors: u32,
        report_capacity: bool,
        max_open: u32,
        state: Mutex<FakeState>,
    }

    #[derive(Debug, Default)]
    struct FakeState {
        zones: Vec<BlkZone>,
        data: Vec<u8>,
        /// The next write stores this many bytes, then fails with this errno.
        fail_write: Option<(usize, i32)>,
        /// Reports fail with EIO while set.
        fail_reports: bool,
        /// Calls that fail with EINTR before doing anything.
        interrupts: u32,
        /// Largest transfer of one pread/pwrite (short transfers); 0 = none.
        max_transfer: usize,
        syncs: u32,
    }

    fn errno(code: i32) -> io::Error {
        io::Error::from_raw_os_error(code)
    }

    impl FakeState {
        fn open_count(&self) -> u32 {
            self.zones
                .iter()
                .filter(|z| matches!(z.cond, BLK_ZONE_COND_IMP_OPEN | BLK_ZONE_COND_EXP_OPEN))
                .count() as u32
        }

        fn zone_at(&self, sector: u64) -> io::Result<usize> {
            self.zones
                .iter()
                .position(|z| z.start <= sector && sector < z.start + z.len)
                .ok_or_else(|| errno(libc::EIO))
        }

        /// Takes an open resource for zone `index`, closing an implicitly open zone if need be.
        fn take_open_resource(&mut self, index: usize, max_open: u32, implicit: bool) -> io::Result<()> {
            if max_open == 0 || self.open_count() < max_open {
                return Ok(());
            }
            let victim = self.zones.iter().position(|z| z.cond == BLK_ZONE_COND_IMP_OPEN);
            match victim {
                Some(v) if implicit && v != index => {
                    let zone = &mut self.zones[v];
                    zone.cond = if zone.wp == zone.start {
                        BLK_ZONE_COND_EMPTY
                    } else {
                        BLK_ZONE_COND_CLOSED
                    };
                    Ok(())
                }
                _ => Err(errno(libc::ETOOMANYREFS)),
            }
        }

        fn interrupted(&mut self) -> bool {
            if self.interrupts > 0 {
                self.interrupts -= 1;
                true
            } else {
                false
            }
        }

        fn transfer_len(&self, len: usize) -> usize {
            if self.max_transfer == 0 {
                len
            } else {
                len.min(self.max_transfer)
            }
        }
    }

    impl FakeZbd {
        /// `conventional` conventional zones, then `sequential` sequential ones of `capacity`
        /// sectors, then optionally a smaller last zone of `runt` sectors.
        fn new(block_size: u32, zone_sectors: u32, capacity: u64, conventional: usize, sequential: usize) -> Self {
            let len = u64::from(zone_sectors);
            let mut zones = Vec::new();
            for i in 0..conventional + sequential {
                let start = i as u64 * len;
                zones.push(if i < conventional {
                    raw(
                        start,
                        len,
                        u64::MAX,
                        BLK_ZONE_TYPE_CONVENTIONAL,
                        BLK_ZONE_COND_NOT_WP,
                        len,
                    )
                } else {
                    raw(
                        start,
                        len,
                        start,
                        BLK_ZONE_TYPE_SEQWRITE_REQ,
                        BLK_ZONE_COND_EMPTY,
                        capacity,
                    )
                });
            }
            let data = vec![0; zones.len() * len as usize * SECTOR_BYTES as usize];
            FakeZbd {
                block_size,
                zone_sectors,
                report_capacity: true,
                max_open: 0,
                state: Mutex::new(FakeState {
                    zones,
                    data,
                    ..FakeState::default()
                }),
            }
        }

        fn with_runt(self, runt_sectors: u64, capacity: u64) -> Self {
            {
                let mut state = self.state();
                let start = state.zones.last().map_or(0, |z| z.start + z.len);
                state.zones.push(raw(
                    start,
                    runt_sectors,
                    start,
                    BLK_ZONE_TYPE_SEQWRITE_REQ,
                    BLK_ZONE_COND_EMPTY,
                    capacity,
                ));
                let size = (start + runt_sectors) as usize * SECTOR_BYTES as usize;
                state.data.resize(size, 0);
            }
            self
        }

        fn state(&self) -> MutexGuard<'_, FakeState> {
            self.state.lock().expect("fake state")
        }

        fn direct_io_ok(&self, ptr: *const u8, len: usize, offset: u64) -> io::Result<()> {
            let block = self.block_size as usize;
            if (ptr as usize) % block != 0 || len % block != 0 || offset % block as u64 != 0 {
                return Err(errno(libc::EINVAL));
            }
            Ok(())
        }
    }

    /// The fake, shared between the device under test and the test's own inspection.
    #[derive(Debug, Clone)]
    struct Shared(Arc<FakeZbd>);

    impl ZoneIo for Shared {
        fn logical_block_size(&self) -> io::Result<u32> {
            Ok(self.0.block_size)
        }

        fn zone_sectors(&self) -> io::Result<u32> {
            Ok(self.0.zone_sectors)
        }

        fn zone_count(&self) -> io::Result<u32> {
            Ok(self.0.state().zones.len() as u32)
        }

        fn report(&self, sector: u64, out: &mut [BlkZone]) -> io::Result<(usize, u32)> {
            let state = self.0.state();
            if state.fail_reports {
                return Err(errno(libc::EIO));
            }
            let first = state
                .zones
                .iter()
                .position(|z| sector < z.start + z.len)
                .unwrap_or(state.zones.len());
            let zones = &state.zones[first..];
            let count = zones.len().min(out.len());
            for (slot, zone) in out.iter_mut().zip(&zones[..count]) {
                *slot = *zone;
                if !self.0.report_capacity {
                    slot.capacity = 0; // Kernels before 5.9 leave it unset.
                }
            }
            Ok((
                count,
                if self.0.report_capacity {
                    BLK_ZONE_REP_CAPACITY
                } else {
                    0
                },
            ))
        }

        fn zone_op(&self, op: ZoneOp, range: BlkZoneRange) -> io::Result<()> {
            let mut state = self.0.state();
            let index = state
                .zones
                .iter()
                .position(|z| z.start == range.sector && z.len == range.nr_sectors)
                .ok_or_else(|| errno(libc::EINVAL))?;
            let zone = state.zones[index];
            if zone.zone_type == BLK_ZONE_TYPE_CONVENTIONAL
                || matches!(zone.cond, BLK_ZONE_COND_OFFLINE | BLK_ZONE_COND_READONLY)
            {
                return Err(errno(libc::EIO));
            }
            let (cond, wp) = match (op, zone.cond) {
                (ZoneOp::Reset, _) => (BLK_ZONE_COND_EMPTY, zone.start),
                (ZoneOp::Open, BLK_ZONE_COND_EXP_OPEN) => (BLK_ZONE_COND_EXP_OPEN, zone.wp),
                (ZoneOp::Open, BLK_ZONE_COND_IMP_OPEN) => (BLK_ZONE_COND_EXP_OPEN, zone.wp),
                (ZoneOp::Open, BLK_ZONE_COND_EMPTY | BLK_ZONE_COND_CLOSED) => {
                    state.take_open_resource(index, self.0.max_open, false)?;
                    (BLK_ZONE_COND_EXP_OPEN, zone.wp)
                }
                (ZoneOp::Close, BLK_ZONE_COND_CLOSED) => (BLK_ZONE_COND_CLOSED, zone.wp),
                (ZoneOp::Close, BLK_ZONE_COND_IMP_OPEN | BLK_ZONE_COND_EXP_OPEN) if zone.wp == zone.start => {
                    (BLK_ZONE_COND_EMPTY, zone.wp)
                }
                (ZoneOp::Close, BLK_ZONE_COND_IMP_OPEN | BLK_ZONE_COND_EXP_OPEN) => (BLK_ZONE_COND_CLOSED, zone.wp),
                (ZoneOp::Finish, _) => (BLK_ZONE_COND_FULL, zone.start + zone.len),
                // As null_blk: opening a full zone, closing an empty or full one.
                _ => return Err(errno(libc::EIO)),
            };
            let zone = &mut state.zones[index];
            zone.cond = cond;
            zone.wp = wp;
            Ok(())
        }

        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
            self.0.direct_io_ok(buf.as_ptr(), buf.len(), offset)?;
            let mut state = self.0.state();
            if state.interrupted() {
                return Err(errno(libc::EINTR));
            }
            let (len, fail) = match state.fail_write.take() {
                Some((stored, code)) => (stored.min(buf.len()), Some(code)),
                None => (state.transfer_len(buf.len()), None),
            };
            let sector = offset / SECTOR_BYTES;
            let index = state.zone_at(sector)?;
            let zone = state.zones[index];
            if zone.zone_type != BLK_ZONE_TYPE_CONVENTIONAL {
                let end = sector + (len as u64) / SECTOR_BYTES;
                if !matches!(
                    zone.cond,
                    BLK_ZONE_COND_EMPTY | BLK_ZONE_COND_IMP_OPEN | BLK_ZONE_COND_EXP_OPEN | BLK_ZONE_COND_CLOSED
                ) || sector != zone.wp
                    || end > zone.start + zone.capacity
                {
                    return Err(errno(libc::EIO));
                }
                if matches!(zone.cond, BLK_ZONE_COND_EMPTY | BLK_ZONE_COND_CLOSED) {
                    state.take_open_resource(index, self.0.max_open, true)?;
                    state.zones[index].cond = BLK_ZONE_COND_IMP_OPEN;
                }
                let zone = &mut state.zones[index];
                zone.wp = end;
                if end == zone.start + zone.capacity {
                    zone.cond = BLK_ZONE_COND_FULL;
                    zone.wp = zone.start + zone.len;
                }
            }
            state.data[offset as usize..offset as usize + len].copy_from_slice(&buf[..len]);
            match fail {
                Some(code) => Err(errno(code)),
                None => Ok(len),
            }
        }

        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            self.0.direct_io_ok(buf.as_ptr(), buf.len(), offset)?;
            let mut state = self.0.state();
            if state.interrupted() {
                return Err(errno(libc::EINTR));
            }
            let len = state.transfer_len(buf.len());
            let sector = offset / SECTOR_BYTES;
            let zone = state.zones[state.zone_at(sector)?];
            let end = sector + len as u64 / SECTOR_BYTES;
            let readable = match zone.cond {
                BLK_ZONE_COND_NOT_WP => end <= zone.start + zone.len,
                BLK_ZONE_COND_OFFLINE => false,
                _ => end <= zone.wp,
            };
            if !readable {
                return Err(errno(libc::EIO));
            }
            buf[..len].copy_from_slice(&state.data[offset as usize..offset as usize + len]);
            Ok(len)
        }

        fn sync(&self) -> io::Result<()> {
            self.0.state().syncs += 1;
            Ok(())
        }
    }

    const BLOCK: usize = 4096;
    /// 32 KiB zones, of which 24 KiB (6 blocks) writable.
    const ZONE_SECTORS: u32 = 64;
    const CAPACITY_SECTORS: u64 = 48;
    const CAPACITY: u64 = CAPACITY_SECTORS * SECTOR_BYTES;

    fn limits(max_open: u32) -> QueueLimits {
        QueueLimits {
            max_open_zones: max_open,
            max_active_zones: 0,
            chunk_sectors: u64::from(ZONE_SECTORS),
        }
    }

    /// Two conventional zones, six sequential ones, a runt; bounce buffers of two blocks.
    fn fake() -> Arc<FakeZbd> {
        Arc::new(FakeZbd::new(BLOCK as u32, ZONE_SECTORS, CAPACITY_SECTORS, 2, 6).with_runt(32, 32))
    }

    fn device_on(fake: &Arc<FakeZbd>) -> BlockZonedDevice {
        BlockZonedDevice::with_io(
            Box::new(Shared(Arc::clone(fake))),
            PathBuf::from("/dev/fake0"),
            QueueLimits {
                chunk_sectors: u64::from(fake.zone_sectors),
                ..limits(fake.max_open)
            },
            2 * BLOCK,
        )
        .expect("open fake device")
    }

    /// `len` bytes of a pattern, starting one byte into an allocation so that it is NOT aligned.
    fn unaligned_pattern(len: usize, seed: u8) -> (Vec<u8>, std::ops::Range<usize>) {
        let mut v: Vec<u8> = (0..len + 1)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        if (v.as_ptr() as usize + 1) % BLOCK == 0 {
            v.insert(0, 0); // Keep it unaligned whatever the allocator did.
        }
        (v, 1..len + 1)
    }

    /// `len` bytes of a pattern at a 4096-aligned address.
    fn aligned_pattern(storage: &mut Vec<u8>, len: usize, seed: u8) -> std::ops::Range<usize> {
        *storage = vec![0; len + BLOCK];
        let start = storage.as_ptr().align_offset(BLOCK);
        for (i, b) in storage[start..start + len].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(7).wrapping_add(seed);
        }
        start..start + len
    }

    #[test]
    fn exposes_only_full_size_sequential_zones() {
        let fake = fake();
        let dev = device_on(&fake);
        assert_eq!(
            dev.geometry(),
            Geometry {
                zone_count: 6,
                zone_capacity: CAPACITY,
                block_size: BLOCK as u32,
                max_open_zones: 0
            }
        );
        assert_eq!(dev.skipped_zone_count(), 3);
        let zones = dev.report_zones().expect("report");
        assert_eq!(zones.len(), 6);
        for (i, zone) in zones.iter().enumerate() {
            assert_eq!(
                *zone,
                ZoneInfo {
                    id: ZoneId(i as u32),
                    capacity: CAPACITY,
                    write_pointer: 0,
                    state: ZoneState::Empty
                }
            );
        }
        // Zone 0 is the third device zone: its bytes start after two conventional zones.
        dev.write(ZoneId(0), 0, &[0x5A; BLOCK]).expect("write");
        let start = 2 * ZONE_SECTORS as usize * SECTOR_BYTES as usize;
        assert!(fake.state().data[start..start + BLOCK].iter().all(|&b| b == 0x5A));
        assert!(matches!(
            dev.zone_info(ZoneId(6)),
            Err(ZoneError::NoSuchZone(ZoneId(6)))
        ));
    }

    #[test]
    fn without_the_capacity_flag_capacity_is_the_zone_length() {
        let mut fake = FakeZbd::new(BLOCK as u32, ZONE_SECTORS, CAPACITY_SECTORS, 0, 2);
        fake.report_capacity = false;
        let fake = Arc::new(fake);
        assert_eq!(
            device_on(&fake).geometry().zone_capacity,
            u64::from(ZONE_SECTORS) * SECTOR_BYTES
        );
    }

    #[test]
    fn writes_advance_the_write_pointer_and_read_back() {
        let fake = fake();
        let dev = device_on(&fake);
        let zone = ZoneId(1);
        // Unaligned source, three blocks: goes through the two-block bounce buffer twice.
        let (first, range) = unaligned_pattern(3 * BLOCK, 1);
        dev.write(zone, 0, &first[range.clone()])
            .expect("write unaligned buffer");
        let info = dev.zone_info(zone).expect("info");
        assert_eq!((info.state, info.write_pointer), (ZoneState::Open, 3 * BLOCK as u64));
        // Aligned source, written directly.
        let mut storage = Vec::new();
        let second = aligned_pattern(&mut storage, BLOCK, 9);
        dev.write(zone, 3 * BLOCK as u64, &storage[second.clone()])
            .expect("write aligned buffer");
        let mut expected = first[range].to_vec();
        expected.extend_from_slice(&storage[second]);
        assert_eq!(dev.zone_info(zone).expect("info").write_pointer, 4 * BLOCK as u64);

        // Whole, aligned, unaligned, straddling blocks and bounce pieces, single bytes.
        for (offset, len) in [
            (0, 4 * BLOCK),
            (0, BLOCK),
            (1, 1),
            (4095, 2),
            (100, 3 * BLOCK + 7),
            (4 * BLOCK - 1, 1),
        ] {
            let mut buf = vec![0u8; len];
            dev.read(zone, offset as u64, &mut buf).expect("read");
            assert_eq!(buf, expected[offset..offset + len], "read of {len} at {offset}");
        }
        let mut aligned = Vec::new();
        let r = aligned_pattern(&mut aligned, 2 * BLOCK, 0);
        dev.read(zone, BLOCK as u64, &mut aligned[r.clone()])
            .expect("aligned read");
        assert_eq!(aligned[r], expected[BLOCK..3 * BLOCK]);
        dev.read(zone, 5, &mut []).expect("empty read");

        // The device's own report agrees with the cache.
        let reported = dev.report_zones().expect("report")[1];
        assert_eq!(
            (reported.state, reported.write_pointer),
            (ZoneState::Open, 4 * BLOCK as u64)
        );
    }

    #[test]
    fn writes_that_break_the_rules_are_refused_before_the_device_sees_them() {
        let fake = fake();
        let dev = device_on(&fake);
        let zone = ZoneId(0);
        let block = [7u8; BLOCK];
        assert!(matches!(
            dev.write(zone, BLOCK as u64, &block),
            Err(ZoneError::NotAtWritePointer {
                offset: 4096,
                write_pointer: 0,
                ..
            })
        ));
        dev.write(zone, 0, &block).expect("write at the write pointer");
        assert!(matches!(
            dev.write(zone, 0, &block),
            Err(ZoneError::NotAtWritePointer {
                write_pointer: 4096,
                ..
            })
        ));
        assert!(matches!(
            dev.write(zone, BLOCK as u64, &block[..100]),
            Err(ZoneError::Unaligned { what: "write", .. })
        ));
        assert!(matches!(dev.write(zone, 1, &block), Err(ZoneError::Unaligned { .. })));
        let too_much = vec![0u8; CAPACITY as usize];
        assert!(matches!(
            dev.write(zone, BLOCK as u64, &too_much),
            Err(ZoneError::ZoneFull { .. })
        ));
        assert!(matches!(
            dev.write(ZoneId(99), 0, &block),
            Err(ZoneError::NoSuchZone(_))
        ));
        let mut buf = [0u8; 10];
        assert!(matches!(
            dev.read(zone, BLOCK as u64 - 5, &mut buf),
            Err(ZoneError::ReadPastWritePointer { .. })
        ));
        assert!(matches!(
            dev.read(ZoneId(2), 0, &mut buf),
            Err(ZoneError::ReadPastWritePointer { .. })
        ));
        assert_eq!(dev.report_zones().expect("report")[0].write_pointer, BLOCK as u64);
    }

    #[test]
    fn filling_a_zone_makes_it_full() {
        let fake = fake();
        let dev = device_on(&fake);
        let data = vec![3u8; CAPACITY as usize];
        dev.write(ZoneId(2), 0, &data).expect("fill");
        let full = ZoneInfo {
            id: ZoneId(2),
            capacity: CAPACITY,
            write_pointer: CAPACITY,
            state: ZoneState::Full,
        };
        assert_eq!(dev.zone_info(ZoneId(2)).expect("info"), full);
        assert_eq!(dev.report_zones().expect("report")[2], full);
        assert!(matches!(
            dev.write(ZoneId(2), CAPACITY, &data[..BLOCK]),
            Err(ZoneError::ZoneFull { .. })
        ));
        let mut back = vec![0u8; CAPACITY as usize];
        dev.read(ZoneId(2), 0, &mut back).expect("read all");
        assert_eq!(back, data);
    }

    #[test]
    fn finish_keeps_the_write_pointer_until_reopened() {
        let fake = fake();
        let dev = device_on(&fake);
        let zone = ZoneId(3);
        dev.write(zone, 0, &[1u8; BLOCK]).expect("write");
        dev.finish(zone).expect("finish");
        let finished = ZoneInfo {
            id: zone,
            capacity: CAPACITY,
            write_pointer: BLOCK as u64,
            state: ZoneState::Full,
        };
        assert_eq!(dev.zone_info(zone).expect("info"), finished);
        assert_eq!(dev.report_zones().expect("report")[3], finished);
        assert!(matches!(
            dev.write(zone, BLOCK as u64, &[0u8; BLOCK]),
            Err(ZoneError::ZoneFull { .. })
        ));
        dev.finish(zone).expect("finishing a full zone is a no-op");
        let mut past = [0u8; 1];
        assert!(matches!(
            dev.read(zone, BLOCK as u64, &mut past),
            Err(ZoneError::ReadPastWritePointer { .. })
        ));
        // The device does not remember where the data ended.
        drop(dev);
        let reopened = device_on(&fake);
        assert_eq!(reopened.zone_info(zone).expect("info").write_pointer, CAPACITY);
        // Finishing an empty zone.
        reopened.finish(ZoneId(4)).expect("finish empty");
        assert_eq!(reopened.zone_info(ZoneId(4)).expect("info").write_pointer, 0);
    }

    #[test]
    fn reset_empties_a_zone() {
        let fake = fake();
        let dev = device_on(&fake);
        let zone = ZoneId(0);
        dev.write(zone, 0, &[9u8; 2 * BLOCK]).expect("write");
        dev.reset(zone).expect("reset");
        let empty = ZoneInfo {
            id: zone,
            capacity: CAPACITY,
            write_pointer: 0,
            state: ZoneState::Empty,
        };
        assert_eq!(dev.zone_info(zone).expect("info"), empty);
        assert_eq!(dev.report_zones().expect("report")[0], empty);
        assert!(matches!(
            dev.read(zone, 0, &mut [0u8; 1]),
            Err(ZoneError::ReadPastWritePointer { .. })
        ));
        dev.write(zone, 0, &[1u8; BLOCK]).expect("write after reset");
        dev.finish(zone).expect("finish");
        dev.reset(zone).expect("reset a full zone");
        assert_eq!(dev.zone_info(zone).expect("info"), empty);
    }

    #[test]
    fn open_and_close_follow_the_zone_state_machine() {
        let fake = fake();
        let dev = device_on(&fake);
        let zone = ZoneId(5);
        let state = |dev: &BlockZonedDevice| dev.zone_info(zone).expect("info").state;
        dev.close(zone).expect("closing an empty zone is a no-op");
        assert_eq!(state(&dev), ZoneState::Empty);
        dev.open(zone).expect("open");
        assert_eq!(state(&dev), ZoneState::Open);
        dev.close(zone).expect("close");
        assert_eq!(state(&dev), ZoneState::Empty, "an empty zone closes to empty");
        dev.write(zone, 0, &[1u8; BLOCK]).expect("write");
        assert_eq!(state(&dev), ZoneState::Open);
        dev.close(zone).expect("close");
        assert_eq!(state(&dev), ZoneState::Closed);
        dev.close(zone).expect("close twice");
        assert_eq!(dev.report_zones().expect("report")[5].state, ZoneState::Closed);
        dev.write(zone, BLOCK as u64, &[2u8; BLOCK]).expect("writing reopens");
        assert_eq!(state(&dev), ZoneState::Open);
        dev.close(zone).expect("close");
        dev.open(zone).expect("reopen");
        assert_eq!(state(&dev), ZoneState::Open);
        dev.open(zone).expect("open twice");
        dev.finish(zone).expect("finish");
        assert!(matches!(dev.open(zone), Err(ZoneError::ZoneFull { .. })));
        dev.close(zone).expect("closing a full zone is a no-op");
        assert_eq!(state(&dev), ZoneState::Full);
    }

    #[test]
    fn open_limits_map_to_too_many_open() {
        let mut fake = FakeZbd::new(BLOCK as u32, ZONE_SECTORS, CAPACITY_SECTORS, 0, 4);
        fake.max_open = 2;
        let fake = Arc::new(fake);
        let dev = device_on(&fake);
        assert_eq!(dev.geometry().max_open_zones, 2);
        dev.open(ZoneId(0)).expect("open 0");
        dev.open(ZoneId(1)).expect("open 1");
        assert!(matches!(dev.open(ZoneId(2)), Err(ZoneError::TooManyOpen(2))));
        assert!(matches!(
            dev.write(ZoneId(2), 0, &[0u8; BLOCK]),
            Err(ZoneError::TooManyOpen(2))
        ));
        assert_eq!(dev.zone_info(ZoneId(2)).expect("info").state, ZoneState::Empty);
        dev.close(ZoneId(1)).expect("close 1");
        dev.write(ZoneId(2), 0, &[0u8; BLOCK])
            .expect("write once a zone is free");
        let err = dev.device_error(errno(libc::EOVERFLOW), || unreachable!());
        assert!(matches!(err, ZoneError::TooManyOpen(0)));
    }

    #[test]
    fn a_failed_write_reloads_the_write_pointer_from_the_device() {
        let fake = fake();
        let dev = device_on(&fake);
        let zone = ZoneId(0);
        fake.state().fail_write = Some((BLOCK, libc::EIO));
        let mut storage = Vec::new();
        let data = aligned_pattern(&mut storage, 3 * BLOCK, 4);
        match dev.write(zone, 0, &storage[data.clone()]) {
            Err(ZoneError::Io { context, source }) => {
                assert_eq!(source.raw_os_error(), Some(libc::EIO));
                assert!(
                    context.contains("write 12288 bytes at 0 in zone 0 of /dev/fake0"),
                    "{context}"
                );
            }
            other => panic!("expected Io, got {other:?}"),
        }
        // One block reached the device before the error: the device's pointer is the truth.
        assert_eq!(dev.zone_info(zone).expect("info").write_pointer, BLOCK as u64);
        dev.write(zone, BLOCK as u64, &storage[data.start + BLOCK..data.end])
            .expect("finish the write");
        let mut back = vec![0u8; 3 * BLOCK];
        dev.read(zone, 0, &mut back).expect("read");
        assert_eq!(back, storage[data]);
    }

    #[test]
    fn a_zone_that_cannot_be_reloaded_is_offline_until_the_next_report() {
        let fake = fake();
        let dev = device_on(&fake);
        {
            let mut state = fake.state();
            state.fail_write = Some((0, libc::EIO));
            state.fail_reports = true;
        }
        assert!(matches!(
            dev.write(ZoneId(0), 0, &[0u8; BLOCK]),
            Err(ZoneError::Io { .. })
        ));
        assert_eq!(dev.zone_info(ZoneId(0)).expect("info").state, ZoneState::Offline);
        assert!(matches!(
            dev.write(ZoneId(0), 0, &[0u8; BLOCK]),
            Err(ZoneError::Offline(_))
        ));
        assert!(matches!(dev.report_zones(), Err(ZoneError::Io { .. })));
        fake.state().fail_reports = false;
        // The failed write left the zone implicitly open, with nothing written.
        let reloaded = dev.report_zones().expect("report")[0];
        assert_eq!((reloaded.state, reloaded.write_pointer), (ZoneState::Open, 0));
        dev.write(ZoneId(0), 0, &[0u8; BLOCK]).expect("write");
    }

    #[test]
    fn offline_zones_refuse_everything() {
        let fake = fake();
        fake.state().zones[3].cond = BLK_ZONE_COND_OFFLINE; // Exposed zone 1.
        let dev = device_on(&fake);
        let zone = ZoneId(1);
        assert_eq!(dev.zone_info(zone).expect("info").state, ZoneState::Offline);
        assert!(matches!(dev.write(zone, 0, &[0u8; BLOCK]), Err(ZoneError::Offline(_))));
        assert!(matches!(dev.read(zone, 0, &mut [0u8; 1]), Err(ZoneError::Offline(_))));
        for result in [dev.reset(zone), dev.open(zone), dev.close(zone), dev.finish(zone)] {
            assert!(matches!(result, Err(ZoneError::Offline(_))));
        }
        assert_eq!(dev.geometry().zone_count, 6);
    }

    #[test]
    fn short_transfers_and_interrupts_are_retried() {
        let fake = fake();
        let dev = device_on(&fake);
        {
            let mut state = fake.state();
            state.max_transfer = BLOCK;
            state.interrupts = 3;
        }
        let (data, range) = unaligned_pattern(4 * BLOCK, 5);
        dev.write(ZoneId(0), 0, &data[range.clone()])
            .expect("write in short pieces");
        fake.state().interrupts = 2;
        let mut back = vec![0u8; 4 * BLOCK - 3];
        dev.read(ZoneId(0), 3, &mut back).expect("read in short pieces");
        assert_eq!(back, data[range][3..]);
        fake.state().interrupts = MAX_INTERRUPTS + 1;
        assert!(matches!(
            dev.write(ZoneId(0), 4 * BLOCK as u64, &[0u8; BLOCK]),
            Err(ZoneError::Io { .. })
        ));
        assert_eq!(dev.zone_info(ZoneId(0)).expect("info").write_pointer, 4 * BLOCK as u64);
    }

    #[test]
    fn a_report_does_not_undo_a_write_that_ran_meanwhile() {
        let fake = fake();
        let dev = device_on(&fake);
        // Simulate the race: the report saw generation `seen`, then a write bumped it.
        let slot = &dev.zones[0];
        let seen = slot.lock().generation;
        dev.write(ZoneId(0), 0, &[0u8; BLOCK]).expect("write");
        assert_ne!(slot.lock().generation, seen);
        assert_eq!(dev.report_zones().expect("report")[0].write_pointer, BLOCK as u64);
    }

    #[test]
    fn sync_flushes_the_device() {
        let fake = fake();
        let dev = device_on(&fake);
        dev.sync().expect("sync");
        dev.sync_zone(ZoneId(0)).expect("sync zone");
        assert_eq!(fake.state().syncs, 2);
    }

    #[test]
    fn mismatched_shapes_are_refused() {
        let fake = fake();
        let wrong_chunk = QueueLimits {
            chunk_sectors: 128,
            ..limits(0)
        };
        match BlockZonedDevice::with_io(
            Box::new(Shared(Arc::clone(&fake))),
            "/dev/fake0".into(),
            wrong_chunk,
            BLOCK,
        ) {
            Err(ZoneError::Unsupported(message)) => assert!(message.contains("chunk_sectors"), "{message}"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
        let odd_block = Arc::new(FakeZbd::new(1000, ZONE_SECTORS, CAPACITY_SECTORS, 0, 2));
        let result = BlockZonedDevice::with_io(Box::new(Shared(odd_block)), "/dev/fake0".into(), limits(0), BLOCK);
        assert!(matches!(result, Err(ZoneError::Unsupported(_))));
        let all_conventional = Arc::new(FakeZbd::new(BLOCK as u32, ZONE_SECTORS, CAPACITY_SECTORS, 3, 0));
        let result = BlockZonedDevice::with_io(
            Box::new(Shared(all_conventional)),
            "/dev/fake0".into(),
            limits(0),
            BLOCK,
        );
        assert!(matches!(result, Err(ZoneError::Unsupported(_))));
    }

    #[test]
    fn reports_are_read_in_batches() {
        let count = 2 * REPORT_BATCH_ZONES + 3;
        let fake = Arc::new(FakeZbd::new(512, 8, 8, 1, count - 1));
        let dev = device_on(&fake);
        assert_eq!(dev.geometry().zone_count as usize, count - 1);
        let zones = dev.report_zones().expect("report");
        assert_eq!(zones.len(), count - 1);
        assert!(zones.iter().all(|z| z.state == ZoneState::Empty && z.capacity == 4096));
        dev.write(ZoneId(count as u32 - 2), 0, &[1u8; 512])
            .expect("write to the last zone");
    }
}
