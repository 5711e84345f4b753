//! The contract against unlucky clients and hostile ones: a commit whose answer is lost,
//! bursts, floods, abuse, slow clients, metric labels.

use reqwest::StatusCode;

use crate::helpers::{Backend, Shared, assert_problem, read, spawn_config};

/// The connection to PostgreSQL dies after COMMIT was sent and before its answer came
/// back: the client is told the outcome is unknown (never "nothing was executed"), the
/// ticket shows the spend completed, and resending with the same ticket replays the
/// stored 201 — so a client that follows the answer never pays twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_commit_answer_is_outcome_unknown() {
    let shared = Shared::new(Backend::Distributed).await;
    let cutter = ledger::testing::CommitCutter::start(shared.database.url())
        .await
        .unwrap();
    let mut config = shared.config(&[]);
    config.database_url = Some(cutter.url().to_owned());
    let app = spawn_config(shared, config).await;
    let ada = app.create_account(1000, 0).await;
    let ticket = app.ticket(&ada).await;

    cutter.arm();
    let response = app.withdraw(&ada, &ticket, 300).await;
    let problem =
        assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "outcome-unknown").await;
    assert_eq!(cutter.cuts(), 1);
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains("same ticket")),
        "{problem}"
    );

    let (status, _, shown) = read(
        app.client
            .get(app.url(&format!("/v1/tickets/{ticket}")))
            .bearer_auth(&ada.key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shown["state"], "completed", "{shown}");
    let (status, replayed, body) = read(app.withdraw(&ada, &ticket, 300).await).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true), "{body}");
    assert_eq!(body, shown["response"]["body"]);
    assert_eq!(body["balance"].as_i64(), Some(700));
    assert_eq!(app.balance(&ada).await, (700, 0));
    app.assert_audit_clean().await;
}
