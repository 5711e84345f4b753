//! Logs and traces. `tracing`'s spans become OpenTelemetry spans (`tracing-opentelemetry`);
//! with `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set they are
//! exported over OTLP/HTTP in batches, otherwise nothing leaves the process. W3C trace
//! context (`traceparent`) is read from requests and written on outgoing calls either way,
//! so a trace crosses instances, the bank and webhook receivers. Logs are human-readable
//! lines, or with `PAYONCE_LOG_FORMAT=json` one JSON object per line carrying the trace
//! and span ids of the span it was logged in, so logs and traces join.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

use opentelemetry::global;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::dispatcher::WeakDispatch;
use tracing::field::{Field, Visit};
use tracing::{Dispatch, Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    Text,
    /// One JSON object per line, with the trace and span ids.
    Json,
}

/// The tracer provider, kept to flush what is still batched at exit.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Sends the spans still batched (when exporting) and stops the exporter.
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("payonce: flushing traces: {error}");
        }
    }
}

/// Whether spans are exported: an OTLP endpoint is configured.
fn exporting() -> bool {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()))
}

/// Spans exported in batches over OTLP/HTTP, configured by the `OTEL_EXPORTER_OTLP_*`
/// variables.
#[cfg(feature = "otlp")]
fn with_otlp_exporter(
    provider: opentelemetry_sdk::trace::TracerProviderBuilder,
) -> Result<opentelemetry_sdk::trace::TracerProviderBuilder, Box<dyn std::error::Error>> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    Ok(provider.with_batch_exporter(exporter))
}

/// A build without the exporter refuses an endpoint rather than dropping every span
/// silently: whoever set it expects traces to arrive.
#[cfg(not(feature = "otlp"))]
fn with_otlp_exporter(
    _: opentelemetry_sdk::trace::TracerProviderBuilder,
) -> Result<opentelemetry_sdk::trace::TracerProviderBuilder, Box<dyn std::error::Error>> {
    Err("OTEL_EXPORTER_OTLP_ENDPOINT is set, but this build cannot export traces: build with `--features otlp`, e.g. `cargo build --release -p api --features otlp`".into())
}

/// Installs the process's logging and tracing: the `RUST_LOG` filter (`info,sqlx=warn`
/// by default), the log lines in `format`, and the OpenTelemetry layer.
pub fn init(format: LogFormat) -> Result<Telemetry, Box<dyn std::error::Error>> {
    global::set_text_map_propagator(TraceContextPropagator::new());
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("payonce");
    }
    let provider = SdkTracerProvider::builder().with_resource(resource.build());
    let provider = if exporting() {
        with_otlp_exporter(provider)?
    } else {
        provider
    };
    let provider = provider.build();
    let tracer = provider.tracer("payonce");
    global::set_tracer_provider(provider.clone());
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let traces = tracing_opentelemetry::layer().with_tracer(tracer);
    let registry = tracing_subscriber::registry().with(filter).with(traces);
    match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .try_init()?,
        LogFormat::Json => registry.with(JsonLines::default()).try_init()?,
    }
    Ok(Telemetry { provider })
}

/// Log lines as JSON objects on stderr: `timestamp`, `level`, `target`, `message` and the
/// event's other fields, the `span` it was logged in, and that span's `trace_id` and
/// `span_id` as OpenTelemetry knows them.
#[derive(Default)]
struct JsonLines {
    dispatch: OnceLock<WeakDispatch>,
    out: Mutex<()>,
}

impl<S> Layer<S> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        let _ = self.dispatch.set(subscriber.downgrade());
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let metadata = event.metadata();
        let mut line = serde_json::Map::new();
        line.insert(
            "timestamp".into(),
            humantime::format_rfc3339_millis(std::time::SystemTime::now())
                .to_string()
                .into(),
        );
        line.insert("level".into(), metadata.level().as_str().into());
        line.insert("target".into(), metadata.target().into());
        if let Some(message) = fields.message.take() {
            line.insert("message".into(), message.into());
        }
        if let Some(span) = ctx.event_span(event) {
            line.insert("span".into(), span.name().into());
            let context = self
                .dispatch
                .get()
                .and_then(WeakDispatch::upgrade)
                .and_then(|dispatch| {
                    tracing_opentelemetry::get_otel_context(&span.id(), &dispatch)
                });
            if let Some(context) = context {
                let span = context.span();
                let ids = span.span_context();
                if ids.is_valid() {
                    line.insert("trace_id".into(), ids.trace_id().to_string().into());
                    line.insert("span_id".into(), ids.span_id().to_string().into());
                }
            }
        }
        if !fields.others.is_empty() {
            line.insert("fields".into(), fields.others.into());
        }
        let mut text = serde_json::Value::Object(line).to_string();
        text.push('\n');
        let _held = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }
}

/// An event's fields: its message apart, the others as JSON values.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    others: serde_json::Map<String, serde_json::Value>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = Some(text);
        } else {
            self.others.insert(field.name().into(), text.into());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_owned());
        } else {
            self.others.insert(field.name().into(), value.into());
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.others.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.others.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.others.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.others.insert(field.name().into(), value.into());
    }
}

/// The W3C trace context of the current span, as headers for an outgoing call.
pub fn trace_headers() -> axum::http::HeaderMap {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let mut headers = axum::http::HeaderMap::new();
    let context = tracing::Span::current().context();
    global::get_text_map_propagator(|propagator| {
        propagator.inject_context(
            &context,
            &mut opentelemetry_http::HeaderInjector(&mut headers),
        );
    });
    headers
}

/// The trace context an incoming request carries (`traceparent`), to parent its span.
pub fn incoming_context(headers: &axum::http::HeaderMap) -> opentelemetry::Context {
    global::get_text_map_propagator(|propagator| {
        propagator.extract(&opentelemetry_http::HeaderExtractor(headers))
    })
}
