//! A region's storage, and the handles onto it: [`MemoryRegion`] for the application, and for
//! the transport [`Span`] (borrowed from the memory table while it is held) and [`HeldSpan`]
//! (a queued packet's payload, which holds its memory).
//!
//! # Soundness: remote writes while the application reads
//!
//! A peer's RDMA WRITE or atomic may land in a region while the application reads it. If the
//! region were plain `[u8]`, that would be a data race, undefined behaviour in Rust's memory
//! model. So a region owns its storage as `AtomicU64` words, and every access, by the transport
//! or by the application through [`MemoryRegion`], is an atomic load or store:
//!
//! - whole words are copied with relaxed loads and stores, or, on x86-64 with AVX, with aligned
//!   16-byte moves that are atomic per word too (`bulk.rs`);
//! - a write that covers part of a word merges its bytes with a compare-and-swap loop, so that two
//!   writers of neighbouring bytes never lose each other's update;
//! - the remote atomics (FETCH_ADD, CMP_SWAP) are `fetch_add` and `compare_exchange` on the word,
//!   so they are atomic against the application too (IBTA o9-38: atomicity against local access).
//!
//! Relaxed ordering is enough: RDMA gives no ordering between a remote write and local reads
//! except through a completion, and the completion path synchronises through the queues that
//! carry it. The price is a copy in and out instead of the application writing into the
//! registered memory in place; `benches/memory.rs` measures it. A region softroce allocates
//! needs no `unsafe`; one over the application's own buffer views its bytes as the same
//! atomic words, which `lent.rs` does. One over a C program's memory at its own address is not
//! words of softroce's: `foreign.rs` reaches it with single aligned 8-byte and 1-byte accesses
//! that a fault cannot kill (the program may unmap it), so its accesses can fail
//! ([`MemoryError::Unmapped`]). `lent.rs`, `foreign.rs` and `bulk.rs` hold the crate's only
//! `unsafe` code.
//!
//! The storage is allocated with `try_reserve_exact`: a region the host cannot hold is a
//! [`MemoryError::NoMemory`], never an abort of the process.

use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::bulk;
use super::foreign::ForeignMemory;
use super::lent::Lent;
use super::{Access, MemoryError, PdId};
use crate::wire::{LKey, RKey};

const WORD: usize = 8;

/// Splits `len` bytes at `offset` into a head up to the first word boundary and whole words;
/// what is left is the tail. A range inside one word is all head.
fn split(offset: usize, len: usize) -> (usize, usize) {
    let head = ((WORD - offset % WORD) % WORD).min(len);
    (head, (len - head) / WORD * WORD)
}

/// Where a region's words live.
enum Storage {
    /// Allocated by softroce, zeroed (`ProtectionDomain::register`).
    Own(Box<[AtomicU64]>),
    /// The application's buffer, handed over (`ProtectionDomain::register_buffer`).
    Lent(Lent),
}

impl Deref for Storage {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        match self {
            Storage::Own(words) => words,
            Storage::Lent(lent) => lent.words(),
        }
    }
}

/// Where a region's bytes live: words of softroce's (allocated or lent), whose first word is
/// the region's first, or a program's memory at its own address.
enum Bytes {
    Words(Storage),
    Foreign(ForeignMemory),
}

/// The storage of a region: atomic words, or a program's memory reached by `foreign.rs`'s
/// single accesses, so that concurrent access is never a data race.
pub(super) struct Words {
    bytes: Bytes,
    len: usize,
}

impl Words {
    /// The application's `buffer`, as it is: its length is the region's.
    pub(super) fn lent(buffer: Vec<u8>) -> Result<Self, (Vec<u8>, MemoryError)> {
        let lent = Lent::new(buffer)?;
        Ok(Words {
            len: lent.len(),
            bytes: Bytes::Words(Storage::Lent(lent)),
        })
    }

    /// A program's memory, in place.
    pub(super) fn foreign(memory: ForeignMemory) -> Self {
        Words {
            len: memory.len(),
            bytes: Bytes::Foreign(memory),
        }
    }

    /// Where the region's byte 0 falls in its first word: 0 but in a program's memory.
    pub(super) fn skew(&self) -> usize {
        match &self.bytes {
            Bytes::Words(_) => 0,
            Bytes::Foreign(memory) => memory.addr() % WORD,
        }
    }

    /// `len` zero bytes, or `NoMemory` if the host cannot allocate them.
    pub(super) fn zeroed(len: usize) -> Result<Self, MemoryError> {
        let count = len.div_ceil(WORD);
        let mut words = Vec::new();
        words
            .try_reserve_exact(count)
            .map_err(|_| MemoryError::NoMemory { len: len as u64 })?;
        words.resize_with(count, || AtomicU64::new(0));
        Ok(Words {
            bytes: Bytes::Words(Storage::Own(words.into_boxed_slice())),
            len,
        })
    }

    /// Copies `out.len()` bytes starting at `offset` out of the region; `Unmapped` if the
    /// program took its memory away. The caller has checked that the range lies inside the
    /// region.
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryError> {
        let words = match &self.bytes {
            Bytes::Words(words) => words,
            Bytes::Foreign(memory) => return memory.read(offset, out),
        };
        let (head, bulk) = split(offset, out.len());
        let (out_head, rest) = out.split_at_mut(head);
        let (out_bulk, out_tail) = rest.split_at_mut(bulk);
        read_partial(words, offset, out_head);
        let first = (offset + head) / WORD;
        bulk::load(&words[first..first + bulk / WORD], out_bulk);
        read_partial(words, offset + head + bulk, out_tail);
        Ok(())
    }

    /// Copies `data` into the region at `offset`; `Unmapped` if the program took its memory
    /// away. The caller has checked the range.
    fn write(&self, offset: usize, data: &[u8]) -> Result<(), MemoryError> {
        let words = match &self.bytes {
            Bytes::Words(words) => words,
            Bytes::Foreign(memory) => return memory.write(offset, data),
        };
        let (head, bulk) = split(offset, data.len());
        let (data_head, rest) = data.split_at(head);
        let (data_bulk, data_tail) = rest.split_at(bulk);
        write_partial(words, offset, data_head);
        let first = (offset + head) / WORD;
        bulk::store(&words[first..first + bulk / WORD], data_bulk);
        write_partial(words, offset + head + bulk, data_tail);
        Ok(())
    }

    /// FETCH_ADD on the word at `offset`, which is a word boundary of the memory (a multiple
    /// of 8 from the region's start, or in a program's memory an 8-aligned address): the value
    /// before.
    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        match &self.bytes {
            Bytes::Words(words) => Ok(word(words, offset).fetch_add(add, Ordering::Relaxed)),
            Bytes::Foreign(memory) => memory.fetch_add(offset, add),
        }
    }

    /// CMP_SWAP on the word at `offset`, as [`fetch_add`](Self::fetch_add): the value before.
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        match &self.bytes {
            Bytes::Words(words) => {
                let word = word(words, offset);
                Ok(
                    match word.compare_exchange(compare, swap, Ordering::Relaxed, Ordering::Relaxed)
                    {
                        Ok(old) | Err(old) => old,
                    },
                )
            }
            Bytes::Foreign(memory) => memory.compare_swap(offset, compare, swap),
        }
    }
}

/// Reads less than a word of `words`, within one word, at byte `at`.
fn read_partial(words: &[AtomicU64], at: usize, out: &mut [u8]) {
    if out.is_empty() {
        return;
    }
    let lane = at % WORD;
    let bytes = words[at / WORD].load(Ordering::Relaxed).to_ne_bytes();
    out.copy_from_slice(&bytes[lane..lane + out.len()]);
}

/// Writes less than a word of `words`, within one word, at byte `at`: merged with a
/// compare-and-swap loop, so a neighbour's concurrent write to the same word survives.
fn write_partial(words: &[AtomicU64], at: usize, part: &[u8]) {
    if part.is_empty() {
        return;
    }
    let lane = at % WORD;
    let _ = words[at / WORD].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        let mut bytes = old.to_ne_bytes();
        bytes[lane..lane + part.len()].copy_from_slice(part);
        Some(u64::from_ne_bytes(bytes))
    });
}

/// The word of `words` at byte `offset`, a multiple of 8.
fn word(words: &[AtomicU64], offset: usize) -> &AtomicU64 {
    assert_eq!(offset % WORD, 0, "not a word boundary");
    &words[offset / WORD]
}

/// A scatter/gather element: `len` bytes at `addr` in the region `lkey` names. Made checked
/// by [`MemoryRegion::sge`]; a work request's lists hold them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// The first byte, in the region's address space (from its `iova`).
    pub addr: u64,
    /// How many bytes.
    pub len: u32,
    /// The local key of the region the bytes are in.
    pub lkey: LKey,
}

/// A peer's memory as this side addresses it: where it starts, how long it is, and its rkey.
/// The type to exchange out of band for RDMA READ, WRITE and atomics
/// ([`MemoryRegion::remote`] on the peer's side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RemoteRegion {
    /// The first byte's address in the peer's space (its region's `iova`).
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The key the peer's responder checks.
    pub rkey: RKey,
}

impl RemoteRegion {
    /// The part of the region from `offset` on; `None` if `offset` is past its end.
    pub fn at(&self, offset: u64) -> Option<RemoteRegion> {
        Some(RemoteRegion {
            addr: self.addr.checked_add(offset)?,
            len: self.len.checked_sub(offset)?,
            rkey: self.rkey,
        })
    }
}

/// What runs when the last of the application's handles to a region goes (the device's own
/// copy and the transport's spans do not count): the verbs deregister the region then.
struct LastHandle(Box<dyn Fn() + Send + Sync>);

impl Drop for LastHandle {
    fn drop(&mut self) {
        (self.0)()
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
    /// Shared by the application's handles only ([`on_last_drop`](Self::on_last_drop)).
    last_handle: Option<Arc<LastHandle>>,
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
    /// A region over `words`, with these keys.
    pub(super) fn new(
        pd: PdId,
        iova: u64,
        access: Access,
        (lkey, rkey): (LKey, RKey),
        words: Words,
    ) -> Self {
        MemoryRegion {
            pd,
            iova,
            access,
            lkey,
            rkey,
            words: Arc::new(words),
            last_handle: None,
        }
    }

    /// This handle, and the clones made of it from now on, run `then` when the last of them
    /// goes. The copies made before (the device's own) do not count.
    pub(crate) fn on_last_drop(mut self, then: impl Fn() + Send + Sync + 'static) -> Self {
        self.last_handle = Some(Arc::new(LastHandle(Box::new(then))));
        self
    }

    /// The region's memory as a `Vec`, once this is its last handle: for a buffer registered
    /// with `register_buffer`, the same allocation, at its length, holding what was last
    /// written; for a region softroce allocated, or a program's memory, a copy (zeros from
    /// the first byte of a program's memory it took away, [`MemoryError::Unmapped`]). While another
    /// handle, the device's registration or a packet queued and not yet built ([`HeldSpan`])
    /// still holds the memory, the handle comes back: deregister first, and let transfers
    /// complete.
    pub fn into_buffer(self) -> Result<Vec<u8>, MemoryRegion> {
        match Arc::try_unwrap(self.words) {
            Ok(Words {
                bytes: Bytes::Words(Storage::Lent(lent)),
                ..
            }) => Ok(lent.into_vec()),
            Ok(own) => {
                let mut copy = vec![0; own.len];
                let _ = own.read(0, &mut copy);
                Ok(copy)
            }
            Err(words) => Err(MemoryRegion { words, ..self }),
        }
    }

    /// Lets go of the region's memory, once this is its last handle: after a region over a
    /// program's memory ([`super::ForeignMemory`]) is deregistered and this
    /// succeeds, softroce touches that memory no more, and the program may free it. While the
    /// device's registration or a packet queued and not yet built ([`HeldSpan`]) still holds
    /// it, the handle comes back.
    pub fn try_close(self) -> Result<(), MemoryRegion> {
        match Arc::try_unwrap(self.words) {
            Ok(_) => Ok(()),
            Err(words) => Err(MemoryRegion { words, ..self }),
        }
    }

    /// The span of `len` bytes at `offset` from the region's start, which the caller checked.
    pub(super) fn span(&self, offset: usize, len: usize) -> Span<'_> {
        debug_assert!(offset + len <= self.len());
        Span {
            words: &self.words,
            offset,
            len,
        }
    }

    /// Whether `other` is a handle to the same region's memory (not one registered since
    /// under the same keys).
    pub(super) fn same_memory(&self, other: &MemoryRegion) -> bool {
        Arc::ptr_eq(&self.words, &other.words)
    }

    /// How many handles and held spans hold the memory, this one included.
    pub(super) fn holders(&self) -> usize {
        Arc::strong_count(&self.words)
    }

    /// The local key: names the region in this side's scatter/gather lists.
    pub fn lkey(&self) -> LKey {
        self.lkey
    }

    /// The remote key: what a peer's READ, WRITE or atomic names the region by.
    pub fn rkey(&self) -> RKey {
        self.rkey
    }

    /// The address the region starts at, for peers and for scatter/gather lists.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// The region's length in bytes.
    pub fn len(&self) -> usize {
        self.words.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.words.len == 0
    }

    /// The protection domain the region belongs to.
    pub fn pd(&self) -> PdId {
        self.pd
    }

    /// What the region allows, locally and to peers.
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

    /// A scatter/gather element for `len` bytes at `offset` into the region, checked here: a
    /// range that leaves the region, or is longer than an SGE holds (2^32 - 1 bytes), is
    /// refused at the call rather than failing the work request later. Not checked here: the
    /// QP it is posted on. A region of another protection domain than the QP's makes the
    /// request complete with LOC_PROT_ERR (the key is checked against the QP's PD when the
    /// request runs, IBTA 10.6.3), not an error at the post.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge, MemoryError> {
        self.range(offset, len)?;
        let len = u32::try_from(len).map_err(|_| MemoryError::OutOfBounds {
            addr: self.iova.wrapping_add(offset as u64),
            len: len as u64,
        })?;
        Ok(Sge {
            addr: self.iova + offset as u64,
            len,
            lkey: self.lkey,
        })
    }

    /// The whole region, as a peer addresses it: hand this to the peer out of band (it
    /// serialises with the `serde` feature). It reaches the memory only if the region grants
    /// the remote access the peer's request needs.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.iova,
            len: self.len() as u64,
            rkey: self.rkey,
        }
    }

    /// Reads bytes at `offset` (from the region's start) into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryError> {
        self.range(offset, out.len())?;
        self.words.read(offset, out)
    }

    /// Writes `data` at `offset` (from the region's start).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), MemoryError> {
        self.range(offset, data.len())?;
        self.words.write(offset, data)
    }

    /// A copy of the whole region (zeros from the first byte of a program's memory it took
    /// away, [`MemoryError::Unmapped`]).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len()];
        let _ = self.words.read(0, &mut out);
        out
    }
}

/// A checked window into a region, borrowed from the memory table: what the transport may touch
/// for one packet, while it holds the table. The checks hand this out, so that a packet's
/// bytes land (or are read) under the table's guard, where no deregistration or invalidation
/// can come between the check and the access, and so that no count of the region's holders
/// moves per packet (an atomic add and subtract on a line the application's threads read).
#[derive(Clone, Copy)]
pub struct Span<'a> {
    words: &'a Arc<Words>,
    offset: usize,
    len: usize,
}

/// A checked window into a region that holds its memory: the payload of a packet queued
/// before it is built ([`Span::held`]). The memory outlives a deregistration until the
/// packet is built or dropped; the table counts it as a holder (`release_dropped`).
#[derive(Clone)]
pub struct HeldSpan {
    words: Arc<Words>,
    offset: usize,
    len: usize,
}

impl fmt::Debug for Span<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Span {{ offset: {}, len: {} }}", self.offset, self.len)
    }
}

impl fmt::Debug for HeldSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.span().fmt(f)
    }
}

impl<'a> Span<'a> {
    /// The span's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the span has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The same window, holding its memory, for a packet built later.
    pub fn held(&self) -> HeldSpan {
        HeldSpan {
            words: Arc::clone(self.words),
            offset: self.offset,
            len: self.len,
        }
    }

    /// The part of the span `len` bytes long at `at`, if it lies inside.
    pub fn slice(&self, at: usize, len: usize) -> Option<Span<'a>> {
        if at.checked_add(len)? > self.len {
            return None;
        }
        Some(Span {
            words: self.words,
            offset: self.offset + at,
            len,
        })
    }

    /// Copies `out.len()` bytes from `at` within the span; [`MemoryError::Unmapped`] if the
    /// program took the memory away (a region over a program's memory). Panics past the span:
    /// the core sizes every copy from the checked length.
    pub fn read(&self, at: usize, out: &mut [u8]) -> Result<(), MemoryError> {
        assert!(at + out.len() <= self.len, "read past a checked span");
        self.words.read(self.offset + at, out)
    }

    /// Copies `data` to `at` within the span, as [`read`](Self::read).
    pub fn write(&self, at: usize, data: &[u8]) -> Result<(), MemoryError> {
        assert!(at + data.len() <= self.len, "write past a checked span");
        self.words.write(self.offset + at, data)
    }

    /// The offset of an atomic span's word (8 bytes, 8-aligned).
    fn atomic_word(&self) -> usize {
        assert!(self.is_word(), "not an atomic span");
        self.offset
    }

    /// Whether the span is one whole word of the memory, which an atomic may act on: 8 bytes
    /// from a word boundary (`MemoryTable::check_atomic` asks).
    pub(super) fn is_word(&self) -> bool {
        self.len == WORD && (self.offset + self.words.skew()) % WORD == 0
    }

    /// FETCH_ADD: adds `add` and returns the value before; [`MemoryError::Unmapped`] as for
    /// [`read`](Self::read).
    pub fn fetch_add(&self, add: u64) -> Result<u64, MemoryError> {
        self.words.fetch_add(self.atomic_word(), add)
    }

    /// CMP_SWAP: stores `swap` if the word equals `compare`; returns the value before, or
    /// [`MemoryError::Unmapped`] as for [`read`](Self::read).
    pub fn compare_swap(&self, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        self.words.compare_swap(self.atomic_word(), compare, swap)
    }
}

impl HeldSpan {
    /// The window, to read or write.
    pub fn span(&self) -> Span<'_> {
        Span {
            words: &self.words,
            offset: self.offset,
            len: self.len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::tests::table;
    use super::super::MemoryTable;
    use super::*;
    use crate::wire::Qpn;

    /// A buffer of `len` bytes, `byte(i)` each, whose allocation is aligned to 8 and holds
    /// whole words, as the usual allocators give it. Rust promises a `Vec<u8>` no alignment, and Miri gives it any: there,
    /// buffers are made (and kept, so that each is a new allocation) until one is aligned.
    fn aligned(len: usize, byte: impl Fn(usize) -> u8) -> Vec<u8> {
        let mut misaligned = Vec::new();
        loop {
            // Room for whole words, so that registering it does not move it.
            let mut buffer = Vec::with_capacity(len.next_multiple_of(8));
            buffer.extend((0..len).map(&byte));
            if buffer.as_ptr() as usize % 8 == 0 {
                return buffer;
            }
            misaligned.push(buffer);
        }
    }

    /// A buffer handed over is the region itself: a remote WRITE lands in it, the application
    /// reads it through the handle, and after deregistration the same allocation comes back,
    /// at its length, with what was written (Miri runs this: the `unsafe` of `lent.rs`).
    #[test]
    fn a_lent_buffer_is_the_region_and_comes_back_whole() {
        let (mut t, pd, _) = table();
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let buffer = aligned(100, |i| i as u8);
        let allocation = buffer.as_ptr();
        let mr = t.register_buffer(pd, 0x8000, buffer, access).unwrap();
        assert_eq!((mr.len(), mr.to_vec()[99]), (100, 99));
        let span = t
            .check_remote(
                mr.rkey(),
                (pd, Qpn::new(1)),
                0x8000 + 95,
                5,
                Access::REMOTE_WRITE,
            )
            .unwrap()
            .held();
        span.span().write(0, b"12345").unwrap();
        let mut tail = [0u8; 5];
        mr.read(95, &mut tail).unwrap();
        assert_eq!(&tail, b"12345");
        let held = mr
            .into_buffer()
            .expect_err("the table and the held span still hold it");
        drop(span);
        t.deregister(held.lkey()).unwrap();
        let back = held.into_buffer().expect("the last handle");
        assert_eq!(back.as_ptr(), allocation, "the same allocation, not a copy");
        assert_eq!(back.len(), 100);
        assert_eq!(&back[95..], b"12345");
        assert_eq!(back[..95], (0..95).map(|i| i as u8).collect::<Vec<_>>()[..]);
    }

    /// Buffers of every awkward shape: empty (with and without an allocation), shorter than a
    /// word, and one dropped while registered rather than handed back.
    #[test]
    fn lent_buffers_of_any_length_are_sound() {
        let (mut t, pd, _) = table();
        let shapes = [
            Vec::new(),
            Vec::with_capacity(16),
            aligned(3, |_| 7),
            aligned(4096, |_| 1),
        ];
        for buffer in shapes {
            let len = buffer.len();
            let mr = t
                .register_buffer(pd, 0x10_0000, buffer, Access::LOCAL_WRITE)
                .unwrap();
            assert_eq!(mr.len(), len);
            if len > 0 {
                mr.write(len - 1, &[9]).unwrap();
            }
            t.deregister(mr.lkey()).unwrap();
            let back = mr.into_buffer().unwrap();
            assert_eq!(back.len(), len);
            assert!(back.last().is_none_or(|&b| b == 9));
        }
        let dropped = t
            .register_buffer(pd, 0x20_0000, aligned(13, |_| 0), Access::LOCAL_WRITE)
            .unwrap();
        drop(dropped);
        t.release_dropped();
        // A buffer not aligned to 8 comes back untouched, with the address that refused it.
        // The usual allocators never give one, so this runs where one turns up (under Miri).
        let mut made = Vec::new();
        for _ in 0..64 {
            let buffer = vec![5u8; 24];
            if buffer.as_ptr() as usize % 8 != 0 {
                let addr = buffer.as_ptr() as u64;
                let (back, why) = t
                    .register_buffer(pd, 0x30_0000, buffer, Access::LOCAL_WRITE)
                    .unwrap_err();
                assert_eq!(
                    (back, why),
                    (vec![5u8; 24], MemoryError::Misaligned { addr })
                );
                break;
            }
            made.push(buffer);
        }
        // A region softroce allocated hands back a copy of its bytes, once nothing else holds it.
        let (own_table, _, own) = table();
        own.write(0, b"copied").unwrap();
        assert!(
            own.clone().into_buffer().is_err(),
            "its table still holds it"
        );
        drop(own_table);
        assert_eq!(&own.into_buffer().unwrap()[..6], b"copied");
    }

    /// An SGE is checked where it is made: a range past the region's end is an error with
    /// its address, not a request that fails later with LOC_PROT_ERR.
    #[test]
    fn sges_are_checked_against_the_region() {
        let (_, _, mr) = table();
        let sge = mr.sge(8, 16).unwrap();
        assert_eq!(
            (sge.addr, sge.len, sge.lkey),
            (mr.iova() + 8, 16, mr.lkey())
        );
        assert_eq!(mr.sge(mr.len(), 0).map(|s| s.len), Ok(0));
        assert_eq!(
            mr.sge(mr.len() - 4, 5),
            Err(MemoryError::OutOfBounds {
                addr: mr.iova() + mr.len() as u64 - 4,
                len: 5
            })
        );
        assert!(mr.sge(usize::MAX, 2).is_err(), "an end that overflows");
        let remote = mr.remote();
        assert_eq!(
            (remote.addr, remote.len, remote.rkey),
            (mr.iova(), mr.len() as u64, mr.rkey())
        );
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
        span.read(0, &mut got).unwrap();
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
        let span = t
            .check_atomic(mr.rkey(), (pd, Qpn::new(2)), 0x2008)
            .unwrap();
        assert_eq!(span.fetch_add(1), Ok(41));
        assert_eq!(span.compare_swap(42, 7), Ok(42));
        assert_eq!(span.compare_swap(42, 9), Ok(7));
        let mut word = [0u8; 8];
        mr.read(8, &mut word).unwrap();
        assert_eq!(u64::from_ne_bytes(word), 7);
    }

    #[test]
    fn a_word_read_while_it_is_written_is_one_write_or_the_other() {
        // Whole-word copies, the bulk path (16-byte moves on x86-64 with AVX), are atomic per
        // word: a reader racing a writer sees each word whole, from one write or the other.
        let mut t = MemoryTable::new(5);
        let pd = t.alloc_pd();
        let mr = t.register(pd, 0, 4096, Access::LOCAL_WRITE).unwrap();
        let rounds = if cfg!(miri) { 4 } else { 2000 };
        let writer = {
            let mr = mr.clone();
            std::thread::spawn(move || {
                for round in 0..rounds {
                    mr.write(0, &[if round % 2 == 0 { 0x11 } else { 0x22 }; 4096])
                        .unwrap();
                }
            })
        };
        let mut out = vec![0u8; 4096];
        for _ in 0..rounds {
            mr.read(0, &mut out).unwrap();
            for word in out.chunks_exact(WORD) {
                assert!(
                    word.iter().all(|&b| b == word[0]) && [0, 0x11, 0x22].contains(&word[0]),
                    "a torn word: {word:02x?}"
                );
            }
        }
        writer.join().unwrap();
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
