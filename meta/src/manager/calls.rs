//! Helpers for nodes and tools that talk to the managers without being one.

use super::rpc::{GetMap, GetMapRequest, Propose, ProposeRequest, ProposeResponse};
use super::{ManagerError, MapRefusal, MapResponse};
use crate::ids::Epoch;
use crate::map::{ClusterMap, MapCommand};
use shingle_transport::{CallOptions, RpcChannel};
use std::net::SocketAddr;
use tracing::debug;

/// Fetches the cluster map from the first of `managers` that answers (each in turn).
///
/// Any member's applied copy is acceptable: a follower's trails the leader's by at most a
/// heartbeat, and a node that holds a stale map learns so from its peers' "stale map"
/// answers and fetches again. An epoch-0 map (a manager that has not joined the group
/// yet) is returned only when no later manager in the list has anything newer.
pub async fn fetch_map(client: &impl RpcChannel, managers: &[SocketAddr]) -> Result<ClusterMap, ManagerError> {
    fetch_map_since(client, managers, None, Epoch(1))
        .await
        .map(|(map, _)| map)
}

/// [`fetch_map`], also asking for the maps between epoch `known` (held by the caller)
/// and the newest: returned in order, every one of them or none (the manager no longer
/// holds them all, or there are too many). Managers are asked in turn until one has a
/// map of epoch `want` or later (a manager that restarted answers with the map it had
/// until it catches up with the others); if none has, the newest answer wins.
pub async fn fetch_map_since(
    client: &impl RpcChannel,
    managers: &[SocketAddr],
    known: Option<Epoch>,
    want: Epoch,
) -> Result<(ClusterMap, Vec<ClusterMap>), ManagerError> {
    let mut last = ManagerError::NoManagers;
    let mut best: Option<(ClusterMap, Vec<ClusterMap>)> = None;
    for &addr in managers {
        let req = GetMapRequest {
            known_epoch: None,
            history_from: known.map(|k| k.0 + 1),
        };
        match client.call::<GetMap>(addr, &req, CallOptions::default()).await {
            Ok(resp) => {
                let map = decode_map(addr, &resp.map_json, resp.epoch)?;
                let mut between = Vec::with_capacity(resp.history_json.len());
                for (json, epoch) in resp.history_json.iter().zip(known.map_or(0, |k| k.0 + 1)..) {
                    between.push(decode_map(addr, json, epoch)?);
                }
                if between.last().is_some_and(|m| m.epoch.0 + 1 != map.epoch.0) {
                    between.clear();
                }
                let done = map.epoch.0 > 0 && map.epoch >= want;
                if best.as_ref().is_none_or(|(b, _)| map.epoch > b.epoch) {
                    best = Some((map, between));
                }
                if done {
                    break;
                }
            }
            Err(e) => {
                debug!(manager = %addr, error = %e, "cannot fetch the cluster map; trying the next manager");
                last = e.into();
            }
        }
    }
    best.ok_or_else(|| unavailable(managers.len(), last))
}

fn decode_map(peer: SocketAddr, json: &str, epoch: u64) -> Result<ClusterMap, ManagerError> {
    let map: ClusterMap = serde_json::from_str(json).map_err(|e| ManagerError::Decode {
        peer,
        message: format!("cluster map: {e}"),
    })?;
    if map.epoch.0 != epoch {
        return Err(ManagerError::Decode {
            peer,
            message: format!("map of epoch {} sent as epoch {epoch}", map.epoch.0),
        });
    }
    Ok(map)
}

/// Commits `cmd` through the first of `managers` that answers (each in turn; any of them
/// forwards to the leader) and returns the map's epoch after it.
///
/// A refusal by the map is final ([`ManagerError::Refused`]); a manager that cannot reach a
/// leader or cannot be reached is skipped. See the module notes on duplicates.
pub async fn propose(
    client: &impl RpcChannel,
    managers: &[SocketAddr],
    cmd: &MapCommand,
) -> Result<Epoch, ManagerError> {
    let command_json =
        serde_json::to_string(cmd).map_err(|e| ManagerError::Config(format!("cannot encode command: {e}")))?;
    let mut last = ManagerError::NoManagers;
    for &addr in managers {
        let req = ProposeRequest {
            command_json: command_json.clone(),
            forwarded: false,
        };
        match client.call::<Propose>(addr, &req, CallOptions::default()).await {
            Ok(resp) => return Ok(decode_propose(addr, resp)?.into_result()?),
            Err(e) => {
                debug!(manager = %addr, error = %e, "proposal failed; trying the next manager");
                last = e.into();
            }
        }
    }
    Err(unavailable(managers.len(), last))
}

fn unavailable(tried: usize, last: ManagerError) -> ManagerError {
    match last {
        ManagerError::NoManagers => ManagerError::NoManagers,
        last => ManagerError::Unavailable {
            tried,
            last: Box::new(last),
        },
    }
}

/// Decodes a `Propose` reply into the outcome of the command.
pub(super) fn decode_propose(peer: SocketAddr, resp: ProposeResponse) -> Result<MapResponse, ManagerError> {
    if resp.refusal_json.is_empty() {
        return Ok(MapResponse::Applied(Epoch(resp.epoch)));
    }
    let r: MapRefusal = serde_json::from_str(&resp.refusal_json).map_err(|e| ManagerError::Decode {
        peer,
        message: format!("refusal: {e}"),
    })?;
    Ok(MapResponse::Refused(r))
}
