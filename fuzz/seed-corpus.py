#!/usr/bin/env python3
"""Builds fuzz/corpus/{frame,roce_packet,capture,cm}/ from packet-fixtures/.

frame:       every captured Ethernet frame, and the published hex vectors
roce_packet: the UDP payload (BTH to ICRC) of every frame
capture:     every fixture file whole
cm:          the MADs of every QP1 packet, each as a record of the cm target (sender 0,
             no time step), and all of a capture's in one input
Only classic pcap (as tcpdump writes it) is split; other files still seed `capture`.
"""
import hashlib
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "packet-fixtures"
CORPUS = ROOT / "fuzz" / "corpus"


def save(target, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


def pcap_frames(blob):
    if len(blob) < 24:
        return
    magic = blob[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        return
    linktype = struct.unpack(endian + "I", blob[20:24])[0]
    if linktype != 1:  # Ethernet only
        return
    at = 24
    while at + 16 <= len(blob):
        incl = struct.unpack(endian + "I", blob[at + 8:at + 12])[0]
        yield blob[at + 16:at + 16 + incl]
        at += 16 + incl


def udp_payload(frame):
    at, ethertype = 14, frame[12:14]
    if ethertype == b"\x81\x00":
        at, ethertype = 18, frame[16:18]
    if ethertype == b"\x08\x00":
        at += (frame[at] & 0x0F) * 4
    elif ethertype == b"\x86\xdd":
        at += 40
    else:
        return None
    return frame[at + 8:]


def mad(payload):
    """The MAD of a UD SEND_ONLY to QP1: after the BTH (12 bytes) and DETH (8), 256 bytes."""
    if len(payload) < 12 + 8 + 256 or payload[0] != 0x64:
        return None
    if payload[5:8] != b"\x00\x00\x01":
        return None
    return payload[20:276]


def main():
    count = 0
    for path in sorted(FIXTURES.rglob("*")):
        if path.suffix in (".pcap", ".pcapng"):
            blob = path.read_bytes()
            save("capture", blob)
            handshake = b""
            for frame in pcap_frames(blob):
                save("frame", frame)
                payload = udp_payload(frame)
                if payload:
                    save("roce_packet", payload)
                    m = mad(payload)
                    if m:
                        save("cm", b"\x00\x00" + m)
                        handshake += b"\x00\x00" + m
                count += 1
            if handshake:
                save("cm", handshake)
        elif path.suffix == ".hex":
            digits = "".join(
                "".join(l.split()) for l in path.read_text().splitlines() if not l.startswith("#")
            )
            frame = bytes.fromhex(digits)
            save("frame", frame)
            save("roce_packet", udp_payload(frame) or b"")
            count += 1
    print(f"seeded {count} frames into {CORPUS}")


if __name__ == "__main__":
    main()
