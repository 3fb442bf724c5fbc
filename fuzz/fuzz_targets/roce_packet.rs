//! A UDP payload as a RoCE packet, the way a UDP socket delivers it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softroce::wire::{AethRepr, AtomicEthRepr, DethRepr, PacketRepr, RethRepr, RocePacket};

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = RocePacket::new_checked(data) else {
        return;
    };
    let _ = (
        packet.payload(),
        packet.pad(),
        packet.icrc(),
        packet.covered(),
    );
    let _ = (packet.ext::<RethRepr>(), packet.ext::<AethRepr>());
    let _ = (packet.ext::<DethRepr>(), packet.ext::<AtomicEthRepr>());
    let repr = PacketRepr::parse(&packet).expect("a checked packet parses");
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit_with_payload(&mut out, packet.payload())
        .expect("a parsed packet emits");
    assert_eq!(out.len(), data.len());
});
