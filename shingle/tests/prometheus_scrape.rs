//! Prometheus metrics end to end: `shingle dev --metrics-port P` (six `shingle serve`
//! processes and the FUSE mount, each with its `/metrics` endpoint), a file written and
//! read through the mount, and Debian's real `prometheus` server scraping all seven
//! targets. The test asks Prometheus (its HTTP query API), not the endpoints: every
//! target is up, and the series an operator's dashboard needs have the values the
//! workload implies. It also holds the healthy run to its promise: no WARN or ERROR in
//! any process's log.
//!
//! Needs root and /dev/fuse (as the other mount tests) and the `prometheus` binary
//! (`apt install prometheus`; scripts/setup.sh installs it). Without it the test fails.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

mod common;

use common::{DevMount, free_run, http_get};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_shingle");
const NODES: u16 = 6;

fn prometheus_bin() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join("prometheus"))
        .find(|p| p.exists())
}

struct Killed(Option<Child>, &'static str);

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = Command::new("kill").args(["-INT", &c.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("{} did not stop on SIGINT; killing it", self.1);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn urlencode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query: (labels, value) of each series.
fn query(prom: SocketAddr, q: &str) -> Vec<(serde_json::Value, f64)> {
    let (status, body) = match http_get(prom, &format!("/api/v1/query?query={}", urlencode(q))) {
        Ok(r) => r,
        Err(_) => return Vec::new(),
    };
    if status != 200 {
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["data"]["result"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| {
                    let val = r["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
                    (r["metric"].clone(), val)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `q` until `ok` holds of its result (Prometheus scrapes every second).
fn eventually(prom: SocketAddr, q: &str, what: &str, ok: impl Fn(&[(serde_json::Value, f64)]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = query(prom, q);
        if ok(&r) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: `{q}` gave {r:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn sum(r: &[(serde_json::Value, f64)]) -> f64 {
    r.iter().map(|(_, v)| v).sum()
}

#[test]
fn prometheus_scrapes_every_process_of_a_dev_cluster() {
    let prometheus = prometheus_bin()
        .expect("this test needs the prometheus binary on PATH (apt-get install prometheus; scripts/setup.sh does)");
    let tmp = tempfile::tempdir().expect("tmp");
    let (data, mnt) = (tmp.path().join("data"), tmp.path().join("mnt"));
    let base = free_run(NODES + 1);
    let err_log = tmp.path().join("dev.stderr");
    let metrics_port = base.to_string();
    let mut dev = DevMount::start(
        &data,
        &mnt,
        &["--zones", "16", "--metrics-port", &metrics_port],
        |cmd| {
            cmd.stderr(std::fs::File::create(&err_log).expect("stderr file"));
        },
    );
    let saw_metrics = dev
        .banner
        .iter()
        .any(|l| l.starts_with(shingle::banner::METRICS) && l.contains(&format!("http://127.0.0.1:{base}/metrics")));
    assert!(saw_metrics, "dev did not say where the mount's metrics are");

    // A workload through the mount: a 5 MiB file (two stripes) written, and one the
    // tool stored read (the mount never saw it, so its read is not served from the
    // page cache).
    let content: Vec<u8> = (0..5u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(mnt.join("written.bin"), &content).expect("write via mount");
    let local = tmp.path().join("local.bin");
    std::fs::write(&local, &content).expect("write local");
    let put = Command::new(BIN)
        .args(["put", "--cluster-file"])
        .arg(data.join("cluster.toml"))
        .arg("--secret-file")
        .arg(data.join("secret"))
        .arg(&local)
        .arg("/scraped.bin")
        .env("SHINGLE_LOG", "warn,openraft=error")
        .output()
        .expect("shingle put");
    assert!(put.status.success(), "put: {}", String::from_utf8_lossy(&put.stderr));
    let said = String::from_utf8_lossy(&put.stderr);
    assert!(
        !said.contains(" WARN ") && !said.contains(" ERROR "),
        "put logged: {said}"
    );
    let back = std::fs::read(mnt.join("scraped.bin")).expect("read via mount");
    assert!(back == content, "read back differs");
    assert!(std::fs::metadata(mnt.join("missing")).is_err());

    // Prometheus scraping the mount and every node each second.
    let prom_port = free_run(0);
    let prom = SocketAddr::from(([127, 0, 0, 1], prom_port));
    let targets: Vec<String> = (0..=NODES).map(|i| format!("'127.0.0.1:{}'", base + i)).collect();
    let cfg = tmp.path().join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: shingle\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .expect("write prometheus.yml");
    let prom_log = tmp.path().join("prometheus.log");
    let p = Command::new(&prometheus)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", tmp.path().join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&prom_log).expect("prometheus log"))
        .spawn()
        .expect("spawn prometheus");
    let prom_proc = Killed(Some(p), "prometheus");

    eventually(prom, "up{job=\"shingle\"}", "all seven targets up", |r| {
        r.len() == usize::from(NODES) + 1 && r.iter().all(|(_, v)| *v == 1.0)
    });
    let mount_target = format!("127.0.0.1:{base}");
    // The mount: its reads and writes, their bytes, and latency histograms per op.
    eventually(
        prom,
        &format!("shingle_fs_read_bytes_total{{instance=\"{mount_target}\"}}"),
        "bytes read through the mount",
        |r| sum(r) >= content.len() as f64,
    );
    eventually(prom, "shingle_fs_write_bytes_total", "bytes written", |r| {
        sum(r) >= content.len() as f64
    });
    eventually(prom, "shingle_fs_op_seconds_count{op=\"read\"}", "timed reads", |r| {
        sum(r) >= 1.0
    });
    eventually(
        prom,
        "shingle_fs_op_errors_total{op=\"lookup\"}",
        "the failed lookup",
        |r| sum(r) >= 1.0,
    );
    eventually(
        prom,
        "sum by (fabric) (shingle_remote_read_bytes_total)",
        "shard bytes over TCP",
        |r| {
            r.iter()
                .any(|(m, v)| m["fabric"] == "tcp" && *v >= content.len() as f64 * 0.9)
        },
    );
    // The nodes: requests handled by name, zones, chunks, the manager's Raft state.
    eventually(
        prom,
        "sum by (kind) (shingle_rpc_server_requests_total{code=\"ok\"})",
        "named RPCs served",
        |r| {
            let kinds: Vec<&str> = r.iter().filter_map(|(m, _)| m["kind"].as_str()).collect();
            kinds.iter().any(|k| k.contains("Write")) && kinds.iter().any(|k| k.contains("StageShard"))
        },
    );
    eventually(prom, "shingle_zones{state=\"total\"}", "zones of six nodes", |r| {
        r.len() == usize::from(NODES) && r.iter().all(|(_, v)| *v == 16.0)
    });
    eventually(prom, "sum(shingle_chunks)", "the file's shards", |r| sum(r) >= 12.0);
    eventually(prom, "sum(shingle_raft_leader)", "one Raft leader", |r| sum(r) == 1.0);
    eventually(prom, "min(shingle_map_epoch)", "every process has a map", |r| {
        sum(r) >= 1.0
    });
    eventually(
        prom,
        "histogram_quantile(0.5, sum by (le) (rate(shingle_rpc_client_seconds_bucket[1m])))",
        "a client latency median",
        |r| r.first().is_some_and(|(_, v)| v.is_finite() && *v > 0.0),
    );
    drop(prom_proc);
    dev.stop(Duration::from_secs(60));

    // A healthy run logs nothing at WARN or above, in any process.
    let mut logs = vec![err_log];
    for i in 1..=NODES {
        logs.push(data.join(format!("node{i}.log")));
    }
    let mut bad = Vec::new();
    for l in &logs {
        let text = std::fs::read_to_string(l).unwrap_or_default();
        for line in text.lines() {
            // Plain text (or coloured, should a terminal's escapes ever reach a file).
            if line.contains(" WARN ")
                || line.contains(" ERROR ")
                || line.contains("WARN\x1b")
                || line.contains("ERROR\x1b")
            {
                bad.push(format!(
                    "{}: {line}",
                    l.file_name().and_then(|f| f.to_str()).unwrap_or("?")
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "a healthy run logged warnings or errors:\n{}",
        bad.join("\n")
    );
}
