//! The one merge of a series' two forms: a range read gets the series' rows and the items
//! of its packed values, and [`Merged`] puts them in key order, once per key, within the
//! range, up to a limit. Every range reader of the packed tiers (host rows, process ticks,
//! GPU samples, rollup minutes, health readings) merges through it.
//!
//! A minute is in one form at a time, so a key is held twice only while a write races a
//! read, or (health) when a late reading is written as a row into a packed hour: which form
//! wins is the table's rule ([`Prefer`]).

use super::TimeRange;
use gpufleet_core::UnixMs;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

/// Which form's item is kept where both hold a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prefer {
    /// The row: what the row table holds is what was written last.
    Rows,
    /// The packed item: it was written first, and a second insert of a stored time
    /// changes nothing.
    Packed,
}

/// Items of one series by key, from both forms.
#[derive(Debug)]
pub(crate) struct Merged<K, T> {
    range: TimeRange,
    prefer: Prefer,
    items: BTreeMap<K, T>,
}

impl<K: Ord, T> Merged<K, T> {
    /// A read of `range` (both ends included) under `prefer`.
    pub(crate) fn new(range: TimeRange, prefer: Prefer) -> Self {
        Merged {
            range,
            prefer,
            items: BTreeMap::new(),
        }
    }

    /// Adds the series' rows (read with the range already).
    pub(crate) fn rows(&mut self, rows: impl IntoIterator<Item = (K, T)>) {
        for (k, v) in rows {
            self.put(k, v, Prefer::Rows);
        }
    }

    /// Adds the items of packed values, those whose time (`time` of the key) is in the
    /// range; returns how many were.
    pub(crate) fn packed(
        &mut self,
        items: impl IntoIterator<Item = (K, T)>,
        time: impl Fn(&K) -> UnixMs,
    ) -> usize {
        let mut n = 0;
        for (k, v) in items {
            let t = time(&k);
            if (self.range.from_ms..=self.range.to_ms).contains(&t) {
                n += 1;
                self.put(k, v, Prefer::Packed);
            }
        }
        n
    }

    fn put(&mut self, k: K, v: T, from: Prefer) {
        match self.items.entry(k) {
            Entry::Vacant(e) => {
                e.insert(v);
            }
            Entry::Occupied(mut e) if from == self.prefer => {
                e.insert(v);
            }
            Entry::Occupied(_) => {}
        }
    }

    /// The first `limit` items in key order.
    pub(crate) fn take(self, limit: usize) -> impl Iterator<Item = (K, T)> {
        self.items.into_iter().take(limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range(from_ms: UnixMs, to_ms: UnixMs) -> TimeRange {
        TimeRange { from_ms, to_ms }
    }

    #[test]
    fn the_preferred_form_wins_either_way_round() {
        for prefer in [Prefer::Rows, Prefer::Packed] {
            let mut m = Merged::new(range(0, 100), prefer);
            m.rows([(10, "row"), (20, "row")]);
            assert_eq!(m.packed([(20, "packed"), (30, "packed")], |k| *k), 2);
            let got: Vec<_> = m.take(10).collect();
            let at_20 = if prefer == Prefer::Rows {
                "row"
            } else {
                "packed"
            };
            assert_eq!(got, [(10, "row"), (20, at_20), (30, "packed")]);
        }
    }

    #[test]
    fn packed_items_outside_the_range_are_not_counted_or_kept() {
        let mut m = Merged::new(range(10, 20), Prefer::Rows);
        assert_eq!(
            m.packed([(9, 'a'), (10, 'b'), (20, 'c'), (21, 'd')], |k| *k),
            2
        );
        assert_eq!(m.take(5).collect::<Vec<_>>(), [(10, 'b'), (20, 'c')]);
    }

    proptest! {
        /// Whatever the split between rows and packed items, a read gives each key once,
        /// in order, in range, at most `limit`, with the preferred form's value.
        #[test]
        fn a_read_is_the_ordered_union(
            rows in proptest::collection::btree_map(0i64..50, 0u8..4, 0..30),
            packed in proptest::collection::btree_map(-10i64..60, 4u8..8, 0..30),
            limit in 0usize..40,
            rows_win in any::<bool>(),
        ) {
            let prefer = if rows_win { Prefer::Rows } else { Prefer::Packed };
            let mut m = Merged::new(range(0, 49), prefer);
            m.rows(rows.clone());
            m.packed(packed.clone(), |k| *k);
            let got: Vec<_> = m.take(limit).collect();
            let mut want = BTreeMap::new();
            for (k, v) in packed.iter().filter(|(k, _)| (0..=49).contains(*k)) {
                want.insert(*k, *v);
            }
            for (k, v) in &rows {
                if rows_win || !want.contains_key(k) {
                    want.insert(*k, *v);
                }
            }
            let want: Vec<_> = want.into_iter().take(limit).collect();
            prop_assert_eq!(got, want);
        }
    }
}
