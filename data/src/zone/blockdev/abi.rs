//! The kernel ABI of zoned block devices: `<linux/blkzoned.h>`, `<linux/fs.h>` and
//! `<asm-generic/ioctl.h>` request numbers, descriptor layouts (checked in every build) and
//! zone management commands.

/// Bytes per sector in every zoned-block ioctl, whatever the logical block size.
pub(super) const SECTOR_BYTES: u64 = 512;

/// The `_IOC` request-number encoding (`asm-generic/ioctl.h`, or the per-architecture variants).
pub(super) mod ioc {
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
    pub(super) const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
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
pub(super) const BLK_IOC_TYPE: u32 = 0x12;

/// `BLKREPORTZONE = _IOWR(0x12, 130, struct blk_zone_report)`.
pub(super) const BLKREPORTZONE: u32 = ioc::iowr(BLK_IOC_TYPE, 130, size_of::<BlkZoneReport>());
/// `BLKRESETZONE = _IOW(0x12, 131, struct blk_zone_range)`.
pub(super) const BLKRESETZONE: u32 = ioc::iow(BLK_IOC_TYPE, 131, size_of::<BlkZoneRange>());
/// `BLKGETZONESZ = _IOR(0x12, 132, __u32)`: zone size in sectors.
pub(super) const BLKGETZONESZ: u32 = ioc::ior(BLK_IOC_TYPE, 132, size_of::<u32>());
/// `BLKGETNRZONES = _IOR(0x12, 133, __u32)`: number of zones, conventional ones included.
pub(super) const BLKGETNRZONES: u32 = ioc::ior(BLK_IOC_TYPE, 133, size_of::<u32>());
/// `BLKOPENZONE = _IOW(0x12, 134, struct blk_zone_range)`.
pub(super) const BLKOPENZONE: u32 = ioc::iow(BLK_IOC_TYPE, 134, size_of::<BlkZoneRange>());
/// `BLKCLOSEZONE = _IOW(0x12, 135, struct blk_zone_range)`.
pub(super) const BLKCLOSEZONE: u32 = ioc::iow(BLK_IOC_TYPE, 135, size_of::<BlkZoneRange>());
/// `BLKFINISHZONE = _IOW(0x12, 136, struct blk_zone_range)`.
pub(super) const BLKFINISHZONE: u32 = ioc::iow(BLK_IOC_TYPE, 136, size_of::<BlkZoneRange>());

/// `enum blk_zone_type`.
pub(super) const BLK_ZONE_TYPE_CONVENTIONAL: u8 = 0x1;
pub(super) const BLK_ZONE_TYPE_SEQWRITE_REQ: u8 = 0x2;
pub(super) const BLK_ZONE_TYPE_SEQWRITE_PREF: u8 = 0x3;

/// `enum blk_zone_cond`.
pub(super) const BLK_ZONE_COND_NOT_WP: u8 = 0x0;
pub(super) const BLK_ZONE_COND_EMPTY: u8 = 0x1;
pub(super) const BLK_ZONE_COND_IMP_OPEN: u8 = 0x2;
pub(super) const BLK_ZONE_COND_EXP_OPEN: u8 = 0x3;
pub(super) const BLK_ZONE_COND_CLOSED: u8 = 0x4;
pub(super) const BLK_ZONE_COND_READONLY: u8 = 0xD;
pub(super) const BLK_ZONE_COND_FULL: u8 = 0xE;
pub(super) const BLK_ZONE_COND_OFFLINE: u8 = 0xF;

/// `enum blk_zone_report_flags`: the descriptors' `capacity` field is valid.
pub(super) const BLK_ZONE_REP_CAPACITY: u32 = 1 << 0;

/// `struct blk_zone`: one zone descriptor; all positions in 512-byte sectors.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BlkZone {
    pub(super) start: u64,
    pub(super) len: u64,
    pub(super) wp: u64,
    pub(super) zone_type: u8,
    pub(super) cond: u8,
    pub(super) non_seq: u8,
    pub(super) reset: u8,
    pub(super) resv: [u8; 4],
    pub(super) capacity: u64,
    pub(super) reserved: [u8; 24],
}

impl BlkZone {
    pub(super) const ZERO: BlkZone = BlkZone {
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
pub(super) struct BlkZoneReport {
    pub(super) sector: u64,
    pub(super) nr_zones: u32,
    pub(super) flags: u32,
}

/// `struct blk_zone_range`: argument of the zone management ioctls.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BlkZoneRange {
    pub(super) sector: u64,
    pub(super) nr_sectors: u64,
}

/// Zone descriptors fetched per `BLKREPORTZONE` call.
pub(super) const REPORT_BATCH_ZONES: usize = 256;

/// `struct blk_zone_report` followed by room for its `zones[]`, as the ioctl wants in memory.
#[repr(C)]
pub(super) struct ReportBuffer {
    pub(super) header: BlkZoneReport,
    pub(super) zones: [BlkZone; REPORT_BATCH_ZONES],
}

// The layout the kernel ABI fixes; checked in every build.
const _: () = assert!(size_of::<BlkZone>() == 64);
const _: () = assert!(size_of::<BlkZoneReport>() == 16);
const _: () = assert!(size_of::<BlkZoneRange>() == 16);
const _: () = assert!(std::mem::offset_of!(ReportBuffer, zones) == size_of::<BlkZoneReport>());

/// A zone management command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ZoneOp {
    Reset,
    Open,
    Close,
    Finish,
}

impl ZoneOp {
    pub(super) fn request(self) -> u32 {
        match self {
            ZoneOp::Reset => BLKRESETZONE,
            ZoneOp::Open => BLKOPENZONE,
            ZoneOp::Close => BLKCLOSEZONE,
            ZoneOp::Finish => BLKFINISHZONE,
        }
    }

    pub(super) fn verb(self) -> &'static str {
        match self {
            ZoneOp::Reset => "reset",
            ZoneOp::Open => "open",
            ZoneOp::Close => "close",
            ZoneOp::Finish => "finish",
        }
    }
}
