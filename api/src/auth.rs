//! Who sends a request: an account, by its API key, or the operator, by
//! `PAYONCE_OPERATOR_KEY` — who alone may create money when that is set (opening balances
//! and points above zero, deposits); unset, anyone may, as the demonstration wants.
//!
//! A key this instance remembers (the ledger keeps the keys it has seen) is let through
//! at once. Any other is checked under its client's allowance of bad keys
//! (`PAYONCE_BAD_KEYS_PER_MINUTE`, see `limits.rs`): past it the answer is 429 before the
//! database is asked, so a flood of guessed keys costs a bounded number of look-ups a
//! second. A key that proves right gives its share of the allowance back.

use std::net::IpAddr;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use ledger::AccountId;

use crate::error::ApiError;
use crate::extract::{AccountPath, ClientAddress};
use crate::limits::KeyCheck;
use crate::state::AppState;

/// The account whose API key authenticated the request.
#[derive(Debug, Clone, Copy)]
pub struct Caller(pub AccountId);

impl<S> FromRequestParts<S> for Caller
where
    AppState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let ClientAddress(client) = ClientAddress::from_request_parts(parts, state).await?;
        let key = bearer(&parts.headers).ok_or(ApiError::Unauthenticated)?;
        account(&AppState::from_ref(state), client, key)
            .await
            .map(Self)
    }
}

impl Caller {
    /// The caller may act on `account` only if it is its own.
    pub fn must_be(self, account: AccountId) -> Result<(), ApiError> {
        if self.0 == account {
            Ok(())
        } else {
            Err(ApiError::Forbidden)
        }
    }
}

/// The key of `Authorization: Bearer <key>`, if there is one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| key.trim())
        .filter(|key| !key.is_empty())
}

/// The account in the path, which must be the caller's: 401 without a valid key, then 404
/// if the path does not hold an account id, then 403 if the key is another account's — in
/// that order, before anything else about the request is looked at. (Authentication
/// first: a caller without a key learns nothing, not even which paths name accounts.)
#[derive(Debug, Clone, Copy)]
pub struct OwnAccount(pub AccountId);

impl<S> FromRequestParts<S> for OwnAccount
where
    AppState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, state).await?;
        let AccountPath(account) = AccountPath::from_request_parts(parts, state).await?;
        caller.must_be(account)?;
        Ok(Self(account))
    }
}

/// Takes one from `client`'s allowance of bad keys (429 past it).
fn check_key(state: &AppState, client: IpAddr) -> Result<KeyCheck<'_>, ApiError> {
    state
        .limits()
        .check_key(client)
        .inspect_err(|_| state.metrics().rate_limited())
}

/// The account `key` is the API key of; 401 if none, 429 if `client` sent too many bad
/// keys lately and this one is not remembered.
pub async fn account(state: &AppState, client: IpAddr, key: &str) -> Result<AccountId, ApiError> {
    if let Some(account) = state.ledger().remembered(key) {
        return Ok(account);
    }
    let check = check_key(state, client)?;
    look_up(state, check, key).await
}

/// Asks the database whose key `key` is, under `check`: spent if it is nobody's.
async fn look_up(state: &AppState, check: KeyCheck<'_>, key: &str) -> Result<AccountId, ApiError> {
    state.metrics().key_looked_up();
    let account = state
        .ledger()
        .authenticate(key)
        .await?
        .ok_or(ApiError::Unauthenticated)?;
    check.passed();
    Ok(account)
}

/// Whether the request may open an account with money or points: anyone may without an
/// operator key; with one, only a request sent with it — 403 `operator-key-required`
/// without a key, 401 with another (a bad key, under the allowance).
pub fn may_create_money(state: &AppState, client: IpAddr, sent: &Bearer) -> Result<(), ApiError> {
    let Some(operator) = &state.settings().operator_key else {
        return Ok(());
    };
    let key = sent.0.as_deref().ok_or(ApiError::OperatorKeyRequired)?;
    let check = check_key(state, client)?;
    if !operator.matches(key) {
        return Err(ApiError::Unauthenticated);
    }
    check.passed();
    Ok(())
}

/// The request's bearer key, if it has one: for endpoints where a key is optional.
#[derive(Debug, Clone)]
pub struct Bearer(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for Bearer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Ok(Self(bearer(&parts.headers).map(str::to_owned)))
    }
}

/// The account a deposit goes into. Without an operator key, the caller's own, as
/// [`OwnAccount`]. With one, any account, for the operator alone: 401 without a valid
/// key, then 404 if the path names no account, then 403 `operator-key-required` for an
/// account's key — the account's own included.
#[derive(Debug, Clone, Copy)]
pub struct DepositAccount(pub AccountId);

impl<S> FromRequestParts<S> for DepositAccount
where
    AppState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let app = AppState::from_ref(state);
        let Some(operator) = &app.settings().operator_key else {
            let OwnAccount(account) = OwnAccount::from_request_parts(parts, state).await?;
            return Ok(Self(account));
        };
        let ClientAddress(client) = ClientAddress::from_request_parts(parts, state).await?;
        let key = bearer(&parts.headers).ok_or(ApiError::Unauthenticated)?;
        let from_operator = if app.ledger().remembered(key).is_some() {
            false
        } else {
            let check = check_key(&app, client)?;
            if operator.matches(key) {
                check.passed();
                true
            } else {
                look_up(&app, check, key).await?;
                false
            }
        };
        let AccountPath(account) = AccountPath::from_request_parts(parts, state).await?;
        if from_operator {
            Ok(Self(account))
        } else {
            Err(ApiError::OperatorKeyRequired)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_keys() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, "Bearer po_abc".parse().unwrap());
        assert_eq!(bearer(&headers), Some("po_abc"));
        headers.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&headers), None);
    }
}
