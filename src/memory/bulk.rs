//! Whole-word copies into and out of a region's atomic words, at close to `memcpy` speed.
//!
//! A region's words may be written by a peer while the application reads them, so every access
//! to them is atomic (see `region.rs`). Written as a loop of `AtomicU64` loads or stores, a copy
//! moves 8 bytes an instruction, and the compiler may not widen atomics: 4 KiB took 2.3–3× a
//! `memcpy` (`benches/memory.rs`). On x86-64 processors with AVX, this module moves the words 16
//! bytes at a time instead, with `VMOVDQA` on the region's side.
//!
//! # Why this is as sound as the word loop
//!
//! Intel (SDM vol. 3A, 9.1.1) and AMD (APM vol. 2, 7.3.2) guarantee that on every processor of
//! theirs that reports AVX, a 16-byte `VMOVDQA` (VEX.128) load or store of 16-byte aligned,
//! cacheable memory is single-copy atomic. Other makers' processors document no such thing, so the
//! wide path runs only on Intel and AMD (the vendor string of CPUID leaf 0). GCC's libatomic and
//! LLVM implement 16-byte atomics the same way (PR104688, llvm-project #74275). Such an access can
//! be observed only as the two relaxed `AtomicU64` loads, or stores, of the words it covers would
//! be. So each block of assembly below behaves as a sequence of relaxed `AtomicU64` accesses to the
//! region's words, the same accesses of the same size that every other path makes to them: there is
//! no data race and no mixed-size access. The other side of the copy is a `&[u8]` or `&mut [u8]`
//! that the caller holds alone or shares read-only. Region storage is ordinary heap memory, which
//! is cacheable.
//!
//! Where AVX is missing, on other makers' processors, on targets other than 64-bit x86-64
//! (x32's 32-bit pointers included), and under Miri (which cannot run assembly), every word
//! goes through the loop.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

const WORD: usize = 8;

#[cfg(all(target_arch = "x86_64", target_pointer_width = "64", not(miri)))]
pub(super) use wide::atomic_16;

/// Copies `words` into `out`, which is exactly as long.
pub(super) fn load(words: &[AtomicU64], out: &mut [u8]) {
    debug_assert_eq!(out.len(), words.len() * WORD);
    let peel = unaligned_words(words);
    let (head, words) = words.split_at(peel);
    let (out_head, out) = out.split_at_mut(peel * WORD);
    load_each(head, out_head);
    let done = wide::load(words, out);
    load_each(&words[done..], &mut out[done * WORD..]);
}

/// Copies `data`, which is exactly as long, into `words`.
pub(super) fn store(words: &[AtomicU64], data: &[u8]) {
    debug_assert_eq!(data.len(), words.len() * WORD);
    let peel = unaligned_words(words);
    let (head, words) = words.split_at(peel);
    let (data_head, data) = data.split_at(peel * WORD);
    store_each(head, data_head);
    let done = wide::store(words, data);
    store_each(&words[done..], &data[done * WORD..]);
}

/// How many words come before the first 16-byte boundary: 0 or 1, as words are 8-aligned.
fn unaligned_words(words: &[AtomicU64]) -> usize {
    (words.as_ptr() as usize / WORD % 2).min(words.len())
}

fn load_each(words: &[AtomicU64], out: &mut [u8]) {
    // Relaxed loads are plain moves on x86-64 and aarch64.
    for (word, chunk) in words.iter().zip(out.chunks_exact_mut(WORD)) {
        chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
    }
}

fn store_each(words: &[AtomicU64], data: &[u8]) {
    for (word, chunk) in words.iter().zip(data.chunks_exact(WORD)) {
        let mut bytes = [0u8; WORD];
        bytes.copy_from_slice(chunk);
        word.store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
    }
}

#[cfg(all(target_arch = "x86_64", target_pointer_width = "64", not(miri)))]
mod wide {
    use std::arch::asm;
    use std::sync::atomic::AtomicU64;
    use std::sync::OnceLock;

    /// Words a block moves: 64 bytes, four 16-byte accesses on the region's side.
    const BLOCK_WORDS: usize = 8;

    /// Whether the 16-byte moves are atomic here: the processor reports AVX, and is one whose
    /// maker documents the guarantee (Intel or AMD). Found once, then a load. Also what
    /// decides the guarded copies of a program's memory (`memory::foreign`).
    pub(in crate::memory) fn atomic_16() -> bool {
        static ATOMIC_16: OnceLock<bool> = OnceLock::new();
        *ATOMIC_16.get_or_init(|| {
            let vendor = std::arch::x86_64::__cpuid(0);
            let mut name = [0u8; 12];
            for (part, register) in name
                .chunks_exact_mut(4)
                .zip([vendor.ebx, vendor.edx, vendor.ecx])
            {
                part.copy_from_slice(&register.to_le_bytes());
            }
            matches!(&name, b"GenuineIntel" | b"AuthenticAMD")
                && std::arch::is_x86_feature_detected!("avx")
        })
    }

    /// How many whole blocks of `words` the 16-byte moves may copy to or from a plain buffer
    /// of `plain_len` bytes: `None` for none, or where they are not atomic ([`atomic_16`]).
    /// Panics unless `words` starts 16-byte aligned and the plain side is long enough, which
    /// the callers' slicing guarantees and the assembly relies on.
    fn blocks(words: &[AtomicU64], plain_len: usize) -> Option<usize> {
        let blocks = words.len() / BLOCK_WORDS;
        if blocks == 0 || !atomic_16() {
            return None;
        }
        assert!(plain_len >= blocks * BLOCK_WORDS * 8 && words.as_ptr() as usize % 16 == 0);
        Some(blocks)
    }

    /// Loads whole blocks of `words`, which starts 16-byte aligned, into `out`; returns how
    /// many words it moved (0 without AVX).
    pub(super) fn load(words: &[AtomicU64], out: &mut [u8]) -> usize {
        let Some(blocks) = blocks(words, out.len()) else {
            return 0;
        };
        // SAFETY:
        // - The loop runs `blocks` times, reading 64 bytes from `rsi` and writing 64 to `rdi`
        //   each time: `blocks * 64` bytes of `words` and of `out`, both inside their slices
        //   (asserted in `blocks`), and no other memory.
        // - `rsi`, the region's side, starts 16-byte aligned (asserted in `blocks`) and steps
        //   by 64, so every VMOVDQA is aligned. The processor is an Intel or AMD one with AVX
        //   (checked in `blocks`), so each is a single-copy atomic 16-byte load of cacheable
        //   memory. It behaves as relaxed `AtomicU64` loads of its two words (the module
        //   documentation): no data race with a peer's or the application's concurrent
        //   writes, which are `AtomicU64` accesses too.
        // - `out` is borrowed mutably: no one else reads or writes it meanwhile.
        // - Every register the block changes is declared: `clobber_abi("C")` marks all the
        //   vector registers, whole, as clobbered, which covers the YMM halves written here and
        //   the VZEROUPPER that clears them before returning, as the ABI expects. No stack is
        //   used. The flags are clobbered (no `preserves_flags`).
        unsafe {
            asm!(
                "2:",
                "vmovdqa xmm0, [rsi]",
                "vmovdqa xmm1, [rsi + 16]",
                "vmovdqa xmm2, [rsi + 32]",
                "vmovdqa xmm3, [rsi + 48]",
                "vinsertf128 ymm0, ymm0, xmm1, 1",
                "vinsertf128 ymm2, ymm2, xmm3, 1",
                "vmovdqu [rdi], ymm0",
                "vmovdqu [rdi + 32], ymm2",
                "add rsi, 64",
                "add rdi, 64",
                "dec rcx",
                "jnz 2b",
                "vzeroupper",
                inout("rsi") words.as_ptr() => _,
                inout("rdi") out.as_mut_ptr() => _,
                inout("rcx") blocks => _,
                clobber_abi("C"),
                options(nostack),
            );
        }
        blocks * BLOCK_WORDS
    }

    /// Stores whole blocks of `data` into `words`, which starts 16-byte aligned; returns how
    /// many words it moved (0 without AVX).
    pub(super) fn store(words: &[AtomicU64], data: &[u8]) -> usize {
        let Some(blocks) = blocks(words, data.len()) else {
            return 0;
        };
        // SAFETY:
        // - The loop runs `blocks` times, reading 64 bytes from `rsi` and writing 64 to `rdi`
        //   each time: `blocks * 64` bytes of `data` and of `words`, both inside their slices
        //   (asserted in `blocks`), and no other memory.
        // - Writing through a pointer from `&[AtomicU64]` is allowed: `AtomicU64` is an
        //   `UnsafeCell`, mutable through shared references.
        // - `rdi`, the region's side, starts 16-byte aligned (asserted in `blocks`) and steps
        //   by 64, so every VMOVDQA is aligned. The processor is an Intel or AMD one with AVX
        //   (checked in `blocks`), so each is a single-copy atomic 16-byte store to cacheable
        //   memory. It behaves as relaxed `AtomicU64` stores to its two words (the module
        //   documentation): no data race with concurrent readers or writers, which use
        //   `AtomicU64` accesses too.
        // - `data` is only read.
        // - Every register the block changes is declared (`clobber_abi("C")` covers the vector
        //   registers); only XMM registers are written, so no VZEROUPPER is needed. No stack is
        //   used. The flags are clobbered (no `preserves_flags`).
        unsafe {
            asm!(
                "2:",
                "vmovdqu xmm0, [rsi]",
                "vmovdqu xmm1, [rsi + 16]",
                "vmovdqu xmm2, [rsi + 32]",
                "vmovdqu xmm3, [rsi + 48]",
                "vmovdqa [rdi], xmm0",
                "vmovdqa [rdi + 16], xmm1",
                "vmovdqa [rdi + 32], xmm2",
                "vmovdqa [rdi + 48], xmm3",
                "add rsi, 64",
                "add rdi, 64",
                "dec rcx",
                "jnz 2b",
                inout("rsi") data.as_ptr() => _,
                inout("rdi") words.as_ptr() => _,
                inout("rcx") blocks => _,
                clobber_abi("C"),
                options(nostack),
            );
        }
        blocks * BLOCK_WORDS
    }
}

#[cfg(not(all(target_arch = "x86_64", target_pointer_width = "64", not(miri))))]
mod wide {
    use std::sync::atomic::AtomicU64;

    /// No wide moves here: every word goes through the loop.
    pub(super) fn load(_: &[AtomicU64], _: &mut [u8]) -> usize {
        0
    }

    /// As `load`.
    pub(super) fn store(_: &[AtomicU64], _: &[u8]) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(n: usize) -> Vec<AtomicU64> {
        (0..n as u64)
            .map(|i| AtomicU64::new(i * 0x0101_0101_0101_0101))
            .collect()
    }

    #[test]
    fn every_length_and_start_matches_the_word_loop() {
        // Starts on both sides of a 16-byte boundary, lengths around whole blocks, and an
        // unaligned plain side: every split between the peeled word, the blocks and the rest.
        let region = words(64);
        for start in 0..4 {
            for len in 0..40 {
                let src = &region[start..start + len];
                let mut wide = vec![0u8; len * WORD + 3];
                load(src, &mut wide[3..]);
                let mut each = vec![0u8; len * WORD];
                load_each(src, &mut each);
                assert_eq!(wide[3..], each, "load {len} words from {start}");

                let target = words(64);
                let data: Vec<u8> = (0..len * WORD + 5).map(|i| (i * 7 + len) as u8).collect();
                store(&target[start..start + len], &data[5..]);
                for (i, word) in target.iter().enumerate() {
                    let expected = if (start..start + len).contains(&i) {
                        let at = 5 + (i - start) * WORD;
                        u64::from_ne_bytes(data[at..at + WORD].try_into().unwrap())
                    } else {
                        i as u64 * 0x0101_0101_0101_0101
                    };
                    assert_eq!(
                        word.load(Ordering::Relaxed),
                        expected,
                        "store {len} at {start}"
                    );
                }
            }
        }
    }
}
