//! `/openapi.json` describes what the server really does: every route it serves is in the
//! document, every documented operation is routed, the spends document every error status
//! of the contract, and real response bodies fit their documented schemas.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Backend, SendForJson, read, spawn_app, spawn_app_with};

fn schema<'a>(spec: &'a Value, reference: &Value) -> &'a Value {
    let name = reference["$ref"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap();
    &spec["components"]["schemas"][name]
}

/// A response as written, or the shared one (`#/components/responses/…`) it refers to.
fn resolved<'a>(spec: &'a Value, response: &'a Value) -> &'a Value {
    match response["$ref"].as_str() {
        Some(reference) => {
            let name = reference
                .strip_prefix("#/components/responses/")
                .unwrap_or_else(|| panic!("not a response reference: {reference}"));
            &spec["components"]["responses"][name]
        }
        None => response,
    }
}

/// The documented response schema of an operation and status.
fn response_schema<'a>(spec: &'a Value, path: &str, method: &str, status: u16) -> &'a Value {
    let response = &spec["paths"][path][method]["responses"][status.to_string()];
    let content = &resolved(spec, response)["content"];
    let media = content.as_object().unwrap().values().next().unwrap();
    schema(spec, &media["schema"])
}

/// Every required property is present, and every property present is documented (except
/// on problems, which may carry extension members, as RFC 9457 allows).
fn assert_fits(schema: &Value, body: &Value, what: &str) {
    let object = body
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object: {body}"));
    for required in schema["required"].as_array().into_iter().flatten() {
        let name = required.as_str().unwrap();
        assert!(
            object.contains_key(name),
            "{what}: missing required {name}: {body}"
        );
    }
    let properties = schema["properties"].as_object().unwrap();
    if !properties.contains_key("detail") {
        for key in object.keys() {
            assert!(
                properties.contains_key(key),
                "{what}: undocumented property {key}: {body}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_matches_the_routes_and_the_bodies() {
    let app = spawn_app(Backend::Embedded).await;
    let spec = app.openapi().await;

    let contract = [
        ("/v1/accounts", "post"),
        ("/v1/accounts/{id}", "get"),
        ("/v1/accounts/{id}/entries", "get"),
        ("/v1/accounts/{id}/tickets", "post"),
        ("/v1/tickets/{ticket_id}", "get"),
        ("/v1/accounts/{id}/withdrawals", "post"),
        ("/v1/accounts/{id}/deposits", "post"),
        ("/v1/accounts/{id}/lottery-draws", "post"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
    ];
    for (path, method) in contract {
        assert!(
            spec["paths"][path][method].is_object(),
            "{method} {path} is not documented"
        );
    }

    // Every documented operation is routed: asked with dummy ids it may be refused, but
    // never as an unknown route or a wrong method.
    for (path, operations) in spec["paths"].as_object().unwrap() {
        let concrete = path
            .replace("{id}", &uuid::Uuid::new_v4().to_string())
            .replace("{ticket_id}", &uuid::Uuid::new_v4().to_string())
            .replace("{name}", "not-found");
        for method in operations.as_object().unwrap().keys() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let response = app
                .client
                .request(method.clone(), app.url(&concrete))
                .send()
                .await
                .unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            assert_ne!(
                body["detail"], "no such resource",
                "{method} {path} is documented but not routed"
            );
        }
    }

    for spend in ["withdrawals", "deposits", "lottery-draws"] {
        let responses = &spec["paths"][format!("/v1/accounts/{{id}}/{spend}")]["post"]["responses"];
        for status in [201, 400, 401, 403, 404, 409, 410, 413, 415, 422, 429, 503] {
            assert!(
                resolved(&spec, &responses[status.to_string()])["description"].is_string(),
                "{spend} does not document {status}"
            );
        }
    }
    for spend in ["withdrawals", "lottery-draws"] {
        assert!(
            spec["paths"][format!("/v1/accounts/{{id}}/{spend}")]["post"]["responses"]["402"]
                .is_object()
        );
    }

    // Real bodies against their schemas: each (path, method, status) documents the body
    // the server answered, checked once all are in.
    let mut answered: Vec<(&str, &str, u16, &str, Value)> = Vec::new();
    let created = app
        .client
        .post(app.url("/v1/accounts"))
        .json(&json!({ "name": "Ada", "balance": 100, "points": 3 }))
        .send_for_json::<Value>()
        .await;
    answered.push((
        "/v1/accounts",
        "post",
        201,
        "created account",
        created.clone(),
    ));
    let account = crate::helpers::TestAccount {
        id: created["id"].as_str().unwrap().to_owned(),
        key: created["api_key"].as_str().unwrap().to_owned(),
    };
    let key = account.key.as_str();
    let account_path = format!("/v1/accounts/{}", account.id);
    let body = app.get_json(key, &account_path).await;
    answered.push(("/v1/accounts/{id}", "get", 200, "account", body));
    let issued = read(app.post_as(key, &format!("{account_path}/tickets")).await)
        .await
        .2;
    let ticket = issued["ticket_id"].as_str().unwrap().to_owned();
    answered.push(("/v1/accounts/{id}/tickets", "post", 201, "ticket", issued));
    let moved = read(app.withdraw(&account, &ticket, 10).await).await.2;
    answered.push((
        "/v1/accounts/{id}/withdrawals",
        "post",
        201,
        "withdrawal",
        moved,
    ));
    let draw_ticket = app.ticket(&account).await;
    let drawn = read(
        app.spend(&account, "lottery-draws", &draw_ticket, json!({}))
            .await,
    )
    .await
    .2;
    answered.push((
        "/v1/accounts/{id}/lottery-draws",
        "post",
        201,
        "draw",
        drawn,
    ));
    let view = app.get_json(key, &format!("/v1/tickets/{ticket}")).await;
    answered.push(("/v1/tickets/{ticket_id}", "get", 200, "ticket view", view));
    let page = app.get_json(key, &format!("{account_path}/entries")).await;
    let entry_schema = schema(
        &spec,
        &response_schema(&spec, "/v1/accounts/{id}/entries", "get", 200)["properties"]["entries"]["items"],
    );
    assert_fits(entry_schema, &page["entries"][0], "entry");
    answered.push(("/v1/accounts/{id}/entries", "get", 200, "entries", page));
    // A payout, once the in-process bank made it, and what the bank holds for it.
    let payout_ticket = app.ticket(&account).await;
    let to_the_bank = json!({ "amount": 5, "destination": "DE89370400440532013000" });
    let accepted = read(
        app.spend(&account, "payouts", &payout_ticket, to_the_bank)
            .await,
    )
    .await
    .2;
    let payout_id = accepted["payout_id"].as_str().unwrap();
    let mut payout = Value::Null;
    for _ in 0..200 {
        payout = app.get_json(key, &format!("/v1/payouts/{payout_id}")).await;
        if payout["status"] != "pending" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    answered.push(("/v1/payouts/{payout_id}", "get", 200, "payout", payout));
    let held = app
        .get_json(key, &format!("/v1/payouts/{payout_id}/bank"))
        .await;
    let held_schema = response_schema(&spec, "/v1/payouts/{payout_id}/bank", "get", 200);
    assert_fits(
        schema(&spec, &held_schema["properties"]["transfers"]["items"]),
        &held["transfers"][0],
        "the bank's transfer",
    );
    answered.push((
        "/v1/payouts/{payout_id}/bank",
        "get",
        200,
        "payout at the bank",
        held,
    ));
    let broke = app.ticket(&account).await;
    let refused = read(app.withdraw(&account, &broke, 1_000_000).await)
        .await
        .2;
    answered.push(("/v1/accounts/{id}/withdrawals", "post", 402, "402", refused));
    for (path, method, status, what, body) in &answered {
        assert_fits(response_schema(&spec, path, method, *status), body, what);
    }
}

/// What the server enforces is in the document: the `Idempotency-Key` pattern (exactly
/// the forms the server accepts), a payout's `Payonce-Bank-Fault` (one of the bank's
/// faults, where the bank takes them; absent where it does not), `limit` 1–1000, every problem name, a name without NUL —
/// and links lead from an account to a ticket, from a ticket to each spend and to its own
/// lookup, and from a spend to the ticket that remembers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_says_what_the_server_enforces() {
    let app = spawn_app(Backend::Embedded).await;
    let spec = app.openapi().await;
    let parameter = |path: &str, method: &str, name: &str| -> Value {
        spec["paths"][path][method]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|parameter| parameter["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{method} {path} has no parameter {name}"))
    };
    for spend in ["withdrawals", "deposits", "lottery-draws"] {
        let key = parameter(
            &format!("/v1/accounts/{{id}}/{spend}"),
            "post",
            "Idempotency-Key",
        );
        assert_eq!(
            key["schema"]["pattern"],
            api::extract::IDEMPOTENCY_KEY_PATTERN,
            "{spend}"
        );
    }
    // `POST path` documents its `status` answer with a description that mentions `mentions`.
    let documented = |path: &str, status: &str, mentions: &str| {
        let response = resolved(&spec, &spec["paths"][path]["post"]["responses"][status]);
        assert!(
            response["description"]
                .as_str()
                .is_some_and(|description| description.contains(mentions)),
            "{path} {status}: {response}"
        );
    };
    // The creates take an optional key of the same syntax, and document its 400 and 422.
    for create in ["/v1/accounts", "/v1/accounts/{id}/orders"] {
        let key = parameter(create, "post", "Idempotency-Key");
        assert_eq!(
            (&key["schema"]["pattern"], key["required"].as_bool()),
            (&json!(api::extract::IDEMPOTENCY_KEY_PATTERN), Some(false)),
            "{create}: {key}"
        );
        for (status, mentions) in [
            ("400", "Idempotency-Key"),
            ("422", "idempotency-key-reuse"),
            ("201", "Idempotent-Replayed"),
        ] {
            documented(create, status, mentions);
        }
    }
    // A payout's demonstration fault: optional, one of the bank's faults (the list the
    // server parses it with), and its two refusals documented.
    let fault = parameter("/v1/accounts/{id}/payouts", "post", "Payonce-Bank-Fault");
    let faults: Vec<&str> = bank::Fault::ALL
        .into_iter()
        .map(bank::Fault::name)
        .collect();
    assert_eq!(
        (
            &fault["in"],
            fault["required"].as_bool().unwrap_or(false),
            &fault["schema"]["enum"]
        ),
        (&json!("header"), false, &json!(faults)),
        "{fault}"
    );
    for (status, mentions) in [("400", "bank-fault-unknown"), ("422", "bank-fault-refused")] {
        documented("/v1/accounts/{id}/payouts", status, mentions);
    }
    // An instance that pays out to a bank at a URL refuses the header: it does not offer it.
    let paying_to_a_url =
        spawn_app_with(Backend::Embedded, &["--bank-url", "http://127.0.0.1:9"]).await;
    let its = paying_to_a_url.openapi().await;
    let names: Vec<&Value> = its["paths"]["/v1/accounts/{id}/payouts"]["post"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|parameter| &parameter["name"])
        .collect();
    assert_eq!(names, [&json!("id"), &json!("Idempotency-Key")]);
    paying_to_a_url.stop().await;
    let limit = parameter("/v1/accounts/{id}/entries", "get", "limit");
    assert_eq!(
        (
            limit["schema"]["minimum"].as_i64(),
            limit["schema"]["maximum"].as_i64()
        ),
        (Some(1), Some(1000))
    );
    let name = parameter("/problems/{name}", "get", "name");
    let names: Vec<&str> = name["schema"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| name.as_str().unwrap())
        .collect();
    let explained: Vec<&str> = api::error::EXPLANATIONS
        .iter()
        .map(|(name, _, _)| *name)
        .collect();
    assert_eq!(names, explained);
    for name in &names {
        let response = app.get(&format!("/problems/{name}")).await;
        assert_eq!(response.status(), StatusCode::OK, "{name}");
    }
    assert!(
        spec["components"]["schemas"]["NewAccountRequest"]["properties"]["name"]["pattern"]
            .as_str()
            .is_some_and(|pattern| pattern.contains("u0000"))
    );

    let links = |path: &str, method: &str| -> Vec<String> {
        spec["paths"][path][method]["responses"]["201"]["links"]
            .as_object()
            .map(|links| {
                links
                    .values()
                    .map(|link| link["operationId"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut from_ticket = links("/v1/accounts/{id}/tickets", "post");
    from_ticket.sort();
    assert_eq!(
        from_ticket,
        ["deposit", "draw", "get_ticket", "send_payout", "withdraw"]
    );
    assert!(links("/v1/accounts", "post").contains(&"issue_ticket".to_owned()));
    for spend in ["withdrawals", "deposits", "lottery-draws"] {
        assert_eq!(
            links(&format!("/v1/accounts/{{id}}/{spend}"), "post"),
            ["get_ticket"]
        );
    }
    // Every link names an operation the document has.
    let operations: Vec<&str> = spec["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .filter_map(|operation| operation["operationId"].as_str())
        .collect();
    for target in from_ticket {
        assert!(operations.contains(&target.as_str()), "{target}");
    }

    // Every 409, 429 and 503 says when to retry, as the server's answers do.
    let mut declared = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            for status in ["409", "429", "503"] {
                let response = &operation["responses"][status];
                if response.is_null() {
                    continue;
                }
                assert_eq!(
                    response["headers"]["Retry-After"]["schema"]["type"], "integer",
                    "{method} {path} {status}"
                );
                declared += 1;
            }
        }
    }
    assert!(declared > 10, "{declared}");
}

/// Every `$ref` in the document leads somewhere: the shared error answers
/// (`#/components/responses/…`) and schemas that operations refer to are all there, and
/// the shared 401 is the one every authenticated operation gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reference_in_the_document_resolves() {
    fn references<'a>(node: &'a Value, found: &mut Vec<&'a str>) {
        match node {
            Value::Object(object) => {
                if let Some(Value::String(reference)) = object.get("$ref") {
                    found.push(reference);
                }
                object.values().for_each(|value| references(value, found));
            }
            Value::Array(values) => values.iter().for_each(|value| references(value, found)),
            _ => {}
        }
    }
    let app = spawn_app(Backend::Embedded).await;
    let spec = app.openapi().await;
    let mut found = Vec::new();
    references(&spec, &mut found);
    for reference in &found {
        let pointer = reference.strip_prefix('#').unwrap_or(reference);
        assert!(
            spec.pointer(pointer).is_some_and(Value::is_object),
            "{reference} leads nowhere"
        );
    }
    let shared_401 = found
        .iter()
        .filter(|reference| **reference == "#/components/responses/Unauthenticated")
        .count();
    assert!(shared_401 >= 10, "{shared_401}");
}
