//! The link under a device's address, for its port MTU: rxe's port follows its netdev's MTU
//! (rxe_net.c, `NETDEV_CHANGEMTU`), and so does a softroce device's, read once when it opens.

use std::io;
use std::net::IpAddr;

use nix::ifaddrs::{getifaddrs, InterfaceAddress};

/// A network interface and its IP MTU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub mtu: u32,
}

/// The interface that holds `address`, or whose IPv4 network holds it (127.0.0.2 is on `lo`
/// through 127.0.0.1/8), with its MTU from `/sys/class/net/NAME/mtu`. `ip netns exec` mounts a
/// sysfs of the namespace, so that file is the namespace's own interface.
pub fn link_of(address: IpAddr) -> io::Result<Link> {
    let interfaces: Vec<InterfaceAddress> = getifaddrs().map_err(io::Error::from)?.collect();
    let name = interfaces
        .iter()
        .find(|i| interface_ip(i) == Some(address))
        .or_else(|| interfaces.iter().find(|i| ipv4_network_holds(i, address)))
        .map(|i| i.interface_name.clone())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("no network interface has the address {address}"),
            )
        })?;
    let path = format!("/sys/class/net/{name}/mtu");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    let mtu = text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path}: not an MTU: {:?}", text.trim()),
        )
    })?;
    Ok(Link { name, mtu })
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
        }
    }

    #[test]
    fn an_address_of_no_interface_is_an_error() {
        // TEST-NET-3 (RFC 5737): documentation only, never assigned.
        let err = link_of(Ipv4Addr::new(203, 0, 113, 77).into()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrNotAvailable);
        assert!(err.to_string().contains("203.0.113.77"), "{err}");
    }
}
