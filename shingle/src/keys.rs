//! `shingle client grant|revoke|list`: client keys, for mounts and tools that should
//! not hold the cluster secret (issue 16; `docs/decisions/0020-client-keys.md`).
//!
//! A grant is a command in the managers' replicated cluster map (name, serial, read
//! or write, root squashing); the key is derived from the cluster secret for that
//! name and serial, so it is written once, here, and kept by nobody else. Every node
//! checks each client request against the map it holds ([`crate::access`]).

use crate::cli::ClusterArgs;
use anyhow::{Context, Result, bail};
use shingle_meta::ids::{Ino, NodeId};
use shingle_meta::manager::{fetch_map_since, propose};
use shingle_meta::map::NodeState;
use shingle_meta::map::{ClientGrant, MapCommand, Subtree};
use shingle_meta::namespace::FileKind;
use shingle_transport::auth::Identity;
use shingle_transport::{ClusterSecret, PeerClient, TransportConfig};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Client keys.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Grant a client a key and write it to a file (mode 0600; refuses to overwrite).
    /// Granting a name again makes a new key; the earlier one stops working.
    Grant {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// The client's name: 1 to 32 of A-Z a-z 0-9 . _ -
        name: String,
        /// Where to write the key; give it to the mount as its --secret-file.
        #[arg(long)]
        out: PathBuf,
        /// Reads only: no change to the namespace, no data written.
        #[arg(long)]
        read_only: bool,
        /// Let the client's uid 0 act as root (by default it acts as nobody, 65534).
        #[arg(long)]
        no_root_squash: bool,
        /// Every uid of the client acts as this one, UID:GID (a tenant whose hosts must
        /// not act as anyone else, whatever they assert).
        #[arg(long, value_name = "UID:GID", value_parser = parse_ids)]
        act_as: Option<(u32, u32)>,
        /// Confine the client to this directory (an absolute path in the filesystem) and
        /// what lies below it: every node refuses it anything else, and its mounts are
        /// rooted there. The grant follows the directory if it is renamed.
        #[arg(long, value_name = "DIR")]
        path: Option<String>,
    },
    /// Revoke a client's key: every node refuses its next request.
    Revoke {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// The client's name.
        name: String,
    },
    /// The clients granted keys, and what they may do.
    List {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

/// Runs a `shingle client` command.
pub async fn run(cmd: ClientCommand) -> Result<()> {
    let cluster = match &cmd {
        ClientCommand::Grant { cluster, .. }
        | ClientCommand::Revoke { cluster, .. }
        | ClientCommand::List { cluster } => cluster.clone(),
    };
    let cf = crate::config::ClusterFile::load(&cluster.cluster_file)?;
    let secret = ClusterSecret::from_file(&cluster.secret_file)
        .with_context(|| format!("load cluster secret {}", cluster.secret_file.display()))?;
    if let Some(id) = secret.identity() {
        bail!(
            "{} is the client key of {id}: managing keys takes the cluster secret",
            cluster.secret_file.display()
        );
    }
    let tcp = PeerClient::new(TransportConfig::default(), secret.clone());
    let managers = cf.manager_addrs();
    match cmd {
        ClientCommand::Grant {
            name,
            out,
            read_only,
            no_root_squash,
            act_as,
            path,
            ..
        } => {
            Identity::new(&name, 1)?;
            // Refuse before granting: a grant whose key nobody wrote down is useless.
            if out.exists() {
                bail!("{} exists; not overwriting it", out.display());
            }
            let subtree = match path {
                Some(p) => subtree(&cluster, &p).await?,
                None => None,
            };
            let cmd = MapCommand::GrantClient {
                name: name.clone(),
                write: !read_only,
                root_squash: !no_root_squash,
                act_as,
                subtree,
            };
            let epoch = propose(&tcp, &managers, &cmd).await.context("grant the key")?;
            let (map, _) = fetch_map_since(&tcp, &managers, None, epoch).await?;
            let Some(grant) = map.clients.get(&name).filter(|_| map.epoch >= epoch) else {
                bail!("the managers answered with a map that does not show the grant yet; run `shingle client list`");
            };
            let id = Identity::new(&name, grant.serial)?;
            let key = secret.client_key(&id).context("derive the key")?;
            write_key_file(&out, &key).with_context(|| format!("create {}", out.display()))?;
            let held = nodes_hold(&cluster, epoch).await?;
            println!(
                "granted {id} ({}); key in {} (give it to `shingle mount --secret-file`); {held}",
                describe(grant),
                out.display()
            );
        }
        ClientCommand::Revoke { name, .. } => {
            let epoch = propose(&tcp, &managers, &MapCommand::RevokeClient { name: name.clone() })
                .await
                .context("revoke the key")?;
            let held = nodes_hold(&cluster, epoch).await?;
            println!("revoked {name} (map epoch {}); {held}", epoch.0);
        }
        ClientCommand::List { .. } => {
            let (map, _) = fetch_map_since(&tcp, &managers, None, shingle_meta::ids::Epoch(1)).await?;
            if map.clients.is_empty() {
                println!("no client keys granted");
            }
            for (name, g) in &map.clients {
                println!("{name:<32} serial {:<4} {}", g.serial, describe(g));
            }
        }
    }
    Ok(())
}

/// Waits (up to 10 s) until every Up metadata node holds the map of `epoch`, so that a
/// key just granted works at once (and one just revoked is refused everywhere); says
/// how that went. Nodes without the metadata role adopt it within a heartbeat too, but
/// cannot be asked.
async fn nodes_hold(cluster: &ClusterArgs, epoch: shingle_meta::ids::Epoch) -> Result<String> {
    let (meta, _) = crate::dev::connect(&cluster.cluster_file, &cluster.secret_file, Duration::from_secs(10)).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = meta.view();
        let up = |id: &NodeId| view.map.nodes.get(id).is_some_and(|n| n.state == NodeState::Up);
        let behind: Vec<u64> = meta
            .stats()
            .await
            .into_iter()
            .filter(|(id, s)| up(id) && s.as_ref().map_or(true, |s| s.epoch < epoch))
            .map(|(id, _)| id.0)
            .collect();
        if behind.is_empty() {
            return Ok("every metadata node holds it".into());
        }
        if Instant::now() >= deadline {
            return Ok(format!(
                "nodes {behind:?} did not confirm within 10 s (they will within a heartbeat of reaching the managers)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The directory `path` names, for a grant confined to it (`None` for "/").
async fn subtree(cluster: &ClusterArgs, path: &str) -> Result<Option<Subtree>> {
    if !path.starts_with('/') {
        bail!("--path {path:?}: give the directory's absolute path in the filesystem, e.g. /datasets/imagenet");
    }
    let names: Vec<&str> = path.split('/').filter(|n| !n.is_empty() && *n != ".").collect();
    if names.contains(&"..") {
        bail!("--path {path:?}: name the directory without \"..\"");
    }
    let clean = format!("/{}", names.join("/"));
    let (meta, _) = crate::dev::connect(&cluster.cluster_file, &cluster.secret_file, Duration::from_secs(10)).await?;
    let a = meta
        .resolve(clean.as_bytes())
        .await
        .map_err(|e| anyhow::anyhow!("--path {clean}: {e} (symbolic links are not followed)"))?;
    if a.kind != FileKind::Dir {
        bail!("--path {clean}: not a directory (symbolic links are not followed)");
    }
    let ino = a.ino;
    Ok((ino != Ino::ROOT).then_some(Subtree { root: ino, path: clean }))
}

fn describe(g: &ClientGrant) -> String {
    if g.revoked {
        return "revoked".into();
    }
    let who = match g.act_as {
        Some((uid, gid)) => format!("everyone acts as {uid}:{gid}"),
        None if g.root_squash => "root squashed".into(),
        None => "root kept".into(),
    };
    let under = match &g.subtree {
        Some(s) => format!(", confined to {} (inode {})", s.path, s.root.0),
        None => String::new(),
    };
    format!("{}, {who}{under}", if g.write { "read-write" } else { "read-only" })
}

fn parse_ids(s: &str) -> Result<(u32, u32), String> {
    let (u, g) = s.split_once(':').ok_or("UID:GID, e.g. 1000:1000")?;
    let n = |x: &str| x.parse::<u32>().map_err(|e| format!("{x:?}: {e}"));
    Ok((n(u)?, n(g)?))
}

/// Writes `key` to a new file of mode 0600 (never over an existing one), synced: the
/// cluster secret as its bytes and a newline (`shingle keygen`, `shingle dev`), a
/// client key as its key-file line (`shingle client grant`).
pub fn write_key_file(out: &std::path::Path, key: &ClusterSecret) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let text = match key.key_file() {
        Some(line) => line.into_bytes(),
        None => [key.expose(), b"\n"].concat(),
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)?;
    f.write_all(&text)?;
    f.sync_all()
}
