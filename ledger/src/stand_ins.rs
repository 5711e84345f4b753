//! A success body rendered before the database said the balance and points after the
//! spend: stand-in numbers where they go, which the group commit's statements (`batch.rs`,
//! `hold_batch.rs`) replace by text substitution as they store the body, and the ledger the
//! same way in its own copy. A hold's step has more: the money available after it, the
//! database's clock as the statement read it, and what the hold's row says of it — its
//! amount, its expiry, when and by which ticket it was placed.

use serde_json::Value;
use time::OffsetDateTime;
use time::macros::datetime;

/// Where the balance after the spend goes in a body rendered before the database said it.
/// No balance or points can be negative, so neither stand-in is ever a real value.
pub(crate) const BALANCE_STAND_IN: i64 = i64::MIN;
/// Where the points after the spend go (see [`BALANCE_STAND_IN`]).
pub(crate) const POINTS_STAND_IN: i64 = i64::MIN + 1;
/// Where the money available after a hold's step goes (see [`BALANCE_STAND_IN`]).
pub(crate) const AVAILABLE_STAND_IN: i64 = i64::MIN + 2;
/// Where the database's clock as a hold's step read it goes (a placing's `created_at`, a
/// resolution's `resolved_at`): a time no ledger ever wrote, rendered (RFC 3339) as
/// [`NOW_STAND_IN_TEXT`].
pub(crate) const NOW_STAND_IN: OffsetDateTime = datetime!(1000-01-01 0:00 UTC);
/// [`NOW_STAND_IN`] as a body shows it.
pub(crate) const NOW_STAND_IN_TEXT: &str = "1000-01-01T00:00:00Z";
/// Where the hold's expiry goes (see [`NOW_STAND_IN`]).
pub(crate) const EXPIRY_STAND_IN: OffsetDateTime = datetime!(1001-01-01 0:00 UTC);
/// [`EXPIRY_STAND_IN`] as a body shows it.
pub(crate) const EXPIRY_STAND_IN_TEXT: &str = "1001-01-01T00:00:00Z";
/// Where the time the hold was placed goes (see [`NOW_STAND_IN`]).
pub(crate) const PLACED_AT_STAND_IN: OffsetDateTime = datetime!(1002-01-01 0:00 UTC);
/// [`PLACED_AT_STAND_IN`] as a body shows it.
pub(crate) const PLACED_AT_STAND_IN_TEXT: &str = "1002-01-01T00:00:00Z";
/// Where the hold's amount goes (see [`BALANCE_STAND_IN`]).
pub(crate) const HOLD_AMOUNT_STAND_IN: i64 = i64::MIN + 3;
/// Where the ticket that placed the hold goes: the nil UUID, which no ticket is (tickets are
/// random, version 4).
pub(crate) const PLACED_BY_STAND_IN: uuid::Uuid = uuid::Uuid::nil();
/// [`PLACED_BY_STAND_IN`] as a body shows it.
pub(crate) const PLACED_BY_STAND_IN_TEXT: &str = "00000000-0000-0000-0000-000000000000";

/// `body` as text whose stand-ins the database can replace by plain text substitution, if
/// it is one: every occurrence of a stand-in's digits is a whole number of the body,
/// never part of a string or of a longer number, and every occurrence of a time's text a
/// whole string of it.
pub(crate) fn substitutable(body: &Value) -> Option<String> {
    let text = serde_json::to_string(body).ok()?;
    let numbers = [
        BALANCE_STAND_IN,
        POINTS_STAND_IN,
        AVAILABLE_STAND_IN,
        HOLD_AMOUNT_STAND_IN,
    ]
    .into_iter()
    .all(|stand_in| {
        text.matches(&stand_in.to_string()).count()
            == occurrences(body, &|value| value.as_i64() == Some(stand_in))
    });
    let texts = [
        NOW_STAND_IN_TEXT,
        EXPIRY_STAND_IN_TEXT,
        PLACED_AT_STAND_IN_TEXT,
        PLACED_BY_STAND_IN_TEXT,
    ]
    .into_iter()
    .all(|stand_in| {
        text.matches(stand_in).count()
            == occurrences(body, &|value| value.as_str() == Some(stand_in))
    });
    (numbers && texts).then_some(text)
}

/// `body` (text from [`substitutable`]) with the balance and points after the spend in place
/// of the stand-ins: the text the group commit's statement (`batch.rs`) stores, made the
/// same way — `replace`, the balance first.
pub(crate) fn filled(body: &str, balance: i64, points: i64) -> String {
    body.replace(&BALANCE_STAND_IN.to_string(), &balance.to_string())
        .replace(&POINTS_STAND_IN.to_string(), &points.to_string())
}

/// What a hold's step fills in of its body: the values of the stand-ins, the times RFC 3339
/// and the ticket hyphenated, as the database wrote them.
pub(crate) struct HoldFill<'a> {
    pub balance: i64,
    pub available: i64,
    pub hold_amount: i64,
    pub now: &'a str,
    pub expiry: &'a str,
    pub placed_at: &'a str,
    pub placed_by: &'a str,
}

/// `body` (text from [`substitutable`]) with a hold step's values in place of the
/// stand-ins: the text `hold_batch.rs`'s statement stores, made the same way — `replace`,
/// in this order.
pub(crate) fn filled_hold(body: &str, fill: &HoldFill<'_>) -> String {
    body.replace(&BALANCE_STAND_IN.to_string(), &fill.balance.to_string())
        .replace(&AVAILABLE_STAND_IN.to_string(), &fill.available.to_string())
        .replace(
            &HOLD_AMOUNT_STAND_IN.to_string(),
            &fill.hold_amount.to_string(),
        )
        .replace(NOW_STAND_IN_TEXT, fill.now)
        .replace(EXPIRY_STAND_IN_TEXT, fill.expiry)
        .replace(PLACED_AT_STAND_IN_TEXT, fill.placed_at)
        .replace(PLACED_BY_STAND_IN_TEXT, fill.placed_by)
}

/// How many numbers and strings of `value` `matches` says yes to.
fn occurrences(value: &Value, matches: &dyn Fn(&Value) -> bool) -> usize {
    match value {
        Value::Array(items) => items.iter().map(|item| occurrences(item, matches)).sum(),
        Value::Object(fields) => fields.values().map(|item| occurrences(item, matches)).sum(),
        leaf => usize::from(matches(leaf)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn stand_ins_that_are_whole_numbers_can_be_substituted() {
        let body = json!({"balance": BALANCE_STAND_IN, "nested": [{"points_after": POINTS_STAND_IN}], "amount": 5});
        let text = substitutable(&body).unwrap();
        let filled: Value = serde_json::from_str(&filled(&text, 700, 3)).unwrap();
        assert_eq!(
            filled,
            json!({"balance": 700, "nested": [{"points_after": 3}], "amount": 5})
        );
        assert!(
            substitutable(&json!({"amount": 5})).is_some(),
            "no stand-in at all"
        );
    }

    #[test]
    fn a_hold_steps_stand_ins_render_as_their_texts_and_are_filled_in() {
        let rfc3339 = |moment: OffsetDateTime| {
            moment
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap()
        };
        assert_eq!(rfc3339(NOW_STAND_IN), NOW_STAND_IN_TEXT);
        assert_eq!(rfc3339(EXPIRY_STAND_IN), EXPIRY_STAND_IN_TEXT);
        assert_eq!(rfc3339(PLACED_AT_STAND_IN), PLACED_AT_STAND_IN_TEXT);
        assert_eq!(PLACED_BY_STAND_IN.to_string(), PLACED_BY_STAND_IN_TEXT);
        let body = json!({
            "resolved_at": NOW_STAND_IN_TEXT, "expires_at": EXPIRY_STAND_IN_TEXT,
            "created_at": PLACED_AT_STAND_IN_TEXT, "ticket_id": PLACED_BY_STAND_IN_TEXT,
            "amount": HOLD_AMOUNT_STAND_IN, "captured_amount": HOLD_AMOUNT_STAND_IN,
            "available": AVAILABLE_STAND_IN, "balance": BALANCE_STAND_IN,
        });
        let text = substitutable(&body).unwrap();
        let fill = HoldFill {
            balance: 9,
            available: 4,
            hold_amount: 5,
            now: "2026-11-28T15:30:00.5Z",
            expiry: "2026-11-28T16:30:00.5Z",
            placed_at: "2026-11-28T15:00:00Z",
            placed_by: "7d3c1a52-2c1e-4f0a-9b1e-0c8d2f3a4b5c",
        };
        assert_eq!(
            serde_json::from_str::<Value>(&filled_hold(&text, &fill)).unwrap(),
            json!({
                "resolved_at": "2026-11-28T15:30:00.5Z", "expires_at": "2026-11-28T16:30:00.5Z",
                "created_at": "2026-11-28T15:00:00Z",
                "ticket_id": "7d3c1a52-2c1e-4f0a-9b1e-0c8d2f3a4b5c",
                "amount": 5, "captured_amount": 5, "available": 4, "balance": 9,
            })
        );
        let detail = format!("held until {EXPIRY_STAND_IN_TEXT}");
        assert!(substitutable(&json!({"detail": detail})).is_none());
        let detail = format!("placed by {PLACED_BY_STAND_IN_TEXT}");
        assert!(substitutable(&json!({"detail": detail})).is_none());
    }

    #[test]
    fn stand_ins_inside_text_cannot() {
        let detail = format!("the balance is {BALANCE_STAND_IN}");
        assert!(substitutable(&json!({"balance": BALANCE_STAND_IN, "detail": detail})).is_none());
        let detail = format!("{POINTS_STAND_IN} points");
        assert!(substitutable(&json!({"detail": detail})).is_none());
    }
}
