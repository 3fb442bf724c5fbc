//! [`KeyedTable`]: values under random keys (QP numbers, memory keys), found by index.
//!
//! A key is drawn at random, as before, but only among keys whose top bits name a free slot of
//! the table: the slot then holds the key's entry, and a lookup is a shift, a load and a
//! compare, with no hash and no probing. The keys stay as unpredictable as the draw: a peer
//! that holds one learns only that its slot is taken while it lives. rxe and ConnectX put an
//! index in a key's low bits beside a few random ones instead, which makes the rest guessable.
//!
//! The table doubles its slots when half are taken, up to 2^[`MAX_SLOT_BITS`]: a key's top
//! bits still name one slot after a doubling (one more bit of the same key), so no two keys
//! ever meet. Past half that, draws find a free slot less often, and the caller's bounded
//! number of draws says when the table is full.

/// The most slots a table grows to unless told ([`KeyedTable::with_max_slot_bits`]): 2^20,
/// 4 MiB of slot numbers, about a million entries.
pub(crate) const MAX_SLOT_BITS: u32 = 20;
/// The slots a table starts with: 2^6.
const MIN_SLOT_BITS: u32 = 6;

/// Values under `key_bits`-bit keys, each in the slot its top bits name (see the module
/// documentation).
#[derive(Debug, Clone)]
pub(crate) struct KeyedTable<V> {
    key_bits: u32,
    slot_bits: u32,
    /// The most `slot_bits` grows to.
    max_slot_bits: u32,
    /// By slot: 0 if free, else the index in `entries` of its key, plus 1.
    slots: Vec<u32>,
    /// Dense, in no particular order, so that going through every entry costs what they do.
    entries: Vec<(u32, V)>,
}

impl<V> KeyedTable<V> {
    /// An empty table for keys of `key_bits` bits (24 for QP numbers), which grows to
    /// 2^[`MAX_SLOT_BITS`] slots.
    pub fn new(key_bits: u32) -> Self {
        Self::with_max_slot_bits(key_bits, MAX_SLOT_BITS)
    }

    /// An empty table for keys of `key_bits` bits, which grows to 2^`max_slot_bits` slots (no
    /// more than the key has bits): memory keys, of which a device holds millions.
    pub fn with_max_slot_bits(key_bits: u32, max_slot_bits: u32) -> Self {
        debug_assert!((MIN_SLOT_BITS..=32).contains(&key_bits));
        debug_assert!(max_slot_bits >= MIN_SLOT_BITS);
        KeyedTable {
            key_bits,
            max_slot_bits: max_slot_bits.min(key_bits),
            slot_bits: MIN_SLOT_BITS,
            slots: vec![0; 1 << MIN_SLOT_BITS],
            entries: Vec::new(),
        }
    }

    /// The slot `key` belongs in: its top `slot_bits` bits (of `key_bits`).
    fn slot(&self, key: u32) -> usize {
        let key = u64::from(key) & ((1u64 << self.key_bits) - 1);
        (key >> (self.key_bits - self.slot_bits)) as usize
    }

    /// The index in `entries` of `key`'s entry, if it is in the table.
    fn find(&self, key: u32) -> Option<usize> {
        let at = (self.slots[self.slot(key)] as usize).checked_sub(1)?;
        (self.entries[at].0 == key).then_some(at)
    }

    /// The value under `key`.
    pub fn get(&self, key: u32) -> Option<&V> {
        self.find(key).map(|at| &self.entries[at].1)
    }

    /// The value under `key`, to change it.
    pub fn get_mut(&mut self, key: u32) -> Option<&mut V> {
        self.find(key).map(|at| &mut self.entries[at].1)
    }

    /// The key and value in the slot `key` names, whatever the key there is: a caller that
    /// knows only part of a key (its top bits) finds its entry so.
    pub fn get_in_slot(&self, key: u32) -> Option<(u32, &V)> {
        let at = (self.slots[self.slot(key)] as usize).checked_sub(1)?;
        let (found, value) = &self.entries[at];
        Some((*found, value))
    }

    /// Whether a value is under `key`.
    pub fn contains_key(&self, key: u32) -> bool {
        self.find(key).is_some()
    }

    /// Whether `key` may be inserted: its slot is free. A drawn key is kept only if so.
    pub fn takes(&self, key: u32) -> bool {
        self.slots[self.slot(key)] == 0
    }

    /// Whether `a` and `b` name the same slot now.
    pub fn same_slot(&self, a: u32, b: u32) -> bool {
        self.slot(a) == self.slot(b)
    }

    /// Puts `value` under `key`, whose slot must be free ([`takes`](Self::takes)); gives the
    /// value back if it is not.
    pub fn insert(&mut self, key: u32, value: V) -> Result<(), V> {
        let slot = self.slot(key);
        if self.slots[slot] != 0 {
            return Err(value);
        }
        self.entries.push((key, value));
        self.slots[slot] = self.entries.len() as u32;
        if self.entries.len() * 2 > self.slots.len() && self.slot_bits < self.max_slot_bits {
            self.grow();
        }
        Ok(())
    }

    /// Takes the value under `key` out.
    pub fn remove(&mut self, key: u32) -> Option<V> {
        let at = self.find(key)?;
        Some(self.remove_at(at))
    }

    /// Removes the entry at `at` of `entries`; the last entry takes its place.
    fn remove_at(&mut self, at: usize) -> V {
        let slot = self.slot(self.entries[at].0);
        self.slots[slot] = 0;
        let (_, value) = self.entries.swap_remove(at);
        if let Some(&(moved, _)) = self.entries.get(at) {
            let slot = self.slot(moved);
            self.slots[slot] = at as u32 + 1;
        }
        value
    }

    /// Keeps the entries for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(u32, &mut V) -> bool) {
        let mut at = 0;
        while at < self.entries.len() {
            let (key, value) = &mut self.entries[at];
            if keep(*key, value) {
                at += 1;
            } else {
                // The last entry moved here: look at it next.
                self.remove_at(at);
            }
        }
    }

    /// How many entries the table holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Every key, in no particular order.
    #[cfg(test)]
    pub fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        self.entries.iter().map(|(key, _)| *key)
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, value)| value)
    }

    /// Every value, to change it, in no particular order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries.iter_mut().map(|(_, value)| value)
    }

    /// Doubles the slots: each key moves to the slot its one more top bit names.
    fn grow(&mut self) {
        self.slot_bits += 1;
        self.slots = vec![0; 1 << self.slot_bits];
        for at in 0..self.entries.len() {
            let slot = self.slot(self.entries[at].0);
            debug_assert_eq!(self.slots[slot], 0, "two keys in one slot");
            self.slots[slot] = at as u32 + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Inserts `key` if its slot is free, as a caller that drew it would.
    fn offer(table: &mut KeyedTable<u32>, model: &mut BTreeMap<u32, u32>, key: u32) {
        if table.takes(key) {
            assert!(table.insert(key, !key).is_ok());
            model.insert(key, !key);
        } else {
            assert!(table.insert(key, 0).is_err(), "a taken slot is refused");
        }
    }

    proptest! {
        /// Whatever is inserted, removed and retained, the table holds what a map would, every
        /// key finds its value, and a key not inserted finds nothing.
        #[test]
        fn the_table_agrees_with_a_map(
            key_bits in prop::sample::select(vec![24u32, 32]),
            ops in prop::collection::vec((0u8..4, any::<u32>()), 0..600),
        ) {
            let mask = ((1u64 << key_bits) - 1) as u32;
            let mut table = KeyedTable::new(key_bits);
            let mut model = BTreeMap::new();
            for (op, key) in ops {
                let key = key & mask;
                match op {
                    0 | 1 => offer(&mut table, &mut model, key),
                    2 => {
                        // Remove a key that is there, or one that is not.
                        let key = model.keys().nth(key as usize % (model.len() + 1)).copied()
                            .unwrap_or(key);
                        prop_assert_eq!(table.remove(key), model.remove(&key));
                    }
                    _ => {
                        table.retain(|k, _| k % 3 != key % 3);
                        model.retain(|k, _| k % 3 != key % 3);
                    }
                }
                prop_assert_eq!(table.len(), model.len());
            }
            for (&key, &value) in &model {
                prop_assert_eq!(table.get(key), Some(&value));
            }
            let mut keys: Vec<u32> = table.keys().collect();
            keys.sort_unstable();
            prop_assert_eq!(keys, model.keys().copied().collect::<Vec<_>>());
            prop_assert_eq!(table.get(mask), model.get(&mask));
        }
    }

    /// The table doubles as it fills, to its bound, and keys drawn at random keep finding free
    /// slots until it is about half full at its largest.
    #[test]
    fn the_table_grows_to_its_bound() {
        let mut table = KeyedTable::new(24);
        let mut state = 0x9e37_79b9_u32;
        let mut inserted = 0;
        for _ in 0..(1 << 19) {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let key = state & 0xff_ffff;
            if table.insert(key, ()).is_ok() {
                inserted += 1;
            }
        }
        assert_eq!(table.len(), inserted);
        assert_eq!(table.slot_bits, MAX_SLOT_BITS);
        assert!(inserted > 1 << 18, "{inserted}");
    }
}
