//! The prize table: the one place that says what a lottery draw can win.

/// One prize.
#[derive(Debug, PartialEq, Eq)]
pub struct Prize {
    /// Shown to the player and stored in the outcome.
    pub label: &'static str,
    /// Relative chance among all prizes.
    pub weight: u32,
    /// Money credited per point spent, in minor units.
    pub credit_per_point: i64,
}

/// Every prize a draw can win. Expected return: 6.9 minor units per point.
pub const PRIZES: [Prize; 4] = [
    Prize {
        label: "nothing",
        weight: 55,
        credit_per_point: 0,
    },
    Prize {
        label: "bronze",
        weight: 30,
        credit_per_point: 5,
    },
    Prize {
        label: "silver",
        weight: 12,
        credit_per_point: 20,
    },
    Prize {
        label: "gold",
        weight: 3,
        credit_per_point: 100,
    },
];

#[cfg(feature = "test-support")]
tokio::task_local! {
    /// The prize every draw within a scope wins ([`crate::testing::with_prize`]): a test
    /// that runs the same draws twice, to compare what two paths stored, needs the same
    /// prizes both times.
    pub(crate) static FIXED_PRIZE: &'static Prize;
}

/// Draws one prize, by weight.
pub fn draw() -> &'static Prize {
    #[cfg(feature = "test-support")]
    if let Ok(prize) = FIXED_PRIZE.try_with(|prize| *prize) {
        return prize;
    }
    let total: u32 = PRIZES.iter().map(|prize| prize.weight).sum();
    let mut ticket = rand::random_range(0..total);
    for prize in &PRIZES {
        if ticket < prize.weight {
            return prize;
        }
        ticket -= prize.weight;
    }
    // The loop returns for every ticket below the total; keep the compiler content.
    &PRIZES[0]
}

/// The prize with this label, as stored in an outcome.
pub fn prize(label: &str) -> Option<&'static Prize> {
    PRIZES.iter().find(|prize| prize.label == label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_follow_the_weights() {
        let mut wins = [0u32; PRIZES.len()];
        for _ in 0..100_000 {
            let prize = draw();
            let index = PRIZES
                .iter()
                .position(|p| p == prize)
                .expect("a listed prize");
            wins[index] += 1;
        }
        for (prize, wins) in PRIZES.iter().zip(wins) {
            let share = f64::from(wins) / 1000.0;
            assert!(
                (share - f64::from(prize.weight)).abs() < 1.5,
                "{}: {share}%",
                prize.label
            );
        }
    }
}
