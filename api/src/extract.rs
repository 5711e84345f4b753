//! Request extractors that speak the API's error format: the client's address, the path's
//! ids, the `Idempotency-Key`, and JSON bodies. (Who the caller is: `auth.rs`.)

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::{ConnectInfo, FromRef, FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, header};
use ipnet::IpNet;
use ledger::holds::HoldId;
use ledger::payouts::PayoutId;
use ledger::{AccountId, OrderId, TicketId};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::error::ApiError;
use crate::state::AppState;

/// The client's address: the connection's peer — or, when the peer is a proxy named in
/// `PAYONCE_TRUSTED_PROXIES`, the client that proxy names in `PAYONCE_CLIENT_IP_HEADER`.
/// An IPv4 address written as IPv6 (`::ffff:192.0.2.1`) is the IPv4 address.
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
        let settings = state.settings();
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |ConnectInfo(peer)| {
                peer.ip()
            });
        Ok(Self(client_address(
            peer,
            &parts.headers,
            settings.client_ip_header.as_ref(),
            &settings.trusted_proxies,
        )))
    }
}

/// `peer`, unless it is one of the `trusted` proxies and names the client in `header`.
///
/// The header may list several addresses (`X-Forwarded-For: client, proxy1, proxy2`),
/// each proxy appending the address it was reached from. Only the right end is
/// believable: a client writes anything it likes on the left. So the list is read from
/// the right, skipping trusted proxies, and the first address no trusted proxy has is the
/// client; if every one is trusted, the leftmost. A value that is not an address there
/// (which a trusted proxy would not write) makes the peer count instead.
fn client_address(
    peer: IpAddr,
    headers: &HeaderMap,
    header: Option<&HeaderName>,
    trusted: &[IpNet],
) -> IpAddr {
    let peer = peer.to_canonical();
    let is_trusted = |address: &IpAddr| trusted.iter().any(|network| network.contains(address));
    let Some(header) = header.filter(|_| is_trusted(&peer)) else {
        return peer;
    };
    let mut client = peer;
    for value in headers.get_all(header).iter().rev() {
        let Ok(value) = value.to_str() else {
            return peer;
        };
        for hop in value.rsplit(',') {
            let Ok(address) = hop.trim().parse::<IpAddr>() else {
                return peer;
            };
            client = address.to_canonical();
            if !is_trusted(&client) {
                return client;
            }
        }
    }
    client
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

/// An order id from the path; one that is not a UUID names no order (404).
#[derive(Debug, Clone, Copy)]
pub struct OrderPath(pub OrderId);

impl<S: Send + Sync> FromRequestParts<S> for OrderPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::OrderNotFound)?;
        Uuid::try_parse(&id)
            .map(|id| Self(OrderId(id)))
            .map_err(|_| ApiError::OrderNotFound)
    }
}

/// A hold id from the path; one that is not a UUID names nothing (404).
#[derive(Debug, Clone, Copy)]
pub struct HoldPath(pub HoldId);

impl<S: Send + Sync> FromRequestParts<S> for HoldPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::HoldNotFound)?;
        Uuid::try_parse(&id)
            .map(|id| Self(HoldId(id)))
            .map_err(|_| ApiError::HoldNotFound)
    }
}

/// A payout id from the path; one that is not a UUID names nothing (404).
#[derive(Debug, Clone, Copy)]
pub struct PayoutPath(pub PayoutId);

impl<S: Send + Sync> FromRequestParts<S> for PayoutPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::PayoutNotFound)?;
        Uuid::try_parse(&id)
            .map(|id| Self(PayoutId(id)))
            .map_err(|_| ApiError::PayoutNotFound)
    }
}

/// What [`IdempotencyKey::parse`] accepts, as the OpenAPI document declares it: a
/// hyphenated UUID, bare or in double quotes.
pub const IDEMPOTENCY_KEY_PATTERN: &str = concat!(
    r#"^(?:[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"#,
    r#"|"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")$"#
);

/// The ticket a spend is sent with — or a create's key of the client's own choosing:
/// `Idempotency-Key: <uuid>`, bare or as a quoted structured-field string (`"<uuid>"`),
/// as the IETF draft writes it.
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyKey(pub TicketId);

impl IdempotencyKey {
    /// Parses a header value: the hyphenated form only (the one tickets are issued in),
    /// not the other spellings a UUID parser would take, so the document's pattern is
    /// exactly what is accepted.
    pub fn parse(value: &str) -> Result<Self, ApiError> {
        let value = value.trim();
        let unquoted = value
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
            .unwrap_or(value);
        let hyphenated = unquoted.len() == 36;
        Uuid::try_parse(unquoted)
            .ok()
            .filter(|_| hyphenated)
            .map(|id| Self(TicketId(id)))
            .ok_or(ApiError::IdempotencyKeyInvalid)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        <Self as axum::extract::OptionalFromRequestParts<S>>::from_request_parts(parts, state)
            .await?
            .ok_or(ApiError::IdempotencyKeyMissing)
    }
}

/// A create's optional key (`Option<IdempotencyKey>`): none without the header, and the
/// same 400s as a spend's for a malformed or repeated one. The UUID is the client's own
/// choice here, not a ticket.
impl<S: Send + Sync> axum::extract::OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, ApiError> {
        let mut values = parts.headers.get_all("idempotency-key").iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            // Which one would be meant? Neither is guessed.
            return Err(ApiError::IdempotencyKeyRepeated);
        }
        Self::parse(
            value
                .to_str()
                .map_err(|_| ApiError::IdempotencyKeyInvalid)?,
        )
        .map(Some)
    }
}

/// A JSON body, with the API's errors: 415 without a JSON content type, 400 for
/// malformed JSON, 422 for JSON that is not a valid request, 413 over the size limit. An
/// empty body — without a content type, or with a JSON one — counts as `{}`, so fields
/// with defaults may be left out entirely (a lottery draw of one point needs no body).
/// Every body is a JSON object: any other value — an array above all, which serde's
/// derived `Deserialize` would read as the struct's fields in order — is 422 before it is
/// read as a request.
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
        refuse_other_than_an_object(&bytes)?;
        axum::Json::<T>::from_bytes(&bytes)
            .map(|axum::Json(value)| Self(value))
            .map_err(rejection)
    }
}

/// 422 for a JSON document whose top-level value is not an object; 400 for one that is
/// not JSON at all, whatever it begins with. An object is left to the request's own
/// deserializer.
fn refuse_other_than_an_object(bytes: &[u8]) -> Result<(), ApiError> {
    let first = bytes
        .iter()
        .find(|byte| !matches!(byte, b' ' | b'\t' | b'\n' | b'\r'));
    if first == Some(&b'{') {
        return Ok(());
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|error| {
        ApiError::MalformedJson(format!("Failed to parse the request body as JSON: {error}"))
    })?;
    let kind = match value {
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Null => "null",
        serde_json::Value::Object(_) => return Ok(()),
    };
    Err(ApiError::InvalidRequest(format!(
        "the body must be a JSON object, not {kind}"
    )))
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
        let simple = id.replace('-', "");
        let braced = format!("{{{id}}}");
        let urn = format!("urn:uuid:{id}");
        for bad in [
            "",
            "\"\"",
            "not-a-uuid",
            "\"0b6f5b8e\"",
            "12345",
            simple.as_str(),
            braced.as_str(),
            urn.as_str(),
        ] {
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
    fn the_client_is_the_last_address_no_trusted_proxy_has() {
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
        let header = HeaderName::from_static("x-forwarded-for");
        let with = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(&header, value.parse().unwrap());
            }
            headers
        };
        let client = |peer: &str, values: &[&str]| {
            client_address(ip(peer), &with(values), Some(&header), &trusted)
        };
        // From an untrusted peer the header is ignored; without a header, the peer.
        assert_eq!(client("192.0.2.1", &["198.51.100.7"]), ip("192.0.2.1"));
        assert_eq!(client("10.0.0.2", &[]), ip("10.0.0.2"));
        assert_eq!(
            client_address(ip("10.0.0.2"), &with(&["198.51.100.7"]), None, &trusted),
            ip("10.0.0.2")
        );
        // From a trusted one: the rightmost untrusted address, whatever the client put
        // on the left, across repeated header lines too.
        assert_eq!(client("10.0.0.2", &["198.51.100.7"]), ip("198.51.100.7"));
        assert_eq!(
            client("10.0.0.2", &["203.0.113.9, 198.51.100.7, 10.1.2.3"]),
            ip("198.51.100.7")
        );
        assert_eq!(
            client("::1", &["203.0.113.9", "198.51.100.7 ,10.1.2.3"]),
            ip("198.51.100.7")
        );
        assert_eq!(client("10.0.0.2", &["10.9.9.9, 10.1.2.3"]), ip("10.9.9.9"));
        assert_eq!(client("10.0.0.2", &["2001:db8::5"]), ip("2001:db8::5"));
        // Garbage a trusted proxy would not write: the peer counts.
        assert_eq!(client("10.0.0.2", &["unknown, 10.1.2.3"]), ip("10.0.0.2"));
        assert_eq!(client("10.0.0.2", &["198.51.100.7:4711"]), ip("10.0.0.2"));
        // A mapped IPv4 peer is its IPv4 address, trusted or not; so is a mapped client.
        assert_eq!(
            client("::ffff:10.0.0.2", &["::ffff:198.51.100.7"]),
            ip("198.51.100.7")
        );
        assert_eq!(client("::ffff:192.0.2.1", &[]), ip("192.0.2.1"));
    }
}
