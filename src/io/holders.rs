//! Who holds an address's UDP 4791: the sockets the kernel lists as bound there
//! (`/proc/thread-self/net/udp` and `udp6`, `proc(5)`, of this thread's network namespace),
//! with their owners' user IDs, and, for an error's sake, the processes that hold them where
//! this user may look.
//!
//! A group asks whether its address is free by reading the list rather than by binding a
//! socket of its own for a moment: a child that another thread of the process forks holds a
//! copy of every descriptor until its exec, and a socket closed here can live on there for a
//! while, in the way of the binding that follows.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::wire::ROCEV2_UDP_PORT;

/// A UDP socket bound to port 4791 on an address that covers the one asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The address it is bound to: the one asked about, or a wildcard.
    pub bound: IpAddr,
    /// Its owner's user ID.
    pub uid: u32,
    /// Its inode, as `socket:[inode]` names it among a process's descriptors.
    pub inode: u64,
    /// The processes that hold it, with their names, where this user may see them.
    pub processes: Vec<(u32, String)>,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a socket on {}, of uid {}", self.bound, self.uid)?;
        if self.processes.is_empty() {
            return write!(f, ", in no process this user may see");
        }
        let processes: Vec<String> = self
            .processes
            .iter()
            .map(|(pid, name)| format!("{pid} ({name})"))
            .collect();
        write!(f, ", held by process {}", processes.join(", "))
    }
}

/// The sockets bound to UDP 4791 on `address` itself, without their processes: those a group
/// of the address waits for, and those its reuse-port sockets would join (the kernel groups
/// sockets of one address only, `udp_reuseport_add_sock`). A wildcard binding that conflicts
/// fails the bind itself, and [`described`] names it. An error if neither table can be read.
pub fn bound(address: IpAddr) -> io::Result<Vec<Holder>> {
    Ok(listed(address)?
        .into_iter()
        .filter(|h| h.bound.to_canonical() == address.to_canonical())
        .collect())
}

/// Whether anything is bound to UDP 4791 on `address` itself ([`bound`]). The kernel's list is
/// read in pieces, each found again by counting sockets from the start, so a socket that closes
/// between two pieces can hide another: it counts as empty only when read empty twice running.
/// Where `/proc` cannot be read (a sandbox that masks it), a bind tells instead: a plain socket
/// bound and closed at once, which a child forked meanwhile by another thread may hold until its
/// exec (the race the list avoids), and which refuses nothing of another user's either way.
pub fn is_bound(address: IpAddr) -> io::Result<bool> {
    match bound(address) {
        Ok(found) if !found.is_empty() => Ok(true),
        Ok(_) => Ok(!bound(address)?.is_empty()),
        Err(_) => match std::net::UdpSocket::bind((address, ROCEV2_UDP_PORT)) {
            Ok(_) => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => Ok(true),
            Err(e) => Err(e),
        },
    }
}

/// The sockets bound to UDP 4791 on `address`, or on a wildcard address whose binding covers
/// it, without their processes. An error if neither table can be read.
fn listed(address: IpAddr) -> io::Result<Vec<Holder>> {
    let tables =
        ["udp", "udp6"].map(|t| std::fs::read_to_string(format!("/proc/thread-self/net/{t}")));
    if let [Err(e), Err(_)] = &tables {
        return Err(io::Error::new(
            e.kind(),
            format!("reading /proc/thread-self/net/udp: {e}"),
        ));
    }
    Ok(tables
        .iter()
        .flatten()
        .flat_map(|text| text.lines().skip(1).filter_map(parse_line))
        .filter(|&(at, port, _, _)| port == ROCEV2_UDP_PORT && covers(at, address))
        .map(|(bound, _, uid, inode)| Holder {
            bound,
            uid,
            inode,
            processes: Vec::new(),
        })
        .collect())
}

/// The sockets bound to UDP 4791 on `address` or on a wildcard that covers it, with the
/// processes holding each: for an error, as a scan of every process's descriptors is slow.
/// Empty if nothing is bound, or the tables cannot be read.
pub fn holders(address: IpAddr) -> Vec<Holder> {
    let mut found = listed(address).unwrap_or_default();
    if !found.is_empty() {
        attach_processes(&mut found);
    }
    found
}

/// What holds `address:4791`, for an error to say: each socket with its owner and processes,
/// or that none is bound any more.
pub fn described(address: IpAddr) -> String {
    let held = holders(address);
    if held.is_empty() {
        return "no socket is bound there any more".to_string();
    }
    held.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Fails with `EADDRINUSE`, saying what holds it, if anything is bound to `address:4791`: for
/// a device of several engines, whose reuse-port sockets would join any group there and see
/// none of its datagrams.
pub fn refuse_if_bound(address: IpAddr) -> io::Result<()> {
    if !is_bound(address)? {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!(
            "UDP {address}:{ROCEV2_UDP_PORT} is bound already ({}): a device of several \
             engines needs the address to itself",
            described(address)
        ),
    ))
}

/// Whether a socket bound to `bound` takes datagrams for `address`, so that another binding
/// there conflicts: the same address, a wildcard of its family, or IPv6's wildcard (which also
/// binds IPv4 unless it is IPv6-only; `/proc` does not say, so it counts).
fn covers(bound: IpAddr, address: IpAddr) -> bool {
    bound.to_canonical() == address.to_canonical()
        || bound == IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        || (bound == IpAddr::V4(Ipv4Addr::UNSPECIFIED) && address.is_ipv4())
}

/// `(local address, local port, uid, inode)` of one line of `/proc/net/udp` or `udp6`:
/// `sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode`.
/// The address is the kernel's bytes printed as native-endian 32-bit words, the port a
/// big-endian number.
fn parse_line(line: &str) -> Option<(IpAddr, u16, u32, u64)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (address, port) = fields.get(1)?.split_once(':')?;
    let words = (0..address.len() / 8)
        .map(|i| u32::from_str_radix(address.get(8 * i..8 * i + 8)?, 16).ok())
        .collect::<Option<Vec<u32>>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let bound = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => return None,
    };
    let port = u16::from_str_radix(port, 16).ok()?;
    let uid = fields.get(7)?.parse().ok()?;
    let inode = fields.get(9)?.parse().ok()?;
    Some((bound, port, uid, inode))
}

/// Finds, for each holder, the processes with a descriptor of its socket: every process's
/// `/proc/<pid>/fd`, where this user may read it (its own, or all of them as root).
fn attach_processes(holders: &mut [Holder]) {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return;
    };
    for process in processes.flatten() {
        let Some(pid) = process
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(process.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let Some(inode) = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok())
            else {
                continue;
            };
            for holder in holders.iter_mut().filter(|h| h.inode == inode) {
                if !holder.processes.iter().any(|&(p, _)| p == pid) {
                    let name = std::fs::read_to_string(process.path().join("comm"))
                        .map_or_else(|_| "?".to_string(), |n| n.trim_end().to_string());
                    holder.processes.push((pid, name));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as Linux 6.1 prints them (`udp4_format_sock`, `udp6_sock_seq_show`).
    #[test]
    fn proc_net_udp_lines_parse_to_address_port_uid_and_inode() {
        let v4 = "  893: 3203007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 \
                  00000000     0        0 2935195 2 0000000000000000 0";
        assert_eq!(
            parse_line(v4),
            Some(("127.0.3.50".parse().unwrap(), 4791, 0, 2935195))
        );
        let v6 = " 1234: 00000000000000000000000001000000:12B7 \
                  00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 \
                  00000000  1000        0 4242 2 0000000000000000 0";
        assert_eq!(
            parse_line(v6),
            Some(("::1".parse().unwrap(), 4791, 1000, 4242))
        );
        let header = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when";
        assert_eq!(parse_line(header), None);
    }

    #[test]
    fn a_wildcard_binding_covers_the_addresses_of_its_family() {
        let address: IpAddr = "127.0.3.50".parse().unwrap();
        assert!(covers(address, address));
        assert!(covers("0.0.0.0".parse().unwrap(), address));
        assert!(covers("::".parse().unwrap(), address));
        assert!(covers("::ffff:127.0.3.50".parse().unwrap(), address));
        assert!(!covers("127.0.3.51".parse().unwrap(), address));
        assert!(!covers("0.0.0.0".parse().unwrap(), "::1".parse().unwrap()));
    }

    /// A socket this process binds is found, with this process holding it.
    #[test]
    fn a_bound_socket_is_found_with_its_process() {
        let address: IpAddr = "127.0.12.40".parse().unwrap();
        let socket = std::net::UdpSocket::bind((address, ROCEV2_UDP_PORT)).unwrap();
        let found = holders(address);
        let me = std::process::id();
        assert!(
            found
                .iter()
                .any(|h| h.bound == address && h.processes.iter().any(|&(p, _)| p == me)),
            "{found:?}"
        );
        assert_eq!(bound(address).unwrap().len(), 1);
        drop(socket);
        // Gone from the list once closed: at once, unless a child another test's thread forked
        // holds a copy until its exec (the race this module is for).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !bound(address).unwrap().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                holders(address)
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
