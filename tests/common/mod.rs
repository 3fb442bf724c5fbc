//! Shared by the integration tests: the fixture manifests, a minimal pcap writer, and a reader
//! of softroce's own recordings. Each test binary uses a different subset.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One line of a fixture directory's `MANIFEST.tsv`.
pub struct Entry {
    pub file: String,
    pub mtu: usize,
    pub ip: u8,
    pub packets: usize,
    pub corrupt: BTreeSet<usize>,
}

pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("packet-fixtures")
        .join(name)
}

/// Reads `MANIFEST.tsv`: `file mtu ip packets corrupt_frames description command`, tab-separated.
pub fn manifest(dir: &Path) -> Vec<Entry> {
    let path = dir.join("MANIFEST.tsv");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header line").split('\t').collect();
    assert_eq!(
        &header[..5],
        ["file", "mtu", "ip", "packets", "corrupt_frames"],
        "MANIFEST.tsv columns"
    );
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            assert!(cols.len() >= 7, "a manifest line has 7 columns: {line}");
            Entry {
                file: cols[0].to_string(),
                mtu: cols[1].parse().expect("mtu"),
                ip: cols[2].parse().expect("ip"),
                packets: cols[3].parse().expect("packets"),
                corrupt: match cols[4] {
                    "-" => BTreeSet::new(),
                    list => list
                        .split(',')
                        .map(|n| n.parse().expect("frame number"))
                        .collect(),
                },
            }
        })
        .collect()
}

/// A classic little-endian pcap file of Ethernet frames, all stamped with time zero.
pub fn pcap_of(frames: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    for word in [0u32, 0, 65_535, 1] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    for frame in frames {
        let len = frame.len() as u32;
        for word in [0u32, 0, len, len] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.extend_from_slice(frame);
    }
    out
}

/// Reads the pcap file softroce recorded at `path`, deletes it, checks that every frame is RoCE
/// with a good ICRC, and returns the frames' UDP source ports, in order.
pub fn recorded_source_ports(path: &Path) -> Vec<u16> {
    use softroce::capture::Capture;
    use softroce::wire::IcrcStatus;

    let bytes = std::fs::read(path).unwrap();
    std::fs::remove_file(path).unwrap();
    Capture::new(&bytes)
        .unwrap()
        .map(|record| {
            let record = record.unwrap();
            let frame = record.frame().unwrap();
            assert_eq!(
                frame.icrc_status(),
                IcrcStatus::Ok,
                "frame {}",
                record.number
            );
            frame.repr.udp.src_port
        })
        .collect()
}
