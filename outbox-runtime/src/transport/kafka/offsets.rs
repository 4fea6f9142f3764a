//! Which offsets a consumer may commit: per partition, the position after the longest run of
//! settled deliveries from the start. With keyed lanes handling a partition's messages in
//! parallel, offset N is committed only once every message before it is settled.

use std::collections::{BTreeMap, HashMap};

/// A partition: topic and partition number.
pub(super) type Partition = (String, i32);

/// The deliveries of one partition not yet committed.
#[derive(Debug, Default)]
struct PartitionOffsets {
    /// Delivered offsets and whether each is settled, from the oldest.
    open: BTreeMap<i64, bool>,
    /// Times each offset was handed out again after a rewind (for `delivery_count`).
    redelivered: HashMap<i64, u32>,
}

/// Every assigned partition of a subscription.
#[derive(Debug, Default)]
pub(super) struct Offsets {
    partitions: HashMap<Partition, PartitionOffsets>,
}

impl Offsets {
    /// The partition is now assigned to this consumer: it starts from its committed offset.
    pub(super) fn assign(&mut self, partition: Partition) {
        self.partitions
            .insert(partition, PartitionOffsets::default());
    }

    /// The partition went to another consumer: forget it (its settled run was committed by the
    /// caller first; what is still open will be delivered to the new owner).
    pub(super) fn revoke(&mut self, partition: &Partition) {
        self.partitions.remove(partition);
    }

    /// Whether the partition is assigned here.
    #[cfg(test)]
    pub(super) fn owns(&self, partition: &Partition) -> bool {
        self.partitions.contains_key(partition)
    }

    /// Offset `offset` was handed out; returns its delivery count (1, or more after rewinds).
    pub(super) fn delivered(&mut self, partition: &Partition, offset: i64) -> u32 {
        let p = self.partitions.entry(partition.clone()).or_default();
        p.open.insert(offset, false);
        1 + p.redelivered.get(&offset).copied().unwrap_or(0)
    }

    /// Offset `offset` is settled. Returns the new commit position (the offset after the
    /// settled run from the oldest open delivery) when it moved.
    pub(super) fn settle(&mut self, partition: &Partition, offset: i64) -> Option<i64> {
        let p = self.partitions.get_mut(partition)?;
        match p.open.get_mut(&offset) {
            Some(settled) => *settled = true,
            None => return None,
        }
        let mut position = None;
        while let Some(entry) = p.open.first_entry() {
            if !*entry.get() {
                break;
            }
            let (done, _) = entry.remove_entry();
            p.redelivered.remove(&done);
            position = Some(done + 1);
        }
        position
    }

    /// Hand `offset` and everything after it out again: they are forgotten (the consumer seeks
    /// back to `offset`), and `offset`'s next delivery counts one more.
    pub(super) fn rewind(&mut self, partition: &Partition, offset: i64) -> bool {
        let Some(p) = self.partitions.get_mut(partition) else {
            return false;
        };
        if !p.open.contains_key(&offset) {
            return false;
        }
        p.open.split_off(&offset);
        *p.redelivered.entry(offset).or_default() += 1;
        true
    }

    /// Deliveries handed out and not settled, in every partition.
    pub(super) fn unsettled(&self) -> usize {
        self.partitions
            .values()
            .map(|p| p.open.values().filter(|settled| !**settled).count())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> Partition {
        ("t".to_owned(), 0)
    }

    #[test]
    fn commits_only_the_settled_run_from_the_oldest() {
        let mut o = Offsets::default();
        o.assign(p());
        for offset in 10..15 {
            assert_eq!(o.delivered(&p(), offset), 1);
        }
        // A slow message at 10; later ones done: nothing may be committed.
        assert_eq!(o.settle(&p(), 11), None);
        assert_eq!(o.settle(&p(), 12), None);
        assert_eq!(o.settle(&p(), 14), None);
        assert_eq!(o.unsettled(), 2);
        // 10 done: everything up to 12 is, 13 is not.
        assert_eq!(o.settle(&p(), 10), Some(13));
        assert_eq!(o.settle(&p(), 13), Some(15));
        assert_eq!(o.unsettled(), 0);
        // Settling twice, or an offset never delivered, moves nothing.
        assert_eq!(o.settle(&p(), 13), None);
        assert_eq!(o.settle(&p(), 99), None);
    }

    #[test]
    fn gaps_between_offsets_are_not_waited_for() {
        let mut o = Offsets::default();
        o.assign(p());
        o.delivered(&p(), 3);
        o.delivered(&p(), 7); // 4..6 were compacted away or are transaction markers
        assert_eq!(o.settle(&p(), 7), None);
        assert_eq!(o.settle(&p(), 3), Some(8));
    }

    #[test]
    fn a_rewind_forgets_later_deliveries_and_counts_the_redelivery() {
        let mut o = Offsets::default();
        o.assign(p());
        for offset in 0..4 {
            o.delivered(&p(), offset);
        }
        assert_eq!(o.settle(&p(), 0), Some(1));
        assert_eq!(o.settle(&p(), 2), None);
        assert!(o.rewind(&p(), 1));
        assert_eq!(o.unsettled(), 0, "1 and later are forgotten");
        // A late ack of a forgotten delivery changes nothing.
        assert_eq!(o.settle(&p(), 3), None);
        assert_eq!(
            o.delivered(&p(), 1),
            2,
            "the nacked message's second delivery"
        );
        assert_eq!(o.delivered(&p(), 2), 1);
        assert_eq!(o.settle(&p(), 1), Some(2));
        assert_eq!(o.settle(&p(), 2), Some(3));
    }

    #[test]
    fn revoked_partitions_are_forgotten() {
        let mut o = Offsets::default();
        o.assign(p());
        o.delivered(&p(), 0);
        o.revoke(&p());
        assert!(!o.owns(&p()));
        assert_eq!(o.settle(&p(), 0), None);
        assert!(!o.rewind(&p(), 0));
    }
}
