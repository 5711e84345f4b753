//! The group commit's batch sizes, as the ledger's and the API's benchmarks print them
//! (each includes this file).

/// The batches the ledger's group commit sent between two readings of
/// [`ledger::Ledger::batches`]: how many, the spends in them, the mean size and the size
/// the median spend went in.
pub fn summary(before: &[(usize, u64)], after: &[(usize, u64)]) -> String {
    let mut sizes = sent_between(before, after);
    sizes.sort_unstable();
    let batches: u64 = sizes.iter().map(|&(_, count)| count).sum();
    let spends: u64 = sizes.iter().map(|&(size, count)| size as u64 * count).sum();
    if batches == 0 {
        return "no batches".into();
    }
    let mut seen = 0;
    let median = sizes
        .iter()
        .find(|&&(size, count)| {
            seen += size as u64 * count;
            seen * 2 >= spends
        })
        .map_or(0, |&(size, _)| size);
    format!(
        "{batches} batches, {spends} spends, mean size {:.1}, the median spend in a batch of {median}, largest {}",
        spends as f64 / batches as f64,
        sizes.last().map_or(0, |&(size, _)| size)
    )
}

/// `(size, batches of that size)` sent between two readings, for every size sent at least
/// once meanwhile.
pub fn sent_between(before: &[(usize, u64)], after: &[(usize, u64)]) -> Vec<(usize, u64)> {
    after
        .iter()
        .map(|&(size, count)| {
            let earlier = before
                .iter()
                .find(|&&(seen, _)| seen == size)
                .map_or(0, |&(_, count)| count);
            (size, count - earlier)
        })
        .filter(|&(_, count)| count > 0)
        .collect()
}
