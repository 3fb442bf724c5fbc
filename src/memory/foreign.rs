//! Memory a program registered in place, at its own address (`ibv_reg_mr` through softroce's
//! `libibverbs.so.1`): its bytes are the region, with no copy and no shadow buffer, so that a
//! peer's WRITE lands where the program reads.
//!
//! The third place softroce uses `unsafe` (after `lent.rs` and `bulk.rs`): a raw pointer from C
//! becomes atomic views of its bytes. The memory is the program's, at any address, length and
//! alignment (`malloc`, the stack, `mmap`), so it is reached as:
//!
//! - the whole 8-byte words inside it, as `AtomicU64` (the region's word accesses, its bulk
//!   copies and the remote atomics, which the memory table lets through only at addresses
//!   that are multiples of 8 here too);
//! - the bytes of a word the region covers only in part, as `AtomicU8`, one at a time: a byte
//!   outside the registered range is never read or written, not even with its own value.
//!
//! The program reads and writes its buffer with plain loads and stores while softroce's atomic
//! accesses go on, as it does with a NIC's DMA. That is outside what Rust's memory model
//! describes, which covers only Rust's own accesses; on the hardware, each of softroce's
//! accesses is a single aligned load or store (or a locked read-modify-write), and the
//! program's accesses cannot tear them. What Rust's model does require holds: every access
//! softroce makes is atomic, so softroce's own threads never race each other, and no
//! reference to these bytes other than atomic ones ever exists on softroce's side.

#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

const WORD: usize = 8;

/// A program's memory, lent to a region for as long as the region lives.
pub struct ForeignMemory {
    ptr: NonNull<u8>,
    len: usize,
}

impl std::fmt::Debug for ForeignMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ForeignMemory({:p}, {} bytes)", self.ptr, self.len)
    }
}

// SAFETY: `ForeignMemory` is an address and a length; the bytes they name are reached only
// through `AtomicU64` and `AtomicU8`, which are `Send` and `Sync`, and `new`'s contract keeps
// them mapped for as long as the value lives, whichever thread holds it.
unsafe impl Send for ForeignMemory {}
// SAFETY: as for `Send`: shared access goes through atomics only.
unsafe impl Sync for ForeignMemory {}

impl ForeignMemory {
    /// `len` bytes at `ptr`, which may be at any alignment; `None` if `ptr` is null (and `len`
    /// not 0) or the range wraps around the address space.
    ///
    /// # Safety
    ///
    /// The `len` bytes at `ptr` must stay allocated and mapped, readable, and writable if the
    /// region will grant local or remote writes, until this value is dropped: for a region,
    /// until it is deregistered and [`MemoryRegion::try_close`](super::MemoryRegion::try_close)
    /// has succeeded. The caller may not free them before then. They may be accessed by the
    /// program meanwhile (see the module's documentation), but never through a Rust reference
    /// other than an atomic one.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Option<ForeignMemory> {
        if len > 0 && (ptr as usize).checked_add(len).is_none() {
            return None;
        }
        let ptr = match NonNull::new(ptr) {
            Some(ptr) => ptr,
            None if len == 0 => NonNull::dangling(),
            None => return None,
        };
        Some(ForeignMemory { ptr, len })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of its first byte.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// How many bytes come before the first 8-byte boundary (all of them if there is none).
    fn head(&self) -> usize {
        ((WORD - self.addr() % WORD) % WORD).min(self.len)
    }

    /// The whole words inside the memory, and the offset of the first.
    pub(super) fn words(&self) -> (usize, &[AtomicU64]) {
        let head = self.head();
        let count = (self.len - head) / WORD;
        if count == 0 {
            return (head, &[]);
        }
        // SAFETY: `ptr + head` is 8-aligned (`head` reaches the first boundary) and the `count`
        // words from it lie inside the `len` bytes, which `new`'s contract keeps allocated and
        // mapped while `self` lives, and so while this borrow of it does. `AtomicU64` has the
        // size and alignment of `u64`, every bit pattern is valid for it, and its interior
        // mutability makes writes through a shared reference sound. No non-atomic reference to
        // these bytes exists on softroce's side.
        let words = unsafe {
            let first = self.ptr.as_ptr().add(head).cast::<AtomicU64>();
            std::slice::from_raw_parts(first, count)
        };
        (head, words)
    }

    /// The byte at `offset` (inside the memory, which the caller checked).
    fn byte(&self, offset: usize) -> &AtomicU8 {
        assert!(offset < self.len, "a byte past the memory");
        // SAFETY: `offset` is inside the `len` bytes (asserted), which `new`'s contract keeps
        // mapped while `self`, and so this borrow, lives. `AtomicU8` has the size and alignment
        // of `u8` and is valid for every bit pattern.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(offset)) }
    }

    /// Copies the bytes from `offset` into `out`, one at a time.
    pub(super) fn read_bytes(&self, offset: usize, out: &mut [u8]) {
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = self.byte(offset + i).load(Ordering::Relaxed);
        }
    }

    /// Copies `data` to the bytes from `offset`, one at a time.
    pub(super) fn write_bytes(&self, offset: usize, data: &[u8]) {
        for (i, &byte) in data.iter().enumerate() {
            self.byte(offset + i).store(byte, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alignment and length over a buffer with guard bytes either side: reads see what
    /// was written, and writes never touch a byte outside the range.
    #[test]
    fn bytes_outside_the_range_are_never_touched() {
        let mut buffer = vec![0xeeu8; 64];
        let base = buffer.as_mut_ptr();
        for start in 8..16 {
            for len in 0..24 {
                // SAFETY: the range lies inside `buffer`, which outlives `memory`, and is
                // reached only through `memory` meanwhile.
                let memory = unsafe { ForeignMemory::new(base.add(start), len) }.unwrap();
                let data: Vec<u8> = (0..len as u8).collect();
                let (head, words) = memory.words();
                assert!(words.is_empty() || (memory.addr() + head) % WORD == 0);
                assert!(head + words.len() * WORD <= len);
                memory.write_bytes(0, &data);
                let mut back = vec![0; len];
                memory.read_bytes(0, &mut back);
                assert_eq!(back, data);
                memory.write_bytes(0, &vec![0xee; len]);
                assert!(buffer.iter().all(|&b| b == 0xee), "{start} {len}");
            }
        }
    }

    #[test]
    fn a_null_pointer_is_refused_unless_empty() {
        // SAFETY: nothing is accessed through either.
        unsafe {
            assert!(ForeignMemory::new(std::ptr::null_mut(), 8).is_none());
            assert!(ForeignMemory::new(std::ptr::null_mut(), 0).is_some());
            assert!(ForeignMemory::new(std::ptr::without_provenance_mut(usize::MAX), 2).is_none());
        }
    }
}
