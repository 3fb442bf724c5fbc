//! The out-of-band exchange of rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong` and
//! `ibv_ud_pingpong` (libibverbs/examples), on TCP port 18515 by default.
//!
//! Each side's address is one 52-byte message, `"%04x:%06x:%06x:%s"` of LID, QPN, PSN and GID
//! and a terminating NUL, the GID as 32 hex digits in wire (network) order
//! (`gid_to_wire_gid` in pingpong.c). The client connects and writes its message; the server
//! reads it, moves its QP to RTR and RTS (so it can receive before the client learns its QPN),
//! and answers with its own; the client then writes `"done\0"` and both close the connection.
//!
//! rdma-core reads each message with one `read()` of its size, so every message here goes out
//! in one `write()`. rdma-core parses with `sscanf` and checks nothing; this side refuses a
//! message that is not in the format above, with the message in the error.

use std::borrow::Cow;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv6Addr, TcpStream};

use super::{Error, Result};
use crate::wire::{Psn, Qpn};

/// The TCP port rdma-core's pingpong tools use unless told otherwise.
pub const DEFAULT_PORT: u16 = 18515;
/// `sizeof "0000:000000:000000:00000000000000000000000000000000"`.
pub const MESSAGE_LEN: usize = 52;
/// What the client writes once it has the server's address: `sizeof "done"` bytes.
pub const DONE: &[u8; 5] = b"done\0";

/// One side's address in the exchange (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// Always 0 on RoCE, which addresses by GID.
    pub lid: u16,
    /// The QP number, six hex digits on the wire.
    pub qpn: Qpn,
    /// The first PSN this side sends, six hex digits on the wire.
    pub psn: Psn,
    /// The GID, 32 hex digits on the wire; IPv4-mapped for an IPv4 device.
    pub gid: Ipv6Addr,
}

impl Dest {
    /// The 52-byte message.
    pub fn to_wire(&self) -> [u8; MESSAGE_LEN] {
        let gid: String = self
            .gid
            .octets()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{gid}",
            self.lid,
            self.qpn.value(),
            self.psn.value()
        );
        let mut msg = [0; MESSAGE_LEN];
        // Every field is at its widest, so the text fills the message but its last byte, the NUL.
        msg[..text.len()].copy_from_slice(text.as_bytes());
        msg
    }

    /// Parses a peer's message; `who` ("client" or "server") names the peer in errors.
    pub fn parse(msg: &[u8], who: &str) -> Result<Dest> {
        let text = nul_terminated(msg);
        let bad = |why: &str| {
            Error::Exchange(format!(
                "the {who}'s address message {text:?} is not LID:QPN:PSN:GID \
                 (\"%04x:%06x:%06x:\" and 32 hex digits): {why}"
            ))
        };
        let fields: Vec<&str> = text.split(':').collect();
        let [lid, qpn, psn, gid] = fields[..] else {
            return Err(bad("it does not have 4 fields"));
        };
        let hex = |field: &str, what: &str, max: u32| {
            u32::from_str_radix(field, 16)
                .ok()
                .filter(|&v| v <= max)
                .ok_or_else(|| bad(&format!("bad {what} {field:?}")))
        };
        if gid.len() != 32 || !gid.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(&format!("the GID {gid:?} is not 32 hex digits")));
        }
        let gid = u128::from_str_radix(gid, 16).map_err(|_| bad("bad GID"))?;
        Ok(Dest {
            lid: hex(lid, "LID", 0xffff)? as u16,
            qpn: Qpn::new(hex(qpn, "QPN", Qpn::MAX.value())?),
            psn: Psn::new(hex(psn, "PSN", Psn::MAX.value())?),
            gid: Ipv6Addr::from(gid),
        })
    }
}

/// The text of a NUL-terminated message or field, as C reads it.
pub(super) fn nul_terminated(msg: &[u8]) -> Cow<'_, str> {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    String::from_utf8_lossy(&msg[..end])
}

/// Reads exactly `len` bytes of `what`. A read that times out (the stream's read timeout, which
/// the daemon sets) asks `waited`: an error ends the read with it, `Ok` reads on.
pub(super) fn read_exactly(
    stream: &mut TcpStream,
    len: usize,
    what: &str,
    waited: &mut dyn FnMut() -> Result<()>,
) -> Result<Vec<u8>> {
    let mut msg = vec![0; len];
    let mut got = 0;
    while got < len {
        match stream.read(&mut msg[got..]) {
            Ok(0) => {
                return Err(Error::Exchange(format!(
                    "{got}/{len}: Couldn't read {what}: the peer closed the connection"
                )))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                waited()?;
            }
            Err(e) => {
                return Err(Error::Exchange(format!(
                    "{got}/{len}: Couldn't read {what}: {e}"
                )))
            }
        }
    }
    Ok(msg)
}

/// For [`read_exactly`]: a read that times out ends the exchange. The pingpong exchange is
/// short, and the daemon sets its timeout to the idle limit.
pub(super) fn give_up(idle: Option<std::time::Duration>) -> impl FnMut() -> Result<()> {
    move || {
        Err(match idle {
            Some(idle) => Error::PeerSilent(idle),
            None => Error::Exchange("the TCP connection's read timed out".into()),
        })
    }
}

pub(super) fn write_all(stream: &mut TcpStream, msg: &[u8], what: &str) -> Result<()> {
    stream
        .write_all(msg)
        .map_err(|e| Error::Exchange(format!("Couldn't send {what}: {e}")))
}

/// The client's half (`pp_client_exch_dest`): returns the server's address.
pub fn client_exchange(stream: &mut TcpStream, me: &Dest) -> Result<Dest> {
    write_all(stream, &me.to_wire(), "local address")?;
    let reply = read_exactly(stream, MESSAGE_LEN, "remote address", &mut give_up(None))?;
    write_all(stream, DONE, "\"done\"")?;
    Dest::parse(&reply, "server")
}

/// The server's half (`pp_server_exch_dest`): reads the client's address, hands it to `ready`
/// (which must make the QP able to receive from it), answers, and waits for the client's
/// `"done"`. Returns the client's address. A read that times out ends it with
/// [`Error::PeerSilent`] for `idle`.
pub fn server_exchange(
    stream: &mut TcpStream,
    me: &Dest,
    idle: Option<std::time::Duration>,
    ready: impl FnOnce(&Dest) -> Result<()>,
) -> Result<Dest> {
    let msg = read_exactly(stream, MESSAGE_LEN, "remote address", &mut give_up(idle))?;
    let client = Dest::parse(&msg, "client")?;
    ready(&client)?;
    write_all(stream, &me.to_wire(), "local address")?;
    let done = read_exactly(stream, DONE.len(), "\"done\"", &mut give_up(idle))?;
    if done != DONE {
        return Err(Error::Exchange(format!(
            "the client ended the exchange with {:?}, not \"done\"",
            String::from_utf8_lossy(&done)
        )));
    }
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest() -> Dest {
        Dest {
            lid: 0,
            qpn: Qpn::new(0x11),
            psn: Psn::new(0xabcdef),
            gid: "::ffff:10.99.0.1".parse().unwrap(),
        }
    }

    #[test]
    fn message_is_rdma_cores() {
        let msg = dest().to_wire();
        assert_eq!(
            &msg[..51],
            b"0000:000011:abcdef:00000000000000000000ffff0a630001"
        );
        assert_eq!(msg[51], 0);
        assert_eq!(Dest::parse(&msg, "client").unwrap(), dest());
    }

    #[test]
    fn malformed_messages_are_refused_with_the_message() {
        let cases: [&[u8]; 4] = [
            b"hello",
            b"0000:000011:abcdef:0000",
            b"0000:1000000:abcdef:00000000000000000000ffff0a630001",
            b"0000:000011:abcdef:00000000000000000000ffff0a63000g",
        ];
        for msg in cases {
            let error = Dest::parse(msg, "client").unwrap_err().to_string();
            assert!(error.contains("is not LID:QPN:PSN:GID"), "{error}");
            assert!(error.contains(&*String::from_utf8_lossy(msg)), "{error}");
        }
    }
}
