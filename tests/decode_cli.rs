//! `softroce decode`, run as a user runs it.

mod common;

use std::process::{Command, Output};

use common::{fixture_dir, manifest, pcap_of};

fn decode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softroce"))
        .arg("decode")
        .args(args)
        .output()
        .expect("run softroce")
}

fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("softroce-test-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn json_over_every_rxe_fixture_has_every_frame_with_a_good_icrc() {
    let dir = fixture_dir("rxe");
    for entry in manifest(&dir) {
        let path = dir.join(&entry.file);
        let out = decode(&["--json", path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}: {}",
            entry.file,
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), entry.packets, "{}", entry.file);
        for packet in &lines {
            for field in [
                "opcode",
                "opcode_name",
                "dest_qp",
                "psn",
                "ack_req",
                "payload_len",
                "icrc",
            ] {
                assert!(
                    packet.get(field).is_some(),
                    "{}: no {field} in {packet}",
                    entry.file
                );
            }
            let frame = packet["frame"].as_u64().unwrap() as usize;
            let expected = if entry.corrupt.contains(&frame) {
                "bad"
            } else {
                "ok"
            };
            assert_eq!(packet["icrc"], expected, "{} frame {frame}", entry.file);
        }
    }
}

/// The CNP a ConnectX-4 Lx sent, as an Ethernet frame.
fn connectx_cnp() -> Vec<u8> {
    let cnp = include_str!("../packet-fixtures/vectors/connectx4lx_cnp.hex");
    let digits: String = cnp
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn text_output_has_a_line_per_packet_and_counts() {
    let frame = connectx_cnp();
    // An ARP-sized non-IP frame is counted and skipped.
    let other = [0xffu8; 60];
    let mut corrupt = frame.clone();
    *corrupt.last_mut().unwrap() ^= 0xff;
    let path = temp_file("mixed.pcap", &pcap_of(&[&frame, &other, &corrupt]));
    let out = decode(&[path.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    assert!(text.contains("CNP QP=0x000118 PSN=0 A=0"), "{text}");
    assert!(
        text.contains("ICRC=ok") && text.contains("ICRC=BAD"),
        "{text}"
    );
    assert!(text.contains("non-RoCE frames skipped: 1"), "{text}");
    assert!(
        text.contains("CNP                                         2"),
        "{text}"
    );
}

/// The IP header's ECN shows: a CE mark on the text line and in the JSON, beside the DSCP.
/// The ConnectX-4 Lx's CNP is sent ECT(0) with DSCP 48 (TOS 0xc2); marked CE on its way, its
/// TOS is 0xc3, and its IPv4 checksum follows (the ICRC does not cover the TOS).
#[test]
fn ecn_shows_and_a_ce_mark_stands_out() {
    let sent = connectx_cnp();
    let mut marked = sent.clone();
    marked[15] |= 0b11;
    marked[24..26].fill(0);
    let sum: u32 = marked[14..34]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let checksum = !((folded & 0xffff) + (folded >> 16)) as u16;
    marked[24..26].copy_from_slice(&checksum.to_be_bytes());
    let path = temp_file("ce.pcap", &pcap_of(&[&sent, &marked]));
    let out = decode(&[path.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().take(2).collect();
    assert!(lines[0].ends_with("BECN len=0 ICRC=ok"), "{text}");
    assert!(lines[1].contains("A=0 CE BECN len=0 ICRC=ok"), "{text}");
    let out = decode(&["--json", path.to_str().unwrap()]);
    let json: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        (&json[0]["dscp"], &json[0]["ecn"]),
        (&48.into(), &"ECT(0)".into())
    );
    assert_eq!(json[1]["ecn"], "CE");
    assert_eq!(json[1]["becn"], true);
}

#[test]
fn a_truncated_capture_is_an_error_with_its_byte_offset() {
    let frame = [0u8; 80];
    let whole = pcap_of(&[&frame, &frame]);
    // Cut the second record in half: the first still decodes, then the error names offset 120.
    let path = temp_file("truncated.pcap", &whole[..whole.len() - 40]);
    let out = decode(&[path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("at byte offset 120"), "{err}");
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn a_file_that_is_no_capture_is_an_error() {
    let path = temp_file("garbage.pcap", b"this is not a capture file at all");
    let out = decode(&[path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("at byte offset 0: not a pcap or pcapng file"),
        "{err}"
    );
}

/// The frames of a fixture, whole.
fn fixture_frames(file: &str) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(fixture_dir("rxe").join(file)).unwrap();
    softroce::capture::Capture::new(&bytes)
        .unwrap()
        .map(|record| record.unwrap().data.to_vec())
        .collect()
}

/// kernel rxe's rping handshake: every CM MAD decoded, text and JSON, with its IDs, service,
/// RDMA-CM's header, a REP's QPN and the private data's length.
#[test]
fn cm_mads_are_decoded_in_text_and_json() {
    let path = fixture_dir("rxe").join("rdma_cm_rping.pcap");
    let text = String::from_utf8(decode(&[path.to_str().unwrap()]).stdout).unwrap();
    let cm: Vec<&str> = text.lines().filter(|l| l.contains(" CM ")).collect();
    assert_eq!(cm.len(), 5, "{text}");
    assert!(cm[0].ends_with(
        "CM REQ tid=0x00000002117924d1 local_comm=0xd1247911 service=0x0000000001061c06 \
         (TCP port 7174) qpn=0x00001d psn=12606050 mtu=1024 \
         ip 10.99.0.11 port 58498 -> 10.99.0.12 private=56"
    ));
    assert!(cm[1].contains(
        "CM REP tid=0x00000002117924d1 local_comm=0x589c56fb remote_comm=0xd1247911 qpn=0x000029"
    ));
    assert!(cm[3].contains("CM DREQ") && cm[3].ends_with("qpn=0x000029 private=220"));
    let json = String::from_utf8(decode(&["--json", path.to_str().unwrap()]).stdout).unwrap();
    let req: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(req["cm"]["message"], "REQ");
    assert_eq!(req["cm"]["port_space"], "TCP");
    assert_eq!(req["cm"]["port"], 7174);
    assert_eq!(req["cm"]["ip"]["src_port"], 58498);
    assert_eq!(req["cm"]["private_data_len"], 56);
    let data: serde_json::Value = serde_json::from_str(json.lines().nth(3).unwrap()).unwrap();
    assert!(data.get("cm").is_none(), "an RC SEND is no MAD: {data}");
}

/// `frame` (Ethernet, IPv4 without options) with BTH opcode `opcode`, its ICRC sealed for the
/// new bytes, or left as it was (so wrong) if `seal` is false.
fn with_opcode(frame: &[u8], opcode: u8, seal: bool) -> Vec<u8> {
    let mut frame = frame.to_vec();
    let bth = 14 + 20 + 8;
    frame[bth] = opcode;
    if seal {
        let udp: [u8; 8] = frame[34..42].try_into().unwrap();
        let end = frame.len() - 4;
        let icrc = softroce::wire::icrc::icrc_ipv4(&frame[14..34], udp, &frame[bth..end]);
        frame[end..].copy_from_slice(&icrc.to_le_bytes());
    }
    frame
}

/// Frames whose opcode softroce does not parse still get an ICRC verdict (the ICRC covers the
/// packet whatever its extension headers are), and are counted by IBTA's name for the opcode:
/// RD (which ConnectX's DC reuses), XRC, manufacturer-specific and reserved values.
#[test]
fn unparsed_opcodes_are_named_counted_and_their_icrc_checked() {
    let send = &fixture_frames("rdma_cm_rping.pcap")[3];
    let frames = [
        with_opcode(send, 0x44, true),
        with_opcode(send, 0xa4, true),
        with_opcode(send, 0xc5, true),
        with_opcode(send, 0x1f, false),
    ];
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let path = temp_file("unparsed.pcap", &common::pcap_of(&refs));
    let out = decode(&[path.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].contains(" RD_SEND_ONLY (RD, or ConnectX DC) QP="),
        "{}",
        lines[0]
    );
    assert!(lines[0].ends_with("ICRC=ok"), "{}", lines[0]);
    assert!(lines[1].contains(" XRC_SEND_ONLY QP=") && lines[1].ends_with("ICRC=ok"));
    assert!(lines[2].contains(" MANUFACTURER_SPECIFIC 0xc5 QP=") && lines[2].ends_with("ICRC=ok"));
    assert!(lines[3].contains(" RESERVED 0x1f QP=") && lines[3].ends_with("ICRC=BAD"));
    for (name, count) in [
        ("RD_SEND_ONLY", 1),
        ("XRC_SEND_ONLY", 1),
        ("MANUFACTURER_SPECIFIC 0xc5", 1),
        ("RESERVED 0x1f", 1),
        ("ok", 3),
        ("bad", 1),
    ] {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")
                    == format!("{name} {count}")),
            "no count {name} {count}:\n{text}"
        );
    }
    assert!(text.contains("not parsed (RD, XRC, vendor or reserved opcodes): 4"));
    assert!(text.contains("malformed RoCE frames: 0"));
    let json = String::from_utf8(decode(&["--json", path.to_str().unwrap()]).stdout).unwrap();
    let first: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(first["opcode_name"], "RD_SEND_ONLY");
    assert_eq!(first["icrc"], "ok");
    assert!(
        first["not_parsed"].as_str().unwrap().contains("RD"),
        "{first}"
    );
    std::fs::remove_file(path).unwrap();
}
