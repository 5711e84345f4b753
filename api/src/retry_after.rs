//! `Retry-After`: how long a server that answered asks its client to wait — the bank's
//! answers to payouts and webhook receivers' answers both carry it. Its own module so that
//! payouts and webhooks, which both read it, need not import each other for it.

use std::time::Duration;

/// An answer's `Retry-After`, in seconds (the HTTP-date form is not honoured).
pub(crate) fn requested(response: &reqwest::Response) -> Option<Duration> {
    response
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
        .map(Duration::from_secs)
}
