//! What the kernel's pin checks of memory a program registers, checked here: every page of the
//! range mapped, readable, and writable if the region grants any write (rdma-core's
//! `ibv_reg_mr` fails with `EFAULT` otherwise, as `ib_umem_get` cannot pin such pages).
//!
//! softroce reaches the memory itself, as the program does, so memory it accepted but that was
//! read-only or unmapped would turn a peer's WRITE (or READ) into a segmentation fault on
//! whichever thread runs the engine. The check is one `madvise(MADV_POPULATE_READ)` or
//! `MADV_POPULATE_WRITE` over the range's pages (Linux 5.14): it faults the pages in, as the
//! kernel's pin does (for write, breaking copy-on-write sharing), and fails for a page that is
//! not mapped, not readable, or not writable when asked to write. On an older kernel, which
//! does not know the advice, the process's map (`/proc/self/maps`) is read instead: it says
//! what is mapped and with which rights, but faults nothing in.
//!
//! Memory unmapped, or made read-only, after its registration is not seen here: see
//! `softroce::memory::ForeignMemory` for what a peer's access to it does.

use std::sync::OnceLock;

use libc::c_int;

/// `MADV_POPULATE_READ` and `MADV_POPULATE_WRITE` (Linux 5.14), which the libc crate may not
/// name on every target.
const MADV_POPULATE_READ: c_int = 22;
const MADV_POPULATE_WRITE: c_int = 23;

/// Checks that the `len` bytes at `addr` are mapped and readable, and writable if `writable`;
/// `EFAULT` if not, as rdma-core's `ibv_reg_mr` answers. Nothing to check for no bytes.
pub(crate) fn check(addr: usize, len: usize, writable: bool) -> Result<(), c_int> {
    if len == 0 {
        return Ok(());
    }
    let page = page_size();
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len)
        .and_then(|end| end.checked_next_multiple_of(page))
        .ok_or(libc::EFAULT)?;
    if populate_known() {
        populate(start, end - start, writable)
    } else {
        let maps = std::fs::read_to_string("/proc/self/maps").map_err(|_| libc::EFAULT)?;
        if covers(&maps, start, end, writable) {
            Ok(())
        } else {
            Err(libc::EFAULT)
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf takes a constant and returns a number.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|s| s.is_power_of_two())
        .unwrap_or(4096)
}

/// Faults the pages in for read, or write: 0, or `EFAULT` for any page that cannot be.
fn populate(start: usize, len: usize, writable: bool) -> Result<(), c_int> {
    let advice = if writable {
        MADV_POPULATE_WRITE
    } else {
        MADV_POPULATE_READ
    };
    loop {
        // SAFETY: madvise with a populating advice reads and writes no memory of ours: it
        // faults in the program's own pages in the range, as the program's own access would,
        // and fails for those it cannot (ENOMEM where nothing is mapped, EINVAL where the
        // mapping's rights forbid the access, EFAULT where it would raise SIGBUS).
        let done = unsafe { libc::madvise(start as *mut libc::c_void, len, advice) };
        if done == 0 {
            return Ok(());
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR | libc::EAGAIN) => continue,
            _ => return Err(libc::EFAULT),
        }
    }
}

/// Whether the kernel knows `MADV_POPULATE_READ`: asked once, of a page that is surely mapped
/// and readable (this function's own code), where only an unknown advice can fail.
fn populate_known() -> bool {
    static KNOWN: OnceLock<bool> = OnceLock::new();
    *KNOWN.get_or_init(|| {
        let here = populate_known as *const () as usize;
        let page = page_size();
        populate(here & !(page - 1), page, false).is_ok()
    })
}

/// Whether the map of a process (`/proc/<pid>/maps`'s text) covers `start..end` with mappings
/// that are readable, and writable if `writable`, with no gap between them.
fn covers(maps: &str, start: usize, end: usize, writable: bool) -> bool {
    let mut reached = start;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(rights)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((from, to)) = range.split_once('-') else {
            continue;
        };
        let (Ok(from), Ok(to)) = (
            usize::from_str_radix(from, 16),
            usize::from_str_radix(to, 16),
        ) else {
            continue;
        };
        if to <= reached {
            continue;
        }
        let rights = rights.as_bytes();
        let allowed = rights.first() == Some(&b'r') && (!writable || rights.get(1) == Some(&b'w'));
        if from > reached || !allowed {
            return false;
        }
        reached = to;
        if reached >= end {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pages` pages of fresh anonymous memory with `prot`.
    fn mapped(pages: usize, prot: c_int) -> usize {
        // SAFETY: a new private anonymous mapping, touched by nothing else.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pages * page_size(),
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        at as usize
    }

    /// What the kernel's pin refuses is refused, by the populating advice or the map alike:
    /// a read-only page for a writable region, a page with no rights, and a range with a page
    /// unmapped in it.
    #[test]
    fn memory_the_kernel_would_not_pin_is_refused() {
        let page = page_size();
        let writable = mapped(4, libc::PROT_READ | libc::PROT_WRITE);
        let read_only = mapped(2, libc::PROT_READ);
        let no_rights = mapped(1, libc::PROT_NONE);
        let holed = mapped(3, libc::PROT_READ | libc::PROT_WRITE);
        // SAFETY: the middle page of our own mapping, which nothing uses.
        assert_eq!(unsafe { libc::munmap((holed + page) as *mut _, page) }, 0);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let cases = [
            (writable + 100, 3 * page, true, true),
            (read_only, 2 * page, false, true),
            (read_only + 10, 10, true, false),
            (no_rights, 1, false, false),
            (holed, 3 * page, false, false),
            (holed + 2 * page, page, true, true),
        ];
        for (addr, len, write, ok) in cases {
            assert_eq!(
                check(addr, len, write).is_ok(),
                ok,
                "{addr:#x}+{len} w{write}"
            );
            let (start, end) = (addr & !(page - 1), (addr + len).next_multiple_of(page));
            assert_eq!(
                covers(&maps, start, end, write),
                ok,
                "{addr:#x}+{len} w{write}"
            );
        }
        assert_eq!(check(usize::MAX - 3, 8, false), Err(libc::EFAULT), "wraps");
        assert_eq!(check(0, 0, true), Ok(()), "no bytes");
    }

    #[test]
    fn the_map_must_cover_the_range_without_a_gap() {
        let maps = "1000-3000 rw-p 00000000 00:00 0\n\
                    3000-4000 r--p 00000000 00:00 0 [stack]\n\
                    5000-6000 rw-p 00000000 00:00 0\n";
        assert!(covers(maps, 0x1000, 0x4000, false));
        assert!(!covers(maps, 0x1000, 0x4000, true), "a read-only part");
        assert!(covers(maps, 0x2000, 0x3000, true));
        assert!(!covers(maps, 0x3000, 0x6000, false), "a gap");
        assert!(!covers(maps, 0x6000, 0x7000, false), "past every mapping");
        assert!(!covers("garbage\n", 0x1000, 0x2000, false));
    }
}
