//! Whole frames from the network: Ethernet, raw IP and Linux cooked, then the ICRC and the
//! packet representation. Nothing may panic, and what parses must re-emit to a frame that parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softroce::wire::{Frame, PacketRepr};

fuzz_target!(|data: &[u8]| {
    for parsed in [
        Frame::parse_ethernet(data),
        Frame::parse_ip(data),
        Frame::parse_linux_sll(data),
    ]
    .into_iter()
    .flatten()
    {
        let _ = parsed.icrc_status();
        let Ok(repr) = PacketRepr::parse(&parsed.packet) else {
            continue;
        };
        let mut out = vec![0u8; parsed.repr.buffer_len(&repr)];
        if let Ok(n) = parsed.repr.emit(&repr, parsed.packet.payload(), &mut out) {
            let again = if parsed.repr.ethernet.is_some() {
                Frame::parse_ethernet(&out[..n])
            } else {
                Frame::parse_ip(&out[..n])
            };
            assert!(again.is_ok(), "an emitted frame must parse");
        }
    }
});
