//! Memory windows (IBTA 10.6.7): a remote key for part of a region, with rights of its own,
//! bound and invalidated without registering anything.
//!
//! - A **type 1** window is valid from its allocation and is bound (and bound again, or unbound
//!   with a zero length) by the `ibv_bind_mw` verb, which libibverbs posts on a QP. It serves
//!   every QP of its protection domain, and cannot be invalidated (o10-37.2.26).
//! - A **type 2** window (rxe's type 2B) starts free and is bound by a bind work request on a
//!   QP, to which it then belongs: only that QP's peer reaches memory through it
//!   (rxe_mw.c `rxe_lookup_mw`). It is freed again by a local invalidate, or by the peer's SEND
//!   with Invalidate naming it, and must be free to be bound again (o10-37.2.30).
//!
//! The rules of a bind are rxe's `rxe_check_bind_mw`: the region must have been registered with
//! [`Access::MW_BIND`] (C10-73), a window that grants remote write or atomics needs a region
//! with local write (C10-74), and the range lies inside the region (C10-75). softroce also
//! requires the region, the window and the binding QP to share a protection domain, which rxe
//! checks only for the QP of a type 2 window. Zero-based windows are not supported.
//!
//! A region with windows bound over it cannot be deregistered (rxe: `num_mw`); a type 2 window
//! bound through a QP is freed when that QP is destroyed, since its number may be reused.

use super::table::{within, Target};
use super::{Access, MemoryError, MemoryRegion, MemoryTable, PdId, Span};
use crate::wire::{LKey, Qpn, RKey};

/// The two kinds of memory window (`IBV_MW_TYPE_1`, `IBV_MW_TYPE_2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Bound with `ibv_bind_mw`; serves every QP of its PD and cannot be invalidated.
    Type1,
    /// Bound by a bind work request; serves only that QP, freed by a local or remote invalidate.
    Type2,
}

/// A bind (`struct ibv_mw_bind_info` with the window and its new rkey).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindMw {
    /// The window, by its current rkey.
    pub window: RKey,
    /// The window's rkey once bound: its upper 24 bits the window's, the low 8 the caller's
    /// choice, as [`inc_rkey`] makes it.
    pub new_rkey: RKey,
    /// The region the window is bound over.
    pub region: LKey,
    /// The range, by the region's addresses. A zero length unbinds a type 1 window.
    pub addr: u64,
    /// The range's length, in bytes.
    pub len: u64,
    /// What peers may do through the window: remote read, write and atomic rights.
    pub access: Access,
}

/// `ibv_inc_rkey`: the next rkey of a window, its low 8 bits one more.
pub fn inc_rkey(rkey: RKey) -> RKey {
    RKey((rkey.0 & !0xff) | (rkey.0.wrapping_add(1) & 0xff))
}

/// What a bound window gives access to.
#[derive(Debug, Clone)]
struct Binding {
    region: MemoryRegion,
    addr: u64,
    len: u64,
    access: Access,
    /// Type 2: the QP the window was bound through, the only one it serves.
    qp: Option<Qpn>,
}

/// One memory window.
#[derive(Debug, Clone)]
pub(super) struct Window {
    pd: PdId,
    kind: MwType,
    pub(super) rkey: RKey,
    /// `None`: a type 2 window that is free, or a type 1 window bound to nothing.
    binding: Option<Binding>,
}

impl Window {
    /// The remote access check through this window, in the order a region's runs.
    pub(super) fn check(
        &self,
        rkey: RKey,
        (pd, qpn): (PdId, Qpn),
        addr: u64,
        len: usize,
        needed: Access,
    ) -> Result<Span<'_>, MemoryError> {
        let binding = self
            .binding
            .as_ref()
            .ok_or(MemoryError::UnknownKey { key: rkey.0 })?;
        if self.pd != pd {
            return Err(MemoryError::WrongPd { key: rkey.0 });
        }
        if binding.qp.is_some_and(|bound| bound != qpn) {
            return Err(MemoryError::WrongQp { key: rkey.0 });
        }
        within(addr, len, binding.addr, binding.len)?;
        if !binding.access.contains(needed) {
            return Err(MemoryError::AccessDenied { needed });
        }
        let region = &binding.region;
        Ok(region.span((addr - region.iova()) as usize, len))
    }
}

impl MemoryTable {
    pub(super) fn windows(&self) -> impl Iterator<Item = &Window> {
        self.windows.iter().flatten()
    }

    /// The slot of the window whose rkey is `rkey` now.
    fn window_slot(&self, rkey: RKey) -> Result<usize, MemoryError> {
        match self.rkeys.get(rkey.0) {
            Some(&Target::Window(slot)) => Ok(slot),
            _ => Err(MemoryError::UnknownKey { key: rkey.0 }),
        }
    }

    /// `ibv_alloc_mw`: a window of `pd`; type 1 valid and unbound, type 2 free. Its rkey's
    /// upper 24 bits are random and shared with no other key (a free key's slot is free, and
    /// the slot is named by at most its top 20 bits). `OutOfKeys` when no key is free.
    pub fn alloc_mw(&mut self, pd: PdId, kind: MwType) -> Result<RKey, MemoryError> {
        let rkey = RKey(self.fresh_rkey()?);
        let window = Window {
            pd,
            kind,
            rkey,
            binding: None,
        };
        let slot = match self.free_windows.pop() {
            Some(slot) => {
                self.windows[slot] = Some(window);
                slot
            }
            None => {
                self.windows.push(Some(window));
                self.windows.len() - 1
            }
        };
        let inserted = self.rkeys.insert(rkey.0, Target::Window(slot));
        assert!(inserted.is_ok(), "a fresh key's slot is free");
        Ok(rkey)
    }

    /// `ibv_dealloc_mw`: the window's rkey stops working at once, bound or not. The window is
    /// found by the upper 24 bits of `rkey`, which it keeps for life, so a handle that took
    /// the rkey of a bind that was then refused still deallocates its window.
    pub fn dealloc_mw(&mut self, rkey: RKey) -> Result<(), MemoryError> {
        // The rkey in its slot now: the window's latest, whose upper 24 bits are the same.
        let slot = match self.rkeys.get_in_slot(rkey.0) {
            Some((now, &Target::Window(slot))) if now >> 8 == rkey.0 >> 8 => slot,
            _ => return Err(MemoryError::UnknownKey { key: rkey.0 }),
        };
        let window = self.windows[slot].take().expect("rkeys name live windows");
        self.rkeys.remove(window.rkey.0);
        self.free_windows.push(slot);
        if let Some(old) = window.binding {
            self.count_window(&old.region, false);
        }
        Ok(())
    }

    /// Binds a window through QP `qpn` of `pd` (a bind work request, or `ibv_bind_mw`).
    pub fn bind_mw(&mut self, bind: &BindMw, (pd, qpn): (PdId, Qpn)) -> Result<(), MemoryError> {
        let slot = self.window_slot(bind.window)?;
        let window = self.windows[slot]
            .as_ref()
            .expect("rkeys name live windows");
        if window.pd != pd {
            return Err(MemoryError::WrongPd { key: bind.window.0 });
        }
        if window.kind == MwType::Type2 {
            if window.binding.is_some() {
                return Err(MemoryError::Bind(
                    "a type 2 window must be invalidated before it is bound again (o10-37.2.30)",
                ));
            }
            if bind.len == 0 {
                return Err(MemoryError::Bind(
                    "a type 2 window is bound over a region and a length (o10-37.2.40)",
                ));
            }
        }
        if bind.new_rkey.0 >> 8 != bind.window.0 >> 8 {
            return Err(MemoryError::Bind(
                "the new rkey keeps the window's upper 24 bits (ibv_inc_rkey)",
            ));
        }
        let binding = if bind.len == 0 {
            None
        } else {
            let region = &self
                .regions
                .get(bind.region.0)
                .ok_or(MemoryError::UnknownKey { key: bind.region.0 })?
                .region;
            if region.pd() != window.pd {
                return Err(MemoryError::WrongPd { key: bind.region.0 });
            }
            if !region.access().contains(Access::MW_BIND) {
                return Err(MemoryError::Bind(
                    "the region was registered without MW_BIND (C10-73)",
                ));
            }
            let writes = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
            if bind.access.intersects(writes) && !region.access().contains(Access::LOCAL_WRITE) {
                return Err(MemoryError::Bind(
                    "a window with remote write or atomic rights needs a region with local \
                     write (C10-74)",
                ));
            }
            let len = usize::try_from(bind.len).map_err(|_| MemoryError::OutOfBounds {
                addr: bind.addr,
                len: bind.len,
            })?;
            within(bind.addr, len, region.iova(), region.len() as u64)?;
            Some(Binding {
                region: region.clone(),
                addr: bind.addr,
                len: bind.len,
                access: bind.access,
                qp: (window.kind == MwType::Type2).then_some(qpn),
            })
        };
        self.rkeys.remove(bind.window.0);
        // The new rkey keeps the old one's upper 24 bits, so its slot, just freed.
        let inserted = self.rkeys.insert(bind.new_rkey.0, Target::Window(slot));
        assert!(inserted.is_ok(), "a window's slot is its own");
        if let Some(new) = &binding {
            self.count_window(&new.region, true);
        }
        let window = self.windows[slot].as_mut().expect("checked above");
        window.rkey = bind.new_rkey;
        let old = std::mem::replace(&mut window.binding, binding);
        if let Some(old) = old {
            self.count_window(&old.region, false);
        }
        Ok(())
    }

    /// Invalidates a type 2 window (a local invalidate work request of QP `qpn`, or with
    /// `remote`, a SEND with Invalidate that QP received): it is free again, and its rkey
    /// reaches nothing. A region's rkey, a type 1 window, a free window, one of another PD,
    /// and (for a peer) one bound through another QP are refused: one peer cannot cut other
    /// QPs off their memory.
    pub fn invalidate(
        &mut self,
        rkey: RKey,
        (pd, qpn): (PdId, Qpn),
        remote: bool,
    ) -> Result<(), MemoryError> {
        let slot = match self.rkeys.get(rkey.0) {
            Some(&Target::Window(slot)) => slot,
            Some(Target::Region(_)) => return Err(MemoryError::NotInvalidatable { key: rkey.0 }),
            None => return Err(MemoryError::UnknownKey { key: rkey.0 }),
        };
        let window = self.windows[slot]
            .as_mut()
            .expect("rkeys name live windows");
        if window.kind == MwType::Type1 {
            return Err(MemoryError::NotInvalidatable { key: rkey.0 });
        }
        let Some(binding) = &window.binding else {
            return Err(MemoryError::UnknownKey { key: rkey.0 });
        };
        if window.pd != pd {
            return Err(MemoryError::WrongPd { key: rkey.0 });
        }
        if remote && binding.qp != Some(qpn) {
            return Err(MemoryError::WrongQp { key: rkey.0 });
        }
        if let Some(old) = window.binding.take() {
            self.count_window(&old.region, false);
        }
        Ok(())
    }

    /// Frees every type 2 window bound through `qpn`, which is being destroyed.
    pub fn release_qp_windows(&mut self, qpn: Qpn) {
        let mut freed = Vec::new();
        for window in self.windows.iter_mut().flatten() {
            if window.binding.as_ref().is_some_and(|b| b.qp == Some(qpn)) {
                freed.extend(window.binding.take());
            }
        }
        for old in freed {
            self.count_window(&old.region, false);
        }
    }

    /// How many windows are allocated.
    pub fn window_count(&self) -> usize {
        self.windows().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QP: Qpn = Qpn::new(0x20);
    const OTHER_QP: Qpn = Qpn::new(0x21);
    const BASE: u64 = 0x1000;

    fn setup(access: Access) -> (MemoryTable, PdId, MemoryRegion) {
        let mut t = MemoryTable::new(9);
        let pd = t.alloc_pd();
        let mr = t.register(pd, BASE, 4096, access).unwrap();
        (t, pd, mr)
    }

    fn bind(window: RKey, mr: &MemoryRegion, addr: u64, len: u64, access: Access) -> BindMw {
        BindMw {
            window,
            new_rkey: inc_rkey(window),
            region: mr.lkey(),
            addr,
            len,
            access,
        }
    }

    const BINDABLE: Access = Access::LOCAL_WRITE.union(Access::MW_BIND);

    /// A region whose last application handle went while a window was bound over it kept its
    /// own rkey working until the next registration after the window was unbound. Now its
    /// keys stop at once; the window, which the application left bound, serves its range
    /// until it is deallocated, and then nothing holds the memory.
    #[test]
    fn a_released_region_stops_at_once_and_its_bound_window_keeps_its_range() {
        let access = BINDABLE | Access::REMOTE_WRITE;
        let (mut t, pd, mr) = setup(access);
        let mw = t.alloc_mw(pd, MwType::Type1).unwrap();
        let b = bind(mw, &mr, BASE, 64, Access::REMOTE_WRITE);
        t.bind_mw(&b, (pd, QP)).unwrap();
        let (lkey, rkey) = (mr.lkey(), mr.rkey());
        let memory = mr.clone();
        drop(mr);
        t.release(lkey, rkey);
        assert_eq!(t.regions(), 0);
        assert!(matches!(
            t.check_remote(rkey, (pd, QP), BASE, 8, Access::REMOTE_WRITE),
            Err(MemoryError::UnknownKey { .. })
        ));
        assert!(t
            .check_local(lkey, pd, BASE, 8, Access::LOCAL_WRITE)
            .is_err());
        let span = t
            .check_remote(b.new_rkey, (pd, QP), BASE, 8, Access::REMOTE_WRITE)
            .unwrap();
        span.write(0, b"window").unwrap();
        assert_eq!(&memory.to_vec()[..6], b"window");
        // The window's binding and this test's clone hold the memory; then only the clone.
        assert_eq!(memory.holders(), 2);
        t.dealloc_mw(b.new_rkey).unwrap();
        assert_eq!(memory.holders(), 1);
    }

    #[test]
    fn a_type_2_window_serves_its_range_its_rights_and_its_qp_only() {
        let (mut t, pd, mr) = setup(BINDABLE);
        let mw = t.alloc_mw(pd, MwType::Type2).unwrap();
        assert!(matches!(
            t.check_remote(mw, (pd, QP), BASE, 8, Access::REMOTE_WRITE),
            Err(MemoryError::UnknownKey { .. })
        ));
        let b = bind(mw, &mr, BASE + 256, 512, Access::REMOTE_WRITE);
        t.bind_mw(&b, (pd, QP)).unwrap();
        let rkey = b.new_rkey;
        assert_ne!(rkey, mw);
        assert_eq!(rkey.0 >> 8, mw.0 >> 8);
        // The old rkey reaches nothing; the new one the range, for this QP, for writing.
        assert!(t
            .check_remote(mw, (pd, QP), BASE + 256, 8, Access::REMOTE_WRITE)
            .is_err());
        let span = t
            .check_remote(rkey, (pd, QP), BASE + 256, 512, Access::REMOTE_WRITE)
            .unwrap();
        span.write(0, b"window").unwrap();
        assert_eq!(&mr.to_vec()[256..262], b"window");
        assert_eq!(
            t.check_remote(rkey, (pd, OTHER_QP), BASE + 256, 8, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemoryError::WrongQp { key: rkey.0 }
        );
        assert!(matches!(
            t.check_remote(rkey, (pd, QP), BASE, 8, Access::REMOTE_WRITE),
            Err(MemoryError::OutOfBounds { .. })
        ));
        assert!(matches!(
            t.check_remote(rkey, (pd, QP), BASE + 256, 8, Access::REMOTE_READ),
            Err(MemoryError::AccessDenied { .. })
        ));
        // Bound windows keep the region registered.
        assert_eq!(
            t.deregister(mr.lkey()),
            Err(MemoryError::WindowsBound { lkey: mr.lkey().0 })
        );
        // A peer of another QP cannot invalidate it; the QP's own peer can, once.
        assert_eq!(
            t.invalidate(rkey, (pd, OTHER_QP), true),
            Err(MemoryError::WrongQp { key: rkey.0 })
        );
        t.invalidate(rkey, (pd, QP), true).unwrap();
        assert!(t
            .check_remote(rkey, (pd, QP), BASE + 256, 8, Access::REMOTE_WRITE)
            .is_err());
        assert!(t.invalidate(rkey, (pd, QP), true).is_err(), "already free");
        t.deregister(mr.lkey()).unwrap();
    }

    #[test]
    fn regions_and_type_1_windows_cannot_be_invalidated() {
        let (mut t, pd, mr) = setup(BINDABLE);
        assert_eq!(
            t.invalidate(mr.rkey(), (pd, QP), true),
            Err(MemoryError::NotInvalidatable { key: mr.rkey().0 })
        );
        let mw = t.alloc_mw(pd, MwType::Type1).unwrap();
        let b = bind(mw, &mr, BASE, 64, Access::REMOTE_READ);
        t.bind_mw(&b, (pd, QP)).unwrap();
        assert!(matches!(
            t.invalidate(b.new_rkey, (pd, QP), false),
            Err(MemoryError::NotInvalidatable { .. })
        ));
        // A type 1 window serves every QP of its PD, and binds again without invalidation.
        assert!(t
            .check_remote(b.new_rkey, (pd, OTHER_QP), BASE, 64, Access::REMOTE_READ)
            .is_ok());
        let again = bind(b.new_rkey, &mr, BASE + 64, 64, Access::REMOTE_READ);
        t.bind_mw(&again, (pd, QP)).unwrap();
        assert!(t
            .check_remote(again.new_rkey, (pd, QP), BASE + 64, 64, Access::REMOTE_READ)
            .is_ok());
        // A zero length unbinds it.
        let unbind = bind(again.new_rkey, &mr, 0, 0, Access::NONE);
        t.bind_mw(&unbind, (pd, QP)).unwrap();
        assert!(t
            .check_remote(unbind.new_rkey, (pd, QP), BASE + 64, 8, Access::REMOTE_READ)
            .is_err());
    }

    /// rxe_mw.c `rxe_check_bind_mw`, rule by rule.
    #[test]
    fn binds_that_break_a_rule_are_refused() {
        let (mut t, pd, mr) = setup(Access::LOCAL_WRITE);
        let other_pd = t.alloc_pd();
        let mw = t.alloc_mw(pd, MwType::Type2).unwrap();
        let write = Access::REMOTE_WRITE;
        let refused = |t: &mut MemoryTable, b: BindMw, who: (PdId, Qpn)| {
            let e = t.bind_mw(&b, who).unwrap_err();
            assert!(t.check_remote(b.new_rkey, who, b.addr, 1, write).is_err());
            e
        };
        assert!(matches!(
            refused(&mut t, bind(mw, &mr, BASE, 64, write), (pd, QP)),
            MemoryError::Bind(why) if why.contains("C10-73")
        ));
        let bindable = t.register(pd, 0x10_0000, 4096, Access::MW_BIND).unwrap();
        assert!(matches!(
            refused(&mut t, bind(mw, &bindable, 0x10_0000, 64, write), (pd, QP)),
            MemoryError::Bind(why) if why.contains("C10-74")
        ));
        let (_, _, good) = (0, 0, t.register(pd, 0x20_0000, 4096, BINDABLE).unwrap());
        assert!(matches!(
            refused(
                &mut t,
                bind(mw, &good, 0x20_0000 + 4000, 200, write),
                (pd, QP)
            ),
            MemoryError::OutOfBounds { .. }
        ));
        assert!(matches!(
            refused(&mut t, bind(mw, &good, 0x20_0000, 0, write), (pd, QP)),
            MemoryError::Bind(why) if why.contains("o10-37.2.40")
        ));
        assert!(matches!(
            refused(
                &mut t,
                bind(mw, &good, 0x20_0000, 64, write),
                (other_pd, QP)
            ),
            MemoryError::WrongPd { .. }
        ));
        let mut wrong_key = bind(mw, &good, 0x20_0000, 64, write);
        wrong_key.new_rkey = RKey(mw.0 ^ 0x100);
        assert!(matches!(
            refused(&mut t, wrong_key, (pd, QP)),
            MemoryError::Bind(why) if why.contains("upper 24 bits")
        ));
        // Bound, it cannot be bound again until invalidated.
        let b = bind(mw, &good, 0x20_0000, 64, write);
        t.bind_mw(&b, (pd, QP)).unwrap();
        let again = bind(b.new_rkey, &good, 0x20_0000, 64, write);
        assert!(matches!(
            t.bind_mw(&again, (pd, QP)),
            Err(MemoryError::Bind(why)) if why.contains("o10-37.2.30")
        ));
        t.invalidate(b.new_rkey, (pd, QP), false).unwrap();
        t.bind_mw(&again, (pd, QP)).unwrap();
    }

    #[test]
    fn a_destroyed_qps_windows_are_freed_and_a_deallocated_window_is_gone() {
        let (mut t, pd, mr) = setup(BINDABLE);
        let mw = t.alloc_mw(pd, MwType::Type2).unwrap();
        let b = bind(mw, &mr, BASE, 64, Access::REMOTE_READ);
        t.bind_mw(&b, (pd, QP)).unwrap();
        t.release_qp_windows(QP);
        assert!(t
            .check_remote(b.new_rkey, (pd, QP), BASE, 8, Access::REMOTE_READ)
            .is_err());
        assert_eq!(t.window_count(), 1);
        // By its upper 24 bits: a handle may hold the rkey of a later, refused bind.
        t.dealloc_mw(inc_rkey(b.new_rkey)).unwrap();
        assert_eq!(t.window_count(), 0);
        assert!(t.dealloc_mw(b.new_rkey).is_err());
        // The region is free of windows and goes.
        t.deregister(mr.lkey()).unwrap();
    }

    #[test]
    fn window_rkeys_share_no_prefix_with_other_keys() {
        let (mut t, pd, _) = setup(BINDABLE);
        let mut prefixes = std::collections::HashSet::new();
        // Miri interprets every key search: a few rounds there, many natively.
        let rounds = if cfg!(miri) { 8 } else { 200 };
        for _ in 0..rounds {
            let mw = t.alloc_mw(pd, MwType::Type1).unwrap();
            assert!(prefixes.insert(mw.0 >> 8));
            let mr = t.register(pd, 0, 8, Access::NONE).unwrap();
            assert!(!prefixes.contains(&(mr.rkey().0 >> 8)));
        }
    }
}
