//! Every RoCE frame captured from kernel rxe (`packet-fixtures/rxe/`, made by
//! `tests/interop/run.sh --fixtures`) must parse, re-emit to the same bytes, and pass its ICRC,
//! except the frames the manifest names as corrupt.
//!
//! The `softroce_*` captures hold softroce's frames too, sent by the host side of the lab where
//! the capture is taken: the kernel leaves their UDP checksum to the device (checksum offload),
//! so the capture shows only the pseudo-header's sum there. Those two bytes are the one thing
//! their re-emission may differ in; the ICRC, which the receiver checks, covers none of them.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::{fixture_dir, manifest, Entry};
use softroce::capture::Capture;
use softroce::wire::{AckSyndrome, IcrcStatus, IpRepr, PacketRepr, Position, Qpn};

/// What the fixture files hold, summed over all of them.
#[derive(Default)]
struct Seen {
    opcodes: BTreeSet<&'static str>,
    naks: BTreeSet<u8>,
    ipv6: usize,
    to_qp1: usize,
    frames: usize,
}

fn check_file(dir: &Path, entry: &Entry, seen: &mut Seen) {
    let bytes = std::fs::read(dir.join(&entry.file)).unwrap();
    let mut count = 0;
    for record in Capture::new(&bytes).unwrap() {
        let record = record.unwrap();
        count += 1;
        let at = format!("{} frame {}", entry.file, record.number);
        let frame = record.frame().unwrap_or_else(|e| panic!("{at}: {e}"));
        let repr = PacketRepr::parse(&frame.packet).unwrap_or_else(|e| panic!("{at}: {e}"));

        // Byte for byte: parse, then emit, gives the captured frame.
        let mut out = vec![0u8; frame.repr.buffer_len(&repr)];
        let n = frame
            .repr
            .emit(&repr, frame.packet.payload(), &mut out)
            .unwrap();
        let offloaded = entry.file.starts_with("softroce_") && sent_by_the_host(&frame.repr);
        let at_checksum = frame.repr.header_len() - 2;
        let as_captured = |out: &mut [u8]| {
            if offloaded {
                out[at_checksum..at_checksum + 2]
                    .copy_from_slice(&record.data[at_checksum..at_checksum + 2]);
            }
        };
        as_captured(&mut out);
        assert_eq!(&out[..n], &record.data[..], "{at}: re-emitted bytes differ");
        // Framing the captured packet as it is, as a capture of UDP-socket traffic does, gives
        // the same frame too.
        let n = frame.repr.frame(frame.packet.as_bytes(), &mut out).unwrap();
        as_captured(&mut out);
        assert_eq!(&out[..n], &record.data[..], "{at}: re-framed bytes differ");

        let icrc_ok = frame.icrc_status() == IcrcStatus::Ok;
        assert_eq!(
            icrc_ok,
            !entry.corrupt.contains(&record.number),
            "{at}: ICRC {:?}",
            frame.icrc_status()
        );

        let info = frame.packet.info();
        assert!(
            repr.payload_len <= entry.mtu,
            "{at}: payload over the path MTU"
        );
        if matches!(info.position, Position::First | Position::Middle) {
            // IBTA C9-87..: FIRST and MIDDLE packets carry exactly one path MTU.
            assert_eq!(
                repr.payload_len, entry.mtu,
                "{at}: a {:?} packet is one MTU",
                info.position
            );
        }
        let is_v6 = matches!(frame.repr.ip, IpRepr::V6 { .. });
        assert_eq!(is_v6, entry.ip == 6, "{at}: IP version");
        seen.ipv6 += usize::from(is_v6);
        seen.to_qp1 += usize::from(repr.bth.dest_qp == Qpn::GSI);
        seen.opcodes.insert(info.name);
        if let Some(syndrome @ AckSyndrome::Nak(_)) = repr.ext.aeth.map(|a| a.syndrome) {
            seen.naks.insert(syndrome.to_byte());
        }
    }
    assert_eq!(count, entry.packets, "{}: frame count", entry.file);
    seen.frames += count;
}

/// A frame the lab's host side sent: softroce's, in a `softroce_*` capture.
fn sent_by_the_host(repr: &softroce::wire::FrameRepr) -> bool {
    match repr.ip {
        IpRepr::V4 { src, .. } => src == std::net::Ipv4Addr::new(10, 99, 0, 1),
        IpRepr::V6 { src, .. } => src == "fd99::1".parse::<std::net::Ipv6Addr>().unwrap(),
    }
}

#[test]
fn rxe_captures_parse_re_emit_and_verify() {
    let dir = fixture_dir("rxe");
    let entries = manifest(&dir);
    let mut seen = Seen::default();
    for entry in &entries {
        check_file(&dir, entry, &mut seen);
    }

    // The manifest and the directory agree.
    let listed: BTreeSet<_> = entries.iter().map(|e| e.file.clone()).collect();
    let present: BTreeSet<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".pcap") || n.ends_with(".pcapng"))
        .collect();
    assert_eq!(
        listed, present,
        "MANIFEST.tsv lists exactly the captures present"
    );

    // The captures cover what the codec must read from rxe.
    let required = [
        "RC_SEND_FIRST",
        "RC_SEND_MIDDLE",
        "RC_SEND_LAST",
        "RC_SEND_ONLY",
        "RC_ACKNOWLEDGE",
        "UC_SEND_FIRST",
        "UC_SEND_MIDDLE",
        "UC_SEND_LAST",
        "UD_SEND_ONLY",
        "RC_RDMA_WRITE_FIRST",
        "RC_RDMA_WRITE_MIDDLE",
        "RC_RDMA_WRITE_LAST",
        "RC_RDMA_WRITE_ONLY",
        "RC_RDMA_READ_REQUEST",
        "RC_RDMA_READ_RESPONSE_FIRST",
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        "RC_RDMA_READ_RESPONSE_LAST",
        "RC_FETCH_ADD",
        "RC_COMPARE_SWAP",
        "RC_ATOMIC_ACKNOWLEDGE",
    ];
    let missing: Vec<_> = required
        .iter()
        .filter(|op| !seen.opcodes.contains(*op))
        .collect();
    assert!(
        missing.is_empty(),
        "no capture holds {missing:?}; seen {:?}",
        seen.opcodes
    );
    assert!(
        seen.naks.contains(&0x60),
        "the lossy capture shows a PSN sequence NAK"
    );
    assert!(seen.ipv6 > 0, "an IPv6 capture");
    assert!(seen.to_qp1 > 0, "RDMA-CM traffic to QP1");
    let per_file: BTreeMap<_, _> = entries
        .iter()
        .map(|e| (e.file.as_str(), e.packets))
        .collect();
    assert!(
        seen.frames > 0 && per_file.values().all(|&n| n <= 1000),
        "small captures"
    );
}
