#!/bin/busybox sh
# /init of the scripts/kernels.sh guests (busybox, in the initramfs). Builds a
# root on tmpfs from the host's root (9p, read-only, at /host), or from a
# folder of it (another architecture's userland), with its paths where the
# tool and its workloads expect them, the repository at its host path, runs
# scripts/kernel-guest.sh there with its outputs on the second share, and
# powers off. The kernel command line names the root, the repository, the
# kernel's modules folder (host paths) and the steps.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

say() { echo "kernel-init: $*"; }

for m in $(cat /modules/order); do
	insmod "/modules/$m.ko" || say "insmod $m failed"
done
for a in $(cat /proc/cmdline); do
	case $a in
	autoglm.root=*) root=${a#*=} ;;
	autoglm.repo=*) repo=${a#*=} ;;
	autoglm.modules=*) modules=${a#*=} ;;
	autoglm.steps=*) steps=$(echo "${a#*=}" | tr , ' ') ;;
	esac
done

r=/newroot
mount -t tmpfs -o mode=0755 root $r
mkdir -p $r/host $r/out
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot $r/host || say "9p hostroot failed"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out $r/out || say "9p out failed"
src=$r/host${root%/}

# /usr is an overlay, writable, so that the guest kernel's modules sit
# where modprobe looks for them (the kernel loads some on demand).
mkdir -p $r/usr $r/.usr/upper $r/.usr/work
if mount -t overlay -o "lowerdir=$src/usr,upperdir=$r/.usr/upper,workdir=$r/.usr/work" usr $r/usr; then
	mkdir -p "$r/usr/lib/modules/$(uname -r)"
	mount --bind "$r/host$modules" "$r/usr/lib/modules/$(uname -r)"
else
	say "overlay on /usr failed: /usr read-only, no modules on demand"
	mount --bind $src/usr $r/usr
fi
for d in etc opt; do
	[ -d $src/$d ] && mkdir -p $r/$d && mount --bind $src/$d $r/$d
done
# Mounting proc over the 9p root itself broke /proc/self: hence a tmpfs
# root with the host's top folders bound or linked as the host has them.
for d in bin sbin lib lib32 lib64 libx32; do
	if [ -L $src/$d ]; then
		ln -s "$(readlink $src/$d)" $r/$d
	elif [ -d $src/$d ]; then
		mkdir -p $r/$d && mount --bind $src/$d $r/$d
	fi
done

mkdir -p $r/tmp $r/run $r/var/tmp $r/root $r/proc $r/sys $r/dev
for d in tmp run var/tmp; do
	mount -t tmpfs -o mode=1777 tmpfs $r/$d
done
# After the tmpfs mounts: the repository may be under /tmp.
if [ ! -d "$r$repo" ]; then
	mkdir -p "$r$repo" && mount --bind "$r/host$repo" "$r$repo"
fi
mount -t proc proc $r/proc
mount -t sysfs sysfs $r/sys
mount -t devtmpfs devtmpfs $r/dev
mkdir -p $r/dev/shm $r/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $r/dev/shm
mount -t devpts devpts $r/dev/pts
mount -t debugfs debugfs $r/sys/kernel/debug
mount -t tracefs tracefs $r/sys/kernel/tracing
mount -t bpf bpf $r/sys/fs/bpf
mount -t cgroup2 cgroup2 $r/sys/fs/cgroup
# The socket workload serves on 127.0.0.1.
ip link set lo up

say "running scripts/kernel-guest.sh"
# shellcheck disable=SC2086 # steps are words
chroot $r /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	HOME=/root LANG=C.UTF-8 /bin/bash "$repo/scripts/kernel-guest.sh" /out $steps || say "kernel-guest.sh exit $?"
sync
say "end"
poweroff -f
