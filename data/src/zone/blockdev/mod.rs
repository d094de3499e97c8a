//! [`BlockZonedDevice`]: a real Linux zoned block device (host-managed SMR, NVMe ZNS, null_blk
//! with `zoned=1`) driven through the zoned-block ioctls of `<linux/blkzoned.h>`.
//!
//! Owns: one exclusive (`O_EXCL`) `O_DIRECT` descriptor on the device, and an in-memory cache of
//! every sequential zone's condition and write pointer. Must never: write anywhere but at a zone's
//! write pointer, read past a write pointer, or touch a conventional zone.
//!
//! The pieces: `abi` (request numbers and descriptor layouts of the kernel headers),
//! `report` (pure: zone reports checked and turned into zones and a geometry), `sysfs` (queue
//! limits), `kernel` (the I/O seam, one syscall per operation, which the tests replace with a
//! model), `buf` (aligned bounce buffers) and this file (the device: cache, locking, I/O).
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

use parking_lot::{Mutex, MutexGuard};
use std::alloc::{self, Layout};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use super::{Geometry, ZoneError, ZoneId, ZoneInfo, ZoneResult, ZoneState, ZonedDevice, check_read, check_write};

mod abi;
mod buf;
mod kernel;
mod report;
mod sysfs;
#[cfg(test)]
mod tests;

use abi::*;
use buf::*;
use kernel::*;
use report::*;
use sysfs::*;

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
        self.cache.lock()
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
