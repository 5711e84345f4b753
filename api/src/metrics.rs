//! Prometheus metrics (OpenMetrics text at `/metrics`), one registry per server so that
//! several servers in one process (the tests) keep separate counts.
//!
//! The HTTP metric follows OpenTelemetry's semantic conventions as Prometheus exposes them:
//! `http.server.request.duration` (seconds) is the histogram
//! `http_server_request_duration_seconds` with the labels `http_request_method`,
//! `http_route` and `http_response_status_code`, and the conventions' buckets; its
//! `_count` is the request count. payonce's own metrics are `payonce_*`. A metric measured
//! in seconds says so (`# UNIT`, and the `_seconds` suffix); the rest count things —
//! spends, calls, requests — which OpenTelemetry writes as annotations (`{request}`)
//! and Prometheus leaves out of the name, so their help text names what they count.
//!
//! The lock metrics carry the lock service (`lock_service="redis"`, …) as a label, so a
//! dashboard over instances on different services can tell them apart. Labelled families
//! whose values are known in advance (payout outcomes, webhook results, grants) start
//! with every value at zero: a rate over a series that does not exist yet is no answer at
//! all, where over a zero it is 0.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry, Unit};
use std::sync::atomic::AtomicU64;
use tokio::time::Instant;

/// The attributes OpenTelemetry's conventions give `http.server.request.duration`, as
/// Prometheus labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    http_request_method: &'static str,
    http_route: String,
    http_response_status_code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GrantLabels {
    how: &'static str,
}

/// What a call to the bank came to (`payouts.rs`).
const PAYOUT_OUTCOMES: [&str; 3] = ["made", "refused", "no_word"];
/// How a payout settled.
const PAYOUT_SETTLEMENTS: [&str; 2] = ["succeeded", "failed"];
/// What a webhook delivery attempt came to (`webhooks/`).
const WEBHOOK_RESULTS: [&str; 4] = ["delivered", "retried", "exhausted", "endpoint_gone"];
/// The states the hold gauge counts.
const HOLD_STATES: [&str; 2] = ["held", "overdue"];
/// How a spend got its account's lock: free at once, or handed off by a holder it waited
/// behind.
const GRANTS: [&str; 2] = ["free", "handed_off"];

/// The buckets OpenTelemetry's conventions advise for `http.server.request.duration`.
const HTTP_DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

fn http_duration_histogram() -> Histogram {
    Histogram::new(HTTP_DURATION_BUCKETS)
}

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~16 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// A metric as `/metrics` describes it: its name (after its registry's prefix), its help
/// text, and whether it is measured in seconds (`# UNIT`, `_seconds`) or counts things.
struct Described {
    name: &'static str,
    help: &'static str,
    in_seconds: bool,
}

/// Registers `metric` as `described`.
fn register(registry: &mut Registry, described: &Described, metric: impl Metric) {
    if described.in_seconds {
        registry.register_with_unit(described.name, described.help, Unit::Seconds, metric);
    } else {
        registry.register(described.name, described.help, metric);
    }
}

const HTTP_DURATION: Described = Described {
    name: "http_server_request_duration",
    help: "Duration of HTTP server requests, by method, route template and status (OpenTelemetry's http.server.request.duration; its count is the requests)",
    in_seconds: true,
};
const REPLAYS: Described = Described {
    name: "replays",
    help: "Spends answered with a stored outcome",
    in_seconds: false,
};
const EXECUTIONS: Described = Described {
    name: "executions",
    help: "Spends executed (outcome stored for the first time)",
    in_seconds: false,
};
const LOCK_WAIT: Described = Described {
    name: "lock_wait",
    help: "Time spends waited for their account's lock",
    in_seconds: true,
};
const LOCK_GRANTS: Described = Described {
    name: "lock_grants",
    help: "Account locks spends got, by how: free at once, or handed off by the holder they waited behind",
    in_seconds: false,
};
const COMMIT_DURATION: Described = Described {
    name: "ledger_commit_duration",
    help: "Time a spend's commit took in the ledger, its wait for the group commit's next batch included",
    in_seconds: true,
};
const AUDIT_VIOLATIONS: Described = Described {
    name: "audit_violations",
    help: "Broken ledger invariants the last periodic audit found (0: clean; see PAYONCE_AUDIT_EVERY)",
    in_seconds: false,
};
const AUDIT_COMPLETED: Described = Described {
    name: "audit_completed_timestamp",
    help: "When the last periodic audit of the ledger finished, as a Unix time (0: none yet)",
    in_seconds: true,
};
const LOCKS_LOST: Described = Described {
    name: "locks_lost",
    help: "Spends refused because the lock was lost or a newer holder had written",
    in_seconds: false,
};
const STALE_TOKENS: Described = Described {
    name: "stale_fencing_tokens",
    help: "Writes the ledger refused for carrying an old fencing token",
    in_seconds: false,
};
const LOCK_TIMEOUTS: Described = Described {
    name: "lock_timeouts",
    help: "Spends that gave up waiting for their account's lock (409)",
    in_seconds: false,
};
const LOCK_QUEUE_FULL: Described = Described {
    name: "lock_queue_full",
    help: "Spends turned away because their account already had as many waiters as it takes (409)",
    in_seconds: false,
};
const RATE_LIMITED: Described = Described {
    name: "rate_limited",
    help: "Requests refused by a rate limit (429)",
    in_seconds: false,
};
const KEY_LOOKUPS: Described = Described {
    name: "key_lookups",
    help: "API keys looked up in the database: keys this instance did not remember",
    in_seconds: false,
};
const PAYOUT_ATTEMPTS: Described = Described {
    name: "payout_attempts",
    help: "Calls to the bank for payouts, by what came of them: made, refused, or no word",
    in_seconds: false,
};
const PAYOUTS: Described = Described {
    name: "payouts",
    help: "Payouts pending (status=\"pending\"), as last counted",
    in_seconds: false,
};
const PAYOUTS_SETTLED: Described = Described {
    name: "payouts_settled",
    help: "Payouts this instance settled, by status: succeeded or failed",
    in_seconds: false,
};
const OLDEST_PENDING_PAYOUT: Described = Described {
    name: "payout_oldest_pending",
    help: "How long the oldest pending payout has waited for the bank's word (0: none pending)",
    in_seconds: true,
};
const WEBHOOK_ATTEMPTS: Described = Described {
    name: "webhook_attempts",
    help: "Webhook delivery attempts this instance recorded, by result: delivered, retried (a failure with attempts left), exhausted, endpoint_gone (410)",
    in_seconds: false,
};
const WEBHOOK_DELIVERY_LAG: Described = Described {
    name: "webhook_delivery_lag",
    help: "From an event's commit to its delivery, for deliveries this instance made",
    in_seconds: true,
};
const WEBHOOKS_PENDING: Described = Described {
    name: "webhooks_pending",
    help: "Webhook deliveries not done yet, as last counted",
    in_seconds: false,
};
const OLDEST_UNDELIVERED_WEBHOOK: Described = Described {
    name: "webhook_oldest_undelivered",
    help: "How long ago the oldest undelivered webhook's event committed (0: none waiting)",
    in_seconds: true,
};
const HOLDS: Described = Described {
    name: "holds",
    help: "Holds held, as last counted, by state: held (setting money aside) or overdue (past their expiry, expired to every reader, not yet recorded by a sweep; see PAYONCE_HOLD_SWEEP)",
    in_seconds: false,
};
const HOLDS_EXPIRED: Described = Described {
    name: "holds_expired",
    help: "Holds this instance's sweeps recorded expired, each released with its hold.expired event",
    in_seconds: false,
};
const DEPENDENCY_UP: Described = Described {
    name: "dependency_up",
    help: "Whether the database and the lock store answered (1) or not (0) within 2 s, asked at each scrape as readiness asks",
    in_seconds: false,
};

/// The service's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    http_duration: Family<HttpLabels, Histogram, fn() -> Histogram>,
    replays: Counter,
    executions: Counter,
    lock_wait: Histogram,
    lock_grants: Family<GrantLabels, Counter>,
    commit_duration: Histogram,
    audit_violations: Gauge,
    audit_completed: Gauge<f64, AtomicU64>,
    locks_lost: Counter,
    stale_tokens: Counter,
    lock_timeouts: Counter,
    lock_queue_full: Counter,
    rate_limited: Counter,
    key_lookups: Counter,
    payout_attempts: Family<OutcomeLabels, Counter>,
    payouts: Family<StatusLabels, Gauge>,
    payouts_settled: Family<StatusLabels, Counter>,
    oldest_pending_payout: Gauge<f64, AtomicU64>,
    webhook_attempts: Family<ResultLabels, Counter>,
    webhook_delivery_lag: Histogram,
    webhooks_pending: Gauge,
    oldest_undelivered_webhook: Gauge<f64, AtomicU64>,
    holds: Family<StateLabels, Gauge>,
    holds_expired: Counter,
    dependency_up: Family<DependencyLabels, Gauge>,
    batch_sizes: Arc<BatchSizes>,
}

/// The ledger's group commit batch sizes, as read at the last scrape, served as the
/// histogram `payonce_ledger_batch_size` (on PostgreSQL: SQLite has no group commit).
#[derive(Debug, Default)]
struct BatchSizes(std::sync::Mutex<Vec<(usize, u64)>>);

/// Upper bounds of the batch-size buckets (spends per statement).
const BATCH_BOUNDS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, f64::INFINITY];

impl prometheus_client::collector::Collector for BatchSizes {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let counts = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if counts.is_empty() {
            return Ok(());
        }
        let mut buckets: Vec<(f64, u64)> = BATCH_BOUNDS.iter().map(|bound| (*bound, 0)).collect();
        let (mut sum, mut count) = (0.0, 0);
        for (size, batches) in counts {
            // Bucket counts are per bucket here; the encoder makes them cumulative.
            let size = size as f64;
            if let Some(bucket) = buckets.iter_mut().find(|(bound, _)| size <= *bound) {
                bucket.1 += batches;
            }
            sum += size * batches as f64;
            count += batches;
        }
        let mut metric = encoder.encode_descriptor(
            "ledger_batch_size",
            "Spends per statement the ledger's group commit sent (PostgreSQL; holds' steps included), counted since the instance started",
            None,
            prometheus_client::metrics::MetricType::Histogram,
        )?;
        metric
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DependencyLabels {
    dependency: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric at zero, for locks in this process.
    pub fn new() -> Self {
        Self::for_lock_service("in_process")
    }

    /// A fresh registry with every metric at zero, the lock metrics labelled with
    /// `lock_service`.
    pub fn for_lock_service(lock_service: &'static str) -> Self {
        let mut registry = Registry::default();
        let metrics = Self::unregistered();
        metrics.register(&mut registry, lock_service);
        metrics.start_known_series_at_zero();
        Self {
            registry,
            ..metrics
        }
    }

    /// Every metric at zero, in an empty registry.
    fn unregistered() -> Self {
        Self {
            registry: Registry::default(),
            http_duration: Family::new_with_constructor(http_duration_histogram),
            replays: Counter::default(),
            executions: Counter::default(),
            lock_wait: latency_histogram(),
            lock_grants: Family::default(),
            commit_duration: latency_histogram(),
            audit_violations: Gauge::default(),
            audit_completed: Gauge::default(),
            locks_lost: Counter::default(),
            stale_tokens: Counter::default(),
            lock_timeouts: Counter::default(),
            lock_queue_full: Counter::default(),
            rate_limited: Counter::default(),
            key_lookups: Counter::default(),
            payout_attempts: Family::default(),
            payouts: Family::default(),
            payouts_settled: Family::default(),
            oldest_pending_payout: Gauge::default(),
            webhook_attempts: Family::default(),
            webhook_delivery_lag: latency_histogram(),
            webhooks_pending: Gauge::default(),
            oldest_undelivered_webhook: Gauge::default(),
            holds: Family::default(),
            holds_expired: Counter::default(),
            dependency_up: Family::default(),
            batch_sizes: Arc::new(BatchSizes::default()),
        }
    }

    /// Registers every metric as the table above describes it: the HTTP histogram at the
    /// top, payonce's own under `payonce_`, the lock metrics also labelled with
    /// `lock_service`. `/metrics` lists them in this order.
    fn register(&self, registry: &mut Registry, lock_service: &'static str) {
        register(registry, &HTTP_DURATION, self.http_duration.clone());
        let own = registry.sub_registry_with_prefix("payonce");
        register(own, &REPLAYS, self.replays.clone());
        register(own, &EXECUTIONS, self.executions.clone());
        register(own, &COMMIT_DURATION, self.commit_duration.clone());
        register(own, &AUDIT_VIOLATIONS, self.audit_violations.clone());
        register(own, &AUDIT_COMPLETED, self.audit_completed.clone());
        register(own, &LOCKS_LOST, self.locks_lost.clone());
        register(own, &STALE_TOKENS, self.stale_tokens.clone());
        register(own, &LOCK_TIMEOUTS, self.lock_timeouts.clone());
        register(own, &LOCK_QUEUE_FULL, self.lock_queue_full.clone());
        register(own, &RATE_LIMITED, self.rate_limited.clone());
        register(own, &KEY_LOOKUPS, self.key_lookups.clone());
        register(own, &PAYOUT_ATTEMPTS, self.payout_attempts.clone());
        register(own, &PAYOUTS, self.payouts.clone());
        register(own, &PAYOUTS_SETTLED, self.payouts_settled.clone());
        register(
            own,
            &OLDEST_PENDING_PAYOUT,
            self.oldest_pending_payout.clone(),
        );
        register(own, &WEBHOOK_ATTEMPTS, self.webhook_attempts.clone());
        register(
            own,
            &WEBHOOK_DELIVERY_LAG,
            self.webhook_delivery_lag.clone(),
        );
        register(own, &WEBHOOKS_PENDING, self.webhooks_pending.clone());
        register(
            own,
            &OLDEST_UNDELIVERED_WEBHOOK,
            self.oldest_undelivered_webhook.clone(),
        );
        register(own, &HOLDS, self.holds.clone());
        register(own, &HOLDS_EXPIRED, self.holds_expired.clone());
        register(own, &DEPENDENCY_UP, self.dependency_up.clone());
        own.register_collector(Box::new(self.batch_sizes.clone()));
        // A sub-registry is listed after its parent's metrics, whenever it was made.
        let locks = own.sub_registry_with_label(("lock_service".into(), lock_service.into()));
        register(locks, &LOCK_WAIT, self.lock_wait.clone());
        register(locks, &LOCK_GRANTS, self.lock_grants.clone());
    }

    /// Starts every series whose labels are known in advance at zero.
    fn start_known_series_at_zero(&self) {
        for how in GRANTS {
            drop(self.lock_grants.get_or_create(&GrantLabels { how }));
        }
        for outcome in PAYOUT_OUTCOMES {
            drop(
                self.payout_attempts
                    .get_or_create(&OutcomeLabels { outcome }),
            );
        }
        for status in PAYOUT_SETTLEMENTS {
            drop(self.payouts_settled.get_or_create(&StatusLabels { status }));
        }
        drop(
            self.payouts
                .get_or_create(&StatusLabels { status: "pending" }),
        );
        for state in HOLD_STATES {
            drop(self.holds.get_or_create(&StateLabels { state }));
        }
        for result in WEBHOOK_RESULTS {
            drop(
                self.webhook_attempts
                    .get_or_create(&ResultLabels { result }),
            );
        }
    }

    /// The group commit's batch sizes as the ledger counts them (`(size, batches)`).
    pub fn batch_sizes(&self, counts: Vec<(usize, u64)>) {
        *self
            .batch_sizes
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = counts;
    }

    /// Whether `dependency` (`database`, `lock_store`) answered.
    pub fn dependency(&self, dependency: &'static str, up: bool) {
        self.dependency_up
            .get_or_create(&DependencyLabels { dependency })
            .set(i64::from(up));
    }

    /// A webhook attempt recorded, by what came of it.
    pub fn webhook_attempt(&self, result: &'static str) {
        self.webhook_attempts
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// A webhook delivered, `lag` after its event committed.
    pub fn webhook_delivered(&self, lag: Duration) {
        self.webhook_delivery_lag.observe(lag.as_secs_f64());
    }

    /// The deliveries not done, as last counted, and the oldest one's age.
    pub fn webhook_backlog(&self, pending: u64, oldest_age: Duration) {
        self.webhooks_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
        self.oldest_undelivered_webhook
            .set(oldest_age.as_secs_f64());
    }

    /// A call to the bank for a payout, and what came of it.
    pub fn payout_attempt(&self, outcome: &'static str) {
        self.payout_attempts
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// The payouts as last counted, and the oldest pending one's age.
    pub fn pending_payouts(&self, pending: u64, oldest_age: Duration) {
        self.payouts
            .get_or_create(&StatusLabels { status: "pending" })
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
        self.oldest_pending_payout.set(oldest_age.as_secs_f64());
    }

    /// The holds held and overdue, as counted.
    pub fn hold_counts(&self, counts: ledger::holds::HoldCounts) {
        for (state, count) in [("held", counts.held), ("overdue", counts.overdue)] {
            self.holds
                .get_or_create(&StateLabels { state })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// Holds a sweep of this instance recorded expired.
    pub fn holds_expired(&self, expired: u64) {
        self.holds_expired.inc_by(expired);
    }

    /// A payout this instance settled: `succeeded` or `failed`.
    pub fn payout_settled(&self, status: &'static str) {
        self.payouts_settled
            .get_or_create(&StatusLabels { status })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }

    /// The classic Prometheus text exposition (version 0.0.4), for scrapers and tools
    /// that do not ask for OpenMetrics.
    pub fn render_prometheus(&self) -> String {
        prometheus_text(&self.render())
    }

    pub fn lock_queue_full(&self) {
        self.lock_queue_full.inc();
    }

    pub fn rate_limited(&self) {
        self.rate_limited.inc();
    }

    pub fn key_looked_up(&self) {
        self.key_lookups.inc();
    }

    pub fn replayed(&self) {
        self.replays.inc();
    }

    pub fn executed(&self) {
        self.executions.inc();
    }

    /// A lock granted after `waited`: free at once, or handed off by a holder.
    pub fn lock_granted(&self, waited: Duration, handed_off: bool) {
        self.lock_wait.observe(waited.as_secs_f64());
        self.lock_grants
            .get_or_create(&GrantLabels {
                how: if handed_off { "handed_off" } else { "free" },
            })
            .inc();
    }

    /// A wait for a lock that ended without it (timed out, turned away, an error).
    pub fn lock_not_granted(&self, waited: Duration) {
        self.lock_wait.observe(waited.as_secs_f64());
    }

    /// A spend's commit in the ledger, however it ended.
    pub fn committed(&self, took: Duration) {
        self.commit_duration.observe(took.as_secs_f64());
    }

    /// A periodic audit finished with `violations` broken invariants.
    pub fn audited(&self, violations: usize) {
        self.audit_violations
            .set(i64::try_from(violations).unwrap_or(i64::MAX));
        self.audit_completed.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |since| since.as_secs_f64()),
        );
    }

    pub fn lock_lost(&self) {
        self.locks_lost.inc();
    }

    pub fn stale_token(&self) {
        self.stale_tokens.inc();
    }

    pub fn lock_timed_out(&self) {
        self.lock_timeouts.inc();
    }

    fn observe(&self, route: String, method: &'static str, status: u16, took: Duration) {
        self.http_duration
            .get_or_create(&HttpLabels {
                http_request_method: method,
                http_route: route,
                http_response_status_code: status,
            })
            .observe(took.as_secs_f64());
    }
}

/// The method as a label: the standard ones by name, anything else as `_OTHER` (the
/// conventions' word) — a label per method a client invents would be a new series forever.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "_OTHER",
    }
}

/// The route template a response answered, left on it by [`label_route`] for [`track`].
#[derive(Clone, Debug)]
struct Route(String);

/// Middleware inside the router, where the matched route is known: labels the response
/// with its route template (never the raw path, whose ids would make a metric per
/// account).
pub async fn label_route(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    // The request's span (the trace layer's, current here) takes the route as its name,
    // as the conventions name a server span: started already, so renamed on the
    // OpenTelemetry span itself.
    {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let span = tracing::Span::current();
        span.record("http.route", route.as_str());
        span.context()
            .span()
            .update_name(format!("{} {route}", request.method().as_str()));
    }
    let mut response = next.run(request).await;
    response.extensions_mut().insert(Route(route));
    response
}

/// Middleware outside the body limit, the timeout and the panic catcher: counts every
/// request by its route, and those one of them answered before the router could (a 413
/// by `Content-Length`, a 503 timeout, a 500 from a panic) under the route `(layer)`.
pub async fn track(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    let response = next.run(request).await;
    let route = response
        .extensions()
        .get::<Route>()
        .map_or_else(|| "(layer)".to_owned(), |route| route.0.clone());
    metrics.observe(route, method, response.status().as_u16(), started.elapsed());
    response
}

/// OpenMetrics text turned into the classic Prometheus text format: a counter's metadata
/// names its `_total` series (OpenMetrics names the family without the suffix, which
/// classic parsers read as metadata of a series that does not exist), and there is no
/// `# EOF` or `# UNIT`. Every other line is the same in both.
fn prometheus_text(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut text = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let metadata = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|kind| Some((kind, line.strip_prefix(kind)?)));
        match metadata {
            Some((kind, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let suffix = if counters.contains(&name) {
                    "_total"
                } else {
                    ""
                };
                text.push_str(&format!("{kind}{name}{suffix} {tail}"));
            }
            None => text.push_str(line),
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_described_by_their_total_series_in_the_classic_format() {
        let metrics = Metrics::new();
        metrics.executed();
        metrics.lock_granted(Duration::from_millis(3), false);
        let text = metrics.render_prometheus();
        assert!(
            text.contains("# HELP payonce_executions_total Spends executed"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE payonce_executions_total counter"),
            "{text}"
        );
        assert!(text.contains("\npayonce_executions_total 1\n"), "{text}");
        assert!(
            text.contains("# TYPE payonce_lock_wait_seconds histogram"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
        assert!(metrics.render().ends_with("# EOF\n"));
    }

    /// The HTTP histogram has OpenTelemetry's name, unit, labels and buckets, outside
    /// payonce's prefix; payonce's own metrics measured in seconds carry the unit too.
    #[test]
    fn http_requests_follow_the_semantic_conventions() {
        let metrics = Metrics::new();
        metrics.observe(
            "/v1/accounts/{id}/withdrawals".to_owned(),
            "POST",
            201,
            Duration::from_millis(7),
        );
        let text = metrics.render();
        for expected in [
            "# TYPE http_server_request_duration_seconds histogram",
            "# UNIT http_server_request_duration_seconds seconds",
            "http_server_request_duration_seconds_bucket{le=\"0.01\",http_request_method=\"POST\",http_route=\"/v1/accounts/{id}/withdrawals\",http_response_status_code=\"201\"} 1",
            "http_server_request_duration_seconds_count{http_request_method=\"POST\",http_route=\"/v1/accounts/{id}/withdrawals\",http_response_status_code=\"201\"} 1",
            "# UNIT payonce_lock_wait_seconds seconds",
            "# UNIT payonce_payout_oldest_pending_seconds seconds",
            "# UNIT payonce_webhook_delivery_lag_seconds seconds",
            "# UNIT payonce_webhook_oldest_undelivered_seconds seconds",
        ] {
            assert!(text.contains(expected), "{expected} missing from\n{text}");
        }
        let helps = text
            .lines()
            .filter(|line| line.starts_with("# HELP "))
            .count();
        let types = text
            .lines()
            .filter(|line| line.starts_with("# TYPE "))
            .count();
        assert_eq!(helps, types, "every metric has help text");
    }

    /// The group commit's batch sizes read as a histogram: cumulative buckets, the sum of
    /// spends and the count of batches.
    #[test]
    fn batch_sizes_are_a_histogram() {
        let metrics = Metrics::new();
        assert!(
            !metrics.render().contains("ledger_batch_size"),
            "none on SQLite"
        );
        metrics.batch_sizes(vec![(1, 10), (3, 2), (40, 1)]);
        let text = metrics.render();
        for expected in [
            "# TYPE payonce_ledger_batch_size histogram",
            "payonce_ledger_batch_size_sum 56.0",
            "payonce_ledger_batch_size_count 13",
            "payonce_ledger_batch_size_bucket{le=\"1.0\"} 10",
            "payonce_ledger_batch_size_bucket{le=\"4.0\"} 12",
            "payonce_ledger_batch_size_bucket{le=\"32.0\"} 12",
            "payonce_ledger_batch_size_bucket{le=\"64.0\"} 13",
            "payonce_ledger_batch_size_bucket{le=\"+Inf\"} 13",
        ] {
            assert!(text.contains(expected), "{expected} missing from\n{text}");
        }
        // Prometheus's own checker takes it in the classic format.
        let mut promtool = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool (Debian's prometheus package; scripts/services.sh installs it)");
        std::io::Write::write_all(
            &mut promtool.stdin.take().expect("stdin"),
            metrics.render_prometheus().as_bytes(),
        )
        .expect("promtool reads");
        let checked = promtool.wait_with_output().expect("promtool runs");
        let said = String::from_utf8_lossy(&checked.stdout).into_owned()
            + &String::from_utf8_lossy(&checked.stderr);
        assert!(checked.status.success() && said.trim().is_empty(), "{said}");
    }

    #[test]
    fn invented_methods_share_one_label() {
        for (method, label) in [("GET", "GET"), ("M0", "_OTHER"), ("M9999", "_OTHER")] {
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            assert_eq!(method_label(&method), label);
        }
    }
}
