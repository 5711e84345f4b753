//! The operator's view, against a real Prometheus: three instances under a short load
//! test (payouts to the shared bank, webhooks to a receiver, the ledger audited every
//! second), scraped by Debian's `prometheus` with payonce's recording rules and alerts.
//! Every recording rule and every query of the Grafana dashboard returns data, the
//! dashboard asks nothing but recording rules, and no alert fires on a clean run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use loadtest::receiver::ReceiverFaults;
use loadtest::run::{RunOptions, run};
use serde_json::Value;

use crate::end_to_end::{Distributed, options};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// A Prometheus server on a free loopback port, stopped when dropped.
struct Prometheus {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `targets` (host:port) every second as the job `payonce`, evaluating
    /// deploy/prometheus/rules.yml every second.
    fn start(targets: &[String]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let rules = deploy()
            .join("prometheus/rules.yml")
            .canonicalize()
            .unwrap();
        let listed = targets
            .iter()
            .map(|target| format!("\"{target}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: payonce\n    static_configs:\n      - targets: [{listed}]\n",
            rules = rules.display()
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian's package; scripts/services.sh installs it)");
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    async fn get(&self, path: &str, query: &[(&str, &str)]) -> Option<Value> {
        let mut url = url::Url::parse(&format!("{}{path}", self.base)).ok()?;
        url.query_pairs_mut().extend_pairs(query);
        let answer = reqwest::Client::new()
            .get(url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        let body: Value = answer.json().await.ok()?;
        (body["status"] == "success").then(|| body["data"].clone())
    }

    /// The instant vector `expr` evaluates to now.
    async fn query(&self, expr: &str) -> Vec<Value> {
        self.get("/api/v1/query", &[("query", expr)])
            .await
            .and_then(|data| data["result"].as_array().cloned())
            .unwrap_or_default()
    }

    /// Waits until every target is scraped and healthy.
    async fn until_targets_up(&self, count: usize) {
        for _ in 0..300 {
            let up = self.query("up{job=\"payonce\"} == 1").await.len();
            if up == count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the targets were not all up in 30 s:\n{}", self.log());
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a vector holds at least one sample whose value is a number (not NaN: a
/// quantile of nothing).
fn has_a_number(samples: &[Value]) -> bool {
    samples.iter().any(|sample| {
        sample["value"][1]
            .as_str()
            .and_then(|value| value.parse::<f64>().ok())
            .is_some_and(f64::is_finite)
    })
}

/// Every `expr` of the dashboard's panels, in order.
fn dashboard_queries() -> Vec<String> {
    fn walk(value: &Value, found: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(expr)) = map.get("expr") {
                    found.push(expr.clone());
                }
                map.values().for_each(|value| walk(value, found));
            }
            Value::Array(items) => items.iter().for_each(|value| walk(value, found)),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(deploy().join("grafana/payonce.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut found = Vec::new();
    walk(&dashboard["panels"], &mut found);
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_recording_rule_and_dashboard_query_returns_data_from_a_real_prometheus() {
    let shared = Distributed::new().await;
    // Retries soon, and enough of them that a delivery the receiver fails (a tenth of its
    // attempts, drawn each time) is never exhausted: with four attempts one delivery in
    // 10,000 was, and the run rightly reported its event missing; with nine, one in 10⁹.
    let flags = [
        "--audit-every",
        "1s",
        "--webhook-allow-private",
        "--webhook-retry-schedule",
        "100ms,200ms,400ms,800ms,1s,1s,1s,1s",
        "--webhook-timeout",
        "1s",
    ];
    let mut targets = Vec::new();
    for _ in 0..3 {
        targets.push(shared.serve(&flags).await);
    }
    let scraped: Vec<String> = targets
        .iter()
        .map(|target| target.trim_start_matches("http://").to_owned())
        .collect();
    let prometheus = Prometheus::start(&scraped);
    prometheus.until_targets_up(3).await;

    let result = run(RunOptions {
        bank: Some(shared.bank.clone()),
        webhooks: Some(ReceiverFaults {
            fail: 0.1,
            ..ReceiverFaults::default()
        }),
        ..options(targets)
    })
    .await
    .unwrap();
    assert!(result.violations.is_empty(), "{:#?}", result.violations);
    assert!(result.payouts.payouts > 0, "{:?}", result.payouts);
    assert!(result.webhooks.delivered > 0, "{:?}", result.webhooks);

    // The rules Prometheus loaded, as it reports them: all of rules.yml, all healthy.
    let groups = prometheus
        .get("/api/v1/rules", &[])
        .await
        .expect("the rules API answers");
    let rules: Vec<&Value> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap())
        .collect();
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    let recorded: BTreeSet<String> = rules
        .iter()
        .filter(|rule| rule["type"] == "recording")
        .map(|rule| rule["name"].as_str().unwrap().to_owned())
        .collect();
    let in_the_file = std::fs::read_to_string(deploy().join("prometheus/rules.yml"))
        .unwrap()
        .matches("- record: ")
        .count();
    assert_eq!(recorded.len(), in_the_file, "{recorded:?}");

    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    for query in &queries {
        assert!(
            recorded.contains(query),
            "the dashboard asks `{query}`, which is not a recording rule"
        );
    }
    let asked: BTreeSet<&String> = recorded.iter().chain(&queries).collect();

    // Recordings land at the next evaluation after the scrapes they read: wait for them.
    let mut missing: Vec<&String> = asked.iter().copied().collect();
    for _ in 0..60 {
        let mut still = Vec::new();
        for expr in missing {
            if !has_a_number(&prometheus.query(expr).await) {
                still.push(expr);
            }
        }
        missing = still;
        if missing.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        missing.is_empty(),
        "no data in 60 s for {missing:?}\n{}",
        prometheus.log()
    );

    // What the data says: three instances, every dependency up, the ledger audited clean
    // all along, spends executed, and the lock service named.
    let value =
        |samples: Vec<Value>| -> f64 { samples[0]["value"][1].as_str().unwrap().parse().unwrap() };
    assert_eq!(value(prometheus.query("payonce:up:sum").await), 3.0);
    let dependencies = prometheus
        .query("dependency:payonce_dependency_up:min")
        .await;
    assert_eq!(dependencies.len(), 2, "{dependencies:?}");
    assert!(dependencies.iter().all(|sample| sample["value"][1] == "1"));
    assert_eq!(
        value(
            prometheus
                .query("max_over_time(payonce:audit_violations:max[10m])")
                .await
        ),
        0.0
    );
    assert!(value(prometheus.query("payonce:executions:rate5m").await) > 0.0);
    let grants = prometheus
        .query("lock_service_how:payonce_lock_grants:rate5m{lock_service=\"redis\"}")
        .await;
    assert_eq!(grants.len(), 2, "free and handed_off: {grants:?}");
    let firing = prometheus.query("ALERTS{alertstate=\"firing\"}").await;
    assert!(firing.is_empty(), "alerts fired on a clean run: {firing:?}");
}
