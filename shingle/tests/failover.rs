//! The fault scenarios of issue 6 on real processes: `shingle bench failover` (8 nodes,
//! 3 managers) under a scan, a writer and a lookup prober — one and two data nodes
//! killed, the manager leader killed, restarts, rebuild to healthy, three nodes down
//! (EIO, promptly), full verified read-back, and no read, lookup or write stalled past
//! its bound. The bench exits non-zero when an invariant or a bound breaks; this test
//! also checks the report it writes.
//!
//! And the promise for writes on the smallest cluster that can hold 4+2: through the
//! FUSE mount of a 6-node `shingle dev` cluster, two nodes killed during writes lose no
//! write (decision 0017), and the cluster heals when they return.

mod common;

use common::{DevMount, json, pattern, tool};
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

/// The stall bounds of issue 15 (reads and lookups 100 ms, writes 500 ms, in every
/// phase after the first kill) for a release build; a debug build serves every request
/// about six times slower (median read 30 ms instead of 5), so its bounds are five times
/// wider — still far below the multi-second stalls they are there to catch (a partition
/// that waited 5 s for a dead member's return, decision 0009). `scripts/check.sh` also
/// runs the release bench with the unscaled bounds.
const STALL_SCALE: f64 = if cfg!(debug_assertions) { 5.0 } else { 1.0 };

#[test]
fn kills_under_load_lose_nothing_and_stall_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("failover.json");
    let (read_bound, write_bound) = (100.0 * STALL_SCALE, 500.0 * STALL_SCALE);
    let out = Command::new(env!("CARGO_BIN_EXE_shingle"))
        .args([
            "bench",
            "failover",
            "--files",
            "16",
            "--file-kib",
            "1024",
            "--phase-secs",
            "5",
        ])
        .args(["--max-read-stall-ms", &read_bound.to_string()])
        .args(["--max-write-stall-ms", &write_bound.to_string()])
        .arg("--json")
        .arg(&report)
        .env("SHINGLE_LOG", "warn,openraft=error")
        .output()
        .expect("run shingle bench failover");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failover bench failed:\n{stdout}\n{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).expect("report")).expect("json");
    for p in r["phases"].as_array().expect("phases") {
        for k in ["failed_reads", "failed_lookups", "failed_writes"] {
            assert_eq!(p[k], 0, "{k} in phase {}:\n{stdout}", p["name"]);
        }
        assert!(p["reads"].as_u64().unwrap_or(0) > 0, "no reads in phase {}", p["name"]);
    }
    assert_eq!(r["healed"], true, "{stdout}");
    let three = &r["three_down"];
    assert!(
        three["eio"].as_u64().unwrap_or(0) > 0,
        "three down gave no EIO: {three}"
    );
    assert_eq!(three["other_errors"].as_array().map(Vec::len), Some(0), "{three}");
    assert!(three["max_ms"].as_f64().unwrap_or(f64::MAX) < 10_000.0, "{three}");
    let rb = &r["read_back"];
    assert_eq!(rb["verified"], rb["files"], "{rb}");
    assert!(
        rb["acked_writes"].as_u64().unwrap_or(0) > 0,
        "the writer got nothing acknowledged"
    );
    // The bench failed above if a bound broke; the report says the same.
    for p in r["phases"].as_array().expect("phases").iter().skip(1) {
        for (k, bound) in [
            ("read_max_ms", read_bound),
            ("lookup_max_ms", read_bound),
            ("write_max_ms", write_bound),
        ] {
            let took = p[k].as_f64().unwrap_or(f64::MAX);
            assert!(took <= bound, "{k} {took} > {bound} in phase {}:\n{stdout}", p["name"]);
        }
    }
    eprintln!("{stdout}");
}

/// A writer creates files of one full 4+2 stripe and a bit (4 MiB + up to 64 KiB) with
/// write + fsync + close in a loop; nodes 5 and 3 (not the manager) are killed 4 s
/// apart. With two of six down there is no spare node, so full stripes put two shards
/// on some nodes. Every write must succeed and read back; after the nodes return the
/// cluster becomes healthy (shards spread to their own nodes) and everything still
/// reads back.
#[test]
fn two_of_six_nodes_killed_during_fuse_writes_lose_no_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, mnt) = (dir.path().join("data"), dir.path().join("mnt"));
    let mut dev = DevMount::start(&data, &mnt, &[], |_| {});
    let files = dev.path("ckpt");
    std::fs::create_dir(&files).expect("mkdir");
    let writer = {
        let files = files.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut done: Vec<(u64, usize, Duration, Option<String>)> = Vec::new();
            let mut i = 0u64;
            while start.elapsed() < Duration::from_secs(16) {
                let len = (4 << 20) + (i as usize * 4099) % (64 << 10);
                let t = Instant::now();
                let r = (|| -> std::io::Result<()> {
                    let mut f = std::fs::File::create(files.join(format!("f{i:04}")))?;
                    f.write_all(&pattern(i, len))?;
                    f.sync_all()
                })();
                done.push((i, len, t.elapsed(), r.err().map(|e| e.to_string())));
                i += 1;
            }
            done
        })
    };
    std::thread::sleep(Duration::from_secs(4));
    dev.kill_node(5);
    std::thread::sleep(Duration::from_secs(4));
    dev.kill_node(3);
    let done = writer.join().expect("writer");
    let failed: Vec<_> = done.iter().filter(|d| d.3.is_some()).collect();
    let worst = done.iter().map(|d| d.2).max().unwrap_or_default();
    eprintln!("{} writes, {} failed, slowest {worst:?}", done.len(), failed.len());
    assert!(failed.is_empty(), "writes failed with two nodes down: {failed:?}");
    assert!(done.len() >= 8, "too few writes to mean anything: {}", done.len());
    let read_back = |why: &str| {
        for (i, len, _, _) in &done {
            let got = std::fs::read(files.join(format!("f{i:04}"))).unwrap_or_else(|e| panic!("{why}: f{i:04}: {e}"));
            assert!(got.len() == *len && got == pattern(*i, *len), "{why}: f{i:04} differs");
        }
    };
    read_back("two nodes down");
    // Full stripes written after the second kill share nodes; the next repair pass
    // (every 10 s) counts them and status says so.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = json(&tool(&data, &["status", "--json"]));
        if st["repair"]["shared"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no stripe counted as sharing a node: {st}");
        std::thread::sleep(Duration::from_secs(1));
    }

    dev.restart_node(5);
    dev.restart_node(3);
    let healed = tool(&data, &["status", "--wait", "180"]);
    assert!(
        healed.status.success(),
        "not healthy after the nodes returned: {}",
        String::from_utf8_lossy(&healed.stdout)
    );
    let st = json(&tool(&data, &["status", "--json"]));
    assert_eq!(st["repair"]["shared"], 0, "{st}");
    read_back("after healing");
    dev.stop(Duration::from_secs(60));
}
