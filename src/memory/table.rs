//! [`MemoryTable`]: every protection domain, region and window of one device, and the checks
//! behind every access.
//!
//! A remote key names either a region or a window ([`Target`]); a local key names a region.
//! The remote check runs in one order for both, so a peer learns from a NAK only what the
//! first failing rule says: the key, the protection domain (and for a type 2 window the QP),
//! the bounds, then the rights.

use std::fmt;

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use super::region::Words;
use super::window::Window;
use super::{Access, ForeignMemory, MemoryError, MemoryRegion, PdId, Span};
use crate::keyed::KeyedTable;
use crate::wire::{LKey, Qpn, RKey};

const WORD: u64 = 8;
/// Draws of a random key before the table counts as full.
const KEY_DRAWS: usize = 64;
/// The most slots each key table grows to: 2^22, 16 MiB of slot numbers at the most, reached
/// only past two million keys. A key still keeps 10 random bits below its slot's.
const MAX_KEY_SLOT_BITS: u32 = 22;

/// What a remote key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// The region with this lkey.
    Region(u32),
    /// The window in this slot of `windows`.
    Window(usize),
}

/// A registered region, and how many windows are bound over it: a region with windows bound
/// cannot be deregistered (rxe's `num_mw`), and the count answers that without a look at
/// every window.
#[derive(Debug)]
pub(super) struct Registered {
    pub(super) region: MemoryRegion,
    pub(super) windows: u32,
}

/// Every protection domain, registered region and memory window of one device.
pub struct MemoryTable {
    next_pd: u32,
    /// Regions by lkey, found by index ([`KeyedTable`]).
    pub(super) regions: KeyedTable<Registered>,
    /// What each remote key names, found by index.
    pub(super) rkeys: KeyedTable<Target>,
    /// Windows by slot; `None` where one was deallocated, its slot in `free_windows`.
    pub(super) windows: Vec<Option<Window>>,
    pub(super) free_windows: Vec<usize>,
    pub(super) rng: ChaCha20Rng,
}

impl fmt::Debug for MemoryTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTable")
            .field("regions", &self.regions.len())
            .field("windows", &self.windows().count())
            .finish()
    }
}

/// Checks `len` bytes at `addr` against the range `[start, start + size)`.
pub(super) fn within(addr: u64, len: usize, start: u64, size: u64) -> Result<(), MemoryError> {
    let out_of_bounds = MemoryError::OutOfBounds {
        addr,
        len: len as u64,
    };
    let end = addr.checked_add(len as u64).ok_or(out_of_bounds)?;
    if addr < start || end > start.saturating_add(size) {
        return Err(out_of_bounds);
    }
    Ok(())
}

/// Where a region may go: an iova on a word boundary (so that its atomics are aligned) and
/// an end that does not overflow.
fn check_placement(iova: u64, len: usize) -> Result<(), MemoryError> {
    if iova % WORD != 0 {
        return Err(MemoryError::Misaligned { addr: iova });
    }
    if iova.checked_add(len as u64).is_none() {
        return Err(MemoryError::OutOfBounds {
            addr: iova,
            len: len as u64,
        });
    }
    Ok(())
}

/// A random non-zero key that `free` takes; `OutOfKeys` when [`KEY_DRAWS`] draws find none.
/// lkeys and rkeys are drawn each in its own table, which grows when half its slots are taken:
/// a draw succeeds with at least one chance in two until a table reaches its 2^22 slots, and
/// 64 draws then begin to fail near 3.3 million regions (their lkeys), or as many regions and
/// windows together (their rkeys). (Keys once drawn free in both tables at once filled the
/// two tables' slots between them: at 31 regions of 64 slots, 62 were taken, and draws failed.)
fn draw(rng: &mut ChaCha20Rng, free: impl Fn(u32) -> bool) -> Result<u32, MemoryError> {
    for _ in 0..KEY_DRAWS {
        let key = rng.next_u32();
        if key != 0 && free(key) {
            return Ok(key);
        }
    }
    Err(MemoryError::OutOfKeys)
}

impl MemoryTable {
    /// A table whose keys are drawn from a ChaCha20 stream seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        MemoryTable {
            next_pd: 1,
            regions: KeyedTable::with_max_slot_bits(32, MAX_KEY_SLOT_BITS),
            rkeys: KeyedTable::with_max_slot_bits(32, MAX_KEY_SLOT_BITS),
            windows: Vec::new(),
            free_windows: Vec::new(),
            rng: ChaCha20Rng::seed_from_u64(seed),
        }
    }

    /// A new protection domain (`ibv_alloc_pd`); IDs count up from 1 and are never reused.
    pub fn alloc_pd(&mut self) -> PdId {
        let pd = PdId(self.next_pd);
        self.next_pd += 1;
        pd
    }

    /// A random local key whose slot is free among the regions' lkeys; `OutOfKeys` when 64
    /// draws find none.
    fn fresh_lkey(&mut self) -> Result<u32, MemoryError> {
        let regions = &self.regions;
        draw(&mut self.rng, |key| regions.takes(key))
    }

    /// A random remote key (a region's or a window's) whose slot is free among the rkeys;
    /// `OutOfKeys` when 64 draws find none. A window keeps its rkey's upper 24 bits across
    /// binds, and a slot is named by at most the top 20 bits, so no other rkey can share a
    /// window's upper 24 bits.
    pub(super) fn fresh_rkey(&mut self) -> Result<u32, MemoryError> {
        let rkeys = &self.rkeys;
        draw(&mut self.rng, |key| rkeys.takes(key))
    }

    /// Registers a zeroed region of `len` bytes at address `iova`, which must be 8-aligned so
    /// that atomics fall on whole words. A region the host cannot allocate is `NoMemory`.
    pub fn register(
        &mut self,
        pd: PdId,
        iova: u64,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, MemoryError> {
        check_placement(iova, len)?;
        let keys = self.fresh_keys()?;
        let region = MemoryRegion::new(pd, iova, access, keys, Words::zeroed(len)?);
        Ok(self.insert(region))
    }

    /// Registers the application's `buffer` as a region that peers address from `iova`, with
    /// no copy: the region is the buffer ([`MemoryRegion::into_buffer`] hands it back). A
    /// buffer that cannot be registered comes back with the reason.
    pub fn register_buffer(
        &mut self,
        pd: PdId,
        iova: u64,
        buffer: Vec<u8>,
        access: Access,
    ) -> Result<MemoryRegion, (Vec<u8>, MemoryError)> {
        if let Err(refused) = check_placement(iova, buffer.len()) {
            return Err((buffer, refused));
        }
        let keys = match self.fresh_keys() {
            Ok(keys) => keys,
            Err(refused) => return Err((buffer, refused)),
        };
        let words = Words::lent(buffer)?;
        let region = MemoryRegion::new(pd, iova, access, keys, words);
        Ok(self.insert(region))
    }

    /// Registers a program's `memory` in place as a region that peers address from `iova`
    /// (`ibv_reg_mr`, where `iova` is the memory's own address, or `ibv_reg_mr_iova2`), at any
    /// alignment: the region is that memory, and a peer's WRITE lands in it.
    pub fn register_foreign(
        &mut self,
        pd: PdId,
        iova: u64,
        memory: ForeignMemory,
        access: Access,
    ) -> Result<MemoryRegion, MemoryError> {
        let len = memory.len();
        if iova.checked_add(len as u64).is_none() {
            return Err(MemoryError::OutOfBounds {
                addr: iova,
                len: len as u64,
            });
        }
        let keys = self.fresh_keys()?;
        let region = MemoryRegion::new(pd, iova, access, keys, Words::foreign(memory));
        Ok(self.insert(region))
    }

    /// A new region's keys: the lkey free in `regions`, the rkey in `rkeys`. Only when a
    /// table has no key free are the regions no one holds any more released, and the draw
    /// made again: a look at every region, once in a long while, rather than one per
    /// registration (a million registrations cost as much each as the first).
    fn fresh_keys(&mut self) -> Result<(LKey, RKey), MemoryError> {
        let drawn = |t: &mut Self| Ok((LKey(t.fresh_lkey()?), RKey(t.fresh_rkey()?)));
        drawn(self).or_else(|_: MemoryError| {
            self.release_dropped();
            drawn(self)
        })
    }

    /// Makes a new region's keys reach it; both were drawn free.
    fn insert(&mut self, region: MemoryRegion) -> MemoryRegion {
        let (lkey, rkey) = (region.lkey().0, region.rkey().0);
        // Each was drawn with its slot free in its table, and nothing changed them since; a
        // key that reached nothing would be a broken invariant, which stops the device.
        let fresh = "a fresh key's slot is free";
        assert!(
            self.rkeys.insert(rkey, Target::Region(lkey)).is_ok(),
            "{fresh}"
        );
        let registered = Registered {
            region: region.clone(),
            windows: 0,
        };
        assert!(self.regions.insert(lkey, registered).is_ok(), "{fresh}");
        region
    }

    /// Deregisters a region: both its keys stop working at once. Refused while windows are
    /// bound over it, as rxe refuses (IBTA C10-11).
    pub fn deregister(&mut self, lkey: LKey) -> Result<(), MemoryError> {
        let registered = self
            .regions
            .get(lkey.0)
            .ok_or(MemoryError::UnknownKey { key: lkey.0 })?;
        if registered.windows > 0 {
            return Err(MemoryError::WindowsBound { lkey: lkey.0 });
        }
        self.forget(lkey);
        Ok(())
    }

    /// Counts a window bound over `region` (`bound`), or one no longer bound over it, in the
    /// region's entry, if it is still registered: a region released with a window bound, and
    /// one registered since under the same lkey, are not the same region.
    pub(super) fn count_window(&mut self, region: &MemoryRegion, bound: bool) {
        let entry = self.regions.get_mut(region.lkey().0);
        if let Some(entry) = entry.filter(|e| e.region.same_memory(region)) {
            entry.windows = if bound {
                entry.windows + 1
            } else {
                entry.windows.saturating_sub(1)
            };
        }
    }

    /// Deregisters the region registered as `lkey` if its rkey is `rkey`: the region whose
    /// last application handle went, and not one registered since under a key drawn again.
    /// Its own keys stop working at once, bound windows or not. A window bound over it holds
    /// the region in its binding, so it keeps serving what it was bound to (the application
    /// left it bound), and the memory goes once the last such window is unbound.
    pub fn release(&mut self, lkey: LKey, rkey: RKey) {
        if self.regions.get(lkey.0).map(|r| r.region.rkey()) == Some(rkey) {
            self.forget(lkey);
        }
    }

    /// Takes the region registered as `lkey`, and its rkey, out of the table.
    fn forget(&mut self, lkey: LKey) {
        if let Some(registered) = self.regions.remove(lkey.0) {
            self.rkeys.remove(registered.region.rkey().0);
        }
    }

    /// How many regions are registered.
    pub fn regions(&self) -> usize {
        self.regions.len()
    }

    /// Deregisters every region that nothing but this table holds any more: no application
    /// handle, no [`HeldSpan`](super::HeldSpan) of a packet queued and no window bound over
    /// it. A region is the application's to let go of by dropping its last handle; the owner
    /// of the table calls this when that is likely, and the region's keys stop working then.
    pub fn release_dropped(&mut self) {
        let rkeys = &mut self.rkeys;
        self.regions.retain(|_, registered| {
            let held = registered.region.holders() > 1;
            if !held {
                rkeys.remove(registered.region.rkey().0);
            }
            held
        });
    }

    /// A checked span of `region`.
    fn region_span(
        region: &MemoryRegion,
        key: u32,
        pd: PdId,
        addr: u64,
        len: usize,
        needed: Access,
    ) -> Result<Span<'_>, MemoryError> {
        if region.pd() != pd {
            return Err(MemoryError::WrongPd { key });
        }
        within(addr, len, region.iova(), region.len() as u64)?;
        if !region.access().contains(needed) {
            return Err(MemoryError::AccessDenied { needed });
        }
        Ok(region.span((addr - region.iova()) as usize, len))
    }

    /// The check behind every remote access by QP `qpn` of `pd`: key, protection domain (and
    /// for a type 2 window, QP), bounds, then rights. The key may name a region or a window.
    pub fn check_remote(
        &self,
        rkey: RKey,
        (pd, qpn): (PdId, Qpn),
        addr: u64,
        len: usize,
        needed: Access,
    ) -> Result<Span<'_>, MemoryError> {
        let unknown = MemoryError::UnknownKey { key: rkey.0 };
        match *self.rkeys.get(rkey.0).ok_or(unknown)? {
            Target::Region(lkey) => {
                let registered = self.regions.get(lkey).ok_or(unknown)?;
                Self::region_span(&registered.region, rkey.0, pd, addr, len, needed)
            }
            Target::Window(slot) => {
                let window = self.windows[slot].as_ref().ok_or(unknown)?;
                window.check(rkey, (pd, qpn), addr, len, needed)
            }
        }
    }

    /// The same check for a local scatter/gather element.
    pub fn check_local(
        &self,
        lkey: LKey,
        pd: PdId,
        addr: u64,
        len: usize,
        needed: Access,
    ) -> Result<Span<'_>, MemoryError> {
        let registered = self
            .regions
            .get(lkey.0)
            .ok_or(MemoryError::UnknownKey { key: lkey.0 })?;
        Self::region_span(&registered.region, lkey.0, pd, addr, len, needed)
    }

    /// An atomic target: 8 bytes, 8-aligned, with remote atomic access.
    pub fn check_atomic(
        &self,
        rkey: RKey,
        requester: (PdId, Qpn),
        addr: u64,
    ) -> Result<Span<'_>, MemoryError> {
        if addr % WORD != 0 {
            return Err(MemoryError::Misaligned { addr });
        }
        let span =
            self.check_remote(rkey, requester, addr, WORD as usize, Access::REMOTE_ATOMIC)?;
        // A program's memory registered at an iova of another alignment than its own address
        // has no word at `addr`.
        if !span.is_word() {
            return Err(MemoryError::Misaligned { addr });
        }
        Ok(span)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    const QP: Qpn = Qpn::new(0x20);

    /// A table with one region of 64 bytes at 0x1000, local and remote write.
    pub(in crate::memory) fn table() -> (MemoryTable, PdId, MemoryRegion) {
        let mut t = MemoryTable::new(7);
        let pd = t.alloc_pd();
        let mr = t
            .register(pd, 0x1000, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        (t, pd, mr)
    }

    #[test]
    fn each_failure_has_its_own_error() {
        let (mut t, pd, mr) = table();
        let other = t.alloc_pd();
        let rkey = mr.rkey();
        let me = (pd, QP);
        assert!(t
            .check_remote(rkey, me, 0x1000, 64, Access::REMOTE_WRITE)
            .is_ok());
        assert_eq!(
            t.check_remote(RKey(rkey.0 ^ 1), me, 0x1000, 1, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemoryError::UnknownKey { key: rkey.0 ^ 1 }
        );
        assert_eq!(
            t.check_remote(rkey, (other, QP), 0x1000, 1, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemoryError::WrongPd { key: rkey.0 }
        );
        assert_eq!(
            t.check_remote(rkey, me, 0x1001, 64, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemoryError::OutOfBounds {
                addr: 0x1001,
                len: 64
            }
        );
        assert_eq!(
            t.check_remote(rkey, me, 0xfff, 2, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemoryError::OutOfBounds {
                addr: 0xfff,
                len: 2
            }
        );
        // An address plus length that overflows 64 bits.
        assert!(matches!(
            t.check_remote(rkey, me, u64::MAX - 2, 8, Access::REMOTE_WRITE),
            Err(MemoryError::OutOfBounds { .. })
        ));
        assert_eq!(
            t.check_remote(rkey, me, 0x1000, 8, Access::REMOTE_READ)
                .unwrap_err(),
            MemoryError::AccessDenied {
                needed: Access::REMOTE_READ
            }
        );
        assert_eq!(
            t.check_atomic(rkey, me, 0x1004).unwrap_err(),
            MemoryError::Misaligned { addr: 0x1004 }
        );
    }

    #[test]
    fn deregistration_invalidates_both_keys_at_once() {
        let (mut t, pd, mr) = table();
        let span = t
            .check_local(mr.lkey(), pd, 0x1000, 8, Access::LOCAL_WRITE)
            .unwrap()
            .held();
        t.deregister(mr.lkey()).unwrap();
        assert!(matches!(
            t.check_remote(mr.rkey(), (pd, QP), 0x1000, 8, Access::REMOTE_WRITE),
            Err(MemoryError::UnknownKey { .. })
        ));
        assert!(matches!(
            t.check_local(mr.lkey(), pd, 0x1000, 8, Access::LOCAL_WRITE),
            Err(MemoryError::UnknownKey { .. })
        ));
        // A span held from before (a packet queued) stays memory-safe: the words live as long
        // as any handle.
        span.span().write(0, b"late").unwrap();
        assert_eq!(
            t.deregister(mr.lkey()),
            Err(MemoryError::UnknownKey { key: mr.lkey().0 })
        );
    }

    #[test]
    fn a_region_no_one_holds_is_released_and_one_in_use_is_not() {
        let (mut t, pd, mr) = table();
        let kept = t.register(pd, 0x10_0000, 64, Access::REMOTE_WRITE).unwrap();
        let span = t
            .check_remote(kept.rkey(), (pd, QP), 0x10_0000, 8, Access::REMOTE_WRITE)
            .unwrap()
            .held();
        let (rkey, kept_rkey) = (mr.rkey(), kept.rkey());
        drop((mr, kept));
        t.release_dropped();
        // The first region had no handle left; the second is still reachable by its span, as
        // a packet queued holds the span its payload is read from.
        assert_eq!(t.regions(), 1);
        assert!(matches!(
            t.check_remote(rkey, (pd, QP), 0x1000, 8, Access::REMOTE_WRITE),
            Err(MemoryError::UnknownKey { .. })
        ));
        drop(span);
        t.release_dropped();
        assert_eq!(t.regions(), 0);
        assert!(t
            .check_remote(kept_rkey, (pd, QP), 0x10_0000, 8, Access::REMOTE_WRITE)
            .is_err());
    }

    #[test]
    fn keys_are_random_and_distinct() {
        let mut t = MemoryTable::new(1);
        let pd = t.alloc_pd();
        let keys: Vec<u32> = (0..64)
            .map(|_| t.register(pd, 0, 8, Access::NONE).unwrap().rkey().0)
            .collect();
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len());
        // Neighbouring registrations do not give neighbouring keys: their high 24 bits differ.
        let sequential = keys.windows(2).filter(|w| w[0] >> 8 == w[1] >> 8).count();
        assert_eq!(sequential, 0);
    }

    /// A program's memory is the region, at every alignment: what the region writes is in
    /// the memory, nothing outside the range changes, and an atomic acts on the program's
    /// word at an 8-aligned address (and is refused where the iova's alignment differs).
    #[test]
    #[allow(unsafe_code)]
    fn a_programs_memory_is_the_region_at_any_alignment() {
        let (mut t, pd, _kept) = table();
        let mut buffer = vec![0xeeu8; 96];
        let all = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        for start in 8..16 {
            // Taken again each time: `fill` below borrows the buffer mutably.
            let base = buffer.as_mut_ptr();
            let len = 64;
            // SAFETY: the range lies inside `buffer`, which outlives the region (closed below),
            // and is read only through the region meanwhile.
            let memory = unsafe { ForeignMemory::new(base.add(start), len) }.unwrap();
            let addr = memory.addr() as u64;
            let region = t.register_foreign(pd, addr, memory, all).unwrap();
            let data: Vec<u8> = (0..len as u8).collect();
            region.write(0, &data).unwrap();
            assert_eq!(region.to_vec(), data);
            let span = t
                .check_remote(region.rkey(), (pd, QP), addr + 3, 50, Access::REMOTE_READ)
                .unwrap()
                .held();
            let mut out = [0; 50];
            span.span().read(0, &mut out).unwrap();
            assert_eq!(&out[..], &data[3..53]);
            let word = addr.next_multiple_of(8);
            let before = t
                .check_atomic(region.rkey(), (pd, QP), word)
                .unwrap()
                .fetch_add(1)
                .unwrap();
            let at = (word - addr) as usize;
            assert_eq!(before.to_ne_bytes()[..], data[at..at + 8]);
            // The same memory at an iova 4 bytes off its own alignment has no word there.
            let memory = unsafe { ForeignMemory::new(base.add(start), len) }.unwrap();
            let iova = 0x10_0000 + (addr + 4) % 8;
            let skewed = t.register_foreign(pd, iova, memory, all).unwrap();
            assert_eq!(
                t.check_atomic(skewed.rkey(), (pd, QP), 0x10_0008)
                    .map(|_| ())
                    .unwrap_err(),
                MemoryError::Misaligned { addr: 0x10_0008 }
            );
            t.deregister(region.lkey()).unwrap();
            t.deregister(skewed.lkey()).unwrap();
            skewed.try_close().unwrap();
            let region = region.try_close().expect_err("a held span still holds it");
            drop(span);
            region.try_close().unwrap();
            let untouched = |b: &u8| *b == 0xee;
            assert!(buffer[..start].iter().all(untouched), "{start}");
            assert!(buffer[start + len..].iter().all(untouched), "{start}");
            buffer.fill(0xee);
        }
    }

    /// `register(1 << 46)` aborted the process in `Words::zeroed` ("memory allocation of
    /// 70368744177664 bytes failed"); the host's refusal is now an error.
    #[test]
    #[cfg_attr(miri, ignore = "Miri's allocator is not the host's")]
    fn a_region_the_host_cannot_hold_is_an_error_not_an_abort() {
        let (mut t, pd, _kept) = table();
        for len in [1usize << 46, usize::MAX - 7] {
            assert_eq!(
                t.register(pd, 0, len, Access::LOCAL_WRITE).unwrap_err(),
                MemoryError::NoMemory { len: len as u64 },
                "{len}"
            );
        }
        assert_eq!(t.regions(), 1, "nothing was registered");
    }
}
