//! `softroce run`'s private view of `/dev/infiniband`: the nodes a program looks for before it
//! opens an RDMA device.
//!
//! rdma-core's `ibv_open_device` opens `/dev/infiniband/uverbsN`; softroce's does not need it,
//! but some programs check for it first. UCX keeps a device only if
//! `/dev/infiniband/<ibv_device.dev_name>` is a character device it may read and write (else
//! "network device 'softroce0:1' is not available"). A host with no RDMA has no such node, and
//! making one needs root and touches the whole host. So the program gets a mount namespace of
//! its own, in which `/dev` is a copy of the host's (each entry bind-mounted, so every device,
//! `/dev/shm` and `/dev/pts` are the host's own) plus `/dev/infiniband/uverbsN` and
//! `rdma_cm`, each a bind of `/dev/null`: a character device anyone may open, which nothing
//! reads or writes, since softroce's library never opens it. Nothing outside the namespace
//! changes; the namespace ends with the program.
//!
//! Root gets a mount namespace directly. Anyone else gets it inside a user namespace that maps
//! their own user and group to themselves, so the program runs as who ran it, with no
//! privilege (a user namespace's capabilities are dropped at `exec` for a non-root user).
//! Where neither is allowed (a container whose seccomp profile refuses `unshare`), or the copy
//! fails halfway (undone: the host's `/dev` shows again), the program runs with the host's
//! `/dev` and [`give_device_nodes`] says why; only a user namespace whose user could not be
//! mapped stops the program ([`ViewError::fatal`]).
//!
//! The copy's limits: `/dev` is the host's as it was at the start (a node made later does not
//! show); `/dev/ptmx` is a new node as root, and in a user namespace a link to `pts/ptmx`,
//! which works only where the host's `devpts` lets users open it (`ptmxmode`; Debian's does
//! not: new pseudo-terminals then fail, as README says); a bind of the host's
//! `ptmx` would not work at all, since the kernel finds a `ptmx`'s `devpts` beside it. Mounts
//! the host makes later still reach the program (the namespace is a slave of the host's).

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{symlink, FileTypeExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};
use nix::unistd::{getgid, getuid};

/// Where rdma-core's programs look for a device's nodes.
const DEV_INFINIBAND: &str = "/dev/infiniband";

/// Why a program could not be given its own `/dev/infiniband`.
#[derive(Debug)]
pub struct ViewError {
    /// What was being done.
    step: String,
    /// The system's answer.
    error: io::Error,
    /// Whether the process is left unfit to run the program: in a user namespace whose user
    /// could not be mapped, where it would run as nobody.
    pub fatal: bool,
}

impl std::fmt::Display for ViewError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step, self.error)
    }
}

impl std::error::Error for ViewError {}

fn step<T>(
    step: impl FnOnce() -> String,
    result: Result<T, impl Into<io::Error>>,
) -> Result<T, ViewError> {
    result.map_err(|error| ViewError {
        step: step(),
        error: error.into(),
        fatal: false,
    })
}

/// The nodes device `index` of softroce's library is found by: `ibv_device.dev_name` is
/// `uverbs<index>`.
fn node_names(devices: usize) -> impl Iterator<Item = String> {
    (0..devices)
        .map(|index| format!("uverbs{index}"))
        .chain(std::iter::once("rdma_cm".to_owned()))
}

/// Whether every node the program may look for is already a character device (a host with
/// RDMA hardware or rxe has them): then the program needs no view of its own.
fn host_has_nodes(devices: usize) -> bool {
    node_names(devices).all(|name| {
        fs::metadata(Path::new(DEV_INFINIBAND).join(name))
            .is_ok_and(|meta| meta.file_type().is_char_device())
    })
}

/// Gives this process, and the program it is about to become, `/dev/infiniband/uverbs0` to
/// `uverbs<devices - 1>` and `rdma_cm`, in a mount namespace of its own, unless the host has
/// them. Returns whether it made them. Call it while the process has one thread.
pub fn give_device_nodes(devices: usize) -> Result<bool, ViewError> {
    if host_has_nodes(devices) {
        return Ok(false);
    }
    let in_user_namespace = enter_mount_namespace()?;
    // Mounts made from here on stay in this namespace; the host's later ones still come in.
    step(
        || "making this mount namespace a slave of the host's".into(),
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_SLAVE,
            None::<&str>,
        ),
    )?;
    let dev = Path::new("/dev");
    // The host's /dev, as it is before a tmpfs covers it: its entries are bound from here.
    let host_dev = step(|| "opening /dev".into(), File::open(dev))?;
    let host_path = PathBuf::from(format!("/proc/self/fd/{}", host_dev.as_raw_fd()));
    let infiniband = Path::new(DEV_INFINIBAND);
    let covered = if infiniband.is_dir() { infiniband } else { dev };
    let made = cover_with_copy(covered, &host_path, in_user_namespace).and_then(|()| {
        if !infiniband.is_dir() {
            step(
                || format!("creating {DEV_INFINIBAND}"),
                fs::create_dir(infiniband),
            )?;
        }
        let null = host_path.join("null");
        for name in node_names(devices) {
            let node = infiniband.join(name);
            if !node.exists() {
                bind(&null, &node, false)?;
            }
        }
        Ok(())
    });
    match made {
        Ok(()) => Ok(true),
        Err(why) => {
            // Undone: the tmpfs goes, with every bind under it, and the host's /dev shows
            // again, in this namespace.
            let _ = umount2(covered, MntFlags::MNT_DETACH);
            Err(why)
        }
    }
}

/// Enters a mount namespace of this process's own: directly where it may (root), else inside
/// a user namespace that maps its user and group to themselves. Returns whether it is in a
/// user namespace.
fn enter_mount_namespace() -> Result<bool, ViewError> {
    match unshare(CloneFlags::CLONE_NEWNS) {
        Ok(()) => return Ok(false),
        Err(Errno::EPERM) => {}
        Err(error) => return step(|| "making a mount namespace".into(), Err(error)),
    }
    let (uid, gid) = (getuid(), getgid());
    step(
        || "making a user and mount namespace".into(),
        unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS),
    )?;
    // A user namespace's gid_map may be written only after setgroups is denied (user_namespaces(7)).
    for (file, line) in [
        ("/proc/self/setgroups", "deny".to_owned()),
        ("/proc/self/uid_map", format!("{uid} {uid} 1")),
        ("/proc/self/gid_map", format!("{gid} {gid} 1")),
    ] {
        // The user namespace cannot be left: unmapped, the program would run as nobody.
        step(|| format!("writing {file}"), fs::write(file, line)).map_err(|mut why| {
            why.fatal = true;
            why
        })?;
    }
    Ok(true)
}

/// Mounts a tmpfs on `dir` and fills it with `original`'s entries: each directory, device,
/// socket and file bind-mounted from there (with the mounts below it), each symbolic link made
/// again with its target, and `ptmx` made anew ([`pseudo_terminal_multiplexer`]).
fn cover_with_copy(dir: &Path, original: &Path, in_user_namespace: bool) -> Result<(), ViewError> {
    let entries: Vec<fs::DirEntry> = step(
        || format!("reading {}", dir.display()),
        fs::read_dir(dir).and_then(|list| list.collect::<io::Result<Vec<_>>>()),
    )?;
    step(
        || format!("mounting a tmpfs on {}", dir.display()),
        mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("mode=0755"),
        ),
    )?;
    for entry in entries {
        let name = entry.file_name();
        let (from, to) = (original.join(&name), dir.join(&name));
        let kind = step(|| format!("reading {}", to.display()), entry.file_type())?;
        if name == "ptmx" && dir == Path::new("/dev") {
            pseudo_terminal_multiplexer(&to, in_user_namespace)?;
        } else if kind.is_symlink() {
            let target = step(
                || format!("reading {}", from.display()),
                fs::read_link(&from),
            )?;
            step(|| format!("linking {}", to.display()), symlink(target, &to))?;
        } else {
            bind(&from, &to, kind.is_dir())?;
        }
    }
    Ok(())
}

/// `/dev/ptmx` at `to`: the kernel finds the `devpts` of a `ptmx` beside it, in its own mount,
/// so a bind of the host's fails (ENOENT). Root makes the node (5, 2) in the tmpfs, which
/// finds the bound `/dev/pts`; in a user namespace, where nodes cannot be made, a link to
/// `pts/ptmx`, which opens only where the host's `devpts` allows users to.
fn pseudo_terminal_multiplexer(to: &Path, in_user_namespace: bool) -> Result<(), ViewError> {
    if in_user_namespace {
        return step(
            || format!("linking {}", to.display()),
            symlink("pts/ptmx", to),
        );
    }
    step(
        || format!("making {}", to.display()),
        mknod(
            to,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(5, 2),
        ),
    )
}

/// Bind-mounts `from` (with the mounts below it) on a new directory or empty file `to`.
fn bind(from: &Path, to: &Path, is_dir: bool) -> Result<(), ViewError> {
    let made = if is_dir {
        fs::create_dir(to)
    } else {
        File::create(to).map(drop)
    };
    step(|| format!("creating {}", to.display()), made)?;
    step(
        || format!("binding {} on {}", from.display(), to.display()),
        mount(
            Some(from),
            to,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        ),
    )
}
