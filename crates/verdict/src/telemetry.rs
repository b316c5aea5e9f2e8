//! Traces over OTLP (HTTP, protobuf), off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set.
//!
//! Off, nothing of OpenTelemetry is installed: no layer, no exporter, and the spans that only
//! traces need are never made ([`span!`] makes `Span::none()`), so a request costs what it did
//! before. On, [`Tracing::layer`] turns verdict's own spans into OpenTelemetry spans, which a
//! batch processor exports from a thread of its own: a request only records spans, it never
//! waits for the collector. [`Tracing::shutdown`] flushes what is queued.
//!
//! The W3C trace context crosses the process boundary twice: a request's `traceparent` (when
//! it is well-formed and no longer than [`MAX_TRACE_HEADER`]) makes the request span a child of
//! the caller's span ([`continue_trace`]), and every callback and connector call carries a
//! `traceparent` naming its own span ([`outbound_headers`]). Both go through the
//! `opentelemetry` SDK's `TraceContextPropagator`.

use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Status, TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::{Span, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// The target of the spans only traces need (`decide`, `commit`, `callback`,
/// `connector_call`): the logs leave them out, so a log line reads the same with tracing on.
pub const TARGET: &str = "verdict::telemetry";

/// The longest `traceparent` or `tracestate` value read from a request. A `traceparent` is 55
/// bytes; W3C asks a `tracestate` of at most 512 to be kept. A longer one is a client's to
/// ignore, not to parse.
pub const MAX_TRACE_HEADER: usize = 512;

/// The service name when `OTEL_SERVICE_NAME` is unset.
pub const DEFAULT_SERVICE_NAME: &str = "verdict";

/// Whether traces are on: set once, by [`Tracing::layer`].
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether traces are on in this process. One relaxed load: what a request pays when they are
/// off.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// An INFO span under [`TARGET`] while traces are on; `Span::none()` (no allocation, nothing
/// recorded) while they are off. Takes what `tracing::info_span!` takes after the target.
macro_rules! span {
    ($($fields:tt)*) => {
        if $crate::telemetry::enabled() {
            ::tracing::info_span!(target: $crate::telemetry::TARGET, $($fields)*)
        } else {
            ::tracing::Span::none()
        }
    };
}
pub(crate) use span;

/// Why traces could not be set up or flushed.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL={0:?}: verdict exports traces as http/protobuf only")]
    Protocol(String),
    #[error("could not build the OTLP trace exporter")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
    #[error("could not flush the traces at shutdown")]
    Shutdown(#[source] opentelemetry_sdk::error::OTelSdkError),
}

/// The trace pipeline: a tracer provider with a batch exporter. Dropping it without
/// [`Tracing::shutdown`] loses the spans still queued.
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Traces as the standard variables ask: `None` unless an OTLP endpoint is set (and
    /// `OTEL_SDK_DISABLED` is not `true`). The exporter reads the rest itself
    /// (`OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`, the `OTEL_BSP_*` batch settings).
    pub fn from_env() -> Result<Option<Tracing>, TelemetryError> {
        let var = |name: &str| std::env::var(name).ok();
        if !wanted(var) {
            return Ok(None);
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(protocol) = var(name).filter(|p| !p.is_empty() && p != "http/protobuf") {
                return Err(TelemetryError::Protocol(protocol));
            }
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()
            .map_err(TelemetryError::Exporter)?;
        let resource = Resource::builder()
            .with_service_name(service_name(var))
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        Ok(Some(Tracing { provider }))
    }

    /// The layer that makes verdict's spans OpenTelemetry spans, and the log lines inside
    /// them span events: what `VERDICT_LOG` keeps (its default keeps every span verdict
    /// makes). From now on the trace-only spans ([`span!`]) are made.
    ///
    /// It takes no filter of its own: beside the logs' per-layer filter, a per-layer filter
    /// here missed the spans of the first request (tracing-subscriber 0.3), so both go under
    /// `VERDICT_LOG`'s one filter.
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let tracer = self.provider.tracer("verdict");
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false);
        ENABLED.store(true, Ordering::Relaxed);
        layer
    }

    /// Exports what is queued and stops the exporter. Blocks until then (at most the SDK's
    /// shutdown timeout), so it runs on a blocking thread.
    pub async fn shutdown(self) -> Result<(), TelemetryError> {
        let provider = self.provider;
        tokio::task::spawn_blocking(move || provider.shutdown())
            .await
            .unwrap_or(Ok(()))
            .map_err(TelemetryError::Shutdown)
    }
}

/// Whether the environment (`var`) asks for traces.
fn wanted(var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// `OTEL_SERVICE_NAME`, or [`DEFAULT_SERVICE_NAME`].
fn service_name(var: impl Fn(&str) -> Option<String>) -> String {
    var("OTEL_SERVICE_NAME")
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned())
}

/// Makes `span` (not yet entered) a child of the caller's span named by `headers`'
/// `traceparent`. A missing, malformed or oversized one leaves `span` the root of a new
/// trace: the request goes on as any other. Does nothing while traces are off.
pub fn continue_trace(span: &Span, headers: &HeaderMap) {
    if !enabled() {
        return;
    }
    if let Some(parent) = caller_context(headers) {
        // Only fails for a span the layer does not see, which then has no parent to set.
        let _ = span.set_parent(parent);
    }
}

/// The caller's trace context in `headers`, if a valid one is there.
fn caller_context(headers: &HeaderMap) -> Option<opentelemetry::Context> {
    let context = TraceContextPropagator::new().extract(&Bounded(headers));
    context.span().span_context().is_remote().then_some(context)
}

/// The headers naming the current span for an outbound call (`traceparent`, and the caller's
/// `tracestate` passed on); `None` while traces are off or outside any traced span.
pub fn outbound_headers() -> Option<HeaderMap> {
    if !enabled() {
        return None;
    }
    let context = Span::current().context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut headers = HeaderMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut Headers(&mut headers));
    Some(headers)
}

/// Records an answered request's status on its span (and marks a 5xx failed). Does nothing
/// while traces are off.
pub fn record_response(span: &Span, status: u16) {
    if !enabled() {
        return;
    }
    span.set_attribute("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.set_status(Status::error("server error"));
    }
}

/// Records an outbound call's result on its span: the HTTP status if there was an answer,
/// the outcome, and a failed status unless it was delivered. Does nothing while traces are
/// off.
pub fn record_call(span: &Span, status: Option<u16>, outcome: &'static str, delivered: bool) {
    if !enabled() {
        return;
    }
    if let Some(status) = status {
        span.set_attribute("http.response.status_code", i64::from(status));
    }
    span.set_attribute("outcome", outcome);
    if !delivered {
        span.set_status(Status::error(outcome));
    }
}

/// A request's headers as the propagator reads them: a `traceparent` or `tracestate` longer
/// than [`MAX_TRACE_HEADER`], or not ASCII, reads as absent.
struct Bounded<'a>(&'a HeaderMap);

impl Extractor for Bounded<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let value = self.0.get(key)?;
        if value.len() > MAX_TRACE_HEADER {
            return None;
        }
        value.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// An outbound request's headers as the propagator writes them.
struct Headers<'a>(&'a mut HeaderMap);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes only its own names and printable ASCII values.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::try_from(value),
        ) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceId};

    const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const PARENT: &str = "b7ad6b7169203331";

    fn headers(pairs: &[(&str, String)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers
    }

    fn traceparent() -> (&'static str, String) {
        ("traceparent", format!("00-{TRACE}-{PARENT}-01"))
    }

    #[test]
    fn a_well_formed_traceparent_names_the_callers_span() {
        let context = caller_context(&headers(&[
            traceparent(),
            ("tracestate", "vendor=opaque".into()),
        ]))
        .unwrap();
        let caller = context.span().span_context().clone();
        assert_eq!(caller.trace_id(), TraceId::from_hex(TRACE).unwrap());
        assert_eq!(caller.span_id(), SpanId::from_hex(PARENT).unwrap());
        assert!(caller.is_sampled());
        assert_eq!(caller.trace_state().get("vendor"), Some("opaque"));
    }

    #[test]
    fn a_malformed_or_missing_traceparent_starts_a_new_trace() {
        let bad = [
            "",
            "garbage",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01x",
        ];
        for value in bad {
            let found = caller_context(&headers(&[("traceparent", value.into())]));
            assert!(found.is_none(), "{value:?}");
        }
        assert!(caller_context(&HeaderMap::new()).is_none());
    }

    #[test]
    fn oversized_trace_headers_are_ignored() {
        // A later version may carry more fields, and the propagator reads it; padded past the
        // bound, it is not read at all.
        let short = format!("01-{TRACE}-{PARENT}-01-{}", "a".repeat(8));
        assert!(caller_context(&headers(&[("traceparent", short)])).is_some());
        let long = format!("01-{TRACE}-{PARENT}-01-{}", "a".repeat(MAX_TRACE_HEADER));
        assert!(caller_context(&headers(&[("traceparent", long)])).is_none());
        // An oversized tracestate is dropped; the traceparent beside it still counts.
        let members: Vec<String> = (0..40).map(|i| format!("k{i}=v{i}-padding")).collect();
        let state = members.join(",");
        assert!(state.len() > MAX_TRACE_HEADER);
        let context = caller_context(&headers(&[traceparent(), ("tracestate", state)])).unwrap();
        let caller = context.span().span_context().clone();
        assert_eq!(caller.span_id(), SpanId::from_hex(PARENT).unwrap());
        assert_eq!(caller.trace_state().header(), "");
        // At the bound exactly, it is read.
        let at_bound = format!("00-{TRACE}-{PARENT}-01");
        assert!(at_bound.len() <= MAX_TRACE_HEADER);
        assert!(caller_context(&headers(&[("traceparent", at_bound)])).is_some());
    }

    #[test]
    fn traces_are_wanted_only_with_an_endpoint_and_not_disabled() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert!(!wanted(env(&[])));
        assert!(!wanted(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "")])));
        assert!(!wanted(env(&[("OTEL_SERVICE_NAME", "x")])));
        assert!(wanted(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4318"
        )])));
        assert!(wanted(env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/traces"
        )])));
        assert!(!wanted(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ])));
        assert_eq!(service_name(env(&[])), "verdict");
        assert_eq!(service_name(env(&[("OTEL_SERVICE_NAME", " ")])), "verdict");
        assert_eq!(
            service_name(env(&[("OTEL_SERVICE_NAME", "verdict-eu")])),
            "verdict-eu"
        );
    }

    #[test]
    fn nothing_is_propagated_while_traces_are_off() {
        assert!(!enabled());
        assert!(outbound_headers().is_none());
        let none = span!("decide");
        assert!(none.is_none());
    }
}
