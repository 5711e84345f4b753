//! The faults the bank plays: what each does, the rates they are drawn at, and the draw.

use std::str::FromStr;
use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// One fault, as a request meets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 500 before anything is done: nothing stored, the key stays free.
    FailBefore,
    /// The request is done (executed, declined or replayed), then its connection is
    /// closed without one byte of the answer.
    CommitThenDrop,
    /// The request is done, then answered only after the bank's `slow_for` — past any
    /// sensible caller's timeout.
    CommitThenSlow,
    /// A request under a new key is declined for good: 422 `destination-closed`, stored
    /// under the key like any answer (a request under a key taken already is replayed).
    Decline,
    /// 503 with `Retry-After` before anything is done: nothing stored.
    Unavailable,
    /// The bank stops listening for its `down_for`: this request's connection and every
    /// other is closed without an answer, new connections are refused, then the bank
    /// listens again on the same address. Nothing is done.
    Down,
}

impl Fault {
    /// Every fault, in the order the draw tries them.
    pub const ALL: [Self; 6] = [
        Self::FailBefore,
        Self::CommitThenDrop,
        Self::CommitThenSlow,
        Self::Decline,
        Self::Unavailable,
        Self::Down,
    ];

    /// The fault's name, as the demonstration header and the flags spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::FailBefore => "fail-before",
            Self::CommitThenDrop => "commit-then-drop",
            Self::CommitThenSlow => "commit-then-slow",
            Self::Decline => "decline",
            Self::Unavailable => "unavailable",
            Self::Down => "down",
        }
    }
}

/// An unknown fault's name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown fault {0:?} (one of fail-before, commit-then-drop, commit-then-slow, decline, unavailable, down)"
)]
pub struct UnknownFault(pub String);

impl FromStr for Fault {
    type Err = UnknownFault;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|fault| fault.name() == name)
            .ok_or_else(|| UnknownFault(name.to_owned()))
    }
}

/// How often each fault strikes: each a probability per request, 0 to 1, together at
/// most 1 (each request meets at most one fault, so each rate is exactly its share).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultRates {
    /// `fail-before`.
    pub fail_before: f64,
    /// `commit-then-drop`.
    pub commit_then_drop: f64,
    /// `commit-then-slow`.
    pub commit_then_slow: f64,
    /// `decline`.
    pub decline: f64,
    /// `unavailable`.
    pub unavailable: f64,
    /// `down`.
    pub down: f64,
}

/// Rates that are not probabilities.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRates(String);

impl FaultRates {
    /// The rate of `fault`.
    pub fn of(&self, fault: Fault) -> f64 {
        match fault {
            Fault::FailBefore => self.fail_before,
            Fault::CommitThenDrop => self.commit_then_drop,
            Fault::CommitThenSlow => self.commit_then_slow,
            Fault::Decline => self.decline,
            Fault::Unavailable => self.unavailable,
            Fault::Down => self.down,
        }
    }

    /// Checks each rate is in 0..=1 and their sum at most 1.
    pub fn validate(&self) -> Result<(), InvalidRates> {
        for fault in Fault::ALL {
            let rate = self.of(fault);
            if !(0.0..=1.0).contains(&rate) {
                return Err(InvalidRates(format!(
                    "the rate of {} is {rate}, not a probability (0 to 1)",
                    fault.name()
                )));
            }
        }
        let sum: f64 = Fault::ALL.into_iter().map(|fault| self.of(fault)).sum();
        // A little room for rates written as decimals that add up to 1 (0.1 + 0.2 + 0.7).
        if sum > 1.0 + 1e-9 {
            return Err(InvalidRates(format!(
                "the fault rates add up to {sum}; a request meets at most one fault, so at most 1"
            )));
        }
        Ok(())
    }
}

/// The rates and the random source they are drawn from.
#[derive(Debug)]
pub(crate) struct Faults {
    rates: FaultRates,
    /// Shared by every request; seeded for a reproducible sequence of draws (the order
    /// in which concurrent requests draw is still the scheduler's).
    rng: Mutex<StdRng>,
}

impl Faults {
    pub(crate) fn new(rates: FaultRates, seed: Option<u64>) -> Self {
        let seed = seed.unwrap_or_else(rand::random);
        Self {
            rates,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    /// The fault this request meets, if any: one draw, compared against the rates laid
    /// end to end.
    pub(crate) fn draw(&self) -> Option<Fault> {
        if Fault::ALL
            .into_iter()
            .all(|fault| self.rates.of(fault) == 0.0)
        {
            return None;
        }
        let point: f64 = match self.rng.lock() {
            Ok(mut rng) => rng.random(),
            Err(poisoned) => poisoned.into_inner().random(),
        };
        let mut edge = 0.0;
        for fault in Fault::ALL {
            edge += self.rates.of(fault);
            if point < edge {
                return Some(fault);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rates are probabilities that add up to at most 1.
    #[test]
    fn rates_are_checked() {
        assert!(FaultRates::default().validate().is_ok());
        let too_much = FaultRates {
            fail_before: 0.6,
            decline: 0.6,
            ..FaultRates::default()
        };
        assert!(too_much.validate().is_err());
        let negative = FaultRates {
            down: -0.1,
            ..FaultRates::default()
        };
        assert!(negative.validate().is_err());
    }

    /// A rate of 1 always strikes, rates of 0 never, and a seed repeats its draws.
    #[test]
    fn draws_follow_the_rates_and_the_seed() {
        let always = Faults::new(
            FaultRates {
                unavailable: 1.0,
                ..FaultRates::default()
            },
            None,
        );
        assert!((0..100).all(|_| always.draw() == Some(Fault::Unavailable)));
        let never = Faults::new(FaultRates::default(), None);
        assert!((0..100).all(|_| never.draw().is_none()));
        let half = FaultRates {
            fail_before: 0.25,
            decline: 0.25,
            ..FaultRates::default()
        };
        let one: Vec<_> = {
            let faults = Faults::new(half, Some(7));
            (0..200).map(|_| faults.draw()).collect()
        };
        let two: Vec<_> = {
            let faults = Faults::new(half, Some(7));
            (0..200).map(|_| faults.draw()).collect()
        };
        assert_eq!(one, two);
        assert!(one.contains(&None) && one.contains(&Some(Fault::Decline)));
        assert!(one.contains(&Some(Fault::FailBefore)));
        assert!(!one.contains(&Some(Fault::Down)));
    }
}
