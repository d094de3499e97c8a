//! Tests of the zoned block device against a model of the kernel.

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
        self.state.lock()
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
