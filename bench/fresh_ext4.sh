#!/bin/sh
# Mount a fresh, empty, journaled ext4 (a loop device over a sparse file) for the benchmark's
# storage roots, and print the TMPDIR to run `make bench` with. Needs root.
#
#   sudo bench/fresh_ext4.sh [MOUNTPOINT] [SIZE]      # default /mnt/benchfs, 4G
#   TMPDIR=/mnt/benchfs make bench bench-peer
#
# Why (bench/README.md, "Where the storage roots live"): on a long-used filesystem that many
# jobs create and delete files on, each new inode can cost 0.1-0.9 ms of kernel CPU, and that,
# not app/, decides the write figures; on this fresh one it costs ~0.02 ms.
set -eu
mnt=${1:-/mnt/benchfs}
size=${2:-4G}
img=/var/tmp/$(basename "$mnt")-ext4.img
if mountpoint -q "$mnt"; then
    umount "$mnt"
fi
rm -f "$img"
truncate -s "$size" "$img"
mkfs.ext4 -q -F "$img"
mkdir -p "$mnt"
mount -o loop "$img" "$mnt"
chmod 1777 "$mnt"
echo "TMPDIR=$mnt"
