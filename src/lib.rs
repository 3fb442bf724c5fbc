//! softroce: a userspace software RoCEv2 transport, wire-compatible with Linux's `rdma_rxe` and
//! with ConnectX NICs, in Rust and without an RDMA NIC or kernel module.
//!
//! A program opens a [`Device`](verbs::Device) on an IP address (a UDP socket on port 4791),
//! registers memory, creates queue pairs and posts work requests to them, as with libibverbs.
//! [`prelude`] holds what a first program needs:
//!
//! ```
//! use softroce::prelude::*;
//! # use std::time::Duration;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
//! let (a, b) = (
//!     Device::open(DeviceConfig::udp("127.0.0.41".parse()?))?,
//!     Device::open(DeviceConfig::udp("127.0.0.42".parse()?))?,
//! );
//! let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
//! let (cq_a, cq_b) = (a.create_cq(8)?, b.create_cq(8)?);
//! let qp_a = pd_a.create_qp().send_cq(&cq_a).recv_cq(&cq_a).build()?;
//! let qp_b = pd_b.create_qp().send_cq(&cq_b).recv_cq(&cq_b).build()?;
//! let source = pd_a.register(64, access)?;
//! let target = pd_b.register(64, access)?;
//!
//! // Each side hands the other its endpoint (and the target its region) out of band;
//! // `verbs::Connection` does it with RDMA-CM instead.
//! qp_a.connect(&qp_b.endpoint(), &ConnectOptions::default())?;
//! qp_b.connect(&qp_a.endpoint(), &ConnectOptions::default())?;
//!
//! source.write(0, b"hello")?;
//! qp_a.post_send(SendWr::write(1, source.sge(0, 5)?, target.remote()))?;
//! let wc = cq_a.wait(Duration::from_secs(5))?.expect("a completion");
//! assert_eq!(wc.status, WcStatus::Success);
//! assert_eq!(&target.to_vec()[..5], b"hello");
//! # Ok(())
//! # }
//! ```
//!
//! The layers, from the top (`ARCHITECTURE.md` has the map and the invariants):
//! - [`verbs`]: devices, protection domains, regions, CQs, QPs, SRQs, memory windows, and
//!   RDMA-CM connections ([`verbs::Connection`], [`verbs::Listener`]), over an engine that runs
//!   on a thread of its own or inside the application's calls ([`verbs::Progress`]);
//! - [`transport`]: the RC, UC and UD state machines, sans-IO: fed `(now, datagram)`, they
//!   return packets, completions and their next deadline;
//! - [`cm`]: the InfiniBand CM with RDMA-CM's addressing, sans-IO too;
//! - [`memory`]: registered regions and windows, and the key checks every remote access passes;
//! - [`io`]: the UDP and raw IPv4 backends, and pcap recording;
//! - [`wire`]: every RoCEv2 header, CM MADs, frames and the ICRC; [`capture`] reads pcap files.
//!
//! Features: `cli` (default) adds the `softroce` command line's modules (`tools`, `demo`,
//! `decode`) and their dependencies; build with `default-features = false` for the library
//! alone. `serde` (which `cli` turns on) derives `Serialize` and `Deserialize` for the types
//! a program exchanges with its peer: [`QpEndpoint`](transport::QpEndpoint) and
//! [`RemoteRegion`](memory::RemoteRegion).

#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]
#![warn(missing_docs)]

pub mod capture;
pub mod cm;
#[cfg(feature = "cli")]
pub mod decode;
#[cfg(feature = "cli")]
pub mod demo;
mod engine;
pub mod io;
mod keyed;
pub mod memory;
#[cfg(test)]
mod test_support;
#[cfg(feature = "cli")]
pub mod tools;
pub mod transport;
pub mod verbs;
pub mod wire;

/// What a first program imports: `use softroce::prelude::*;`.
pub mod prelude {
    pub use crate::memory::{Access, MemoryRegion, RemoteRegion};
    pub use crate::transport::{
        AddressHandle, ConnectOptions, PathMtu, QpEndpoint, QpType, RecvWr, SendOp, SendWr, Sge,
        SgeList, UdDest, WcOpcode, WcStatus, WorkCompletion,
    };
    pub use crate::verbs::{
        CompletionQueue, CompletionRouter, Connection, ConnectionEvent, Device, DeviceConfig,
        Error, Listener, ProtectionDomain, QueuePair, SharedReceiveQueue,
    };
    pub use crate::wire::{Psn, QKey, Qpn, RKey};
}
