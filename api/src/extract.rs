//! Request extractors that speak the API's error format: the caller's account (from the
//! bearer key), the path's ids, the `Idempotency-Key`, and JSON bodies.

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::{ConnectInfo, FromRef, FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use ledger::{AccountId, TicketId};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::error::ApiError;
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
        let key = bearer(&parts.headers).ok_or(ApiError::Unauthenticated)?;
        let state = AppState::from_ref(state);
        state
            .authenticate(key)
            .await?
            .map(Self)
            .ok_or(ApiError::Unauthenticated)
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| key.trim())
        .filter(|key| !key.is_empty())
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

/// The client's address: the connection's peer, or — behind a proxy, when
/// `PAYONCE_CLIENT_IP_HEADER` names the header the proxy sets — that header's address.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddress(pub IpAddr);

impl<S> FromRequestParts<S> for ClientAddress
where
    AppState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let state = AppState::from_ref(state);
        let forwarded = state
            .settings()
            .client_ip_header
            .as_ref()
            .and_then(|name| parts.headers.get(name))
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<IpAddr>().ok());
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| peer.ip());
        Ok(Self(
            forwarded
                .or(peer)
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        ))
    }
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

/// An account id from the path; one that is not a UUID names nothing (404).
#[derive(Debug, Clone, Copy)]
pub struct AccountPath(pub AccountId);

impl<S: Send + Sync> FromRequestParts<S> for AccountPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::NotFound("no such account".into()))?;
        Uuid::try_parse(&id)
            .map(|id| Self(AccountId(id)))
            .map_err(|_| ApiError::NotFound("no such account".into()))
    }
}

/// A ticket id from the path.
#[derive(Debug, Clone, Copy)]
pub struct TicketPath(pub TicketId);

impl<S: Send + Sync> FromRequestParts<S> for TicketPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::TicketNotFound)?;
        Uuid::try_parse(&id)
            .map(|id| Self(TicketId(id)))
            .map_err(|_| ApiError::TicketNotFound)
    }
}

/// The ticket a spend is sent with: `Idempotency-Key: <uuid>`, bare or as a quoted
/// structured-field string (`"<uuid>"`), as the IETF draft writes it.
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyKey(pub TicketId);

impl IdempotencyKey {
    /// Parses a header value.
    pub fn parse(value: &str) -> Result<Self, ApiError> {
        let value = value.trim();
        let unquoted = value
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
            .unwrap_or(value);
        Uuid::try_parse(unquoted)
            .map(|id| Self(TicketId(id)))
            .map_err(|_| ApiError::IdempotencyKeyInvalid)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let mut values = parts.headers.get_all("idempotency-key").iter();
        let value = values.next().ok_or(ApiError::IdempotencyKeyMissing)?;
        if values.next().is_some() {
            // Which one would be meant? Neither is guessed.
            return Err(ApiError::IdempotencyKeyRepeated);
        }
        Self::parse(
            value
                .to_str()
                .map_err(|_| ApiError::IdempotencyKeyInvalid)?,
        )
    }
}

/// A JSON body, with the API's errors: 415 without a JSON content type, 400 for
/// malformed JSON, 422 for JSON that is not a valid request, 413 over the size limit. An
/// empty body — without a content type, or with a JSON one — counts as `{}`, so fields
/// with defaults may be left out entirely (a lottery draw of one point needs no body).
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let has_content_type = request.headers().contains_key(header::CONTENT_TYPE);
        let json_content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .map(|essence| {
                let essence = essence.trim().to_ascii_lowercase();
                essence == "application/json" || essence.ends_with("+json")
            })
            .unwrap_or(false);
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::PayloadTooLarge
                } else {
                    ApiError::MalformedJson(rejection.body_text())
                }
            })?;
        if bytes.is_empty() && (json_content_type || !has_content_type) {
            return axum::Json::<T>::from_bytes(b"{}")
                .map(|axum::Json(value)| Self(value))
                .map_err(rejection);
        }
        if !json_content_type {
            return Err(ApiError::UnsupportedMediaType);
        }
        axum::Json::<T>::from_bytes(&bytes)
            .map(|axum::Json(value)| Self(value))
            .map_err(rejection)
    }
}

fn rejection(rejection: JsonRejection) -> ApiError {
    match rejection {
        JsonRejection::JsonDataError(error) => ApiError::InvalidRequest(error.body_text()),
        JsonRejection::JsonSyntaxError(error) => ApiError::MalformedJson(error.body_text()),
        JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType,
        other if other.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::PayloadTooLarge
        }
        other => ApiError::MalformedJson(other.body_text()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_bare_or_quoted() {
        let id = "0b6f5b8e-6f1e-4f7e-9d55-4f0b1f7a2c3d";
        assert_eq!(
            IdempotencyKey::parse(id)
                .map(|k| k.0.0.to_string())
                .ok()
                .as_deref(),
            Some(id)
        );
        let quoted = format!("\"{id}\"");
        assert_eq!(
            IdempotencyKey::parse(&quoted)
                .map(|k| k.0.0.to_string())
                .ok()
                .as_deref(),
            Some(id)
        );
        for bad in ["", "\"\"", "not-a-uuid", "\"0b6f5b8e\"", "12345"] {
            assert!(
                matches!(
                    IdempotencyKey::parse(bad),
                    Err(ApiError::IdempotencyKeyInvalid)
                ),
                "{bad}"
            );
        }
    }

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
