//! Who owns which database: a pure function of the live instances and the databases, the same
//! on every instance that reads the same membership.
//!
//! Each database ranks the instances by a digest of the pair (rendezvous hashing), so a
//! database keeps its owner while that owner lives and the counts allow it. Counts are fixed
//! first: with `n` databases and `m` instances every instance owns `n / m`, and the first
//! `n % m` instances (by id) one more, so no instance owns more than one database above
//! another. Databases are placed in the order of their own digest, each on its best-ranked
//! instance that still has room.

use std::collections::BTreeMap;

/// The owner of each database: `databases` spread over `instances` (see the module's doc).
/// Empty when there is no instance.
pub(crate) fn assign<'a>(
    instances: &[&'a str],
    databases: &[&'a str],
) -> BTreeMap<&'a str, &'a str> {
    let mut instances: Vec<&str> = instances.to_vec();
    instances.sort_unstable();
    instances.dedup();
    let mut databases: Vec<&str> = databases.to_vec();
    databases.sort_unstable();
    databases.dedup();
    let mut owners = BTreeMap::new();
    if instances.is_empty() {
        return owners;
    }
    let (base, extra) = (
        databases.len() / instances.len(),
        databases.len() % instances.len(),
    );
    let mut room: Vec<usize> = (0..instances.len())
        .map(|i| base + usize::from(i < extra))
        .collect();
    databases.sort_by_key(|d| (weight(d, ""), *d));
    for database in databases {
        let best = (0..instances.len())
            .filter(|&i| room[i] > 0)
            .max_by_key(|&i| (weight(database, instances[i]), std::cmp::Reverse(i)))
            .expect("the rooms add up to the databases");
        room[best] -= 1;
        owners.insert(database, instances[best]);
    }
    owners
}

/// The rank of `instance` for `database`: the digest of both with a separator, then mixed so
/// that ids differing in their last byte rank far apart.
fn weight(database: &str, instance: &str) -> u64 {
    let mut h =
        crate::inbox::digest::digest(&[database.as_bytes(), &[0xff], instance.as_bytes()].concat());
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    fn counts<'a>(owners: &BTreeMap<&'a str, &'a str>) -> BTreeMap<&'a str, usize> {
        let mut counts = BTreeMap::new();
        for owner in owners.values() {
            *counts.entry(*owner).or_default() += 1;
        }
        counts
    }

    #[test]
    fn every_database_has_one_owner_within_one_of_even() {
        for (n, m) in [
            (12, 3),
            (13, 3),
            (14, 3),
            (1, 3),
            (0, 2),
            (50, 7),
            (3, 3),
            (2, 5),
        ] {
            let dbs = names("tenant-", n);
            let ins = names("pod-", m);
            let d: Vec<&str> = dbs.iter().map(String::as_str).collect();
            let i: Vec<&str> = ins.iter().map(String::as_str).collect();
            let owners = assign(&i, &d);
            assert_eq!(owners.len(), n, "{n} databases over {m} instances");
            let counts = counts(&owners);
            let max = counts.values().copied().max().unwrap_or(0);
            let min = if counts.len() < m {
                0
            } else {
                counts.values().copied().min().unwrap_or(0)
            };
            assert!(max - min <= 1, "{n} over {m}: {counts:?}");
        }
    }

    #[test]
    fn every_instance_computes_the_same_owners_whatever_the_order() {
        let dbs = names("t", 12);
        let mut d: Vec<&str> = dbs.iter().map(String::as_str).collect();
        let owners = assign(&["b", "a", "c"], &d);
        d.reverse();
        assert_eq!(assign(&["c", "b", "a", "a"], &d), owners);
    }

    #[test]
    fn no_instance_owns_nothing_and_one_owns_everything() {
        assert!(assign(&[], &["t1", "t2"]).is_empty());
        let owners = assign(&["only"], &["t1", "t2", "t3"]);
        assert!(owners.values().all(|o| *o == "only"));
        assert_eq!(owners.len(), 3);
    }

    #[test]
    fn a_departure_moves_the_leavers_databases_and_few_others() {
        let dbs = names("tenant-", 12);
        let d: Vec<&str> = dbs.iter().map(String::as_str).collect();
        let before = assign(&["pod-a", "pod-b", "pod-c"], &d);
        let after = assign(&["pod-a", "pod-b"], &d);
        assert!(after.values().all(|o| *o != "pod-c"));
        let kept = d
            .iter()
            .filter(|db| before[*db] != "pod-c" && before[*db] == after[*db])
            .count();
        let survivors = d.iter().filter(|db| before[*db] != "pod-c").count();
        // Most databases of the instances that stay keep their owner.
        assert!(kept * 4 >= survivors * 3, "kept {kept} of {survivors}");
        // A return restores the first assignment: ownership moves back when one joins.
        assert_eq!(assign(&["pod-a", "pod-b", "pod-c"], &d), before);
    }
}
