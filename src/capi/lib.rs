//! softroce as `libibverbs.so.1` and `librdmacm.so.1`: the verbs and RDMA-CM calls of
//! rdma-core's ABI (Debian 12's rdma-core 44, and every release since), over softroce's
//! [`Device`](softroce::verbs::Device), so that an unmodified, dynamically linked RDMA program
//! runs over softroce with no NIC and no kernel module.
//!
//! The shared object is the `softroce-rdma` target (`main.rs`, linked by `build.rs` with
//! rdma-core's symbol versions from `rdma.map`); `<profile>/rdma/` holds it under both names.
//!
//! # The C boundary
//!
//! Every exported function is `unsafe extern "C"`, in the module of its verbs, and:
//!
//! - checks each pointer it is given for null before it uses it, and answers null as rdma-core
//!   does (`EINVAL`, or the verb's own error value);
//! - runs its body under `guard`, so that a panic never unwinds into C: the call returns its
//!   error value with `errno` set to `EIO` instead; the calls that wait for an event are
//!   `extern "C-unwind"` and run theirs in slices, each under `guard`, so that a cancellation
//!   of the waiting thread unwinds through nothing of the library's (`blocking`);
//! - reaches softroce's objects only through the structures it handed out (`abi`), each of which
//!   begins with the rdma-core structure the program sees, so that the program's pointer is
//!   also a pointer to softroce's object (the way rdma-core's providers embed theirs).
//!
//! What softroce lacks answers `EOPNOTSUPP`, with one line on standard error the first time
//! (`unsupported`). Every line the library prints goes through `say!`, which never fails: a
//! program may have closed standard error, or made it a pipe whose reader has gone.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod abi;
mod blocking;
mod cm;
mod comp_channel;
mod config;
mod cq;
mod cq_ex;
mod devices;
mod fork;
mod gid;
mod held;
mod import;
mod mapping;
mod marshall;
mod memory;
mod post;
mod provider;
mod qp;
mod qp_ex;
mod section;
mod signals;
mod strings;
mod users;
pub mod verbs_1_0;

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use libc::c_int;

pub use config::{Addresses, ADDR_VAR};

/// Writes `softroce: ` and the line to standard error, in one write, and ignores a failure:
/// `eprintln!` panics when the write fails (a program that closed standard error, or whose
/// standard error is a pipe with no reader and that ignores SIGPIPE), and the library's lines
/// are never worth a program's call.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say_line(format_args!($($arg)*))
    };
}
pub(crate) use say;

/// Gives each function, defined in the module that calls this, the name of a symbol at an
/// older version node, not the default (the assembler's `.symver`): `at_version!("IBVERBS_1.0";
/// ibv_open_device_1_0 => "ibv_open_device")` is what a program linked with libibverbs 1.0
/// binds as `ibv_open_device@IBVERBS_1.0`. The directive must be in the object that defines
/// the function, so each module names its own; `rdma.map` names the symbol in that node too
/// (a versioned name is exported only if its node names it).
macro_rules! at_version {
    ($version:literal; $($function:ident => $symbol:literal),* $(,)?) => {
        std::arch::global_asm!(
            $(concat!(".symver ", stringify!($function), ", ", $symbol, "@", $version)),*
        );
    };
}
pub(crate) use at_version;

/// What [`say!`] expands to.
pub(crate) fn say_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let text = format!("softroce: {line}\n");
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(value: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's `errno`, valid for the thread's
    // life.
    unsafe { *libc::__errno_location() = value }
}

/// Runs `body`, the whole of an exported function; if it panics (a bug in softroce), returns
/// `failed` with `errno` set to `EIO` instead of unwinding into the C caller. The thread's
/// cancellation is disabled meanwhile: the engine's turns that a call runs, a doorbell's ring
/// and the library's files make system calls that are glibc's cancellation points, and a
/// cancellation pending would unwind from one through the library's frames, which it may not
/// (`blocking`). rdma-core's calls are no cancellation points either, but for their waits
/// for an event, which `blocking` lets be cancelled.
pub(crate) fn guard<T>(failed: T, body: impl FnOnce() -> T) -> T {
    let program = blocking::cancel_state(blocking::PTHREAD_CANCEL_DISABLE);
    let result = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(_) => {
            set_errno(libc::EIO);
            failed
        }
    };
    blocking::cancel_state(program);
    result
}

/// Says once per verb, on standard error, that softroce does not provide it; the caller then
/// answers `EOPNOTSUPP`.
pub(crate) fn unsupported(verb: &str) -> c_int {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if said
        .get_or_insert_with(HashSet::new)
        .insert(verb.to_string())
    {
        say!("{verb} is not supported (EOPNOTSUPP)");
    }
    libc::EOPNOTSUPP
}

/// Reports an error of softroce's own on standard error, in one line, for a call whose C
/// interface has only an errno to say it with; returns that errno.
pub(crate) fn report(verb: &str, errno: c_int, why: impl std::fmt::Display) -> c_int {
    say!("{verb}: {why}");
    errno
}

/// The `errno` rdma-core gives where softroce refuses a verb for `e`'s reason.
pub(crate) fn errno_of(e: &softroce::verbs::Error) -> c_int {
    use softroce::memory::MemoryError;
    use softroce::transport::VerbsError;
    use softroce::verbs::Error;
    let memory = |m: &MemoryError| match m {
        MemoryError::NoMemory { .. } | MemoryError::OutOfKeys => libc::ENOMEM,
        MemoryError::WindowsBound { .. } => libc::EBUSY,
        _ => libc::EINVAL,
    };
    match e {
        Error::Io(io) => io.raw_os_error().unwrap_or(libc::EIO),
        Error::Memory(m) | Error::Verbs(VerbsError::Memory(m)) => memory(m),
        Error::QueueFull { .. } | Error::Verbs(VerbsError::QueueFull) => libc::ENOMEM,
        Error::Verbs(VerbsError::OutOfResources(_)) => libc::ENOMEM,
        Error::Verbs(_) => libc::EINVAL,
        Error::DeviceClosed | Error::DeviceFailed(_) => libc::EIO,
        Error::Cm(_) | Error::ConnectFailed { .. } | Error::Disconnected | Error::Unresolved(_) => {
            libc::EINVAL
        }
    }
}
