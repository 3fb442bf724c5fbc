//! The link under a device's address, for its port MTU: rxe's port follows its netdev's MTU
//! (rxe_net.c, `NETDEV_CHANGEMTU`), and so does a softroce device's, read once when it opens.

use std::io;
use std::net::IpAddr;

use nix::ifaddrs::{getifaddrs, InterfaceAddress};

/// A network interface, its index and its IP MTU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The interface's name, e.g. `eth0`; an alias's label is cut at the colon.
    pub name: String,
    /// Its index in this network namespace (what a GID entry's `ndev_ifindex` names).
    pub index: u32,
    /// The interface's IP MTU, in bytes.
    pub mtu: u32,
}

/// The interface that holds `address`, or whose IPv4 network holds it (127.0.0.2 is on `lo`
/// through 127.0.0.1/8), with its MTU from `/sys/class/net/NAME/mtu`.
///
/// sysfs shows the network namespace it was mounted in, which `ip netns exec` makes the
/// process's own, but `nsenter --net` or `unshare -n` do not: there `NAME` can be another
/// namespace's interface. So the MTU is taken only if sysfs's `NAME` has the index and MAC
/// address that this namespace's kernel reports for it (getifaddrs, through netlink). An ioctl
/// (`SIOCGIFMTU`) would ask the namespace directly, but needs `unsafe`.
pub fn link_of(address: IpAddr) -> io::Result<Link> {
    let address = address.to_canonical();
    let interfaces: Vec<InterfaceAddress> = getifaddrs().map_err(io::Error::from)?.collect();
    let label = interfaces
        .iter()
        .find(|i| interface_ip(i) == Some(address))
        .or_else(|| interfaces.iter().find(|i| ipv4_network_holds(i, address)))
        .map(|i| i.interface_name.as_str())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("no network interface has the address {address}"),
            )
        })?;
    // glibc names an IPv4 alias by its label, "eth0:1"; the device is "eth0".
    let name = label.split(':').next().unwrap_or(label).to_string();
    let sysfs = |file: &str| {
        let path = format!("/sys/class/net/{name}/{file}");
        std::fs::read_to_string(&path)
            .map(|text| text.trim().to_string())
            .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
    };
    // This namespace's index and (for 6-byte link addresses) MAC of the interface, and sysfs's.
    let here = interfaces
        .iter()
        .filter(|i| i.interface_name == name)
        .find_map(|i| {
            let link = i.address.as_ref()?.as_link_addr()?;
            Some((
                link.ifindex().to_string(),
                (link.halen() == 6).then(|| link.to_string()),
            ))
        })
        .ok_or_else(|| io::Error::other(format!("interface {name}: no link-layer entry")))?;
    let index = here.0.parse().map_err(io::Error::other)?;
    let there = (
        sysfs("ifindex")?,
        here.1.as_ref().map(|_| sysfs("address")).transpose()?,
    );
    if there != here {
        return Err(io::Error::other(format!(
            "/sys/class/net/{name} is another network namespace's {name} (index and address \
             {there:?} there, {here:?} here): mount this namespace's sysfs, as `ip netns exec` does"
        )));
    }
    let mtu = sysfs("mtu")?;
    let mtu = mtu.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/sys/class/net/{name}/mtu: not an MTU: {mtu:?}"),
        )
    })?;
    Ok(Link { name, index, mtu })
}

fn interface_ip(i: &InterfaceAddress) -> Option<IpAddr> {
    let address = i.address.as_ref()?;
    if let Some(v4) = address.as_sockaddr_in() {
        return Some(v4.ip().into());
    }
    address.as_sockaddr_in6().map(|v6| v6.ip().into())
}

fn ipv4_network_holds(i: &InterfaceAddress, address: IpAddr) -> bool {
    let IpAddr::V4(address) = address else {
        return false;
    };
    let (Some(own), Some(mask)) = (
        i.address.as_ref().and_then(|a| a.as_sockaddr_in()),
        i.netmask.as_ref().and_then(|m| m.as_sockaddr_in()),
    ) else {
        return false;
    };
    let mask = u32::from(mask.ip());
    u32::from(own.ip()) & mask == u32::from(address) & mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn loopback_mtu() -> u32 {
        let text = std::fs::read_to_string("/sys/class/net/lo/mtu").unwrap();
        text.trim().parse().unwrap()
    }

    #[test]
    fn loopback_addresses_are_on_lo() {
        for address in [Ipv4Addr::LOCALHOST, Ipv4Addr::new(127, 0, 0, 2)] {
            let link = link_of(address.into()).unwrap();
            assert_eq!(link.name, "lo", "{address}");
            assert_eq!(link.mtu, loopback_mtu());
            let index = std::fs::read_to_string("/sys/class/net/lo/ifindex").unwrap();
            assert_eq!(link.index.to_string(), index.trim());
        }
    }

    #[test]
    fn an_ipv4_mapped_address_is_its_ipv4_address() {
        let mapped = Ipv4Addr::LOCALHOST.to_ipv6_mapped();
        assert_eq!(link_of(mapped.into()).unwrap().name, "lo");
    }

    #[test]
    fn an_address_of_no_interface_is_an_error() {
        // TEST-NET-3 (RFC 5737): documentation only, never assigned.
        let err = link_of(Ipv4Addr::new(203, 0, 113, 77).into()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrNotAvailable);
        assert!(err.to_string().contains("203.0.113.77"), "{err}");
    }
}
