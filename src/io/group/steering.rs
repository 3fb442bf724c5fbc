//! The classic BPF program that picks, for each datagram to the address, the group socket of
//! the process it belongs to. The kernel runs it with the data at the UDP payload
//! (`reuseport_select_sock`) and takes its answer as an index into the group's sockets.
//!
//! - A packet for QP 2 or above goes to the place its DestQP's low byte names: every QP
//!   number of a member ends in its place.
//! - A MAD for QP1 of the CM class: a REQ or SIDR_REQ to the member that bound its service ID
//!   (the RDMA-CM port), or to a living member when nobody did, which rejects it; a SIDR_REP
//!   to the member its request ID names; every other CM message (REP, RTU, MRA, REJ, DREQ,
//!   DREP, LAP, APR) to the member its remote communication ID names: members draw their IDs
//!   so that they end in their place, as they do their QP numbers.
//! - Any other MAD to that living member, which drops and counts it. A datagram too short for
//!   a load ends the program with 0, the first place's member, which does the same. A packet
//!   for a place past the last socket the kernel gives a socket by hash: whoever gets it finds
//!   no QP.

use std::io;
use std::os::fd::AsFd;

use nix::libc;
use nix::sys::socket::{setsockopt, sockopt};

/// Offsets in the UDP payload: the BTH (12 bytes), QP1's DETH (8), then the MAD header.
mod at {
    /// BTH bytes 4 to 7: a reserved byte, then DestQP.
    pub const DEST_QP_WORD: u32 = 4;
    pub const MGMT_CLASS: u32 = 20 + 1;
    pub const ATTRIBUTE_ID: u32 = 20 + 16;
    /// The MAD's data: the CM message.
    const DATA: u32 = 20 + 24;
    /// REQ's and SIDR_REQ's service ID, its low 32 bits (IBTA 12.6.5, 12.11.1).
    pub const SERVICE_ID_LOW: u32 = DATA + 12;
    /// The last byte of SIDR_REP's request ID.
    pub const REQUEST_ID_LOW: u32 = DATA + 3;
    /// The last byte of the remote communication ID, the second word of every other message.
    pub const REMOTE_COMM_ID_LOW: u32 = DATA + 7;
}
const CM_CLASS: u32 = 0x07;
const REQ: u32 = 0x0010;
const SIDR_REQ: u32 = 0x0017;
const SIDR_REP: u32 = 0x0018;

/// The most ports one program routes: 2 instructions each, within BPF_MAXINSNS (4,096) with the
/// 18 others. The ports table holds no more (`registry::MAX_PORTS`).
pub const MAX_ROUTED_PORTS: usize = super::registry::MAX_PORTS;

/// The program for a group whose bound RDMA-CM services are `services`: (the low 32 bits of
/// the service ID, the place of the member that bound it); a request for no bound service,
/// and a MAD of another class, go to `default`, a living member, which rejects or drops it.
pub fn program(services: &[(u32, u8)], default: u8) -> Vec<libc::sock_filter> {
    let op = |code: u32| code as u16;
    let insn = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: op(code),
        jt,
        jf,
        k,
    };
    let ld = |size: u32, k: u32| insn(libc::BPF_LD | size | libc::BPF_ABS, 0, 0, k);
    let jeq = |k: u32, jt: u8, jf: u8| insn(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, jt, jf, k);
    let ret_a = insn(libc::BPF_RET | libc::BPF_A, 0, 0, 0);
    let ret = |k: u32| insn(libc::BPF_RET | libc::BPF_K, 0, 0, k);
    let and = |k: u32| insn(libc::BPF_ALU | libc::BPF_AND | libc::BPF_K, 0, 0, k);
    let mut program = vec![
        /* 0 */ ld(libc::BPF_W, at::DEST_QP_WORD),
        /* 1 */ and(0x00ff_ffff),
        // QP 2 and above: to 3; QP0 and QP1: to 5.
        /* 2 */
        insn(libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K, 0, 2, 1),
        /* 3 */ and(0xff),
        /* 4 */ ret_a,
        /* 5 */ ld(libc::BPF_B, at::MGMT_CLASS),
        /* 6 */ jeq(CM_CLASS, 1, 0),
        /* 7 */ ret(u32::from(default)),
        /* 8 */ ld(libc::BPF_H, at::ATTRIBUTE_ID),
        /* 9 */ jeq(REQ, 6, 0),
        /* 10 */ jeq(SIDR_REQ, 5, 0),
        /* 11 */ jeq(SIDR_REP, 0, 2),
        /* 12 */ ld(libc::BPF_B, at::REQUEST_ID_LOW),
        /* 13 */ ret_a,
        /* 14 */ ld(libc::BPF_B, at::REMOTE_COMM_ID_LOW),
        /* 15 */ ret_a,
        /* 16 */ ld(libc::BPF_W, at::SERVICE_ID_LOW),
    ];
    for &(key, place) in services.iter().take(MAX_ROUTED_PORTS) {
        program.push(jeq(key, 0, 1));
        program.push(ret(u32::from(place)));
    }
    program.push(ret(u32::from(default)));
    program
}

/// Gives the reuse-port group of `socket` the program for `services` and `default`.
pub fn attach(socket: impl AsFd, services: &[(u32, u8)], default: u8) -> io::Result<()> {
    let mut program = program(services, default);
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // The kernel copies the program during the call, while `program` lives.
    setsockopt(&socket, sockopt::AttachReusePortCbpf, &fprog)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic BPF program over `packet` as the kernel does for a reuse-port group
    /// (only the instructions `program` emits).
    fn run(program: &[libc::sock_filter], packet: &[u8]) -> u32 {
        let load = |k: u32, size: usize| -> Option<u32> {
            let bytes = packet.get(k as usize..k as usize + size)?;
            Some(bytes.iter().fold(0, |a, b| (a << 8) | u32::from(*b)))
        };
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let i = program[pc];
            let code = u32::from(i.code);
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => match load(i.k, 4) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == libc::BPF_LD | libc::BPF_H | libc::BPF_ABS => match load(i.k, 2) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == libc::BPF_LD | libc::BPF_B | libc::BPF_ABS => match load(i.k, 1) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => a &= i.k,
                c if c == libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K => {
                    pc += usize::from(if a > i.k { i.jt } else { i.jf })
                }
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += usize::from(if a == i.k { i.jt } else { i.jf })
                }
                c if c == libc::BPF_RET | libc::BPF_A => return a,
                c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    /// A CM MAD on QP1: BTH, DETH, the MAD header with `attribute`, then `data`.
    fn mad(attribute: u16, data: &[u8]) -> Vec<u8> {
        let mut packet = vec![0u8; 20 + 24];
        packet[7] = 1;
        packet[21] = CM_CLASS as u8;
        packet[36..38].copy_from_slice(&attribute.to_be_bytes());
        packet.extend_from_slice(data);
        packet
    }

    #[test]
    fn a_qp_packet_goes_to_the_place_its_number_ends_in() {
        let program = program(&[], 3);
        let mut bth = [0u8; 12];
        bth[5..8].copy_from_slice(&[0x12, 0x34, 0x07]);
        assert_eq!(run(&program, &bth), 7);
        bth[5..8].copy_from_slice(&[0xff, 0xff, 0x00]);
        assert_eq!(run(&program, &bth), 0);
        // Too short for the BTH: the first place, which drops it.
        assert_eq!(run(&program, &bth[..6]), 0);
    }

    #[test]
    fn a_request_goes_to_the_member_that_bound_its_port_and_replies_to_their_id() {
        let tcp_7174 = 0x0106_1c06;
        let program = program(&[(0x0106_0001, 3), (tcp_7174, 9)], 4);
        let mut req = vec![0u8; 16];
        req[8..16].copy_from_slice(&0x0000_0000_0106_1c06u64.to_be_bytes());
        assert_eq!(run(&program, &mad(REQ as u16, &req)), 9);
        assert_eq!(run(&program, &mad(SIDR_REQ as u16, &req)), 9);
        req[15] = 0x07;
        assert_eq!(
            run(&program, &mad(REQ as u16, &req)),
            4,
            "no port: the default"
        );
        // REP, RTU, DREQ...: the remote communication ID's last byte.
        let ids = [0xaa, 0xbb, 0xcc, 0xdd, 0x11, 0x22, 0x33, 0x05];
        for attribute in [0x11, 0x12, 0x13, 0x14, 0x15, 0x16] {
            assert_eq!(run(&program, &mad(attribute, &ids)), 5, "{attribute:#x}");
        }
        assert_eq!(run(&program, &mad(SIDR_REP as u16, &ids)), 0xdd);
        // Another class: the default.
        let mut other = mad(0x11, &ids);
        other[21] = 0x04;
        assert_eq!(run(&program, &other), 4);
    }
}
