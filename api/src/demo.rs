//! The demonstration: the lock strategies the classic write-ups get wrong, next to the
//! fenced one, and the faults that expose them.
//!
//! Every non-`fenced` strategy takes this module's own code path: take the strategy's lock
//! (or none), read the balance, make the call-out (where faults strike), write the new
//! balance as an absolute value, release. That read-check-write is what real code behind
//! a lock does when it trusts the lock alone; here it runs against the ledger's
//! clearly-marked `read_unguarded` / `write_unguarded`. The `fenced` path never comes here,
//! and nothing here changes the ledger's guarantees for it.
//!
//! Reachable only when the instance is configured with an unsafe `PAYONCE_LOCK_STRATEGY`,
//! or per request with `Payonce-Strategy` under `PAYONCE_DEMO`.

use std::time::Duration;

use axum::http::HeaderMap;
use ledger::{AccountId, Operation, TicketId};
use lock::LockError;
#[cfg(feature = "demo")]
use lock::recipes::{GetSetTimestamp, Recipe, RecipeGuard, SetnxExpire};
#[cfg(feature = "demo")]
use lock::{LockGuard, LockService, Redlock, RedlockGuard};
#[cfg(feature = "demo")]
use tokio::time::Instant;

use crate::config::Strategy;
use crate::error::ApiError;
#[cfg(feature = "demo")]
use crate::render::render;
use crate::state::AppState;

#[cfg(feature = "demo")]
/// The unsafe strategies' locks. Present in the distributed mode; Redlock only with
/// `PAYONCE_REDLOCK_URLS`.
#[derive(Debug, Default)]
pub struct Recipes {
    setnx_expire: Option<SetnxExpire>,
    getset: Option<GetSetTimestamp>,
    redlock: Option<Redlock>,
}

#[cfg(feature = "demo")]
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

/// Without the demonstration (cargo feature `demo`) there are no unsafe strategies and no
/// locks for them.
#[cfg(not(feature = "demo"))]
#[derive(Debug, Default)]
pub struct Recipes {
    _none: (),
}

#[cfg(not(feature = "demo"))]
impl Recipes {
    /// Nothing to connect to: this build has only the fenced strategy.
    pub fn open(
        _redis_url: &str,
        _redlock_urls: &[String],
        _namespace: &str,
    ) -> Result<Self, LockError> {
        Ok(Self::default())
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

/// The strategy for a request: the instance's, or under the demonstration mode the one
/// `Payonce-Strategy` names.
pub fn strategy(state: &AppState, headers: &HeaderMap) -> Result<Strategy, ApiError> {
    let settings = state.settings();
    if !settings.demo {
        return Ok(settings.strategy);
    }
    match headers.get("payonce-strategy") {
        None => Ok(settings.strategy),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(Strategy::parse)
            .ok_or_else(|| {
                ApiError::BadRequest(
                    "Payonce-Strategy: expected fenced, none, setnx-expire, getset, unfenced or redlock".into(),
                )
            }),
    }
}

/// What a strategy holds during the critical section.
#[cfg(feature = "demo")]
enum Held<'a> {
    Nothing,
    /// The instance's own lock service, its fencing token ignored (the `unfenced`
    /// strategy).
    Lock(LockGuard),
    Recipe(&'a dyn Recipe, RecipeGuard),
    Redlock(&'a Redlock, RedlockGuard),
}

#[cfg(feature = "demo")]
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

#[cfg(feature = "demo")]
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

#[cfg(feature = "demo")]
async fn take<'a>(
    state: &'a AppState,
    strategy: Strategy,
    key: &str,
    deadline: Instant,
    faults: Faults,
) -> Result<Held<'a>, ApiError> {
    let ttl = state.settings().lock_ttl;
    let recipes = state.recipes();
    let locks: &LockService = state.locks();
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

#[cfg(feature = "demo")]
/// A spend under an unsafe strategy: lock (or not), read, call out, write, release.
pub async fn spend_unguarded(
    state: &AppState,
    strategy: Strategy,
    account: AccountId,
    ticket_id: TicketId,
    operation: Operation,
    fingerprint: &str,
    faults: Faults,
) -> Result<Option<ledger::Applied>, ApiError> {
    let key = format!("lock:account:{account}");
    let deadline = Instant::now() + state.settings().lock_wait;
    let mut held = take(state, strategy, &key, deadline, faults).await?;

    let read = state.ledger().read_unguarded(account).await;
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
    let written = match read {
        Ok(read) => state
            .ledger()
            .write_unguarded(ticket_id, account, operation, fingerprint, &read, &render)
            .await
            .map_err(ApiError::from),
        Err(error) => Err(error.into()),
    };
    held.release(faults.clock_offset_ms).await;
    written
}

/// Without the demonstration there is no unsafe strategy to run (the configuration refuses
/// one at start-up, and the request headers are not read): refused, should one get here.
#[cfg(not(feature = "demo"))]
pub async fn spend_unguarded(
    _state: &AppState,
    strategy: Strategy,
    _account: AccountId,
    _ticket_id: TicketId,
    _operation: Operation,
    _fingerprint: &str,
    _faults: Faults,
) -> Result<Option<ledger::Applied>, ApiError> {
    Err(ApiError::BadRequest(format!(
        "strategy {} needs a build with the demonstration (cargo feature demo)",
        strategy.name()
    )))
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
