//! Log output of the real binary: `--log-format json` / `[log] format = "json"` write one
//! JSON object per line on stderr, text stays the default, and unknown values are refused
//! with a clear error.

use shingle::config::{DataSection, NodeConfig, NodeSection};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_shingle");

/// A standalone data node's config (no cluster needed), with `extra` appended.
fn write_config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let secret = dir.join("secret");
    if !secret.exists() {
        let out = Command::new(BIN).arg("keygen").arg(&secret).output().expect("keygen");
        assert!(out.status.success(), "keygen: {out:?}");
    }
    let config = dir.join("node.toml");
    let listen = "127.0.0.1:0".parse().expect("address");
    let mut cfg = NodeConfig::new(NodeSection::new(listen, &secret));
    cfg.data = Some(DataSection::emulated(&dir.join("data"), 4, 1 << 20));
    // Appended as written: some of the extras are meant to be refused.
    let text = format!("{}\n{extra}", cfg.to_toml().expect("config"));
    std::fs::write(&config, text).expect("write config");
    config
}

/// A command with no log settings inherited from the test's environment.
fn shingle() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("SHINGLE_LOG").env_remove("SHINGLE_LOG_FORMAT");
    c
}

/// Runs `shingle [args] serve --config CONFIG` until it serves, stops it with SIGTERM and
/// returns its stderr.
fn serve_and_stop(mut cmd: Command, config: &Path) -> String {
    let mut child = cmd
        .args(["serve", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shingle serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read startup line");
    assert!(line.starts_with(shingle::banner::LISTENING), "startup line: {line:?}");
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(term.success(), "kill -TERM");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "serve exited with {:?}", out.status);
    String::from_utf8(out.stderr).expect("utf-8 stderr")
}

/// Every line is one JSON object with the fields the docs promise; returns the messages.
fn json_messages(stderr: &str) -> Vec<(String, String)> {
    let mut messages = Vec::new();
    for line in stderr.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
        let o = v.as_object().unwrap_or_else(|| panic!("not a JSON object: {line}"));
        for key in ["timestamp", "level", "target", "fields"] {
            assert!(o.contains_key(key), "no {key} in {line}");
        }
        let level = o["level"].as_str().expect("level is a string").to_string();
        let message = o["fields"]["message"].as_str().expect("fields.message").to_string();
        messages.push((level, message));
    }
    messages
}

#[test]
fn config_log_table_gives_json_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "[log]\nformat = \"json\"\nlevel = \"info\"\n");
    let stderr = serve_and_stop(shingle(), &config);
    let messages = json_messages(&stderr);
    assert!(messages.contains(&("INFO".into(), "node started".into())), "{stderr}");
    assert!(messages.contains(&("INFO".into(), "shutting down".into())), "{stderr}");
}

#[test]
fn flag_and_env_override_the_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The config says text and errors only; the flag asks for JSON and SHINGLE_LOG for info.
    let config = write_config(dir.path(), "[log]\nformat = \"text\"\nlevel = \"error\"\n");
    let mut cmd = shingle();
    cmd.args(["--log-format", "json"]).env("SHINGLE_LOG", "info");
    let stderr = serve_and_stop(cmd, &config);
    let messages = json_messages(&stderr);
    assert!(messages.contains(&("INFO".into(), "node started".into())), "{stderr}");
    // The format from the environment variable.
    let mut cmd = shingle();
    cmd.env("SHINGLE_LOG_FORMAT", "json").env("SHINGLE_LOG", "info");
    let stderr = serve_and_stop(cmd, &config);
    assert!(
        json_messages(&stderr).iter().any(|(_, m)| m == "node started"),
        "{stderr}"
    );
}

#[test]
fn text_stays_the_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "");
    let mut cmd = shingle();
    cmd.env("SHINGLE_LOG", "info");
    let stderr = serve_and_stop(cmd, &config);
    assert!(stderr.contains("node started"), "{stderr}");
    assert!(
        stderr
            .lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_err()),
        "text logs expected: {stderr}"
    );
    // Without SHINGLE_LOG or [log] level the default filter (warnings and up) applies.
    let stderr = serve_and_stop(shingle(), &config);
    assert!(!stderr.contains("node started"), "{stderr}");
}

#[test]
fn unknown_values_are_refused_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = shingle()
        .args(["--log-format", "xml", "keygen"])
        .arg(dir.path().join("k"))
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("invalid value 'xml'") && err.contains("text, json"),
        "{err}"
    );

    let out = shingle()
        .env("SHINGLE_LOG_FORMAT", "yaml")
        .arg("keygen")
        .arg(dir.path().join("k"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'yaml'"));

    for (extra, expect) in [
        (
            "[log]\nformat = \"xml\"\n",
            "unknown variant `xml`, expected `text` or `json`",
        ),
        (
            "[log]\nlevel = \"verbose\"\n",
            "'verbose' in log level 'verbose' names no level",
        ),
        ("[log]\nlevel = \"info,shingle_meta=loud\"\n", "log.level"),
        ("[log]\nformat = \"json\"\ncolour = true\n", "unknown field `colour`"),
    ] {
        let config = write_config(dir.path(), extra);
        let out = shingle()
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra} was accepted");
        assert!(err.contains(expect), "{extra}: {err}");
    }
}
