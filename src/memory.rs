//! Protection domains and memory regions, with the one check every memory access goes through.
//!
//! # Soundness: remote writes while the application reads
//!
//! A peer's RDMA WRITE or atomic may land in a region while the application reads it. If the
//! region were plain `[u8]`, that would be a data race, undefined behaviour in Rust's memory
//! model. So a region owns its storage as `AtomicU64` words, and every access, by the transport
//! or by the application through [`MemoryRegion`], is an atomic load or store:
//!
//! - whole words are copied with relaxed loads and stores;
//! - a write that covers part of a word merges its bytes with a compare-and-swap loop, so that two
//!   writers of neighbouring bytes never lose each other's update;
//! - the remote atomics (FETCH_ADD, CMP_SWAP) are `fetch_add` and `compare_exchange` on the word,
//!   so they are atomic against the application too (IBTA o9-38: atomicity against local access).
//!
//! Relaxed ordering is enough: RDMA gives no ordering between a remote write and local reads
//! except through a completion, and the completion path synchronises through the queues that
//! carry it. The price is a copy in and out instead of the application writing into the
//! registered memory in place; `benches/memory.rs` measures it. No `unsafe` is needed.
//!
//! # Keys
//!
//! A key is 32 bits: all of them random, drawn from a ChaCha20 stream seeded by the caller. One
//! valid rkey says nothing about any other (rxe keeps 24 bits of index and 8 random ones).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use crate::wire::{LKey, RKey};

const WORD: usize = 8;

/// Access rights of a memory region (the `ibv_access_flags` that matter on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u8);

impl Access {
    pub const NONE: Access = Access(0);
    /// The local side may write: receive buffers, READ responses, atomic results.
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    pub const REMOTE_READ: Access = Access(4);
    pub const REMOTE_ATOMIC: Access = Access(8);

    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, other: Access) -> Access {
        self.union(other)
    }
}

/// A protection domain: regions and queue pairs of one PD may be used together only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PdId(pub u32);

/// Why a memory access was refused. Each failure has its own variant, so the transport can
/// choose the right NAK or completion status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryError {
    /// No registered region has this key (never had one, or it was deregistered).
    UnknownKey { key: u32 },
    /// The key belongs to a region of another protection domain.
    WrongPd { key: u32 },
    /// The range leaves the region, or its end overflows 64 bits.
    OutOfBounds { addr: u64, len: u64 },
    /// The region does not grant the access asked for.
    AccessDenied { needed: Access },
    /// An atomic's address is not 8-byte aligned.
    Misaligned { addr: u64 },
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MemoryError::UnknownKey { key } => write!(f, "key {key:#010x}: no such region"),
            MemoryError::WrongPd { key } => {
                write!(
                    f,
                    "key {key:#010x}: the region belongs to another protection domain"
                )
            }
            MemoryError::OutOfBounds { addr, len } => {
                write!(f, "{len} bytes at {addr:#x} leave the region")
            }
            MemoryError::AccessDenied { needed } => {
                write!(f, "the region does not grant access {:#x}", needed.0)
            }
            MemoryError::Misaligned { addr } => {
                write!(f, "atomic at {addr:#x} is not 8-byte aligned")
            }
        }
    }
}

impl std::error::Error for MemoryError {}

/// Splits `len` bytes at `offset` into a head up to the first word boundary and whole words;
/// what is left is the tail. A range inside one word is all head.
fn split(offset: usize, len: usize) -> (usize, usize) {
    let head = ((WORD - offset % WORD) % WORD).min(len);
    (head, (len - head) / WORD * WORD)
}

/// The storage of a region: atomic words, so that concurrent access is never a data race.
struct Words {
    words: Box<[AtomicU64]>,
    len: usize,
}

impl Words {
    fn zeroed(len: usize) -> Self {
        let words = (0..len.div_ceil(WORD)).map(|_| AtomicU64::new(0)).collect();
        Words { words, len }
    }

    /// Copies `out.len()` bytes starting at `offset` out of the region.
    /// The caller has checked that the range lies inside the region.
    fn read(&self, offset: usize, out: &mut [u8]) {
        let (head, bulk) = split(offset, out.len());
        let (out_head, rest) = out.split_at_mut(head);
        let (out_bulk, out_tail) = rest.split_at_mut(bulk);
        self.read_partial(offset, out_head);
        // Whole words: relaxed loads are plain moves on x86-64 and aarch64.
        let first = (offset + head) / WORD;
        for (word, chunk) in self.words[first..]
            .iter()
            .zip(out_bulk.chunks_exact_mut(WORD))
        {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        self.read_partial(offset + head + bulk, out_tail);
    }

    /// Reads less than a word, within one word.
    fn read_partial(&self, at: usize, out: &mut [u8]) {
        if out.is_empty() {
            return;
        }
        let lane = at % WORD;
        let bytes = self.words[at / WORD].load(Ordering::Relaxed).to_ne_bytes();
        out.copy_from_slice(&bytes[lane..lane + out.len()]);
    }

    /// Copies `data` into the region at `offset`. The caller has checked the range.
    fn write(&self, offset: usize, data: &[u8]) {
        let (head, bulk) = split(offset, data.len());
        let (data_head, rest) = data.split_at(head);
        let (data_bulk, data_tail) = rest.split_at(bulk);
        self.write_partial(offset, data_head);
        let first = (offset + head) / WORD;
        for (word, chunk) in self.words[first..].iter().zip(data_bulk.chunks_exact(WORD)) {
            let mut bytes = [0u8; WORD];
            bytes.copy_from_slice(chunk);
            word.store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
        }
        self.write_partial(offset + head + bulk, data_tail);
    }

    /// Writes less than a word, within one word: merged with a compare-and-swap loop, so a
    /// neighbour's concurrent write to the same word survives.
    fn write_partial(&self, at: usize, part: &[u8]) {
        if part.is_empty() {
            return;
        }
        let lane = at % WORD;
        let _ = self.words[at / WORD].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            let mut bytes = old.to_ne_bytes();
            bytes[lane..lane + part.len()].copy_from_slice(part);
            Some(u64::from_ne_bytes(bytes))
        });
    }

    /// The word holding the 8-byte-aligned `offset`.
    fn word(&self, offset: usize) -> &AtomicU64 {
        &self.words[offset / WORD]
    }
}

/// A registered memory region, as the application holds it.
///
/// Cloning gives another handle to the same memory. The handle stays usable after
/// deregistration, but the keys no longer reach it.
#[derive(Clone)]
pub struct MemoryRegion {
    pd: PdId,
    iova: u64,
    access: Access,
    lkey: LKey,
    rkey: RKey,
    words: Arc<Words>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("pd", &self.pd)
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len())
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .finish()
    }
}

impl MemoryRegion {
    pub fn lkey(&self) -> LKey {
        self.lkey
    }

    pub fn rkey(&self) -> RKey {
        self.rkey
    }

    /// The address the region starts at, for peers and for scatter/gather lists.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    pub fn len(&self) -> usize {
        self.words.len
    }

    pub fn is_empty(&self) -> bool {
        self.words.len == 0
    }

    pub fn pd(&self) -> PdId {
        self.pd
    }

    pub fn access(&self) -> Access {
        self.access
    }

    fn range(&self, offset: usize, len: usize) -> Result<(), MemoryError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(MemoryError::OutOfBounds {
                addr: self.iova.wrapping_add(offset as u64),
                len: len as u64,
            }),
        }
    }

    /// Reads bytes at `offset` (from the region's start) into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryError> {
        self.range(offset, out.len())?;
        self.words.read(offset, out);
        Ok(())
    }

    /// Writes `data` at `offset` (from the region's start).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), MemoryError> {
        self.range(offset, data.len())?;
        self.words.write(offset, data);
        Ok(())
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len()];
        self.words.read(0, &mut out);
        out
    }
}

/// A checked window into a region: what the transport may touch for one packet.
#[derive(Clone)]
pub struct Span {
    words: Arc<Words>,
    offset: usize,
    len: usize,
}

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Span {{ offset: {}, len: {} }}", self.offset, self.len)
    }
}

impl Span {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `out.len()` bytes from `at` within the span. Panics past the span: the core
    /// sizes every copy from the checked length.
    pub fn read(&self, at: usize, out: &mut [u8]) {
        assert!(at + out.len() <= self.len, "read past a checked span");
        self.words.read(self.offset + at, out);
    }

    /// Copies `data` to `at` within the span.
    pub fn write(&self, at: usize, data: &[u8]) {
        assert!(at + data.len() <= self.len, "write past a checked span");
        self.words.write(self.offset + at, data);
    }

    /// The 64-bit word of an atomic span (8 bytes, 8-aligned), as the host holds it.
    fn atomic_word(&self) -> &AtomicU64 {
        assert!(
            self.len == WORD && self.offset % WORD == 0,
            "not an atomic span"
        );
        self.words.word(self.offset)
    }

    /// FETCH_ADD: adds `add` and returns the value before.
    pub fn fetch_add(&self, add: u64) -> u64 {
        self.atomic_word().fetch_add(add, Ordering::Relaxed)
    }

    /// CMP_SWAP: stores `swap` if the word equals `compare`; returns the value before.
    pub fn compare_swap(&self, compare: u64, swap: u64) -> u64 {
        match self.atomic_word().compare_exchange(
            compare,
            swap,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(old) | Err(old) => old,
        }
    }
}

struct Entry {
    region: MemoryRegion,
}

/// Every protection domain and registered region of one device.
pub struct MemoryTable {
    next_pd: u32,
    by_lkey: HashMap<u32, Entry>,
    rkey_to_lkey: HashMap<u32, u32>,
    rng: ChaCha20Rng,
}

impl fmt::Debug for MemoryTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTable")
            .field("regions", &self.by_lkey.len())
            .finish()
    }
}

impl MemoryTable {
    /// A table whose keys are drawn from a ChaCha20 stream seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        MemoryTable {
            next_pd: 1,
            by_lkey: HashMap::new(),
            rkey_to_lkey: HashMap::new(),
            rng: ChaCha20Rng::seed_from_u64(seed),
        }
    }

    pub fn alloc_pd(&mut self) -> PdId {
        let pd = PdId(self.next_pd);
        self.next_pd += 1;
        pd
    }

    /// A random key that no region uses, neither as lkey nor as rkey.
    fn fresh_key(&mut self) -> u32 {
        loop {
            let key = self.rng.next_u32();
            if key != 0 && !self.by_lkey.contains_key(&key) && !self.rkey_to_lkey.contains_key(&key)
            {
                return key;
            }
        }
    }

    /// Registers a zeroed region of `len` bytes at address `iova`, which must be 8-aligned so
    /// that atomics fall on whole words.
    pub fn register(
        &mut self,
        pd: PdId,
        iova: u64,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, MemoryError> {
        if iova % WORD as u64 != 0 {
            return Err(MemoryError::Misaligned { addr: iova });
        }
        if iova.checked_add(len as u64).is_none() {
            return Err(MemoryError::OutOfBounds {
                addr: iova,
                len: len as u64,
            });
        }
        self.release_dropped();
        let lkey = self.fresh_key();
        let rkey = self.fresh_key();
        let region = MemoryRegion {
            pd,
            iova,
            access,
            lkey: LKey(lkey),
            rkey: RKey(rkey),
            words: Arc::new(Words::zeroed(len)),
        };
        self.rkey_to_lkey.insert(rkey, lkey);
        self.by_lkey.insert(
            lkey,
            Entry {
                region: region.clone(),
            },
        );
        Ok(region)
    }

    /// Deregisters a region: both its keys stop working at once.
    pub fn deregister(&mut self, lkey: LKey) -> Result<(), MemoryError> {
        let entry = self
            .by_lkey
            .remove(&lkey.0)
            .ok_or(MemoryError::UnknownKey { key: lkey.0 })?;
        self.rkey_to_lkey.remove(&entry.region.rkey.0);
        Ok(())
    }

    /// How many regions are registered.
    pub fn regions(&self) -> usize {
        self.by_lkey.len()
    }

    /// Deregisters every region that nothing but this table holds any more: no application
    /// handle and no [`Span`] of a request in flight. A region is the application's to let go
    /// of by dropping its last handle; the owner of the table calls this when that is likely,
    /// and the region's keys stop working then.
    pub fn release_dropped(&mut self) {
        let rkey_to_lkey = &mut self.rkey_to_lkey;
        self.by_lkey.retain(|_, entry| {
            let held = Arc::strong_count(&entry.region.words) > 1;
            if !held {
                rkey_to_lkey.remove(&entry.region.rkey.0);
            }
            held
        });
    }

    /// Invalidates a region's rkey (SEND with invalidate): the region stays registered for
    /// local use, but the key no longer reaches it from the network.
    pub fn invalidate_rkey(&mut self, pd: PdId, rkey: RKey) -> Result<(), MemoryError> {
        let lkey = *self
            .rkey_to_lkey
            .get(&rkey.0)
            .ok_or(MemoryError::UnknownKey { key: rkey.0 })?;
        if self.by_lkey[&lkey].region.pd != pd {
            return Err(MemoryError::WrongPd { key: rkey.0 });
        }
        self.rkey_to_lkey.remove(&rkey.0);
        Ok(())
    }

    fn check(
        region: &MemoryRegion,
        key: u32,
        pd: PdId,
        addr: u64,
        len: usize,
        needed: Access,
    ) -> Result<Span, MemoryError> {
        if region.pd != pd {
            return Err(MemoryError::WrongPd { key });
        }
        let out_of_bounds = MemoryError::OutOfBounds {
            addr,
            len: len as u64,
        };
        let end = addr.checked_add(len as u64).ok_or(out_of_bounds)?;
        if addr < region.iova || end > region.iova + region.len() as u64 {
            return Err(out_of_bounds);
        }
        if !region.access.contains(needed) {
            return Err(MemoryError::AccessDenied { needed });
        }
        Ok(Span {
            words: region.words.clone(),
            offset: (addr - region.iova) as usize,
            len,
        })
    }

    /// The check behind every remote access: key, protection domain, bounds, then rights.
    pub fn check_remote(
        &self,
        rkey: RKey,
        pd: PdId,
        addr: u64,
        len: usize,
        needed: Access,
    ) -> Result<Span, MemoryError> {
        let lkey = self
            .rkey_to_lkey
            .get(&rkey.0)
            .ok_or(MemoryError::UnknownKey { key: rkey.0 })?;
        Self::check(&self.by_lkey[lkey].region, rkey.0, pd, addr, len, needed)
    }

    /// The same check for a local scatter/gather element.
    pub fn check_local(
        &self,
        lkey: LKey,
        pd: PdId,
        addr: u64,
        len: usize,
        needed: Access,
    ) -> Result<Span, MemoryError> {
        let entry = self
            .by_lkey
            .get(&lkey.0)
            .ok_or(MemoryError::UnknownKey { key: lkey.0 })?;
        Self::check(&entry.region, lkey.0, pd, addr, len, needed)
    }

    /// An atomic target: 8 bytes, 8-aligned, with remote atomic access.
    pub fn check_atomic(&self, rkey: RKey, pd: PdId, addr: u64) -> Result<Span, MemoryError> {
        if addr % WORD as u64 != 0 {
            return Err(MemoryError::Misaligned { addr });
        }
        self.check_remote(rkey, pd, addr, WORD, Access::REMOTE_ATOMIC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> (MemoryTable, PdId, MemoryRegion) {
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
        assert!(t
            .check_remote(rkey, pd, 0x1000, 64, Access::REMOTE_WRITE)
            .is_ok());
        assert_eq!(
            t.check_remote(RKey(rkey.0 ^ 1), pd, 0x1000, 1, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemoryError::UnknownKey { key: rkey.0 ^ 1 }
        );
        assert_eq!(
            t.check_remote(rkey, other, 0x1000, 1, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemoryError::WrongPd { key: rkey.0 }
        );
        assert_eq!(
            t.check_remote(rkey, pd, 0x1001, 64, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemoryError::OutOfBounds {
                addr: 0x1001,
                len: 64
            }
        );
        assert_eq!(
            t.check_remote(rkey, pd, 0xfff, 2, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemoryError::OutOfBounds {
                addr: 0xfff,
                len: 2
            }
        );
        // An address plus length that overflows 64 bits.
        assert!(matches!(
            t.check_remote(rkey, pd, u64::MAX - 2, 8, Access::REMOTE_WRITE),
            Err(MemoryError::OutOfBounds { .. })
        ));
        assert_eq!(
            t.check_remote(rkey, pd, 0x1000, 8, Access::REMOTE_READ)
                .unwrap_err(),
            MemoryError::AccessDenied {
                needed: Access::REMOTE_READ
            }
        );
        assert_eq!(
            t.check_atomic(rkey, pd, 0x1004).unwrap_err(),
            MemoryError::Misaligned { addr: 0x1004 }
        );
    }

    #[test]
    fn deregistration_invalidates_both_keys_at_once() {
        let (mut t, pd, mr) = table();
        let span = t
            .check_local(mr.lkey(), pd, 0x1000, 8, Access::LOCAL_WRITE)
            .unwrap();
        t.deregister(mr.lkey()).unwrap();
        assert!(matches!(
            t.check_remote(mr.rkey(), pd, 0x1000, 8, Access::REMOTE_WRITE),
            Err(MemoryError::UnknownKey { .. })
        ));
        assert!(matches!(
            t.check_local(mr.lkey(), pd, 0x1000, 8, Access::LOCAL_WRITE),
            Err(MemoryError::UnknownKey { .. })
        ));
        // A span checked before stays memory-safe: the words live as long as any handle.
        span.write(0, b"late");
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
            .check_remote(kept.rkey(), pd, 0x10_0000, 8, Access::REMOTE_WRITE)
            .unwrap();
        let (rkey, kept_rkey) = (mr.rkey(), kept.rkey());
        drop((mr, kept));
        t.release_dropped();
        // The first region had no handle left; the second is still reachable by its span, as
        // a READ in flight holds the span it was granted.
        assert_eq!(t.regions(), 1);
        assert!(matches!(
            t.check_remote(rkey, pd, 0x1000, 8, Access::REMOTE_WRITE),
            Err(MemoryError::UnknownKey { .. })
        ));
        drop(span);
        t.release_dropped();
        assert_eq!(t.regions(), 0);
        assert!(t
            .check_remote(kept_rkey, pd, 0x10_0000, 8, Access::REMOTE_WRITE)
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

    #[test]
    fn unaligned_reads_and_writes() {
        let (t, pd, mr) = table();
        mr.write(3, b"hello, region").unwrap();
        let mut out = [0u8; 13];
        mr.read(3, &mut out).unwrap();
        assert_eq!(&out, b"hello, region");
        let span = t
            .check_local(mr.lkey(), pd, 0x1000 + 5, 20, Access::LOCAL_WRITE)
            .unwrap();
        let mut got = [0u8; 4];
        span.read(0, &mut got);
        assert_eq!(&got, b"llo,");
        assert_eq!(
            mr.read(60, &mut [0u8; 5]),
            Err(MemoryError::OutOfBounds {
                addr: 0x1000 + 60,
                len: 5
            })
        );
    }

    #[test]
    fn every_small_offset_and_length_matches_a_plain_buffer() {
        // Head, whole words and tail: every split the copy loops make.
        let (_, _, mr) = table();
        let mut model = vec![0u8; 64];
        for offset in 0..24 {
            for len in 0..=(40 - offset % 8) {
                let data: Vec<u8> = (0..len)
                    .map(|i| (offset * 31 + len * 7 + i) as u8)
                    .collect();
                mr.write(offset, &data).unwrap();
                model[offset..offset + len].copy_from_slice(&data);
                assert_eq!(mr.to_vec(), model, "write {len} at {offset}");
                let mut out = vec![0u8; len];
                mr.read(offset, &mut out).unwrap();
                assert_eq!(out, data, "read {len} at {offset}");
            }
        }
    }

    #[test]
    fn atomics_act_on_the_word() {
        let mut t = MemoryTable::new(3);
        let pd = t.alloc_pd();
        let mr = t.register(pd, 0x2000, 16, Access::REMOTE_ATOMIC).unwrap();
        mr.write(8, &41u64.to_ne_bytes()).unwrap();
        let span = t.check_atomic(mr.rkey(), pd, 0x2008).unwrap();
        assert_eq!(span.fetch_add(1), 41);
        assert_eq!(span.compare_swap(42, 7), 42);
        assert_eq!(span.compare_swap(42, 9), 7);
        let mut word = [0u8; 8];
        mr.read(8, &mut word).unwrap();
        assert_eq!(u64::from_ne_bytes(word), 7);
    }

    #[test]
    fn concurrent_partial_writes_to_one_word_are_not_lost() {
        let (_, _, mr) = table();
        let writers: Vec<_> = (0..8)
            .map(|lane| {
                let mr = mr.clone();
                std::thread::spawn(move || {
                    for round in 0..200u8 {
                        mr.write(lane, &[round]).unwrap();
                    }
                })
            })
            .collect();
        let reader = {
            let mr = mr.clone();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let _ = mr.to_vec();
                }
            })
        };
        for w in writers {
            w.join().unwrap();
        }
        reader.join().unwrap();
        let mut word = [0u8; 8];
        mr.read(0, &mut word).unwrap();
        assert_eq!(word, [199; 8], "every lane keeps its last write");
    }
}
