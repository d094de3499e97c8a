//! The zoned-device contract, run against every implementation available here.

use shingle_data::zone::faulty::{Faults, FaultyDevice};
use shingle_data::zone::file::FileZonedDevice;
use shingle_data::zone::{Geometry, ZoneError, ZoneId, ZoneState, ZonedDevice};

fn geometry() -> Geometry {
    Geometry {
        zone_count: 4,
        zone_capacity: 64 * 1024,
        block_size: 4096,
        max_open_zones: 2,
    }
}

fn contract<D: ZonedDevice>(d: &D) {
    let g = d.geometry();
    let z = ZoneId(1);
    let zones = d.report_zones().expect("report");
    assert_eq!(zones.len(), g.zone_count as usize);
    assert!(
        zones
            .iter()
            .all(|i| i.state == ZoneState::Empty && i.write_pointer == 0)
    );

    let block = vec![0xa5u8; 4096];
    d.write(z, 0, &block).expect("write at wp");
    assert_eq!(d.zone_info(z).expect("info").write_pointer, 4096);
    assert_eq!(d.zone_info(z).expect("info").state, ZoneState::Open);
    assert!(matches!(
        d.write(z, 0, &block),
        Err(ZoneError::NotAtWritePointer { .. })
    ));
    assert!(matches!(
        d.write(z, 8192, &block),
        Err(ZoneError::NotAtWritePointer { .. })
    ));
    assert!(matches!(
        d.write(z, 4096, &block[..100]),
        Err(ZoneError::Unaligned { .. })
    ));
    assert!(matches!(d.write(ZoneId(99), 0, &block), Err(ZoneError::NoSuchZone(_))));

    let mut two = vec![0u8; 8192];
    two[..4096].fill(1);
    two[4096..].fill(2);
    d.write(z, 4096, &two).expect("second write");
    let mut buf = vec![0u8; 100];
    d.read(z, 4000, &mut buf).expect("unaligned read below wp");
    assert!(buf[..96].iter().all(|b| *b == 0xa5) && buf[96..].iter().all(|b| *b == 1));
    assert!(matches!(
        d.read(z, 12288 - 10, &mut buf),
        Err(ZoneError::ReadPastWritePointer { .. })
    ));
    d.sync().expect("sync");

    // Open-zone limit: zone 1 is open; open zone 2, then zone 3 exceeds the limit of 2.
    d.open(ZoneId(2)).expect("open");
    assert!(matches!(d.write(ZoneId(3), 0, &block), Err(ZoneError::TooManyOpen(2))));
    d.close(ZoneId(2)).expect("close");
    assert_eq!(d.zone_info(ZoneId(2)).expect("info").state, ZoneState::Empty);
    d.write(ZoneId(3), 0, &block).expect("write after close");

    // Capacity and finish.
    let rest = vec![3u8; (g.zone_capacity - 12288) as usize];
    assert!(matches!(
        d.write(z, 12288, &vec![0u8; rest.len() + 4096]),
        Err(ZoneError::ZoneFull { .. })
    ));
    d.write(z, 12288, &rest).expect("fill");
    assert_eq!(d.zone_info(z).expect("info").state, ZoneState::Full);
    assert!(matches!(
        d.write(z, g.zone_capacity, &block),
        Err(ZoneError::ZoneFull { .. })
    ));
    d.finish(ZoneId(3)).expect("finish");
    let i3 = d.zone_info(ZoneId(3)).expect("info");
    assert_eq!((i3.state, i3.write_pointer), (ZoneState::Full, 4096));
    assert!(matches!(
        d.write(ZoneId(3), 4096, &block),
        Err(ZoneError::ZoneFull { .. })
    ));

    // Reset.
    d.reset(z).expect("reset");
    let i = d.zone_info(z).expect("info");
    assert_eq!((i.state, i.write_pointer), (ZoneState::Empty, 0));
    assert!(matches!(
        d.read(z, 0, &mut buf),
        Err(ZoneError::ReadPastWritePointer { .. })
    ));
    d.write(z, 0, &block).expect("write after reset");
}

#[test]
fn file_device_meets_the_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = FileZonedDevice::create(dir.path(), geometry()).expect("create");
    contract(&d);
}

#[test]
fn faulty_wrapper_without_faults_meets_the_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = FaultyDevice::new(
        FileZonedDevice::create(dir.path(), geometry()).expect("create"),
        Faults::none(),
    );
    contract(&d);
}

#[test]
fn file_device_recovers_write_pointers_after_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let d = FileZonedDevice::create(dir.path(), geometry()).expect("create");
        d.write(ZoneId(0), 0, &vec![1u8; 8192]).expect("write");
        d.write(ZoneId(2), 0, &vec![2u8; 4096]).expect("write");
        d.finish(ZoneId(2)).expect("finish");
        d.sync().expect("sync");
    }
    // A torn write: half a block landed after the synced data.
    let z0 = dir.path().join("zone-00000");
    let mut bytes = std::fs::read(&z0).expect("read zone file");
    bytes.extend_from_slice(&[9u8; 1000]);
    std::fs::write(&z0, &bytes).expect("tear");
    let d = FileZonedDevice::open(dir.path()).expect("reopen");
    let i0 = d.zone_info(ZoneId(0)).expect("info");
    assert_eq!((i0.write_pointer, i0.state), (8192, ZoneState::Closed));
    let i2 = d.zone_info(ZoneId(2)).expect("info");
    assert_eq!((i2.write_pointer, i2.state), (4096, ZoneState::Full));
    assert_eq!(d.zone_info(ZoneId(1)).expect("info").state, ZoneState::Empty);
    d.write(ZoneId(0), 8192, &vec![3u8; 4096])
        .expect("append after recovery");
    let mut buf = vec![0u8; 4096];
    d.read(ZoneId(0), 4096, &mut buf).expect("read");
    assert!(buf.iter().all(|b| *b == 1), "synced data survived");
}

#[test]
fn invalid_geometry_and_missing_device_are_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = Geometry {
        block_size: 1000,
        ..geometry()
    };
    assert!(matches!(
        FileZonedDevice::create(&dir.path().join("a"), bad),
        Err(ZoneError::Unsupported(_))
    ));
    let e = FileZonedDevice::open(&dir.path().join("missing"))
        .err()
        .expect("no device");
    assert!(e.to_string().contains("geometry"), "{e}");
    FileZonedDevice::create(&dir.path().join("b"), geometry()).expect("create");
    assert!(matches!(
        FileZonedDevice::create(&dir.path().join("b"), geometry()),
        Err(ZoneError::Unsupported(_))
    ));
}
