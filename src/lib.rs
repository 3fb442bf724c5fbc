//! softroce: a userspace software RoCEv2 transport.
//!
//! This release holds the wire layer ([`wire`]): every RoCEv2 header, the opcode table, whole
//! packets and frames, and the ICRC, plus [`capture`] for reading pcap files. See
//! `ARCHITECTURE.md` for the layers that will stand on it.

#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod capture;
pub mod cm;
#[cfg(feature = "cli")]
pub mod decode;
#[cfg(feature = "cli")]
pub mod demo;
mod engine;
pub mod io;
pub mod memory;
#[cfg(feature = "cli")]
pub mod tools;
pub mod transport;
pub mod verbs;
pub mod wire;
