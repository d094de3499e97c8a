//! Zone reports, checked and turned into the exposed zones and the device geometry: pure
//! functions of what the kernel answered.

use super::*;

/// A zone descriptor, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReportedZone {
    /// No write pointer: random-write space that Shingle does not use.
    Conventional { start_sector: u64, len_sectors: u64 },
    /// A zone with a write pointer.
    Sequential(SeqZone),
}

/// A sequential zone as the device reported it; byte quantities are relative to its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SeqZone {
    pub(super) start_sector: u64,
    pub(super) len_sectors: u64,
    pub(super) capacity: u64,
    pub(super) write_pointer: u64,
    pub(super) state: ZoneState,
}

impl SeqZone {
    pub(super) fn info(&self, id: ZoneId) -> ZoneInfo {
        ZoneInfo {
            id,
            capacity: self.capacity,
            write_pointer: self.write_pointer,
            state: self.state,
        }
    }
}

pub(super) fn sectors_to_bytes(sectors: u64) -> Result<u64, String> {
    sectors
        .checked_mul(SECTOR_BYTES)
        .ok_or_else(|| format!("{sectors} sectors overflow a byte count"))
}

impl ReportedZone {
    /// Checks one descriptor of a report whose header carried `report_flags`.
    pub(super) fn parse(raw: &BlkZone, report_flags: u32) -> Result<Self, String> {
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
pub(super) fn usable_zones(
    reported: &[ReportedZone],
    zone_sectors: u64,
    block_size: u32,
) -> Result<Vec<SeqZone>, String> {
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
pub(super) fn min_limit(a: u32, b: u32) -> u32 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (x, y) => x.min(y),
    }
}

pub(super) fn geometry_of(zones: &[SeqZone], block_size: u32, limits: &QueueLimits) -> Result<Geometry, String> {
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
pub(super) fn merge_report(cached: &ZoneInfo, fresh: ZoneInfo) -> ZoneInfo {
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
pub(super) fn covering_range(offset: u64, len: u64, block: u64) -> (u64, u64) {
    let start = offset - offset % block;
    let end = (offset + len).next_multiple_of(block);
    (start, end)
}
