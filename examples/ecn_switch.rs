//! A two-port Ethernet switch whose port toward one host is a bottleneck: a rate, and a queue
//! that marks ECN-capable IPv4 packets CE as RED does (never below `kmin` bytes queued, with a
//! chance rising to `pmax` at `kmax`, always above) and drops what arrives past `limit`. The
//! other way is forwarded at once. It stands in for a switch in `benches/congestion.sh`, on a
//! host whose kernel has no marking qdisc (no RED, fq_codel or netem here).
//!
//! ```text
//! ecn_switch PORT_A MAC_A PORT_B MAC_B RATE_MBPS KMIN KMAX PMAX LIMIT STATS_FILE
//! ```
//!
//! Frames from the host with `MAC_A`, arriving on `PORT_A`, queue for `PORT_B`; frames from
//! `MAC_B` go straight to `PORT_A`. (A packet socket also sees the frames sent through it:
//! the source MAC tells them apart.) Every 100 ms the counts go to `STATS_FILE`, as
//! `forwarded F marked M dropped D max_queue Q`. Runs until killed; needs CAP_NET_RAW.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pnet_datalink::{Channel, Config, NetworkInterface};

/// A frame waiting for the bottleneck, and when it leaves.
struct Queued {
    leaves: Instant,
    frame: Vec<u8>,
}

#[derive(Default)]
struct Counts {
    forwarded: u64,
    marked: u64,
    dropped: u64,
    max_queue: usize,
}

struct Port {
    queue: VecDeque<Queued>,
    /// Bytes in `queue`.
    bytes: usize,
    /// When the port has sent everything queued.
    free_at: Option<Instant>,
    counts: Counts,
}

#[path = "../tests/sim/red.rs"]
mod red;
use red::Red;

fn interface(name: &str) -> NetworkInterface {
    pnet_datalink::interfaces()
        .into_iter()
        .find(|i| i.name == name)
        .unwrap_or_else(|| panic!("no interface {name}"))
}

fn mac(text: &str) -> [u8; 6] {
    let bytes: Vec<u8> = text
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).expect("a MAC address"))
        .collect();
    bytes.try_into().expect("a MAC address of six bytes")
}

/// Marks an ECN-capable IPv4 packet CE, with its header checksum brought up to date
/// (RFC 1624). Returns whether it did.
fn mark_ce(frame: &mut [u8]) -> bool {
    const IP: usize = 14;
    if frame.len() < IP + 20 || frame[12..14] != [0x08, 0x00] || frame[IP + 1] & 3 == 0 {
        return false;
    }
    let old = u16::from_be_bytes([frame[IP], frame[IP + 1]]);
    frame[IP + 1] |= 3;
    let new = u16::from_be_bytes([frame[IP], frame[IP + 1]]);
    let checksum = u16::from_be_bytes([frame[IP + 10], frame[IP + 11]]);
    let mut sum = u32::from(!checksum) + u32::from(!old) + u32::from(new);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    frame[IP + 10..IP + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    true
}

fn channel(
    port: &NetworkInterface,
) -> (
    Box<dyn pnet_datalink::DataLinkSender>,
    Box<dyn pnet_datalink::DataLinkReceiver>,
) {
    let config = Config {
        read_timeout: Some(Duration::from_millis(100)),
        ..Config::default()
    };
    match pnet_datalink::channel(port, config) {
        Ok(Channel::Ethernet(tx, rx)) => (tx, rx),
        Ok(_) => panic!("{}: not an Ethernet channel", port.name),
        Err(e) => panic!("{}: {e}", port.name),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [port_a, mac_a, port_b, mac_b, rate, kmin, kmax, pmax, limit, stats] = &args[..] else {
        eprintln!(
            "usage: ecn_switch PORT_A MAC_A PORT_B MAC_B RATE_MBPS KMIN KMAX PMAX LIMIT STATS_FILE"
        );
        std::process::exit(2);
    };
    let (mac_a, mac_b) = (mac(mac_a), mac(mac_b));
    let rate: f64 = rate.parse::<f64>().expect("a rate in Mb/s") * 1e6 / 8.0;
    let red = Red {
        kmin: kmin.parse().expect("KMIN in bytes"),
        kmax: kmax.parse().expect("KMAX in bytes"),
        pmax: pmax.parse().expect("PMAX, 0 to 1"),
    };
    let limit: usize = limit.parse().expect("LIMIT in bytes");
    let (mut tx_a, mut rx_a) = channel(&interface(port_a));
    let (mut tx_b, mut rx_b) = channel(&interface(port_b));
    let port = Arc::new((
        Mutex::new(Port {
            queue: VecDeque::new(),
            bytes: 0,
            free_at: None,
            counts: Counts::default(),
        }),
        Condvar::new(),
    ));

    // B to A: at once.
    std::thread::spawn(move || loop {
        if let Ok(frame) = rx_b.next() {
            if frame.len() >= 12 && frame[6..12] == mac_b {
                let _ = tx_a.send_to(frame, None);
            }
        }
    });

    // A to B: into the queue, or dropped at its limit.
    let arrivals = port.clone();
    std::thread::spawn(move || loop {
        let Ok(frame) = rx_a.next() else {
            continue;
        };
        if frame.len() < 12 || frame[6..12] != mac_a {
            continue;
        }
        let (lock, wake) = &*arrivals;
        let mut port = lock.lock().unwrap();
        if port.bytes + frame.len() > limit {
            port.counts.dropped += 1;
            continue;
        }
        let now = Instant::now();
        let start = port.free_at.map_or(now, |free| free.max(now));
        let leaves = start + Duration::from_secs_f64(frame.len() as f64 / rate);
        port.free_at = Some(leaves);
        port.bytes += frame.len();
        port.counts.max_queue = port.counts.max_queue.max(port.bytes);
        port.queue.push_back(Queued {
            leaves,
            frame: frame.to_vec(),
        });
        wake.notify_one();
    });

    // The counts, for the bench.
    let counting = port.clone();
    let stats = stats.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(100));
        let port = counting.0.lock().unwrap();
        let c = &port.counts;
        let line = format!(
            "forwarded {} marked {} dropped {} max_queue {}\n",
            c.forwarded, c.marked, c.dropped, c.max_queue
        );
        let _ = std::fs::write(&stats, line);
    });

    // The bottleneck's departures: each frame at its time, marked by what waits behind it.
    let mut random = 0x9e37_79b9_7f4a_7c15_u64;
    let (lock, wake) = &*port;
    let mut port = lock.lock().unwrap();
    loop {
        let Some(head) = port.queue.front() else {
            port = wake.wait(port).unwrap();
            continue;
        };
        let now = Instant::now();
        if head.leaves > now {
            let wait = head.leaves - now;
            port = wake.wait_timeout(port, wait).unwrap().0;
            continue;
        }
        let Queued { mut frame, .. } = port.queue.pop_front().expect("a head");
        port.bytes -= frame.len();
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        let draw = (random >> 11) as f64 / (1u64 << 53) as f64;
        if draw < red.chance(port.bytes) && mark_ce(&mut frame) {
            port.counts.marked += 1;
        }
        port.counts.forwarded += 1;
        let _ = tx_b.send_to(&frame, None);
    }
}
