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

#[test]
fn text_output_has_a_line_per_packet_and_counts() {
    let cnp = include_str!("../packet-fixtures/vectors/connectx4lx_cnp.hex");
    let digits: String = cnp
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    let frame: Vec<u8> = (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect();
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
