//! Trace context across processes: the client span's context goes into the frame, the
//! server span adopts it as its parent. Works with any `tracing` subscriber; the ids
//! are real only when a `tracing-opentelemetry` layer is installed.

use crate::frame::TraceContext;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The context of `span` in frame form (all zero when it has none).
pub fn inject(span: &tracing::Span) -> TraceContext {
    if span.is_disabled() {
        return TraceContext::default();
    }
    let cx = span.context();
    let otel_span = cx.span();
    let sc = otel_span.span_context();
    if !sc.is_valid() {
        return TraceContext::default();
    }
    TraceContext {
        trace_id: sc.trace_id().to_bytes(),
        span_id: sc.span_id().to_bytes(),
        flags: sc.trace_flags().to_u8(),
    }
}

/// Makes the remote context in a frame the parent of `span`.
pub fn adopt(span: &tracing::Span, remote: &TraceContext) {
    if !remote.is_valid() || span.is_disabled() {
        return;
    }
    let sc = SpanContext::new(
        TraceId::from_bytes(remote.trace_id),
        SpanId::from_bytes(remote.span_id),
        TraceFlags::new(remote.flags),
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(sc));
}
