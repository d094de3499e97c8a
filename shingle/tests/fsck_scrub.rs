//! `shingle fsck` and `shingle scrub` against six real `shingle serve` processes: a
//! healthy cluster checks clean; a shard corrupted on disk is found by scrub (non-zero
//! exit, the node and shard named) while fsck still reads every file whole (parity); with
//! three data nodes down under 4+2, fsck fails promptly with a clear report instead of
//! hanging. A node's own scrub rebuilds a corrupt shard from its stripe.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

mod common;

use common::{Cluster, Spec, corrupt_first_record, json, tool};
use std::time::{Duration, Instant};

#[test]
fn fsck_and_scrub_find_what_is_wrong_and_say_so() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    let mut cluster = Cluster::start(
        root,
        Spec {
            nodes: 6,
            managers: 1,
            data: true,
            partitions: 16,
            down_after_ms: 2000,
            data_toml: "",
            zones: (16, "16MiB"),
            node_toml: "",
            manager_toml: "",
        },
    );
    let ready = tool(root, &["status", "--wait", "60"]);
    assert!(ready.status.success(), "{}", String::from_utf8_lossy(&ready.stderr));

    // Three files: one small, two of several stripes.
    for (name, len) in [("small.bin", 10_000usize), ("a.bin", 5 << 20), ("b.bin", (9 << 20) + 7)] {
        let local = root.join(name);
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2])
            .collect();
        std::fs::write(&local, data).expect("write local");
        let out = tool(root, &["put", local.to_str().expect("utf-8"), &format!("/{name}")]);
        assert!(
            out.status.success(),
            "put {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Healthy: every file whole, every shard good. A read whose data shard is slow is
    // hedged to parity and counts as degraded (seen under CI load); a missing shard
    // would be degraded every time, so three tries tell the two apart.
    let mut r = serde_json::Value::Null;
    for _ in 0..3 {
        let f = tool(root, &["fsck", "--json"]);
        assert!(f.status.success(), "fsck: {}", String::from_utf8_lossy(&f.stderr));
        r = json(&f);
        if r["degraded"].as_array().is_some_and(Vec::is_empty) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert_eq!((r["files"].as_u64(), r["ok"].as_u64()), (Some(3), Some(3)), "{r}");
    assert_eq!(r["bytes"].as_u64(), Some(10_000 + (5 << 20) + (9 << 20) + 7));
    assert!(r["bad"].as_array().is_some_and(Vec::is_empty) && r["degraded"].as_array().is_some_and(Vec::is_empty));
    let s = tool(root, &["scrub", "--json"]);
    assert!(s.status.success(), "scrub: {}", String::from_utf8_lossy(&s.stderr));
    let r = json(&s);
    assert!(r["checked"].as_u64().is_some_and(|c| c >= 18), "{r}");
    assert_eq!(r["nodes"].as_array().map(Vec::len), Some(6));
    // Progress went to stderr (not a terminal here: whole lines), results to stdout.
    let progress = String::from_utf8_lossy(&s.stderr);
    assert!(progress.contains("scrub [") && progress.contains("100%"), "{progress}");

    // A shard corrupted on node 3's disk: scrub names it and fails; fsck still reads
    // every file whole.
    corrupt_first_record(&root.join("node3").join("data").join("zones"));
    let s = tool(root, &["scrub", "--json"]);
    assert!(!s.status.success(), "scrub passed over a corrupt shard");
    let r = json(&s);
    let bad: Vec<&serde_json::Value> = r["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["corrupt"].as_array().is_some_and(|c| !c.is_empty()))
        .collect();
    assert_eq!(bad.len(), 1, "{r}");
    assert_eq!(bad[0]["node"].as_u64(), Some(3), "{r}");
    let text = tool(root, &["scrub"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("node 3: CORRUPT shard"));
    let f = tool(root, &["fsck", "--json"]);
    assert!(
        f.status.success(),
        "fsck with one bad shard: {}",
        String::from_utf8_lossy(&f.stderr)
    );
    assert_eq!(json(&f)["bad"].as_array().map(Vec::len), Some(0));

    // Three data nodes down under 4+2: a prompt, clear failure.
    for i in [3, 4, 5] {
        cluster.local.nodes[i].kill();
    }
    let t = Instant::now();
    let f = tool(root, &["fsck", "--json"]);
    let took = t.elapsed();
    assert!(!f.status.success(), "fsck passed with three of six data nodes down");
    assert!(took < Duration::from_secs(90), "fsck took {took:?}");
    let stderr = String::from_utf8_lossy(&f.stderr);
    match serde_json::from_slice::<serde_json::Value>(&f.stdout) {
        // The namespace was walked: the unreadable files are listed.
        Ok(r) => {
            let bad = r["bad"].as_array().expect("bad");
            assert!(!bad.is_empty(), "{r}");
            assert!(
                bad.iter().all(|b| b["error"].as_str().is_some_and(|e| !e.is_empty())),
                "{r}"
            );
        }
        // Some directory's metadata had every replica down: the walk itself says so.
        Err(_) => assert!(stderr.contains("Error:"), "{stderr}"),
    }
}

/// A shard corrupted on disk is rebuilt by its own node's scrub (every 2 s here) from
/// the other shards of its stripe: scrub comes back clean and every file reads whole.
#[test]
fn a_corrupt_shard_is_rebuilt_by_the_node_that_holds_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    let _cluster = Cluster::start(
        root,
        Spec {
            nodes: 6,
            managers: 1,
            data: true,
            partitions: 8,
            down_after_ms: 2000,
            data_toml: "scrub_interval_ms = 2000\n",
            zones: (16, "16MiB"),
            node_toml: "",
            manager_toml: "",
        },
    );
    let ready = tool(root, &["status", "--wait", "60"]);
    assert!(ready.status.success(), "{}", String::from_utf8_lossy(&ready.stderr));
    let local = root.join("a.bin");
    let data: Vec<u8> = (0..(6usize << 20))
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8)
        .collect();
    std::fs::write(&local, &data).expect("write local");
    let out = tool(root, &["put", local.to_str().expect("utf-8"), "/a.bin"]);
    assert!(out.status.success(), "put: {}", String::from_utf8_lossy(&out.stderr));

    corrupt_first_record(&root.join("node3").join("data").join("zones"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let s = tool(root, &["scrub", "--json"]);
        if s.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the corrupt shard was not rebuilt: {}",
            String::from_utf8_lossy(&s.stdout)
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let f = tool(root, &["fsck", "--json"]);
    assert!(f.status.success(), "fsck: {}", String::from_utf8_lossy(&f.stderr));
    assert_eq!(
        json(&f)["degraded"].as_array().map(Vec::len),
        Some(0),
        "read from parity after the rebuild"
    );
    let back = root.join("back.bin");
    let out = tool(root, &["get", "/a.bin", back.to_str().expect("utf-8")]);
    assert!(out.status.success(), "get: {}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(&back).expect("read back") == data, "contents differ");
}
