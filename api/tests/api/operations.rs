//! Operating payonce: the Prometheus configuration, recording rules and alerts in
//! `deploy/prometheus/` are what Prometheus's own checker takes, and every alert's unit
//! tests (firing and not firing) pass under `promtool test rules`.

use std::path::PathBuf;
use std::process::Command;

fn prometheus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

/// Runs `promtool` with `args` in `deploy/prometheus/`; panics with what it said unless it
/// succeeded.
fn promtool(args: &[&str]) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(prometheus_dir())
        .output()
        .expect("promtool (Debian's prometheus package; scripts/services.sh installs it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?}: {said}");
    said
}

#[test]
fn the_scrape_configuration_and_the_rules_are_valid() {
    // The checker reads the targets file (targets.yml) and the rules too.
    promtool(&["check", "config", "prometheus.yml"]);
    let said = promtool(&["check", "rules", "rules.yml"]);
    assert!(said.contains("SUCCESS"), "{said}");
}

/// The configuration as docker-compose.yml mounts it: compose-targets.yml in place of
/// targets.yml.
#[test]
fn the_compose_targets_are_valid() {
    let dir = tempfile::tempdir().unwrap();
    for (from, to) in [
        ("prometheus.yml", "prometheus.yml"),
        ("rules.yml", "rules.yml"),
        ("compose-targets.yml", "targets.yml"),
    ] {
        std::fs::copy(prometheus_dir().join(from), dir.path().join(to)).unwrap();
    }
    let config = dir.path().join("prometheus.yml");
    promtool(&["check", "config", config.to_str().unwrap()]);
}

/// Every alert of `rules.yml` has a test that fires it and one that does not, and
/// `promtool test rules` passes them all.
#[test]
fn every_alert_is_tested_firing_and_not_firing() {
    let rules = std::fs::read_to_string(prometheus_dir().join("rules.yml")).unwrap();
    let tests = std::fs::read_to_string(prometheus_dir().join("rules_test.yml")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 7, "{alerts:?}");
    for alert in alerts {
        // Each test of an alert is an `alertname:` line followed by its `exp_alerts`: a
        // list of alerts (firing) or `[]` (not firing).
        let cases: Vec<bool> = tests
            .split(&format!("alertname: {alert}\n"))
            .skip(1)
            .map(|rest| !rest.trim_start().starts_with("exp_alerts: []"))
            .collect();
        assert!(cases.contains(&true), "no test fires {alert}");
        assert!(cases.contains(&false), "no test keeps {alert} quiet");
    }
    let said = promtool(&["test", "rules", "rules_test.yml"]);
    assert!(said.contains("SUCCESS"), "{said}");
}
