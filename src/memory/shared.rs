//! [`DeviceMemory`]: a device's [`MemoryTable`] as the endpoint of one of its engines holds it.

use std::cell::{Ref, RefCell, RefMut};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::MemoryTable;

/// A device's memory table, as one endpoint holds it: its own when the device has one engine,
/// or shared by the endpoints of its engines, so that a region registered or a window bound
/// through one is found, by the same keys, by every other.
///
/// Shared behind a lock, not copied per engine: a type 2 window bound on one engine's QP may
/// be invalidated by a SEND with Invalidate arriving at another's, and a deregistration must
/// stop every engine's next packet before it returns. Checks take the read side, which engines
/// take at once; only the verbs that change the table (register, bind, invalidate) take the
/// write side. A table of one endpoint's own takes no lock: two atomic read-modify-writes per
/// check were measurable on small messages.
#[derive(Debug)]
pub struct DeviceMemory(Table);

// One per endpoint, so its size does not matter; boxing the own table would cost an indirection
// per check.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Table {
    Own(RefCell<MemoryTable>),
    Shared(Arc<RwLock<MemoryTable>>),
}

const POISONED: &str = "an engine panicked while it held the memory table";

/// The table, read ([`DeviceMemory::read`]).
#[derive(Debug)]
pub enum MemoryRead<'a> {
    /// An endpoint's own table.
    Own(Ref<'a, MemoryTable>),
    /// A table the device's engines share.
    Shared(RwLockReadGuard<'a, MemoryTable>),
}

/// The table, to change it ([`DeviceMemory::write`]).
#[derive(Debug)]
pub enum MemoryWrite<'a> {
    /// An endpoint's own table.
    Own(RefMut<'a, MemoryTable>),
    /// A table the device's engines share.
    Shared(RwLockWriteGuard<'a, MemoryTable>),
}

impl DeviceMemory {
    /// A table of one endpoint's own, whose keys are drawn from a ChaCha20 stream seeded with
    /// `seed`.
    pub fn own(seed: u64) -> Self {
        DeviceMemory(Table::Own(RefCell::new(MemoryTable::new(seed))))
    }

    /// One table for `count` endpoints (a device's engines), seeded with `seed`: the first
    /// endpoint's own if `count` is 1.
    pub fn shared_by(count: usize, seed: u64) -> Vec<Self> {
        if count == 1 {
            return vec![Self::own(seed)];
        }
        let table = Arc::new(RwLock::new(MemoryTable::new(seed)));
        let share = |_| DeviceMemory(Table::Shared(Arc::clone(&table)));
        (0..count).map(share).collect()
    }

    /// The table, to check an access or read what it holds.
    ///
    /// A caller holds one guard at a time, and only within a statement or a short block: a
    /// second `read` while holding one would wait behind another engine's waiting `write`,
    /// which waits for the first, for ever.
    ///
    /// # Panics
    ///
    /// If the table is being changed through [`write`](Self::write) (a bug, as above), or if
    /// another engine panicked while it held the table, which a change may have left half
    /// done: each engine that touches the table after that stops too (its turns catch the
    /// panic and report the device failed), rather than check keys against it.
    pub fn read(&self) -> MemoryRead<'_> {
        match &self.0 {
            Table::Own(table) => MemoryRead::Own(table.borrow()),
            Table::Shared(table) => MemoryRead::Shared(table.read().expect(POISONED)),
        }
    }

    /// The table, to change it. Panics as [`read`](Self::read) does, and if it is being read.
    pub fn write(&self) -> MemoryWrite<'_> {
        match &self.0 {
            Table::Own(table) => MemoryWrite::Own(table.borrow_mut()),
            Table::Shared(table) => MemoryWrite::Shared(table.write().expect(POISONED)),
        }
    }
}

impl Deref for MemoryRead<'_> {
    type Target = MemoryTable;

    fn deref(&self) -> &MemoryTable {
        match self {
            MemoryRead::Own(table) => table,
            MemoryRead::Shared(table) => table,
        }
    }
}

impl Deref for MemoryWrite<'_> {
    type Target = MemoryTable;

    fn deref(&self) -> &MemoryTable {
        match self {
            MemoryWrite::Own(table) => table,
            MemoryWrite::Shared(table) => table,
        }
    }
}

impl DerefMut for MemoryWrite<'_> {
    fn deref_mut(&mut self) -> &mut MemoryTable {
        match self {
            MemoryWrite::Own(table) => table,
            MemoryWrite::Shared(table) => table,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Access;

    /// What one endpoint registers, every endpoint of the device finds by the same keys; a
    /// device of one engine keeps a table of its own.
    #[test]
    fn a_region_registered_through_one_engine_is_found_through_every_other() {
        let tables = DeviceMemory::shared_by(3, 7);
        let pd = tables[0].write().alloc_pd();
        let region = (tables[1].write())
            .register(pd, 0x1000, 64, Access::REMOTE_WRITE)
            .unwrap();
        for table in &tables {
            let qp = (pd, crate::wire::Qpn::new(2));
            let table = table.read();
            let span = table.check_remote(region.rkey(), qp, 0x1000, 64, Access::REMOTE_WRITE);
            assert!(span.is_ok());
        }
        tables[2].write().deregister(region.lkey()).unwrap();
        assert_eq!(tables[0].read().regions(), 0);
        assert!(matches!(DeviceMemory::shared_by(1, 7)[0].0, Table::Own(_)));
    }
}
