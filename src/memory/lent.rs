//! An application's buffer, registered without a copy: a `Vec<u8>` handed over whole, reached
//! only through atomic words while it is registered, and handed back whole.
//!
//! One of the two places softroce uses `unsafe` (the other is `bulk.rs`): the bytes of the `Vec`
//! are viewed as `AtomicU64` words, which no safe API offers. Everything else about a region's
//! soundness (`region.rs`) holds unchanged, because after [`Lent::new`] the words are all there is.

#![allow(unsafe_code)]

use std::mem::{align_of, ManuallyDrop};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use super::MemoryError;

const WORD: usize = 8;

/// The parts of a `Vec<u8>` taken apart: its allocation, as whole initialised words, and the
/// length the application gave it.
pub(super) struct Lent {
    /// The `Vec`'s pointer: its allocation, aligned to 8 when `words` is not 0.
    base: NonNull<u8>,
    /// The `Vec`'s length when it was handed over.
    len: usize,
    /// Its capacity, for putting it back together.
    capacity: usize,
    /// `len` rounded up to whole words: all initialised, all inside the allocation.
    words: usize,
}

// SAFETY: `Lent` owns its allocation alone (the `Vec` it came from no longer exists), and its
// bytes are reached only through `&[AtomicU64]`, which is `Send` and `Sync`.
unsafe impl Send for Lent {}
// SAFETY: as for `Send`: shared access goes through atomics only.
unsafe impl Sync for Lent {}

impl Lent {
    /// Takes `buffer` over. Its last word is completed with zero bytes (at most 7), which the
    /// allocator grows in place in practice; a buffer whose allocation is not 8-byte aligned,
    /// or that cannot grow those bytes, comes back with the reason.
    pub(super) fn new(mut buffer: Vec<u8>) -> Result<Lent, (Vec<u8>, MemoryError)> {
        let len = buffer.len();
        let words = len.div_ceil(WORD);
        if buffer.try_reserve_exact(words * WORD - len).is_err() {
            return Err((buffer, MemoryError::NoMemory { len: len as u64 }));
        }
        if words > 0 && buffer.as_ptr() as usize % align_of::<AtomicU64>() != 0 {
            let addr = buffer.as_ptr() as u64;
            return Err((buffer, MemoryError::Misaligned { addr }));
        }
        // Every byte an atomic word covers must be initialised: the pad bytes become zeros.
        buffer.resize(words * WORD, 0);
        let mut buffer = ManuallyDrop::new(buffer);
        let base = NonNull::new(buffer.as_mut_ptr()).expect("a Vec's pointer is never null");
        Ok(Lent {
            base,
            len,
            capacity: buffer.capacity(),
            words,
        })
    }

    /// The buffer's bytes as atomic words.
    pub(super) fn words(&self) -> &[AtomicU64] {
        if self.words == 0 {
            return &[];
        }
        // SAFETY: `base` is aligned to 8 (checked in `new` whenever there are words), and the
        // allocation holds `words * 8` initialised bytes (`resize` in
        // `new`), which live until `Drop` or `into_vec` frees or returns them, and those take
        // `self` by value or `&mut`, so no view outlives them. `AtomicU64` has the size and
        // alignment of `u64`, every bit pattern is valid for it, and its interior mutability
        // makes shared writes through `&AtomicU64` sound. No `&[u8]` or `&mut [u8]` to these
        // bytes exists while they are lent: the `Vec` was taken apart.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().cast::<AtomicU64>(), self.words) }
    }

    /// The length the buffer was handed over with.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The `Vec` handed over, whole: the same allocation, at its original length, its bytes
    /// as the last writers left them.
    pub(super) fn into_vec(self) -> Vec<u8> {
        let lent = ManuallyDrop::new(self);
        // SAFETY: `lent` is never dropped, so the allocation is freed once, by this `Vec`.
        let mut buffer = unsafe { lent.rebuild() };
        buffer.truncate(lent.len);
        buffer
    }

    /// The `Vec` again, from its parts.
    ///
    /// # Safety
    ///
    /// Once only: the caller must not use `self`'s allocation afterwards (`into_vec` and
    /// `Drop` call it last).
    unsafe fn rebuild(&self) -> Vec<u8> {
        if self.capacity == 0 {
            // No allocation: the pointer was a dangling one of the empty `Vec`'s.
            return Vec::new();
        }
        // SAFETY: `base`, `capacity` and the `words * 8` initialised bytes are the parts of
        // the `Vec` taken apart in `new` (`resize` made them its length), the allocation came
        // from the global allocator with `u8`'s layout, and the caller rebuilds it once.
        unsafe { Vec::from_raw_parts(self.base.as_ptr(), self.words * WORD, self.capacity) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once, and nothing uses the allocation after it.
        drop(unsafe { self.rebuild() });
    }
}
