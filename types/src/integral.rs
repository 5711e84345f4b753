//! Amounts as the contract reads them.

/// Deserializes an integer, also when written as an integral number (`250.0`, `2.5e2`):
/// the OpenAPI document says `integer`, and JSON Schema counts those as integers. A
/// fraction, a string, or an integral number beyond ±2^53 (which a float cannot hold
/// exactly) is refused — 422 `invalid-request`. A request's fingerprint is taken from the
/// value read, so `250.0` and `250` are the same request.
pub fn integral<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    use serde::de::{Error, Unexpected, Visitor};

    struct Integral;

    impl Visitor<'_> for Integral {
        type Value = i64;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an integer")
        }

        fn visit_i64<E: Error>(self, value: i64) -> Result<i64, E> {
            Ok(value)
        }

        fn visit_u64<E: Error>(self, value: u64) -> Result<i64, E> {
            i64::try_from(value).map_err(|_| E::invalid_value(Unexpected::Unsigned(value), &self))
        }

        fn visit_f64<E: Error>(self, value: f64) -> Result<i64, E> {
            /// 2^53: every integer up to it is exact in a float, none much beyond.
            const EXACT: f64 = 9_007_199_254_740_992.0;
            if value.fract() == 0.0 && value.abs() <= EXACT {
                // Exact: integral and within ±2^53.
                Ok(value as i64)
            } else {
                Err(E::invalid_value(Unexpected::Float(value), &self))
            }
        }
    }

    deserializer.deserialize_any(Integral)
}

/// [`integral`], for a member that may be absent (with `#[serde(default)]`) or null.
pub fn option<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    #[derive(serde::Deserialize)]
    struct Integral(#[serde(deserialize_with = "integral")] i64);

    Ok(
        <Option<Integral> as serde::Deserialize>::deserialize(deserializer)?
            .map(|Integral(value)| value),
    )
}

#[cfg(test)]
mod integral_tests {
    #[derive(Debug, serde::Deserialize)]
    struct Amount {
        #[serde(deserialize_with = "super::integral")]
        amount: i64,
    }

    fn read(json: &str) -> Option<i64> {
        serde_json::from_str::<Amount>(json).ok().map(|a| a.amount)
    }

    #[test]
    fn integral_numbers_are_integers_and_nothing_else_is() {
        assert_eq!(read(r#"{"amount": 250}"#), Some(250));
        assert_eq!(read(r#"{"amount": 250.0}"#), Some(250));
        assert_eq!(read(r#"{"amount": 2.5e2}"#), Some(250));
        assert_eq!(read(r#"{"amount": -3.0}"#), Some(-3));
        assert_eq!(read(r#"{"amount": 9007199254740992.0}"#), Some(1 << 53));
        // Large integral floats parse exactly (serde_json's `float_roundtrip`): without it
        // this one read as …198.5, and a schema-valid body was refused (found by
        // Schemathesis).
        assert_eq!(
            read(r#"{"amount": 4364179650694198.0}"#),
            Some(4_364_179_650_694_198)
        );
        for refused in [
            r#"{"amount": 2.5}"#,
            r#"{"amount": 1e30}"#,
            r#"{"amount": 9223372036854775808}"#,
            r#"{"amount": "250"}"#,
            r#"{"amount": null}"#,
        ] {
            assert_eq!(read(refused), None, "{refused}");
        }
    }
}
