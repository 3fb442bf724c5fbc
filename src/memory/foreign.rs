//! Memory a program registered in place, at its own address (`ibv_reg_mr` through softroce's
//! `libibverbs.so.1`): its bytes are the region, with no copy and no shadow buffer, so that a
//! peer's WRITE lands where the program reads.
//!
//! One of the places softroce uses `unsafe`: a raw pointer from C, reached byte by byte where a
//! word of it sticks out of the range, and 8 aligned bytes at a time inside, never a byte
//! outside the registered range.
//!
//! # Memory the program takes away
//!
//! The kernel pins a region's pages, so a program that unmaps its memory (or takes a right
//! away with `mprotect`) after registering it leaves the NIC the old pages. softroce reaches
//! the program's memory itself, and would take a segmentation fault on the engine's thread,
//! killing the process at a peer's WRITE or READ. So, on x86-64 Linux, every access is made by
//! a few routines of assembly (`guarded`) that a fault cannot kill: a handler of `SIGSEGV` and
//! `SIGBUS`, installed with the first region, finds a fault's instruction inside them and
//! resumes at their exit with a failure, which becomes [`MemoryError::Unmapped`] (the kernel's
//! `copy_from_user` works so, with its exception table). Every other fault goes to the handler
//! that was there before, or kills the process as it would have. An access costs what a copy
//! loop costs: the handler runs only on a fault. softroce's engine threads unblock the two
//! signals as they start ([`take_faults_here`]), whatever mask they inherited. Two things take
//! the protection away: a program that installs its own `SIGSEGV` handler after its first
//! registration, and does not pass ours the faults it does not own; and a thread of the
//! program's that blocks `SIGSEGV` and runs the engine itself (hybrid or inline progress, in
//! its polls). Elsewhere (other targets, and under Miri), the accesses are the same atomic
//! loads and stores, unguarded: memory taken away kills the process there.
//!
//! # Concurrent access
//!
//! The program reads and writes its buffer with plain loads and stores while softroce's
//! accesses go on, as it does with a NIC's DMA. softroce's are single aligned loads and stores
//! of 8 bytes inside the range, of single bytes where a word sticks out, and locked
//! read-modify-writes for the atomics, so the program's accesses cannot tear them. softroce
//! holds no Rust reference to these bytes: each access is the assembly's (or, unguarded, an
//! atomic one through a pointer), so its own threads never race each other in Rust's model
//! either.

#![allow(unsafe_code)]

use std::ptr::NonNull;

use super::MemoryError;

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

// SAFETY: `ForeignMemory` is an address and a length; the bytes they name are reached only by
// the accesses below, each a single machine access that is safe to make from any thread.
unsafe impl Send for ForeignMemory {}
// SAFETY: as for `Send`: shared access goes through those accesses only.
unsafe impl Sync for ForeignMemory {}

impl ForeignMemory {
    /// `len` bytes at `ptr`, which may be at any alignment; `None` if `ptr` is null (and `len`
    /// not 0) or the range wraps around the address space.
    ///
    /// # Safety
    ///
    /// The `len` bytes at `ptr` are the program's to lend until this value is dropped (for a
    /// region, until it is deregistered and
    /// [`MemoryRegion::try_close`](super::MemoryRegion::try_close) has succeeded): they are
    /// not freed to be used as something else meanwhile, which peers could then reach. The
    /// program may access them meanwhile (see the module's documentation), and, on x86-64
    /// Linux, unmap them or change their protection: an access then fails. Elsewhere they must
    /// stay mapped, readable, and writable if the region grants writes.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Option<ForeignMemory> {
        if len > 0 && (ptr as usize).checked_add(len).is_none() {
            return None;
        }
        let ptr = match NonNull::new(ptr) {
            Some(ptr) => ptr,
            None if len == 0 => NonNull::dangling(),
            None => return None,
        };
        access::prepare();
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

    /// The address of the byte at `offset`, after checking that `len` bytes from there lie
    /// inside the memory (the callers checked the range against the region: this is the
    /// proof the accesses below rely on).
    fn at(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "an access past the memory"
        );
        // SAFETY: `offset` is at most `len`, so the result stays inside (or one past) the
        // range `new` was given, which does not wrap.
        unsafe { self.ptr.as_ptr().add(offset) }
    }

    /// The failure of an access at `offset`, for the program's address.
    fn unmapped(&self, offset: usize) -> MemoryError {
        MemoryError::Unmapped {
            addr: (self.addr() + offset) as u64,
        }
    }

    /// Copies the bytes from `offset` into `out`.
    pub(super) fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryError> {
        let from = self.at(offset, out.len());
        // SAFETY: `from` and the `out.len()` bytes after it lie inside the memory (`at`), which
        // `new`'s contract lends us; `out` is ours, borrowed mutably, and cannot overlap the
        // program's memory, which no Rust reference names.
        let read = unsafe { access::read(from, out.as_mut_ptr(), out.len()) };
        read.map_err(|()| self.unmapped(offset))
    }

    /// Copies `data` to the bytes from `offset`.
    pub(super) fn write(&self, offset: usize, data: &[u8]) -> Result<(), MemoryError> {
        let to = self.at(offset, data.len());
        // SAFETY: as in `read`, with `data` only read.
        let written = unsafe { access::write(to, data.as_ptr(), data.len()) };
        written.map_err(|()| self.unmapped(offset))
    }

    /// FETCH_ADD on the 8 bytes at `offset`, which the caller checked are 8-aligned in the
    /// address space: the value before.
    pub(super) fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        let word = self.word(offset);
        // SAFETY: an aligned word inside the memory (`word`).
        unsafe { access::fetch_add(word, add) }.map_err(|()| self.unmapped(offset))
    }

    /// CMP_SWAP on the 8 bytes at `offset`, as [`fetch_add`](Self::fetch_add): the value
    /// before.
    pub(super) fn compare_swap(
        &self,
        offset: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryError> {
        let word = self.word(offset);
        // SAFETY: an aligned word inside the memory (`word`).
        unsafe { access::compare_swap(word, compare, swap) }.map_err(|()| self.unmapped(offset))
    }

    /// The word at `offset`, inside the memory and 8-aligned.
    fn word(&self, offset: usize) -> *mut u64 {
        let at = self.at(offset, 8);
        assert_eq!(at as usize % 8, 0, "an atomic's word is 8-aligned");
        at.cast()
    }
}

/// Lets the calling thread, one of softroce's own, take the faults that the guarded accesses
/// recover from: a thread started with `SIGSEGV` and `SIGBUS` blocked (a program that blocks
/// every signal before it opens a device, whose threads inherit its mask) would die of one.
pub(crate) fn take_faults_here() {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    {
        use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
        let mut faults = SigSet::empty();
        faults.add(Signal::SIGSEGV);
        faults.add(Signal::SIGBUS);
        let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&faults), None);
    }
}

/// The accesses, guarded against faults: x86-64 Linux, outside Miri.
#[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
mod access {
    use std::arch::global_asm;
    use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
    use std::sync::Once;

    // The routines a fault may stop, between `softroce_guarded_begin` and
    // `softroce_guarded_fault`. Each is a leaf that touches no stack, so when a fault sends
    // it to `softroce_guarded_fault`, that routine's `ret` returns to the caller with 1 in
    // eax. Accesses to the program's memory are single bytes, and 8 aligned bytes where a
    // whole word of it lies inside the range (the `_wide` routines: 16 aligned bytes where
    // 64 are left, by VMOVDQA, single-copy atomic on the processors they run on, as two
    // 8-byte accesses would be; see `memory::bulk`: for cacheable memory, which is what a
    // program registers but for a device's mapping, which `capi::mapping` refuses where the
    // kernel has MADV_POPULATE and lets through on older kernels); the other side is the
    // caller's own
    // buffer. Stores to the program's memory go in address order, so a program that polls
    // the last byte of a message (perftest's latency tests) sees the rest before it.
    //
    // softroce_guarded_read(to: rdi, from: rsi (the program's), len: rdx) -> eax 0 | 1
    // softroce_guarded_write(to: rdi (the program's), from: rsi, len: rdx) -> eax 0 | 1
    // softroce_guarded_read_wide, softroce_guarded_write_wide: the same, XMM0-3 clobbered
    // softroce_guarded_fetch_add(word: rdi, add: rsi, before: rdx) -> eax 0 | 1
    // softroce_guarded_compare_swap(word: rdi, compare: rsi, swap: rdx, before: rcx) -> eax

    /// A copy routine `name`(to: rdi, from: rsi, len: rdx) -> eax: single bytes until
    /// `aligned` (the byte register of the program's side, `sil` or `dil`) is 8-aligned, then
    /// the bulk step, then 8 bytes at a time while whole words are left, then the last bytes.
    /// 0 once done; the fault exit returns 1. The bulk step: 8 bytes at a time, four to an
    /// iteration, while 32 are left; or, given a `load` and a `store` instruction (the aligned
    /// VMOVDQA on the program's side), a word until the program's side is 16-aligned, then four
    /// 16-byte moves an iteration while 64 bytes are left.
    #[rustfmt::skip]
    macro_rules! guarded_copy {
        (@routine $name:literal, $aligned:literal, [$($step:literal),*]) => {
            concat!(
                ".globl ", $name, "\n.hidden ", $name, "\n.type ", $name, ",@function\n",
                $name, ":\n",
                "1:\n test rdx, rdx\n jz 9f\n test ", $aligned, ", 7\n jz 2f\n",
                "mov al, byte ptr [rsi]\n mov byte ptr [rdi], al\n",
                "inc rsi\n inc rdi\n dec rdx\n jmp 1b\n",
                "2:\n", $($step,)*
                "3:\n cmp rdx, 8\n jb 4f\n",
                "mov rax, qword ptr [rsi]\n mov qword ptr [rdi], rax\n",
                "add rsi, 8\n add rdi, 8\n sub rdx, 8\n jmp 3b\n",
                "4:\n test rdx, rdx\n jz 9f\n",
                "mov al, byte ptr [rsi]\n mov byte ptr [rdi], al\n",
                "inc rsi\n inc rdi\n dec rdx\n jmp 4b\n",
                "9:\n xor eax, eax\n ret\n",
                ".size ", $name, ", . - ", $name, "\n",
            )
        };
        ($name:literal, $aligned:literal) => {
            guarded_copy!(@routine $name, $aligned, [
                "cmp rdx, 32\n jb 3f\n",
                "mov rax, qword ptr [rsi]\n mov rcx, qword ptr [rsi + 8]\n",
                "mov r8, qword ptr [rsi + 16]\n mov r9, qword ptr [rsi + 24]\n",
                "mov qword ptr [rdi], rax\n mov qword ptr [rdi + 8], rcx\n",
                "mov qword ptr [rdi + 16], r8\n mov qword ptr [rdi + 24], r9\n",
                "add rsi, 32\n add rdi, 32\n sub rdx, 32\n jmp 2b\n"
            ])
        };
        ($name:literal, $aligned:literal, $load:literal, $store:literal) => {
            guarded_copy!(@routine $name, $aligned, [
                "cmp rdx, 8\n jb 4f\n test ", $aligned, ", 15\n jz 5f\n",
                "mov rax, qword ptr [rsi]\n mov qword ptr [rdi], rax\n",
                "add rsi, 8\n add rdi, 8\n sub rdx, 8\n",
                "5:\n cmp rdx, 64\n jb 3f\n",
                $load, " xmm0, xmmword ptr [rsi]\n", $load, " xmm1, xmmword ptr [rsi + 16]\n",
                $load, " xmm2, xmmword ptr [rsi + 32]\n", $load, " xmm3, xmmword ptr [rsi + 48]\n",
                $store, " xmmword ptr [rdi], xmm0\n", $store, " xmmword ptr [rdi + 16], xmm1\n",
                $store, " xmmword ptr [rdi + 32], xmm2\n", $store, " xmmword ptr [rdi + 48], xmm3\n",
                "add rsi, 64\n add rdi, 64\n sub rdx, 64\n jmp 5b\n"
            ])
        };
    }

    global_asm!(
        ".pushsection .text.softroce_guarded,\"ax\",@progbits",
        ".p2align 4",
        ".globl softroce_guarded_begin",
        ".hidden softroce_guarded_begin",
        "softroce_guarded_begin:",
        guarded_copy!("softroce_guarded_read", "sil"),
        guarded_copy!("softroce_guarded_write", "dil"),
        guarded_copy!("softroce_guarded_read_wide", "sil", "vmovdqa", "vmovdqu"),
        guarded_copy!("softroce_guarded_write_wide", "dil", "vmovdqu", "vmovdqa"),
        ".globl softroce_guarded_fetch_add",
        ".hidden softroce_guarded_fetch_add",
        ".type softroce_guarded_fetch_add,@function",
        "softroce_guarded_fetch_add:",
        "lock xadd qword ptr [rdi], rsi",
        "mov qword ptr [rdx], rsi",
        "xor eax, eax",
        "ret",
        ".size softroce_guarded_fetch_add, . - softroce_guarded_fetch_add",
        ".globl softroce_guarded_compare_swap",
        ".hidden softroce_guarded_compare_swap",
        ".type softroce_guarded_compare_swap,@function",
        "softroce_guarded_compare_swap:",
        "mov rax, rsi",
        "lock cmpxchg qword ptr [rdi], rdx",
        "mov qword ptr [rcx], rax",
        "xor eax, eax",
        "ret",
        ".size softroce_guarded_compare_swap, . - softroce_guarded_compare_swap",
        ".globl softroce_guarded_fault",
        ".hidden softroce_guarded_fault",
        ".type softroce_guarded_fault,@function",
        "softroce_guarded_fault:",
        "mov eax, 1",
        "ret",
        ".size softroce_guarded_fault, . - softroce_guarded_fault",
        ".popsection",
    );

    extern "C" {
        fn softroce_guarded_begin();
        fn softroce_guarded_fault();
        fn softroce_guarded_read(to: *mut u8, from: *const u8, len: usize) -> u32;
        fn softroce_guarded_write(to: *mut u8, from: *const u8, len: usize) -> u32;
        fn softroce_guarded_read_wide(to: *mut u8, from: *const u8, len: usize) -> u32;
        fn softroce_guarded_write_wide(to: *mut u8, from: *const u8, len: usize) -> u32;
        fn softroce_guarded_fetch_add(word: *mut u64, add: u64, before: *mut u64) -> u32;
        fn softroce_guarded_compare_swap(
            word: *mut u64,
            compare: u64,
            swap: u64,
            before: *mut u64,
        ) -> u32;
    }

    /// What handled `SIGSEGV` or `SIGBUS` before ours: its handler's address (or `SIG_DFL`,
    /// `SIG_IGN`) and its flags. Atomics, which the signal handler may read: they are
    /// published before our handler is installed, so it never runs without them.
    struct Previous {
        handler: AtomicUsize,
        flags: AtomicI32,
    }

    impl Previous {
        const fn new() -> Previous {
            Previous {
                handler: AtomicUsize::new(libc::SIG_DFL),
                flags: AtomicI32::new(0),
            }
        }

        fn store(&self, action: &libc::sigaction) {
            self.flags.store(action.sa_flags, Ordering::Relaxed);
            self.handler.store(action.sa_sigaction, Ordering::Release);
        }
    }

    /// The actions before ours, for `SIGSEGV` and `SIGBUS`.
    static PREVIOUS: [Previous; 2] = [Previous::new(), Previous::new()];

    /// The index in [`PREVIOUS`] of `signal`'s.
    fn index(signal: libc::c_int) -> usize {
        usize::from(signal == libc::SIGBUS)
    }

    /// Installs the fault handler, once per process, before the first access can fault.
    pub(super) fn prepare() {
        static INSTALLED: Once = Once::new();
        INSTALLED.call_once(|| {
            // SAFETY: `sigaction` is plain data, for which zero is valid.
            let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
            ours.sa_sigaction = on_fault as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            for signal in [libc::SIGSEGV, libc::SIGBUS] {
                let previous = &PREVIOUS[index(signal)];
                // SAFETY: as above.
                let mut before: libc::sigaction = unsafe { std::mem::zeroed() };
                // SAFETY: reads the current action into `before`, a valid structure.
                unsafe { libc::sigaction(signal, std::ptr::null(), &mut before) };
                previous.store(&before);
                // SAFETY: `ours` and `before` are valid sigaction structures; the handler is a
                // function of this module, for the process's life (see the capi's
                // `-z nodelete`). What it reads of the action before is published above.
                unsafe { libc::sigaction(signal, &ours, &mut before) };
                // Another thread's handler installed in between is the one to pass on to.
                previous.store(&before);
            }
        });
    }

    /// The fault handler: a fault inside the guarded routines resumes at their exit, which
    /// returns the failure; any other signal goes to what handled it before. Only a fault the
    /// kernel raised (`si_code` above 0) is ours: the same signal sent by a process (`kill`,
    /// `sigqueue`) while a copy runs is passed on, not taken for a fault.
    extern "C" fn on_fault(
        signal: libc::c_int,
        info: *mut libc::siginfo_t,
        ctx: *mut libc::c_void,
    ) {
        // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler, and
        // the interrupted thread's registers in the ucontext are this handler's to change:
        // they are what the thread resumes with.
        let (raised, rip) = unsafe {
            let ucontext = ctx.cast::<libc::ucontext_t>();
            (
                (*info).si_code > 0,
                &mut (*ucontext).uc_mcontext.gregs[libc::REG_RIP as usize],
            )
        };
        let (begin, end) = (
            softroce_guarded_begin as *const () as usize,
            softroce_guarded_fault as *const () as usize,
        );
        if raised && (begin..end).contains(&(*rip as usize)) {
            *rip = end as i64;
            return;
        }
        // SAFETY: the arguments as the kernel gave them.
        unsafe { pass_on(signal, info, ctx, raised) };
    }

    /// Hands a signal that is not ours to what handled it before: its handler; for a fault
    /// under the default action (or ignored, which the kernel does not allow a fault), the
    /// default, restored, and a return to the faulting instruction, which faults again and
    /// kills the process as it would have; a sent signal that was ignored stays ignored, and
    /// one under the default action is sent again, to it.
    ///
    /// # Safety
    ///
    /// Called from the signal handler with the kernel's arguments; `raised` says whether the
    /// kernel raised the signal for a fault.
    unsafe fn pass_on(
        signal: libc::c_int,
        info: *mut libc::siginfo_t,
        ctx: *mut libc::c_void,
        raised: bool,
    ) {
        let previous = &PREVIOUS[index(signal)];
        let handler = previous.handler.load(Ordering::Acquire);
        match handler {
            libc::SIG_IGN if !raised => {}
            libc::SIG_DFL | libc::SIG_IGN => {
                // SAFETY: plain data, zero is SIG_DFL with no flags; restoring the default is
                // async-signal-safe.
                let mut default: libc::sigaction = unsafe { std::mem::zeroed() };
                default.sa_sigaction = libc::SIG_DFL;
                // SAFETY: as above.
                unsafe { libc::sigaction(signal, &default, std::ptr::null_mut()) };
                if !raised {
                    // SAFETY: raise is async-signal-safe.
                    unsafe { libc::raise(signal) };
                }
            }
            _ if previous.flags.load(Ordering::Relaxed) & libc::SA_SIGINFO != 0 => {
                // SAFETY: the previous handler took three arguments (SA_SIGINFO).
                let handle: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(handler) };
                handle(signal, info, ctx);
            }
            _ => {
                // SAFETY: the previous handler took the signal alone.
                let handle: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
                handle(signal);
            }
        }
    }

    /// A guarded copy routine: (to, from, len) -> 0, or 1 if a fault stopped it.
    type Routine = unsafe extern "C" fn(*mut u8, *const u8, usize) -> u32;

    /// Runs `wide` where its 16-byte moves are atomic (`memory::bulk`'s `atomic_16`: AVX, on
    /// Intel or AMD), `narrow` elsewhere.
    ///
    /// # Safety
    ///
    /// As for the routines: `len` bytes at `to` writable and at `from` readable, the program's
    /// side lent memory (mapped or not), the other the caller's own.
    unsafe fn guarded(
        (narrow, wide): (Routine, Routine),
        to: *mut u8,
        from: *const u8,
        len: usize,
    ) -> Result<(), ()> {
        #[cfg(target_pointer_width = "64")]
        let routine = if super::super::bulk::atomic_16() {
            wide
        } else {
            narrow
        };
        #[cfg(not(target_pointer_width = "64"))]
        let routine = {
            let _ = wide;
            narrow
        };
        // SAFETY: per the contract; a fault in the routine returns 1 instead.
        match unsafe { routine(to, from, len) } {
            0 => Ok(()),
            _ => Err(()),
        }
    }

    /// Copies `len` bytes of the program's memory at `from` to `to`.
    ///
    /// # Safety
    ///
    /// `to` is `len` writable bytes of the caller's own; `from` is lent memory (mapped or not).
    pub(super) unsafe fn read(from: *const u8, to: *mut u8, len: usize) -> Result<(), ()> {
        let routines: (Routine, Routine) = (softroce_guarded_read, softroce_guarded_read_wide);
        // SAFETY: per the contract.
        unsafe { guarded(routines, to, from, len) }
    }

    /// Copies `len` bytes at `from` to the program's memory at `to`.
    ///
    /// # Safety
    ///
    /// `from` is `len` readable bytes of the caller's own; `to` is lent memory.
    pub(super) unsafe fn write(to: *mut u8, from: *const u8, len: usize) -> Result<(), ()> {
        let routines: (Routine, Routine) = (softroce_guarded_write, softroce_guarded_write_wide);
        // SAFETY: per the contract.
        unsafe { guarded(routines, to, from, len) }
    }

    /// The routines without the 16-byte step, `write` or read, as processors without the
    /// 16-byte guarantee run them: for the tests, whose processor may well have it.
    ///
    /// # Safety
    ///
    /// As for [`read`] and [`write`].
    #[cfg(test)]
    pub(super) unsafe fn narrow(
        write: bool,
        to: *mut u8,
        from: *const u8,
        len: usize,
    ) -> Result<(), ()> {
        let routine: Routine = if write {
            softroce_guarded_write
        } else {
            softroce_guarded_read
        };
        // SAFETY: per the contract.
        unsafe { guarded((routine, routine), to, from, len) }
    }

    /// A locked add on the program's 8-aligned word at `word`: the value before.
    ///
    /// # Safety
    ///
    /// `word` is 8-aligned lent memory.
    pub(super) unsafe fn fetch_add(word: *mut u64, add: u64) -> Result<u64, ()> {
        let mut before = 0;
        // SAFETY: per the contract; `before` is ours.
        match unsafe { softroce_guarded_fetch_add(word, add, &mut before) } {
            0 => Ok(before),
            _ => Err(()),
        }
    }

    /// A locked compare-and-swap on the program's 8-aligned word at `word`: the value before.
    ///
    /// # Safety
    ///
    /// As for [`fetch_add`].
    pub(super) unsafe fn compare_swap(word: *mut u64, compare: u64, swap: u64) -> Result<u64, ()> {
        let mut before = 0;
        // SAFETY: per the contract; `before` is ours.
        match unsafe { softroce_guarded_compare_swap(word, compare, swap, &mut before) } {
            0 => Ok(before),
            _ => Err(()),
        }
    }
}

/// The accesses, unguarded: atomic loads and stores through the pointer, which a fault kills.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(miri))))]
mod access {
    use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

    /// Nothing to install.
    pub(super) fn prepare() {}

    /// Whether a word of the program's memory starts at `at`, with 8 bytes left of `len`.
    fn whole_word(at: usize, left: usize) -> bool {
        at % 8 == 0 && left >= 8
    }

    /// As the guarded one: a byte at a time, a word at a time where whole words lie.
    ///
    /// # Safety
    ///
    /// `to` is `len` writable bytes of the caller's own; `from` is lent memory that stays
    /// mapped.
    pub(super) unsafe fn read(from: *const u8, to: *mut u8, len: usize) -> Result<(), ()> {
        let mut done = 0;
        while done < len {
            // SAFETY: inside both ranges; atomic accesses to the program's memory, which no
            // Rust reference names but this one, for the access alone.
            unsafe {
                let at = from.add(done).cast_mut();
                if whole_word(at as usize, len - done) {
                    let word = AtomicU64::from_ptr(at.cast()).load(Relaxed);
                    to.add(done)
                        .cast::<[u8; 8]>()
                        .write_unaligned(word.to_ne_bytes());
                    done += 8;
                } else {
                    to.add(done).write(AtomicU8::from_ptr(at).load(Relaxed));
                    done += 1;
                }
            }
        }
        Ok(())
    }

    /// As [`read`], the other way.
    ///
    /// # Safety
    ///
    /// `from` is `len` readable bytes of the caller's own; `to` is lent memory that stays
    /// mapped and writable.
    pub(super) unsafe fn write(to: *mut u8, from: *const u8, len: usize) -> Result<(), ()> {
        let mut done = 0;
        while done < len {
            // SAFETY: as in `read`.
            unsafe {
                let at = to.add(done);
                if whole_word(at as usize, len - done) {
                    let word = from.add(done).cast::<[u8; 8]>().read_unaligned();
                    AtomicU64::from_ptr(at.cast()).store(u64::from_ne_bytes(word), Relaxed);
                    done += 8;
                } else {
                    AtomicU8::from_ptr(at).store(from.add(done).read(), Relaxed);
                    done += 1;
                }
            }
        }
        Ok(())
    }

    /// # Safety
    ///
    /// `word` is 8-aligned lent memory that stays mapped and writable.
    pub(super) unsafe fn fetch_add(word: *mut u64, add: u64) -> Result<u64, ()> {
        // SAFETY: per the contract.
        Ok(unsafe { AtomicU64::from_ptr(word) }.fetch_add(add, Relaxed))
    }

    /// # Safety
    ///
    /// As for [`fetch_add`].
    pub(super) unsafe fn compare_swap(word: *mut u64, compare: u64, swap: u64) -> Result<u64, ()> {
        // SAFETY: per the contract.
        let word = unsafe { AtomicU64::from_ptr(word) };
        Ok(
            match word.compare_exchange(compare, swap, Relaxed, Relaxed) {
                Ok(before) | Err(before) => before,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alignment and length over a buffer with guard bytes either side: reads see what
    /// was written, and writes never touch a byte outside the range.
    #[test]
    fn bytes_outside_the_range_are_never_touched() {
        // Lengths past two of the wide routines' 64-byte steps, from every start in a
        // 16-byte line; under Miri, whose accesses are the unguarded ones and slow, less.
        let (starts, lens) = if cfg!(miri) {
            (8..16, 0..72)
        } else {
            (0..16, 0..200)
        };
        for start in starts {
            for len in lens.clone() {
                // A buffer for each range: the unguarded accesses (Miri's) take a byte as part
                // of a word or alone as the range has it, and Miri cannot follow one byte's
                // atomic accesses of two sizes.
                let mut buffer = vec![0xeeu8; 232];
                let base = buffer.as_mut_ptr();
                // SAFETY: the range lies inside `buffer`, which outlives `memory`, and is
                // reached only through `memory` meanwhile.
                let memory = unsafe { ForeignMemory::new(base.add(start), len) }.unwrap();
                let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
                memory.write(0, &data).unwrap();
                let mut back = vec![0; len];
                memory.read(0, &mut back).unwrap();
                assert_eq!(back, data);
                memory.write(0, &vec![0xee; len]).unwrap();
                assert!(buffer.iter().all(|&b| b == 0xee), "{start} {len}");
            }
        }
    }

    /// The routines without the 16-byte step, which processors without its guarantee run:
    /// every alignment and length reads and writes exactly its range.
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    #[test]
    fn the_narrow_routines_copy_exactly_their_range() {
        for start in 0..16 {
            for len in 0..200 {
                let mut program = vec![0xeeu8; 232];
                let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let mut back = vec![0u8; len];
                // SAFETY: both ranges lie inside buffers of this test, reached only here.
                unsafe {
                    let at = program.as_mut_ptr().add(start);
                    access::narrow(true, at, data.as_ptr(), len).unwrap();
                    access::narrow(false, back.as_mut_ptr(), at, len).unwrap();
                }
                assert_eq!(back, data, "{start} {len}");
                let outside = program[..start].iter().chain(&program[start + len..]);
                assert!(outside.into_iter().all(|&b| b == 0xee), "{start} {len}");
            }
        }
    }

    #[test]
    fn atomics_act_on_the_aligned_word() {
        let mut words = [0u64; 2];
        words[1] = 41;
        {
            // SAFETY: `words` outlives `memory`, and is reached only through it meanwhile.
            let memory = unsafe { ForeignMemory::new(words.as_mut_ptr().cast(), 16) }.unwrap();
            assert_eq!(memory.fetch_add(8, 1), Ok(41));
            assert_eq!(memory.compare_swap(8, 42, 7), Ok(42));
            assert_eq!(memory.compare_swap(8, 42, 9), Ok(7));
        }
        assert_eq!(words, [0, 7]);
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

    /// `pages` pages of fresh anonymous memory, readable and writable.
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    fn mapped(pages: usize) -> *mut u8 {
        // SAFETY: a new private anonymous mapping, touched by nothing else.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pages * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        at.cast()
    }

    /// Memory the program unmaps, or makes read-only, after lending it: each access fails with
    /// the address, where it used to kill the process with SIGSEGV, and the part still mapped
    /// works as before.
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    #[test]
    fn memory_taken_away_fails_each_access_and_kills_nothing() {
        let base = mapped(3);
        // SAFETY: our own mapping, lent to `memory` alone; its pages are taken away below, as
        // a program may take them.
        let memory = unsafe { ForeignMemory::new(base.add(100), 3 * 4096 - 100) }.unwrap();
        memory.write(0, &[7; 5000]).unwrap();
        // SAFETY: the middle page of our own mapping, and the last made read-only.
        unsafe {
            assert_eq!(libc::munmap(base.add(4096).cast(), 4096), 0);
            assert_eq!(
                libc::mprotect(base.add(8192).cast(), 4096, libc::PROT_READ),
                0
            );
        }
        let gone = MemoryError::Unmapped {
            addr: base as u64 + 100 + 3000,
        };
        let mut out = vec![0u8; 4000];
        assert_eq!(memory.read(3000, &mut out), Err(gone));
        assert_eq!(memory.write(3000, &out), Err(gone));
        let word = 4096 - 100 + 8;
        assert!(memory.fetch_add(word, 1).is_err());
        assert!(memory.compare_swap(word, 0, 1).is_err());
        let read_only = 8192 - 100;
        assert!(memory.write(read_only, &[1]).is_err(), "read-only now");
        let mut byte = [0u8];
        assert_eq!(memory.read(read_only + 1, &mut byte), Ok(()));
        assert_eq!(memory.read(10, &mut byte), Ok(()));
        assert_eq!(byte, [7], "the page still mapped is as it was");
        // SAFETY: the rest of our own mapping.
        unsafe {
            libc::munmap(base.cast(), 4096);
            libc::munmap(base.add(8192).cast(), 4096);
        }
    }

    /// What the child half of [`signals_that_are_not_ours_go_where_they_went_before`] does,
    /// named by its environment: installs the fault handler (a region), then meets a signal
    /// that is not the handler's.
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    fn child(mode: &str) -> ! {
        extern "C" fn program_handler(
            _: libc::c_int,
            _: *mut libc::siginfo_t,
            _: *mut libc::c_void,
        ) {
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(42) };
        }
        // What handles SIGSEGV before softroce: a program's own handler, or (rather than the
        // Rust runtime's, which this test binary has) the default action, as a C program has.
        // SAFETY: plain data; the handler is a function of this test.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            if mode == "chained" {
                action.sa_sigaction = program_handler as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO;
            } else {
                action.sa_sigaction = libc::SIG_DFL;
            }
            libc::sigaction(libc::SIGSEGV, &action, std::ptr::null_mut());
        }
        let mut byte = 0u8;
        // SAFETY: our own byte, lent to `memory` alone.
        let memory = unsafe { ForeignMemory::new(&mut byte, 1) }.unwrap();
        memory.write(0, &[1]).unwrap();
        if mode == "sent" {
            // A SIGSEGV sent, not raised by a fault: the default action, which kills.
            // SAFETY: raise takes a signal number.
            unsafe { libc::raise(libc::SIGSEGV) };
        } else {
            // SAFETY: deliberately not: a write to an address nothing maps, outside the guarded
            // routines, which must reach the program's handler or kill this child.
            unsafe { std::ptr::without_provenance_mut::<u8>(8).write_volatile(1) };
        }
        // SAFETY: _exit takes a status.
        unsafe { libc::_exit(0) }
    }

    /// Signals that are not the handler's go where they went before it: a fault outside the
    /// guarded routines kills the process as it would have, or reaches the program's own
    /// handler installed before; a SIGSEGV sent by `raise` kills too. Each in a child process
    /// (this test binary again).
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    #[test]
    fn signals_that_are_not_ours_go_where_they_went_before() {
        use std::os::unix::process::ExitStatusExt;
        const CHILD: &str = "SOFTROCE_TEST_SIGNAL_CHILD";
        if let Ok(mode) = std::env::var(CHILD) {
            child(&mode);
        }
        for (mode, signal, code) in [
            ("fault", Some(libc::SIGSEGV), None),
            ("sent", Some(libc::SIGSEGV), None),
            ("chained", None, Some(42)),
        ] {
            let status = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "memory::foreign::tests::signals_that_are_not_ours_go_where_they_went_before",
                ])
                .env(CHILD, mode)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            assert_eq!(
                (status.signal(), status.code()),
                (signal, code),
                "{mode}: {status}"
            );
        }
    }
}
