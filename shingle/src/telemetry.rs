//! OpenTelemetry traces exported over OTLP (HTTP/protobuf, decision 0011).
//!
//! Off unless an endpoint is given: by `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the whole
//! URL), `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL; `/v1/traces` is appended) or the
//! node config's `[trace] endpoint` (a base URL too). The variables win over the config,
//! as `SHINGLE_LOG` does over `[log]`, and work for every command (`serve`, `mount`,
//! `dev` and its nodes, the tools, the benchmarks). The service name comes from
//! `OTEL_SERVICE_NAME`, else `[trace] service_name`, else `shingle-<role>`; sampling
//! from `OTEL_TRACES_SAMPLER`/`_ARG` (handled by the SDK), else `[trace] sample_ratio`.
//! The batch processor honours `OTEL_BSP_*`, the exporter `OTEL_EXPORTER_OTLP_TIMEOUT`
//! and `_HEADERS`, the resource `OTEL_RESOURCE_ATTRIBUTES`.
//!
//! Spans are exported from their own thread (the SDK's batch processor with a blocking
//! HTTP client), so exporting never runs on, or waits for, the tokio runtime; the
//! provider is flushed and shut down when the command ends ([`Tracing::shutdown`]).

use anyhow::{Result, bail};
use opentelemetry::trace::{Link, SpanKind, TraceContextExt, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SamplingDecision, SamplingResult, SdkTracerProvider, ShouldSample};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[trace]` of a node config.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceSection {
    /// Base URL of an OTLP/HTTP receiver (a collector, Jaeger, Tempo), e.g.
    /// `http://127.0.0.1:4318`; spans go to `<endpoint>/v1/traces`. Unset: no traces.
    pub endpoint: Option<String>,
    /// The `service.name` of this process's spans (default `shingle-<roles>`).
    pub service_name: Option<String>,
    /// Share of operations traced, 0 to 1 (default 1). A node follows the caller's
    /// decision for requests that carry one; this ratio applies to traces it starts.
    #[serde(default = "default_ratio")]
    pub sample_ratio: f64,
    /// Also trace RPCs made outside any operation (heartbeats, map polls, Raft
    /// messages, replication catch-up): many small traces (default false).
    #[serde(default)]
    pub background: bool,
}

fn default_ratio() -> f64 {
    1.0
}

impl TraceSection {
    /// Checks the values.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            bail!("trace.sample_ratio must be between 0 and 1, got {}", self.sample_ratio);
        }
        if let Some(e) = &self.endpoint {
            check_url("trace.endpoint", e)?;
        }
        if self.service_name.as_deref().is_some_and(|s| s.trim().is_empty()) {
            bail!("trace.service_name must not be empty (omit it for the default)");
        }
        Ok(())
    }
}

/// The OTLP path of traces under a base endpoint.
const TRACES_PATH: &str = "/v1/traces";

fn check_url(what: &str, url: &str) -> Result<()> {
    let Some(rest) = url.strip_prefix("http://") else {
        if url.starts_with("https://") {
            bail!(
                "{what} '{url}': Shingle exports OTLP over plain HTTP only (no TLS built in); \
                 send to a collector on the host or in the pod (http://127.0.0.1:4318) and let it forward over TLS"
            );
        }
        bail!("{what} '{url}' is not an http:// URL (e.g. http://127.0.0.1:4318)");
    };
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() || authority.contains(char::is_whitespace) {
        bail!("{what} '{url}' names no host (e.g. http://127.0.0.1:4318)");
    }
    Ok(())
}

/// A base URL with the traces path appended (unless it is there already).
fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with(TRACES_PATH) {
        base.to_string()
    } else {
        format!("{base}{TRACES_PATH}")
    }
}

/// How the sampler is chosen.
#[derive(Clone, Debug, PartialEq)]
pub enum SamplerChoice {
    /// `OTEL_TRACES_SAMPLER` is set: the SDK reads it (and `OTEL_TRACES_SAMPLER_ARG`).
    Env,
    /// Parent-based; of the traces this process starts, operations at this ratio and,
    /// when `background` is set, RPCs outside any operation too.
    Operations {
        /// Share of operations traced.
        ratio: f64,
        /// Also start traces at stray RPCs.
        background: bool,
    },
}

/// What [`resolve`] decided: where and how this process exports spans.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSetup {
    /// The full OTLP/HTTP traces URL.
    pub url: String,
    /// `service.name`.
    pub service_name: String,
    /// Sampling.
    pub sampler: SamplerChoice,
}

/// Resolves the settings from the environment (`env`) and the node config's `[trace]`
/// table; `None` when tracing is off.
pub fn resolve(
    config: Option<&TraceSection>,
    env: impl Fn(&str) -> Option<String>,
    default_service: &str,
) -> Result<Option<TraceSetup>> {
    let var = |k: &str| env(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match var("OTEL_TRACES_EXPORTER").as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => bail!(
            "OTEL_TRACES_EXPORTER={other} is not supported: Shingle exports traces over OTLP (otlp) or not at all (none)"
        ),
    }
    if let Some(c) = config {
        c.validate()?;
    }
    let url = if let Some(u) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        check_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &u)?;
        u
    } else if let Some(u) = var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        check_url("OTEL_EXPORTER_OTLP_ENDPOINT", &u)?;
        traces_url(&u)
    } else if let Some(u) = config.and_then(|c| c.endpoint.as_deref()) {
        traces_url(u)
    } else {
        return Ok(None);
    };
    for k in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
        if let Some(p) = var(k) {
            if p != "http/protobuf" {
                bail!(
                    "{k}={p} is not supported: Shingle exports OTLP as http/protobuf (port 4318 on a collector, Jaeger or Tempo)"
                );
            }
            break;
        }
    }
    let service_name = var("OTEL_SERVICE_NAME")
        .or_else(|| config.and_then(|c| c.service_name.clone()))
        .unwrap_or_else(|| default_service.to_string());
    let sampler = if var("OTEL_TRACES_SAMPLER").is_some() {
        SamplerChoice::Env
    } else {
        SamplerChoice::Operations {
            ratio: config.map_or(1.0, |c| c.sample_ratio),
            background: config.is_some_and(|c| c.background),
        }
    };
    Ok(Some(TraceSetup {
        url,
        service_name,
        sampler,
    }))
}

/// Decides for traces this process starts (the parent's decision rules otherwise):
/// RPC spans without a parent (`rpc.client`, `rpc.server` of a call that carried no
/// trace) are background traffic, dropped unless asked for; the rest is sampled by
/// trace id at the ratio.
#[derive(Clone, Debug)]
struct RootSampler {
    ratio: Sampler,
    background: bool,
}

impl ShouldSample for RootSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        if !self.background && name.starts_with("rpc.") {
            return SamplingResult {
                decision: SamplingDecision::Drop,
                attributes: Vec::new(),
                trace_state: parent_context
                    .map(|cx| cx.span().span_context().trace_state().clone())
                    .unwrap_or_default(),
            };
        }
        self.ratio
            .should_sample(parent_context, trace_id, name, span_kind, attributes, links)
    }
}

/// The process's identity in its spans.
#[derive(Clone, Debug, Default)]
pub struct Identity {
    /// Default `service.name` (`shingle-client`, `shingle-meta-data`, ...).
    pub service: String,
    /// Node id (`shingle.node.id`), for `serve`.
    pub node_id: Option<u64>,
    /// Roles (`shingle.roles`, e.g. `manager,meta,data`), for `serve`.
    pub roles: Option<String>,
}

/// A tracer provider exporting to an OTLP receiver; flush and shut it down at exit.
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Builds the exporter and the provider (nothing is sent until spans end).
    pub fn start(setup: &TraceSetup, id: &Identity) -> Result<Tracing> {
        use opentelemetry_otlp::WithExportConfig;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(setup.url.clone())
            .build()
            .map_err(|e| anyhow::anyhow!("OTLP exporter for {}: {e}", setup.url))?;
        let mut attrs = vec![
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("process.pid", i64::from(std::process::id())),
        ];
        if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            attrs.push(KeyValue::new("host.name", h.trim().to_string()));
        }
        if let Some(n) = id.node_id {
            attrs.push(KeyValue::new("shingle.node.id", n as i64));
        }
        if let Some(r) = &id.roles {
            attrs.push(KeyValue::new("shingle.roles", r.clone()));
        }
        let resource = Resource::builder()
            .with_attributes(attrs)
            .with_service_name(setup.service_name.clone())
            .build();
        let mut builder = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource);
        if let SamplerChoice::Operations { ratio, background } = setup.sampler {
            builder = builder.with_sampler(Sampler::ParentBased(Box::new(RootSampler {
                ratio: Sampler::TraceIdRatioBased(ratio),
                background,
            })));
        }
        Ok(Tracing {
            provider: builder.build(),
        })
    }

    /// The provider (for the tracing layer).
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// Exports the spans still queued and stops the exporter (waits at most a few
    /// seconds, so an unreachable collector never holds up a shutdown).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown_with_timeout(Duration::from_secs(5)) {
            eprintln!("shingle: traces not flushed at exit: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with_env<'a>(vars: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<String> + 'a {
        let m: HashMap<&str, &str> = vars.iter().copied().collect();
        move |k| m.get(k).map(|v| v.to_string())
    }

    fn section(toml: &str) -> TraceSection {
        toml::from_str(toml).expect("parse [trace]")
    }

    #[test]
    fn off_without_an_endpoint() {
        assert_eq!(resolve(None, with_env(&[]), "shingle-client").expect("ok"), None);
        let s = section("service_name = \"x\"\nsample_ratio = 0.5");
        assert_eq!(resolve(Some(&s), with_env(&[]), "shingle-node").expect("ok"), None);
        let on = section("endpoint = \"http://c:4318\"");
        for off in [("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "none")] {
            assert_eq!(resolve(Some(&on), with_env(&[off]), "n").expect("ok"), None, "{off:?}");
        }
    }

    #[test]
    fn variables_win_over_the_config_and_paths_are_completed() {
        let s = section("endpoint = \"http://collector:4318/\"\nservice_name = \"storage-a\"\nsample_ratio = 0.25");
        let r = resolve(Some(&s), with_env(&[]), "shingle-meta-data")
            .expect("ok")
            .expect("on");
        assert_eq!(r.url, "http://collector:4318/v1/traces");
        assert_eq!(r.service_name, "storage-a");
        assert_eq!(
            r.sampler,
            SamplerChoice::Operations {
                ratio: 0.25,
                background: false
            }
        );
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318"),
            ("OTEL_SERVICE_NAME", "from-env"),
            ("OTEL_TRACES_SAMPLER", "always_on"),
        ];
        let r = resolve(Some(&s), with_env(&env), "n").expect("ok").expect("on");
        assert_eq!(r.url, "http://other:4318/v1/traces");
        assert_eq!(r.service_name, "from-env");
        assert_eq!(r.sampler, SamplerChoice::Env);
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://tempo:4318/custom/path"),
        ];
        let r = resolve(None, with_env(&env), "shingle-client")
            .expect("ok")
            .expect("on");
        assert_eq!(r.url, "http://tempo:4318/custom/path");
        assert_eq!(r.service_name, "shingle-client");
        assert_eq!(
            r.sampler,
            SamplerChoice::Operations {
                ratio: 1.0,
                background: false
            }
        );
    }

    #[test]
    fn nonsense_is_refused_with_the_reason() {
        for (toml, want) in [
            ("endpoint = \"http://c:4318\"\nsample_ratio = 1.5", "sample_ratio"),
            ("endpoint = \"http://c:4318\"\nsample_ratio = -0.1", "sample_ratio"),
            ("endpoint = \"https://c:4318\"", "TLS"),
            ("endpoint = \"c:4318\"", "http://"),
            ("endpoint = \"http:///v1/traces\"", "no host"),
            ("endpoint = \"http://c:4318\"\nservice_name = \" \"", "service_name"),
        ] {
            let e = resolve(Some(&section(toml)), with_env(&[]), "n").expect_err(toml);
            assert!(format!("{e:#}").contains(want), "{toml}: {e:#}");
        }
        assert!(toml::from_str::<TraceSection>("endpont = \"http://c\"").is_err());
        for env in [
            [
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
            [
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_EXPORTER", "zipkin"),
            ],
        ] {
            assert!(resolve(None, with_env(&env), "n").is_err(), "{env:?}");
        }
        let ok = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ];
        assert!(
            resolve(None, with_env(&ok), "n")
                .expect("traces protocol wins")
                .is_some()
        );
    }

    #[test]
    fn stray_rpcs_start_no_trace_unless_asked() {
        let cx = Context::new();
        let id = TraceId::from_bytes([0x11; 16]);
        let decide = |background: bool, name: &str| {
            RootSampler {
                ratio: Sampler::TraceIdRatioBased(1.0),
                background,
            }
            .should_sample(Some(&cx), id, name, &SpanKind::Client, &[], &[])
            .decision
        };
        assert_eq!(decide(false, "rpc.client"), SamplingDecision::Drop);
        assert_eq!(decide(false, "fs.read"), SamplingDecision::RecordAndSample);
        assert_eq!(decide(true, "rpc.client"), SamplingDecision::RecordAndSample);
        let none = RootSampler {
            ratio: Sampler::TraceIdRatioBased(0.0),
            background: true,
        };
        assert_eq!(
            none.should_sample(Some(&cx), id, "fs.read", &SpanKind::Internal, &[], &[])
                .decision,
            SamplingDecision::Drop
        );
    }
}
