//! The README and the documents behind it stay true: the README's walkthrough runs as
//! written, its endpoint table and the contract's (docs/api.md) name every operation the
//! OpenAPI document has, and the tables of docs/configuration.md and docs/api.md name every
//! setting and every problem the code has.

use api::config::Cli;
use api::error::EXPLANATIONS;
use clap::CommandFactory;

use crate::helpers::{Backend, spawn_app};

const README: &str = include_str!("../../../README.md");
const CONFIGURATION: &str = include_str!("../../../docs/configuration.md");
const API: &str = include_str!("../../../docs/api.md");

fn walkthrough() -> &'static str {
    let start = README
        .find("<!-- walkthrough:start -->")
        .expect("start marker");
    let end = README.find("<!-- walkthrough:end -->").expect("end marker");
    let block = &README[start..end];
    let code = block.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let close = block[code..].find("```").expect("closing fence") + code;
    &block[code..close]
}

/// Every command of the walkthrough succeeds against a fresh server and shows what it
/// says it shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_walkthrough_runs_as_written() {
    let app = spawn_app(Backend::Embedded).await;
    let script = walkthrough();
    assert!(script.contains("PAYONCE=http://127.0.0.1:8080\n"));
    let script = script.replace(
        "PAYONCE=http://127.0.0.1:8080\n",
        &format!("PAYONCE={}\n", app.address),
    );
    let output = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .output()
        .await
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.matches("idempotent-replayed: true").count() >= 2,
        "the walkthrough shows no replayed create:\n{stdout}"
    );
    for shown in [
        "\"description\":\"order #1018\"",
        "\"balance\":700",
        "/problems/idempotency-key-reuse",
        "/problems/insufficient-funds",
        "/problems/idempotency-key-missing",
        "\"kind\": \"lottery_draw\"",
        "\"state\":\"paid\"",
        "/problems/order-already-paid",
        "\"kind\": \"order_payment\"",
        "\"status\": \"succeeded\"",
        "\"kind\": \"payout\"",
        "\"state\": \"captured\"",
        "\"captured_amount\": 100",
        "\"refunded_total\":30",
        "/problems/refund-exceeds-payment",
        "\"refundable\":40",
        "\"kind\": \"hold_capture\"",
        "\"kind\": \"refund\"",
        "payonce_replays_total",
        "\"type\": \"withdrawal.succeeded\"",
        "\"webhook_signature\": \"v1,",
        "/v1/accounts/{id}/withdrawals",
    ] {
        assert!(
            stdout.contains(shown),
            "the walkthrough does not show {shown}:\n{stdout}"
        );
    }
}

/// The configuration table (docs/configuration.md) lists every environment variable the
/// binary reads, and the error table (docs/api.md) every problem name.
#[test]
fn the_tables_list_every_setting_and_problem() {
    let command = Cli::command();
    for argument in command.get_arguments() {
        if let Some(env) = argument.get_env() {
            let name = env.to_string_lossy();
            assert!(
                CONFIGURATION.contains(&format!("| `{name}` |")),
                "docs/configuration.md's table lacks {name}"
            );
        }
    }
    for (name, status, _) in EXPLANATIONS {
        assert!(
            API.contains(&format!("| {status} | `{name}` |")),
            "docs/api.md's error table lacks {status} {name}"
        );
    }
}

/// The section of `document` under the heading `heading`, up to the next heading of its
/// level or above.
fn section<'a>(document: &'a str, heading: &str) -> &'a str {
    let start = document.find(heading).expect("the heading");
    let level = heading.len() - heading.trim_start_matches('#').len();
    let rest = &document[start + heading.len()..];
    let end = rest
        .match_indices("\n#")
        .find(|(at, _)| {
            let line = &rest[at + 1..];
            line.len() - line.trim_start_matches('#').len() <= level
        })
        .map_or(rest.len(), |(at, _)| at);
    &rest[..end]
}

/// The README's endpoint table and the contract's table in docs/api.md name every
/// operation of the OpenAPI document the server serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_tables_list_every_operation() {
    let app = spawn_app(Backend::Embedded).await;
    let spec = app.openapi().await;
    let endpoints = section(README, "## Endpoints");
    let contract = section(API, "## The contract");
    let mut operations = 0;
    for (path, item) in spec["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            operations += 1;
            let method = method.to_uppercase();
            // A path may show its query (`…/entries?after=&limit=`); the service's own
            // endpoints share one row: `GET /healthz` · `/readyz` · …
            let named = |table: &str| {
                table.contains(&format!("`{method} {path}`"))
                    || table.contains(&format!("`{method} {path}?"))
                    || (method == "GET" && table.contains(&format!("· `{path}`")))
            };
            assert!(
                named(endpoints),
                "README's endpoint table lacks {method} {path}"
            );
            assert!(
                named(contract),
                "docs/api.md's contract lacks {method} {path}"
            );
        }
    }
    assert!(operations > 0, "the document lists no operations");
}
