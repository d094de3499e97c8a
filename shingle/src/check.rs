//! `shingle tool fsck` and `shingle tool scrub`: the two whole-cluster checks, with
//! progress on stderr and a summary (or `--json`) on stdout.
//!
//! - **fsck** walks the namespace from a path and reads every regular file back through
//!   the client library, as a training job would: every shard's checksum is verified on
//!   the way and a stripe missing shards is reconstructed from parity. It reports files
//!   that read back whole, files that needed parity (degraded: a node down or a shard
//!   bad), and files that cannot be read (too many shards missing) or come back short.
//! - **scrub** asks every data node to verify every shard it stores against its
//!   checksum (the `Scrub` RPC), one node at a time, and lists the corrupt shards.
//!
//! Both exit non-zero when they find data that cannot be read or is corrupt.

use crate::progress::Progress;
use anyhow::{Result, bail};
use shingle_client::Client;
use shingle_data::wire::{Scrub, ScrubRequest};
use shingle_meta::ids::Ino;
use shingle_meta::namespace::{Creds, Errno, FileKind};
use shingle_transport::{CallOptions, RpcChannel};
use std::collections::VecDeque;
use std::time::Duration;

/// Bytes asked per read (the client reads ahead of it).
const CHUNK: u64 = 4 << 20;

struct File {
    ino: Ino,
    path: String,
    size: u64,
}

fn join(dir: &str, name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn err(e: Errno) -> String {
    std::io::Error::from_raw_os_error(e.code()).to_string()
}

/// Every regular file under `path` (or `path` itself).
async fn walk(client: &Client, path: &str) -> Result<Vec<File>> {
    let meta = client.meta();
    let top = meta
        .resolve(path.as_bytes())
        .await
        .map_err(|e| anyhow::anyhow!("{path}: {}", err(e)))?;
    let mut files = Vec::new();
    if top.kind == FileKind::File {
        files.push(File {
            ino: top.ino,
            path: path.to_string(),
            size: top.size,
        });
        return Ok(files);
    }
    let mut p = Progress::new("fsck: walking", 0);
    let mut dirs = VecDeque::from([(top.ino, path.to_string())]);
    let mut seen_dirs = 0u64;
    while let Some((dir, dpath)) = dirs.pop_front() {
        seen_dirs += 1;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = meta
                .readdir_as(&Creds::root(), dir, after.as_deref(), 1000)
                .await
                .map_err(|e| anyhow::anyhow!("list {dpath}: {}", err(e)))?;
            let Some(last) = page.last() else { break };
            after = Some(last.name.clone());
            for e in page {
                match e.kind {
                    FileKind::Dir => dirs.push_back((e.ino, join(&dpath, &e.name))),
                    FileKind::File => {
                        let path = join(&dpath, &e.name);
                        // A file removed since the listing is not an error of the check.
                        match client.getattr(e.ino).await {
                            Ok(a) => files.push(File {
                                ino: e.ino,
                                path,
                                size: a.size,
                            }),
                            Err(Errno::ENOENT) => {}
                            Err(x) => bail!("stat {path}: {}", err(x)),
                        }
                    }
                    _ => {}
                }
            }
            p.update(files.len() as u64, &format!("files in {seen_dirs} directories"));
        }
    }
    p.finish(files.len() as u64, &format!("files in {seen_dirs} directories"));
    Ok(files)
}

/// What reading one file back found.
enum Outcome {
    Ok,
    Degraded,
    Unreadable(String),
    Short(u64),
    Gone,
}

async fn check_file(client: &Client, f: &File) -> Outcome {
    let degraded_before = shingle_metrics::get().degraded_reads.get();
    let open = match client.open(&Creds::root(), f.ino).await {
        Ok(o) => o,
        Err(Errno::ENOENT) => return Outcome::Gone,
        Err(e) => return Outcome::Unreadable(format!("open: {}", err(e))),
    };
    let mut off = 0u64;
    while off < f.size {
        let want = (f.size - off).min(CHUNK) as u32;
        match open.read(off, want).await {
            Ok(b) if b.is_empty() => return Outcome::Short(off),
            Ok(b) => off += b.len() as u64,
            Err(e) => return Outcome::Unreadable(format!("at byte {off}: {}", err(e))),
        }
    }
    if shingle_metrics::get().degraded_reads.get() > degraded_before {
        Outcome::Degraded
    } else {
        Outcome::Ok
    }
}

/// `shingle tool fsck PATH`.
pub async fn fsck(client: &Client, path: &str, json: bool) -> Result<()> {
    let files = walk(client, path).await?;
    let total: u64 = files.iter().map(|f| f.size).sum();
    let mut p = Progress::new("fsck", total);
    let (mut ok, mut degraded, mut gone, mut read) = (0u64, Vec::new(), 0u64, 0u64);
    let mut bad: Vec<(String, String)> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        match check_file(client, f).await {
            Outcome::Ok => ok += 1,
            Outcome::Degraded => degraded.push(f.path.clone()),
            Outcome::Gone => gone += 1,
            Outcome::Unreadable(why) => bad.push((f.path.clone(), why)),
            Outcome::Short(at) => bad.push((f.path.clone(), format!("ends at byte {at} of {}", f.size))),
        }
        read += f.size;
        let mib_s = read as f64 / (1 << 20) as f64 / p.elapsed().as_secs_f64().max(1e-3);
        p.update(
            read,
            &format!(
                "{}/{} files, {mib_s:.0} MiB/s, {} degraded, {} bad",
                i + 1,
                files.len(),
                degraded.len(),
                bad.len()
            ),
        );
    }
    let secs = p.elapsed().as_secs_f64();
    p.finish(
        read,
        &format!("{} files, {} degraded, {} bad", files.len(), degraded.len(), bad.len()),
    );
    if json {
        let out = serde_json::json!({
            "path": path, "files": files.len(), "bytes": total, "ok": ok,
            "degraded": degraded, "vanished": gone,
            "bad": bad.iter().map(|(p, why)| serde_json::json!({"path": p, "error": why})).collect::<Vec<_>>(),
            "secs": secs,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "fsck {path}: {} files, {} bytes in {secs:.1} s: {ok} whole, {} read from parity, {} bad{}",
            files.len(),
            total,
            degraded.len(),
            bad.len(),
            if gone > 0 {
                format!(", {gone} removed meanwhile")
            } else {
                String::new()
            }
        );
        for d in &degraded {
            println!("  degraded (read with parity): {d}");
        }
        for (p, why) in &bad {
            println!("  BAD {p}: {why}");
        }
    }
    if !bad.is_empty() {
        bail!("{} of {} files cannot be read back whole", bad.len(), files.len());
    }
    Ok(())
}

/// `shingle tool scrub`.
pub async fn scrub(client: &Client, json: bool, timeout: Duration) -> Result<()> {
    let v = client.meta().view();
    let nodes: Vec<_> = v.map.nodes.values().filter(|n| n.roles.data).cloned().collect();
    let mut p = Progress::new("scrub", nodes.len() as u64);
    let (mut checked, mut results) = (0u64, Vec::new());
    let mut failures = 0usize;
    for (i, n) in nodes.iter().enumerate() {
        p.update(
            i as u64,
            &format!("node {} ({}), {checked} shards verified", n.id.0, n.addr),
        );
        let r = client
            .meta()
            .transport()
            .call::<Scrub>(n.addr, &ScrubRequest {}, CallOptions::timeout(timeout))
            .await;
        match r {
            Ok(r) => {
                checked += r.checked;
                failures += r.corrupt.len();
                let corrupt: Vec<_> = r
                    .corrupt
                    .iter()
                    .map(|s| serde_json::json!({"ino": s.ino, "stripe": s.stripe, "shard": s.shard}))
                    .collect();
                results.push(serde_json::json!({"node": n.id.0, "addr": n.addr.to_string(), "checked": r.checked, "corrupt": corrupt}));
            }
            Err(e) => {
                failures += 1;
                results.push(serde_json::json!({"node": n.id.0, "addr": n.addr.to_string(), "error": e.to_string()}));
            }
        }
    }
    p.finish(nodes.len() as u64, &format!("{checked} shards verified"));
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"checked": checked, "nodes": results}))?
        );
    } else {
        println!("scrub: {checked} shards verified on {} data nodes", nodes.len());
        for r in &results {
            if let Some(e) = r.get("error") {
                println!("  node {}: not scrubbed: {}", r["node"], e.as_str().unwrap_or_default());
            }
            for c in r["corrupt"].as_array().into_iter().flatten() {
                println!(
                    "  node {}: CORRUPT shard {} of stripe {} of inode {}",
                    r["node"], c["shard"], c["stripe"], c["ino"]
                );
            }
        }
    }
    if failures > 0 {
        bail!("scrub found {failures} corrupt shards or unreachable nodes");
    }
    Ok(())
}
