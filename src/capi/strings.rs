//! The `*_str` calls and the rate conversions: the texts rdma-core prints, so that a program's
//! messages read the same over softroce.

use libc::{c_char, c_int, c_uint};

/// A static C string.
fn text(s: &'static [u8]) -> *const c_char {
    debug_assert_eq!(s.last(), Some(&0));
    s.as_ptr().cast()
}

/// `ibv_wc_status_str`.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_uint) -> *const c_char {
    const NAMES: [&[u8]; 23] = [
        b"success\0",
        b"local length error\0",
        b"local QP operation error\0",
        b"local EE context operation error\0",
        b"local protection error\0",
        b"Work Request Flushed Error\0",
        b"memory management operation error\0",
        b"bad response error\0",
        b"local access error\0",
        b"remote invalid request error\0",
        b"remote access error\0",
        b"remote operation error\0",
        b"transport retry counter exceeded\0",
        b"RNR retry counter exceeded\0",
        b"local RDD violation error\0",
        b"remote invalid RD request\0",
        b"aborted error\0",
        b"invalid EE context number\0",
        b"invalid EE context state\0",
        b"fatal error\0",
        b"response timeout error\0",
        b"general error\0",
        b"TM error\0",
    ];
    text(NAMES.get(status as usize).copied().unwrap_or(b"unknown\0"))
}

/// `ibv_event_type_str`.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: c_uint) -> *const c_char {
    const NAMES: [&[u8]; 20] = [
        b"CQ error\0",
        b"local work queue catastrophic error\0",
        b"invalid request local work queue error\0",
        b"local access violation work queue error\0",
        b"communication established\0",
        b"send queue drained\0",
        b"path migrated\0",
        b"path migration request error\0",
        b"local catastrophic error\0",
        b"port active\0",
        b"port error\0",
        b"LID change\0",
        b"P_Key change\0",
        b"SM change\0",
        b"SRQ catastrophic error\0",
        b"SRQ limit reached\0",
        b"last WQE reached\0",
        b"client reregistration\0",
        b"GID table change\0",
        b"WQ fatal\0",
    ];
    text(NAMES.get(event as usize).copied().unwrap_or(b"unknown\0"))
}

/// `ibv_node_type_str`.
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    const NAMES: [&[u8]; 7] = [
        b"unknown\0",
        b"InfiniBand channel adapter\0",
        b"InfiniBand switch\0",
        b"InfiniBand router\0",
        b"iWARP NIC\0",
        b"usNIC\0",
        b"usNIC UDP\0",
    ];
    let index = usize::try_from(node_type).unwrap_or(0);
    text(NAMES.get(index).copied().unwrap_or(b"unknown\0"))
}

/// `ibv_port_state_str`.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(state: c_uint) -> *const c_char {
    const NAMES: [&[u8]; 6] = [
        b"no state change (NOP)\0",
        b"down\0",
        b"init\0",
        b"armed\0",
        b"active\0",
        b"active deferred\0",
    ];
    text(NAMES.get(state as usize).copied().unwrap_or(b"unknown\0"))
}

/// Each `enum ibv_rate`, its multiple of 2.5 Gb/s where rdma-core's `ibv_rate_to_mult` gives
/// one (0 where it gives none: the FDR and EDR rates, whose lanes are not multiples of 2.5), and
/// its Mb/s, as rdma-core's tables (verbs.c) have them.
const RATES: [(c_int, c_int, c_int); 23] = [
    // (ibv_rate, multiple of 2.5 Gb/s, Mb/s)
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, 0, 14062),
    (12, 0, 56250),
    (13, 0, 112500),
    (14, 0, 168750),
    (15, 0, 25781),
    (16, 0, 103125),
    (17, 0, 206250),
    (18, 0, 309375),
    (19, 11, 28125),
    (20, 20, 53125),
    (21, 160, 425000),
    (22, 240, 637500),
    (23, 320, 850000),
    (24, 480, 1275000),
];

/// `IBV_RATE_MAX`: what the reverse lookups answer for a value no rate has.
const IBV_RATE_MAX: c_int = 0;

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s, or -1.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate && r.1 != 0)
        .map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate`: the rate of a multiple of 2.5 Gb/s, or `IBV_RATE_MAX`.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult != 0)
        .map_or(IBV_RATE_MAX, |r| r.0)
}

/// `ibv_rate_to_mbps`: the rate in Mb/s, or -1.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`: the rate of exactly `mbps` Mb/s, or `IBV_RATE_MAX`.
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.2 == mbps)
        .map_or(IBV_RATE_MAX, |r| r.0)
}
