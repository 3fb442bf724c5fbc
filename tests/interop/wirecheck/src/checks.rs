//! The checks: each sets up against its guest tool, drives the exchange and returns a summary
//! of what it verified, or the first thing that did not hold.

use std::net::{Ipv6Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use softroce::wire::{
    BthRepr, DethRepr, ExtHeaders, NakCode, Opcode, PacketRepr, Psn, QKey, Qpn, RKey,
};

use crate::args::{Args, Check};
use crate::link::{describe, Link, Seal};
use crate::oob::{self, PerftestDest, PingpongDest, Report};
use crate::rc::{RcQp, PATH_MTU};
use crate::Result;

/// This side's QP number: any value but 0 and 1 (the special QPs) will do.
const LOCAL_QPN: Qpn = Qpn::new(0x00c0de);

/// The Q_Key ibv_ud_pingpong gives its QP and puts in every send.
const UD_PINGPONG_QKEY: QKey = QKey(0x1111_1111);

/// How long rxe gets to answer a packet it must drop before we call it silence. rxe answers a
/// good request within milliseconds, even under TCG.
const SILENCE: Duration = Duration::from_secs(1);

pub fn run(args: &Args) -> Result<String> {
    match args.check {
        Check::RcPingpong => rc_pingpong(args),
        Check::UdPingpong => ud_pingpong(args),
        Check::Write => write(args),
        Check::Read => read(args),
        Check::Atomic => atomic(args),
        Check::BadIcrc => bad_icrc(args),
        Check::PsnGap => psn_gap(args),
        Check::WriteNoAccess => write_no_access(args),
        Check::Cnp => cnp(args),
    }
}

/// The bytes of message `seed`: different for every message, and with a period (251, a prime)
/// that does not divide the MTU, so that two segments of one message never look alike either.
fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| ((j + seed * 7) % 251) as u8).collect()
}

fn oob_addr(args: &Args) -> SocketAddrV4 {
    SocketAddrV4::new(args.server, args.port)
}

/// Opens the link, then does the pingpong exchange as the client. The link comes first, so that
/// this side listens on UDP 4791 before the guest knows where to send.
fn pingpong_setup(args: &Args) -> Result<(Link, PingpongDest, PingpongDest)> {
    let link = Link::open(args.path, args.local, args.server)?;
    let me = PingpongDest {
        lid: 0,
        qpn: LOCAL_QPN,
        psn: Psn::new(args.psn),
        gid: oob::mapped_gid(args.local),
    };
    let server = oob::pingpong_exchange(oob_addr(args), &me)?;
    check_gid(&server.gid, args)?;
    Ok((link, me, server))
}

/// rxe only accepts RC packets whose IP addresses are the GIDs of the QP's path, so the guest
/// must have sent the IPv4-mapped GID of the address we talk to (GID index 1: `-g 1`/`-x 1`).
fn check_gid(gid: &Ipv6Addr, args: &Args) -> Result<()> {
    if *gid != oob::mapped_gid(args.server) {
        bail!(
            "the server's GID is not ::ffff:{}: run it with GID index 1",
            args.server
        );
    }
    Ok(())
}

/// An RC QP connected to an `ibv_rc_pingpong` server.
fn rc_pingpong_qp(args: &Args) -> Result<RcQp> {
    let (link, me, server) = pingpong_setup(args)?;
    Ok(RcQp::new(link, me.qpn, server.qpn, me.psn, server.psn))
}

/// One pingpong round trip: our SEND, rxe's ACK of its last PSN, then the guest's SEND back
/// (acknowledged by `RcQp`). ibv_rc_pingpong receives into and sends from the same buffer, so
/// the guest's message must be ours, byte for byte.
fn round_trip(qp: &mut RcQp, i: usize, msg: &[u8]) -> Result<()> {
    let last = qp.send_message(msg)?;
    qp.expect_ack(last)?;
    let echo = qp.next_message()?;
    if echo != msg {
        let at = echo.iter().zip(msg).position(|(a, b)| a != b);
        bail!(
            "round trip {i}: the guest sent back {} bytes that differ from our {} (first \
             difference at byte {at:?})",
            echo.len(),
            msg.len()
        );
    }
    Ok(())
}

fn rc_pingpong(args: &Args) -> Result<String> {
    let mut qp = rc_pingpong_qp(args)?;
    let first_psn = qp.next_psn();
    for i in 0..args.iters {
        round_trip(&mut qp, i, &pattern(i, args.size))?;
    }
    let packets = args.size.div_ceil(PATH_MTU).max(1);
    Ok(format!(
        "{} round trips of {} bytes ({packets} packets per SEND, our PSNs {first_psn}..{}), every \
         ACK and echo right; {}",
        args.iters,
        args.size,
        qp.next_psn() - 1,
        qp.link.summary()
    ))
}

fn ud_pingpong(args: &Args) -> Result<String> {
    if args.size > PATH_MTU {
        bail!("a UD message is one packet: --size must be at most {PATH_MTU}");
    }
    let (mut link, me, server) = pingpong_setup(args)?;
    for i in 0..args.iters {
        let msg = pattern(i, args.size);
        let ext = ExtHeaders {
            deth: Some(DethRepr {
                qkey: UD_PINGPONG_QKEY,
                src_qp: me.qpn,
            }),
            ..Default::default()
        };
        let bth = BthRepr::new(Opcode::UdSendOnly, server.qpn, me.psn + i as u32);
        link.send(&PacketRepr::new(bth, ext, msg.len()), &msg, Seal::Good)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        let Some(rx) = link.recv(deadline)? else {
            bail!("round trip {i}: no UD_SEND_ONLY from the guest");
        };
        let repr = &rx.repr;
        // The guest's UD QP sends with the Q_Key and from the QP it announced, to our QP,
        // numbering its packets from the PSN it announced.
        let want = DethRepr {
            qkey: UD_PINGPONG_QKEY,
            src_qp: server.qpn,
        };
        if repr.bth.opcode != Opcode::UdSendOnly
            || repr.bth.dest_qp != me.qpn
            || repr.bth.psn != server.psn + i as u32
            || repr.ext.deth != Some(want)
        {
            bail!(
                "round trip {i}: expected UD_SEND_ONLY qp={} psn={} deth(qkey={} src_qp={}), \
                 got {}",
                me.qpn,
                server.psn + i as u32,
                want.qkey,
                want.src_qp,
                describe(repr)
            );
        }
        // ibv_ud_pingpong receives the 40-byte GRH and the payload into one buffer and sends
        // the payload part back: the guest's message must be ours.
        if rx.payload != msg {
            bail!(
                "round trip {i}: the guest's {} bytes are not ours",
                rx.payload.len()
            );
        }
    }
    Ok(format!(
        "{} UD round trips of {} bytes, Q_Key {UD_PINGPONG_QKEY}, every echo right; {}",
        args.iters,
        args.size,
        link.summary()
    ))
}

/// An RC QP connected to a perftest server, with the server's keys (its buffer's R_Key and VA).
fn perftest_setup(args: &Args) -> Result<(RcQp, oob::Perftest, PerftestDest)> {
    let link = Link::open(args.path, args.local, args.server)?;
    let me = PerftestDest {
        lid: 0,
        // The server makes this its QP's max_rd_atomic; it never sends reads to us.
        out_reads: 1,
        qpn: LOCAL_QPN,
        psn: Psn::new(args.psn),
        rkey: RKey(0),
        vaddr: 0,
        gid: oob::mapped_gid(args.local),
        srqn: 0,
    };
    let (session, server) = oob::Perftest::connect(oob_addr(args), me)?;
    check_gid(&server.gid, args)?;
    let qp = RcQp::new(link, me.qpn, server.qpn, me.psn, server.psn);
    Ok((qp, session, server))
}

/// Ends the perftest exchange with a report of `ops` operations of `size` bytes since `start`;
/// the server prints it as its result line and exits.
fn perftest_finish(session: oob::Perftest, size: usize, ops: usize, start: Instant) -> Result<()> {
    let secs = start.elapsed().as_secs_f64().max(1e-6);
    let bw = (size * ops) as f64 / secs / (1 << 20) as f64;
    session.finish(Report {
        size: size as u64,
        iters: ops as u64,
        bw_peak: bw,
        bw_avg: bw,
        msg_rate: ops as f64 / secs / 1e6,
    })
}

/// RDMA WRITEs into the `ib_write_bw` server's buffer, each acknowledged with its last PSN.
/// Its MR only allows remote writes, so the bytes cannot be read back; the ACK is the check.
fn write(args: &Args) -> Result<String> {
    let (mut qp, session, server) = perftest_setup(args)?;
    let start = Instant::now();
    for i in 0..args.iters {
        let last = qp.write(server.vaddr, server.rkey, &pattern(i, args.size))?;
        qp.expect_ack(last)?;
    }
    perftest_finish(session, args.size, args.iters, start)?;
    Ok(format!(
        "{} RDMA WRITEs of {} bytes ({} packets each) acknowledged; {}",
        args.iters,
        args.size,
        args.size.div_ceil(PATH_MTU).max(1),
        qp.link.summary()
    ))
}

/// Two RDMA READs from the `ib_read_bw` server's buffer, the second a quarter further on.
/// perftest fills the buffer with rand() (seeded by the clock) and its MR allows no remote
/// write, so the bytes cannot be known in advance. What is checked: the response opcodes, PSNs
/// and AETHs; that the bytes are not all zero (perftest filled them); and that the two reads
/// agree where they overlap, so rxe read from the addresses asked for.
fn read(args: &Args) -> Result<String> {
    let (mut qp, session, server) = perftest_setup(args)?;
    let size = args.size;
    let shift = size / 4;
    if shift == 0 {
        bail!("--size must be at least 4 for two overlapping reads");
    }
    let start = Instant::now();
    let first = qp.read(server.vaddr, server.rkey, size)?;
    let second = qp.read(server.vaddr + shift as u64, server.rkey, size)?;
    if first.iter().all(|&b| b == 0) {
        bail!("the READ returned {size} zero bytes; perftest fills its buffer with rand()");
    }
    if first[shift..] != second[..size - shift] {
        bail!("the READs at VA and VA+{shift} disagree where they overlap");
    }
    perftest_finish(session, size, 2, start)?;
    Ok(format!(
        "2 RDMA READs of {size} bytes ({} response packets each), overlapping {} bytes that \
         agree; {}",
        size.div_ceil(PATH_MTU).max(1),
        size - shift,
        qp.link.summary()
    ))
}

/// FETCH_ADDs on the first 8 bytes of the `ib_atomic_bw` server's buffer: each original value
/// must be the previous one plus the addend. The first is whatever rand() left there.
fn atomic(args: &Args) -> Result<String> {
    const ADD: u64 = 0x0000_0001_0000_0001;
    let (mut qp, session, server) = perftest_setup(args)?;
    let start = Instant::now();
    let mut previous = None;
    for i in 0..args.iters {
        let orig = qp.fetch_add(server.vaddr, server.rkey, ADD)?;
        if let Some(prev) = previous {
            let want = u64::wrapping_add(prev, ADD);
            if orig != want {
                bail!("FETCH_ADD {i}: original value {orig:#x}, expected {want:#x}");
            }
        }
        previous = Some(orig);
    }
    perftest_finish(session, 8, args.iters, start)?;
    Ok(format!(
        "{} FETCH_ADDs of {ADD:#x}, each ATOMIC_ACKNOWLEDGE's original value the one before \
         plus {ADD:#x}; {}",
        args.iters,
        qp.link.summary()
    ))
}

/// A SEND_ONLY with a corrupted ICRC gets no answer (rxe drops it); the same packet with the
/// right ICRC then gets its ACK, and one round trip completes so that the server exits 0.
fn bad_icrc(args: &Args) -> Result<String> {
    let mut qp = rc_pingpong_qp(args)?;
    let msg = pattern(0, args.size.min(PATH_MTU));
    let psn = qp.next_psn();
    qp.packet(
        Opcode::RcSendOnly,
        psn,
        ExtHeaders::default(),
        &msg,
        Seal::Corrupt,
    )?;
    qp.expect_silence(SILENCE)
        .map_err(|e| format!("after the corrupted ICRC: {e}"))?;
    round_trip(&mut qp, 0, &msg)?;
    Ok(format!(
        "SEND_ONLY psn={psn} with a corrupted ICRC: no answer in {SILENCE:?}; with the right \
         ICRC: ACK psn={psn} msn=1 and the echo; {}",
        qp.link.summary()
    ))
}

/// A CNP (IBTA Annex A17.9.3: BECN set, PSN 0, 16 reserved bytes), as softroce's notification
/// point sends one, to ibv_rc_pingpong's QP: rxe has no reaction point and drops it (its opcode
/// checks admit RC, UC and UD only), so nothing answers and nothing breaks; the round trip
/// that follows completes.
fn cnp(args: &Args) -> Result<String> {
    let mut qp = rc_pingpong_qp(args)?;
    let bth = BthRepr {
        becn: true,
        ..BthRepr::new(Opcode::Cnp, qp.remote_qpn(), Psn::new(0))
    };
    let repr = PacketRepr::new(bth, ExtHeaders::default(), 0);
    qp.link.send(&repr, &[], Seal::Good)?;
    qp.expect_silence(SILENCE)
        .map_err(|e| format!("after the CNP: {e}"))?;
    let msg = pattern(0, args.size.min(PATH_MTU));
    round_trip(&mut qp, 0, &msg)?;
    Ok(format!(
        "CNP to QP {}: no answer in {SILENCE:?}; then a SEND: ACK and the echo; {}",
        qp.remote_qpn(),
        qp.link.summary()
    ))
}

/// A SEND_ONLY five PSNs ahead of the expected one gets one NAK 0x60 (PSN sequence error)
/// carrying the expected PSN; the SEND at the expected PSN then completes a round trip.
fn psn_gap(args: &Args) -> Result<String> {
    const AHEAD: u32 = 5;
    let mut qp = rc_pingpong_qp(args)?;
    let msg = pattern(0, args.size.min(PATH_MTU));
    let expected = qp.next_psn();
    let early = expected + AHEAD;
    qp.packet(
        Opcode::RcSendOnly,
        early,
        ExtHeaders::default(),
        &msg,
        Seal::Good,
    )?;
    qp.expect_nak(NakCode::PsnSequenceError, expected)?;
    round_trip(&mut qp, 0, &msg)?;
    Ok(format!(
        "SEND_ONLY psn={early} (expected {expected}): NAK 0x60 psn={expected} msn=0; then \
         psn={expected}: ACK msn=1 and the echo; {}",
        qp.link.summary()
    ))
}

/// An RDMA WRITE to ibv_rc_pingpong's QP, which has no remote access rights: rxe refuses it
/// before looking at the R_Key (rxe_resp.c, check_op_valid) with NAK 0x61 (invalid request),
/// and the QP goes to the error state.
fn write_no_access(args: &Args) -> Result<String> {
    let mut qp = rc_pingpong_qp(args)?;
    let psn = qp.next_psn();
    qp.write(0, RKey(0), &pattern(0, args.size.min(PATH_MTU)))?;
    qp.expect_nak(NakCode::InvalidRequest, psn)?;
    Ok(format!(
        "RDMA_WRITE_ONLY psn={psn} to a QP without remote write: NAK 0x61 psn={psn} msn=0; {}",
        qp.link.summary()
    ))
}
