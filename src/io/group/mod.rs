//! Many processes on one address: an address group.
//!
//! Kernel rxe serves every process of a host from its one device. softroce's device lives in
//! its process, so processes share an address the way the kernel lets them share a UDP port:
//! each binds its own socket to `address:4791` with `SO_REUSEPORT`, and a classic BPF program
//! on the group ([`steering`]) picks, for each datagram, the socket of the process it belongs
//! to. Each member has a *place*, 0 to 255, the index of its socket in the group: every QP
//! number it draws ends in its place (`transport::QpnLedger`), and so does every CM
//! communication ID, so the program steers a packet by its BTH, and a CM reply by its IDs; a
//! REQ goes to the member that bound its RDMA-CM port, which the members write down in their
//! shared record ([`registry`]). A packet goes from the kernel to its process directly, with
//! no other process on the way and no copy more than one process alone costs.
//!
//! What keeps a socket's index its place is that every member holds a descriptor of every
//! socket of the group ([`keeper`]): a member that exits or is killed leaves its socket where
//! it was, in the hands of the others, until a new member takes the place and the socket with
//! it. Its QP numbers stay written down in the place's ledger, so the new member never draws
//! one: a packet for a QP of a process that is gone finds no QP, and is dropped and counted.
//!
//! Who may join: processes of one user. The kernel admits only the user that made a reuse-port
//! group to it; the record is a file only that user may open; a member hands sockets only to a
//! process of its user. A process of another user meets `EADDRINUSE`, with what to do.

mod keeper;
mod ports;
mod registry;
mod steering;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use self::keeper::{Keeper, Kept};
pub use self::ports::PortBinding;
use self::registry::{Registry, PLACES};
use super::holders;
use super::udp::{UdpBackend, UdpConfig};
use crate::transport::QpnLedger;
use crate::wire::{Qpn, ROCEV2_UDP_PORT};

/// The top 16 bits of the QP number a probe is sent to: never drawn for a QP.
pub const PROBE_QPN_HIGH: u32 = 0xffff;
/// How long a new member waits for the group to settle when it looks empty but its address is
/// still bound: a member that is exiting closes its sockets a moment after it lets go of its
/// place.
const SETTLE: Duration = Duration::from_secs(2);

/// One process's membership of its address's group: its place, and what it keeps for the
/// others. It leaves the group when dropped.
pub struct GroupMember {
    address: IpAddr,
    registry: Registry,
    place: u8,
    generation: u32,
    kept: Kept,
    /// This place's QP number ledger ([`Registry::ledger`]), as written to the record.
    ledger: Mutex<Vec<u64>>,
    /// The ports this member holds: by key, the entry in the record and how many bindings
    /// (a C program's ID binds its port, then its listener binds it again).
    held: Mutex<BTreeMap<u32, (usize, usize)>>,
    /// Stopped first as the member leaves, so that its place's name is free before its place.
    keeper: Option<Keeper>,
}

impl fmt::Debug for GroupMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupMember")
            .field("address", &self.address)
            .field("place", &self.place)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// Places 0 to `made` (at most [`PLACES`]).
fn places(made: usize) -> impl Iterator<Item = u8> {
    (0..made.min(PLACES)).map(|p| p as u8)
}

impl GroupMember {
    /// Joins the group of `config.address`, or starts it: binds or takes a socket of the
    /// group, with `config`'s options, and returns it as a backend.
    pub fn join(config: UdpConfig) -> io::Result<(Arc<GroupMember>, UdpBackend)> {
        let config = UdpConfig {
            reuse_port: true,
            ..config
        };
        let address = config.address;
        // A failure drops the registry, whose byte locks (the place's too) go with its file.
        let (registry, joined, backend) = loop {
            let registry = Registry::open(address)?;
            let group = registry.lock_group()?;
            if !registry.is_linked()? {
                // The last member removed it as this process opened it: open the new one.
                continue;
            }
            let (joined, backend) = match Self::join_locked(&registry, config) {
                Ok(joined) => joined,
                Err(error) => {
                    if !registry.others_alive(None) {
                        registry.unlink();
                    }
                    return Err(error);
                }
            };
            // The program again, without the ports of members that are gone, and with a
            // living member for what no port names.
            let me = (joined.place, holder(joined.generation, joined.place));
            let own = keeper::lock(&joined.kept)
                .get(&joined.place)
                .map(OwnedFd::try_clone)
                .ok_or_else(|| io::Error::other("a member without its socket"))??;
            ports::steer(&registry, me, &own, joined.place)?;
            drop(group);
            break (registry, joined, backend);
        };
        let member = GroupMember {
            address,
            registry,
            place: joined.place,
            generation: joined.generation,
            kept: joined.kept,
            ledger: Mutex::new(joined.ledger),
            held: Mutex::new(BTreeMap::new()),
            keeper: Some(joined.keeper),
        };
        Ok((Arc::new(member), backend))
    }

    fn join_locked(registry: &Registry, config: UdpConfig) -> io::Result<(Joined, UdpBackend)> {
        let address = config.address;
        if !registry.is_current()? {
            if registry.others_alive(None) {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{address} is shared by processes of another softroce version: end them, \
                         or open the device on another address"
                    ),
                ));
            }
            registry.reset()?;
        }
        let recorded = registry.made()?;
        let live = places(recorded)
            .filter_map(|p| match registry.held_by_another(p) {
                Ok(true) => Some(Ok(p)),
                Ok(false) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<io::Result<Vec<u8>>>()?;
        // Every socket any living member keeps: one that missed a socket (stopped at the
        // time) leaves it to the others.
        let mut kept = BTreeMap::new();
        for &p in &live {
            match keeper::ask_for_sockets(address, p) {
                Ok(sockets) => {
                    for (place, socket) in sockets {
                        kept.entry(place).or_insert(socket);
                    }
                }
                Err(error) => {
                    tracing::warn!(%address, place = p, %error, "a member did not answer")
                }
            }
        }
        if live.is_empty() {
            wait_until_unbound(address)?;
            registry.reset()?;
        }
        // The places the group's sockets fill: past the last one alive or kept, a socket is
        // gone (a member that died as it joined, before another kept its socket).
        let made = match live.iter().chain(kept.keys()).max() {
            Some(&last) if !kept.is_empty() => usize::from(last) + 1,
            _ if live.is_empty() => 0,
            _ => recorded.min(PLACES),
        };
        // A place whose member is gone and whose socket the others kept, or a new one.
        let orphan = places(made).find(|p| !live.contains(p) && kept.contains_key(p));
        let place = match orphan {
            Some(p) => p,
            None if made < PLACES => made as u8,
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{PLACES} processes share {address} already: open the device on \
                         another address"
                    ),
                ))
            }
        };
        registry.hold_place(place)?;
        let generation = registry.next_generation(place)?;
        let ledger = registry.ledger(place)?;
        let backend = match orphan.and_then(|p| kept.get(&p)) {
            Some(socket) => UdpBackend::adopt(socket.try_clone()?, config)?,
            None => {
                let backend = UdpBackend::with_config(config).map_err(|e| {
                    if e.kind() == io::ErrorKind::AddrInUse {
                        another_user(address)
                    } else {
                        e
                    }
                })?;
                kept.insert(place, backend.socket()?);
                backend
            }
        };
        let own = backend.socket()?;
        let kept: Kept = Arc::new(Mutex::new(kept));
        let keeper = Keeper::start(address, place, kept.clone())?;
        if orphan.is_none() {
            if live.is_empty() {
                // A new group: no port is bound yet.
                steering::attach(&own, &[], place)?;
            }
            probe(address, place, &own)?;
            registry.set_made(usize::from(place) + 1)?;
            for &p in &live {
                if let Err(error) = keeper::have_kept(address, p, place, &own) {
                    tracing::warn!(%address, place = p, %error, "a member did not keep a new socket");
                }
            }
        }
        let joined = Joined {
            place,
            generation,
            kept,
            ledger,
            keeper,
        };
        Ok((joined, backend))
    }

    /// This member's place in the group: its QP numbers and CM IDs end in it.
    pub fn place(&self) -> u8 {
        self.place
    }

    /// How the ports table names this member.
    fn holder(&self) -> u32 {
        holder(self.generation, self.place)
    }

    fn own_socket(&self) -> io::Result<OwnedFd> {
        keeper::lock(&self.kept)
            .get(&self.place)
            .ok_or_else(|| io::Error::other("a member without its socket"))?
            .try_clone()
    }

    /// Sets or clears bit `bit` of the place's ledger, in the copy and the record: whether it
    /// changed. A number whose bit cannot be written is still taken: the record then fails to
    /// keep it from a later member of the place, as after a reset.
    fn mark(&self, bit: usize, held: bool) -> bool {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let Some(word) = ledger.get_mut(bit / 64) else {
            return false;
        };
        let mask = 1u64 << (bit % 64);
        let was = *word & mask != 0;
        if was == held {
            return false;
        }
        *word ^= mask;
        if let Err(error) = self.registry.set_ledger_word(self.place, bit / 64, *word) {
            tracing::warn!(address = %self.address, %error, "a QP number not written down");
        }
        true
    }
}

/// How the ports table names the member of `place` of `generation`.
fn holder(generation: u32, place: u8) -> u32 {
    (generation << 8) | u32::from(place)
}

impl QpnLedger for GroupMember {
    fn place(&self) -> u8 {
        self.place
    }

    fn claim(&self, qpn: Qpn) -> bool {
        let high = qpn.value() >> 8;
        if high == PROBE_QPN_HIGH {
            return false;
        }
        self.mark(high as usize, true)
    }

    fn release(&self, qpn: Qpn) {
        self.mark((qpn.value() >> 8) as usize, false);
    }
}

impl Drop for GroupMember {
    fn drop(&mut self) {
        // The place goes back; the socket stays with the other members. The ports went back
        // with their bindings, each of which holds the member. The last member removes the
        // record: its sockets close as it exits, and the next process starts a new group.
        // Another hands what no port names to a member that stays.
        let group = self.registry.lock_group();
        self.keeper.take();
        if group.is_ok() {
            let other = places(self.registry.made().unwrap_or(PLACES))
                .find(|&p| p != self.place && self.registry.held_by_another(p).unwrap_or(false));
            match (other, self.own_socket()) {
                (Some(other), Ok(own)) => {
                    let _ = ports::steer(&self.registry, (self.place, 0), &own, other);
                }
                (Some(_), Err(_)) => {}
                (None, _) => self.registry.unlink(),
            }
        }
        let _ = self.registry.leave_place(self.place);
    }
}

/// What a new member brings from its join.
struct Joined {
    place: u8,
    generation: u32,
    kept: Kept,
    ledger: Vec<u64>,
    keeper: Keeper,
}

/// Checks that the kernel steers `place` of `address`'s group to `own`, its socket: sends a
/// datagram for a QP number of the place that no QP is given, and reads it back. The group's
/// program and the order of its sockets decide; they disagree only if a socket closed that
/// the members should have kept.
fn probe(address: IpAddr, place: u8, own: &OwnedFd) -> io::Result<()> {
    let sender = UdpSocket::bind(SocketAddr::new(address, 0))?;
    let mut probe = [0u8; 32];
    // An RC SEND_ONLY to QP (PROBE_QPN_HIGH << 8) | place, so that any other member that gets
    // it finds no QP; then a nonce.
    probe[0] = 0x04;
    probe[4..8].copy_from_slice(&((PROBE_QPN_HIGH << 8) | u32::from(place)).to_be_bytes());
    let nonce = {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u8(place);
        hasher.finish()
    };
    probe[12..20].copy_from_slice(&nonce.to_ne_bytes());
    let to = SocketAddr::new(address, ROCEV2_UDP_PORT);
    for _ in 0..3 {
        sender.send_to(&probe, to)?;
        let deadline = Instant::now() + Duration::from_millis(200);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let mut fds = [PollFd::new(own, PollFlags::IN)];
            let left = Timespec::try_from(left).unwrap_or_default();
            if poll(&mut fds, Some(&left)).unwrap_or(0) == 0 {
                break;
            }
            let mut got = [0u8; 64];
            while let Ok((n, _)) =
                rustix::net::recv(own, &mut got, rustix::net::RecvFlags::DONTWAIT)
            {
                if n >= 20 && got[12..20] == nonce.to_ne_bytes() {
                    return Ok(());
                }
            }
        }
    }
    Err(io::Error::other(format!(
        "place {place} of {address}'s group does not reach its socket: a socket of the group \
         closed that its members should have kept; end the softroce processes on {address} \
         and start again"
    )))
}

/// Waits, for [`SETTLE`] at most, until nothing is bound to `address:4791`: a group with no
/// living member may still have sockets of members that are exiting. It reads the kernel's
/// list ([`holders::is_bound`]) rather than binding a socket to find out, as a socket bound and
/// closed here may live on for a while in a child another thread forked, and refuse the
/// binding that follows.
fn wait_until_unbound(address: IpAddr) -> io::Result<()> {
    let deadline = Instant::now() + SETTLE;
    while holders::is_bound(address)? {
        if Instant::now() >= deadline {
            return Err(another_user(address));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// What a process meets when the address is bound by something other than its user's group:
/// what holds it, as far as this user may see, and what to do.
fn another_user(address: IpAddr) -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrInUse,
        format!(
            "UDP {address}:{ROCEV2_UDP_PORT} is bound by another user's softroce processes or by \
             another program (a softroce device of several engines, kernel rxe, ...): {}. \
             Processes share an address only as one user, as the kernel admits one user to a \
             SO_REUSEPORT group; run them as that user, or open the device on another address",
            holders::described(address)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(address: &str) -> (Arc<GroupMember>, UdpBackend) {
        GroupMember::join(UdpConfig::new(address.parse().unwrap())).unwrap()
    }

    /// Members of one address (here in one process, as in several): each its own place; a port
    /// one holds, the others cannot bind; one leaves, and the next member takes its place, its
    /// socket and its port, but none of the QP numbers it held.
    #[test]
    fn a_place_passes_to_the_next_member_without_its_numbers() {
        let address = "127.0.12.3";
        let (a, _a_socket) = join(address);
        let (b, b_socket) = join(address);
        let (c, _c_socket) = join(address);
        assert_eq!([a.place(), b.place(), c.place()], [0, 1, 2]);
        let held = Qpn::new(0x12_3401);
        assert!(b.claim(held));
        assert!(!b.claim(held), "a number is claimed once");
        let port = b.bind_port(0x0106, 7400).unwrap();
        let taken = a.bind_port(0x0106, 7400).unwrap_err();
        assert_eq!(taken.kind(), io::ErrorKind::AddrInUse, "{taken}");
        let again = b.bind_port(0x0106, 7400).unwrap();
        drop((port, again, b_socket, b));
        let (d, _d_socket) = join(address);
        assert_eq!(d.place(), 1, "the place of the member that left");
        assert!(
            !d.claim(held),
            "a number the member before held when it left"
        );
        assert!(d.claim(Qpn::new(0x12_3501)));
        assert!(
            !d.claim(Qpn::new((PROBE_QPN_HIGH << 8) | 1)),
            "the probes' number"
        );
        let _port = a.bind_port(0x0106, 7400).unwrap();
    }

    /// A process whose other threads start programs while it joins: a child holds a copy of
    /// every descriptor from its fork until its exec, so a socket this member bound and closed
    /// a moment before can outlive the close there. Nothing the join binds for a moment may then
    /// stand in the way of its own binding (seen in CI as a test's device refused its address
    /// as "bound by another user's softroce processes", while another test ran a compiler).
    #[test]
    fn a_join_is_not_refused_while_other_threads_start_programs() {
        let address = "127.0.12.41";
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spawners: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = std::process::Command::new("true").status();
                    }
                })
            })
            .collect();
        let refused = (0..200)
            .filter_map(|_| {
                GroupMember::join(UdpConfig::new(address.parse().unwrap()))
                    .err()
                    .map(|e| e.to_string())
            })
            .collect::<Vec<_>>();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spawners.into_iter().for_each(|s| s.join().unwrap());
        assert!(
            refused.is_empty(),
            "{} of 200 joins refused: {:?}",
            refused.len(),
            refused.first()
        );
    }
}
