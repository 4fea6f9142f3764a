//! W3C trace context captured when an event is enqueued and carried in its envelope.
//!
//! [`TraceContext::current`] is what `enqueue` records: the context set with
//! [`TraceContext::scope`] for the running task, or else what a provider installed with
//! [`set_provider`] returns (the OpenTelemetry integration installs one).

use std::{fmt, sync::OnceLock};

/// A W3C trace context: a validated `traceparent` and an optional `tracestate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

/// A `traceparent` or `tracestate` that does not follow the W3C Trace Context format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid trace context: {0}")]
pub struct TraceContextError(String);

tokio::task_local! {
    static CURRENT: TraceContext;
}

static PROVIDER: OnceLock<fn() -> Option<TraceContext>> = OnceLock::new();

/// Install a process-wide source of the current trace context, used when no
/// [`TraceContext::scope`] is active. Only the first call takes effect; returns whether it did.
pub fn set_provider(provider: fn() -> Option<TraceContext>) -> bool {
    PROVIDER.set(provider).is_ok()
}

impl TraceContext {
    /// Validate and build a trace context.
    ///
    /// `traceparent` is `version-traceid-parentid-flags` in lowercase hex
    /// (`00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01`); the trace and parent ids may
    /// not be all zeros.
    pub fn new(
        traceparent: impl Into<String>,
        tracestate: Option<String>,
    ) -> Result<Self, TraceContextError> {
        let traceparent = traceparent.into();
        validate_traceparent(&traceparent)?;
        if let Some(state) = &tracestate
            && (state.len() > 512 || !state.bytes().all(|b| (0x20..0x7f).contains(&b)))
        {
            return Err(TraceContextError(format!(
                "tracestate must be at most 512 printable ASCII characters, got {state:?}"
            )));
        }
        Ok(TraceContext {
            traceparent,
            tracestate: tracestate.filter(|s| !s.is_empty()),
        })
    }

    /// The `traceparent` header value.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` header value, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The 32-hex-digit trace id.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The 16-hex-digit parent (span) id.
    pub fn parent_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// A child context: the same trace and flags, a new parent (span) id. Consumers run handlers
    /// in the child of the producer's context, so the trace continues across the broker.
    pub fn child(&self) -> TraceContext {
        let span_id = loop {
            let id = fastrand::u64(..);
            if id != 0 {
                break id;
            }
        };
        TraceContext {
            traceparent: format!(
                "{}-{}-{span_id:016x}-{}",
                &self.traceparent[..2],
                self.trace_id(),
                &self.traceparent[53..55]
            ),
            tracestate: self.tracestate.clone(),
        }
    }

    /// The context current for this task: the innermost [`scope`](Self::scope), else the
    /// installed provider's answer.
    pub fn current() -> Option<TraceContext> {
        CURRENT
            .try_with(Clone::clone)
            .ok()
            .or_else(|| PROVIDER.get().and_then(|provider| provider()))
    }

    /// Run `future` with this context current: events enqueued inside carry it.
    pub async fn scope<F: Future>(self, future: F) -> F::Output {
        CURRENT.scope(self, future).await
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.traceparent)
    }
}

fn validate_traceparent(tp: &str) -> Result<(), TraceContextError> {
    let err = |why: &str| TraceContextError(format!("traceparent {tp:?} {why}"));
    let parts: Vec<&str> = tp.split('-').collect();
    if parts.len() != 4 {
        return Err(err(
            "must have four dash-separated fields: version-traceid-parentid-flags",
        ));
    }
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !hex(parts[0], 2) || parts[0] == "ff" {
        return Err(err(
            "has an invalid version (two lowercase hex digits, not ff)",
        ));
    }
    if !hex(parts[1], 32) || parts[1].bytes().all(|b| b == b'0') {
        return Err(err(
            "has an invalid trace id (32 lowercase hex digits, not all zero)",
        ));
    }
    if !hex(parts[2], 16) || parts[2].bytes().all(|b| b == b'0') {
        return Err(err(
            "has an invalid parent id (16 lowercase hex digits, not all zero)",
        ));
    }
    if !hex(parts[3], 2) {
        return Err(err("has invalid flags (two lowercase hex digits)"));
    }
    Ok(())
}

/// OpenTelemetry integration (feature `opentelemetry`), through `tracing-opentelemetry`.
///
/// Call [`otel::install`] once at start-up, after installing a `tracing` subscriber with the
/// `tracing-opentelemetry` layer. From then on `enqueue` captures the W3C trace context of the
/// current span, and each `send` and `process` span (see [`crate::telemetry`]) is a child of
/// the producer's span: the trace continues across the relay and the broker.
#[cfg(feature = "opentelemetry")]
pub mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TraceContext;

    /// Take the trace context from OpenTelemetry from now on. Returns whether this call
    /// installed it (only the first provider counts).
    pub fn install() -> bool {
        super::set_provider(current)
    }

    /// The W3C trace context of the current `tracing` span's OpenTelemetry span, if it has one.
    pub fn current() -> Option<TraceContext> {
        let cx = tracing::Span::current().context();
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return None;
        }
        let traceparent = format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        );
        let state = sc.trace_state().header();
        TraceContext::new(traceparent, (!state.is_empty()).then_some(state)).ok()
    }

    /// Make `span`'s OpenTelemetry parent the (remote) span `parent` describes.
    pub fn set_parent(span: &tracing::Span, parent: &TraceContext) {
        let (Ok(trace_id), Ok(span_id), Ok(flags)) = (
            TraceId::from_hex(parent.trace_id()),
            SpanId::from_hex(parent.parent_id()),
            u8::from_str_radix(&parent.traceparent()[53..55], 16),
        ) else {
            return;
        };
        let state = parent
            .tracestate()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let remote = SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, state);
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }

    /// Whether the provider is installed (then handlers run in their own span's context).
    pub(crate) fn installed() -> bool {
        super::PROVIDER.get().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn parses_and_rejects() {
        let ctx = TraceContext::new(TP, Some("congo=t61rcWkgMzE".into())).unwrap();
        assert_eq!(ctx.trace_id(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(ctx.parent_id(), "b7ad6b7169203331");
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert!(TraceContext::new(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn child_keeps_the_trace() {
        let parent = TraceContext::new(TP, Some("k=v".into())).unwrap();
        let child = parent.child();
        assert_eq!(child.trace_id(), parent.trace_id());
        assert_ne!(child.parent_id(), parent.parent_id());
        assert!(child.traceparent().ends_with("-01"));
        assert_eq!(child.tracestate(), Some("k=v"));
        assert!(TraceContext::new(child.traceparent(), None).is_ok());
    }

    #[tokio::test]
    async fn scope_sets_current() {
        assert_eq!(TraceContext::current(), None);
        let ctx = TraceContext::new(TP, None).unwrap();
        let seen = ctx.clone().scope(async { TraceContext::current() }).await;
        assert_eq!(seen, Some(ctx));
        assert_eq!(TraceContext::current(), None);
    }
}
