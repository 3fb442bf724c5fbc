#!/bin/bash
# build.sh KVER OUTDIR: assemble the lab guest from the host's installed Debian packages.
#   OUTDIR/vmlinux            ELF kernel extracted from /boot/vmlinuz-KVER (QEMU boots it via PVH)
#   OUTDIR/initramfs.cpio.gz  busybox + rdma_rxe & friends + rdma-core/perftest/rping/ucx/tc/tcpdump
# Called by lib.sh:lab_build_guest, which caches OUTDIR under a key that hashes this file, so any
# edit here triggers a rebuild.
set -euo pipefail
KVER=$1 OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
R=$OUT/root
MULTIARCH=x86_64-linux-gnu
rm -rf "$R"
mkdir -p "$R"/{bin,sbin,etc,proc,sys,dev,tmp,run,root,usr/bin,usr/sbin,lib/modules/$KVER}

# ---- kernel: the ELF vmlinux inside the bzImage ----------------------------------------------
# Debian's bzImage holds an XZ-compressed ELF vmlinux. QEMU's -kernel with an ELF that has a PVH
# note (Debian: CONFIG_PVH=y) jumps straight into it, skipping the real-mode setup and the XZ
# decompressor, which are slow under TCG.
/usr/bin/python3 - "/boot/vmlinuz-$KVER" "$OUT/vmlinux" <<'PY'
import lzma, sys
d = open(sys.argv[1], 'rb').read()
i = d.find(b'\xfd7zXZ\x00')
if i < 0:
    sys.exit("no XZ stream in " + sys.argv[1])
out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(d[i:])
if out[:4] != b'\x7fELF':
    sys.exit("XZ stream in %s is not an ELF vmlinux" % sys.argv[1])
open(sys.argv[2], 'wb').write(out)
print(sys.argv[2], len(out), "bytes")
PY

# ---- busybox: sh, nc (command server), ip, modprobe, timeout, killall ...----------------------
cp /bin/busybox "$R/bin/busybox"
for a in $("$R/bin/busybox" --list); do
  [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"
done

# ---- kernel modules and their dependency closure (modules.dep lists the full closure) --------
# sch_netem/sch_prio/cls_u32: loss on a guest's egress; ifb/act_mirred/act_gact/sch_ingress: the same
# netem on its ingress, through an ifb device (lib.sh: guest_netem)
MODS="virtio_pci virtio_net rdma_rxe ib_uverbs ib_core rdma_ucm rdma_cm ib_cm iw_cm
crc32_generic crc32-pclmul sch_netem sch_prio cls_u32 sch_ingress act_mirred act_gact ifb"
MD=/lib/modules/$KVER
need=""
for m in $MODS; do
  pat="(^|/)${m//[-_]/[-_]}\.ko(\.[a-z]+)?:"
  line=$(grep -E "$pat" "$MD/modules.dep" || true)
  if [ -z "$line" ]; then
    # built into the kernel: nothing to copy
    grep -qE "(^|/)${m//[-_]/[-_]}\.ko" "$MD/modules.builtin" && continue
    echo "module $m not found for $KVER" >&2; exit 1
  fi
  need="$need ${line%%:*} ${line#*:}"
done
for f in $(echo $need | tr ' ' '\n' | sort -u); do
  mkdir -p "$R$MD/$(dirname "$f")"
  case $f in
    # busybox modprobe cannot read compressed modules: store them plain (depmod finds *.ko)
    *.ko.xz) xz -dc "$MD/$f" >"$R$MD/${f%.xz}";;
    *.ko.zst) zstd -qdc "$MD/$f" >"$R$MD/${f%.zst}";;
    *.ko.gz) gzip -dc "$MD/$f" >"$R$MD/${f%.gz}";;
    *) cp "$MD/$f" "$R$MD/$f";;
  esac
done
cp "$MD"/modules.order "$MD"/modules.builtin "$MD"/modules.builtin.modinfo "$R$MD/" 2>/dev/null || true
depmod -b "$R" "$KVER"

# ---- user space: binaries with their shared libraries ----------------------------------------
copy_with_libs() {
  local f=$1 l
  mkdir -p "$R$(dirname "$f")"
  cp -L "$f" "$R$f"
  for l in $(ldd "$f" 2>/dev/null | grep -oE '/[^ ]+'); do
    [ -e "$R$l" ] && continue
    mkdir -p "$R$(dirname "$l")"
    cp -L "$l" "$R$l"
  done
}
# rdma-core tools, libibverbs examples, perftest, rdmacm-utils, tc (iproute2), tcpdump
BINS="/usr/bin/rdma /usr/bin/ibv_devices /usr/bin/ibv_devinfo
/usr/bin/ibv_rc_pingpong /usr/bin/ibv_uc_pingpong /usr/bin/ibv_ud_pingpong /usr/bin/ibv_srq_pingpong
/usr/bin/ib_write_bw /usr/bin/ib_send_bw /usr/bin/ib_read_bw /usr/bin/ib_atomic_bw
/usr/bin/ib_write_lat /usr/bin/ib_send_lat /usr/bin/ib_read_lat /usr/bin/ib_atomic_lat
/usr/bin/rping /usr/bin/udaddy /usr/bin/ucmatose /usr/bin/rdma_server /usr/bin/rdma_client
/sbin/tc /usr/bin/tcpdump"
for b in $BINS; do
  [ -x "$b" ] || { b2=$(command -v "$(basename "$b")" || true); [ -n "$b2" ] && b=$b2; }
  [ -x "$b" ] || { echo "missing $b" >&2; exit 1; }
  copy_with_libs "$b"
  # busybox has applets of the same name (tc!): no /bin link for them (the guest's ash prefers
  # its applets anyway, so callers use full paths, e.g. /sbin/tc)
  [ -L "$R/bin/$(basename "$b")" ] && [ "$b" != "/bin/$(basename "$b")" ] && rm -f "$R/bin/$(basename "$b")"
  # keep the binaries reachable from the guest's PATH whatever their host directory
  [ -e "$R/usr/bin/$(basename "$b")" ] || ln -s "$b" "$R/usr/bin/$(basename "$b")"
done
# UCX's ucx_perftest (ucx-utils), and the transport modules libuct dlopen()s from its ucx/
# directory (rc and ud over verbs, RDMA-CM): the middleware case runs it against softroce
[ -x /usr/bin/ucx_perftest ] || { echo "missing /usr/bin/ucx_perftest (ucx-utils)" >&2; exit 1; }
copy_with_libs /usr/bin/ucx_perftest
for m in /usr/lib/$MULTIARCH/ucx/libuct_*.so*; do copy_with_libs "$m"; done
# the rxe verbs provider is dlopen()ed by libibverbs, found through /etc/libibverbs.d/rxe.driver
for p in /usr/lib/$MULTIARCH/libibverbs/librxe-rdmav*.so; do copy_with_libs "$p"; done
mkdir -p "$R/etc/libibverbs.d"
cp /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
# glibc dlopen()s libgcc_s for pthread_exit/cancel: rping and other rdma_cm users abort without it
copy_with_libs /lib/$MULTIARCH/libgcc_s.so.1
# tc's netem distribution tables (only needed for delay distributions, small)
[ -d /usr/lib/tc ] && { mkdir -p "$R/usr/lib"; cp -r /usr/lib/tc "$R/usr/lib/"; }
# the dynamic loader under its canonical path
mkdir -p "$R/lib64"
[ -e "$R/lib64/ld-linux-x86-64.so.2" ] || cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"

# ---- /etc -------------------------------------------------------------------------------------
printf 'root:x:0:0:root:/root:/bin/sh\ntcpdump:x:0:0::/:/bin/sh\n' >"$R/etc/passwd"
printf 'root:x:0:\ntcpdump:x:0:\n' >"$R/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$R/etc/hosts"

install -m 0755 "$HERE/init.sh" "$R/init"
(cd "$R" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$OUT/initramfs.cpio.gz"
rm -rf "$R"
ls -la "$OUT"
