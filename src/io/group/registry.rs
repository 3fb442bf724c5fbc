//! The record the members of an address group keep together: a small file in `/dev/shm`,
//! mapped by each, and locks on its bytes.
//!
//! Who is alive is what the kernel says, not what the file says: a member holds an
//! open-file-description lock (`F_OFD_SETLK`) on its place's byte for as long as it lives, and
//! the kernel lets go of it when the process ends, however it ends. The group lock, on byte 0,
//! is taken the same way around every change (`F_OFD_SETLKW`, which sleeps until it is free),
//! so a process killed while holding it stops nobody.
//!
//! The file holds, for each of the [`PLACES`] places (one socket of the group each):
//! its generation, counted up each time a member takes it; and the QP numbers its members hold,
//! one bit per number, so that a member never draws a number a member before it held when it
//! died (a peer may still send to it). Then the RDMA-CM ports bound on the address, each with
//! the place and generation of its holder: a port whose holder is gone is free. It is read and
//! written with `pread` and `pwrite`: the shared words under the group lock, a place's ledger
//! by its member alone, which keeps a copy and writes each word it changes.

use std::fs::{File, OpenOptions};
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::sync::{Mutex, MutexGuard};

use nix::fcntl::{fcntl, FcntlArg};
use nix::libc;

/// How long a process waits for the group lock before it gives up.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Places in a group: one socket each, steered to by a QP number's low byte.
pub const PLACES: usize = 256;
/// RDMA-CM ports one address may have bound at once, over all its members: as many as the
/// group's program routes (`steering::MAX_ROUTED_PORTS`).
pub const MAX_PORTS: usize = 2000;

/// The file's first word, and its layout's version in the second.
const MAGIC: u32 = 0x5352_4731; // "SRG1"
const VERSION: u32 = 1;

/// Bits of a place's QP number ledger: one per value of a number's top 16 bits.
pub const LEDGER_WORDS: usize = (1 << 16) / 64;

/// The file's layout, in bytes from its start.
mod layout {
    use super::{LEDGER_WORDS, MAX_PORTS, PLACES};
    pub const MAGIC: u64 = 0;
    pub const VERSION: u64 = 4;
    /// How many places the group's sockets fill: the next socket bound takes this one.
    pub const MADE: u64 = 8;
    pub const GENERATIONS: u64 = 64;
    /// Pairs of words: the port's key (its port space and number), and its holder.
    pub const PORTS: u64 = GENERATIONS + 4 * PLACES as u64;
    pub const LEDGERS: u64 = PORTS + 8 * MAX_PORTS as u64;
    pub const BYTES: u64 = LEDGERS + (PLACES * LEDGER_WORDS * 8) as u64;
}

/// The group's record.
#[derive(Debug)]
pub struct Registry {
    file: File,
    path: String,
    /// Held with the group lock: a byte lock of one open file does not keep out the threads
    /// that share it.
    threads: Mutex<()>,
}

/// The group lock, let go of when dropped.
#[derive(Debug)]
pub struct GroupLock<'a> {
    registry: &'a Registry,
    _threads: MutexGuard<'a, ()>,
}

impl Drop for GroupLock<'_> {
    fn drop(&mut self) {
        let _ = self.registry.set_lock(0, libc::F_UNLCK);
    }
}

/// The byte a place's member locks, after the group lock's byte 0.
fn place_byte(place: u8) -> i64 {
    1 + i64::from(place)
}

impl Registry {
    /// Opens (creating it, readable by this user only) the record of `address`'s group for this
    /// user and network namespace. A file of that name that is not this user's own is refused:
    /// another user could otherwise plant one.
    pub fn open(address: IpAddr) -> io::Result<Registry> {
        let uid = nix::unistd::geteuid().as_raw();
        // UDP ports belong to a network namespace (this thread's: a thread may have entered
        // another): so does the group.
        let netns = std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |m| m.ino());
        // /dev/shm is memory; a system without it keeps the record in the temporary directory,
        // which then must be one for every process on the address.
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            std::path::PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let path = dir
            .join(format!("softroce-{uid}-{netns}-{address}"))
            .to_string_lossy()
            .into_owned();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("opening {path}: {e}")))?;
        let meta = file.metadata()?;
        if meta.uid() != uid || meta.mode() & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{path} is not this user's alone: remove it"),
            ));
        }
        if meta.len() < layout::BYTES {
            file.set_len(layout::BYTES)?;
        }
        Ok(Registry {
            file,
            path,
            threads: Mutex::new(()),
        })
    }

    /// Whether the file opened is still the one at its path: the last member to leave removes
    /// it, and a process that opened it just before must open the new one.
    pub fn is_linked(&self) -> io::Result<bool> {
        let opened = self.file.metadata()?;
        match std::fs::symlink_metadata(&self.path) {
            Ok(linked) => Ok(linked.ino() == opened.ino() && linked.dev() == opened.dev()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether a member other than the one of `place` (of this open) is alive; true when that
    /// cannot be read.
    pub fn others_alive(&self, place: Option<u8>) -> bool {
        let made = self.made().unwrap_or(PLACES).min(PLACES);
        (0..made)
            .map(|p| p as u8)
            .any(|p| Some(p) != place && self.held_by_another(p).unwrap_or(true))
    }

    /// Removes the file, as the group's last member leaves (with the group lock held).
    pub fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }

    fn read(&self, at: u64) -> io::Result<u32> {
        let mut word = [0u8; 4];
        self.file.read_exact_at(&mut word, at)?;
        Ok(u32::from_ne_bytes(word))
    }

    fn write(&self, at: u64, value: u32) -> io::Result<()> {
        self.file.write_all_at(&value.to_ne_bytes(), at)
    }

    /// Takes the group lock, sleeping until it is free: against other processes (the byte
    /// lock) and against this member's other threads (which share the byte lock's file).
    /// Gives up after [`LOCK_WAIT`]: a process stopped while it holds the lock (in a debugger,
    /// by SIGSTOP) must not hang every other process's open, listen and close for ever.
    pub fn lock_group(&self) -> io::Result<GroupLock<'_>> {
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        let mut pause = std::time::Duration::from_micros(100);
        loop {
            match self.set_lock(0, libc::F_WRLCK) {
                Ok(()) => break,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.raw_os_error() == Some(libc::EACCES) =>
                {
                    if std::time::Instant::now() >= deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "the group of processes on this address did not let this one in \
                                 within {LOCK_WAIT:?}: one of them holds {} locked (is it \
                                 stopped?)",
                                self.path
                            ),
                        ));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(GroupLock {
            registry: self,
            _threads: threads,
        })
    }

    /// Holds `place` for this member, for as long as it lives (or until `leave_place`).
    pub fn hold_place(&self, place: u8) -> io::Result<()> {
        self.set_lock(place_byte(place), libc::F_WRLCK)
    }

    /// Lets go of `place`.
    pub fn leave_place(&self, place: u8) -> io::Result<()> {
        self.set_lock(place_byte(place), libc::F_UNLCK)
    }

    /// Whether another member (another open of this file, in this process or another) holds
    /// `place`.
    pub fn held_by_another(&self, place: u8) -> io::Result<bool> {
        let mut lock = flock(place_byte(place), libc::F_WRLCK);
        fcntl(&self.file, FcntlArg::F_OFD_GETLK(&mut lock))?;
        Ok(i32::from(lock.l_type) != libc::F_UNLCK)
    }

    fn set_lock(&self, byte: i64, kind: i32) -> io::Result<()> {
        let lock = flock(byte, kind);
        loop {
            match fcntl(&self.file, FcntlArg::F_OFD_SETLK(&lock)) {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Makes the record of a group that has no member yet: no place is made, no port bound,
    /// and no QP number held. (A fresh file reads so; one of an earlier group is cleared.)
    pub fn reset(&self) -> io::Result<()> {
        self.file.set_len(0)?;
        self.file.set_len(layout::BYTES)?;
        self.write(layout::MAGIC, MAGIC)?;
        self.write(layout::VERSION, VERSION)
    }

    /// Whether the file holds a record of this layout (a fresh one is all zeros).
    pub fn is_current(&self) -> io::Result<bool> {
        Ok(self.read(layout::MAGIC)? == MAGIC && self.read(layout::VERSION)? == VERSION)
    }

    /// How many places the group's sockets fill.
    pub fn made(&self) -> io::Result<usize> {
        Ok(self.read(layout::MADE)? as usize)
    }

    pub fn set_made(&self, made: usize) -> io::Result<()> {
        self.write(layout::MADE, made as u32)
    }

    fn generation_at(place: u8) -> u64 {
        layout::GENERATIONS + 4 * u64::from(place)
    }

    /// The generation of `place`'s member.
    pub fn generation(&self, place: u8) -> io::Result<u32> {
        self.read(Self::generation_at(place))
    }

    /// Counts a new member of `place`, and returns its generation.
    pub fn next_generation(&self, place: u8) -> io::Result<u32> {
        // Generation 0 names nobody: a port entry's holder is never 0.
        let next = ((self.generation(place)? + 1) & 0x00ff_ffff).max(1);
        self.write(Self::generation_at(place), next)?;
        Ok(next)
    }

    /// The ports table's entries: (index, key, holder), a key of 0 an empty entry.
    pub fn ports(&self) -> io::Result<Vec<(usize, u32, u32)>> {
        let mut table = vec![0u8; 8 * MAX_PORTS];
        self.file.read_exact_at(&mut table, layout::PORTS)?;
        Ok(table
            .chunks_exact(8)
            .enumerate()
            .map(|(i, entry)| {
                let word = |at: usize| {
                    u32::from_ne_bytes([entry[at], entry[at + 1], entry[at + 2], entry[at + 3]])
                };
                (i, word(0), word(4))
            })
            .collect())
    }

    /// Writes entry `index` of the ports table.
    pub fn set_port(&self, index: usize, key: u32, holder: u32) -> io::Result<()> {
        let mut entry = [0u8; 8];
        entry[..4].copy_from_slice(&key.to_ne_bytes());
        entry[4..].copy_from_slice(&holder.to_ne_bytes());
        self.file
            .write_all_at(&entry, layout::PORTS + 8 * index as u64)
    }

    /// `place`'s QP number ledger: bit N of word N / 64 set if a member holds, or held when it
    /// ended, a number whose top 16 bits are N.
    pub fn ledger(&self, place: u8) -> io::Result<Vec<u64>> {
        let mut bytes = vec![0u8; LEDGER_WORDS * 8];
        self.file
            .read_exact_at(&mut bytes, Self::ledger_at(place, 0))?;
        Ok(bytes
            .chunks_exact(8)
            .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or_default()))
            .collect())
    }

    /// Writes word `index` of `place`'s ledger.
    pub fn set_ledger_word(&self, place: u8, index: usize, word: u64) -> io::Result<()> {
        self.file
            .write_all_at(&word.to_ne_bytes(), Self::ledger_at(place, index))
    }

    fn ledger_at(place: u8, index: usize) -> u64 {
        layout::LEDGERS + ((usize::from(place) * LEDGER_WORDS + index) * 8) as u64
    }
}

/// A lock of one byte at `byte`.
fn flock(byte: i64, kind: i32) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: byte,
        l_len: 1,
        l_pid: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two opens of one record, as two processes hold it: a place one holds, the other sees
    /// held, until it lets go or its file closes (as when its process ends).
    #[test]
    fn a_place_is_held_while_its_holder_lives() {
        let address: IpAddr = "127.0.12.1".parse().unwrap();
        let (a, b) = (
            Registry::open(address).unwrap(),
            Registry::open(address).unwrap(),
        );
        {
            let _group = a.lock_group().unwrap();
            a.reset().unwrap();
            a.set_made(3).unwrap();
        }
        a.hold_place(2).unwrap();
        assert!(b.held_by_another(2).unwrap());
        assert!(!b.held_by_another(1).unwrap());
        assert!(
            !a.held_by_another(2).unwrap(),
            "a holder does not conflict with itself"
        );
        assert!(b.others_alive(None));
        assert!(!b.others_alive(Some(2)));
        drop(a);
        assert!(!b.held_by_another(2).unwrap(), "gone with its file");
        b.unlink();
        assert!(!b.is_linked().unwrap());
    }

    #[test]
    fn the_record_keeps_generations_ports_and_ledgers_until_reset() {
        let registry = Registry::open("127.0.12.2".parse().unwrap()).unwrap();
        let _group = registry.lock_group().unwrap();
        registry.reset().unwrap();
        assert!(registry.is_current().unwrap());
        assert_eq!(registry.next_generation(7).unwrap(), 1);
        assert_eq!(registry.next_generation(7).unwrap(), 2);
        assert_eq!(registry.generation(7).unwrap(), 2);
        registry
            .set_port(MAX_PORTS - 1, 0x0106_1c06, 0x207)
            .unwrap();
        assert_eq!(
            registry.ports().unwrap()[MAX_PORTS - 1],
            (MAX_PORTS - 1, 0x0106_1c06, 0x207)
        );
        registry
            .set_ledger_word(255, LEDGER_WORDS - 1, 1 << 63)
            .unwrap();
        assert_eq!(registry.ledger(255).unwrap()[LEDGER_WORDS - 1], 1 << 63);
        registry.reset().unwrap();
        assert_eq!(registry.generation(7).unwrap(), 0);
        assert_eq!(
            registry.ports().unwrap()[MAX_PORTS - 1],
            (MAX_PORTS - 1, 0, 0)
        );
        assert!(registry.ledger(255).unwrap().iter().all(|w| *w == 0));
        registry.unlink();
    }
}
