//! What a run reports: the summary table on stdout, the JSON report, and the chart.

use std::io::Write;
use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde_json::json;

use crate::audit::ViolationKind;
use crate::run::RunResult;

/// Latency at a quantile, in milliseconds.
fn ms(latency: &Histogram<u64>, quantile: f64) -> f64 {
    latency.value_at_quantile(quantile) as f64 / 1000.0
}

/// The summary table, then the verdict and each violation.
pub fn print_summary(result: &RunResult, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "{:-<72}", "")?;
    for (name, value) in summary_rows(result) {
        writeln!(out, "{name:<32} {value}")?;
    }
    print_metrics(result, out)?;
    writeln!(out, "{:-<72}", "")?;
    print_verdict(result, out)
}

/// The summary's table: what was sent, how it was answered, what the audit found.
fn summary_rows(result: &RunResult) -> Vec<(&'static str, String)> {
    SUMMARY
        .iter()
        .map(|(name, value)| (*name, value(result)))
        .collect()
}

/// A row of the summary: its name, and its value made from the run.
type SummaryRow = (&'static str, fn(&RunResult) -> String);

/// The summary's rows, in the order they print.
const SUMMARY: &[SummaryRow] = &[
    ("targets", |result| result.history.targets.join(", ")),
    ("accounts", |result| {
        result.history.accounts.len().to_string()
    }),
    ("duration", |result| format!("{:.1} s", seconds(result))),
    ("retries", retry_policy),
    ("tickets", |result| {
        let counts = &result.counts;
        format!(
            "{} ({} ticket requests failed, {} resends)",
            counts.tickets, counts.ticket_errors, counts.ticket_retries
        )
    }),
    ("orders", |result| {
        let counts = &result.counts;
        format!(
            "{} placed and paid ({} could not be placed)",
            counts.orders, counts.order_errors
        )
    }),
    ("spend requests (attempts)", |result| {
        result.counts.requests.to_string()
    }),
    ("resends (attempt > 1)", |result| {
        result.counts.retries.to_string()
    }),
    ("rate", |result| {
        format!(
            "{:.0} spend requests/s",
            result.counts.requests as f64 / seconds(result)
        )
    }),
    ("200 hold captured / voided", |result| {
        result.counts.resolved.to_string()
    }),
    ("201 created", |result| result.counts.created.to_string()),
    ("202 payout accepted", |result| {
        result.counts.accepted.to_string()
    }),
    ("402 refused (stored)", |result| {
        result.counts.payment_required.to_string()
    }),
    (
        "409 paid already / not held / past the payment / busy / in progress",
        |result| result.counts.conflict.to_string(),
    ),
    ("422 reuse / limit / above the hold", |result| {
        result.counts.unprocessable.to_string()
    }),
    ("429 rate-limited", |result| {
        result.counts.rate_limited.to_string()
    }),
    ("503 unavailable", |result| {
        result.counts.unavailable.to_string()
    }),
    ("other status", |result| result.counts.other.to_string()),
    ("no answer", |result| {
        result.counts.transport_errors.to_string()
    }),
    ("replays (header)", |result| {
        result.counts.replays.to_string()
    }),
    ("unresolved requests", |result| {
        let unresolved = &result.unresolved;
        format!(
            "{} ({} tickets without a definitive answer: {} completed, {} nothing executed)",
            unresolved.requests,
            unresolved.tickets,
            unresolved.completed,
            unresolved.tickets - unresolved.completed
        )
    }),
    ("acknowledged outcomes rechecked", rechecked),
    ("tickets that moved money", |result| {
        executed_tickets(result).to_string()
    }),
    ("double spends (audit)", |result| {
        result
            .tallies
            .iter()
            .map(|tally| tally.double_spends)
            .sum::<u64>()
            .to_string()
    }),
    ("latency p50 / p90 / p99 / max", |result| {
        format!(
            "{:.1} / {:.1} / {:.1} / {:.1} ms",
            ms(&result.latency, 0.5),
            ms(&result.latency, 0.9),
            ms(&result.latency, 0.99),
            result.latency.max() as f64 / 1000.0
        )
    }),
    ("payouts", payouts),
    ("payouts stopped", payouts_stopped),
    ("payouts at the bank", bank),
    ("webhooks", webhooks),
    ("violations", |result| result.violations.len().to_string()),
];

/// The run's length in seconds, never zero (a rate divides by it).
fn seconds(result: &RunResult) -> f64 {
    result.elapsed.as_secs_f64().max(0.001)
}

/// The spends one of whose attempts was answered as executed.
fn executed_tickets(result: &RunResult) -> usize {
    result
        .history
        .spends
        .iter()
        .filter(|spend| {
            let executed = spend.kind.executed_status();
            spend.attempts.iter().any(|a| a.status == Some(executed))
        })
        .count()
}

/// The recheck after the load: each acknowledged outcome sent once more, and how many of
/// those sends replayed it.
fn rechecked(result: &RunResult) -> String {
    let (mut sent, mut replayed, mut lost) = (0, 0, 0);
    for spend in &result.history.spends {
        let rechecks: Vec<_> = spend
            .attempts
            .iter()
            .filter(|attempt| attempt.role == crate::history::Role::Recheck)
            .collect();
        if let Some(last) = rechecks.last() {
            sent += 1;
            if last.replayed {
                replayed += 1;
            }
        }
    }
    for violation in &result.violations {
        if matches!(
            violation.kind,
            ViolationKind::AcknowledgedOutcomeLost | ViolationKind::ExecutedAgain
        ) {
            lost += 1;
        }
    }
    format!("{sent} resent after the run: {replayed} replayed; {lost} lost or executed again")
}

/// Where the payouts ended, and how long they took to.
fn payouts(result: &RunResult) -> String {
    let tally = &result.payouts;
    let Some(drained) = result.drained else {
        return "none sent".to_owned();
    };
    format!(
        "{} ({} succeeded, {} failed and given back, {} still pending after {:.1} s; most calls to the bank for one: {})",
        tally.payouts,
        tally.succeeded,
        tally.failed,
        tally.pending,
        drained.waited.as_secs_f64(),
        tally.most_attempts
    )
}

/// Whether the run stopped sending payouts, and why: the targets have no bank.
fn payouts_stopped(result: &RunResult) -> String {
    let Some(stopped) = &result.payouts_stopped else {
        return "no".to_owned();
    };
    format!(
        "after {:.1} s: {} has no bank to pay out to (503 payouts-unavailable: \"{}\"); {} payout requests refused, {} payouts of the mix sent as withdrawals instead",
        stopped.at_ms as f64 / 1000.0,
        stopped.target,
        stopped.detail,
        stopped.refused,
        stopped.sent_as_withdrawals
    )
}

/// What the webhook receiver got.
fn webhooks(result: &RunResult) -> String {
    let tally = &result.webhooks;
    if !tally.received {
        return "no receiver (give --webhooks)".to_owned();
    }
    let ms = |value: Option<u64>| value.map_or_else(|| "-".to_owned(), |v| v.to_string());
    format!(
        "{} of {} committed outcomes delivered; {} requests ({} answered other than 204 by the receiver, each retried), {} repeats; commit to first arrival p50 / p99 {} / {} ms",
        tally.delivered,
        tally.expected,
        tally.requests,
        tally.refused_by_receiver,
        tally.repeats,
        ms(tally.first_arrival_p50_ms),
        ms(tally.first_arrival_p99_ms)
    )
}

/// The reconciliation with the bank.
fn bank(result: &RunResult) -> String {
    let tally = &result.payouts;
    if result.drained.is_none() {
        return "-".to_owned();
    }
    if !tally.bank_read {
        return "not read (give --bank)".to_owned();
    }
    format!(
        "{} executed; {} executed twice, {} succeeded but missing, {} given back but executed",
        tally.executed_at_bank,
        tally.executed_twice,
        tally.missing_at_bank,
        tally.reversed_but_executed
    )
}

/// What each instance's own metrics counted.
fn print_metrics(result: &RunResult, out: &mut impl Write) -> std::io::Result<()> {
    for (target, metrics) in &result.metrics {
        let pick = |name: &str| {
            metrics
                .iter()
                .find(|(metric, _)| metric == name)
                .map_or(0.0, |(_, value)| *value)
        };
        writeln!(
            out,
            "{:<32} executions {} · replays {} · locks lost {} · stale tokens {} · lock timeouts {}",
            format!("metrics of {target}"),
            pick("payonce_executions_total"),
            pick("payonce_replays_total"),
            pick("payonce_locks_lost_total"),
            pick("payonce_stale_fencing_tokens_total"),
            pick("payonce_lock_timeouts_total"),
        )?;
    }
    Ok(())
}

/// The audit's verdict, and every violation it found.
fn print_verdict(result: &RunResult, out: &mut impl Write) -> std::io::Result<()> {
    if result.violations.is_empty() {
        writeln!(
            out,
            "AUDIT PASSED: nothing was spent twice, every replay matched its original, every invariant held"
        )?;
    } else {
        writeln!(
            out,
            "AUDIT FAILED: {} violation(s)",
            result.violations.len()
        )?;
        for violation in &result.violations {
            writeln!(
                out,
                "  {:?} account={} ticket={}: {}",
                violation.kind,
                violation.account,
                violation.ticket.as_deref().unwrap_or("-"),
                violation.detail
            )?;
        }
    }
    Ok(())
}

/// How the clients resent, in words.
fn retry_policy(result: &RunResult) -> String {
    let retry = &result.retry;
    if retry.retries() {
        format!(
            "up to {} attempts per request, waits up to {}",
            retry.max_attempts,
            humantime::format_duration(retry.max_backoff)
        )
    } else {
        "off: each request sent once".to_owned()
    }
}

/// The JSON report: the retry policy, the counts (attempts, resends), the unresolved
/// requests, the payouts (and why they stopped, if they did), latency, throughput per
/// second, each target's metrics, the violations, and the whole history with every
/// attempt (API keys left out).
pub fn write_json(result: &RunResult, path: &Path) -> std::io::Result<()> {
    let latency = &result.latency;
    let report = json!({
        "verdict": if result.violations.is_empty() { "passed" } else { "failed" },
        "elapsed_seconds": result.elapsed.as_secs_f64(),
        "retry": {
            "max_attempts": result.retry.max_attempts,
            "max_backoff_ms": result.retry.max_backoff.as_millis() as u64,
        },
        "counts": result.counts,
        "unresolved": result.unresolved,
        "payouts": result.payouts,
        "payouts_stopped": result.payouts_stopped,
        "drained": result.drained,
        "webhooks": result.webhooks,
        "latency_ms": {
            "p50": ms(latency, 0.5),
            "p90": ms(latency, 0.9),
            "p99": ms(latency, 0.99),
            "max": latency.max() as f64 / 1000.0,
        },
        "throughput_per_second": result.timeline,
        "metrics": result.metrics.iter().map(|(target, metrics)| json!({
            "target": target,
            "counters": metrics.iter().map(|(name, value)| (name.clone(), json!(value))).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
        "violations": result.violations,
        "accounts": result.tallies,
        "history": result.history,
    });
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, serde_json::to_vec_pretty(&report)?)
}

/// Picks one count out of a second of the run.
type PickCount = fn(&crate::run::Second) -> u64;

/// The chart: throughput over time (answers per second by class) above the latency
/// distribution (latency against percentile, on a scale that spreads the tail).
pub fn draw_chart(result: &RunResult, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent)?;
    }
    let root = SVGBackend::new(path, (1000, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);
    draw_throughput(&top, result)?;
    draw_latency(&bottom, result)?;
    root.present()?;
    Ok(())
}

/// A part of the chart's drawing.
type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Throughput over time: answers per second by class, over the run's whole seconds.
fn draw_throughput(top: &Area<'_>, result: &RunResult) -> Result<(), Box<dyn std::error::Error>> {
    // Whole seconds only: the last, partial one would show as a drop to zero.
    let whole = (result.elapsed.as_secs() as usize).clamp(1, result.timeline.len().max(1));
    let timeline = &result.timeline[..whole.min(result.timeline.len())];
    let seconds = timeline.len().max(1) as u32;
    let peak = timeline
        .iter()
        .map(|second| second.ok.max(second.refused).max(second.failed))
        .max()
        .unwrap_or(1)
        .max(1);
    let mut chart = ChartBuilder::on(top)
        .caption("Answers per second", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(
            0u32..seconds.saturating_sub(1).max(1),
            0u64..peak + peak / 10 + 1,
        )?;
    chart
        .configure_mesh()
        .x_desc("second of the run")
        .y_desc("answers")
        .draw()?;
    let series: [(&str, RGBColor, PickCount); 3] = [
        ("2xx", RGBColor(30, 130, 60), |second| second.ok),
        ("4xx (402, 409, 422)", RGBColor(200, 140, 0), |second| {
            second.refused
        }),
        ("5xx and no answer", RGBColor(200, 30, 30), |second| {
            second.failed
        }),
    ];
    for (label, color, pick) in series {
        chart
            .draw_series(LineSeries::new(
                timeline
                    .iter()
                    .enumerate()
                    .map(|(index, second)| (index as u32, pick(second))),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// The latency distribution: latency against percentile, on a scale that spreads the tail.
fn draw_latency(bottom: &Area<'_>, result: &RunResult) -> Result<(), Box<dyn std::error::Error>> {
    // x = -log10(1 - q): 1 is p90, 2 is p99, 3 is p99.9.
    let nines = |quantile: f64| -(1.0 - quantile).max(1e-4).log10();
    let points: Vec<(f64, f64)> = [
        0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999,
    ]
    .iter()
    .map(|&quantile| {
        (
            nines(quantile),
            result.latency.value_at_quantile(quantile) as f64 / 1000.0,
        )
    })
    .collect();
    let top_latency = points
        .iter()
        .map(|(_, latency)| *latency)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(bottom)
        .caption("Spend latency by percentile", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..4.0, 0.0..top_latency * 1.1)?;
    chart
        .configure_mesh()
        .x_labels(5)
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_label_formatter(&|x| {
            let percentile = 100.0 * (1.0 - 10f64.powf(-x));
            format!("p{percentile:.5}")
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_owned()
        })
        .draw()?;
    chart.draw_series(LineSeries::new(points.clone(), BLUE.stroke_width(2)))?;
    chart.draw_series(
        points
            .iter()
            .map(|&(x, y)| Circle::new((x, y), 3, BLUE.filled())),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::run::{Counts, Second};

    /// The throughput lines stop at the last whole second: the partial one at the end
    /// would show as a drop that never happened.
    #[test]
    fn the_chart_leaves_out_the_partial_last_second() {
        let second = Second {
            ok: 100,
            refused: 50,
            failed: 1,
        };
        let result = RunResult {
            history: Default::default(),
            final_state: Default::default(),
            violations: Vec::new(),
            tallies: Vec::new(),
            unresolved: Default::default(),
            retry: Default::default(),
            payouts: Default::default(),
            webhooks: Default::default(),
            drained: None,
            counts: Counts::default(),
            latency: Histogram::new_with_bounds(1, 120_000_000, 3).unwrap(),
            timeline: vec![second; 5],
            elapsed: Duration::from_millis(3_500),
            metrics: Vec::new(),
            payouts_stopped: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.svg");
        draw_chart(&result, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let lengths: Vec<usize> = svg
            .split("<polyline")
            .skip(1)
            .filter_map(|line| {
                let points = line.split("points=\"").nth(1)?.split('"').next()?;
                Some(points.split_whitespace().count())
            })
            .collect();
        assert_eq!(
            lengths.iter().filter(|&&n| n == 3).count(),
            3,
            "three series of three whole seconds: {lengths:?}"
        );
        assert!(
            !lengths.contains(&5),
            "the partial second was drawn: {lengths:?}"
        );
    }
}
