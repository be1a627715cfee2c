//! Sharing a cap that every principal's holdings count against (parked input rounds,
//! legacy sessions). Each principal has a cap of its own too, but enough principals
//! together fill the shared one; once it is full, a newcomer takes a place from whoever
//! holds the most, as long as that one still holds at least as many as the newcomer
//! after. No group of principals can then keep another out: holding more than others
//! is what loses a place.

use std::collections::HashMap;

use super::Principal;

/// Of the places taken under a full cap (`held`: each place's key, holder, and an
/// order, the first to go the least), the one to free so that `newcomer` gets a place;
/// `None` when no principal holds at least two more than the newcomer (it is then
/// refused: taking a place would not share the cap more evenly).
pub(crate) fn place_to_free<'a, K, O: Ord>(
    held: impl IntoIterator<Item = (K, &'a Principal, O)>,
    newcomer: &Principal,
) -> Option<K> {
    let held: Vec<(K, &Principal, O)> = held.into_iter().collect();
    let mut counts: HashMap<&Principal, usize> = HashMap::new();
    for (_, holder, _) in &held {
        *counts.entry(*holder).or_default() += 1;
    }
    let own = counts.get(newcomer).copied().unwrap_or(0);
    let (fullest, most) = counts.into_iter().max_by_key(|(_, n)| *n)?;
    if most < own + 2 {
        return None;
    }
    held.into_iter()
        .filter(|(_, holder, _)| *holder == fullest)
        .min_by(|a, b| a.2.cmp(&b.2))
        .map(|(key, _, _)| key)
}

/// The principal of agent `name` without an auth context (for tests).
#[cfg(test)]
pub(crate) fn agent(name: &str) -> Principal {
    Principal {
        agent: name.into(),
        context: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fullest_principal_gives_up_its_first_place_to_one_that_holds_fewer() {
        let (a, b, c) = (agent("a"), agent("b"), agent("c"));
        // a holds three places, b one: c (none) takes a's earliest.
        let held = [(1, &a, 30), (2, &a, 10), (3, &b, 5), (4, &a, 20)];
        assert_eq!(place_to_free(held, &c), Some(2));
        // b (one) still takes from a (three).
        assert_eq!(place_to_free(held, &b), Some(2));
        // a itself holds the most: refused.
        assert_eq!(place_to_free(held, &a), None);
        // Even shares are not taken from: b and a hold two each, c one.
        let held = [(1, &a, 1), (2, &a, 2), (3, &b, 3), (4, &b, 4), (5, &c, 5)];
        assert_eq!(place_to_free(held, &c), None);
        // d (none) takes from a or b, the first place of either.
        assert!(matches!(place_to_free(held, &agent("d")), Some(1 | 3)));
        assert_eq!(place_to_free(Vec::<(u8, &Principal, u8)>::new(), &a), None);
    }
}
