//! Verifying that a webhook came from payonce, by the Standard Webhooks signature rules:
//! `webhook-signature` holds `v1,<base64 HMAC-SHA256>` of `{webhook-id}.{webhook-timestamp}.{body}`
//! keyed with the secret's bytes (the base64 after `whsec_`) — two of them during a
//! secret's rotation — and `webhook-timestamp` is within five minutes of now, so a
//! captured delivery cannot be replayed later.

pub use reqwest::header::HeaderMap;

/// Why a webhook was not accepted.
#[derive(Debug, thiserror::Error)]
#[error("the webhook is not payonce's: {0}")]
pub struct VerifyError(String);

/// Checks that `body`, delivered with `headers`, was signed with `secret` (`whsec_…`, as
/// payonce showed it when the endpoint was created). Verify the body exactly as it
/// arrived, before parsing it; then drop repeats by `webhook-id`.
pub fn verify(secret: &str, headers: &HeaderMap, body: &[u8]) -> Result<(), VerifyError> {
    let webhook = standardwebhooks::Webhook::new(secret)
        .map_err(|error| VerifyError(format!("the secret: {error}")))?;
    webhook
        .verify(body, headers)
        .map_err(|error| VerifyError(error.to_string()))
}
