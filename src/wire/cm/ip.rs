//! RDMA-CM's IP addressing in CM private data (IBTA annex A11, the kernel's `struct cma_hdr` in
//! cma.c): the first 36 bytes of a REQ's or SIDR_REQ's private data say which IP addresses and
//! source port the connection is between, since the service ID holds only the destination port.
//!
//! ```text
//!  0       version (0)
//!  1       IP version in the high nibble (4 or 6)
//!  2..4    the active side's source port
//!  4..20   source address (IPv4: 12 zero bytes, then the address)
//! 20..36   destination address
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::super::field::{bytes_at, set_u16, u16_at};
use super::super::{Error, Layer, Result};

mod field {
    pub const VERSION: usize = 0;
    pub const IP_VERSION: usize = 1;
    pub const PORT: usize = 2;
    pub const SRC: usize = 4;
    pub const DST: usize = 20;
}

/// The length of the header; the application's private data follows it.
pub const CMA_HEADER_LEN: usize = 36;
/// The only version there is (`CMA_VERSION`).
pub const CMA_VERSION: u8 = 0;

header_view!(
    /// A view of RDMA-CM's IP header.
    CmaHeader,
    CmaHeaderRepr,
    Layer::CmaHeader,
    36
);

/// The fields of RDMA-CM's IP header. Both addresses are of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeaderRepr {
    /// The active side's address and source port.
    pub src: IpAddr,
    /// The active side's source port (bytes 2 and 3).
    pub src_port: u16,
    /// The passive side's address; its port is in the service ID.
    pub dst: IpAddr,
}

fn address(bytes: [u8; 16], v4: bool) -> IpAddr {
    if v4 {
        Ipv4Addr::new(bytes[12], bytes[13], bytes[14], bytes[15]).into()
    } else {
        Ipv6Addr::from(bytes).into()
    }
}

fn octets(address: IpAddr) -> [u8; 16] {
    match address {
        IpAddr::V4(v4) => {
            let mut out = [0; 16];
            out[12..].copy_from_slice(&v4.octets());
            out
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl CmaHeaderRepr {
    /// Parses the header; a version other than 0, an IP version other than 4 or 6, or an IPv4
    /// address not preceded by 12 zero bytes is an error, as the kernel's `cma_save_ip_info`
    /// refuses them.
    pub fn parse<T: AsRef<[u8]>>(header: &CmaHeader<T>) -> Result<Self> {
        let b = header.bytes();
        if b[field::VERSION] != CMA_VERSION {
            return Err(Error::Field {
                layer: Layer::CmaHeader,
                field: "version",
                found: b[field::VERSION].into(),
                expected: "0",
            });
        }
        let v4 = match b[field::IP_VERSION] >> 4 {
            4 => true,
            6 => false,
            other => {
                return Err(Error::Field {
                    layer: Layer::CmaHeader,
                    field: "ip_version",
                    found: other.into(),
                    expected: "4 or 6",
                })
            }
        };
        let (src, dst) = (bytes_at::<16>(b, field::SRC), bytes_at::<16>(b, field::DST));
        if v4 && (src[..12] != [0; 12] || dst[..12] != [0; 12]) {
            return Err(Error::Field {
                layer: Layer::CmaHeader,
                field: "address",
                found: 0,
                expected: "an IPv4 address after 12 zero bytes",
            });
        }
        Ok(CmaHeaderRepr {
            src: address(src, v4),
            src_port: u16_at(b, field::PORT),
            dst: address(dst, v4),
        })
    }

    /// Writes the 36 bytes, the IP version taken from `src`'s family.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut CmaHeader<T>) {
        let b = &mut header.bytes_mut()[..CMA_HEADER_LEN];
        b[field::VERSION] = CMA_VERSION;
        b[field::IP_VERSION] = if self.src.is_ipv4() { 0x40 } else { 0x60 };
        set_u16(b, field::PORT, self.src_port);
        b[field::SRC..field::DST].copy_from_slice(&octets(self.src));
        b[field::DST..CMA_HEADER_LEN].copy_from_slice(&octets(self.dst));
    }
}
