//! Fault injection for zoned devices: wraps any [`ZonedDevice`] and fails, tears or
//! refuses operations on command, so the same store tests run against bad hardware.

use super::{Geometry, ZoneError, ZoneId, ZoneInfo, ZoneResult, ZonedDevice};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// Switches that decide which operations fail. Shared with the test through an `Arc`.
#[derive(Debug, Default)]
pub struct Faults {
    /// Writes left before every write fails with EIO (negative: never).
    pub writes_until_error: AtomicI64,
    /// The next write lands only its first half (whole blocks), then fails with EIO.
    pub tear_next_write: AtomicBool,
    /// Every write fails with ENOSPC.
    pub no_space: AtomicBool,
    /// Every sync fails with EIO.
    pub fail_sync: AtomicBool,
    /// Every read fails with EIO.
    pub fail_reads: AtomicBool,
}

impl Faults {
    /// No faults.
    pub fn none() -> Arc<Faults> {
        Arc::new(Faults {
            writes_until_error: AtomicI64::new(-1),
            ..Faults::default()
        })
    }

    /// Clears every fault.
    pub fn heal(&self) {
        self.writes_until_error.store(-1, Ordering::SeqCst);
        self.tear_next_write.store(false, Ordering::SeqCst);
        self.no_space.store(false, Ordering::SeqCst);
        self.fail_sync.store(false, Ordering::SeqCst);
        self.fail_reads.store(false, Ordering::SeqCst);
    }
}

fn eio(what: &str) -> ZoneError {
    ZoneError::io(
        format!("{what} (injected fault)"),
        std::io::Error::from_raw_os_error(libc::EIO),
    )
}

/// A device whose operations fail as its [`Faults`] say.
pub struct FaultyDevice<D> {
    inner: D,
    faults: Arc<Faults>,
}

impl<D: ZonedDevice> FaultyDevice<D> {
    /// Wraps `inner`.
    pub fn new(inner: D, faults: Arc<Faults>) -> Self {
        FaultyDevice { inner, faults }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: ZonedDevice> ZonedDevice for FaultyDevice<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn report_zones(&self) -> ZoneResult<Vec<ZoneInfo>> {
        self.inner.report_zones()
    }

    fn zone_info(&self, zone: ZoneId) -> ZoneResult<ZoneInfo> {
        self.inner.zone_info(zone)
    }

    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> ZoneResult<()> {
        let f = &self.faults;
        if f.no_space.load(Ordering::SeqCst) {
            return Err(ZoneError::io(
                "write (injected fault)",
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
        let left = f.writes_until_error.load(Ordering::SeqCst);
        if left == 0 {
            return Err(eio("write"));
        }
        if left > 0 {
            f.writes_until_error.fetch_sub(1, Ordering::SeqCst);
        }
        if f.tear_next_write.swap(false, Ordering::SeqCst) {
            let bs = self.inner.geometry().block_size as usize;
            let half = data.len() / 2 / bs * bs;
            if half > 0 {
                self.inner.write(zone, offset, &data[..half])?;
            }
            return Err(eio("torn write"));
        }
        self.inner.write(zone, offset, data)
    }

    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> ZoneResult<()> {
        if self.faults.fail_reads.load(Ordering::SeqCst) {
            return Err(eio("read"));
        }
        self.inner.read(zone, offset, buf)
    }

    fn sync(&self) -> ZoneResult<()> {
        if self.faults.fail_sync.load(Ordering::SeqCst) {
            return Err(eio("sync"));
        }
        self.inner.sync()
    }

    fn sync_zone(&self, zone: ZoneId) -> ZoneResult<()> {
        if self.faults.fail_sync.load(Ordering::SeqCst) {
            return Err(eio("sync"));
        }
        self.inner.sync_zone(zone)
    }

    fn reset(&self, zone: ZoneId) -> ZoneResult<()> {
        self.inner.reset(zone)
    }

    fn open(&self, zone: ZoneId) -> ZoneResult<()> {
        self.inner.open(zone)
    }

    fn close(&self, zone: ZoneId) -> ZoneResult<()> {
        self.inner.close(zone)
    }

    fn finish(&self, zone: ZoneId) -> ZoneResult<()> {
        self.inner.finish(zone)
    }
}

impl<D: ZonedDevice + ?Sized> ZonedDevice for Arc<D> {
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }
    fn report_zones(&self) -> ZoneResult<Vec<ZoneInfo>> {
        (**self).report_zones()
    }
    fn zone_info(&self, zone: ZoneId) -> ZoneResult<ZoneInfo> {
        (**self).zone_info(zone)
    }
    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> ZoneResult<()> {
        (**self).write(zone, offset, data)
    }
    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> ZoneResult<()> {
        (**self).read(zone, offset, buf)
    }
    fn sync(&self) -> ZoneResult<()> {
        (**self).sync()
    }
    fn sync_zone(&self, zone: ZoneId) -> ZoneResult<()> {
        (**self).sync_zone(zone)
    }
    fn reset(&self, zone: ZoneId) -> ZoneResult<()> {
        (**self).reset(zone)
    }
    fn open(&self, zone: ZoneId) -> ZoneResult<()> {
        (**self).open(zone)
    }
    fn close(&self, zone: ZoneId) -> ZoneResult<()> {
        (**self).close(zone)
    }
    fn finish(&self, zone: ZoneId) -> ZoneResult<()> {
        (**self).finish(zone)
    }
}
