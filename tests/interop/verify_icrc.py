#!/usr/bin/python3
"""verify_icrc.py: independent RoCEv2 ICRC check (and decoder) for pcap files. Stdlib only.

    verify_icrc.py [options] FILE.pcap...

For every Ethernet frame carrying IPv4 or IPv6 / UDP dport 4791, recompute the invariant CRC
(IBTA Vol 1 Annex A17 "RoCEv2", 17.4.1 / A17.9.1) and compare it with the frame's last 4 bytes:

  * the CRC-32 (zlib.crc32: reflected, init ~0, final xor ~0) runs over
      8 bytes of 0xFF (stand-in for the masked LRH of an IB packet)
      + the IP header with its variant fields set to all ones:
          IPv4: TOS (DSCP+ECN), TTL, header checksum
          IPv6: traffic class, flow label, hop limit
      + the UDP header with the checksum set to all ones
      + the BTH with byte 4 (FECN, BECN, 6 reserved bits) set to 0xFF
      + the rest of the packet up to, not including, the ICRC (extension headers, payload, pad);
  * the ICRC is stored least significant byte first: struct.pack('<I', crc) == frame[-4:].
Everything else in the IP header (IPv4 ID, flags/DF, total length, addresses, ...) is covered.
The end of the packet is taken from the IP length field, so Ethernet padding is ignored.

Options:
  --list                one line per frame: addresses, UDP source port and checksum, IP ID/flow
                        label, BTH fields, AETH, RETH, DETH, AtomicETH, AtomicAckETH, ImmDt,
                        payload length and the ICRC verdict
  --count               just print the number of frames in each file
  --expect-opcodes L    fail unless each BTH opcode in L (comma-separated, e.g. 0x00,0x11) occurs
  --expect-ip V         fail unless every RoCE frame is IP version V (4 or 6)
  --expect-loss-recovery fail unless there is a NAK (AETH syndrome 011xxxxx) or a retransmitted
                        request PSN
  --max-frames N        fail if a file has more than N frames
Exit status 0 only if every RoCE frame's ICRC is correct, every file has at least one RoCE frame,
no non-RoCE frame is present, and every expectation holds.
"""
import collections
import signal
import struct
import sys
import zlib

OPCODES = {
    0x00: "RC_SEND_FIRST", 0x01: "RC_SEND_MIDDLE", 0x02: "RC_SEND_LAST",
    0x03: "RC_SEND_LAST_IMM", 0x04: "RC_SEND_ONLY", 0x05: "RC_SEND_ONLY_IMM",
    0x06: "RC_WRITE_FIRST", 0x07: "RC_WRITE_MIDDLE", 0x08: "RC_WRITE_LAST",
    0x09: "RC_WRITE_LAST_IMM", 0x0A: "RC_WRITE_ONLY", 0x0B: "RC_WRITE_ONLY_IMM",
    0x0C: "RC_READ_REQUEST", 0x0D: "RC_READ_RESPONSE_FIRST", 0x0E: "RC_READ_RESPONSE_MIDDLE",
    0x0F: "RC_READ_RESPONSE_LAST", 0x10: "RC_READ_RESPONSE_ONLY", 0x11: "RC_ACKNOWLEDGE",
    0x12: "RC_ATOMIC_ACKNOWLEDGE", 0x13: "RC_CMP_SWAP", 0x14: "RC_FETCH_ADD",
    0x16: "RC_SEND_LAST_INV", 0x17: "RC_SEND_ONLY_INV",
    0x20: "UC_SEND_FIRST", 0x21: "UC_SEND_MIDDLE", 0x22: "UC_SEND_LAST",
    0x23: "UC_SEND_LAST_IMM", 0x24: "UC_SEND_ONLY", 0x25: "UC_SEND_ONLY_IMM",
    0x26: "UC_WRITE_FIRST", 0x27: "UC_WRITE_MIDDLE", 0x28: "UC_WRITE_LAST",
    0x29: "UC_WRITE_LAST_IMM", 0x2A: "UC_WRITE_ONLY", 0x2B: "UC_WRITE_ONLY_IMM",
    0x64: "UD_SEND_ONLY", 0x65: "UD_SEND_ONLY_IMM", 0x81: "CNP",
}
# opcodes whose BTH is followed by an AETH
AETH_OPS = {0x0D, 0x0F, 0x10, 0x11, 0x12}
# opcodes carrying a RETH, an ImmDt
RETH_OPS = {0x06, 0x0A, 0x0B, 0x0C, 0x26, 0x2A, 0x2B}
IMM_OPS = {0x03, 0x05, 0x09, 0x0B, 0x23, 0x25, 0x29, 0x2B, 0x65}
# requester-side opcodes (a repeated PSN among these is a retransmission)
REQUEST_OPS = {op for op in OPCODES if op not in AETH_OPS and op not in (0x0E, 0x81)}
ROCE_PORT = 4791


def read_pcap(fn):
    """Yield (index, frame bytes) for a classic pcap file (either byte order, us or ns)."""
    with open(fn, "rb") as fh:
        d = fh.read()
    if len(d) < 24:
        raise ValueError(f"{fn}: too short for a pcap file")
    magic_le = struct.unpack("<I", d[:4])[0]
    if magic_le in (0xA1B2C3D4, 0xA1B23C4D):
        e = "<"
    elif struct.unpack(">I", d[:4])[0] in (0xA1B2C3D4, 0xA1B23C4D):
        e = ">"
    else:
        raise ValueError(f"{fn}: not a classic pcap file (pcapng is not supported)")
    linktype = struct.unpack(e + "I", d[20:24])[0]
    if linktype != 1:
        raise ValueError(f"{fn}: link type {linktype}, want 1 (Ethernet)")
    off, idx = 24, 0
    while off + 16 <= len(d):
        _ts, _tu, incl, orig = struct.unpack(e + "IIII", d[off:off + 16])
        off += 16
        idx += 1
        frame = d[off:off + incl]
        off += incl
        if incl != orig:
            raise ValueError(f"{fn}: frame {idx} truncated by the snap length ({incl} < {orig})")
        yield idx, frame


def parse_roce(frame):
    """Return a dict describing a RoCEv2 frame, or None if the frame is not RoCEv2."""
    if len(frame) < 14:
        return None
    ethertype = struct.unpack("!H", frame[12:14])[0]
    l3 = 14
    if ethertype == 0x8100:                       # one VLAN tag
        ethertype = struct.unpack("!H", frame[16:18])[0]
        l3 = 18
    info = {}
    if ethertype == 0x0800:
        ip = frame[l3:]
        if len(ip) < 20 or ip[0] >> 4 != 4:
            return None
        ihl = (ip[0] & 15) * 4
        total = struct.unpack("!H", ip[2:4])[0]
        if ip[9] != 17 or total > len(ip):
            return None
        pkt = bytearray(ip[:total])
        masked = bytearray(pkt)
        masked[1] = 0xFF                          # TOS
        masked[8] = 0xFF                          # TTL
        masked[10:12] = b"\xff\xff"               # header checksum
        udp = ihl
        info.update(ipver=4, src=".".join(map(str, ip[12:16])), dst=".".join(map(str, ip[16:20])),
                    ip_id=struct.unpack("!H", ip[4:6])[0], df=bool(ip[6] & 0x40),
                    ttl=ip[8], tos=ip[1])
    elif ethertype == 0x86DD:
        ip = frame[l3:]
        if len(ip) < 40 or ip[0] >> 4 != 6 or ip[6] != 17:   # no extension headers expected
            return None
        plen = struct.unpack("!H", ip[4:6])[0]
        if 40 + plen > len(ip):
            return None
        pkt = bytearray(ip[:40 + plen])
        masked = bytearray(pkt)
        masked[0] |= 0x0F                         # traffic class, high nibble
        masked[1:4] = b"\xff\xff\xff"             # traffic class low nibble + flow label
        masked[7] = 0xFF                          # hop limit
        udp = 40

        def a6(b):
            return ":".join("%x" % struct.unpack("!H", b[i:i + 2])[0] for i in range(0, 16, 2))
        info.update(ipver=6, src=a6(ip[8:24]), dst=a6(ip[24:40]),
                    flow=struct.unpack("!I", ip[0:4])[0] & 0xFFFFF,
                    tclass=(struct.unpack("!H", ip[0:2])[0] >> 4) & 0xFF, ttl=ip[7])
    else:
        return None
    if len(pkt) < udp + 8 + 12 + 4:
        return None
    sport, dport, ulen, ucsum = struct.unpack("!HHHH", pkt[udp:udp + 8])
    if dport != ROCE_PORT:
        return None
    masked[udp + 6:udp + 8] = b"\xff\xff"         # UDP checksum
    bth = udp + 8
    masked[bth + 4] = 0xFF                        # BTH: FECN, BECN, resv6
    crc = zlib.crc32(b"\xff" * 8 + bytes(masked[:-4])) & 0xFFFFFFFF
    want = struct.unpack("<I", bytes(pkt[-4:]))[0]
    b = pkt[bth:bth + 12]
    op = b[0]
    info.update(
        sport=sport, udp_len=ulen, udp_csum=ucsum, icrc_ok=(crc == want), icrc=want, icrc_calc=crc,
        opcode=op, se=bool(b[1] & 0x80), migreq=bool(b[1] & 0x40), pad=(b[1] >> 4) & 3,
        tver=b[1] & 15, pkey=struct.unpack("!H", b[2:4])[0], fecn=bool(b[4] & 0x80),
        becn=bool(b[4] & 0x40), resv6=b[4] & 0x3F, dqpn=struct.unpack("!I", b[4:8])[0] & 0xFFFFFF,
        ackreq=bool(b[8] & 0x80), resv7=b[8] & 0x7F, psn=struct.unpack("!I", b[8:12])[0] & 0xFFFFFF,
        length=len(pkt), payload_end=len(pkt) - 4,
    )
    h = bth + 12                                  # next header
    end = len(pkt) - 4
    if op in AETH_OPS and end >= h + 4:
        syn, msn = struct.unpack("!B3s", pkt[h:h + 4])
        info.update(aeth_syndrome=syn, msn=int.from_bytes(msn, "big"))
        h += 4
        if op == 0x12 and end >= h + 8:            # AtomicAckETH
            info.update(atomic_orig=struct.unpack("!Q", pkt[h:h + 8])[0])
            h += 8
    elif op in RETH_OPS and end >= h + 16:
        info.update(reth=struct.unpack("!QII", pkt[h:h + 16]))   # VA, R_Key, DMA length
        h += 16
    elif op in (0x64, 0x65) and end >= h + 8:      # DETH: Q_Key, reserved, source QP
        info.update(qkey=struct.unpack("!I", pkt[h:h + 4])[0],
                    srcqp=struct.unpack("!I", pkt[h + 4:h + 8])[0] & 0xFFFFFF)
        h += 8
    elif op in (0x13, 0x14) and end >= h + 28:     # AtomicETH: VA, R_Key, swap/add, compare
        info.update(atomic=struct.unpack("!QIQQ", pkt[h:h + 28]))
        h += 28
    if op in IMM_OPS and end >= h + 4:
        info.update(imm=struct.unpack("!I", pkt[h:h + 4])[0])
        h += 4
    info.update(payload_len=end - h)
    return info


def describe(i, r):
    s = (f"{i:4d} v{r['ipver']} {r['src']}:{r['sport']} > {r['dst']} "
         f"{OPCODES.get(r['opcode'], 'OP_0x%02x' % r['opcode'])}(0x{r['opcode']:02x}) "
         f"dqpn=0x{r['dqpn']:06x} psn={r['psn']} A={int(r['ackreq'])} SE={int(r['se'])} "
         f"M={int(r['migreq'])} pad={r['pad']} pkey=0x{r['pkey']:04x} len={r['length']} "
         f"udpcsum=0x{r['udp_csum']:04x}")
    if r["ipver"] == 4:
        s += f" id=0x{r['ip_id']:04x} df={int(r['df'])} ttl={r['ttl']} tos={r['tos']}"
    else:
        s += f" flow=0x{r['flow']:05x} tc={r['tclass']} hlim={r['ttl']}"
    if "aeth_syndrome" in r:
        s += f" aeth=0x{r['aeth_syndrome']:02x}/msn={r['msn']}"
    if "atomic_orig" in r:
        s += f" orig=0x{r['atomic_orig']:x}"
    if "reth" in r:
        s += " reth(va=0x%x,rkey=0x%x,len=%d)" % r["reth"]
    if "qkey" in r:
        s += f" deth(qkey=0x{r['qkey']:08x},srcqp=0x{r['srcqp']:06x})"
    if "atomic" in r:
        s += " atomic(va=0x%x,rkey=0x%x,swap_add=0x%x,cmp=0x%x)" % r["atomic"]
    if "imm" in r:
        s += f" imm=0x{r['imm']:08x}"
    s += f" payload={r['payload_len']}"
    s += " icrc=" + ("ok" if r["icrc_ok"] else f"BAD(frame 0x{r['icrc']:08x} calc 0x{r['icrc_calc']:08x})")
    return s


def main(argv):
    opts = {"list": False, "count": False, "expect_opcodes": [], "expect_ip": None,
            "expect_loss": False, "max_frames": None}
    files = []
    it = iter(argv)
    for a in it:
        if a == "--list":
            opts["list"] = True
        elif a == "--count":
            opts["count"] = True
        elif a == "--expect-opcodes":
            opts["expect_opcodes"] = [int(x, 0) for x in next(it).split(",") if x]
        elif a == "--expect-ip":
            opts["expect_ip"] = int(next(it))
        elif a == "--expect-loss-recovery":
            opts["expect_loss"] = True
        elif a == "--max-frames":
            opts["max_frames"] = int(next(it))
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        elif a.startswith("-"):
            print(f"unknown option {a}", file=sys.stderr)
            return 2
        else:
            files.append(a)
    if not files:
        print(__doc__, file=sys.stderr)
        return 2
    failed = False
    for fn in files:
        try:
            frames = list(read_pcap(fn))
        except (OSError, ValueError) as e:
            print(f"{fn}: ERROR {e}")
            failed = True
            continue
        if opts["count"]:
            print(len(frames))
            continue
        ok = bad = other = 0
        bad_idx, ops, ipvers = [], collections.Counter(), collections.Counter()
        naks, retrans, seen = [], [], set()
        for i, f in frames:
            r = parse_roce(f)
            if r is None:
                other += 1
                if opts["list"]:
                    print(f"{i:4d} (not RoCEv2, {len(f)} bytes)")
                continue
            if opts["list"]:
                print(describe(i, r))
            ipvers[r["ipver"]] += 1
            ops[r["opcode"]] += 1
            if r["icrc_ok"]:
                ok += 1
            else:
                bad += 1
                bad_idx.append(i)
            if r.get("aeth_syndrome", 0) >> 5 == 3:
                naks.append((i, r["aeth_syndrome"], r["psn"]))
            if r["opcode"] in REQUEST_OPS:
                key = (r["src"], r["sport"], r["dst"], r["dqpn"], r["psn"])
                if key in seen:
                    retrans.append((i, r["psn"]))
                seen.add(key)
        problems = []
        if bad:
            problems.append(f"bad ICRC in frames {','.join(map(str, bad_idx))}")
        if ok + bad == 0:
            problems.append("no RoCEv2 frames")
        if other:
            problems.append(f"{other} non-RoCEv2 frames")
        for op in opts["expect_opcodes"]:
            if op not in ops:
                problems.append(f"opcode 0x{op:02x} ({OPCODES.get(op, '?')}) missing")
        if opts["expect_ip"] and set(ipvers) != {opts["expect_ip"]}:
            problems.append(f"IP versions {dict(ipvers)}, want only {opts['expect_ip']}")
        if opts["expect_loss"] and not naks and not retrans:
            problems.append("no NAK and no retransmitted PSN")
        if opts["max_frames"] is not None and len(frames) > opts["max_frames"]:
            problems.append(f"{len(frames)} frames > {opts['max_frames']}")
        opstr = ", ".join(f"0x{o:02x} {OPCODES.get(o, '?')}={n}" for o, n in sorted(ops.items()))
        line = (f"{fn}: {len(frames)} frames, ICRC {ok} ok {bad} bad, "
                f"IPv{'/'.join(map(str, sorted(ipvers)))}; opcodes: {opstr}")
        if naks:
            line += "; NAKs: " + ", ".join(f"frame {i} syndrome 0x{s:02x} psn {p}" for i, s, p in naks)
        if retrans:
            line += "; retransmitted PSNs: " + ", ".join(f"frame {i} psn {p}" for i, p in retrans[:10])
            if len(retrans) > 10:
                line += f" (+{len(retrans) - 10} more)"
        print(line + ("" if not problems else " -- FAIL: " + "; ".join(problems)))
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # quiet when piped into head
    sys.exit(main(sys.argv[1:]))
