//! The web page in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, which `scripts/services.sh` installs) opens an account, withdraws,
//! replays, bursts, races, draws and pays out through the page under its content security
//! policy, checks what a person reads there, and saves screenshots (wide and narrow) under
//! the target directory.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::panic::AssertUnwindSafe;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use futures::FutureExt;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::time::{Instant, sleep};

use crate::helpers::{Backend, TestApp, spawn_app};

/// chromedriver on a free loopback port, in a process group of its own that the Chromium
/// it starts joins; dropping it kills the whole group, so no browser outlives the test.
struct ChromeDriver {
    child: Child,
    port: u16,
    profile: tempfile::TempDir,
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        // The group's id is chromedriver's pid (`process_group(0)` below).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChromeDriver {
    async fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("chromedriver")
            .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".to_owned()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver is installed (scripts/services.sh installs chromium and chromium-driver)");
        let driver = Self {
            child,
            port,
            profile: tempfile::tempdir().unwrap(),
        };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return driver;
            }
            sleep(Duration::from_millis(50)).await;
        }
        panic!("chromedriver did not start");
    }

    async fn browser(&self) -> Client {
        let profile = self.profile.path().display().to_string();
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--disable-quic", "--disable-dev-shm-usage", "--window-size=1280,1500",
                    format!("--user-data-dir={profile}"),
                ],
            },
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a Chromium session")
    }
}

/// The result of a script run in the page.
async fn js<T: DeserializeOwned>(browser: &Client, script: &str) -> T {
    let value = browser.execute(script, vec![]).await.unwrap();
    serde_json::from_value(value.clone())
        .unwrap_or_else(|error| panic!("{script} returned {value}: {error}"))
}

/// The text a person sees in an element.
async fn text(browser: &Client, id: &str) -> String {
    browser
        .find(Locator::Id(id))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn focused(browser: &Client) -> String {
    js(
        browser,
        "return document.activeElement && document.activeElement.id",
    )
    .await
}

/// Waits until `check` holds, or fails saying what it saw.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match check().await {
            Ok(()) => return,
            Err(seen) if Instant::now() > deadline => panic!("{what}: {seen}"),
            Err(_) => sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn fill(browser: &Client, id: &str, value: &str) {
    let input = browser.find(Locator::Id(id)).await.unwrap();
    input.clear().await.unwrap();
    input.send_keys(value).await.unwrap();
}

async fn click(browser: &Client, id: &str) {
    browser
        .find(Locator::Id(id))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// How many actions the page has finished: it counts one when an action and the read-back
/// of balance, points and entries that follows it are both done.
async fn actions(browser: &Client) -> u64 {
    js(browser, "return Number(document.body.dataset.actions || 0)").await
}

/// Presses a button and waits until its action, and the refresh after it, are finished.
async fn press(browser: &Client, id: &str) {
    let before = actions(browser).await;
    click(browser, id).await;
    until(&format!("pressing {id} finishes"), || async {
        let done = actions(browser).await;
        if done > before {
            Ok(())
        } else {
            Err(format!("{done} actions finished, as before"))
        }
    })
    .await;
}

fn contains(shown: &str, expected: &str) {
    assert!(
        shown.contains(expected),
        "expected {expected:?}, the page shows {shown:?}"
    );
}

/// Nothing overflows sideways: neither the page nor the ledger's table.
async fn fits(browser: &Client) {
    let widths: Vec<(String, u32, u32)> = js(
        browser,
        "return [['the page', document.documentElement.scrollWidth, document.documentElement.clientWidth]] \
         .concat([...document.querySelectorAll('.tablewrap')].map(wrap => \
           [wrap.closest('section').id, wrap.scrollWidth, wrap.clientWidth]))",
    )
    .await;
    for (what, scroll, client) in &widths {
        assert!(
            scroll <= &(client + 1),
            "something is wider than the screen: {what} {scroll} in {client} ({widths:?})"
        );
    }
}

/// Saves a screenshot of the whole page at this width: the window is made as tall as the page.
async fn screenshot(browser: &Client, width: u32, name: &str) {
    browser.set_window_size(width, 1400).await.unwrap();
    sleep(Duration::from_millis(200)).await;
    let height: u32 = js(browser, "return document.documentElement.scrollHeight").await;
    browser.set_window_size(width, height + 40).await.unwrap();
    sleep(Duration::from_millis(200)).await;
    browser
        .execute("window.scrollTo(0, 0)", vec![])
        .await
        .unwrap();
    let png = browser.screenshot().await.unwrap();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());
}

/// A person opens an account, withdraws, replays, fires a burst and a race, draws, and
/// pays out to a bank that drops its first answer, through the page — and sees one
/// execution per ticket, no overdraft, and one transfer at the bank.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_page_shows_replays_bursts_and_races() {
    let app = spawn_app(Backend::Embedded).await;
    let driver = ChromeDriver::start().await;
    let browser = driver.browser().await;
    // Whatever the walkthrough does, the session (and Chromium with it) is closed before
    // its outcome is reported; dropping the driver then kills anything left in its group.
    let outcome = AssertUnwindSafe(walkthrough(&app, &browser))
        .catch_unwind()
        .await;
    let closed = browser.close().await;
    drop(driver);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    closed.unwrap();
    app.assert_audit_clean().await;
}

async fn walkthrough(app: &TestApp, browser: &Client) {
    // The page allows only its own inline style and script, and requests to its origin.
    let page = app.get("/").await;
    let header = |name: &str| {
        page.headers()
            .get(name)
            .map(|value| value.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let policy = header("content-security-policy");
    for directive in [
        "default-src 'none'",
        "script-src 'sha256-",
        "style-src 'sha256-",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ] {
        contains(&policy, directive);
    }
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert_eq!(header("referrer-policy"), "no-referrer");

    browser.goto(&app.url("/")).await.unwrap();
    // Under that policy the stylesheet applied, no element carries an inline style, and the
    // script ran (it refreshes once at load); later violations are collected.
    let styled: bool = js(
        browser,
        "return getComputedStyle(document.body).backgroundColor === 'rgb(244, 246, 249)' \
         && document.querySelectorAll('[style]').length === 0",
    )
    .await;
    assert!(
        styled,
        "the stylesheet did not apply, or an inline style is left"
    );
    until("the script runs", || async {
        let refreshes: u64 = js(
            browser,
            "return Number(document.body.dataset.refreshes || 0)",
        )
        .await;
        if refreshes > 0 {
            Ok(())
        } else {
            Err("no refresh yet".to_owned())
        }
    })
    .await;
    browser
        .execute(
            "window.violations = []; document.addEventListener('securitypolicyviolation', \
             (e) => window.violations.push(e.violatedDirective + ' ' + e.blockedURI))",
            vec![],
        )
        .await
        .unwrap();

    // Every form control has a label.
    let labelled: bool = js(
        browser,
        "return [...document.querySelectorAll('input')].every(e => e.labels && e.labels.length > 0)",
    )
    .await;
    assert!(labelled, "an input without a label");

    // Open an account.
    fill(browser, "name", "Ada").await;
    fill(browser, "opening-balance", "500").await;
    fill(browser, "opening-points", "5").await;
    press(browser, "open").await;
    contains(
        &text(browser, "account-status").await,
        "Opened Ada's account: balance 500, 5 points.",
    );
    assert_eq!(text(browser, "balance").await, "500");
    assert_eq!(text(browser, "points").await, "5");
    assert!(!text(browser, "account-id").await.is_empty());
    let key: Option<String> = js(
        browser,
        "return JSON.parse(sessionStorage.getItem('payonce.account')).key",
    )
    .await;
    assert!(
        key.is_some_and(|key| key.starts_with("po_")),
        "the key is kept in sessionStorage"
    );

    // Send the account's events to the demonstration inbox, which refuses each event's
    // first delivery: everything below arrives there, each event twice.
    press(browser, "subscribe").await;
    contains(
        &text(browser, "events-status").await,
        "201: the endpoint gets this account's events from now on.",
    );
    assert!(text(browser, "events-secret").await.starts_with("whsec_"));
    contains(&text(browser, "events-endpoint").await, "?first=503");

    // Withdraw 100 with a fresh ticket: executed; focus stays on the button.
    fill(browser, "amount", "100").await;
    press(browser, "send").await;
    assert_eq!(
        text(browser, "spend-status").await,
        "Withdraw 100: 201 executed."
    );
    assert_eq!(text(browser, "result-status").await, "201");
    contains(
        &text(browser, "result-replayed").await,
        "no — this request executed",
    );
    contains(&text(browser, "result-body").await, "\"balance\": 400");
    assert_eq!(text(browser, "balance").await, "400");
    assert_eq!(focused(browser).await, "send");
    let ticket = text(browser, "result-ticket").await;
    assert_eq!(ticket.len(), 36, "{ticket}");

    // Send again: the stored answer, marked replayed; the balance does not move.
    press(browser, "send-again").await;
    contains(
        &text(browser, "spend-status").await,
        "201 replayed — the stored answer, nothing moved",
    );
    contains(
        &text(browser, "result-replayed").await,
        "yes — Idempotent-Replayed: true",
    );
    assert_eq!(text(browser, "result-ticket").await, ticket);
    contains(&text(browser, "result-body").await, "\"balance\": 400");
    assert_eq!(text(browser, "balance").await, "400");
    assert_eq!(focused(browser).await, "send-again");

    // An invalid copy count stops "send N at once" (focus goes to the field that says why)
    // and does not block a plain send.
    fill(browser, "burst-count", "99").await;
    let before = actions(browser).await;
    click(browser, "burst").await;
    assert_eq!(focused(browser).await, "burst-count");
    assert_eq!(actions(browser).await, before, "an invalid burst was sent");
    press(browser, "send").await;
    assert_eq!(
        text(browser, "spend-status").await,
        "Withdraw 100: 201 executed."
    );
    assert_ne!(text(browser, "result-ticket").await, ticket);
    assert_eq!(text(browser, "balance").await, "300");

    // Ten copies at once with one ticket: one execution, nine replays.
    fill(browser, "burst-count", "10").await;
    press(browser, "burst").await;
    contains(
        &text(browser, "spend-status").await,
        "Withdraw 100, 10 copies with one ticket: 1 executed, 9 replays — exactly once",
    );
    assert_eq!(text(browser, "balance").await, "200");

    // A race that does not ask for more than the balance is not sent, and says why.
    fill(browser, "race-count", "2").await;
    fill(browser, "race-amount", "100").await;
    contains(
        &text(browser, "race-plan").await,
        "Asks for 200 in total against a balance of 200 — not more than it",
    );
    press(browser, "race").await;
    contains(
        &text(browser, "race-status").await,
        "Not sent: 2 × 100 asks for 200 in total against a balance of 200",
    );
    assert_eq!(text(browser, "balance").await, "200");

    // Five withdrawals of 100 with five tickets against 200: two succeed, three are refused.
    fill(browser, "race-count", "5").await;
    contains(
        &text(browser, "race-plan").await,
        "Asks for 500 in total against a balance of 200: at most 2 can succeed.",
    );
    press(browser, "race").await;
    assert_eq!(
        text(browser, "race-status").await,
        "5 withdrawals of 100 asked for 500 in total against a balance of 200: 2 succeeded, \
         3 refused (402). The balance covered 2 — exactly that many went through."
    );
    assert_eq!(text(browser, "balance").await, "0");

    // A lottery draw spends points; its line says a replay returns the same prize.
    browser
        .find(Locator::Css(
            "input[name='operation'][value='lottery-draws']",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(text(browser, "amount-label").await, "Points to spend");
    let points: String = js(browser, "return document.getElementById('amount').value").await;
    assert_eq!(points, "1");
    contains(
        &text(browser, "operation-why").await,
        "A replay returns the same prize",
    );
    press(browser, "send").await;
    contains(
        &text(browser, "spend-status").await,
        "Draw with 1 point: 201 executed — prize",
    );
    assert_eq!(text(browser, "points").await, "4");

    // The ledger: the opening and one entry per ticket, each ticket once, with what was
    // left after it.
    assert_eq!(
        js::<String>(
            browser,
            "return document.getElementById('entries').dataset.count"
        )
        .await,
        "7"
    );
    contains(
        &text(browser, "entries-caption").await,
        "7 entries, oldest first",
    );
    let rows: Vec<Vec<String>> = js(
        browser,
        "return [...document.querySelectorAll('#entries tr')].map(row => [...row.cells].map(cell => \
         [...cell.childNodes].filter(node => !node.classList || !node.classList.contains('sr-only')) \
         .map(node => node.textContent).join('').trim()))",
    )
    .await;
    let columns = |row: &[String]| {
        row.iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" | ")
    };
    assert_eq!(columns(&rows[0]), "opening | — | +500 | 500 | +5 | 5");
    assert_eq!(
        columns(&rows[1]),
        format!("withdrawal | {} | -100 | 400 | 0 | 5", &ticket[..8])
    );
    assert!(columns(&rows[6]).starts_with("lottery draw | "));
    assert_eq!(
        (rows[6][4].as_str(), rows[6][5].as_str()),
        ("-1", "4"),
        "{}",
        columns(&rows[6])
    );
    let tickets: Vec<String> = js(
        browser,
        "return [...document.querySelectorAll('#entries [data-ticket]')].map(e => e.title)",
    )
    .await;
    assert_eq!(tickets.len(), 6);
    assert_eq!(tickets[0], ticket, "the whole ticket id is in the title");
    let distinct: std::collections::HashSet<_> = tickets.iter().collect();
    assert_eq!(distinct.len(), tickets.len(), "a ticket with two entries");

    // An order paid twice at once, with two tickets: paid once, the other refused.
    browser
        .find(Locator::Css("input[name='operation'][value='deposits']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    fill(browser, "amount", "100").await;
    press(browser, "send").await;
    fill(browser, "order-amount", "60").await;
    press(browser, "pay-twice").await;
    let paid = text(browser, "order-status").await;
    contains(&paid, "Order of 60, paid twice with two tickets: ");
    contains(&paid, "409 order-already-paid");
    contains(&paid, "— paid exactly once.");

    // A payout whose first answer the bank drops after it made the transfer (offered by
    // default): two attempts under one key, one transfer at the bank, the balance down
    // once, with one ledger entry under the payout's ticket.
    let dropped: bool = js(
        browser,
        "return document.getElementById('payout-drop').checked",
    )
    .await;
    assert!(dropped, "the lost answer is not offered by default");
    let before: i64 = text(browser, "balance").await.parse().unwrap();
    fill(browser, "payout-amount", "25").await;
    press(browser, "pay-out").await;
    assert_eq!(focused(browser).await, "pay-out");
    assert_eq!(
        text(browser, "payout-status").await,
        "Paid out 25 once: 2 attempts, one key, one transfer at the bank."
    );
    assert_eq!(text(browser, "payout-state").await, "succeeded");
    assert_eq!(text(browser, "payout-attempts").await, "2");
    let key = text(browser, "payout-key").await;
    assert!(key.starts_with("payonce-payout-"), "{key}");
    contains(
        &text(browser, "payout-bank").await,
        "The bank holds 1 transfer for this payout (its reference), 1 executed",
    );
    let transfers: Vec<Vec<String>> = js(
        browser,
        "return [...document.querySelectorAll('#payout-transfers li')].map(item => \
         [...item.querySelectorAll('dd')].map(value => value.textContent))",
    )
    .await;
    assert_eq!(transfers.len(), 1, "{transfers:?}");
    assert_eq!(transfers[0][1..], [key.as_str(), "25", "executed"]);
    contains(
        &text(browser, "payout-why").await,
        "the bank, finding the key, replayed its stored answer instead of paying again",
    );
    assert_eq!(text(browser, "balance").await, (before - 25).to_string());
    let payout_ticket = text(browser, "payout-ticket").await;
    let entries: Vec<Vec<String>> = js(
        browser,
        &format!(
            "return [...document.querySelectorAll('#entries [data-ticket=\"{payout_ticket}\"]')] \
             .map(code => [...code.closest('tr').cells].slice(0, 3).map(cell => cell.textContent.trim()))"
        ),
    )
    .await;
    assert_eq!(
        entries,
        [["payout", &payout_ticket[..8], "-25"]],
        "one entry for the payout's ticket"
    );

    // "Refund twice at once": a payment of 100, two refunds of 60 sent together — one
    // 201, one 409 with 40 refundable, one refund entry. Money first: the race spent it.
    browser
        .find(Locator::Css("input[name='operation'][value='deposits']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    fill(browser, "amount", "300").await;
    press(browser, "send").await;
    press(browser, "refund-twice").await;
    let refunded = text(browser, "refund-status").await;
    contains(&refunded, "Payment of 100, refunded 60 twice at once: ");
    contains(&refunded, "409 refund-exceeds-payment (40 refundable)");
    contains(&refunded, "201 refunded 60");
    contains(
        &refunded,
        "One refund fits; the ledger shows 1 refund entry — never more back than was paid.",
    );
    assert_eq!(focused(browser).await, "refund-twice");

    // "Capture as it expires": a hold of two seconds captured at its edge — exactly one of
    // captured or expired, and the page says which and why. Nothing is set aside after.
    let before: i64 = text(browser, "balance").await.parse().unwrap();
    press(browser, "capture-edge").await;
    let edge = text(browser, "capture-status").await;
    contains(&edge, "Exactly one of captured or expired.");
    let taken = if edge.starts_with("Captured 50 of the hold of 50: ") {
        contains(&edge, "it was still held, so the capture won");
        50
    } else {
        assert!(edge.starts_with("Expired: "), "{edge}");
        contains(&edge, "refused with 409 hold-not-held (state expired)");
        0
    };
    println!("the capture at the edge: {edge}");
    assert_eq!(text(browser, "balance").await, (before - taken).to_string());
    assert_eq!(
        text(browser, "available").await,
        text(browser, "balance").await
    );

    // The inbox got the withdrawal's event twice under one webhook-id — refused, then
    // taken — and every signature checks out in the tab, with the secret it holds.
    until(
        "an event refused and then taken arrives at the inbox",
        || async {
            let rows: Vec<(String, String, String)> = js(
                browser,
                "return [...document.querySelectorAll('#events tr')].map(row => \
             [row.dataset.webhookId, row.dataset.answered, row.dataset.verified])",
            )
            .await;
            let retried = rows.iter().any(|(id, answered, _)| {
                answered == "204"
                    && rows
                        .iter()
                        .any(|(other, refused, _)| other == id && refused == "503")
            });
            if rows.iter().any(|(_, _, verified)| verified != "true") {
                panic!("a signature did not verify: {rows:?}");
            }
            if retried {
                Ok(())
            } else {
                Err(format!("{rows:?}"))
            }
        },
    )
    .await;
    contains(
        &text(browser, "events-caption").await,
        "sent again under the same webhook-id",
    );
    let kinds: Vec<String> = js(
        browser,
        "return [...document.querySelectorAll('#events tr')].map(row => row.cells[1].textContent)",
    )
    .await;
    assert!(
        kinds.iter().any(|kind| kind == "withdrawal.succeeded"),
        "{kinds:?}"
    );

    let violations: Vec<String> = js(browser, "return window.violations").await;
    assert!(violations.is_empty(), "{violations:?}");
    screenshot(browser, 1280, "web-page.png").await;
    fits(browser).await;

    // On a phone-sized screen nothing overflows sideways either.
    screenshot(browser, 390, "web-page-narrow.png").await;
    fits(browser).await;

    // Forgetting the account moves focus to the name of the next one.
    click(browser, "forget").await;
    assert_eq!(focused(browser).await, "name");
    assert_eq!(text(browser, "balance").await, "—");
}
