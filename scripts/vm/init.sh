#!/bin/sh
# /init of the guest of the VM crash test (crates/lsvd/tests/vm_crash.rs, docs/vm-crash-test.md).
#
# Runs as PID 1 in a busybox initramfs built by scripts/vm/build-assets.sh. The disk
# under test is /dev/vda: an lsvd export attached by qemu as virtio-blk over NBD.
# Kernel messages go to ttyS0 (a log file on the host); this script talks to the host
# on ttyS1 only, in lines starting with "@@ " (anything else there is noise):
#
#   @@ BOOT mode=M round=R seed=S         the script started
#   @@ MKFS rc                             mkfs.ext4 finished (mode mkfs)
#   @@ FSCK replay=RC check=RC             e2fsck -E journal_only -y, then e2fsck -f -n
#   @@ FSCKOUT text                        the output of the check, line by line
#   @@ MOUNT rc                            mount -t ext4 /dev/vda /mnt
#   @@ HAVE path size crc                  a file found on the disk (CRC-32 in hex, busybox crc32)
#   @@ VERIFIED n                          all n files were listed
#   @@ BARRIER n                           everything before is flushed (sync); the
#                                          script now waits for a line from the host
#   @@ SYNCED path size crc                file written and fsynced (file and directory)
#   @@ DONE                                final mode: unmounted cleanly, powering off
#   @@ FATAL text                          something the test cannot go on from
#
# Parameters come from the kernel command line: lsvd.mode=mkfs|check|final,
# lsvd.round=R, lsvd.seed=S (file contents), lsvd.barrier=B (a second barrier after
# the B-th synced file of this round; 0 = none).
#
# Files are named rR/dD/fI-SIZE (path relative to the mount point); their content is
# 64-byte lines "SEED PATH LINE" padded with spaces to 63 bytes and a newline,
# truncated to SIZE bytes. The host regenerates the same bytes to check a file.

export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

# One descriptor for the whole run; clocal: never wait for a carrier.
exec 3<> /dev/ttyS1
stty raw -echo clocal 115200 <&3 2>/dev/null
say() { echo "@@ $*" >&3; }
fatal() {
    say "FATAL $*"
    sync
    poweroff -f
}

mode=check round=0 seed=0 barrier=0
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    lsvd.mode=*) mode=${arg#lsvd.mode=} ;;
    lsvd.round=*) round=${arg#lsvd.round=} ;;
    lsvd.seed=*) seed=${arg#lsvd.seed=} ;;
    lsvd.barrier=*) barrier=${arg#lsvd.barrier=} ;;
    esac
done
say "BOOT mode=$mode round=$round seed=$seed"

# Modules in dependency order (listed by build-assets.sh).
while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/$m.ko" || fatal "insmod $m failed"
done < /lib/modules/order

n=0
while [ ! -b /dev/vda ]; do
    n=$((n + 1))
    [ "$n" -le 100 ] || fatal "no /dev/vda after 10 s"
    sleep 0.1
done

wait_host() {
    sync
    say "BARRIER $1"
    read -r _ <&3
}

if [ "$mode" = mkfs ]; then
    # Lazy inode-table init, and noinit_itable below: no background zeroing thread,
    # so the disk is idle whenever the script is.
    mkfs.ext4 -q -F -E lazy_itable_init=1,lazy_journal_init=1 /dev/vda > /tmp/mkfs.out 2>&1
    rc=$?
    say "MKFS $rc"
    [ "$rc" -eq 0 ] || fatal "mkfs.ext4: $(tr '\n' ' ' < /tmp/mkfs.out)"
else
    # Replay the journal (allowed after a crash), then a full read-only check that
    # must find nothing.
    e2fsck -E journal_only -y /dev/vda > /tmp/replay.out 2>&1
    replay=$?
    e2fsck -f -n /dev/vda > /tmp/fsck.out 2>&1
    check=$?
    say "FSCK replay=$replay check=$check"
    while IFS= read -r line; do say "FSCKOUT $line"; done < /tmp/replay.out
    while IFS= read -r line; do say "FSCKOUT $line"; done < /tmp/fsck.out
fi

mount -t ext4 -o noinit_itable /dev/vda /mnt
rc=$?
say "MOUNT $rc"
[ "$rc" -eq 0 ] || fatal "mount failed"

if [ "$mode" != mkfs ]; then
    count=0
    cd /mnt || fatal "cd /mnt"
    for f in $(find r* -type f 2>/dev/null | sort); do
        say "HAVE $f $(wc -c < "$f") $(crc32 "$f" | cut -d' ' -f1)"
        count=$((count + 1))
    done
    cd /
    say "VERIFIED $count"
fi

if [ "$mode" = final ]; then
    umount /mnt || fatal "umount failed"
    say "DONE"
    poweroff -f
fi

gen() { # PATH SIZE
    awk -v p="$1" -v s="$seed" -v n="$2" \
        'BEGIN { for (i = 0; i * 64 < n; i++) printf "%-63s\n", s " " p " " i }' |
        head -c "$2"
}

mkdir -p "/mnt/r$round/d0" "/mnt/r$round/d1" "/mnt/r$round/d2" "/mnt/r$round/d3" ||
    fatal "mkdir"
sync
wait_host 0

# The host kills the VM somewhere in this loop.
# A 31-bit LCG; its low bits are periodic, so r takes bits 16..30 of each step.
x=$seed
next() {
    x=$(((x * 1103515245 + 12345) % 2147483648))
    r=$((x / 65536))
}
i=0
while :; do
    next
    class=$((r % 4))
    next
    v=$r
    next
    v=$((v * 32768 + r))
    case $class in
    0) size=$((v % 4096 + 1)) ;;
    1) size=$((4096 * (v % 16 + 1))) ;;
    2) size=$((v % 262144 + 1)) ;;
    *) size=$((v % 524288)) ;;
    esac
    rel="r$round/d$((i % 4))/f$i-$size"
    gen "$rel" "$size" > "/mnt/$rel" || fatal "write $rel"
    sync "/mnt/$rel" "/mnt/r$round/d$((i % 4))" || fatal "fsync $rel"
    say "SYNCED $rel $(wc -c < "/mnt/$rel") $(crc32 "/mnt/$rel" | cut -d' ' -f1)"
    i=$((i + 1))
    if [ "$i" -eq "$barrier" ]; then
        wait_host "$i"
    fi
done
