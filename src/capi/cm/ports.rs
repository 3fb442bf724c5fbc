//! The RDMA-CM ports this process's IDs are bound to, per device and port space: a port a
//! bound ID holds is not another's (`EADDRINUSE`, as the kernel's `cma_get_port` answers), and
//! port 0 takes a free port of the kernel's ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`, as `cma_alloc_any_port`), so that an ID bound
//! with port 0 listens, and names itself to a peer, on a real port (libfabric's `ofi_rxm`
//! hands its peers the name of a listener bound so). The port goes back when the ID is
//! destroyed. A child after `fork()` starts with none: its parent's IDs are not its own.

use std::collections::HashSet;
use std::ops::RangeInclusive;
use std::sync::{Mutex, MutexGuard, OnceLock};

use libc::c_int;

use softroce::io::PortBinding;
use softroce::verbs::Device;
use softroce::wire::cm::PortSpace;

use crate::fork::Born;

/// A bound port: the device's index, the port space, the port.
type Key = (usize, u32, u16);

/// Every port bound in this process, and the process generation they were bound in.
static BOUND: Mutex<Option<(Born, HashSet<Key>)>> = Mutex::new(None);

/// This process's bound ports: those of a parent before `fork()` are forgotten.
fn bound() -> MutexGuard<'static, Option<(Born, HashSet<Key>)>> {
    let mut bound = BOUND.lock().unwrap_or_else(|p| p.into_inner());
    if !bound.as_ref().is_some_and(|(born, _)| born.current()) {
        *bound = Some((Born::now(), HashSet::new()));
    }
    bound
}

/// The kernel's ephemeral port range (Linux's default where it cannot be read).
fn ephemeral() -> RangeInclusive<u16> {
    static RANGE: OnceLock<RangeInclusive<u16>> = OnceLock::new();
    RANGE
        .get_or_init(|| {
            let read = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok();
            let bounds: Option<Vec<u16>> = read.and_then(|text| {
                text.split_whitespace()
                    .map(|n| n.parse().ok())
                    .collect::<Option<Vec<u16>>>()
            });
            match bounds.as_deref() {
                Some(&[low, high]) if 0 < low && low <= high => low..=high,
                _ => 32768..=60999,
            }
        })
        .clone()
}

/// A port an ID holds, given back when dropped: in this process, and against the other
/// processes that share the device's address (`Device::bind_cm_port`).
#[derive(Debug)]
pub(super) struct PortClaim {
    key: Key,
    _binding: Option<PortBinding>,
}

/// Ephemeral ports tried before a bind of port 0 gives up when other processes on the
/// address hold each one drawn.
const EPHEMERAL_TRIES: usize = 64;

impl PortClaim {
    /// Claims `port` of port space `ps` on `device` (the device at `index`), or for port 0 a
    /// free ephemeral one; `EADDRINUSE` if `port` is taken, here or by another process on the
    /// address, or no ephemeral one is free.
    pub(super) fn claim(
        device: &Device,
        index: usize,
        ps: u32,
        port: u16,
    ) -> Result<PortClaim, c_int> {
        let space = match ps {
            p if p == u32::from(PortSpace::Tcp.value()) => PortSpace::Tcp,
            p if p == u32::from(PortSpace::Udp.value()) => PortSpace::Udp,
            p if p == u32::from(PortSpace::Ib.value()) => PortSpace::Ib,
            _ => return Err(libc::EPROTONOSUPPORT),
        };
        // Ports other processes hold, kept claimed here until the draw ends so that it moves on.
        let mut taken = Vec::new();
        while taken.len() < EPHEMERAL_TRIES {
            let key = Self::claim_here(index, ps, port)?;
            match device.bind_cm_port(space, key.2) {
                Ok(binding) => {
                    return Ok(PortClaim {
                        key,
                        _binding: binding,
                    })
                }
                Err(softroce::verbs::Error::Io(e))
                    if port == 0 && e.kind() == std::io::ErrorKind::AddrInUse =>
                {
                    taken.push(PortClaim {
                        key,
                        _binding: None,
                    })
                }
                Err(error) => {
                    drop(PortClaim {
                        key,
                        _binding: None,
                    });
                    return Err(match error {
                        softroce::verbs::Error::Io(e) => match e.kind() {
                            std::io::ErrorKind::AddrInUse => libc::EADDRINUSE,
                            // The address's ports table is full.
                            std::io::ErrorKind::OutOfMemory => libc::ENOSPC,
                            _ => e.raw_os_error().unwrap_or(libc::EIO),
                        },
                        _ => libc::ENODEV,
                    });
                }
            }
        }
        Err(libc::EADDRINUSE)
    }

    /// Claims `port` of port space `ps` on device `device` in this process, or for port 0 a
    /// free ephemeral one, starting from a point that varies from call to call (the kernel
    /// picks at random); `EADDRINUSE` if `port` is taken or no ephemeral one is free.
    fn claim_here(device: usize, ps: u32, port: u16) -> Result<Key, c_int> {
        let mut table = bound();
        let Some((_, bound)) = table.as_mut() else {
            return Err(libc::EADDRINUSE);
        };
        let chosen = if port != 0 {
            port
        } else {
            let range = ephemeral();
            let (low, count) = (u32::from(*range.start()), range.len() as u32);
            let start = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            (0..count)
                .map(|i| (low + (start + i) % count) as u16)
                .find(|&p| !bound.contains(&(device, ps, p)))
                .ok_or(libc::EADDRINUSE)?
        };
        if !bound.insert((device, ps, chosen)) {
            return Err(libc::EADDRINUSE);
        }
        Ok((device, ps, chosen))
    }

    /// The port claimed.
    pub(super) fn port(&self) -> u16 {
        self.key.2
    }
}

impl Drop for PortClaim {
    fn drop(&mut self) {
        if let Some((_, bound)) = bound().as_mut() {
            bound.remove(&self.key);
        }
    }
}
