//! The web page in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, which `scripts/services.sh` installs) opens an account, withdraws,
//! replays, bursts and races through the page, checks what the page shows, and saves
//! screenshots (wide and narrow) under the target directory.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;
use tokio::time::{Instant, sleep};

use crate::helpers::{Backend, spawn_app};

/// chromedriver on a free loopback port, killed on drop.
struct ChromeDriver {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
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
            .spawn()
            .expect("chromedriver is installed (scripts/services.sh installs chromium and chromium-driver)");
        let driver = Self {
            child,
            port,
            _profile: tempfile::tempdir().unwrap(),
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
        let profile = self._profile.path().display().to_string();
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

async fn text(browser: &Client, id: &str) -> String {
    browser
        .find(Locator::Id(id))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn attr(browser: &Client, id: &str, name: &str) -> Option<String> {
    browser
        .find(Locator::Id(id))
        .await
        .unwrap()
        .attr(name)
        .await
        .unwrap()
}

/// Waits until `check` holds on what the page shows, or fails saying what it showed.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match check().await {
            Ok(()) => return,
            Err(seen) if Instant::now() > deadline => panic!("{what}: the page shows {seen}"),
            Err(_) => sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn fill(browser: &Client, id: &str, value: &str) {
    let input = browser.find(Locator::Id(id)).await.unwrap();
    input.clear().await.unwrap();
    input.send_keys(value).await.unwrap();
}

async fn balance_is(browser: &Client, expected: &str) {
    until(&format!("balance {expected}"), || async {
        let shown = text(browser, "balance").await;
        if shown == expected {
            Ok(())
        } else {
            Err(format!("balance {shown}"))
        }
    })
    .await;
}

async fn screenshot(browser: &Client, name: &str) {
    browser
        .execute("window.scrollTo(0, 0)", vec![])
        .await
        .unwrap();
    let png = browser.screenshot().await.unwrap();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());
}

/// A person opens an account, withdraws, replays, fires a burst and a race through the
/// page, and sees one execution per ticket and no overdraft.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_page_shows_replays_bursts_and_races() {
    let app = spawn_app(Backend::Embedded).await;
    let driver = ChromeDriver::start().await;
    let browser = driver.browser().await;
    browser.goto(&app.url("/")).await.unwrap();

    // Every form control has a label, and keyboard users can reach every button.
    let labelled: bool = serde_json::from_value(
        browser
            .execute("return [...document.querySelectorAll('input, select')].every(e => e.labels && e.labels.length > 0)", vec![])
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(labelled, "an input without a label");

    fill(&browser, "name", "Ada").await;
    fill(&browser, "opening-balance", "400").await;
    fill(&browser, "opening-points", "5").await;
    browser
        .find(Locator::Id("open"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    balance_is(&browser, "400").await;
    assert!(!text(&browser, "account-id").await.is_empty());
    let stored: serde_json::Value = browser
        .execute(
            "return JSON.parse(sessionStorage.getItem('payonce.account'))",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        stored["key"]
            .as_str()
            .is_some_and(|key| key.starts_with("po_")),
        "the key is kept in sessionStorage"
    );

    // Withdraw 100 with a fresh ticket: executed.
    fill(&browser, "amount", "100").await;
    browser
        .find(Locator::Id("send"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    balance_is(&browser, "300").await;
    until("the first send executed", || async {
        let (status, replayed) = (
            text(&browser, "result-status").await,
            text(&browser, "result-replayed").await,
        );
        if status == "201" && replayed.starts_with("no") {
            Ok(())
        } else {
            Err(format!("{status} {replayed}"))
        }
    })
    .await;
    let ticket = text(&browser, "result-ticket").await;

    // Send again: the stored answer, marked replayed; the balance does not move.
    browser
        .find(Locator::Id("send-again"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until("the repeat replayed", || async {
        let (status, replayed) = (
            text(&browser, "result-status").await,
            text(&browser, "result-replayed").await,
        );
        if status == "201" && replayed.starts_with("yes") {
            Ok(())
        } else {
            Err(format!("{status} {replayed}"))
        }
    })
    .await;
    assert_eq!(text(&browser, "result-ticket").await, ticket);
    assert!(text(&browser, "result-meaning").await.contains("Replayed"));
    balance_is(&browser, "300").await;

    // Ten copies at once with one ticket: one execution, nine replays.
    fill(&browser, "burst-count", "10").await;
    browser
        .find(Locator::Id("burst"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until("one execution and nine replays", || async {
        let executed = attr(&browser, "burst-summary", "data-executed").await;
        let replays = attr(&browser, "burst-summary", "data-replays").await;
        if executed.as_deref() == Some("1") && replays.as_deref() == Some("9") {
            Ok(())
        } else {
            Err(format!("{executed:?} {replays:?}"))
        }
    })
    .await;
    balance_is(&browser, "200").await;
    assert!(
        text(&browser, "burst-summary")
            .await
            .contains("exactly once")
    );

    // Five withdrawals of 100 with five tickets against 200: two succeed, three are refused.
    fill(&browser, "race-count", "5").await;
    fill(&browser, "race-amount", "100").await;
    browser
        .find(Locator::Id("race"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until("two of five succeeded", || async {
        let succeeded = attr(&browser, "race-summary", "data-succeeded").await;
        let refused = attr(&browser, "race-summary", "data-refused").await;
        if succeeded.as_deref() == Some("2") && refused.as_deref() == Some("3") {
            Ok(())
        } else {
            Err(format!("{succeeded:?} {refused:?}"))
        }
    })
    .await;
    balance_is(&browser, "0").await;
    until("five entries", || async {
        let count = attr(&browser, "entries", "data-count").await;
        if count.as_deref() == Some("5") {
            Ok(())
        } else {
            Err(format!("{count:?} entries"))
        }
    })
    .await;
    screenshot(&browser, "web-page.png").await;

    // On a phone-sized screen nothing overflows sideways.
    browser.set_window_size(390, 1400).await.unwrap();
    sleep(Duration::from_millis(200)).await;
    let fits: bool = serde_json::from_value(
        browser
            .execute(
                "return document.documentElement.scrollWidth <= window.innerWidth + 1",
                vec![],
            )
            .await
            .unwrap(),
    )
    .unwrap();
    screenshot(&browser, "web-page-narrow.png").await;
    assert!(fits, "the page is wider than a narrow screen");

    app.assert_audit_clean().await;
    browser.close().await.unwrap();
}
