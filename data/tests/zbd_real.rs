//! [`BlockZonedDevice`] on a real zoned block device, named by `SHINGLE_ZBD_DEV`
//! (for example `/dev/nullb0` from `modprobe null_blk nr_devices=1 zoned=1`).
//!
//! DESTRUCTIVE: the tests reset and write the first zones of that device. They are
//! `#[ignore]`d, so a host run counts them as skipped; the guest rig (`fabric-tests/run.sh
//! zoned`) runs them with `--include-ignored`, and there a missing device fails them. The tests take turns on the device (it is opened
//! with `O_EXCL`, so two at once would fail), each on its own zone, which it resets first.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use parking_lot::{Mutex, MutexGuard};

use shingle_data::zone::blockdev::BlockZonedDevice;
use shingle_data::zone::{ZoneError, ZoneId, ZoneInfo, ZoneState, ZonedDevice};

const ENV: &str = "SHINGLE_ZBD_DEV";

/// Zones the tests use (each test its own), so the device needs at least this many.
const ZONES_NEEDED: u32 = 8;

static DEVICE_TURN: Mutex<()> = Mutex::new(());

/// The device path (a missing variable fails the test: it runs only where one is set).
fn device_path() -> PathBuf {
    std::env::var_os(ENV)
        .filter(|v: &OsString| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("{ENV} is not set (needs a zoned block device, e.g. null_blk zoned=1 in the guest rig)")
        })
}

/// The device, opened, while this test holds the turn.
struct Turn {
    dev: BlockZonedDevice,
    path: PathBuf,
    _turn: MutexGuard<'static, ()>,
}

fn open_device() -> Turn {
    let path = device_path();
    let turn = DEVICE_TURN.lock();
    let dev = BlockZonedDevice::open(&path)
        .unwrap_or_else(|e| panic!("{ENV}={} cannot be opened as a zoned device: {e}", path.display()));
    let geometry = dev.geometry();
    assert!(
        geometry.zone_count >= ZONES_NEEDED,
        "{} has {} usable zones; these tests need {ZONES_NEEDED}",
        path.display(),
        geometry.zone_count
    );
    assert!(
        geometry.zone_capacity >= 4 * u64::from(geometry.block_size),
        "zones of {} bytes are too small for these tests",
        geometry.zone_capacity
    );
    Turn { dev, path, _turn: turn }
}

/// A fresh (reset) zone for a test.
fn fresh_zone(dev: &BlockZonedDevice, index: u32) -> ZoneId {
    let zone = ZoneId(index);
    let info = dev.zone_info(zone).expect("zone info");
    assert_ne!(info.state, ZoneState::Offline, "{zone} of the test device is offline");
    dev.reset(zone).expect("reset the test zone");
    zone
}

fn block(dev: &BlockZonedDevice) -> usize {
    dev.geometry().block_size as usize
}

/// `len` pattern bytes starting one byte into their allocation, so NOT aligned in memory.
fn unaligned_pattern(len: usize, seed: u8) -> (Vec<u8>, std::ops::Range<usize>) {
    let mut storage: Vec<u8> = (0..len + 2)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect();
    let start = if (storage.as_ptr() as usize + 1) % 512 == 0 {
        2
    } else {
        1
    };
    storage.truncate(start + len);
    (storage, start..start + len)
}

/// `len` pattern bytes at a 4096-aligned address (written without a bounce buffer).
fn aligned_pattern(storage: &mut Vec<u8>, len: usize, seed: u8) -> std::ops::Range<usize> {
    *storage = vec![0; len + 4096];
    let start = storage.as_ptr().align_offset(4096);
    for (i, b) in storage[start..start + len].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(29).wrapping_add(seed);
    }
    start..start + len
}

fn info(dev: &BlockZonedDevice, zone: ZoneId) -> ZoneInfo {
    dev.zone_info(zone).expect("zone info")
}

fn reported(dev: &BlockZonedDevice, zone: ZoneId) -> ZoneInfo {
    dev.report_zones().expect("report zones")[zone.0 as usize]
}

#[test]
#[ignore = "needs a zoned block device: runs in the guest rig (fabric-tests/run.sh zoned)"]
fn report_zones_matches_the_geometry() {
    let turn = open_device();
    let dev = &turn.dev;
    let geometry = dev.geometry();
    println!(
        "{}: {geometry:?}, {} zones skipped",
        turn.path.display(),
        dev.skipped_zone_count()
    );
    let zones = dev.report_zones().expect("report zones");
    assert_eq!(zones.len(), geometry.zone_count as usize);
    let block = u64::from(geometry.block_size);
    for (i, zone) in zones.iter().enumerate() {
        assert_eq!(zone.id, ZoneId(i as u32));
        if zone.state == ZoneState::Offline {
            continue;
        }
        assert!(zone.capacity >= geometry.zone_capacity, "{zone:?}");
        assert_eq!(zone.capacity % block, 0, "{zone:?}");
        assert!(zone.write_pointer <= zone.capacity, "{zone:?}");
        assert_eq!(zone.write_pointer % block, 0, "{zone:?}");
        assert_eq!(dev.zone_info(zone.id).expect("zone info"), *zone);
    }
    assert!(matches!(
        dev.zone_info(ZoneId(geometry.zone_count)),
        Err(ZoneError::NoSuchZone(_))
    ));
}

#[test]
#[ignore = "needs a zoned block device: runs in the guest rig (fabric-tests/run.sh zoned)"]
fn writes_at_the_write_pointer_advance_it_and_read_back() {
    let turn = open_device();
    let dev = &turn.dev;
    let zone = fresh_zone(dev, 0);
    let block = block(dev);
    let (first, range) = unaligned_pattern(2 * block, 3);
    dev.write(zone, 0, &first[range.clone()])
        .expect("write from an unaligned buffer");
    assert_eq!(info(dev, zone).write_pointer, 2 * block as u64);
    let mut storage = Vec::new();
    let second = aligned_pattern(&mut storage, block, 8);
    dev.write(zone, 2 * block as u64, &storage[second.clone()])
        .expect("write from an aligned buffer");
    let mut expected = first[range].to_vec();
    expected.extend_from_slice(&storage[second]);
    let now = reported(dev, zone);
    assert_eq!(
        (now.state, now.write_pointer),
        (ZoneState::Open, 3 * block as u64),
        "device report"
    );

    for (offset, len) in [
        (0, 3 * block),
        (block, block),
        (1, 1),
        (block - 1, 2),
        (7, 2 * block + 5),
    ] {
        let mut buf = vec![0u8; len];
        dev.read(zone, offset as u64, &mut buf).expect("read");
        assert_eq!(buf, expected[offset..offset + len], "read of {len} bytes at {offset}");
    }

    // The data and the write pointer survive closing and reopening the device.
    dev.sync().expect("sync");
    let path = turn.path.clone();
    let Turn { dev, _turn, .. } = turn;
    drop(dev);
    let reopened = BlockZonedDevice::open(&path).expect("reopen");
    assert_eq!(info(&reopened, zone).write_pointer, 3 * block as u64);
    let mut back = vec![0u8; 3 * block];
    reopened.read(zone, 0, &mut back).expect("read after reopen");
    assert_eq!(back, expected);
}

#[test]
#[ignore = "needs a zoned block device: runs in the guest rig (fabric-tests/run.sh zoned)"]
fn writes_off_the_write_pointer_or_unaligned_are_refused() {
    let turn = open_device();
    let dev = &turn.dev;
    let zone = fresh_zone(dev, 1);
    let block = block(dev);
    let data = vec![0x42u8; block];
    assert!(matches!(
        dev.write(zone, block as u64, &data),
        Err(ZoneError::NotAtWritePointer { write_pointer: 0, .. })
    ));
    dev.write(zone, 0, &data).expect("write at the write pointer");
    assert!(matches!(
        dev.write(zone, 0, &data),
        Err(ZoneError::NotAtWritePointer { .. })
    ));
    assert!(matches!(
        dev.write(zone, 2 * block as u64, &data),
        Err(ZoneError::NotAtWritePointer { .. })
    ));
    assert!(matches!(
        dev.write(zone, block as u64, &data[..block - 1]),
        Err(ZoneError::Unaligned { .. })
    ));
    assert!(matches!(
        dev.write(zone, block as u64 + 1, &data),
        Err(ZoneError::Unaligned { .. })
    ));
    assert_eq!(
        reported(dev, zone).write_pointer,
        block as u64,
        "refused writes must not reach the device"
    );
}

#[test]
#[ignore = "needs a zoned block device: runs in the guest rig (fabric-tests/run.sh zoned)"]
fn reads_past_the_write_pointer_are_refused() {
    let turn = open_device();
    let dev = &turn.dev;
    let zone = fresh_zone(dev, 2);
    let block = block(dev);
    let mut buf = vec![0u8; 16];
    assert!(matches!(
        dev.read(zone, 0, &mut buf),
        Err(ZoneError::ReadPastWritePointer { .. })
    ));
    dev.write(zone, 0, &vec![1u8; block]).expect("write");
    dev.read(zone, block as u64 - 16, &mut buf)
        .expect("read just below the write pointer");
    assert!(matches!(
        dev.read(zone, block as u64 - 15, &mut buf),
        Err(ZoneError::ReadPastWritePointer { .. })
    ));
}

#[test]
#[ignore = "needs a zoned block device: runs in the guest rig (fabric-tests/run.sh zoned)"]
fn finish_makes_a_zone_full_and_refuses_writes() {
    let turn = open_device();
    let dev = &turn.dev;
    let zone = fresh_zone(dev, 3);
    let block = block(dev);
    dev.write(zone, 0, &vec![5u8; block]).expect("write");
    dev.finish(zone).expect("finish");
    let finished = info(dev, zone);
    assert_eq!(
        (finished.state, finished.write_pointer),
        (ZoneState::Full, block as u64)
    );
    assert_eq!(reported(dev, zone).state, ZoneState::Full);
    assert!(matches!(
        dev.write(zone, block as u64, &vec![0u8; block]),
        Err(ZoneError::ZoneFull { .. })
    ));
    let mut back = vec![0u8; block];
    dev.read(zone, 0, &mut back).expect("read a finished zone");
    assert!(back.iter().all(|&b| b == 5));
    dev.reset(zone).expect("reset");
}

#[test]
#[ignore = "needs a zoned block device: runs in the guest rig (fabric-tests/run.sh zoned)"]
fn filling_a_zone_makes_it_full() {
    let turn = open_device();
    let dev = &turn.dev;
    let zone = fresh_zone(dev, 4);
    let capacity = info(dev, zone).capacity;
    assert!(
        capacity <= 256 << 20,
        "zone capacity {capacity} bytes: this test fills a zone of at most 256 MiB"
    );
    let piece = vec![0xC3u8; (4 << 20).min(capacity as usize)];
    let mut written = 0u64;
    while written < capacity {
        let len = piece.len().min((capacity - written) as usize);
        dev.write(zone, written, &piece[..len]).expect("write");
        written += len as u64;
    }
    let full = reported(dev, zone);
    assert_eq!((full.state, full.write_pointer), (ZoneState::Full, capacity));
    assert!(matches!(
        dev.write(zone, capacity, &piece[..block(dev)]),
        Err(ZoneError::ZoneFull { .. })
    ));
    dev.reset(zone).expect("reset");
}

#[test]
#[ignore = "needs a zoned block device: runs in the guest rig (fabric-tests/run.sh zoned)"]
fn reset_empties_a_zone() {
    let turn = open_device();
    let dev = &turn.dev;
    let zone = fresh_zone(dev, 5);
    let block = block(dev);
    dev.write(zone, 0, &vec![9u8; 2 * block]).expect("write");
    dev.reset(zone).expect("reset");
    for now in [info(dev, zone), reported(dev, zone)] {
        assert_eq!((now.state, now.write_pointer), (ZoneState::Empty, 0));
    }
    assert!(matches!(
        dev.read(zone, 0, &mut [0u8; 1]),
        Err(ZoneError::ReadPastWritePointer { .. })
    ));
    dev.write(zone, 0, &vec![1u8; block]).expect("write at 0 after reset");
    dev.reset(zone).expect("reset");
}

#[test]
#[ignore = "needs a zoned block device: runs in the guest rig (fabric-tests/run.sh zoned)"]
fn open_and_close_change_the_zone_state() {
    let turn = open_device();
    let dev = &turn.dev;
    let zone = fresh_zone(dev, 6);
    let block = block(dev);
    let state = |dev: &BlockZonedDevice| reported(dev, zone).state;
    dev.open(zone).expect("open an empty zone");
    assert_eq!(state(dev), ZoneState::Open);
    dev.close(zone).expect("close an empty open zone");
    assert_eq!(state(dev), ZoneState::Empty);
    dev.write(zone, 0, &vec![2u8; block]).expect("write");
    assert_eq!(state(dev), ZoneState::Open);
    dev.close(zone).expect("close");
    assert_eq!(state(dev), ZoneState::Closed);
    assert_eq!(info(dev, zone).write_pointer, block as u64);
    dev.open(zone).expect("reopen");
    assert_eq!(state(dev), ZoneState::Open);
    dev.close(zone).expect("close again");
    dev.write(zone, block as u64, &vec![3u8; block])
        .expect("a write reopens a closed zone");
    assert_eq!(state(dev), ZoneState::Open);
    dev.finish(zone).expect("finish");
    assert!(matches!(dev.open(zone), Err(ZoneError::ZoneFull { .. })));
    dev.reset(zone).expect("reset");
}

#[test]
#[ignore = "needs a zoned block device: runs in the guest rig (fabric-tests/run.sh zoned)"]
fn sync_succeeds() {
    let turn = open_device();
    let dev = &turn.dev;
    let zone = fresh_zone(dev, 7);
    dev.write(zone, 0, &vec![4u8; block(dev)]).expect("write");
    dev.sync().expect("sync");
    dev.sync_zone(zone).expect("sync zone");
    dev.reset(zone).expect("reset");
}

#[test]
#[ignore = "needs a zoned block device: runs in the guest rig (fabric-tests/run.sh zoned)"]
fn a_second_open_is_refused() {
    let turn = open_device();
    match BlockZonedDevice::open(&turn.path) {
        Err(ZoneError::Io { source, .. }) => assert_eq!(source.raw_os_error(), Some(libc::EBUSY), "{source}"),
        Ok(_) => panic!("a second exclusive open of {} succeeded", turn.path.display()),
        Err(other) => panic!("expected EBUSY, got {other}"),
    }
}

#[test]
fn a_regular_file_is_not_a_zoned_device() {
    // Runs everywhere: no device needed.
    let path = std::env::temp_dir().join(format!("shingle-zbd-real-{}", std::process::id()));
    std::fs::write(&path, [0u8; 4096]).expect("create a regular file");
    let result = BlockZonedDevice::open(Path::new(&path));
    std::fs::remove_file(&path).expect("remove the file");
    match result {
        Err(ZoneError::Unsupported(message)) => assert!(message.contains("is not a zoned block device"), "{message}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}
