//! Zoned-device emulation on ordinary files: the default backend.
//!
//! Layout of a device directory:
//! ```text
//! <dir>/geometry          "zone_count=N\nzone_capacity=BYTES\nblock_size=BYTES\nmax_open_zones=N\n"
//! <dir>/zone-00000        the zone's bytes; its length is the write pointer
//! <dir>/zone-00000.full   present when the zone was finished below capacity
//! ```
//! The same rules as a host-managed drive are enforced: writes only at the write
//! pointer, whole aligned blocks, within capacity; reads only below the write pointer;
//! space comes back only by reset. After a crash the write pointer is recovered from
//! the file length, cut back to a block boundary (a torn partial block is truncated
//! away), so it is never past what was written and never before what was synced.

use super::{Geometry, ZoneError, ZoneId, ZoneInfo, ZoneResult, ZoneState, ZonedDevice, check_read, check_write};
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

struct Zone {
    file: File,
    write_pointer: u64,
    state: ZoneState,
    dirty: bool,
}

/// A zoned device emulated by one file per zone in a directory.
pub struct FileZonedDevice {
    dir: PathBuf,
    geometry: Geometry,
    zones: Vec<Mutex<Zone>>,
    open_count: Mutex<u32>,
}

fn zone_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("zone-{id:05}"))
}

fn full_marker(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("zone-{id:05}.full"))
}

fn sync_dir(dir: &Path) -> ZoneResult<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ZoneError::io(format!("sync directory {}", dir.display()), e))
}

impl FileZonedDevice {
    /// Creates a new device in `dir` (which must not hold one yet).
    pub fn create(dir: &Path, geometry: Geometry) -> ZoneResult<Self> {
        if geometry.block_size == 0
            || !geometry.block_size.is_power_of_two()
            || geometry.zone_capacity == 0
            || geometry.zone_capacity % u64::from(geometry.block_size) != 0
            || geometry.zone_count == 0
        {
            return Err(ZoneError::Unsupported(format!("invalid geometry {geometry:?}")));
        }
        std::fs::create_dir_all(dir).map_err(|e| ZoneError::io(format!("create {}", dir.display()), e))?;
        let gpath = dir.join("geometry");
        if gpath.exists() {
            return Err(ZoneError::Unsupported(format!(
                "{} already holds a zoned device",
                dir.display()
            )));
        }
        for id in 0..geometry.zone_count {
            let p = zone_path(dir, id);
            File::create(&p)
                .and_then(|f| f.sync_all())
                .map_err(|e| ZoneError::io(format!("create {}", p.display()), e))?;
        }
        let text = format!(
            "zone_count={}\nzone_capacity={}\nblock_size={}\nmax_open_zones={}\n",
            geometry.zone_count, geometry.zone_capacity, geometry.block_size, geometry.max_open_zones
        );
        // The geometry file appears last and atomically: a half-created device has none.
        let tmp = dir.join("geometry.tmp");
        std::fs::write(&tmp, text).map_err(|e| ZoneError::io(format!("write {}", tmp.display()), e))?;
        File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| ZoneError::io("sync geometry", e))?;
        std::fs::rename(&tmp, &gpath).map_err(|e| ZoneError::io("install geometry", e))?;
        sync_dir(dir)?;
        Self::open(dir)
    }

    /// Opens an existing device, recovering write pointers from the zone files.
    pub fn open(dir: &Path) -> ZoneResult<Self> {
        let gpath = dir.join("geometry");
        let text =
            std::fs::read_to_string(&gpath).map_err(|e| ZoneError::io(format!("read {}", gpath.display()), e))?;
        let geometry = parse_geometry(&text)
            .ok_or_else(|| ZoneError::Unsupported(format!("{} is not a valid geometry file", gpath.display())))?;
        let mut zones = Vec::with_capacity(geometry.zone_count as usize);
        for id in 0..geometry.zone_count {
            let p = zone_path(dir, id);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .map_err(|e| ZoneError::io(format!("open {}", p.display()), e))?;
            let len = file
                .metadata()
                .map_err(|e| ZoneError::io(format!("stat {}", p.display()), e))?
                .len();
            let bs = u64::from(geometry.block_size);
            let wp = (len / bs * bs).min(geometry.zone_capacity);
            if wp != len {
                // A torn write left a partial block (or the file overran capacity): cut it.
                file.set_len(wp)
                    .map_err(|e| ZoneError::io(format!("truncate torn tail of {}", p.display()), e))?;
                file.sync_all()
                    .map_err(|e| ZoneError::io(format!("sync {}", p.display()), e))?;
                tracing::info!(zone = id, from = len, to = wp, "cut torn tail of zone");
            }
            let finished = full_marker(dir, id).exists();
            let state = if finished || wp == geometry.zone_capacity {
                ZoneState::Full
            } else if wp == 0 {
                ZoneState::Empty
            } else {
                ZoneState::Closed
            };
            zones.push(Mutex::new(Zone {
                file,
                write_pointer: wp,
                state,
                dirty: false,
            }));
        }
        Ok(FileZonedDevice {
            dir: dir.to_path_buf(),
            geometry,
            zones,
            open_count: Mutex::new(0),
        })
    }

    /// Opens the device in `dir`, creating it with `geometry` if there is none.
    pub fn open_or_create(dir: &Path, geometry: Geometry) -> ZoneResult<Self> {
        if dir.join("geometry").exists() {
            Self::open(dir)
        } else {
            Self::create(dir, geometry)
        }
    }

    /// The directory holding the device.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn zone(&self, id: ZoneId) -> ZoneResult<parking_lot::MutexGuard<'_, Zone>> {
        self.zones
            .get(id.0 as usize)
            .map(|m| m.lock())
            .ok_or(ZoneError::NoSuchZone(id))
    }

    fn info(&self, id: ZoneId, z: &Zone) -> ZoneInfo {
        ZoneInfo {
            id,
            capacity: self.geometry.zone_capacity,
            write_pointer: z.write_pointer,
            state: z.state,
        }
    }

    fn set_state(&self, z: &mut Zone, to: ZoneState) -> ZoneResult<()> {
        let was_open = z.state == ZoneState::Open;
        let will_open = to == ZoneState::Open;
        if was_open != will_open {
            let mut n = self.open_count.lock();
            if will_open {
                let max = self.geometry.max_open_zones;
                if max != 0 && *n >= max {
                    return Err(ZoneError::TooManyOpen(max));
                }
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
            }
        }
        z.state = to;
        Ok(())
    }
}

fn parse_geometry(text: &str) -> Option<Geometry> {
    let mut g = Geometry {
        zone_count: 0,
        zone_capacity: 0,
        block_size: 0,
        max_open_zones: 0,
    };
    for line in text.lines() {
        let (k, v) = line.split_once('=')?;
        match k.trim() {
            "zone_count" => g.zone_count = v.trim().parse().ok()?,
            "zone_capacity" => g.zone_capacity = v.trim().parse().ok()?,
            "block_size" => g.block_size = v.trim().parse().ok()?,
            "max_open_zones" => g.max_open_zones = v.trim().parse().ok()?,
            _ => return None,
        }
    }
    let valid = g.zone_count > 0
        && g.block_size.is_power_of_two()
        && g.zone_capacity > 0
        && g.zone_capacity % u64::from(g.block_size) == 0;
    valid.then_some(g)
}

impl ZonedDevice for FileZonedDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn report_zones(&self) -> ZoneResult<Vec<ZoneInfo>> {
        (0..self.geometry.zone_count)
            .map(|i| self.zone_info(ZoneId(i)))
            .collect()
    }

    fn zone_info(&self, zone: ZoneId) -> ZoneResult<ZoneInfo> {
        let z = self.zone(zone)?;
        Ok(self.info(zone, &z))
    }

    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> ZoneResult<()> {
        let mut z = self.zone(zone)?;
        check_write(&self.info(zone, &z), self.geometry.block_size, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        if z.state != ZoneState::Open {
            self.set_state(&mut z, ZoneState::Open)?;
        }
        if let Err(e) = z.file.write_all_at(data, offset) {
            // Whatever part landed is cut back to the old write pointer: a failed
            // write leaves the zone as it was.
            let _ = z.file.set_len(offset);
            return Err(ZoneError::io(
                format!("write {} bytes to {zone} at {offset}", data.len()),
                e,
            ));
        }
        z.write_pointer = offset + data.len() as u64;
        z.dirty = true;
        if z.write_pointer == self.geometry.zone_capacity {
            self.set_state(&mut z, ZoneState::Full)?;
        }
        Ok(())
    }

    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> ZoneResult<()> {
        // Reads take the zone lock only to check bounds; the file read itself runs
        // without it (positional reads do not disturb writers).
        let file = {
            let z = self.zone(zone)?;
            check_read(&self.info(zone, &z), offset, buf.len())?;
            z.file
                .try_clone()
                .map_err(|e| ZoneError::io(format!("clone handle of {zone}"), e))?
        };
        file.read_exact_at(buf, offset)
            .map_err(|e| ZoneError::io(format!("read {} bytes from {zone} at {offset}", buf.len()), e))
    }

    fn sync(&self) -> ZoneResult<()> {
        for i in 0..self.geometry.zone_count {
            self.sync_zone(ZoneId(i))?;
        }
        Ok(())
    }

    fn sync_zone(&self, zone: ZoneId) -> ZoneResult<()> {
        let mut z = self.zone(zone)?;
        if z.dirty {
            z.file
                .sync_data()
                .map_err(|e| ZoneError::io(format!("sync {zone}"), e))?;
            z.dirty = false;
        }
        Ok(())
    }

    fn reset(&self, zone: ZoneId) -> ZoneResult<()> {
        let mut z = self.zone(zone)?;
        if z.state == ZoneState::Offline {
            return Err(ZoneError::Offline(zone));
        }
        z.file
            .set_len(0)
            .map_err(|e| ZoneError::io(format!("reset {zone}"), e))?;
        z.file
            .sync_all()
            .map_err(|e| ZoneError::io(format!("sync reset of {zone}"), e))?;
        let marker = full_marker(&self.dir, zone.0);
        if marker.exists() {
            std::fs::remove_file(&marker).map_err(|e| ZoneError::io(format!("clear finish mark of {zone}"), e))?;
            sync_dir(&self.dir)?;
        }
        z.write_pointer = 0;
        z.dirty = false;
        self.set_state(&mut z, ZoneState::Empty)
    }

    fn open(&self, zone: ZoneId) -> ZoneResult<()> {
        let mut z = self.zone(zone)?;
        match z.state {
            ZoneState::Open => Ok(()),
            ZoneState::Empty | ZoneState::Closed => self.set_state(&mut z, ZoneState::Open),
            ZoneState::Full => {
                let capacity = self.geometry.zone_capacity;
                Err(ZoneError::ZoneFull {
                    zone,
                    offset: z.write_pointer,
                    len: 0,
                    capacity,
                })
            }
            ZoneState::Offline => Err(ZoneError::Offline(zone)),
        }
    }

    fn close(&self, zone: ZoneId) -> ZoneResult<()> {
        let mut z = self.zone(zone)?;
        if z.state == ZoneState::Open {
            let to = if z.write_pointer == 0 {
                ZoneState::Empty
            } else {
                ZoneState::Closed
            };
            self.set_state(&mut z, to)?;
        }
        Ok(())
    }

    fn finish(&self, zone: ZoneId) -> ZoneResult<()> {
        let mut z = self.zone(zone)?;
        match z.state {
            ZoneState::Full => return Ok(()),
            ZoneState::Offline => return Err(ZoneError::Offline(zone)),
            _ => {}
        }
        if z.dirty {
            z.file
                .sync_data()
                .map_err(|e| ZoneError::io(format!("sync {zone}"), e))?;
            z.dirty = false;
        }
        let marker = full_marker(&self.dir, zone.0);
        File::create(&marker)
            .and_then(|f| f.sync_all())
            .map_err(|e| ZoneError::io(format!("mark {zone} finished"), e))?;
        sync_dir(&self.dir)?;
        self.set_state(&mut z, ZoneState::Full)
    }
}
