//! The demonstration (cargo feature `demo`): the lock strategies the classic write-ups get
//! wrong, next to the fenced one, and the faults that expose them.
//!
//! Every non-`fenced` strategy takes this module's own code path: take the strategy's lock
//! (or none), read the balance, make the call-out (where faults strike), write the new
//! balance as an absolute value, release. That read-check-write is what real code behind
//! a lock does when it trusts the lock alone; here it runs against the ledger's
//! clearly-marked `read_unguarded` / `write_unguarded`. The `fenced` path never comes here
//! except for [`Faults::strike`], and nothing here changes the ledger's guarantees for it.
//!
//! Reachable only when the instance is configured with an unsafe `PAYONCE_LOCK_STRATEGY`,
//! or per request with `Payonce-Strategy` and `Payonce-Fault` under `PAYONCE_DEMO`. A build
//! without the feature has none of this module: no fault injection, only the fenced
//! strategy, and it refuses `PAYONCE_DEMO=true` and the unsafe strategies at start-up
//! ([`crate::config::Config::validate`]).

use std::time::Duration;

use axum::http::HeaderMap;
use ledger::{AccountId, Ledger, Operation, TicketId};
use lock::recipes::{GetSetTimestamp, Recipe, RecipeGuard, SetnxExpire};
use lock::{LockError, LockGuard, LockService, Redlock, RedlockGuard};
use tokio::time::Instant;
use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
use utoipa::openapi::{Object, RefOr, Required, Type};

use crate::config::lock::Strategy;
use crate::error::ApiError;
use crate::render::render;

/// The unsafe strategies' locks. Present in the distributed mode; Redlock only with
/// `PAYONCE_REDLOCK_URLS`.
#[derive(Debug, Default)]
pub struct Recipes {
    setnx_expire: Option<SetnxExpire>,
    getset: Option<GetSetTimestamp>,
    redlock: Option<Redlock>,
}

impl Recipes {
    /// Connects (lazily) to the Redis the recipes use, and to the Redlock nodes.
    pub fn open(
        redis_url: &str,
        redlock_urls: &[String],
        namespace: &str,
    ) -> Result<Self, LockError> {
        let demo_namespace = format!("{namespace}:demo");
        Ok(Self {
            setnx_expire: Some(SetnxExpire::open(redis_url, &demo_namespace)?),
            getset: Some(GetSetTimestamp::open(redis_url, &demo_namespace)?),
            redlock: if redlock_urls.is_empty() {
                None
            } else {
                Some(Redlock::open(redlock_urls, &demo_namespace)?)
            },
        })
    }
}

/// Faults a demonstration request asks for with `Payonce-Fault`, comma-separated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// `pause=<duration>`: a stop-the-world pause inside the critical section; lock
    /// renewal stops with it.
    pub pause: Option<Duration>,
    /// `slow=<duration>`: a slow call-out inside the critical section (renewal goes on).
    pub slow: Option<Duration>,
    /// `clock-offset=[-]<duration>`: this request's wall clock runs ahead (or behind), for
    /// the timestamp lock; in milliseconds.
    pub clock_offset_ms: i64,
}

impl Faults {
    /// The faults a request asks for; none unless the demonstration mode is on.
    pub fn requested(demo: bool, headers: &HeaderMap) -> Result<Self, ApiError> {
        let mut faults = Self::default();
        if !demo {
            return Ok(faults);
        }
        let Some(value) = headers.get("payonce-fault") else {
            return Ok(faults);
        };
        let bad = || {
            ApiError::BadRequest(
                "Payonce-Fault: expected pause=, slow= or clock-offset= with durations".into(),
            )
        };
        for fault in value.to_str().map_err(|_| bad())?.split(',') {
            let (name, amount) = fault.trim().split_once('=').ok_or_else(bad)?;
            let (negative, amount) = match amount.trim().strip_prefix('-') {
                Some(rest) => (true, rest),
                None => (false, amount.trim().trim_start_matches('+')),
            };
            let duration = humantime::parse_duration(amount).map_err(|_| bad())?;
            match name.trim() {
                // Only a clock can run behind; a negative pause is a typo, not zero.
                "pause" | "slow" if negative => return Err(bad()),
                "pause" => faults.pause = Some(duration),
                "slow" => faults.slow = Some(duration),
                "clock-offset" => {
                    let ms = i64::try_from(duration.as_millis()).map_err(|_| bad())?;
                    faults.clock_offset_ms = if negative { -ms } else { ms };
                }
                _ => return Err(bad()),
            }
        }
        Ok(faults)
    }
}

impl Faults {
    /// What the faults do inside the fenced critical section, with `guard` held. A pause
    /// strikes in the first round only (`first_round`): the retry after a low token is
    /// the spend going on, not a second pause.
    pub async fn strike(&self, guard: &mut LockGuard, ticket_id: TicketId, first_round: bool) {
        if let Some(pause) = self.pause.filter(|_| first_round) {
            // What a stop-the-world pause does: nothing runs, renewal included.
            tracing::warn!(%ticket_id, ?pause, "fault injection: pausing inside the critical section");
            guard.stop_renewal().await;
            tokio::time::sleep(pause).await;
        }
        if let Some(slow) = self.slow {
            // A slow call-out: the watchdog keeps renewing meanwhile.
            tokio::time::sleep(slow).await;
        }
    }
}

/// The unsafe strategy a request runs under, if any: the instance's, or under the
/// demonstration mode (`demo`) the one `Payonce-Strategy` names. `None` for the fenced
/// strategy, and for order payments, payouts and the placing, capture and void of holds,
/// which run fenced only (the strategies are for spends of the account's balance, and for
/// refunds).
pub fn unsafe_strategy(
    instance: Strategy,
    demo: bool,
    operation: Operation,
    headers: &HeaderMap,
) -> Result<Option<Strategy>, ApiError> {
    if matches!(
        operation,
        Operation::OrderPayment { .. }
            | Operation::Payout { .. }
            | Operation::Hold { .. }
            | Operation::Capture { .. }
            | Operation::Void { .. }
    ) {
        return Ok(None);
    }
    let strategy = match headers.get("payonce-strategy").filter(|_| demo) {
        None => instance,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(Strategy::parse)
            .ok_or_else(|| {
                ApiError::BadRequest(
                    "Payonce-Strategy: expected fenced, none, setnx-expire, getset, unfenced or redlock".into(),
                )
            })?,
    };
    Ok(Some(strategy).filter(|strategy| *strategy != Strategy::Fenced))
}

/// What an unsafe strategy's spend works with: the instance's parts, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Parts<'a> {
    /// The ledger, read and written unguarded.
    pub ledger: &'a Ledger,
    /// The instance's lock service (the `unfenced` strategy).
    pub locks: &'a LockService,
    /// The other strategies' locks.
    pub recipes: &'a Recipes,
    /// The lease of a lock.
    pub lock_ttl: Duration,
    /// How long to wait for one.
    pub lock_wait: Duration,
}

/// The bank key a client without a key scheme sends: a new one on every attempt, so a
/// retry after a lost answer is a new transfer at the bank — the unsafe recipe beside
/// payonce's one key per payout (`PAYONCE_PAYOUT_KEYS=fresh-key-per-attempt`).
pub fn fresh_bank_key(payout: &ledger::payouts::Payout, attempt: u32) -> String {
    format!("{}-attempt-{attempt}", payout.bank_key())
}

/// Says in the OpenAPI document which operations read the demonstration's headers: every
/// spend reads `Payonce-Fault`, and those the strategies are for read `Payonce-Strategy`.
pub fn document(openapi: &mut utoipa::openapi::OpenApi) {
    const STRATEGY: &str = "Demonstration mode (PAYONCE_DEMO) only: fenced, none, setnx-expire, getset, unfenced or redlock";
    const FAULT: &str = "Demonstration mode (PAYONCE_DEMO) only: pause=<duration>, slow=<duration>, clock-offset=[-]<duration>, comma-separated";
    let header = |name: &str, description: &str| {
        RefOr::T(
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Header)
                .required(Required::False)
                .description(Some(description))
                .schema(Some(Object::with_type(Type::String)))
                .build(),
        )
    };
    for (path, item) in openapi.paths.paths.iter_mut() {
        let Some(operation) = item.post.as_mut() else {
            continue;
        };
        let by_strategy = ["/withdrawals", "/deposits", "/lottery-draws"]
            .iter()
            .any(|spend| path.starts_with("/v1/accounts/") && path.ends_with(spend))
            || path.ends_with("/refunds");
        let parameters = operation.parameters.get_or_insert_with(Vec::new);
        if by_strategy {
            parameters.push(header("Payonce-Strategy", STRATEGY));
        }
        if by_strategy || path == "/v1/orders/{order_id}/payments" {
            parameters.push(header("Payonce-Fault", FAULT));
        }
    }
}

/// What a strategy holds during the critical section.
enum Held<'a> {
    Nothing,
    /// The instance's own lock service, its fencing token ignored (the `unfenced`
    /// strategy).
    Lock(LockGuard),
    Recipe(&'a dyn Recipe, RecipeGuard),
    Redlock(&'a Redlock, RedlockGuard),
}

impl Held<'_> {
    async fn release(self, clock_offset_ms: i64) {
        let released = match self {
            Held::Nothing => Ok(()),
            Held::Lock(mut guard) => guard.release().await.map(drop),
            Held::Recipe(recipe, guard) => recipe.release(&guard, clock_offset_ms).await,
            Held::Redlock(redlock, guard) => {
                redlock.release(&guard).await;
                Ok(())
            }
        };
        if let Err(error) = released {
            tracing::debug!(%error, "demonstration lock release failed");
        }
    }
}

fn unavailable(strategy: Strategy) -> ApiError {
    ApiError::BadRequest(format!(
        "strategy {} is not available on this instance (it needs Redis{})",
        strategy.name(),
        if strategy == Strategy::Redlock {
            " and PAYONCE_REDLOCK_URLS"
        } else {
            ""
        }
    ))
}

async fn take<'a>(
    parts: Parts<'a>,
    strategy: Strategy,
    key: &str,
    deadline: Instant,
    faults: Faults,
) -> Result<Held<'a>, ApiError> {
    let Parts {
        locks,
        recipes,
        lock_ttl: ttl,
        ..
    } = parts;
    Ok(match strategy {
        Strategy::None => Held::Nothing,
        Strategy::Unfenced => Held::Lock(locks.acquire(key, ttl, deadline).await?),
        Strategy::SetnxExpire | Strategy::Getset => {
            let recipe: &dyn Recipe = match strategy {
                Strategy::SetnxExpire => recipes.setnx_expire.as_ref().map(|r| r as &dyn Recipe),
                _ => recipes.getset.as_ref().map(|r| r as &dyn Recipe),
            }
            .ok_or_else(|| unavailable(strategy))?;
            let guard = recipe
                .acquire(key, ttl, deadline, faults.clock_offset_ms)
                .await?;
            Held::Recipe(recipe, guard)
        }
        Strategy::Redlock => {
            let redlock = recipes
                .redlock
                .as_ref()
                .ok_or_else(|| unavailable(strategy))?;
            Held::Redlock(redlock, redlock.acquire(key, ttl, deadline).await?)
        }
        Strategy::Fenced => {
            return Err(ApiError::Internal(
                "the fenced strategy has its own path".into(),
            ));
        }
    })
}

/// What an unguarded spend read: its account, or a refund's payment.
enum Read {
    Account(ledger::UnguardedRead),
    Payment(ledger::UnguardedPayment),
}

/// A spend under an unsafe strategy: lock `key` (or not), read, call out, write, release.
#[allow(clippy::too_many_arguments)]
pub async fn spend_unguarded(
    parts: Parts<'_>,
    strategy: Strategy,
    key: &str,
    account: AccountId,
    ticket_id: TicketId,
    operation: Operation,
    fingerprint: &str,
    faults: Faults,
) -> Result<Option<ledger::Applied>, ApiError> {
    let deadline = Instant::now() + parts.lock_wait;
    let mut held = take(parts, strategy, key, deadline, faults).await?;

    let read = match operation {
        Operation::Refund { payment, .. } => parts
            .ledger
            .read_payment_unguarded(account, payment)
            .await
            .map(Read::Payment)
            .map_err(ApiError::from),
        _ => parts
            .ledger
            .read_unguarded(account)
            .await
            .map(Read::Account)
            .map_err(ApiError::from),
    };
    // The call-out between reading and writing, where a pause hurts.
    if let Some(pause) = faults.pause {
        if let Held::Lock(guard) = &mut held {
            guard.stop_renewal().await;
        }
        tokio::time::sleep(pause).await;
    }
    if let Some(slow) = faults.slow {
        tokio::time::sleep(slow).await;
    }
    let ledger = parts.ledger;
    let written = match read {
        Ok(Read::Account(read)) => ledger
            .write_unguarded(ticket_id, account, operation, fingerprint, &read, &render)
            .await
            .map_err(ApiError::from),
        Ok(Read::Payment(read)) => ledger
            .refund_unguarded(ticket_id, account, operation, fingerprint, &read, &render)
            .await
            .map_err(ApiError::from),
        Err(error) => Err(error),
    };
    held.release(faults.clock_offset_ms).await;
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults(value: &str) -> Result<Faults, ApiError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            "payonce-fault",
            axum::http::HeaderValue::from_str(value).expect("a header value"),
        );
        Faults::requested(true, &headers)
    }

    #[test]
    fn faults_parse_and_only_clocks_run_backwards() {
        let parsed = faults("pause=1500ms, slow=20ms, clock-offset=-5s").expect("valid");
        assert_eq!(parsed.pause, Some(Duration::from_millis(1500)));
        assert_eq!(parsed.slow, Some(Duration::from_millis(20)));
        assert_eq!(parsed.clock_offset_ms, -5000);
        assert!(faults("pause=-1s").is_err());
        assert!(faults("slow=-20ms").is_err());
        assert!(faults("nap=1s").is_err());
        let mut headers = HeaderMap::new();
        headers.insert(
            "payonce-fault",
            axum::http::HeaderValue::from_static("pause=1s"),
        );
        assert_eq!(
            Faults::requested(false, &headers).ok(),
            Some(Faults::default())
        );
    }
}
