#!/usr/bin/env bash
# Builds the guest of the VM crash test (crates/lsvd/tests/vm_crash.rs): a Debian cloud
# kernel and a busybox initramfs with mkfs.ext4, e2fsck and scripts/vm/init.sh as /init.
#
#   scripts/vm/build-assets.sh OUT_DIR
#
# Writes OUT_DIR/vmlinuz and OUT_DIR/initramfs.cpio.gz (the test uses
# target/vm-assets) and prints OUT_DIR. Nothing is downloaded: the inputs are the
# Debian packages scripts/install-test-deps.sh installs (linux-image-cloud-amd64,
# busybox-static, e2fsprogs). A rebuild happens only when an input changed (the kernel
# version, this script, init.sh, busybox or e2fsprogs).
#
# The kernel's modules are compressed (.ko.xz or .ko.zst); the needed ones are
# decompressed here, so the guest's busybox insmod can load them. They are what the
# cloud kernel builds as modules among: the virtio PCI transport and virtio-blk
# (virtio_ring, virtio, virtio_pci_modern_dev, virtio_pci_legacy_dev, virtio_pci,
# virtio_blk) and ext4 with its dependencies; the order file lists them in load order.
set -euo pipefail
export PATH="/usr/bin:/usr/sbin:/bin:/sbin:${PATH}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:?usage: build-assets.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

die() {
    echo "build-assets: $*" >&2
    exit 1
}

# The newest installed cloud kernel.
kernel=""
for k in /boot/vmlinuz-*-cloud-amd64; do
    [ -e "$k" ] && kernel="$k"
done
[ -n "$kernel" ] || die "no /boot/vmlinuz-*-cloud-amd64: install linux-image-cloud-amd64 (scripts/install-test-deps.sh)"
[ -r "$kernel" ] || die "$kernel is not readable (run as root)"
kver="${kernel#/boot/vmlinuz-}"
moddir="/lib/modules/$kver"
[ -d "$moddir" ] || die "$moddir is missing"
busybox=/bin/busybox
applets="$([ -x "$busybox" ] && "$busybox" --list || true)"
grep -qx awk <<< "$applets" ||
    die "no static busybox at $busybox: install busybox-static"
grep -q "not a dynamic" <<< "$(ldd "$busybox" 2>&1 || true)" || die "$busybox is not static: install busybox-static"
for t in mke2fs e2fsck; do
    command -v "$t" > /dev/null || die "no $t: install e2fsprogs"
done

stamp="$kver $(sha256sum "$0" "$here/init.sh" "$busybox" "$(command -v mke2fs)" "$(command -v e2fsck)" | cut -c1-16 | paste -sd ' ')"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] &&
    [ -f "$out/vmlinuz" ] && [ -f "$out/initramfs.cpio.gz" ]; then
    echo "$out"
    exit 0
fi

root="$(mktemp -d "$out/root.XXXXXX")"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,mnt,tmp,lib/modules}

cp "$busybox" "$root/bin/busybox"
for applet in $applets; do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done

# e2fsprogs and the shared libraries they need, at the same paths.
copy_with_libs() {
    local bin="$1" lib
    cp -L "$bin" "$root/sbin/$(basename "$bin")"
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}
copy_with_libs "$(command -v mke2fs)"
copy_with_libs "$(command -v e2fsck)"
ln -sf mke2fs "$root/sbin/mkfs.ext4"
# mke2fs reads its defaults (ext4 features) from here.
[ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$root/etc/mke2fs.conf"

# Modules: those of the wanted ones that this kernel has as modules (=m), with their
# dependencies from modules.dep, each once, dependencies first.
wanted="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk crc16 mbcache jbd2 crc32c_generic ext4"
declare -A seen=()
order=()
add_module() {
    local name="$1" line path dep
    line="$(grep -E "(^|/)${name}\.ko(\.[a-z]+)?:" "$moddir/modules.dep" || true)"
    [ -n "$line" ] || return 0 # built in (or not built at all: the kernel decides)
    path="${line%%:*}"
    [ -z "${seen[$path]:-}" ] || return 0
    seen[$path]=1
    for dep in ${line#*:}; do
        dep="$(basename "$dep")"
        add_module "${dep%%.ko*}"
    done
    order+=("$path")
}
for m in $wanted; do
    add_module "$m"
done
: > "$root/lib/modules/order"
for path in "${order[@]}"; do
    name="$(basename "$path")"
    name="${name%%.ko*}"
    case "$path" in
    *.ko.xz) xz -dc "$moddir/$path" > "$root/lib/modules/$name.ko" ;;
    *.ko.zst) zstd -qdc "$moddir/$path" > "$root/lib/modules/$name.ko" ;;
    *.ko.gz) gzip -dc "$moddir/$path" > "$root/lib/modules/$name.ko" ;;
    *.ko) cp "$moddir/$path" "$root/lib/modules/$name.ko" ;;
    *) die "unexpected module file $path" ;;
    esac
    echo "$name" >> "$root/lib/modules/order"
done
grep -qx virtio_blk "$root/lib/modules/order" ||
    grep -q "^CONFIG_VIRTIO_BLK=y" "/boot/config-$kver" ||
    die "virtio_blk is neither a module nor built into $kver"

cp "$here/init.sh" "$root/init"
chmod 755 "$root/init"

cp "$kernel" "$out/vmlinuz.tmp"
(cd "$root" && find . | sort | cpio --quiet -o -H newc -R 0:0) | gzip -1 > "$out/initramfs.cpio.gz.tmp"
mv "$out/vmlinuz.tmp" "$out/vmlinuz"
mv "$out/initramfs.cpio.gz.tmp" "$out/initramfs.cpio.gz"
echo "$stamp" > "$out/stamp"
echo "build-assets: kernel $kver, modules: $(paste -sd ' ' "$root/lib/modules/order")" >&2
echo "$out"
