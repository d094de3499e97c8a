//! Log output: human-readable text (the default) or one JSON object per line, on stderr.
//!
//! The format comes from `--log-format` / `SHINGLE_LOG_FORMAT`, else the node config's
//! `[log] format`, else text. The level filter comes from `SHINGLE_LOG`, else the node
//! config's `[log] level`, else [`DEFAULT_FILTER`]. When traces are exported
//! (`crate::telemetry`), a tracing-opentelemetry layer sits next to the log output, with
//! its own filter.

use crate::telemetry::Tracing;
use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;
use tracing_subscriber::EnvFilter;

/// The filter when neither `SHINGLE_LOG` nor `[log] level` sets one: warnings and errors,
/// and only errors from the Raft library (openraft).
pub const DEFAULT_FILTER: &str = "warn,openraft=error";

/// The environment variable that sets the level filter (an `EnvFilter` directive).
pub const LEVEL_ENV: &str = "SHINGLE_LOG";

/// The environment variable that sets the format (same values as `--log-format`).
pub const FORMAT_ENV: &str = "SHINGLE_LOG_FORMAT";

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (timestamp, level, target, message, fields).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (with
    /// `message`), and `span` / `spans` when inside a span.
    Json,
}

impl LogFormat {
    /// The name used on the command line and in config files.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// The format given on the command line (or by `SHINGLE_LOG_FORMAT`), if any; passed on to
/// the node processes `shingle dev` and the benchmarks start.
static CLI_FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// The format given on the command line, if any.
pub fn cli_format() -> Option<LogFormat> {
    CLI_FORMAT.get().copied()
}

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks a level filter such as `info` or `warn,shingle_meta=debug` and builds it.
/// Stricter than `EnvFilter` alone: every directive must end in a level name, so a typo
/// such as `verbose` or `shingle_meta=loud` is an error instead of a filter that
/// silently enables (or hides) something else.
pub fn parse_filter(s: &str) -> Result<EnvFilter> {
    let directives: Vec<&str> = s.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
    if directives.is_empty() {
        bail!("empty log level: use one of off, error, warn, info, debug, trace (e.g. `info,shingle_meta=debug`)");
    }
    for d in &directives {
        let level = d.rsplit_once('=').map_or(*d, |(_, l)| l).trim();
        if !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(level)) {
            bail!(
                "'{d}' in log level '{s}' names no level: use off, error, warn, info, debug or trace, \
                 alone or per module as MODULE=LEVEL (e.g. `info,shingle_meta=debug`)"
            );
        }
    }
    // Spaces after the commas are fine here (EnvFilter itself refuses them).
    EnvFilter::builder()
        .parse(directives.join(","))
        .map_err(|e| anyhow::anyhow!("log level '{s}': {e}"))
}

/// Installs the global subscriber. `cli` is `--log-format` (or `SHINGLE_LOG_FORMAT`);
/// `config` is the node config's `[log]` format and level, for `shingle serve`; `traces`
/// adds the OpenTelemetry layer next to the log output when an OTLP endpoint is set.
///
/// The two outputs filter separately: the log level (`SHINGLE_LOG`, `[log] level`)
/// decides what is written to stderr, [`trace_filter`] what becomes spans (so a quiet
/// log still gets full traces, and a debug log adds no spans).
pub fn init(cli: Option<LogFormat>, config: Option<(LogFormat, Option<&str>)>, traces: Option<&Tracing>) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    if let Some(f) = cli {
        let _ = CLI_FORMAT.set(f);
    }
    let format = cli.or(config.map(|(f, _)| f)).unwrap_or_default();
    // SHINGLE_LOG wins over the config (as before: an unusable value falls back).
    let filter = EnvFilter::try_from_env(LEVEL_ENV).unwrap_or_else(|_| {
        config
            .and_then(|(_, level)| level)
            .and_then(|l| parse_filter(l).ok())
            .unwrap_or_else(|| DEFAULT_FILTER.into())
    });
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    // Colours only for a person at a terminal: a log file (a node's stderr under
    // `shingle dev`, systemd, kubectl logs) gets plain text that grep finds.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let fmt = match format {
        LogFormat::Text => fmt.with_ansi(colour).with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().with_ansi(false).with_filter(filter).boxed(),
    };
    let otel = traces.map(|t| {
        use opentelemetry::trace::TracerProvider as _;
        tracing_opentelemetry::layer()
            .with_tracer(t.provider().tracer("shingle"))
            // Thread names mean nothing for tasks that move between worker threads.
            .with_threads(false)
            .with_filter(trace_filter())
    });
    tracing_subscriber::registry().with(fmt).with(otel).init();
}

/// What becomes spans (and span events) when traces are exported: Shingle's own spans
/// and events at info and above (`shingle=info`); nothing from libraries (Raft, HTTP,
/// the exporter itself).
fn trace_filter() -> tracing_subscriber::filter::Targets {
    // "shingle" is a prefix of every crate of the workspace (shingle_meta, ...).
    tracing_subscriber::filter::Targets::new().with_target("shingle", tracing::Level::INFO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_need_a_level_in_every_directive() {
        for ok in [
            "info",
            "WARN",
            "warn,openraft=error",
            "info, shingle_meta=debug",
            "shingle_transport::server=trace",
            "off",
        ] {
            assert!(parse_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["", " , ", "verbose", "shingle_meta", "info,shingle_meta=loud", "3"] {
            let e = parse_filter(bad).expect_err(bad).to_string();
            assert!(e.contains("level"), "{bad}: {e}");
        }
    }
}
