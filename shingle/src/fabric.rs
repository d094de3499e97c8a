//! Which fabric remote reads use: RDMA (one-sided READ over RoCE) when the binary is
//! built with `--features rdma` and the host has a usable device, TCP otherwise.
//!
//! Settings come from the node config's `[rdma]` table (servers) and the environment
//! (every process; it overrides the file): `SHINGLE_RDMA` = `auto` | `off` | `required`,
//! `SHINGLE_RDMA_DEVICE`, `SHINGLE_RDMA_GID_INDEX`, `SHINGLE_RDMA_PORT`. In `auto` a
//! host without RDMA runs on TCP and says so once; `required` makes that an error.

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};
use shingle_meta::map::ClusterMap;
use shingle_transport::{PeerClient, Router};
use std::sync::Arc;
use tokio::sync::watch;

/// Whether to use RDMA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RdmaMode {
    /// Use RDMA when a device is usable; TCP otherwise (said once).
    #[default]
    Auto,
    /// TCP only.
    Off,
    /// Refuse to start without a usable RDMA device.
    Required,
}

impl std::str::FromStr for RdmaMode {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(RdmaMode::Auto),
            "off" => Ok(RdmaMode::Off),
            "required" => Ok(RdmaMode::Required),
            _ => bail!("RDMA mode must be auto, off or required, not {s:?}"),
        }
    }
}

/// The `[rdma]` table of a node config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaSettings {
    /// auto | off | required (default auto).
    #[serde(default)]
    pub mode: RdmaMode,
    /// Device name (e.g. `mlx5_0`, `rxe0`); the first device when unset.
    #[serde(default)]
    pub device: Option<String>,
    /// GID index of the RoCEv2 address (default 1; ConnectX usually 3).
    #[serde(default = "default_gid_index")]
    pub gid_index: u32,
    /// Device port (default 1).
    #[serde(default = "default_port")]
    pub port: u8,
}

fn default_gid_index() -> u32 {
    1
}

fn default_port() -> u8 {
    1
}

impl Default for RdmaSettings {
    fn default() -> Self {
        RdmaSettings {
            mode: RdmaMode::Auto,
            device: None,
            gid_index: default_gid_index(),
            port: default_port(),
        }
    }
}

impl RdmaSettings {
    /// These settings with the `SHINGLE_RDMA*` variables applied.
    pub fn with_env(mut self) -> Result<Self> {
        self.apply(|k| std::env::var(k).ok())?;
        Ok(self)
    }

    fn apply(&mut self, var: impl Fn(&str) -> Option<String>) -> Result<()> {
        if let Some(m) = var("SHINGLE_RDMA").filter(|s| !s.is_empty()) {
            self.mode = m.parse()?;
        }
        if let Some(d) = var("SHINGLE_RDMA_DEVICE").filter(|s| !s.is_empty()) {
            self.device = Some(d);
        }
        if let Some(g) = var("SHINGLE_RDMA_GID_INDEX").filter(|s| !s.is_empty()) {
            self.gid_index = g
                .parse()
                .map_err(|_| anyhow::anyhow!("SHINGLE_RDMA_GID_INDEX must be a number, not {g:?}"))?;
        }
        if let Some(p) = var("SHINGLE_RDMA_PORT").filter(|s| !s.is_empty()) {
            self.port = p
                .parse()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| anyhow::anyhow!("SHINGLE_RDMA_PORT must be 1..=255, not {p:?}"))?;
        }
        Ok(())
    }

    /// Checks the values (the port is 1-based).
    pub fn validate(&self) -> Result<()> {
        if self.port == 0 {
            bail!("[rdma] port must be at least 1");
        }
        if self.device.as_deref() == Some("") {
            bail!("[rdma] device must not be empty (leave it out for the first device)");
        }
        Ok(())
    }
}

/// Serves remote reads of `regions` over RDMA too, when the settings and the host allow.
/// A client whose key `maps` no longer grants loses its RDMA connections, and with them
/// every grant of its read windows.
pub fn export(
    s: &RdmaSettings,
    router: Router,
    maps: &watch::Receiver<Arc<ClusterMap>>,
    config: &shingle_transport::TransportConfig,
) -> Result<Router> {
    #[cfg(feature = "rdma")]
    if let Some(dev) = open(s)? {
        tracing::info!(device = dev.name(), "serving remote reads over RDMA too");
        let export = shingle_transport::rdma::RdmaExport::new(dev, config);
        tokio::spawn(close_revoked(Arc::downgrade(&export), maps.clone()));
        return Ok(export.routes(router));
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = (maps, config);
        not_built(s)?;
    }
    Ok(router)
}

/// Closes the RDMA connections of clients whose key each new map revokes, for as long as
/// the export lives.
#[cfg(feature = "rdma")]
async fn close_revoked(
    export: std::sync::Weak<shingle_transport::rdma::RdmaExport>,
    mut maps: watch::Receiver<Arc<ClusterMap>>,
) {
    use shingle_transport::auth::Principal;
    while maps.changed().await.is_ok() {
        let Some(e) = export.upgrade() else { return };
        let map = maps.borrow_and_update().clone();
        let n = e.close_clients(|p| matches!(p, Principal::Client(id) if map.client(&id.name, id.serial).is_none()));
        if n > 0 {
            tracing::info!(connections = n, "closed the RDMA connections of revoked client keys");
        }
    }
}

/// Makes `tcp`'s remote reads go over RDMA, when the settings and the host allow.
pub fn attach(s: &RdmaSettings, tcp: &PeerClient) -> Result<()> {
    #[cfg(feature = "rdma")]
    if let Some(dev) = open(s)? {
        tracing::info!(device = dev.name(), "remote reads go over RDMA where peers offer it");
        tcp.attach_rdma(shingle_transport::rdma::RdmaReader::new(dev));
        return Ok(());
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = tcp;
        not_built(s)?;
    }
    Ok(())
}

#[cfg(not(feature = "rdma"))]
fn not_built(s: &RdmaSettings) -> Result<()> {
    match s.mode {
        RdmaMode::Required => {
            bail!("RDMA is required but this binary was built without it (cargo build --features rdma)")
        }
        RdmaMode::Auto => say_once("this binary was built without RDMA support; remote reads use TCP"),
        RdmaMode::Off => {}
    }
    Ok(())
}

#[cfg(feature = "rdma")]
fn open(s: &RdmaSettings) -> Result<Option<Arc<shingle_transport::rdma::Device>>> {
    if s.mode == RdmaMode::Off {
        return Ok(None);
    }
    let cfg = shingle_transport::rdma::RdmaConfig {
        device: s.device.clone(),
        port: s.port,
        gid_index: s.gid_index,
    };
    match shingle_transport::rdma::Device::open(&cfg) {
        Ok(d) => Ok(Some(d)),
        Err(e) if s.mode == RdmaMode::Required => bail!("RDMA is required: {e}"),
        Err(e) => {
            say_once(&format!("{e}; remote reads use TCP"));
            Ok(None)
        }
    }
}

/// Logs the fallback to TCP once per process.
fn say_once(msg: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| tracing::info!("{msg}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_the_environment_overrides() {
        let s: RdmaSettings =
            toml::from_str("mode = \"required\"\ndevice = \"mlx5_0\"\ngid_index = 3\n").expect("parse");
        assert_eq!(s.mode, RdmaMode::Required);
        assert_eq!(s.device.as_deref(), Some("mlx5_0"));
        assert_eq!((s.gid_index, s.port), (3, 1));
        assert!(toml::from_str::<RdmaSettings>("mode = \"sometimes\"").is_err());
        assert!(toml::from_str::<RdmaSettings>("devise = \"x\"").is_err());
        let mut s = RdmaSettings::default();
        let env = |k: &str| match k {
            "SHINGLE_RDMA" => Some("off".to_string()),
            "SHINGLE_RDMA_DEVICE" => Some("rxe1".to_string()),
            _ => None,
        };
        s.apply(env).expect("apply");
        assert_eq!(
            (s.mode, s.device.as_deref(), s.gid_index),
            (RdmaMode::Off, Some("rxe1"), 1)
        );
        let bad = |k: &str| (k == "SHINGLE_RDMA_GID_INDEX").then(|| "one".to_string());
        assert!(RdmaSettings::default().apply(bad).is_err());
        let bad = |k: &str| (k == "SHINGLE_RDMA").then(|| "yes".to_string());
        assert!(RdmaSettings::default().apply(bad).is_err());
    }

    #[test]
    fn off_never_touches_the_device_and_required_fails_without_one() {
        let tcp = PeerClient::new(Default::default(), shingle_transport::conformance::secret());
        let off = RdmaSettings {
            mode: RdmaMode::Off,
            ..RdmaSettings::default()
        };
        attach(&off, &tcp).expect("off");
        assert_eq!(tcp.fabric("127.0.0.1:1".parse().expect("addr")), "tcp");
        // This host has no RDMA device (or the binary no RDMA): required is an error.
        let required = RdmaSettings {
            mode: RdmaMode::Required,
            device: Some("no-such-device".into()),
            ..RdmaSettings::default()
        };
        let e = attach(&required, &tcp).expect_err("required without a device");
        assert!(e.to_string().contains("RDMA"), "{e}");
    }
}
