//! The device I/O seam: one syscall per operation, the kernel's or a model of it in tests,
//! with the retry-on-interrupt loops on top.

use super::*;

/// The operations on a zoned block device, one syscall each.
pub(super) trait ZoneIo: Send + Sync + std::fmt::Debug {
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
pub(super) struct KernelIo {
    pub(super) file: File,
}

pub(super) fn ioctl_result(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// The ioctls that answer with one `__u32`.
#[derive(Clone, Copy, Debug)]
pub(super) enum U32Query {
    /// `BLKGETZONESZ`.
    ZoneSectors,
    /// `BLKGETNRZONES`.
    ZoneCount,
}

impl KernelIo {
    #[allow(unsafe_code)]
    pub(super) fn get_u32(&self, query: U32Query) -> io::Result<u32> {
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
pub(super) const MAX_INTERRUPTS: u32 = 64;

pub(super) fn write_all_at(io: &dyn ZoneIo, buf: &[u8], offset: u64) -> io::Result<()> {
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

pub(super) fn read_exact_at(io: &dyn ZoneIo, buf: &mut [u8], offset: u64) -> io::Result<()> {
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
