//! A success body rendered before the database said the balance and points after the
//! spend: stand-in numbers where they go, which the group commit's statement (`batch.rs`)
//! replaces by text substitution as it stores the body, and the ledger the same way in its
//! own copy.

use serde_json::Value;

/// Where the balance after the spend goes in a body rendered before the database said it.
/// No balance or points can be negative, so neither stand-in is ever a real value.
pub(crate) const BALANCE_STAND_IN: i64 = i64::MIN;
/// Where the points after the spend go (see [`BALANCE_STAND_IN`]).
pub(crate) const POINTS_STAND_IN: i64 = i64::MIN + 1;

/// `body` as text whose stand-ins the database can replace by plain text substitution, if
/// it is one: every occurrence of a stand-in's digits is a whole number of the body,
/// never part of a string or of a longer number.
pub(crate) fn substitutable(body: &Value) -> Option<String> {
    let text = serde_json::to_string(body).ok()?;
    [BALANCE_STAND_IN, POINTS_STAND_IN]
        .into_iter()
        .all(|stand_in| text.matches(&stand_in.to_string()).count() == occurrences(body, stand_in))
        .then_some(text)
}

/// `body` (text from [`substitutable`]) with the balance and points after the spend in place
/// of the stand-ins: the text the group commit's statement (`batch.rs`) stores, made the same way — `replace`, the
/// balance first.
pub(crate) fn filled(body: &str, balance: i64, points: i64) -> String {
    body.replace(&BALANCE_STAND_IN.to_string(), &balance.to_string())
        .replace(&POINTS_STAND_IN.to_string(), &points.to_string())
}

/// How many numbers of `value` equal `number`.
fn occurrences(value: &Value, number: i64) -> usize {
    match value {
        Value::Number(found) => usize::from(found.as_i64() == Some(number)),
        Value::Array(items) => items.iter().map(|item| occurrences(item, number)).sum(),
        Value::Object(fields) => fields.values().map(|item| occurrences(item, number)).sum(),
        _ => 0,
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
    fn stand_ins_inside_text_cannot() {
        let detail = format!("the balance is {BALANCE_STAND_IN}");
        assert!(substitutable(&json!({"balance": BALANCE_STAND_IN, "detail": detail})).is_none());
        let detail = format!("{POINTS_STAND_IN} points");
        assert!(substitutable(&json!({"detail": detail})).is_none());
    }
}
